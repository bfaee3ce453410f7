"""FlashInfer's JIT key: what it covers, and ninja's decision rerun to check it.

Source: flashinfer-python 0.7.4, `flashinfer/jit/core.py` and `jit/cpp_ext.py`. FlashInfer has
no key of its own for a JIT module. `JitSpecNvcc.try_load` returns only an AOT library
(core.py:577-611: "the freshness of the JIT-path .so is owned by ninja's dependency scan"), so
every `build_and_load` (core.py:372-393) writes build.ninja when its text changed
(core.py:552-571) and runs `ninja -C cached_ops/<name>` (core.py:618-640, cpp_ext.py:411-445).
ninja decides alone, from command lines and mtimes (`NinjaPolicy`); what it tracks:

- a `.cu` object: the source and every header nvcc's `--generate-dependencies-with-compile`
  depfile lists, `-isystem` ones included (cpp_ext.py:316-319);
- a `.cpp` object: the source and the headers `-MMD` lists (cpp_ext.py:311-314): none reached
  through `-isystem`, and every include root FlashInfer adds itself is `-isystem` (its own
  data/include and data/csrc, CUTLASS, tvm_ffi, dlpack, spdlog, $cuda_home/include, Python's;
  cpp_ext.py:136-179). Only the vendored CCCL roots and a module's extra include dirs are `-I`;
- on the command lines (build.ninja's variables): `cuda_home`, `$CXX`, `FLASHINFER_NVCC`, the
  two launchers and `FLASHINFER_EXTRA_{CFLAGS,CUDAFLAGS,LDFLAGS}` (cpp_ext.py:182-301), as text.

Never tracked: file contents (a header whose bytes changed under an older mtime, as a
reinstall leaves it, is served stale), the binaries behind `$cuda_home/bin/nvcc` and `c++`, the
variables nvcc and the host compiler read themselves (`NVCC_PREPEND_FLAGS`,
`NVCC_APPEND_FLAGS`, `CPATH` and its family).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from cacheaudit.model import CacheEntry, Finding
from cacheaudit.runtimes._ninja.policy import NinjaPolicy

TRACKED_HOW = ("ninja's deps log (.cu objects: nvcc's depfile, -isystem headers included; .cpp "
               "objects: -MMD, no -isystem header, and FlashInfer's own include roots are all "
               "-isystem) plus the sources; build.ninja's commands")


class FlashInferPolicy(NinjaPolicy):
    """FlashInfer's JIT modules (the module docstring)."""

    runtime = "flashinfer"
    tracked_how = TRACKED_HOW

    def key_remedy(self, entry: CacheEntry | None) -> str | None:
        return ("put a digest of {input} on build.ninja's command lines, through "
                "FLASHINFER_EXTRA_CUDAFLAGS (or FLASHINFER_EXTRA_CFLAGS for .cpp sources), e.g. "
                "-DDEPS_DIGEST=<digest>: ninja rebuilds when a command changes, never when "
                "contents do")

    def scan_findings(self, entries: Sequence[CacheEntry],
                      env: Mapping[str, str]) -> list[Finding]:
        """CA105 for each JIT module that an AOT library of the same name beside the installed
        package shadows (the layout's `aot_library`): `try_load` returns that library before any
        build, with no freshness check (core.py:577-611), so the module in the workspace, its
        sources and headers are never what FlashInfer runs."""
        from cacheaudit.findings import make_finding

        findings = []
        for entry in entries:
            aot = entry.meta.get("aot_library")
            if not aot:
                continue
            findings.append(make_finding(
                "CA105", subject=str(aot), entry=entry,
                message=f"FlashInfer loads the AOT library {aot} for module {entry.kernel}, "
                        f"not this JIT build: try_load returns it before any build, and "
                        f"nothing compares it with the module's sources",
                current=str(aot),
                how="the installed flashinfer package's data/aot/<name>/<name>.so, found "
                    "without importing it (FlashInfer's load order: AOT first)",
                hint="remove the AOT library (or reinstall the package built from these "
                     "sources) to run the JIT module, or evict the module from the workspace"))
        return findings


POLICIES = {"flashinfer": FlashInferPolicy()}
