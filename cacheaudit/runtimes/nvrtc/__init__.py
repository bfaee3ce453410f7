"""The nvrtc runtime: spec, layout, policy, adapter."""
