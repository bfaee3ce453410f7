"""A scan judges its entries a chunk at a time (`scan.SCAN_CHUNK`: one chunk's records in
memory, not the whole cache's), and a large one judges its chunks in forked workers, one per
core (`scan.PARALLEL_FROM`): the findings, their order and the totals must be exactly those of
one process that loads every entry at once.

The cache is DeepJIT's real format (kernel.cu, kernel.cubin, meta.json, .committed) with real
compile records in a real ledger: half the entries were built against a header that was edited
afterwards (CA101, stale), half against one that was not (CA102); every seventh has no record
(CA501), every eleventh lacks its .committed marker and one has a damaged meta.json (CA402).
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
import time
from collections import Counter
from pathlib import Path

import xxhash

from cacheaudit import children
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


def _scanned(root: Path, ledger: Path, chunk: int, workers: int = 1):
    with Ledger.open(str(ledger)) as opened:
        return scan([str(root)], dict(os.environ), ledger=opened,
                    options=AuditOptions(reconstruct=False), chunk=chunk, workers=workers)


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


def _attributed(ledger: Path) -> list[tuple[str, str]]:
    with Ledger.open(str(ledger)) as opened:
        return sorted((r.record_id, r.entry or "") for r in opened.records(with_graphs=False))


def test_a_scan_in_forked_workers_reports_what_one_process_reports(tmp_path: Path,
                                                                   monkeypatch):
    root, ledger, stale = _build(tmp_path)
    serial_ledger, forked_ledger = (_copy_ledger(ledger, tmp_path / "serial"),
                                    _copy_ledger(ledger, tmp_path / "forked"))
    # A temporary directory of the scans' own, to see that they leave nothing in it.
    private = tmp_path / "tmp"
    private.mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(private))
    monkeypatch.setenv("TMPDIR", str(private))
    pools: list[tuple[int, int]] = []

    class Counted(children.ForkedMap):
        """The real pool, counted: (tasks, workers) of each one the scans start."""

        def __init__(self, work, count: int, workers: int) -> None:
            pools.append((count, workers))
            super().__init__(work, count, workers)

    monkeypatch.setattr(children, "ForkedMap", Counted)
    for attempt in ("first", "second"):
        serial = _scanned(root, serial_ledger, chunk=ENTRIES)
        # Chunks of 7 shared by three workers: every worker judges several, out of order.
        forked = _scanned(root, forked_ledger, chunk=7, workers=3)
        codes = Counter(f.code for f in serial.findings)
        # The cache as built: stale (CA101), unrecorded (CA501), damaged and uncommitted
        # (CA402) entries are all there to be judged alike.
        assert codes["CA101"] and codes["CA501"] and codes["CA402"], (attempt, codes)
        assert [e.path for e in forked.entries] == [e.path for e in serial.entries], attempt
        assert (forked.matched, forked.reconstructed, forked.reconstructed_now) == (
            serial.matched, serial.reconstructed, serial.reconstructed_now), attempt
        assert forked.findings == serial.findings, attempt
        # The workers' ties went into the ledger as this process's would have.
        assert _attributed(forked_ledger) == _attributed(serial_ledger), attempt
        # No worker outlives the scan, and none left a file behind.
        assert children.live() == [] and not _children_of_this_process(), attempt
    # Each scan: workers of one process each were given what was read so far (2 chunks or
    # more) while the scan read on; three shared the rest with what those had not begun.
    finals = [n for n, (_tasks, workers) in enumerate(pools) if workers == 3]
    assert len(finals) == 2 and finals[-1] == len(pools) - 1, pools
    heads = [pools[:finals[0]], pools[finals[0] + 1:finals[1]]]
    assert all(h and all(w == 1 and t >= 2 for t, w in h) for h in heads), pools
    assert os.listdir(private) == []
    assert stale.exists()


def _children_of_this_process() -> list[int]:
    """Pids of this process's children that have not been reaped (from /proc)."""
    me, found = os.getpid(), []
    for name in os.listdir("/proc"):
        if name.isdigit():
            try:
                with open(f"/proc/{name}/stat") as handle:
                    fields = handle.read().rsplit(")", 1)[1].split()
            except OSError:
                continue
            if int(fields[1]) == me:
                found.append(int(name))
    return found
