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


def _other_host_compiler(conn: sqlite3.Connection) -> None:
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
                 f" ({', '.join('?' * ODD_COMPILER_KERNELS)})",
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
    return {"generate_s": generated, "combine_s": combined_s, "diff_s": diffed_s,
            "records": merged.records, "differing": len(found.differing)}


def _check(found, hosts: int) -> None:  # type: ignore[no-untyped-def]
    """The odd hosts, and only they, named: the benchmark measures a diff that is right."""
    odd_compiler = {f"node-{i:04d}" for i in range(hosts) if i % 100 == 3}
    odd_flags = {f"node-{i:04d}" for i in range(hosts) if i % 100 == 7}
    expected = {f"kernel_{n}": odd_compiler for n in range(ODD_COMPILER_KERNELS)}
    expected["kernel_5"] = odd_compiler | odd_flags
    named = {k.kernel: set(k.odd_hosts) for k in found.differing}
    assert named == expected, f"{hosts} hosts: {named} != {expected}"
    assert len(found.hosts) == hosts and found.compiles == hosts * RECORDS_PER_HOST


def main(argv: list[str] | None = None) -> None:
    scales = [int(a) for a in (argv if argv is not None else sys.argv[1:])] or [10, 100]
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
            f"{figures['records']:,} records: combine {figures['combine_s']:.1f} s, "
            f"diff --by-host {figures['diff_s']:.1f} s, together {total:.1f} s "
            f"({figures['differing']} kernels differ; generating the copies took "
            f"{figures['generate_s']:.1f} s)")
    ratios = []
    smallest = min(results)
    for hosts in sorted(results):
        if hosts == smallest:
            continue
        for step in ("combine_s", "diff_s"):
            ratios.append(Ratio(f"{step[:-2]}: {hosts} hosts against {smallest}",
                                results[hosts][step], results[smallest][step], None))
    largest = max(results)
    if 1000 not in results:
        # Both steps grow with the records: per host, as measured at the largest scale.
        per_host = (results[largest]["combine_s"] + results[largest]["diff_s"]) / largest
        facts["1000 hosts (extrapolated, not measured)"] = (
            f"about {per_host * 1000:.0f} s, linear in the hosts from {largest}")
    report("fleet combine and diff by host", ratios, facts)


if __name__ == "__main__":
    main()
