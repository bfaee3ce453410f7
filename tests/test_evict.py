"""`cacheaudit evict` and `cacheaudit stats` as a user runs them, on caches the reference runtime
(fixtures/minijit, DeepJIT's cache semantics) built for real through the compiler shim.

Ground truth for evict: the runtime's next request after the eviction is a miss (it compiles),
and its binary equals the same request's in a new process against an empty cache. Ground truth
for stats: the entries and bytes counted on disk here, and the requests the test made. Every
`--json` run's document is checked against the schema shipped in the package (docs/json.md).
"""

from __future__ import annotations

import hashlib
import json
import os
import sqlite3
import subprocess
import sys
from pathlib import Path

import pytest

from cacheaudit.evidence import utc_iso
from cacheaudit.exceptions import ExitCode
from cacheaudit.progress import ProgressLines

from support import valid_document
from truth_table import Project, _write

HEALTHY = """\
#include <envconst.h>
#ifdef __CUDACC__
__global__
#endif
void plain(int* out) { out[0] = ENV_VALUE; }
"""
"""A kernel that never reaches cutlite/detail.h: the header edit leaves it fresh."""


@pytest.fixture
def project(tmp_path: Path) -> Project:
    project = Project(tmp_path / "p", "gxx")
    project.setup()
    return project


def cacheaudit(project: Project, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "cacheaudit", *args, "--ledger",
                           str(project.ledger)], capture_output=True, text=True,
                          env=project.env, cwd=project.root, timeout=300)


def cacheaudit_json(project: Project, kind: str, *args: str
                    ) -> tuple[subprocess.CompletedProcess[bytes], dict]:
    """`cacheaudit ARGS --json`: the process, and its document, validated as a `kind`."""
    done = subprocess.run([sys.executable, "-m", "cacheaudit", *args, "--json", "--ledger",
                           str(project.ledger)], capture_output=True, env=project.env,
                          cwd=project.root, timeout=300)
    return done, valid_document(done.stdout, kind)


def tree_digest(root: Path) -> dict[str, str]:
    """Every path under `root` with its content's (or symlink target's) digest and mode."""
    found = {}
    for directory, dirs, files in os.walk(root):
        for name in dirs + files:
            path = Path(directory) / name
            st = path.lstat()
            if path.is_symlink():
                body = os.readlink(path).encode()
            elif path.is_file():
                body = path.read_bytes()
            else:
                body = b""
            found[str(path.relative_to(root))] = (
                f"{st.st_mode:o}:{st.st_mtime_ns}:{hashlib.sha256(body).hexdigest()}")
    return found


def stale_cache(project: Project) -> tuple[dict, dict]:
    """gemm (which reads cutlite/detail.h, untracked) and plain (which does not) built, then
    detail.h edited: gemm's entry is stale, plain's is not. Returns the two build answers."""
    driver = project.driver()
    try:
        gemm = driver.compile()
        plain = driver.compile(HEALTHY, name="plain")
    finally:
        driver.close()
    assert gemm["event"] == plain["event"] == "compile"
    _write(project.root / "third" / "cutlite" / "detail.h", "#pragma once\n#define DETAIL 4\n")
    return gemm, plain


def request(project: Project, source: str, name: str) -> dict:
    """One request of kernel `name` in a new runtime process."""
    driver = project.driver()
    try:
        return driver.compile(source, name=name)
    finally:
        driver.close()


def evictions(project: Project) -> list[dict]:
    conn = sqlite3.connect(project.ledger)
    conn.row_factory = sqlite3.Row
    try:
        return [dict(r) for r in conn.execute("SELECT * FROM evictions ORDER BY id")]
    finally:
        conn.close()


def test_evict_removes_the_stale_entry_and_the_next_request_compiles_what_a_fresh_cache_does(
        project: Project):
    gemm, plain = stale_cache(project)
    served = project.once()
    fresh = project.fresh()
    assert served["event"] == "disk-hit" and served["digest"] != fresh, \
        "the truth: the runtime serves gemm's old binary after the header edit"
    plain_before = tree_digest(Path(plain["path"]))
    killed = Path(gemm["path"]).parent / ".cacheaudit-evicted-0123"  # a killed evict's trash
    _write(killed / "kernel.so", "half-deleted")
    built_ns = Path(gemm["binary"]).stat().st_mtime_ns

    done, answer = cacheaudit_json(project, "evict", "evict", str(project.cache))

    assert done.returncode == ExitCode.CLEAN, done.stdout + done.stderr
    [outcome] = answer["outcomes"]
    assert (outcome["entry"], outcome["status"], outcome["codes"]) == (
        gemm["path"], "evicted", ["CA101"]), outcome
    assert outcome["paths"] == [gemm["path"]] and outcome["root"] == str(project.cache)
    assert [f["subject"] for f in outcome["findings"] if f["code"] == "CA101"] == [
        str(project.root / "third" / "cutlite" / "detail.h")], outcome["findings"]
    assert (outcome["built_ns"], outcome["built"]) == (built_ns, utc_iso(built_ns)), outcome
    assert answer["totals"] == {"roots": 1, "entries": 2, "chosen": 1, "evicted": 1,
                                "would_evict": 0, "skipped": 0, "failed": 0,
                                "bytes": outcome["bytes"]}, answer["totals"]
    assert not os.path.lexists(gemm["path"]), f"the stale entry {gemm['path']} is still there"
    assert tree_digest(Path(plain["path"])) == plain_before, \
        f"the healthy entry {plain['path']} was touched"
    leftovers = [n for n in os.listdir(Path(gemm["path"]).parent) if n.startswith(".cacheaudit")]
    assert leftovers == [], f"trash left in the cache: {leftovers}"
    after = project.once()
    assert after["event"] == "compile", f"the request after the eviction was a {after['event']}"
    assert after["digest"] == fresh, "the rebuilt binary differs from a fresh compile's"
    assert request(project, HEALTHY, "plain")["event"] == "disk-hit", \
        "the healthy entry no longer serves"

    logged = evictions(project)
    assert [(r["entry"], r["code"], r["outcome"]) for r in logged] == [
        (gemm["path"], "CA101", "evicted")], logged
    assert logged[0]["subject"].endswith("cutlite/detail.h"), logged[0]
    assert logged[0]["bytes"] == outcome["bytes"] > 0 and logged[0]["runtime"] == "deepjit", \
        logged[0]
    assert logged[0]["audit_uuid"] == answer["audit_uuid"], (logged[0], answer["audit_uuid"])
    assert json.loads(logged[0]["codes"]) == ["CA101"], logged[0]
    conn = sqlite3.connect(project.ledger)
    try:
        run_label = conn.execute("SELECT label FROM runs WHERE id = ?",
                                 (logged[0]["run_id"],)).fetchone()[0]
        chose = conn.execute("SELECT code, entry FROM findings WHERE audit_uuid = ?",
                             (logged[0]["audit_uuid"],)).fetchall()
    finally:
        conn.close()
    assert run_label == "evict"
    assert ("CA101", gemm["path"]) in chose, chose
    rescan = project.scan()
    assert not [f for f in rescan["findings"] if f["severity"] == "error"], rescan["findings"]


def test_dry_run_changes_nothing_and_says_what_would_go(project: Project):
    gemm, _ = stale_cache(project)
    project.once()
    cacheaudit(project, "scan", str(project.cache), "--fail-on", "never")  # the ledger settles
    before = tree_digest(project.cache)

    said = cacheaudit(project, "evict", str(project.cache), "--dry-run")
    done, answer = cacheaudit_json(project, "evict", "evict", str(project.cache), "--dry-run")

    assert said.returncode == done.returncode == ExitCode.CLEAN, said.stderr + str(done.stderr)
    assert tree_digest(project.cache) == before, "a dry run changed the cache"
    shown = " ".join(said.stdout.split())
    assert shown.startswith(f"{gemm['path']}: would evict (CA101 error) finding CA101 ") and \
        "/third/cutlite/detail.h" in shown, said.stdout
    assert [(o["entry"], o["status"], o["codes"]) for o in answer["outcomes"]] == [
        (gemm["path"], "would-evict", ["CA101"])], answer["outcomes"]
    size = sum(p.stat().st_size for p in Path(gemm["path"]).rglob("*") if p.is_file())
    assert answer["outcomes"][0]["bytes"] == size
    assert (answer["dry_run"], answer["audit_uuid"]) == (True, None)
    assert (answer["totals"]["would_evict"], answer["totals"]["evicted"],
            answer["totals"]["bytes"]) == (1, 0, size), answer["totals"]
    assert shown.endswith(answer["summary"]), said.stdout
    assert evictions(project) == []
    assert project.once()["event"] == "disk-hit", "the entry stopped serving after a dry run"


def test_severity_select_runtime_and_entry_choose_what_goes(project: Project):
    gemm, plain = stale_cache(project)
    # Warnings reach plain too (CPATH is set and envconst.h is untracked: CA201, CA102).
    _, warned = cacheaudit_json(project, "evict", "evict", str(project.cache), "--dry-run",
                                "--severity", "warning")
    assert {o["entry"] for o in warned["outcomes"]} == {gemm["path"], plain["path"]}
    _, ignored = cacheaudit_json(project, "evict", "evict", str(project.cache), "--dry-run",
                                 "--ignore", "CA1")
    assert ignored["outcomes"] == [], ignored["outcomes"]
    _, other = cacheaudit_json(project, "evict", "evict", str(project.cache), "--dry-run",
                               "--runtime", "triton")
    assert other["outcomes"] == []
    mistyped = cacheaudit(project, "evict", str(project.cache), "--runtime", "tritn")
    assert mistyped.returncode == ExitCode.USAGE and "--runtime tritn" in mistyped.stderr
    assert os.path.isdir(gemm["path"]), "a refused option evicted something"
    # A root given whole beside an entry keeps every entry of the root.
    _, both = cacheaudit_json(project, "evict", "evict", str(project.cache), plain["path"],
                              "--dry-run", "--severity", "warning")
    assert {o["entry"] for o in both["outcomes"]} == {gemm["path"], plain["path"]}
    # An entry named on the command line (a file in it) narrows the choice to that entry.
    only_plain = cacheaudit(project, "evict", str(Path(plain["path"]) / "kernel.cu"),
                            "--severity", "warning")
    assert only_plain.returncode == ExitCode.CLEAN, only_plain.stdout + only_plain.stderr
    assert not os.path.lexists(plain["path"]) and os.path.isdir(gemm["path"]), only_plain.stdout


def test_a_path_outside_every_cache_root_is_refused_in_one_line(project: Project):
    gemm, _ = stale_cache(project)
    before = tree_digest(project.root / "third")
    for target in (project.root / "third", project.root, project.root / "nothing-here"):
        done = cacheaudit(project, "evict", str(target))
        assert done.returncode == ExitCode.USAGE, (target, done.stdout, done.stderr)
        assert len(done.stderr.strip().splitlines()) == 1, done.stderr
        assert done.stderr.startswith(f"cacheaudit: error: {target}: "), done.stderr
    assert tree_digest(project.root / "third") == before
    assert os.path.isdir(gemm["path"])
    between = cacheaudit(project, "evict", str(project.cache / "cache"))
    assert between.returncode == ExitCode.USAGE, between.stdout + between.stderr
    assert f"inside the cache root {project.cache} but in none of its entries" in between.stderr


def test_an_entry_that_is_a_symlink_out_of_its_root_is_never_followed(project: Project):
    gemm, _ = stale_cache(project)
    elsewhere = project.root / "elsewhere"
    subprocess.run(["cp", "-a", gemm["path"], str(elsewhere)], check=True)
    link = Path(gemm["path"]).parent / ("evil." + "0" * 32)
    link.symlink_to(elsewhere)
    outside_before = tree_digest(elsewhere)

    named = cacheaudit(project, "evict", str(link))
    assert named.returncode == ExitCode.USAGE, named.stdout + named.stderr
    assert "leads out of its cache root" in named.stderr, named.stderr

    whole, answer = cacheaudit_json(project, "evict", "evict", str(project.cache), "--severity",
                                    "warning")
    outcomes = {o["entry"]: o for o in answer["outcomes"]}
    assert outcomes[str(link)]["status"] == "skipped", outcomes
    assert "leads out of the cache root" in outcomes[str(link)]["reason"]
    assert whole.returncode == ExitCode.FINDINGS, "a stale entry left in place must not pass"
    assert link.is_symlink() and tree_digest(elsewhere) == outside_before
    assert outcomes[gemm["path"]]["status"] == "evicted" and not os.path.lexists(gemm["path"])
    assert (answer["totals"]["skipped"], answer["totals"]["evicted"]) == (1, len(outcomes) - 1)


def test_a_reader_that_opened_the_entry_keeps_its_files(project: Project):
    gemm, _ = stale_cache(project)
    binary = gemm["binary"]
    expected = Path(binary).read_bytes()
    with open(binary, "rb") as reader:
        done = cacheaudit(project, "evict", str(project.cache))
        assert done.returncode == ExitCode.CLEAN, done.stdout + done.stderr
        assert not os.path.lexists(gemm["path"])
        assert reader.read() == expected, "an open reader lost the entry's bytes"


def test_stats_count_what_the_disk_and_the_requests_say(project: Project):
    driver = project.driver()
    try:
        driver.compile()                          # gemm: compile
        driver.compile()                          # memory hit
        driver.compile(HEALTHY, name="plain")     # plain: compile
    finally:
        driver.close()
    assert project.once()["event"] == "disk-hit"  # a new process: disk hit
    _write(project.root / "third" / "cutlite" / "detail.h", "#pragma once\n#define DETAIL 4\n")
    entries = sorted(p for p in (project.cache / "cache").iterdir() if p.is_dir())
    on_disk = sum(p.stat().st_size for e in entries for p in e.rglob("*") if p.is_file())
    built = [(e / "kernel.so").stat().st_mtime_ns for e in entries]

    done, answer = cacheaudit_json(project, "stats", "stats", str(project.cache))

    assert done.returncode == ExitCode.CLEAN, done.stdout + done.stderr
    rows = [t for t in answer["tallies"] if t["entries"]]
    assert len(rows) == 1, answer["tallies"]
    row = rows[0]
    assert (row["runtime"], row["root"]) == ("deepjit", str(project.cache))
    assert row["entries"] == len(entries) == 2
    assert row["bytes"] == on_disk
    assert (row["compiles"], row["disk_hits"], row["memory_hits"]) == (2, 1, 1), row
    assert row["hit_rate"] == pytest.approx(2 / 4)
    assert (row["stale"], row["unverifiable"]) == (1, 0), row
    assert (row["oldest_ns"], row["newest_ns"]) == (min(built), max(built))
    assert (row["oldest"], row["newest"]) == (utc_iso(min(built)), utc_iso(max(built))), row
    assert answer["judged"] is True and answer["ledger"] == str(project.ledger)
    total = answer["total"]
    assert (total["runtime"], total["root"], total["entries"], total["bytes"], total["stale"]) \
        == (None, None, 2, on_disk, 1), total

    assert cacheaudit(project, "evict", str(project.cache)).returncode == ExitCode.CLEAN
    _, counted = cacheaudit_json(project, "stats", "stats", str(project.cache), "--no-scan")
    row = next(t for t in counted["tallies"] if t["entries"])
    assert (row["entries"], row["evicted"], row["stale"]) == (1, 1, None), row
    assert counted["judged"] is False and counted["total"]["unverifiable"] is None
    table = cacheaudit(project, "stats", str(project.cache))
    # The head wraps after a long path (an xdist worker's tmp path): compare words.
    assert " ".join(table.stdout.split()).startswith(f"{project.cache}: deepjit "), table.stdout
    assert "    hit rate " in table.stdout and "    evicted   1\n" in table.stdout, table.stdout


def test_progress_lines_come_at_most_every_ten_seconds():
    now = [0.0]
    lines: list[str] = []
    progress = ProgressLines(lines.append, clock=lambda: now[0])
    for done in range(1, 101):
        now[0] += 0.5  # an entry every half second: 50 s in all
        progress(done, 100)
    assert lines == [f"cacheaudit: auditing: {n}/100 entries\n" for n in (20, 40, 60, 80, 100)]
    quiet: list[str] = []
    short = ProgressLines(quiet.append, clock=lambda: now[0])
    short(1, 1)
    assert quiet == [], "a scan shorter than the interval printed a line"


def test_without_a_terminal_scans_report_progress_in_lines():
    from cacheaudit import cli_shared

    assert not sys.stderr.isatty()  # pytest captures stderr: no terminal, as in CI
    with cli_shared.progress(True) as advance:
        assert isinstance(advance, ProgressLines), advance
    with cli_shared.progress(False) as advance:
        assert advance is None, "--no-progress still reported progress"


def test_a_reader_listing_the_entry_sees_all_of_it_or_none_while_it_goes(tmp_path: Path):
    import threading

    from cacheaudit.audit.evict import remove

    entry = tmp_path / "cache" / ("k." + "a" * 32)
    names = {f"part{i:04d}.sass" for i in range(3000)} | {".committed", "kernel.so"}
    entry.mkdir(parents=True)
    for name in names:
        (entry / name).write_bytes(b"x")
    seen: list[int] = []
    stop = threading.Event()

    def reader() -> None:
        # A listing counts while the path still names the directory it read: one begun before
        # the rename reads on in the trash while it is deleted, which no reader of the path
        # sees (a listing is many getdents calls, none of them atomic with the deletion).
        while not stop.is_set():
            try:
                fd = os.open(entry, os.O_RDONLY | os.O_DIRECTORY)
            except FileNotFoundError:
                seen.append(0)
                continue
            try:
                inode, count = os.fstat(fd).st_ino, len(os.listdir(fd))
            finally:
                os.close(fd)
            try:
                still = os.stat(entry).st_ino == inode
            except FileNotFoundError:
                still = False
            seen.append(count if still else -1)

    thread = threading.Thread(target=reader)
    thread.start()
    try:
        while not seen:
            pass
        gone, problem = remove((str(entry),))
    finally:
        stop.set()
        thread.join()
    assert (gone, problem) == (True, "")
    assert not entry.exists() and os.listdir(tmp_path / "cache") == []
    partial = sorted({n for n in seen if n not in (-1, 0, len(names))})
    assert partial == [], f"a reader listed {entry} half removed: {partial[:5]} of {len(names)}"


def _reconstructed(project: Project) -> list[str]:
    """The entries whose inputs a scan reconstructed (the ledger keeps each reconstruction)."""
    if not project.ledger.exists():
        return []
    from cacheaudit.ledger import Ledger

    with Ledger.open(str(project.ledger)) as ledger:
        return [r.entry for r in ledger.records(where="r.entry_id IS NOT NULL",
                                                with_graphs=False) if r.reconstructed]


def test_stats_and_evict_scan_with_the_configuration_and_the_options_scan_takes(
        project: Project):
    """`[tool.cacheaudit] reconstruct = false` holds for stats and evict as for scan, and
    `--reconstruct` on their command line beats it; what the scan then finds is the truth."""
    import shutil

    real = shutil.which(project.compiler_name, path=os.environ.get("PATH"))
    built = project.once(DG_JIT_NVCC_COMPILER=real, CACHEAUDIT_DISABLE="1")  # before recording
    (project.root / "pyproject.toml").write_text("[tool.cacheaudit]\nreconstruct = false\n")

    # evict first: it creates the ledger, where stats (which only opens one) would keep what it
    # reconstructed.
    for command in ("evict", "stats"):
        done, _ = cacheaudit_json(project, command, command, str(project.cache),
                                  *(["--dry-run"] if command == "evict" else []))
        assert done.returncode == ExitCode.CLEAN, done.stderr
        assert _reconstructed(project) == [], f"{command} reconstructed {built['path']}"
    refused = cacheaudit(project, "stats", str(project.cache), "--include-dir",
                         str(project.root / "nowhere"))
    assert refused.returncode == ExitCode.USAGE and "nowhere: no such directory" in \
        refused.stderr, refused.stderr

    done, _ = cacheaudit_json(project, "stats", "stats", str(project.cache), "--reconstruct")
    assert done.returncode == ExitCode.CLEAN, done.stderr
    assert _reconstructed(project) == [built["path"]]
    # Ground truth: after the edit the runtime serves the old binary, not a fresh compile's.
    _write(project.root / "third" / "cutlite" / "detail.h", "#pragma once\n#define DETAIL 4\n")
    served = project.once()
    assert served["event"] == "disk-hit" and served["digest"] != project.fresh()
    _, counted = cacheaudit_json(project, "stats", "stats", str(project.cache))
    [row] = [t for t in counted["tallies"] if t["entries"]]
    assert (row["stale"], row["unverifiable"]) == (1, 0), (built["path"], row)
    _, ignored = cacheaudit_json(project, "stats", "stats", str(project.cache), "--ignore",
                                 "CA101")
    [row] = [t for t in ignored["tallies"] if t["entries"]]
    assert row["stale"] == 0, f"--ignore CA101 still counted {built['path']} stale: {row}"
