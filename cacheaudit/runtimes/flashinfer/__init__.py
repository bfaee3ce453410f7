"""FlashInfer's JIT: its environment and compiler setting (its cache is read as a ninja build
directory)."""
