"""FlashInfer's JIT: its environment, its workspace (cached_ops/<name>/ ninja build directories,
read with the machinery of `runtimes._ninja`) and its policy. docs/runtimes/flashinfer.md."""
