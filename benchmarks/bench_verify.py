"""Verifying a recorded include graph of the CUTLASS reference TU, against bare loops.

Budgets (DESIGN.md): at most 1.5x the bare `os.stat` loop over the same files when nothing
changed; at most 1.2x the bare read+xxh3 loop when every file must be re-hashed.
"""

from __future__ import annotations

import os
import shutil
import tempfile

import xxhash

from benchmarks._harness import Ratio, interleaved, reference_graph, report
from cacheaudit.digest import StateCache, changed_files
from cacheaudit.ledger import Ledger, RunInfo, new_record_id
from cacheaudit.model import CompileRecord, FileState


def main() -> None:
    workdir = tempfile.mkdtemp(prefix="cacheaudit-bench-")
    try:
        graph, _include = reference_graph(workdir)
        states = [f.state for f in graph.files]
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
