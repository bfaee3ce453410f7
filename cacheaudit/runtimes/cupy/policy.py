"""CuPy's kernel-cache key: what it covers, and why headers are not in it.

Source: cupy/cuda/compiler.py `_compile_with_cache_cuda` (CuPy 14.2.0). The entry name is
`sha1(key_src)` + ".cubin" (or ".ltoir"), with key_src the text

    "%s %s %s %s %s" % (env, base, source, extra_source, CUPY_CACHE_KEY)
    [+ " ne1 " + "\\0".join(sorted(name_expressions))]

- `env` = (arch, options, NVRTC version, backend) + the arch options for NVRTC; `options` is the
  whole tuple CuPy passes the compiler: the caller's, `-ftz=true`, `-dlto`, the debug flags of
  CUPY_CUDA_COMPILE_WITH_DEBUG, and the `-I` directories `assemble_cupy_compiler_options` adds
  (CCCL, CuPy's own headers, the CUDA include directory);
- `base` = the compiler's output for an empty program (a fingerprint of the compiler build);
- `source` and `extra_source` (`core._get_header_source()`) as text;
- `CUPY_CACHE_KEY`: a checksum of the headers bundled with CuPy, fixed when CuPy was built (a
  C macro in cupy/_core/core.pyx, not an environment variable).

Not covered: the content of any header the source includes. A header reached through
`options=('-I/dir',)` contributes the string "-I/dir", never its bytes. CuPy's maintainers say so
(cupy/cupy#8588: "we don't know which headers are actually used by the compiler"; cupy/cupy#941:
"contents of headers needs be a part of cache key"; cupy/cupy#9664 asks for a better mechanism
than invalidating on every header touch). `RawKernel` also memoises the loaded module per device
in memory, so a process keeps its first binary whatever happens on disk.

No CuPy adapter exists yet (CuPy needs a driver before it consults its cache; see
docs/runtimes/cupy.md), so entries have no compile records: the audit reports each as
unverifiable (CA501) besides the reader's CA402 evidence.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from cacheaudit.model import CacheEntry, CompileRecord, CompilerIdentity, Finding
from cacheaudit.policy import KeyCheck, Policy, TrackedSet

KEY_RECIPE = ("CuPy's key: sha1 of (arch, options, NVRTC version, backend), the compiler's "
              "output for an empty program, the source, extra_source, CUPY_CACHE_KEY and the "
              "sorted name expressions; no header content (cupy/cupy#8588, #941)")


class CupyPolicy(Policy):
    runtime = "cupy"

    def tracked(self, entry: CacheEntry, record: CompileRecord | None) -> TrackedSet:
        # The source is keyed as text (a saved .cu is a copy, not an input); no file is.
        return TrackedSet(frozenset(), how=KEY_RECIPE)

    def check_key(self, entry: CacheEntry, record: CompileRecord | None = None,
                  env: Mapping[str, str] | None = None) -> KeyCheck:
        return KeyCheck(None, note=("CuPy's key hashes the compiler's output for an empty "
                                    "program and the full option tuple, which only a CuPy "
                                    "adapter could record; none exists yet"))

    def compiler_change_in_key(self, recorded: CompilerIdentity,
                               current: CompilerIdentity) -> bool:
        # The NVRTC version and the empty-program preprocess output are both in the key.
        return recorded.version_text != current.version_text

    def dependency_command(self, entry: CacheEntry) -> tuple[list[str], str] | None:
        return None  # neither the options nor the include directories are on disk

    def record_findings(self, record: CompileRecord,
                        history: Sequence[CompileRecord]) -> list[Finding]:
        return []


POLICIES = {"cupy": CupyPolicy()}
