"""The standing reliability suite (issue 13): many writers on one ledger, SIGKILLs at random
points of shim compiles, counted against what each writer says it wrote.

Every writer is a real process: shim compiles with the real g++ through the masquerade
directory, in-process recorders (`record_event`, as the Triton and NVRTC adapters call it) in
their own Python processes, and `cacheaudit scan` writing the records it reconstructs with a real
`g++ -M`. The default run keeps each case to about 15 s; the slow cases run the same for a
minute. Each case leaves its counts for docs/reliability.md (`reliability_figure`).
"""

from __future__ import annotations

import contextlib
import json
import os
import random
import signal
import subprocess
import sys
import textwrap
import time
from collections import Counter
from pathlib import Path
from typing import Any

import pytest

from cacheaudit.ledger import Ledger, ingest_spool
from cacheaudit.model import CompileRecord

from support import GXX, ShimEnv, needs_gxx, reliability_figure

# ------------------------------------------------------------------------------------------
# Writers: each is a process that writes until its deadline and then says what it wrote
# ------------------------------------------------------------------------------------------

SHIM_WRITER = textwrap.dedent("""
    import json, os, subprocess, sys, time
    name, cwd, deadline, report = sys.argv[1], sys.argv[2], float(sys.argv[3]), sys.argv[4]
    stop = report + ".stop"
    done = []
    n = 0
    while time.time() < deadline and not os.path.exists(stop):
        output = os.path.join("..", "out", f"{name}_{n}.o")
        result = subprocess.run(["g++", "-c", "-I", "../inc", "k.cpp", "-o", output],
                                cwd=cwd, capture_output=True)
        if result.returncode == 0:
            done.append(os.path.normpath(os.path.join(cwd, output)))
        n += 1
    with open(report + ".tmp", "w") as handle:
        json.dump({"outputs": done, "tried": n}, handle)
    os.replace(report + ".tmp", report)
""")

RECORDER_WRITER = textwrap.dedent("""
    import json, os, sys, time
    from cacheaudit.model import FileState, GraphFile, IncludeGraph
    from cacheaudit.recorder import record_event
    name, deadline, report = sys.argv[1], float(sys.argv[2]), sys.argv[3]
    written, problems = [], []
    n = 0
    while time.time() < deadline:
        files = tuple(GraphFile(FileState(path=f"/inc/{name}/h{i}.h", exists=True, size=i,
                                          mtime_ns=n, ctime_ns=n, inode=i, digest="%032x" % i,
                                          settled=True), f"h{i}.h") for i in range(n % 7 + 1))
        record_id = f"{name}-{n:06d}"
        problem = record_event(runtime="triton", kernel=name, event="compile",
                               observer="reliability", record_id=record_id,
                               argv=(f"{name}.py", str(n)), exit_code=0,
                               graph=IncludeGraph(files, "trace"))
        written.append(record_id)
        if problem:
            problems.append(problem)
        n += 1
    with open(report + ".tmp", "w") as handle:
        json.dump({"records": written, "problems": problems}, handle)
    os.replace(report + ".tmp", report)
""")

SCAN_WRITER = textwrap.dedent("""
    import json, os, subprocess, sys, time
    compiler, base, deadline, report = sys.argv[1], sys.argv[2], float(sys.argv[3]), sys.argv[4]
    entries, failures, rounds = [], [], 0
    while time.time() < deadline:
        root = os.path.join(base, f"root{rounds}")
        made = []
        for e in range(3):
            entry = os.path.join(root, "cache", f"k{e}.{rounds:016x}{e:016x}")
            os.makedirs(entry)
            os.makedirs(os.path.join(root, "tmp"), exist_ok=True)
            build = os.path.join(root, "tmp", "BUILD")
            with open(os.path.join(entry, "kernel.cu"), "w") as f:
                f.write('#include "../../k.h"\\nint k() { return K; }\\n')
            with open(os.path.join(entry, "kernel.so"), "wb") as f:
                f.write(b"\\x7fELF" + bytes(60) + entry.encode())
            with open(os.path.join(entry, "meta.json"), "w") as f:
                json.dump({"command": f"{compiler} -x c++ {build}/kernel.cu -fPIC -shared "
                                      f"-o {build}/kernel.so",
                           "config": {"python_library_root": root, "extra_signature": "",
                                      "include_dirs": [], "include_prefixes": ["k/"]},
                           "compiler_info": {"path": compiler, "version": "g++ 12\\n"},
                           "compiler_options": {}}, f)
            open(os.path.join(entry, ".committed"), "w").close()
            made.append(entry)
        with open(os.path.join(root, "k.h"), "w") as f:
            f.write("#define K 1\\n")
        done = subprocess.run([sys.executable, "-m", "cacheaudit", "scan", "--json",
                               "--fail-on", "never", root], capture_output=True, text=True)
        if done.returncode == 0:
            entries.extend(made)
        else:
            failures.append(done.stderr[-500:])
        rounds += 1
    with open(report + ".tmp", "w") as handle:
        json.dump({"entries": entries, "failures": failures, "rounds": rounds}, handle)
    os.replace(report + ".tmp", report)
""")


def _start(script: str, *args: str, env: dict[str, str], cwd: Path) -> subprocess.Popen[bytes]:
    return subprocess.Popen([sys.executable, "-c", script, *args], env=env, cwd=cwd,
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)


def _finish(process: subprocess.Popen[bytes], report: Path, limit: float) -> dict[str, Any]:
    try:
        _, stderr = process.communicate(timeout=limit)
    except subprocess.TimeoutExpired:
        process.kill()
        process.communicate()
        pytest.fail(f"writer {report.name} still running {limit:.0f} s after its deadline")
    assert process.returncode == 0, stderr.decode(errors="replace")[-2000:]
    return json.loads(report.read_text())


def _all_records(ledger_path: Path) -> list[CompileRecord]:
    with Ledger.open(str(ledger_path)) as ledger:
        ingest_spool(ledger)
        assert ledger.integrity_check() == "ok"
        return ledger.records()


def _tree(root: Path) -> Path:
    (root / "src").mkdir(parents=True)
    (root / "inc").mkdir()
    (root / "out").mkdir()
    (root / "inc" / "api.h").write_text('#pragma once\n#include "detail.h"\n#define API 1\n')
    (root / "inc" / "detail.h").write_text("#pragma once\n#define DETAIL 2\n")
    (root / "src" / "k.cpp").write_text('#include "api.h"\nint k() { return API + DETAIL; }\n')
    return root


# ------------------------------------------------------------------------------------------
# Concurrency: 16 writers of three kinds on one ledger
# ------------------------------------------------------------------------------------------


def _concurrency(shim_env: ShimEnv, tmp_path: Path, seconds: float, case: str) -> None:
    tree = _tree(tmp_path / "tree")
    reports = tmp_path / "reports"
    reports.mkdir()
    env = dict(shim_env.env)
    env["PYTHONPATH"] = os.pathsep.join(
        p for p in (str(Path(__file__).resolve().parent.parent), env.get("PYTHONPATH")) if p)
    deadline = time.time() + seconds
    writers: list[tuple[str, subprocess.Popen[bytes], Path]] = []
    started = time.monotonic()
    for i in range(9):
        report = reports / f"shim{i}.json"
        writers.append(("shim", _start(SHIM_WRITER, f"shim{i}", str(tree / "src"), str(deadline),
                                       str(report), env=env, cwd=tree / "src"), report))
    bare = shim_env.bare_env({"PYTHONPATH": env["PYTHONPATH"]})
    for i in range(6):
        report = reports / f"recorder{i}.json"
        writers.append(("recorder", _start(RECORDER_WRITER, f"recorder{i}", str(deadline),
                                           str(report), env=bare, cwd=tmp_path), report))
    report = reports / "scan.json"
    (tmp_path / "scans").mkdir()
    writers.append(("scan", _start(SCAN_WRITER, GXX or "g++", str(tmp_path / "scans"),
                                   str(deadline), str(report), env=bare, cwd=tmp_path), report))
    said = [(kind, _finish(process, path, seconds + 120)) for kind, process, path in writers]
    elapsed = time.monotonic() - started

    records = _all_records(shim_env.ledger)
    shim_outputs = [o for kind, r in said if kind == "shim" for o in r["outputs"]]
    recorder_ids = [i for kind, r in said if kind == "recorder" for i in r["records"]]
    scan_entries = [e for kind, r in said if kind == "scan" for e in r["entries"]]
    assert [r["failures"] for kind, r in said if kind == "scan"] == [[]]

    by_output = Counter(o.path for r in records if r.observer.startswith("shim") for o in r.outputs)
    by_id = Counter(r.record_id for r in records)
    by_entry = Counter(r.entry for r in records if r.reconstructed)
    lost = ([o for o in shim_outputs if by_output[o] == 0]
            + [i for i in recorder_ids if by_id[i] == 0]
            + [e for e in scan_entries if by_entry[e] == 0])
    duplicated = ([o for o in shim_outputs if by_output[o] > 1]
                  + [i for i in recorder_ids if by_id[i] > 1]
                  + [e for e in scan_entries if by_entry[e] > 1])
    half_written = []
    headers = {str(tree / "inc" / "api.h"), str(tree / "inc" / "detail.h")}
    wanted_ids = set(recorder_ids)
    for record in records:
        if record.observer.startswith("shim"):
            complete = (record.graph is not None and headers <= set(record.graph.paths)
                        and [s.path for s in record.sources] == [str(tree / "src" / "k.cpp")]
                        and all(o.digest for o in record.outputs))
        elif record.record_id in wanted_ids:
            name, n = record.record_id.rsplit("-", 1)
            complete = (record.kernel == name and list(record.argv) == [f"{name}.py", str(int(n))]
                        and record.graph is not None
                        and len(record.graph.files) == int(n) % 7 + 1)
        elif record.reconstructed:
            complete = record.graph is not None and any(
                p.endswith("/k.h") for p in record.graph.paths)
        else:
            complete = False  # a record no writer claims
        if not complete:
            half_written.append(record.record_id)
    reliability_figure(
        "concurrency", case, writers=len(writers), shim_writers=9, recorder_writers=6,
        scan_writers=1, seconds=round(elapsed, 1), shim_records=len(shim_outputs),
        recorder_records=len(recorder_ids), reconstructed_records=len(scan_entries),
        records=len(records), records_lost=len(lost), records_duplicated=len(duplicated),
        records_half_written=len(half_written),
        spooled=sum(len(r.get("problems", ())) for _, r in said))
    assert lost == [] and duplicated == [] and half_written == []
    assert len(records) == len(shim_outputs) + len(recorder_ids) + len(scan_entries)
    assert shim_outputs and recorder_ids and scan_entries, "a kind of writer wrote nothing"


@needs_gxx
def test_sixteen_writers_of_three_kinds_lose_nothing(shim_env: ShimEnv, tmp_path: Path):
    _concurrency(shim_env, tmp_path, 12, "16 writers (9 shim, 6 in-process, 1 scan), 12 s")


@pytest.mark.slow
@needs_gxx
def test_sixteen_writers_of_three_kinds_lose_nothing_for_half_a_minute(shim_env: ShimEnv,
                                                                   tmp_path: Path):
    _concurrency(shim_env, tmp_path, 30, "16 writers (9 shim, 6 in-process, 1 scan), 30 s")


# ------------------------------------------------------------------------------------------
# SIGKILL of shim compiles at random points, beside compiles that go on
# ------------------------------------------------------------------------------------------


def _descendants(pid: int) -> list[int]:
    """Processes whose parent chain reaches `pid` (children re-parented after a kill are not:
    those are found by what their command line names)."""
    children: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            with contextlib.suppress(OSError, IndexError, ValueError):
                stat = Path(f"/proc/{entry}/stat").read_text()
                children.setdefault(int(stat.rsplit(")", 1)[1].split()[1]), []).append(
                    int(entry))
    found, todo = [], [pid]
    while todo:
        for child in children.get(todo.pop(), []):
            found.append(child)
            todo.append(child)
    return found


def _processes_naming(text: str) -> list[int]:
    found = []
    for entry in os.listdir("/proc"):
        if entry.isdigit() and int(entry) != os.getpid():
            with contextlib.suppress(OSError):
                if text.encode() in Path(f"/proc/{entry}/cmdline").read_bytes():
                    found.append(int(entry))
    return found


def _kills(shim_env: ShimEnv, tmp_path: Path, kills: int, case: str) -> None:
    tree = _tree(tmp_path / "tree")
    env = dict(shim_env.env)
    reports = tmp_path / "reports"
    reports.mkdir()
    rng = random.Random(13)
    # Two neighbours compile all along, in processes of their own, until told to stop.
    neighbour_deadline = time.time() + 3600
    neighbours = [_start(SHIM_WRITER, f"neighbour{i}", str(tree / "src"),
                         str(neighbour_deadline), str(reports / f"neighbour{i}.json"),
                         env=env, cwd=tree / "src") for i in range(2)]
    killed_outputs: list[str] = []
    completed_outputs: list[str] = []
    started = time.monotonic()
    tmp_before = set(os.listdir(env["TMPDIR"]))
    try:
        bare_duration = _timed_compile(shim_env, tree)
        for n in range(kills):
            output = str(tree / "out" / f"killed_{n}.o")
            process = subprocess.Popen(["g++", "-c", "-I", "../inc", "k.cpp", "-o", output],
                                       cwd=tree / "src", env=env, stdout=subprocess.DEVNULL,
                                       stderr=subprocess.DEVNULL)
            # Anywhere in the shim's life: start-up, the compile, the dependency pass, the
            # record's transaction, or (now and then) after it has finished.
            time.sleep(rng.uniform(0, bare_duration * 1.2))
            process.send_signal(signal.SIGKILL)
            process.wait()
            if process.returncode == -signal.SIGKILL:
                killed_outputs.append(output)
            else:
                completed_outputs.append(output)
    finally:
        for index in range(len(neighbours)):
            (reports / f"neighbour{index}.json.stop").write_text("")
    said = [_finish(process, reports / f"neighbour{index}.json", 120)
            for index, process in enumerate(neighbours)]
    elapsed = time.monotonic() - started
    time.sleep(1)
    left = sorted({pid for output in killed_outputs for pid in _processes_naming(
        os.path.basename(output))})
    killed_left = sorted(t for t in set(os.listdir(env["TMPDIR"])) - tmp_before
                         if t.startswith("cacheaudit-shim-"))
    # A SIGKILLed shim cannot clean up: the next cacheaudit command sweeps what it left.
    subprocess.run([sys.executable, "-m", "cacheaudit", "report", "--ledger",
                    str(shim_env.ledger)], env=env, capture_output=True, timeout=120,
                   check=False)
    temp_left = sorted(t for t in set(os.listdir(env["TMPDIR"])) - tmp_before
                       if t.startswith("cacheaudit-shim-"))
    for pid in left:  # ours: the compilers and dependency passes of the killed shims
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)

    records = _all_records(shim_env.ledger)
    by_output = Counter(o.path for r in records for o in r.outputs)
    headers = {str(tree / "inc" / "api.h"), str(tree / "inc" / "detail.h")}
    neighbour_outputs = [o for r in said for o in r["outputs"]]
    # Every compile that finished is there once, its own and its neighbours'; every record the
    # ledger holds is whole, the killed compiles' included.
    missing = [o for o in neighbour_outputs + completed_outputs if by_output[o] != 1]
    torn = []
    for record in records:
        if record.graph is None or not headers <= set(record.graph.paths) or not record.outputs:
            torn.append((record.record_id, [o.path for o in record.outputs], record.notes))
    killed_present = sum(1 for o in killed_outputs if by_output[o])
    duplicated = [o for o, count in by_output.items() if count > 1]
    reliability_figure(
        "kills", case, kills_sent=kills, killed_before_finishing=len(killed_outputs),
        finished_before_kill=len(completed_outputs),
        killed_record_whole=killed_present,
        killed_record_absent=len(killed_outputs) - killed_present,
        neighbour_records=len(neighbour_outputs), records_lost=len(missing),
        records_torn=len(torn), records_duplicated=len(duplicated), processes_left=len(left),
        temp_dirs_swept_by_next_run=len(killed_left) - len(temp_left),
        temp_dirs_left=len(temp_left),
        seconds=round(elapsed, 1))
    assert torn == [] and duplicated == [] and missing == []
    assert temp_left == [], f"left after the next command's sweep: {temp_left}"
    assert killed_outputs, "no kill landed before the compile finished"
    assert neighbour_outputs, "the neighbours compiled nothing"


def _timed_compile(shim_env: ShimEnv, tree: Path) -> float:
    started = time.monotonic()
    done = shim_env.run(["g++", "-c", "-I", "../inc", "k.cpp", "-o", "../out/first.o"],
                        cwd=tree / "src")
    assert done.returncode == 0, done.stderr
    return time.monotonic() - started


@needs_gxx
def test_sigkill_of_shims_at_random_points_tears_no_record(shim_env: ShimEnv, tmp_path: Path):
    _kills(shim_env, tmp_path, 15, "15 SIGKILLs of shim compiles, 2 neighbours compiling")


@pytest.mark.slow
@needs_gxx
def test_sigkill_of_shims_at_random_points_tears_no_record_40_times(shim_env: ShimEnv,
                                                                    tmp_path: Path):
    _kills(shim_env, tmp_path, 40, "40 SIGKILLs of shim compiles, 2 neighbours compiling")


# ------------------------------------------------------------------------------------------
# docs/reliability.md, as the suite writes it
# ------------------------------------------------------------------------------------------


def test_the_document_orders_sections_and_sums_the_harm(tmp_path: Path):
    from support import reliability_document, write_reliability_document

    figures = tmp_path / "figures"
    assert reliability_document(figures) is None  # nothing to say: the document is left alone
    figures.mkdir()
    cases = [("fuzzing", "depfile", {"inputs": 400, "failures": 0}),
             ("zeta", "other", {"widgets": 3}),
             ("kills", "b case", {"kills": 2, "records_lost": 0, "processes_left": 1}),
             ("kills", "a case", {"kills": 5, "records_lost": 0, "temp_dirs_left": 0})]
    for index, (section, case, counted) in enumerate(reversed(cases)):
        (figures / f"{index}.json").write_text(json.dumps({
            "section": section, "case": case, "figures": counted, "recorded": 0,
            "machine": "2 cores"}))
    text = reliability_document(figures)
    assert text is not None and text == reliability_document(figures)
    headings = [line for line in text.splitlines() if line.startswith("## ")]
    assert headings == ["## Kills: SIGKILL at random points",
                        "## Fuzzing: every parser of untrusted text", "## Zeta"]
    kills = text[text.index("## Kills"):text.index("## Fuzzing")]
    assert kills.index("| a case | 5 |") < kills.index("| b case | 2 |")
    assert "| case | kills | records lost | temp dirs left | processes left | date (UTC) |" in kills
    assert "Not clean in 2 cases: 1 processes left" in kills
    assert "Nothing lost in 1 case (0 failures)." in text
    # The whole run's summary comes before the first section.
    assert text.index("**Not clean in 4 cases: 1 processes left") < text.index("## ")
    assert "Machine: 2 cores." in text
    document = tmp_path / "reliability.md"
    assert write_reliability_document(figures, document) is True
    assert write_reliability_document(figures, document) is False  # unchanged: not rewritten
    assert document.read_text() == text
