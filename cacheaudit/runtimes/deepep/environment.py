"""DeepEP's environment (its EPv2 JIT, DeepGEMM's recipe, and Hybrid-EP): what its key holds of
the generic variables, its own `EP_*` and NCCL names, and the `<PREFIX>_JIT_*` family.

The EPv2 key is DeepGEMM's `name$$signature$$flags$$code` (deepseek-jit.md §3): no environment
variable, except those that become flags (`-I{nccl_root}/include`, `-DEP_NUM_TOPK_IDX_BITS=`).
"""

from __future__ import annotations

from cacheaudit.envvars import Reading, Variable, reads, shells_out, variable
from cacheaudit.runtimes._deepseek.environment import JIT_FAMILY

RUNTIME = "deepep"

_NCCL_NOTE = {RUNTIME: "the path is keyed; NCCL header content is not"}

ROWS: tuple[Variable | Reading, ...] = (
    *shells_out(RUNTIME),
    reads("CUDA_HOME", unknown=(RUNTIME,),
          notes={RUNTIME: "deep_ep/__init__.py:find_cuda_home reads it; the reference gives "
                          "no key verdict"}),
    reads("CUDA_PATH", unknown=(RUNTIME,)),

    variable("EP_NCCL_ROOT_DIR", "include-path",
             "NCCL root DeepEP passes as -I{nccl_root}/include (persisted by setup.py)",
             in_key=(RUNTIME,), notes=_NCCL_NOTE,
             source="deepseek-jit.md §3 (find_pkgs.py:find_nccl_root)"),
    variable("NCCL_DIR", "include-path", "NCCL root when EP_NCCL_ROOT_DIR is unset",
             in_key=(RUNTIME,), notes=_NCCL_NOTE,
             source="deepseek-jit.md §3 (find_pkgs.py:find_nccl_root)"),
    variable("EP_GIN_GDAKI_DEBUG", "compiler-flags",
             "adds -DNCCL_DEVICE_GIN_GDAKI_ENABLE_DEBUG=1 to DeepEP kernels",
             in_key=(RUNTIME,), source="deepseek-jit.md §3"),
    variable("EP_NUM_TOPK_IDX_BITS", "compiler-flags",
             "adds -DEP_NUM_TOPK_IDX_BITS= to DeepEP kernels (persisted by setup.py)",
             in_key=(RUNTIME,), source="deepseek-jit.md §3"),
    variable("HYBRID_EP_CACHE_DIR", "cache-location",
             "Hybrid-EP's .so cache root; every .so there is dlopen'ed at startup",
             not_in_key=(RUNTIME,),
             notes={RUNTIME: "Hybrid-EP keys only template and config integers"},
             source="deepseek-jit.md §3 (Hybrid-EP)"),
)

FAMILIES = (JIT_FAMILY,)
