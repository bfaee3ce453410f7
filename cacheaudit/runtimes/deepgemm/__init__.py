"""The deepgemm runtime: spec, layout, policy."""
