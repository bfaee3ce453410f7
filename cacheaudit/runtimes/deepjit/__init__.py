"""The deepjit runtime: spec, layout, policy."""
