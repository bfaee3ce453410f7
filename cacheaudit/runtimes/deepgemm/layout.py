# DeepGEMM <= 2.6 on-disk cache layout: the C++ JIT (csrc/jit/compiler.hpp, kernel_runtime.hpp,
# 2025-07 on), the older Python JIT (deep_gemm/jit/compiler.py, 2025-02 to 2025-07), and DeepEP's
# EPv2 JIT (csrc/jit/, a near-copy of DeepGEMM's at 7f2a703).
#
#   <root>/                      DeepGEMM: DG_JIT_CACHE_DIR (non-empty), else $HOME/.deep_gemm;
#                                before 2025-05-07 (bfe983c) the Python JIT read DG_CACHE_DIR.
#                                DeepEP: EP_JIT_CACHE_DIR (non-empty), else $HOME/.deep_ep
#     cache/
#       kernel.<name>.<hash>/    one entry; no marker file, no metadata
#         kernel.cu              the generated source. Since DeepGEMM 7f2a703 (2026-04-17), and
#                                in DeepEP, its first line is
#                                  // Includes' hash value: <32 hex>
#                                the digest of the tracked <deep_gemm/...> (<deep_ep/...>) headers
#                                (LaunchRuntime::generate); older entries have no such line
#         kernel.cubin           the binary; the Python JIT's first versions wrote kernel.so
#                                (ctypes) with kernel.args, the reference runtime's g++ mode
#                                writes kernel.so
#         kernel.ptx             optional, DG_JIT_DUMP_PTX / DG_JIT_DUMP_ASM
#         kernel.sass            optional, DG_JIT_DUMP_SASS / DG_JIT_DUMP_ASM
#     tmp/
#       <pid>-<8hex>-<8hex>-<8hex>/     since 7f2a703: a whole build, fsynced, then renamed to
#                                       cache/kernel.<name>.<hash> (the rename loser removes
#                                       its copy); left behind when the writer is killed
#       <pid>-<8hex>-<8hex>-<8hex>      before 7f2a703 (C++ JIT): a temporary kernel.cu or cubin
#                                       file renamed into an entry directory created in place
#       file.tmp.<uuid4>.<md5[:12]>     Python JIT: put() writes here, then os.replace
#       nvcc.tmp.<uuid4>.<md5[:12]>.cubin (.so)   Python JIT: nvcc's output, then os.replace
#
#   name    the kernel's name (sm90_fp8_gemm_1d2d, ...)
#   hash    C++ JIT and DeepEP: 32 lowercase hex, get_hex_digest (two FNV-1a-64 passes, then
#           splitmix) of "name$$signature$$flags$$code"; Python JIT: md5(signature)[:12]
#
# Hit rule. C++ JIT (KernelRuntimeCache::get -> KernelRuntime::check_validity): a missing
# directory is a miss; a directory lacking kernel.cu or kernel.cubin makes DeepGEMM print
# "Corrupted JIT cache directory (missing kernel.cu or kernel.cubin): <dir>, please run
# `rm -rf <dir>` and restart your task." and assert. Python JIT (Runtime.is_path_valid): a hit
# iff kernel.cubin exists (first versions: kernel.cu, kernel.args and kernel.so); otherwise it
# recompiles into the same directory. Neither leaves a disk-visible trace of a hit.
"""Reader for DeepGEMM <= 2.6 and DeepEP EPv2 caches: one CacheEntry per
`<root>/cache/kernel.<name>.<hash>/`.

Why it matters: this layout records no compiler, flags or environment at all, so the reader
gives the audit what can be had: the binary and source states, and since 7f2a703 the tracked
include digest the runtime wrote into kernel.cu, which a policy can recompute against the
headers on disk now.

DeepEP writes the same layout under its own root; the reader tells the two apart by the
tracked includes at the top of kernel.cu (`<deep_ep/...>` means runtime "deepep"), not by the
root, which any variable can point anywhere. Symlinks are treated as in the deepjit reader:
followed, and named in the problems when they lead out of the cache directory.
"""

from __future__ import annotations

import os
import re
from collections.abc import Collection, Iterator, Mapping

from cacheaudit.digest import StateCache
from cacheaudit.layout import Layout, capture, read_head
from cacheaudit.model import CacheEntry, CacheLeftover
from cacheaudit.runtimes._deepseek.layout import (
    DEEPGEMM_ENTRY_RE,
    DEEPJIT_ENTRY_RE,
    TMP_NAME_RE,
    has_entry_named,
    has_tmp_named,
    list_entry,
    only_killed_builds,
    read_cache_root,
    symlinks_outside,
)
from cacheaudit.runtimes.deepgemm.spec import default_roots as spec_default_roots

RUNTIME = "deepgemm"
RUNTIME_DEEPEP = "deepep"
LAYOUT_NAME = "deepgemm"

SOURCE = "kernel.cu"
BINARIES = ("kernel.cubin", "kernel.so")
PYTHON_HASH_LEN = 12
NVRTC = "nvrtc"
"""`CacheEntry.meta["compiler"]` of a Python JIT entry NVRTC built (no kernel.cu)."""

INCLUDE_HASH_PREFIX = b"// Includes' hash value: "
_INCLUDE_HASH_RE = re.compile(r"[0-9a-f]{32}")
_DEEP_EP_INCLUDE_RE = re.compile(rb"#\s*include\s*<deep_ep/")
_DEEP_GEMM_INCLUDE_RE = re.compile(rb"#\s*include\s*<deep_gemm/")
_PYTHON_TMP_RE = re.compile(r"(?:nvcc|hgcc|file)\.tmp\..+")

ODD_NAME_REASON = ("directory in cache/ whose name is not kernel.<name>.<hash>: DeepGEMM never "
                   "looks it up")
PYTHON_TMP_REASON = ("temporary file of the Python JIT that was never os.replace'd into place "
                     "(a crashed or interrupted compile or write)")
_TMP_FILE_REASONS = {"nvcc.tmp.": PYTHON_TMP_REASON, "hgcc.tmp.": PYTHON_TMP_REASON,
                     "file.tmp.": PYTHON_TMP_REASON}

CORRUPTED = ("DeepGEMM's C++ JIT (KernelRuntime::check_validity) prints \"Corrupted JIT cache "
             "directory (missing kernel.cu or kernel.cubin)\" and asserts on the first lookup of "
             "this key, until the directory is removed")


class DeepGemmReader(Layout):
    """The `Reader` for DeepGEMM's (and DeepEP's) layout; see the module header for the format."""

    layout = LAYOUT_NAME
    runtime = RUNTIME

    def default_roots(self, env: Mapping[str, str]) -> list[str]:
        """DeepGEMM's root, its pre-2025-05 name, then DeepEP's (the spec's `default_roots`)."""
        return spec_default_roots(env)

    def is_root(self, path: str) -> bool:
        """A `cache/` holding a `kernel.<name>.<hash>` directory, or (no entry of either layout
        yet) a `cache/` beside a `tmp/` with build directories or the Python JIT's temporary
        files. A DeepJIT root says no.

        A root holding only build directories is claimed by both readers, because DeepJIT and
        DeepGEMM >= 7f2a703 name them alike: saying no here would hide a crashed DeepGEMM
        build in a default root that only this reader is asked about. Callers that read one
        root with both readers should count a leftover once per path. So is a root holding
        only a killed first build (`only_killed_builds`: DeepGEMM 2.x, like DeepJIT, creates
        `cache/` at its first publication), so that a `~/.deep_gemm` left so is not refused.
        """
        cache_dir = os.path.join(path, "cache")
        if not os.path.isdir(cache_dir):
            return only_killed_builds(path)
        if has_entry_named(cache_dir, DEEPGEMM_ENTRY_RE):
            return True
        if has_entry_named(cache_dir, DEEPJIT_ENTRY_RE):
            return False
        tmp_dir = os.path.join(path, "tmp")
        return (has_tmp_named(tmp_dir, _PYTHON_TMP_RE, dirs=False)
                or has_tmp_named(tmp_dir, TMP_NAME_RE, dirs=True))

    def read(self, root: str, cache: StateCache) -> Iterator[CacheEntry | CacheLeftover]:
        return read_cache_root(root, cache, runtime=RUNTIME, layout=LAYOUT_NAME,
                               own=DEEPGEMM_ENTRY_RE, other=DEEPJIT_ENTRY_RE, read_entry=read_entry,
                               odd_name_reason=ODD_NAME_REASON,
                               file_reason=_TMP_FILE_REASONS)


def parse_head(head: bytes) -> tuple[str | None, str | None, bool]:
    """(include_hash, problem, is_deepep) from the first bytes of a generated kernel.cu.

    The include-hash line is DeepGEMM's own record of its tracked-header digest; a first line
    that starts like it but does not hold 32 hex digits is a damaged source.
    """
    include_hash: str | None = None
    problem: str | None = None
    if head.startswith(INCLUDE_HASH_PREFIX):
        line = head[len(INCLUDE_HASH_PREFIX):].split(b"\n", 1)[0].rstrip(b"\r")
        text = line.decode("ascii", "replace").strip()
        if _INCLUDE_HASH_RE.fullmatch(text):
            include_hash = text
        else:
            problem = (f"the first line of {SOURCE} starts like DeepGEMM's include-hash line but "
                       f"holds {text!r}, not 32 hex digits")
    is_deepep = bool(_DEEP_EP_INCLUDE_RE.search(head)) and not _DEEP_GEMM_INCLUDE_RE.search(head)
    return include_hash, problem, is_deepep


def nvrtc_mode(names: Collection[str]) -> bool:
    """Whether a Python JIT entry was built by NVRTC (`DG_JIT_USE_NVRTC=1`, 8dfa329): that mode
    compiles the code in memory and writes only kernel.cubin, while NVCC mode `put`s kernel.cu
    before it compiles, so a published NVCC entry always holds it. (A kernel.cu deleted by hand
    reads the same; the runtime serves the cubin either way.)"""
    return "kernel.cubin" in names and SOURCE not in names and "kernel.args" not in names


def read_entry(root: str, item: os.DirEntry[str], name: str, digest: str, boundary: str,
               cache: StateCache) -> CacheEntry:
    """One entry directory, with every reason it is corrupt or partial (CA402 evidence)."""
    path = item.path
    python_jit = len(digest) == PYTHON_HASH_LEN
    names, problems = list_entry(item, boundary, "DeepGEMM")
    if names is None:
        return CacheEntry(runtime=RUNTIME, layout=LAYOUT_NAME, root=root, path=path, kernel=name,
                          key=digest, problems=tuple(problems))

    binary_name = next((b for b in BINARIES if b in names),
                       "kernel.so" if "kernel.args" in names else "kernel.cubin")
    problems += symlinks_outside(names, (binary_name, SOURCE), boundary)

    binary = capture(path, binary_name, names, cache)
    source = capture(path, SOURCE, names, cache)
    if python_jit:
        if not binary.exists:
            problems.append(f"{binary_name} is missing: the Python JIT (Runtime.is_path_valid) "
                            "treats the key as a miss and recompiles into this directory in "
                            "place; an interrupted compile leaves exactly this")
        if not source.exists and not nvrtc_mode(names):
            problems.append(f"{SOURCE} is missing: the Python JIT loads the binary without it, "
                            "but the binary can no longer be tied to its source")
    else:
        missing = [n for n, state in ((SOURCE, source), (binary_name, binary))
                   if not state.exists]
        if missing:
            verb = "is" if len(missing) == 1 else "are"
            problems.append(f"{' and '.join(missing)} {verb} missing: {CORRUPTED} (DeepGEMM before "
                            "7f2a703 created entry directories in place, so a crashed compile "
                            "left exactly this)")
    if binary.exists and binary.digest is None:
        problems.append(f"{binary_name} cannot be read: {binary.error}")
    elif binary.exists and binary.size == 0:
        problems.append(f"{binary_name} is empty (0 bytes): DeepGEMM counts the entry as a hit "
                        "and then fails to load it")
    if source.exists and source.digest is None:
        problems.append(f"{SOURCE} cannot be read: {source.error}")

    include_hash: str | None = None
    runtime = RUNTIME
    if source.readable:
        head = read_head(source.path)
        if head is not None:
            include_hash, problem, is_deepep = parse_head(head)
            if problem is not None:
                problems.append(problem)
            if is_deepep:
                runtime = RUNTIME_DEEPEP

    meta = {"compiler": NVRTC} if python_jit and nvrtc_mode(names) else {}
    return CacheEntry(runtime=runtime, layout=LAYOUT_NAME, root=root, path=path, kernel=name,
                      key=digest, binary=binary, source=source, committed_ns=None, meta=meta,
                      include_hash=include_hash, files=tuple(sorted(names)),
                      problems=tuple(problems))


LAYOUT = DeepGemmReader()
