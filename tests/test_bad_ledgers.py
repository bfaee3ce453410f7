"""Ledgers that are not what they should be, given to every command that reads one: a file of
random bytes, a truncated copy, an SQLite database of another program, a ledger that lost tables
or a column, one whose pages were overwritten, a directory. Each command runs for real
(`python -m cacheaudit` in a subprocess, real SQLite files) and must refuse with exit 2 and one
line naming the file, without a traceback, leaving the file's bytes and its directory as they
were: no `-wal`/`-shm` beside it, nothing written into it.
"""

from __future__ import annotations

import hashlib
import os
import random
import shutil
import sqlite3
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest

from cacheaudit.exceptions import ExitCode
from cacheaudit.ledger import Ledger, RunInfo, new_record_id
from cacheaudit.model import CompileRecord

ROOT = Path(__file__).resolve().parent.parent
_OWN = ("CACHEAUDIT", "DG_", "EP_", "DJ_", "TRITON_", "TORCH_EXTENSIONS", "CUPY_", "FLASHINFER_",
        "XDG_", "NVCC_", "PYTEST_")
PAGE = 4096


def cacheaudit(tmp: Path, *args: str, prefix: tuple[str, ...] = ()
               ) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(_OWN)}
    env.update(HOME=str(tmp / "home"), XDG_CACHE_HOME=str(tmp / "xdg"),
               XDG_CONFIG_HOME=str(tmp / "config"), TMPDIR=str(tmp / "tmp"),
               PYTHONPATH=os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]))
    for directory in ("home", "tmp", "work"):
        (tmp / directory).mkdir(exist_ok=True)
    return subprocess.run([*prefix, sys.executable, "-m", "cacheaudit", *args],
                          capture_output=True, text=True, env=env, cwd=tmp / "work", timeout=300)


def good_ledger(path: Path, records: int = 3000) -> Path:
    """A real ledger with enough records that its tables span hundreds of pages."""
    with Ledger.open(str(path)) as ledger:
        ledger.add_records([CompileRecord(
            record_id=new_record_id(), event="compile", started_ns=10**18 + n,
            runtime="deepjit", kernel=f"kernel{n}-" * 10, observer="shim:g++")
            for n in range(records)], RunInfo(run_uuid="r", label="test"))
    assert not Path(f"{path}-wal").exists()  # checkpointed at close: the file is all of it
    return path


def _random(path: Path) -> None:
    path.write_bytes(random.Random(7).randbytes(5 * PAGE))


def _truncated(path: Path) -> None:
    good_ledger(path)
    with open(path, "r+b") as handle:
        handle.truncate(path.stat().st_size - 3 * PAGE)


def _executed(path: Path, *statements: str) -> None:
    conn = sqlite3.connect(path)
    for statement in statements:
        conn.execute(statement)
    conn.commit()
    conn.close()


def _foreign(path: Path) -> None:
    _executed(path, "CREATE TABLE customers (name TEXT)", "INSERT INTO customers VALUES ('ada')")


def _without_tables(path: Path) -> None:
    good_ledger(path, records=10)
    _executed(path, "DROP TABLE records", "DROP TABLE runs")


def _without_a_column(path: Path) -> None:
    """Every table there, `records` without its `kernel` column: found only when a query
    reads it, mid-command."""
    good_ledger(path, records=10)
    _executed(path, "DROP INDEX records_by_kernel", "ALTER TABLE records DROP COLUMN kernel")


def _overwritten_pages(path: Path) -> None:
    """sqlite_master intact, the records' pages near the end overwritten: SQLite opens it and
    finds the damage only when a query reaches them."""
    good_ledger(path)
    data = bytearray(path.read_bytes())
    for offset in range(len(data) - 20 * PAGE, len(data) - 2 * PAGE, 7):
        data[offset] = 0xAB
    path.write_bytes(bytes(data))


def _text_not_utf8(path: Path) -> None:
    """Every page sound (SQLite's checks pass), a record's text bytes not UTF-8: found when a
    reader decodes it."""
    good_ledger(path)
    _executed(path, "UPDATE records SET kernel = CAST(x'6bff6b' AS TEXT) WHERE id = "
                    "(SELECT max(id) FROM records)")


BAD: dict[str, tuple[Callable[[Path], None], str]] = {
    "random-bytes": (_random, "is not a cacheaudit ledger (not an SQLite file)"),
    "truncated": (_truncated, "is a truncated SQLite file ("),
    "foreign-sqlite": (_foreign, "is an SQLite database but not a cacheaudit ledger"),
    "tables-missing": (_without_tables, "is a damaged cacheaudit ledger: its tables runs, "
                                        "records are missing"),
    "column-missing": (_without_a_column, "is a damaged cacheaudit ledger: table records has "
                                          "no column kernel"),
    "pages-overwritten": (_overwritten_pages, "is a damaged SQLite file ("),
    "text-not-utf8": (_text_not_utf8, "is a damaged cacheaudit ledger: a text value in it is "
                                      "not UTF-8"),
}
FOUND_WHEN_READ = {"pages-overwritten", "text-not-utf8"}
"""Damage SQLite finds only when a query reaches it (a full check would read the whole file at
every opening): refused by the commands that read every record, while one that reads none of
the damaged pages (a scan of nothing) goes on, and leaves the file as it was all the same."""
READ_EVERY_RECORD = {
    "pages-overwritten": {"report", "report-json", "diff-ledgers", "combine-into"},
    # combine copies rows in SQL, decoding no text: it adds the good ledger's and goes on.
    "text-not-utf8": {"report", "report-json", "diff-ledgers"},
}
"""The commands that read every record, and so find each kind of damage found when read."""
WRITES_INTO = {"pages-overwritten": set(), "text-not-utf8": {"combine-into", "run"}}
"""What a command that succeeds on such a ledger writes into it by design."""
COMBINED_AS_IS = {"text-not-utf8"}
"""Damage combine's whole-file check cannot see (SQLite's own checks pass): such a source is
copied row by row as it is, its text undecoded."""


def _commands(ledger: str, good: str, tmp: Path) -> dict[str, list[str]]:
    """Every command that reads a ledger, pointed at `ledger`."""
    return {
        "report": ["report", "--ledger", ledger],
        "report-json": ["report", "--json", "--ledger", ledger],
        "scan": ["scan", "--allow-empty", "--ledger", ledger],
        "stats": ["stats", "--ledger", ledger],
        "explain": ["explain", "kernel1", "--ledger", ledger],
        "verify": ["verify", "--ledger", ledger],
        "evict": ["evict", "--dry-run", "--ledger", ledger],
        "diff-ledgers": ["diff", ledger, good],
        "diff-runs": ["diff", "r", "r", "--ledger", ledger],
        "combine-into": ["combine", "--keep", "--ledger", ledger, good],
        "run": ["run", "--ledger", ledger, "--", sys.executable, "-c",
                f"open({str(tmp / 'ran')!r}, 'w')"],
    }


def _state(directory: Path) -> dict[str, str]:
    return {p.name: hashlib.sha256(p.read_bytes()).hexdigest() for p in directory.iterdir()}


def _refused(done: subprocess.CompletedProcess[str], ledger: Path, expected: str, name: str
             ) -> None:
    assert "Traceback" not in done.stderr, (name, done.stderr)
    assert done.returncode == ExitCode.USAGE, (name, done.returncode, done.stderr)
    lines = done.stderr.splitlines()
    assert len(lines) == 1, (name, done.stderr)
    assert lines[0].startswith(f"cacheaudit: error: {ledger} "), (name, lines[0])
    assert expected in lines[0], (name, lines[0])


def _evict_has_dry_run() -> bool:
    return "--dry-run" in subprocess.run([sys.executable, "-m", "cacheaudit", "evict", "-h"],
                                         capture_output=True, text=True, cwd=ROOT).stdout


@pytest.mark.parametrize("kind", sorted(BAD))
def test_every_command_refuses_a_bad_ledger_with_one_line_and_leaves_it_as_it_was(
        kind: str, tmp_path: Path):
    make, expected = BAD[kind]
    shelf = tmp_path / "shelf"
    shelf.mkdir()
    ledger = shelf / "ledger.db"
    make(ledger)
    good = good_ledger(tmp_path / "good.db", records=3)
    before = _state(shelf)
    failed = {}
    for name, argv in _commands(str(ledger), str(good), tmp_path).items():
        if name == "evict" and not _evict_has_dry_run():
            argv = [a for a in argv if a != "--dry-run"]
        done = cacheaudit(tmp_path, *argv)
        if kind in FOUND_WHEN_READ and name not in READ_EVERY_RECORD.get(kind, set()):
            assert "Traceback" not in done.stderr and "internal error" not in done.stderr, (
                name, done.stderr)
            if name not in WRITES_INTO[kind]:
                assert _state(shelf) == before, f"{name} changed {shelf}"
            continue
        try:
            _refused(done, ledger, expected, name)
        except AssertionError as exc:
            failed[name] = str(exc)
        assert _state(shelf) == before, f"{name} changed {shelf}: {sorted(_state(shelf))}"
    assert failed == {}, "\n".join(f"{n}: {e}" for n, e in failed.items())
    if kind not in FOUND_WHEN_READ:
        assert not (tmp_path / "ran").exists(), "run started its command on a bad ledger"


def test_combine_skips_a_bad_source_names_it_and_leaves_it(tmp_path: Path):
    shelf = tmp_path / "shelf"
    shelf.mkdir()
    refused = {kind: bad for kind, bad in BAD.items() if kind not in COMBINED_AS_IS}
    for kind, (make, _) in refused.items():
        make(shelf / f"{kind}.db")
    before = _state(shelf)
    target = tmp_path / "target.db"
    done = cacheaudit(tmp_path, "combine", "--ledger", str(target),
                      *(str(shelf / f"{kind}.db") for kind in sorted(refused)))
    assert "Traceback" not in done.stderr, done.stderr
    assert done.returncode == ExitCode.USAGE, done.stderr
    skipped = [line for line in done.stderr.splitlines() if line.startswith("cacheaudit: skip")]
    assert len(skipped) == len(refused), done.stderr
    for kind, (_, expected) in refused.items():
        [line] = [s for s in skipped if f"{kind}.db:" in s]
        assert expected in line, line
    assert _state(shelf) == before


@pytest.mark.parametrize("command", ["report", "scan", "explain", "run"])
def test_a_directory_given_as_the_ledger_is_refused_before_anything_runs(
        command: str, tmp_path: Path):
    shelf = tmp_path / "shelf"
    shelf.mkdir()
    argv = {"report": ["report"], "scan": ["scan", "--allow-empty"],
            "explain": ["explain", "kernel1"],
            "run": ["run", "--", sys.executable, "-c", f"open({str(tmp_path / 'ran')!r}, 'w')"]}
    given = argv[command]
    at = given.index("--") if "--" in given else len(given)
    done = cacheaudit(tmp_path, *given[:at], "--ledger", str(shelf), *given[at:])
    assert "Traceback" not in done.stderr
    assert done.returncode == ExitCode.USAGE, done.stderr
    assert done.stderr.splitlines() == [
        f"cacheaudit: error: {shelf} is a directory, not a cacheaudit ledger (give a file in "
        f"it: {shelf / 'ledger.db'})"]
    assert not (tmp_path / "ran").exists(), "the command ran before the ledger was refused"
    assert list(shelf.iterdir()) == []


def test_run_still_makes_a_ledger_that_is_not_there_yet(tmp_path: Path):
    ledger = tmp_path / "new.db"
    done = cacheaudit(tmp_path, "run", "--ledger", str(ledger), "--", sys.executable, "-c",
                      f"open({str(tmp_path / 'ran')!r}, 'w')")
    assert done.returncode == 0, done.stderr
    assert (tmp_path / "ran").exists()


@pytest.mark.parametrize(("a", "b", "named"), [
    ("$DIR", "$TMP/x.db", "$DIR"),
    ("$GOOD", "$DIR", "$DIR"),
])
def test_diff_names_the_argument_that_is_a_directory(a: str, b: str, named: str,
                                                     tmp_path: Path):
    directory = tmp_path / "runs"
    directory.mkdir()
    good = good_ledger(tmp_path / "good.db", records=3)

    def given(word: str) -> str:
        return (word.replace("$DIR", str(directory)).replace("$GOOD", str(good))
                .replace("$TMP", str(tmp_path)))

    done = cacheaudit(tmp_path, "diff", given(a), given(b))
    assert done.returncode == ExitCode.USAGE, done.stderr
    assert done.stderr.splitlines() == [
        f"cacheaudit: error: {given(named)}: a directory, not a ledger file, a snapshot or a "
        "run id; give a ledger file in it, or compare the ledgers in it with --by-host"]


# ------------------------------------------------------------------ a ledger it may not write


def _user_namespaces() -> bool:
    if shutil.which("unshare") is None:
        return False
    return subprocess.run(["unshare", "-rm", "true"], capture_output=True).returncode == 0


_READ_ONLY_FILES = ('for f in "$@"; do case "$f" in --) break;; esac; '
                    'mount --bind "$f" "$f" && mount -o remount,bind,ro "$f" || exit 97; done; '
                    'while [ "$1" != -- ]; do shift; done; shift; exec "$@"')


def _read_only(files: list[Path]) -> tuple[str, ...]:
    """A prefix that runs a command finding `files` read-only while their directory stays
    writable (where SQLite would otherwise create the WAL and SHM files): their mode where that
    binds (not root), else a read-only bind mount of each file in a user and mount namespace."""
    if os.geteuid() != 0:
        for path in files:
            os.chmod(path, 0o444)
        return ()
    if not _user_namespaces():
        pytest.skip("root ignores file modes, and no user namespace for a read-only mount")
    return ("unshare", "-rm", "sh", "-c", _READ_ONLY_FILES, "sh", *map(str, files), "--")


def test_reads_of_a_ledger_they_may_not_write_leave_the_directory_as_it_was(tmp_path: Path):
    shelf = tmp_path / "shelf"
    shelf.mkdir()
    good = good_ledger(shelf / "good.db", records=50)
    bad = {kind: shelf / f"{kind}.db" for kind in BAD}
    for kind, path in bad.items():
        BAD[kind][0](path)
    before = _state(shelf)
    prefix = _read_only([good, *bad.values()])
    shown = {name: cacheaudit(tmp_path, *argv, "--ledger", str(good), prefix=prefix)
             for name, argv in {"report": ["report", "--json"], "stats": ["stats"],
                                "explain": ["explain", "kernel1"]}.items()}
    for name, done in shown.items():
        assert "Traceback" not in done.stderr, (name, done.stderr)
        assert done.returncode in (0, 1, 2), (name, done.stderr)
    assert '"kernel": "kernel1-' in shown["report"].stdout, shown["report"].stderr
    for kind, path in bad.items():
        done = cacheaudit(tmp_path, "report", "--ledger", str(path), prefix=prefix)
        _refused(done, path, BAD[kind][1], kind)
    assert _state(shelf) == before, sorted(_state(shelf))
