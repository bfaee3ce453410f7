"""A fleet: ledgers of 10, 100 (and, asked for, 1,000) hosts, about 10,000 compile records
each, sharing include graphs, `combine`d into one ledger and compared with `diff --by-host`.

Target (issue 17): 1,000 hosts combined and diffed by host in under a minute on this machine.

The ledgers are synthetic but in the real format, written by the real `Ledger`: one host's
ledger is recorded once (10,000 compiles of 10,000 kernels, each key its own, against eight
shared include graphs of 300 headers, nvcc with a host gcc), and each host's ledger is a copy
of it under the host's name, with its own run and record ids. Odd hosts, as a fleet has them:
host 3 (and every hundredth after it) built ten kernels with another host compiler behind nvcc;
host 7 (and every hundredth after it) built one kernel under NVCC_APPEND_FLAGS=-DX=1, which
changed its binary. The benchmark checks that `diff --by-host` names exactly those, then
reports the time of each step and its growth with the hosts (`Ratio`, no budget: there is no
baseline to hold it to). Hosts beyond those measured are extrapolated from the growth, and say
so.

Two ways to the answer are timed: `diff --by-host` over the hosts' own ledgers read in place
(`in_place_s`: the fleet's minute), and `combine` into one ledger followed by `diff --by-host`
on it (`combine_s`, `diff_s`: for keeping the fleet in one file).

    python -m benchmarks.bench_fleet            # 10 and 100 hosts
    python -m benchmarks.bench_fleet 10 100 1000
"""

from __future__ import annotations

import os
import shutil
import sqlite3
import sys
import tempfile
import time

import xxhash

from benchmarks._harness import Ratio, report
from cacheaudit.audit.diff_hosts import diff_by_host
from cacheaudit.ledger import Ledger, RunInfo, combine
from cacheaudit.model import (
    ArgToken,
    CompileRecord,
    CompilerIdentity,
    FileState,
    GraphFile,
    IncludeGraph,
)

RECORDS_PER_HOST = 10_000
GRAPHS = 8
HEADERS_PER_GRAPH = 300
ODD_COMPILER_KERNELS = 10


def _digest(text: str) -> str:
    return xxhash.xxh3_128_hexdigest(text.encode())


def _compiler(host_compiler: str) -> CompilerIdentity:
    host = CompilerIdentity(invoked="gcc", path=f"/usr/bin/{host_compiler}",
                            resolved=f"/usr/bin/x86_64-linux-gnu-{host_compiler}", kind="gcc",
                            version_text=f"{host_compiler} (Debian) 12.2.0\n",
                            digest=_digest(host_compiler), size=1000, mtime_ns=1)
    return CompilerIdentity(invoked="nvcc", path="/usr/local/bin/nvcc",
                            resolved="/usr/local/cuda/bin/nvcc", kind="nvcc",
                            version_text="Cuda compilation tools, release 13.0, V13.0.88\n",
                            digest=_digest("nvcc"), size=1000, mtime_ns=1, host=host)


def _graphs() -> list[IncludeGraph]:
    graphs = []
    for g in range(GRAPHS):
        files = []
        for n in range(HEADERS_PER_GRAPH):
            # Headers 0-199 are shared by every graph (cute/, cutlass/); the rest are the
            # graph's own.
            path = (f"/opt/cutlass/include/cute/h{n}.hpp" if n < 200
                    else f"/opt/lib/include/g{g}/h{n}.cuh")
            state = FileState(path, True, size=100 + n, mtime_ns=10**18 + n, ctime_ns=10**18 + n,
                              inode=1000 + n, digest=_digest(path))
            files.append(GraphFile(state, path))
        graphs.append(IncludeGraph(tuple(files), "nvcc -M"))
    return graphs


def template_ledger(path: str, records: int) -> None:
    """One host's ledger, recorded through the real `Ledger`."""
    compiler, graphs = _compiler("gcc-12"), _graphs()
    effective = (ArgToken("-cubin"), ArgToken("-arch=sm_90a"), ArgToken("-O3"))
    batch: list[CompileRecord] = []
    run = RunInfo(run_uuid="template-run", label="shim", host="template")
    with Ledger.open(path) as ledger:
        for n in range(records):
            source = f"/cache/kernel_{n}/kernel.cu"
            binary = f"/cache/kernel_{n}/kernel.cubin"
            batch.append(CompileRecord(
                record_id=f"{n:08d}", event="compile", started_ns=10**18 + n,
                runtime="deepjit", kernel=f"kernel_{n}", key=_digest(f"key {n}"),
                compiler=compiler, argv=tuple(t.text for t in effective),
                effective_argv=effective, env={"CUDA_HOME": "/usr/local/cuda"},
                sources=(FileState(source, True, 50, 1, 1, n, _digest(source)),),
                graph=graphs[n % GRAPHS],
                outputs=(FileState(binary, True, 5000, 1, 1, n, _digest(binary)),),
                exit_code=0, host="template", observer="shim:nvcc"))
            if len(batch) == 1000:
                ledger.add_records(batch, run)
                batch = []
        if batch:
            ledger.add_records(batch, run)


def host_ledger(template: str, path: str, index: int) -> str:
    """A copy of the template as host `index`'s own ledger; hosts 3 and 7 (mod 100) odd."""
    host = f"node-{index:04d}"
    shutil.copyfile(template, path)
    conn = sqlite3.connect(path, isolation_level=None)
    try:
        conn.execute("BEGIN")
        conn.execute("UPDATE runs SET run_uuid = ?, host = ?", (f"{host}-run", host))
        conn.execute("UPDATE records SET host = ?, record_uuid = ? || '-' || record_uuid",
                     (host, host))
        if index % 100 == 3:
            _other_host_compiler(conn)
        if index % 100 == 7:
            _append_flags(conn)
        conn.execute("COMMIT")
    finally:
        conn.close()
    return host


def _other_host_compiler(conn: sqlite3.Connection, where: str = "") -> None:
    """Kernels 0-9 built with another gcc behind the same nvcc."""
    nvcc_id, host_id = conn.execute(
        "SELECT id, host_id FROM compilers WHERE host_id IS NOT NULL").fetchone()
    columns = ("invoked, path, resolved, wrappers, kind, version_text, binary_digest, size,"
               " mtime_ns, error")
    conn.execute(f"INSERT INTO compilers (digest, {columns}, host_id) SELECT ?, invoked,"
                 " '/opt/gcc-13/bin/gcc', '/opt/gcc-13/bin/gcc', wrappers, kind,"
                 " 'gcc (GCC) 13.2.0', ?, size, mtime_ns, error, NULL FROM compilers"
                 " WHERE id = ?", (_digest("other host"), _digest("gcc-13"), host_id))
    other_host = conn.execute("SELECT last_insert_rowid()").fetchone()[0]
    conn.execute(f"INSERT INTO compilers (digest, {columns}, host_id) SELECT ?, {columns}, ?"
                 " FROM compilers WHERE id = ?", (_digest("other nvcc"), other_host, nvcc_id))
    other = conn.execute("SELECT last_insert_rowid()").fetchone()[0]
    conn.execute("UPDATE records SET compiler_id = ? WHERE kernel IN"
                 f" ({', '.join('?' * ODD_COMPILER_KERNELS)}){where}",
                 (other, *[f"kernel_{n}" for n in range(ODD_COMPILER_KERNELS)]))


def _append_flags(conn: sqlite3.Connection) -> None:
    """Kernel 5 built under NVCC_APPEND_FLAGS=-DX=1: another environment, another binary."""
    body = '{"CUDA_HOME": "/usr/local/cuda", "NVCC_APPEND_FLAGS": "-DX=1"}'
    conn.execute("INSERT INTO blobs (digest, body) VALUES (?, ?)", (_digest(body), body))
    blob = conn.execute("SELECT last_insert_rowid()").fetchone()[0]
    conn.execute("UPDATE records SET env_id = ? WHERE kernel = 'kernel_5'", (blob,))
    conn.execute("UPDATE file_states SET digest = ? WHERE id IN (SELECT g.state_id FROM"
                 " graph_files g JOIN records r ON r.outputs_id = g.graph_id"
                 " WHERE r.kernel = 'kernel_5')", (_digest("another binary"),))


def measure(workdir: str, hosts: int, template: str) -> dict[str, float]:
    directory = os.path.join(workdir, f"fleet-{hosts}")
    os.makedirs(directory)
    start = time.perf_counter()
    paths = [os.path.join(directory, f"node-{i:04d}.db") for i in range(hosts)]
    for index, path in enumerate(paths):
        host_ledger(template, path, index)
    generated = time.perf_counter() - start
    start = time.perf_counter()
    in_place = diff_by_host(paths)
    in_place_s = time.perf_counter() - start
    _check(in_place, hosts)
    combined = os.path.join(directory, "combined.db")
    start = time.perf_counter()
    with Ledger.open(combined) as target:
        merged = combine(target, paths, keep=False)
    combined_s = time.perf_counter() - start
    assert not merged.skipped, merged.skipped
    start = time.perf_counter()
    with Ledger.open(combined, create=False) as ledger:
        found = diff_by_host(ledger)
    diffed_s = time.perf_counter() - start
    _check(found, hosts)
    shutil.rmtree(directory)
    return {"generate_s": generated, "in_place_s": in_place_s, "combine_s": combined_s,
            "diff_s": diffed_s, "records": merged.records, "differing": len(found.differing)}


def _check(found, hosts: int) -> None:  # type: ignore[no-untyped-def]
    """The odd hosts, and only they, named: the benchmark measures a diff that is right."""
    odd_compiler = {f"node-{i:04d}" for i in range(hosts) if i % 100 == 3}
    odd_flags = {f"node-{i:04d}" for i in range(hosts) if i % 100 == 7}
    expected = {f"kernel_{n}": odd_compiler for n in range(ODD_COMPILER_KERNELS)}
    expected["kernel_5"] = odd_compiler | odd_flags
    named = {k.kernel: set(k.odd_hosts) for k in found.differing}
    assert named == expected, f"{hosts} hosts: {named} != {expected}"
    assert len(found.hosts) == hosts and found.compiles == hosts * RECORDS_PER_HOST


def direct_combined(template: str, path: str, hosts: int) -> None:
    """The ledger `combine` makes of `hosts` host ledgers, made directly in SQL: the template's
    records once per host, under the host's name, run and record ids, the odd hosts changed as
    `host_ledger` changes them. The copies share every graph, state, compiler and value, as
    `combine` (content-addressed) makes them share: only the records and runs are new. For the
    diff's cost at a scale whose `combine` takes too long to wait for."""
    shutil.copyfile(template, path)
    conn = sqlite3.connect(path, isolation_level=None)
    try:
        conn.execute("BEGIN")
        # Millions of rows go in faster with the records' indexes made afterwards, in one
        # sorted pass each, than kept up to date row by row.
        indexes = [row for row in conn.execute(
            "SELECT name, sql FROM sqlite_master WHERE type = 'index' AND tbl_name = 'records'"
            " AND sql IS NOT NULL")]
        for name, _sql in indexes:
            conn.execute(f"DROP INDEX {name}")
        conn.execute("CREATE TEMP TABLE fleet (i INTEGER PRIMARY KEY)")
        conn.executemany("INSERT INTO fleet (i) VALUES (?)", [(i,) for i in range(hosts)])
        conn.execute("INSERT INTO runs (run_uuid, started_ns, host, pid, label, command,"
                     " cacheaudit_version) SELECT printf('node-%04d-run', f.i), started_ns,"
                     " printf('node-%04d', f.i), pid, label, command, cacheaudit_version"
                     " FROM runs CROSS JOIN temp.fleet f WHERE run_uuid = 'template-run'")
        columns = ("event, runtime, kernel, key, entry_id, compiler_id, argv_id,"
                   " effective_argv_id, env_id, cwd_id, sources_id, graph_id, outputs_id,"
                   " tracked_id, exit_code, signal, started_ns, duration_ns, pid, test_id,"
                   " observer, notes_id, extra_id")
        conn.execute(
            f"INSERT INTO records (record_uuid, run_id, host, {columns})"
            " SELECT printf('node-%04d-', f.i) || r.record_uuid, u.id, u.host,"
            f" {', '.join('r.' + c.strip() for c in columns.split(','))}"
            " FROM temp.fleet f JOIN runs u ON u.run_uuid = printf('node-%04d-run', f.i)"
            " CROSS JOIN records r WHERE r.host = 'template'")
        conn.execute("DELETE FROM records WHERE host = 'template'")
        conn.execute("DELETE FROM runs WHERE run_uuid = 'template-run'")
        for _name, sql in indexes:
            conn.execute(sql)
        odd_compiler = [f"node-{i:04d}" for i in range(hosts) if i % 100 == 3]
        odd_flags = [f"node-{i:04d}" for i in range(hosts) if i % 100 == 7]
        _odd_in(conn, odd_compiler, _other_host_compiler)
        _odd_in(conn, odd_flags, _append_flags_shared)
        conn.execute("COMMIT")
    finally:
        conn.close()


def _odd_in(conn: sqlite3.Connection, hosts: list[str], change) -> None:  # type: ignore[no-untyped-def]
    """`change` (written for one host's ledger) applied to the records of `hosts` only."""
    if not hosts:
        return
    conn.execute("CREATE TEMP TABLE IF NOT EXISTS odd_hosts (host TEXT PRIMARY KEY)")
    conn.execute("DELETE FROM temp.odd_hosts")
    conn.executemany("INSERT INTO temp.odd_hosts (host) VALUES (?)", [(h,) for h in hosts])
    change(conn, " AND host IN (SELECT host FROM temp.odd_hosts)")


def _append_flags_shared(conn: sqlite3.Connection, where: str) -> None:
    """`_append_flags` where the binary's state is shared by every host: the odd hosts' kernel
    5 gets a binary (state, outputs graph) of its own."""
    body = '{"CUDA_HOME": "/usr/local/cuda", "NVCC_APPEND_FLAGS": "-DX=1"}'
    conn.execute("INSERT INTO blobs (digest, body) VALUES (?, ?)", (_digest(body), body))
    blob = conn.execute("SELECT last_insert_rowid()").fetchone()[0]
    conn.execute("INSERT INTO file_states (file_id, present, size, mtime_ns, ctime_ns, inode,"
                 " digest, settled, error) SELECT s.file_id, s.present, s.size, s.mtime_ns,"
                 " s.ctime_ns, s.inode, ?, s.settled, s.error FROM records r JOIN graph_files g"
                 " ON g.graph_id = r.outputs_id JOIN file_states s ON s.id = g.state_id"
                 " WHERE r.kernel = 'kernel_5' LIMIT 1", (_digest("another binary"),))
    state = conn.execute("SELECT last_insert_rowid()").fetchone()[0]
    conn.execute("INSERT INTO graphs (digest, method, file_count) VALUES (?, 'outputs', 1)",
                 (_digest("another binary graph"),))
    graph = conn.execute("SELECT last_insert_rowid()").fetchone()[0]
    conn.execute("INSERT INTO graph_files (graph_id, position, state_id, written_id)"
                 " SELECT ?, 0, ?, file_id FROM file_states WHERE id = ?", (graph, state, state))
    conn.execute(f"UPDATE records SET env_id = ?, outputs_id = ? WHERE kernel = 'kernel_5'"
                 f"{where}", (blob, graph))


def measure_diff_only(workdir: str, hosts: int, template: str) -> dict[str, float]:
    path = os.path.join(workdir, f"direct-{hosts}.db")
    start = time.perf_counter()
    direct_combined(template, path, hosts)
    built = time.perf_counter() - start
    start = time.perf_counter()
    with Ledger.open(path, create=False) as ledger:
        found = diff_by_host(ledger)
    diffed = time.perf_counter() - start
    _check(found, hosts)
    size = os.path.getsize(path)
    os.remove(path)
    return {"build_s": built, "diff_s": diffed, "bytes": size,
            "differing": len(found.differing)}


def main_diff_only(hosts: int) -> None:
    """`python -m benchmarks.bench_fleet --diff-only 1000`: the diff alone, over a combined
    ledger made in SQL (`direct_combined`)."""
    workdir = tempfile.mkdtemp(prefix="cacheaudit-fleet-")
    try:
        template = os.path.join(workdir, "template.db")
        template_ledger(template, RECORDS_PER_HOST)
        figures = measure_diff_only(workdir, hosts, template)
    finally:
        shutil.rmtree(workdir, ignore_errors=True)
    report(f"fleet diff by host alone {hosts} hosts", [], {
        "records": f"{hosts * RECORDS_PER_HOST:,} ({RECORDS_PER_HOST:,} per host)",
        "combined ledger made in SQL in": f"{figures['build_s']:.1f} s "
                                          f"({figures['bytes'] / 2**30:.1f} GiB)",
        "diff --by-host": f"{figures['diff_s']:.1f} s ({figures['differing']} kernels differ)"})


def main(argv: list[str] | None = None) -> None:
    """`argv`: the command line's arguments (`python -m benchmarks.bench_fleet ...`); none
    under `python -m benchmarks`, whose own arguments are not this module's."""
    args = list(argv or ())
    if args[:1] == ["--diff-only"]:
        main_diff_only(int(args[1]))
        return
    scales = [int(a) for a in args] or [10, 100]
    workdir = tempfile.mkdtemp(prefix="cacheaudit-fleet-")
    try:
        template = os.path.join(workdir, "template.db")
        start = time.perf_counter()
        template_ledger(template, RECORDS_PER_HOST)
        recorded_s = time.perf_counter() - start
        results = {hosts: measure(workdir, hosts, template) for hosts in scales}
    finally:
        shutil.rmtree(workdir, ignore_errors=True)
    facts: dict[str, object] = {"records per host": RECORDS_PER_HOST,
                                "shared include graphs": f"{GRAPHS} x {HEADERS_PER_GRAPH}",
                                "one host's ledger recorded in": f"{recorded_s:.1f} s"}
    for hosts, figures in results.items():
        total = figures["combine_s"] + figures["diff_s"]
        facts[f"{hosts} hosts"] = (
            f"{figures['records']:,} records: diff --by-host of the host ledgers in place "
            f"{figures['in_place_s']:.1f} s; combine {figures['combine_s']:.1f} s, then "
            f"diff --by-host {figures['diff_s']:.1f} s, together {total:.1f} s "
            f"({figures['differing']} kernels differ; generating the copies took "
            f"{figures['generate_s']:.1f} s)")
    ratios = []
    smallest = min(results)
    for hosts in sorted(results):
        if hosts == smallest:
            continue
        for step in ("in_place_s", "combine_s", "diff_s"):
            ratios.append(Ratio(f"{step[:-2]}: {hosts} hosts against {smallest}",
                                results[hosts][step], results[smallest][step], None))
    largest = max(results)
    if 1000 not in results:
        # Both steps grow with the records: per host, as measured at the largest scale.
        per_host = (results[largest]["combine_s"] + results[largest]["diff_s"]) / largest
        in_place = results[largest]["in_place_s"] / largest
        facts["1000 hosts (extrapolated, not measured)"] = (
            f"in place about {in_place * 1000:.0f} s; combine and diff about "
            f"{per_host * 1000:.0f} s; linear in the hosts from {largest}")
    report("fleet combine and diff by host", ratios, facts)


if __name__ == "__main__":
    main(sys.argv[1:])
