"""A scan judges its entries a chunk at a time (`scan.SCAN_CHUNK`: one chunk's records in
memory, not the whole cache's): the findings, their order and the totals must be exactly those
of a scan that loads every entry at once.

The cache is DeepJIT's real format (kernel.cu, kernel.cubin, meta.json, .committed) with real
compile records in a real ledger: half the entries were built against a header that was edited
afterwards (CA101, stale), half against one that was not (CA102); every seventh has no record
(CA501), every eleventh lacks its .committed marker and one has a damaged meta.json (CA402).
"""

from __future__ import annotations

import json
import os
import shutil
import time
from collections import Counter
from pathlib import Path

import xxhash

from cacheaudit.audit import AuditOptions, scan
from cacheaudit.digest import StateCache
from cacheaudit.ledger import Ledger, RunInfo, new_record_id
from cacheaudit.model import (
    ArgToken,
    CompileRecord,
    CompilerIdentity,
    FileState,
    GraphFile,
    IncludeGraph,
)

ENTRIES = 60


def _write(path: Path, body: bytes) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(body)


def _build(base: Path) -> tuple[Path, Path, Path]:
    """The cache root, its ledger and the header edited after the builds."""
    include = base / "include"
    tile, fresh, stale = (include / "deep_gemm" / "tile.cuh", include / "cute" / "fresh.hpp",
                          include / "cute" / "stale.hpp")
    for header in (tile, fresh, stale):
        _write(header, f"// {header.name}\n".encode())
    states = StateCache(window_ns=0)
    graphs = [IncludeGraph(tuple(GraphFile(states.capture(str(h)), str(h)) for h in (tile, other)),
                           "nvcc -M") for other in (fresh, stale)]
    root = base / "dj"
    compiler = CompilerIdentity(invoked="nvcc", path="/usr/local/bin/nvcc",
                                resolved="/usr/local/cuda/bin/nvcc", kind="nvcc",
                                version_text="Cuda compilation tools, release 13.0\n",
                                digest="0" * 32)
    meta = json.dumps({
        "command": f"nvcc {root}/tmp/x/kernel.cu --cubin --include-path {include}",
        "config": {"python_library_root": str(base), "extra_signature": "",
                   "include_dirs": [str(include)], "include_prefixes": ["deep_gemm/"]},
        "compiler_info": {"path": compiler.path, "version": compiler.version_text},
        "compiler_options": {"arch": "90a", "nvcc_flags": [], "post_hook": None}}).encode()
    records = []
    for n in range(ENTRIES):
        key = xxhash.xxh3_128_hexdigest(str(n).encode())
        entry = root / "cache" / f"gemm_{n}.{key}"
        started_ns = time.time_ns()
        source = f"#include <deep_gemm/tile.cuh>\n// kernel {n}\n".encode()
        binary = f"ELF cubin {n}".encode()
        _write(entry / "kernel.cu", source)
        _write(entry / "kernel.cubin", binary)
        _write(entry / "meta.json", b"{not json" if n == 5 else meta)
        if n % 11:
            _write(entry / ".committed", b"")
        if n % 7 == 0:
            continue
        built = root / "tmp" / "x"
        records.append(CompileRecord(
            record_id=new_record_id(), event="compile", started_ns=started_ns,
            compiler=compiler, effective_argv=(ArgToken(f"--include-path={include}"),),
            sources=(FileState(str(built / "kernel.cu"), True, len(source), 1, 1, n,
                               xxhash.xxh3_128_hexdigest(source)),),
            graph=graphs[n % 2], exit_code=0, observer="test",
            outputs=(FileState(str(built / "kernel.cubin"), True, len(binary), 1, 1, n,
                               xxhash.xxh3_128_hexdigest(binary)),)))
    ledger = base / "ledger.db"
    with Ledger.open(str(ledger)) as opened:
        opened.add_records(records, RunInfo(run_uuid="test", label="test"))
    _write(stale, b"// stale.hpp, edited after every build\n")
    return root, ledger, stale


def _copy_ledger(ledger: Path, to: Path) -> Path:
    to.mkdir()
    for name in os.listdir(ledger.parent):
        if name.startswith(ledger.name):
            shutil.copy2(ledger.parent / name, to / name)
    return to / ledger.name


def _scanned(root: Path, ledger: Path, chunk: int):
    with Ledger.open(str(ledger)) as opened:
        return scan([str(root)], dict(os.environ), ledger=opened,
                    options=AuditOptions(reconstruct=False), chunk=chunk)


def test_chunked_scan_reports_what_one_load_of_every_entry_reports(tmp_path: Path):
    root, ledger, stale = _build(tmp_path)
    whole_ledger, chunked_ledger = (_copy_ledger(ledger, tmp_path / "whole"),
                                    _copy_ledger(ledger, tmp_path / "chunked"))
    # Twice: the first scan ties entries by their source's digest and attributes them, the
    # second by those attributions.
    for attempt in ("first", "second"):
        whole = _scanned(root, whole_ledger, chunk=ENTRIES)
        chunked = _scanned(root, chunked_ledger, chunk=7)
        codes = Counter(f.code for f in whole.findings)
        stale_hits = {f.entry: f.code for f in whole.findings if f.subject == str(stale)}
        # The ground truth of the cache as built: every recorded odd entry read the edited
        # header; the one whose meta.json is damaged has no tracked set to judge it by.
        assert stale_hits == {str(e): "CA501" if e.name.startswith("gemm_5.") else "CA101"
                              for e in (root / "cache").iterdir()
                              if int(e.name.split(".")[0][5:]) % 2
                              and int(e.name.split(".")[0][5:]) % 7}, attempt
        assert codes["CA402"] >= 1 + len(range(0, ENTRIES, 11)), (attempt, codes)
        assert whole.matched == ENTRIES - len(range(0, ENTRIES, 7)), attempt
        assert len(chunked.entries) == len(whole.entries) == ENTRIES, attempt
        assert (chunked.matched, chunked.reconstructed, chunked.reconstructed_now) == (
            whole.matched, whole.reconstructed, whole.reconstructed_now), attempt
        # Record ids are the same in both ledgers (copies of one): the findings are equal,
        # field by field, in the same order.
        assert chunked.findings == whole.findings, attempt
