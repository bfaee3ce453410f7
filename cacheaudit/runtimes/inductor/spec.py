"""torch.compile's Inductor on CPU: FX graph and AOTAutograd entries, and C++ kernels built with
g++ through `subprocess` (torch 2.13.0 `torch/_inductor/cpp_builder.py` `_run_compile_cmd`).

Its compiler setting is `CXX`, declared with `path_in_key_if`: Inductor's C++ kernel key
holds the compiler *string* it was given (`config.cpp.cxx`, from `$CXX` or `g++`, on the hashed
command line of `CppCodeCache.load_async`), so a session must leave a `CXX` the user gave by
path as it is wherever torch's Inductor is importable (a stand-in's path would be keyed); the
in-process adapter records those compiles. A bare `g++` on PATH reaches the shim with the key
unchanged; see docs/runtimes/inductor.md.
"""

from cacheaudit.spec import CompilerSetting, RuntimeSpec

SPEC = RuntimeSpec(
    name="inductor",
    title="torch.compile (Inductor)",
    layout="layout",
    roots="roots",
    policy="policy",
    adapter="adapter",
    adapter_imports="torch._inductor.codecache",
    cache_variables=("TORCHINDUCTOR_CACHE_DIR",),
    compiler_settings=(CompilerSetting("CXX", compiler="g++",
                                       path_in_key_if=("torch", "_inductor/codecache.py")),),
    packages=("torch",),
    # "cpp": the C++ layer (kernels, ISA probes, precompiled headers), whose key holds the
    # command line; the FX graph and AOTAutograd entries take the runtime's own statuses.
    variants=("cpp",),
    environment="environment",
    docs="runtimes/inductor.md",
)
