"""Verifying a recorded include graph of the CUTLASS reference TU, against bare loops.

Budgets (DESIGN.md): at most 1.5x the bare `os.stat` loop over the same files when nothing
changed; at most 1.2x the bare read+xxh3 loop when every file must be re-hashed.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile

import xxhash

from benchmarks._harness import Ratio, interleaved, report
from cacheaudit.digest import StateCache, changed_files
from cacheaudit.graph import graph_from_depfile
from cacheaudit.ledger import Ledger, RunInfo, new_record_id
from cacheaudit.model import CompileRecord, FileState, IncludeGraph
from fixtures import reference_tu


def _reference_graph(workdir: str) -> tuple[list[FileState], IncludeGraph]:
    include = reference_tu.cutlass_include()
    compiler = shutil.which("nvcc") or shutil.which("g++")
    if include is None or compiler is None:
        sys.exit("needs the nvidia-cutlass wheel and nvcc (or g++)")
    source = reference_tu.write_source(workdir)
    depfile = os.path.join(workdir, "reference.d")
    flags = (reference_tu.nvcc_flags(include) if compiler.endswith("nvcc")
             else ["-std=c++17", "-x", "c++", "-D__CUDACC__", "-I", include])
    subprocess.run([compiler, *flags, "-M", "-MF", depfile, source], check=True,
                   capture_output=True)
    with open(depfile, encoding="utf-8") as handle:
        _sources, graph = graph_from_depfile(handle.read(), workdir, [source],
                                            StateCache(window_ns=0), f"{compiler} -M")
    return [f.state for f in graph.files], graph


def main() -> None:
    workdir = tempfile.mkdtemp(prefix="cacheaudit-bench-")
    try:
        states, graph = _reference_graph(workdir)
        paths = [s.path for s in states]
        size = sum(s.size for s in states)

        def stat_loop() -> None:
            for path in paths:
                os.stat(path)

        def hash_loop() -> None:
            for path in paths:
                with open(path, "rb") as handle:
                    xxhash.xxh3_128_hexdigest(handle.read())

        def verify_unchanged() -> None:
            assert not changed_files(states, StateCache())

        unsettled = [FileState(**{**s.to_dict(), "settled": False}) for s in states]

        def verify_rehash() -> None:
            assert not changed_files(unsettled, StateCache())

        # The same graph as stored in and loaded from a ledger, as `cacheaudit scan` sees it.
        ledger_path = os.path.join(workdir, "ledger.db")
        with Ledger.open(ledger_path) as ledger:
            ledger.add_records([CompileRecord(record_id=new_record_id(), event="compile",
                                              started_ns=0, graph=graph, observer="bench")],
                               RunInfo(run_uuid="bench", label="bench"))

        def load_and_verify() -> None:
            with Ledger.open(ledger_path) as ledger:
                [record] = ledger.records()
                assert not changed_files([f.state for f in record.graph.files], StateCache())

        unchanged = Ratio("verify, nothing changed / bare os.stat loop",
                          *interleaved(verify_unchanged, stat_loop, repeat=200), budget=1.5)
        rehash = Ratio("verify, everything re-hashed / bare read+xxh3 loop",
                       *interleaved(verify_rehash, hash_loop, repeat=60), budget=1.2)
        loaded = Ratio("load graph from ledger + verify / bare os.stat loop",
                       *interleaved(load_and_verify, stat_loop, repeat=60), budget=None)
        report("graph verification", [unchanged, rehash, loaded],
               {"files": len(paths), "bytes": size, "method": graph.method})
    finally:
        shutil.rmtree(workdir, ignore_errors=True)


if __name__ == "__main__":
    main()
