"""The cuda_core runtime: spec, layout, policy, adapter."""
