"""Triton's environment: its own `TRITON_*` knobs, `PTXAS_OPTIONS`, what it does with `CC`, and
its `CACHE_INVALIDATING_ENV_VARS`, which enter its disk key when set.

Triton's disk key (python/triton/runtime/cache.py get_cache_key, jit-runtimes.md §2) holds the
source, the options' hash, the backend's hash (the ptxas version) and the set invalidating
variables; the in-memory `device_caches` key holds none of them (PR #8350).
"""

from __future__ import annotations

from cacheaudit.envvars import Reading, Variable, reads, variable

RUNTIME = "triton"

CATEGORIES = ("triton-invalidating",)
"""Triton's CACHE_INVALIDATING_ENV_VARS: in its key when set."""

_KNOBS: tuple[Variable, ...] = (
    # --- Triton's knobs (besides CACHE_INVALIDATING_ENV_VARS, below) -------------------------
    variable("TRITON_CACHE_DIR", "cache-location", "Triton's kernel cache root",
             not_in_key=(RUNTIME,), source="jit-runtimes.md §2"),
    variable("TRITON_HOME", "cache-location",
             "parent of Triton's default cache, dump, override dirs",
             not_in_key=(RUNTIME,), source="jit-runtimes.md §2; triton knobs.cache.home_dir"),
    variable("TRITON_DUMP_DIR", "cache-location", "where TRITON_KERNEL_DUMP writes IR",
             not_in_key=(RUNTIME,), source="jit-runtimes.md §2 (knobs.cache)"),
    variable("TRITON_OVERRIDE_DIR", "jit-config",
             "where TRITON_KERNEL_OVERRIDE reads replacement IR from",
             not_in_key=(RUNTIME,),
             notes={RUNTIME: "compile() computes the key before the override is applied"},
             source="jit-runtimes.md §2 (knobs.cache); triton compiler.compile"),
    variable("TRITON_KERNEL_OVERRIDE", "jit-config",
             "replaces compiled stages with files from TRITON_OVERRIDE_DIR",
             not_in_key=(RUNTIME,),
             notes={RUNTIME: "the key is computed before the override is applied"},
             source="triton compiler/compiler.py compile (knobs.compilation.override)"),
    variable("TRITON_KERNEL_DUMP", "print-only", "dumps each stage's IR to TRITON_DUMP_DIR",
             not_in_key=(RUNTIME,), source="triton knobs.compilation.dump_ir"),
    variable("TRITON_STORE_BINARY_ONLY", "cache-control",
             "stores only the cubin and json in a cache entry",
             not_in_key=(RUNTIME,), source="jit-runtimes.md §2"),
    variable("TRITON_ALWAYS_COMPILE", "cache-control",
             "=1 bypasses disk hits (not the in-memory device cache)",
             not_in_key=(RUNTIME,), source="jit-runtimes.md §2"),
    variable("TRITON_CACHE_MANAGER", "cache-location", "a CacheManager subclass (module:Class)",
             not_in_key=(RUNTIME,), source="jit-runtimes.md §2"),
    variable("TRITON_REMOTE_CACHE_BACKEND", "cache-location",
             "a RemoteCacheBackend subclass (Redis); its configuration may carry credentials",
             not_in_key=(RUNTIME,), source="jit-runtimes.md §2"),
    variable("TRITON_REDIS_HOST", "cache-location", "host of Triton's Redis remote cache",
             not_in_key=(RUNTIME,), source="triton knobs.RedisKnobs"),
    variable("TRITON_REDIS_PORT", "cache-location", "port of Triton's Redis remote cache",
             not_in_key=(RUNTIME,), source="triton knobs.RedisKnobs"),
    variable("TRITON_REDIS_KEY_FORMAT", "cache-location", "key layout in Triton's Redis cache",
             not_in_key=(RUNTIME,), source="triton knobs.RedisKnobs"),
    variable("TRITON_PTXAS_PATH", "compiler-choice",
             "the ptxas Triton assembles PTX with for targets below sm_90",
             not_in_key=(RUNTIME,),
             notes={RUNTIME: "only the `ptxas --version` output is keyed (CUDABackend.hash)"},
             source="jit-runtimes.md §2"),
    variable("TRITON_PTXAS_BLACKWELL_PATH", "compiler-choice",
             "the ptxas Triton uses for sm_90 and newer targets (Triton 3.9 get_ptxas)",
             not_in_key=(RUNTIME,),
             notes={RUNTIME: "only the ptxas version is keyed (CUDABackend.hash)"},
             source="triton knobs.env_nvidia_tool; backends/nvidia/compiler.py get_ptxas"),
    variable("PTXAS_OPTIONS", "compiler-flags", "extra ptxas options for every Triton kernel",
             in_key=(RUNTIME,),
             notes={RUNTIME: "CUDAOptions.ptx_options, part of options.hash(); read once, when "
                              "triton is imported"},
             source="jit-runtimes.md §2"),
    variable("TRITON_LIBDEVICE_PATH", "toolkit", "the libdevice bitcode Triton links",
             in_key=(RUNTIME,),
             notes={RUNTIME: "extern_libs are keyed by file content, not path"},
             source="jit-runtimes.md §2; triton backends/nvidia/compiler.py CUDAOptions.hash"),
    variable("TRITON_DEBUG", "compiler-flags", "compiles @jit kernels with debug checks",
             in_key=(RUNTIME,),
             notes={RUNTIME: "becomes options.debug in JITFunction.run; read once at import"},
             source="triton runtime/jit.py JITFunction.run (knobs.runtime.debug)"),
)

# Triton's CACHE_INVALIDATING_ENV_VARS: the union of include/triton/Tools/Sys/GetEnv.h in the
# triton 3.9.0 wheel and GetEnv.hpp at the indexed triton-lang/triton revision (older names that
# 3.9.0 dropped are kept: a cache built by the older Triton keyed them). Set ones enter the key
# through get_cache_invalidating_env_vars() (jit-runtimes.md §2, python/triton/runtime/cache.py
# get_cache_key). Not in the in-memory device_caches key (PR #8350).
INVALIDATING: tuple[str, ...] = (
    "ALLOW_LHS_TMEM_LAYOUT_CONVERSION", "AMDGCN_ENABLE_DUMP", "AMDGCN_USE_BUFFER_ATOMICS",
    "AMDGCN_USE_BUFFER_OPS", "DISABLE_FAST_REDUCTION", "DISABLE_LLVM_OPT", "DISABLE_MMA_V3",
    "DISABLE_MMA_V5", "DISABLE_PTXAS_OPT", "ENABLE_MMA_V5_ATT_PIPELINE", "LLVM_ENABLE_TIMING",
    "LLVM_EXTRACT_DI_LOCAL_VARIABLES", "LLVM_IR_ENABLE_DUMP", "LLVM_PASS_PLUGIN_PATH",
    "MLIR_DISABLE_MULTITHREADING", "MLIR_DUMP_PATH", "MLIR_ENABLE_DIAGNOSTICS",
    "MLIR_ENABLE_DUMP", "MLIR_ENABLE_TIMING", "NVPTX_ENABLE_DUMP",
    "STORE_TMEM_TO_GLOBAL_BYPASS_SMEM", "TRITON_CONSAN_INIT_ALLOCATIONS",
    "TRITON_DEFAULT_FP_FUSION", "TRITON_DISABLE_LINE_INFO",
    "TRITON_DISABLE_RESHAPE_ENCODING_INFERENCE", "TRITON_DUMP_MIR", "TRITON_ENABLE_ASAN",
    "TRITON_ENABLE_EXPERIMENTAL_CONSAN", "TRITON_ENABLE_LLVM_DEBUG", "TRITON_F32_DEFAULT",
    "TRITON_FORCE_DISABLE_FP_FUSION", "TRITON_HIP_GLOBAL_PREFETCH", "TRITON_HIP_LOCAL_PREFETCH",
    "TRITON_HIP_USE_ASYNC_COPY", "TRITON_HIP_USE_BLOCK_PINGPONG",
    "TRITON_HIP_USE_COEXEC_SCHEDULER", "TRITON_HIP_USE_EXPERT_SCHEDULING",
    "TRITON_HIP_USE_IN_THREAD_TRANSPOSE", "TRITON_LLVM_DEBUG_ONLY",
    "TRITON_OVERRIDE_ARCH", "TRITON_PARTITION_SCHEDULING_DUMP_DATA_ONLY",
    "TRITON_PARTITION_SCHEDULING_DUMP_LOOP_ONLY",
    "TRITON_PARTITION_SCHEDULING_ENABLE_DUMP_DOT", "TRITON_PLUGIN_PATHS",
    "TRITON_PLUGIN_VERSION_CHECK", "USE_IR_LOC", "WARP_SPECIALIZE_ATTENTION_FLAG",
)

_INVALIDATING_ROWS: tuple[Variable, ...] = tuple(
    variable(name, "triton-invalidating",
             "listed in Triton's CACHE_INVALIDATING_ENV_VARS: changes lowering, so it is keyed "
             "when set",
             in_key=(RUNTIME,),
             notes={RUNTIME: "in the disk key when set; not in the in-memory device_caches key"},
             source="jit-runtimes.md §2; triton include/triton/Tools/Sys/GetEnv.hpp")
    for name in INVALIDATING
)

ROWS: tuple[Variable | Reading, ...] = (
    reads("CC", not_in_key=(RUNTIME,),
          notes={RUNTIME: "jit-runtimes.md §2: CC is not in the key"},
          description="; Triton compiles launcher stubs with it"),
    *_KNOBS,
    *_INVALIDATING_ROWS,
)
