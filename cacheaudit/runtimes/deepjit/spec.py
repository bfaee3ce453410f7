"""DeepJIT (deepseek-ai/DeepJIT), and DeepGEMM 2.8+ and DeepEP-Ascend built on it."""

from __future__ import annotations

from cacheaudit.roots import unique_paths
from cacheaudit.runtimes._deepseek.roots import env_path_list, home_default
from cacheaudit.spec import CompilerSetting, RuntimeSpec

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Mapping

SPEC = RuntimeSpec(
    name="deepjit",
    title="DeepJIT",
    layout="layout",
    roots="spec",
    policy="policy",
    cache_variables=("DJ_JIT_CACHE_DIR", "DG_JIT_CACHE_DIR", "EP_JIT_CACHE_DIR"),
    compiler_settings=(
        CompilerSetting("DJ_JIT_NVCC_COMPILER", "nvcc", session_fills=True),
        # Every library built on DeepJIT chooses its env prefix (`deep_jit::Config`); its
        # compiler setting is `<P>_JIT_NVCC_COMPILER`, read before DJ_'s.
        CompilerSetting("<P>_JIT_NVCC_COMPILER", "nvcc",
                        pattern=r"[A-Za-z0-9_]+_JIT_NVCC_COMPILER"),
    ),
    variants=("cuda", "rocm", "ascend"),
    environment="environment",
    docs="runtimes/deepjit.md",
)


# ------------------------------------------------------------------------------ default roots
# `SPEC.roots`: where the cache lives under an environment, in the standard library alone, so
# that a session knows the roots to watch without loading the reader.

PREFIXES = ("DG", "EP", "DJ")
"""DeepGEMM 2.8+, DeepEP-Ascend, and DeepJIT's global prefix, in the order roots are listed."""


def default_roots(env: Mapping[str, str]) -> list[str]:
    """Roots for each prefix (DG, EP, every other `<P>_JIT_CACHE_DIR` set in `env`, then
    DJ itself), as DeepJIT's Env resolves them: a library built on DeepJIT chooses its own
    prefix (`deep_jit::Config`), and only the environment says which.

    `<P>_JIT_CACHE_DIR` when set (even if empty: DeepJIT then panics and writes nothing),
    else `DJ_JIT_CACHE_DIR`, else `$HOME/.dj`; values are colon lists (first root written,
    all searched). DeepEP's EPv2 and DeepGEMM <= 2.6 roots (EP_JIT_CACHE_DIR defaulting to
    ~/.deep_ep, ~/.deep_gemm) are the deepgemm layout's.
    """
    prefixes = [*PREFIXES[:-1], *custom_prefixes(env), PREFIXES[-1]]
    return unique_paths([root for prefix in prefixes for root in prefix_roots(env, prefix)])


CACHE_DIR_TAIL = "_JIT_CACHE_DIR"


def custom_prefixes(env: Mapping[str, str]) -> list[str]:
    """The env prefixes other than DG, EP and DJ whose `<P>_JIT_CACHE_DIR` is set in `env`, in
    name order: libraries built on DeepJIT under a prefix of their own choosing."""
    return sorted(name[:-len(CACHE_DIR_TAIL)] for name in env
                  if name.endswith(CACHE_DIR_TAIL) and len(name) > len(CACHE_DIR_TAIL)
                  and name[:-len(CACHE_DIR_TAIL)] not in PREFIXES)


def prefix_roots(env: Mapping[str, str], prefix: str) -> list[str]:
    """The cache roots a runtime with env prefix `prefix` uses in `env`, the one it writes to
    first: `<P>_JIT_CACHE_DIR` when set, else `DJ_JIT_CACHE_DIR`, else `$HOME/.dj` (none without
    a HOME)."""
    items = env_path_list(env, f"{prefix}_JIT_CACHE_DIR")
    if items is None:
        items = env_path_list(env, "DJ_JIT_CACHE_DIR")
    if items is None:
        home = home_default(env, ".dj")
        items = [home] if home else []
    return items
