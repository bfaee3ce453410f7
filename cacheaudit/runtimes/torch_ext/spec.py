"""torch.utils.cpp_extension: `load` and `load_inline` building through ninja."""

from cacheaudit.spec import CompilerSetting, RuntimeSpec

SPEC = RuntimeSpec(
    name="torch-ext",
    title="torch.utils.cpp_extension",
    layout="layout",
    roots="roots",
    policy="policy",
    adapter="adapter",
    adapter_imports="torch.utils.cpp_extension",
    cache_variables=("TORCH_EXTENSIONS_DIR",),
    compiler_settings=(CompilerSetting("PYTORCH_NVCC", "nvcc"),),
    packages=("torch", "ninja"),
    environment="environment",
    docs="runtimes/torch-ext.md",
)
