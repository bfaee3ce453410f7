"""The triton runtime: spec, layout, policy, adapter."""
