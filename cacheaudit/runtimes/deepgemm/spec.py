"""DeepGEMM up to 2.6: its C++ JIT (csrc/jit/) and its 2025 Python JIT."""

from __future__ import annotations

from cacheaudit.roots import unique_paths
from cacheaudit.runtimes._deepseek.roots import home_default
from cacheaudit.spec import CompilerSetting, RuntimeSpec

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Mapping

SPEC = RuntimeSpec(
    name="deepgemm",
    title="DeepGEMM",
    layout="layout",
    roots="spec",
    policy="policy",
    cache_variables=("DG_JIT_CACHE_DIR",),
    # DeepGEMM <= 2.6 reads only DG_; on DeepJIT (2.8+) it falls back to DJ_, and a user's DJ_
    # setting must then stay the one it follows. The Python JIT (deep_gemm/jit/compiler.py, up
    # to 2025-07) keys "<nvcc path>+(major, minor)": a stand-in would change every key, so the
    # session leaves the setting alone there and the adapter records in-process. (Its first
    # release's DG_NVCC_COMPILER is no setting of ours for the same reason.)
    compiler_settings=(
        CompilerSetting("DG_JIT_NVCC_COMPILER", "nvcc", session_fills=True,
                        unless_set=("DJ_JIT_NVCC_COMPILER",),
                        path_in_key_if=("deep_gemm", "jit/compiler.py")),
    ),
    adapter="adapter",
    adapter_imports="deep_gemm.jit.compiler",
    packages=("deep_gemm", "deep-gemm"),
    variants=("nvrtc", "python"),
    environment="environment",
    docs="runtimes/deepjit.md",
)


# ------------------------------------------------------------------------------ default roots
# `SPEC.roots`: where the cache lives under an environment, in the standard library alone, so
# that a session knows the roots to watch without loading the reader.

def default_roots(env: Mapping[str, str]) -> list[str]:
    """DeepGEMM's root, its pre-2025-05 name, then DeepEP's.

    `DG_JIT_CACHE_DIR` when non-empty (empty counts as unset, as in the C++ JIT), else the
    Python JIT's pre-rename `DG_CACHE_DIR`, else `$HOME/.deep_gemm`. When only
    `DG_CACHE_DIR` is set, `$HOME/.deep_gemm` follows it: a DeepGEMM newer than the rename
    ignores the old name and writes there (the breakage of sglang #6073). Then DeepEP's
    `EP_JIT_CACHE_DIR`, else `$HOME/.deep_ep`. No HOME, no home default: DeepGEMM would use
    a path relative to its working directory.
    """
    roots: list[str] = []
    current = env.get("DG_JIT_CACHE_DIR")
    legacy = env.get("DG_CACHE_DIR")
    home = home_default(env, ".deep_gemm")
    if current:
        roots.append(current)
    elif legacy:
        roots.append(legacy)
        if home:
            roots.append(home)
    elif home:
        roots.append(home)
    ep = env.get("EP_JIT_CACHE_DIR") or home_default(env, ".deep_ep")
    if ep:
        roots.append(ep)
    return unique_paths(roots)
