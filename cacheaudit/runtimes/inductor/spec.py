"""torch.compile's Inductor on CPU: FX graph and AOTAutograd entries, and C++ kernels built with
g++ through `subprocess` (torch 2.13.0 `torch/_inductor/cpp_builder.py` `_run_compile_cmd`).

No compiler setting is declared: Inductor's C++ kernel key holds the compiler *string* it was
given (`config.cpp.cxx`, from `$CXX` or `g++`, on the hashed command line of
`CppCodeCache.load_async`), so any stand-in named differently would change the key. A bare
`g++` on PATH reaches the shim with the key unchanged; see docs/runtimes/inductor.md.
"""

from cacheaudit.spec import RuntimeSpec

SPEC = RuntimeSpec(
    name="inductor",
    title="torch.compile (Inductor)",
    layout="layout",
    policy="policy",
    cache_variables=("TORCHINDUCTOR_CACHE_DIR",),
    packages=("torch",),
    environment="environment",
    docs="runtimes/inductor.md",
)
