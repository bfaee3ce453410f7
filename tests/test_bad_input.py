"""Bad input as a user gives it: each case runs the real `cacheaudit` in a subprocess and must
end with its documented exit status and one line on stderr that names what to fix.

The table in docs/cli.md ("Bad input") is the expectation: every row there is a case here, run
and checked cell by cell (the command as shown, the exit status, the line), and every case here
has its row. `python tests/test_bad_input.py` prints the rows as the code gives them now.
"""

from __future__ import annotations

import os
import re
import shlex
import subprocess
import sys
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
DOCS = ROOT / "docs" / "cli.md"
TABLE = re.compile(r"<!-- bad-input:begin -->\n(.*?)\n<!-- bad-input:end -->", re.DOTALL)
NOTHING = "(nothing)"
"""The message cell of a row whose command says nothing on stderr."""

# Variables that would point a case at the machine's own caches or configuration.
_OWN = ("CACHEAUDIT", "DG_", "EP_", "DJ_", "TRITON_", "TORCH_EXTENSIONS", "CUPY_", "FLASHINFER_",
        "XDG_", "NVCC_", "PYTEST_")


@dataclass
class Case:
    argv: list[str]
    env: dict[str, str] = field(default_factory=dict)
    """Shown in the table, before the command."""
    cwd: str = "$TMP/work"
    hidden_env: dict[str, str] = field(default_factory=dict)
    """Set, not shown (a plugin's PYTHONPATH)."""
    check: Callable[[Path], None] | None = None
    """What else must hold afterwards (nothing created), given the temporary directory."""


def _write(path: Path, data: str | bytes) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    if isinstance(data, bytes):
        path.write_bytes(data)
    else:
        path.write_text(data)


def _absent(relative: str) -> Callable[[Path], None]:
    def check(tmp: Path) -> None:
        assert not (tmp / relative).exists(), f"{tmp / relative} was created"
    return check


def _pyproject(text: str | bytes, *argv: str) -> Callable[[Path], Case]:
    def setup(tmp: Path) -> Case:
        _write(tmp / "work" / "pyproject.toml", text)
        return Case(list(argv))
    return setup


def _plain(*argv: str, env: dict[str, str] | None = None,
           check: Callable[[Path], None] | None = None) -> Callable[[Path], Case]:
    return lambda _tmp: Case(list(argv), env=dict(env or {}), check=check)


def _with_file(relative: str, data: str | bytes, *argv: str) -> Callable[[Path], Case]:
    def setup(tmp: Path) -> Case:
        _write(tmp / relative, data)
        return Case(list(argv))
    return setup


def _not_executable(tmp: Path) -> Case:
    _write(tmp / "job.sh", "#!/bin/sh\n")  # mode 0644: there, but not executable
    return Case(["run", "--", "$TMP/job.sh"])


_BROKEN_LAYOUT = '''
from cacheaudit.layout import Layout

class BrokenLayout(Layout):
    layout = runtime = "brokenjit"

    def default_roots(self, env):
        raise RuntimeError("a bug in default_roots")

LAYOUT = BrokenLayout()
'''


_RANDOM_BYTES = bytes(range(256)) * 32


def _unchanged(relative: str, data: bytes) -> Callable[[Path], None]:
    def check(tmp: Path) -> None:
        assert (tmp / relative).read_bytes() == data, f"{tmp / relative} was changed"
        left = sorted(p.name for p in (tmp / relative).parent.iterdir()
                      if p.name.startswith((tmp / relative).name + "-"))
        assert left == [], f"left beside {tmp / relative}: {left}"
    return check


def _bad_ledger(make: Callable[[Path], None], *argv: str) -> Callable[[Path], Case]:
    """A ledger file made by `make` at $TMP/ledger.db, which the command must leave as it is."""
    def setup(tmp: Path) -> Case:
        make(tmp / "ledger.db")
        return Case(list(argv), check=_unchanged("ledger.db", (tmp / "ledger.db").read_bytes()))
    return setup


def _random_bytes(path: Path) -> None:
    path.write_bytes(_RANDOM_BYTES)


def _foreign_sqlite(path: Path) -> None:
    import sqlite3

    conn = sqlite3.connect(path)
    conn.execute("CREATE TABLE customers (name TEXT)")
    conn.commit()
    conn.close()


def _tables_missing(path: Path) -> None:
    import sqlite3

    from cacheaudit.ledger import Ledger

    Ledger.open(str(path)).close()
    conn = sqlite3.connect(path)
    conn.execute("DROP TABLE records")
    conn.commit()
    conn.close()


def _broken_plugin(tmp: Path) -> Case:
    """A runtime package whose layout raises: a bug, not bad input (exit 3)."""
    package = tmp / "plugins" / "brokenjit"
    _write(package / "__init__.py", "")
    _write(package / "spec.py", "from cacheaudit.spec import RuntimeSpec\n"
           "SPEC = RuntimeSpec(name='brokenjit', title='BrokenJIT', layout='layout')\n")
    _write(package / "layout.py", _BROKEN_LAYOUT)
    return Case(["scan"], env={"CACHEAUDIT_RUNTIMES": "brokenjit"},
                hidden_env={"PYTHONPATH": os.pathsep.join(
                    [str(tmp / "plugins"), os.environ.get("PYTHONPATH", "")])})


def _empty_default_root(tmp: Path) -> Case:
    (tmp / "home" / ".deep_gemm").mkdir(parents=True)
    return Case(["scan", "--json"])


CASES: dict[str, Callable[[Path], Case]] = {
    "shim-install-on-a-file": _with_file("afile", "", "shim", "install", "$TMP/afile"),
    "shim-install-missing-parent": _plain("shim", "install", "$TMP/no/bin",
                                          check=_absent("no")),
    "pyproject-cacheaudit-not-a-table": _pyproject("[tool]\ncacheaudit = 5\n", "report"),
    "pyproject-not-utf8": _pyproject(b'[tool.cacheaudit]\nfail-on = "\xff"\n', "report"),
    "pyproject-not-toml-ours": _pyproject('[tool.cacheaudit\nfail-on = "error"\n', "report"),
    "pyproject-not-toml-others": _pyproject('[tool.black\nline-length = 99\n', "report",
                                            "--json"),
    "pyproject-unknown-setting": _pyproject('[tool.cacheaudit]\nfail_on = "never"\n', "report"),
    "pyproject-fail-on-invalid": _pyproject('[tool.cacheaudit]\nfail-on = "sometimes"\n',
                                            "scan", "--allow-empty"),
    "pyproject-fail-on-invalid-overridden": _pyproject(
        '[tool.cacheaudit]\nfail-on = "sometimes"\n', "scan", "--allow-empty", "--fail-on",
        "never"),
    "snapshot-not-json": _with_file("a.json", '{"format": ', "diff", "$TMP/a.json",
                                    "$TMP/a.json"),
    "snapshot-wrong-shape": _with_file("a.json", '{"format": 1, "caches": 5}', "diff",
                                       "$TMP/a.json", "$TMP/a.json"),
    "snapshot-missing": _plain("diff", "$TMP/none.json", "$TMP/none.json"),
    "json-and-format": _plain("scan", "--json", "--format", "markdown"),
    "format-unknown": _plain("scan", "--format", "html"),
    "fail-on-unknown": _plain("scan", "--fail-on", "sometimes"),
    "graph-without-json": _plain("report", "--graph"),
    "limit-negative": _plain("report", "--limit", "-1"),
    "limit-not-a-number": _plain("report", "--limit", "many"),
    "timeout-negative": _plain("snapshot", "--timeout", "-5"),
    "verify-timeout-zero": _plain("verify", "--timeout", "0"),
    "select-and-ignore": _plain("scan", "--select", "CA1", "--ignore", "CA1"),
    "select-unknown-code": _plain("scan", "--select", "XX9"),
    "ledger-missing-parent": _plain("scan", "--ledger", "$TMP/typo/ledger.db",
                                    check=_absent("typo")),
    "ledger-variable-missing-parent": _plain("run", "--", "true",
                                             env={"CACHEAUDIT_LEDGER": "$TMP/typo/l.db"},
                                             check=_absent("typo")),
    "ledger-not-a-ledger": _with_file("bad.db", "not sqlite", "report", "--ledger",
                                      "$TMP/bad.db"),
    "ledger-random-bytes": _bad_ledger(_random_bytes, "stats", "--ledger", "$TMP/ledger.db"),
    "ledger-foreign-sqlite": _bad_ledger(_foreign_sqlite, "explain", "k", "--ledger",
                                         "$TMP/ledger.db"),
    "ledger-tables-missing": _bad_ledger(_tables_missing, "scan", "--allow-empty", "--ledger",
                                         "$TMP/ledger.db"),
    "run-ledger-directory": _plain("run", "--ledger", "$TMP/work", "--", "touch", "$TMP/ran",
                                   check=_absent("ran")),
    "diff-directory": _plain("diff", "$TMP/work", "$TMP/x.db"),
    "output-unwritable": _plain("snapshot", "-o", "$TMP/no/snapshot.md"),
    "unknown-command": _plain("frobnicate"),
    "unknown-option": _plain("scan", "--frobnicate"),
    "demo-compiler-unknown": _plain("demo", "--compiler", "icc"),
    "scan-path-missing": _plain("scan", "$TMP/absent"),
    "scan-path-not-a-root": _plain("scan", "$TMP/work"),
    "scan-variable-root-missing": _plain("scan", env={"DG_JIT_CACHE_DIR": "$TMP/nope"}),
    "scan-variable-root-missing-allowed": _plain(
        "scan", "--allow-empty", "--json", env={"DG_JIT_CACHE_DIR": "$TMP/nope"}),
    "scan-no-root": _plain("scan"),
    "scan-empty-default-root": _empty_default_root,
    "explain-unknown": _plain("explain", "ffffffffffffffffffff"),
    "explain-empty": _plain("explain", ""),
    "include-dir-missing": _plain("scan", "--include-dir", "$TMP/no/include"),
    "run-no-command": _plain("run", "--"),
    "run-no-such-command": _plain("run", "--", "nosuchcommand"),
    "run-not-executable": _not_executable,
    "internal-error": _broken_plugin,
}


def _env(tmp: Path, case: Case) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(_OWN)}
    env.update({"HOME": str(tmp / "home"), "XDG_CACHE_HOME": str(tmp / "xdg"),
                "XDG_CONFIG_HOME": str(tmp / "config"), "TMPDIR": str(tmp / "tmp"),
                "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])})
    env.update({k: v.replace("$TMP", str(tmp)) for k, v in case.env.items()})
    env.update(case.hidden_env)
    return env


def shown_command(case: Case) -> str:
    words = [f"{name}={value}" for name, value in case.env.items()]
    words += ["cacheaudit", *case.argv]
    return " ".join(w if "$TMP" in w or w == shlex.quote(w) else shlex.quote(w) for w in words)


def run_case(name: str, tmp: Path) -> tuple[Case, subprocess.CompletedProcess[str]]:
    for directory in ("home", "work", "tmp"):
        (tmp / directory).mkdir(parents=True, exist_ok=True)
    case = CASES[name](tmp)
    argv = [word.replace("$TMP", str(tmp)) for word in case.argv]
    done = subprocess.run([sys.executable, "-m", "cacheaudit", *argv], capture_output=True,
                          text=True, env=_env(tmp, case), timeout=300,
                          cwd=case.cwd.replace("$TMP", str(tmp)))
    return case, done


def message_of(done: subprocess.CompletedProcess[str], tmp: Path) -> str:
    lines = done.stderr.replace(str(tmp), "$TMP").splitlines()
    return lines[0] if lines else NOTHING


def documented_rows(strict: bool = True) -> dict[str, tuple[str, str, int, str]]:
    """case -> (input, command, exit status, message), from docs/cli.md."""
    match = TABLE.search(DOCS.read_text())
    if match is None:
        assert not strict, "docs/cli.md lost its bad-input markers"
        return {}
    rows: dict[str, tuple[str, str, int, str]] = {}
    for line in match.group(1).splitlines()[2:]:
        cells = [c.strip().replace("\\|", "|")
                 for c in re.split(r"(?<!\\)\|", line.strip()[1:-1])]
        name, given, command, status, message = cells
        assert name.strip("`") not in rows, f"two rows for {name}"
        rows[name.strip("`")] = (given, command.strip("`"), int(status), message)
    return rows


ROWS = documented_rows(strict=__name__ != "__main__")


def test_every_case_has_its_row_and_every_row_its_case():
    assert sorted(ROWS) == sorted(CASES)


@pytest.mark.parametrize("name", sorted(ROWS))
def test_the_documented_row_holds(name: str, tmp_path: Path):
    _given, command, status, message = ROWS[name]
    case, done = run_case(name, tmp_path)
    assert shown_command(case) == command, f"{name}: the table shows another command"
    assert "Traceback" not in done.stderr, done.stderr
    assert done.returncode == status, (name, done.returncode, done.stderr)
    assert message_of(done, tmp_path) == message, (name, done.stderr)
    if status not in (0, 1):
        # A refusal is one line; a command that goes on may say more (what it found).
        assert len(done.stderr.splitlines()) == 1, (name, done.stderr)
    if case.check is not None:
        case.check(tmp_path)


def _rows_now() -> str:  # pragma: no cover - a maintainer's tool
    import tempfile

    lines = []
    for name in CASES:
        with tempfile.TemporaryDirectory() as scratch:
            tmp = Path(scratch)
            case, done = run_case(name, tmp)
            cell = message_of(done, tmp).replace("|", "\\|")
            given = ROWS[name][0] if name in ROWS else ""
            lines.append(f"| `{name}` | {given} | "
                         f"`{shown_command(case)}` | {done.returncode} | {cell} |")
    return "\n".join(lines)


if __name__ == "__main__":  # pragma: no cover
    print(_rows_now())
