"""The torch_ext runtime: spec, layout, policy, adapter."""
