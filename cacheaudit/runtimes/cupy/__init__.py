"""The cupy runtime: spec, layout, policy."""
