"""The truth table: every way a DeepJIT-style cache goes stale, run for real, judged by cacheaudit.

Each scenario builds a kernel with the reference runtime (fixtures/minijit) through the compiler
shim, changes one thing, asks the runtime for the kernel again, and scans. The ground truth comes
from compiling the same kernel again into an empty cache and comparing the binaries byte for
byte: served != fresh means the runtime served a stale binary. cacheaudit must flag every stale
case and raise no error when nothing changed.

The runtime runs in its own process (`minijit_driver.py`), as a real job does: a process keeps
its in-memory caches, a new one starts empty. Run `python -m tests.truth_table` for the table.
"""

from __future__ import annotations

import json
import os
import shutil
import stat
import subprocess
import sys
import textwrap
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import xxhash

ROOT = Path(__file__).resolve().parent.parent
DRIVER = Path(__file__).resolve().parent / "minijit_driver.py"

SOURCE = """\
#include <mylib/api.cuh>
#include <envconst.h>
#ifndef VARIANT
#define VARIANT 0
#endif
#ifndef EXTRA
#define EXTRA 0
#endif
#ifdef __CUDACC__
__global__
#endif
void gemm(int* out) { out[0] = API_VALUE + TILE_VALUE + ENV_VALUE + VARIANT + EXTRA; }
"""


def _write(path: Path, text: str, executable: bool = False) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    if executable:
        path.chmod(path.stat().st_mode | stat.S_IXUSR | stat.S_IXGRP | stat.S_IXOTH)


def _digest(path: str | None) -> str | None:
    if path is None or not os.path.exists(path):
        return None
    return xxhash.xxh3_128_hexdigest(Path(path).read_bytes())


class Driver:
    """One runtime process; requests go in as JSON lines, answers come back the same way."""

    def __init__(self, project: Project, env: dict[str, str]) -> None:
        config = json.dumps({"root": str(project.root), "backend": project.backend,
                             "include_dirs": [str(d) for d in project.include_dirs],
                             "include_prefixes": ["mylib/"]})
        self.process = subprocess.Popen(
            [sys.executable, str(DRIVER), config], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
            stderr=subprocess.PIPE, text=True, env=env, cwd=project.root)

    def compile(self, source: str = SOURCE, name: str = "gemm") -> dict[str, Any]:
        assert self.process.stdin is not None and self.process.stdout is not None
        self.process.stdin.write(json.dumps({"op": "compile", "name": name,
                                             "source": source}) + "\n")
        self.process.stdin.flush()
        line = self.process.stdout.readline()
        if not line:
            raise RuntimeError(f"the driver died: {self.process.stderr.read()}")  # type: ignore[union-attr]
        answer = json.loads(line)
        answer["digest"] = _digest(answer.get("binary"))
        return answer

    def setenv(self, name: str, value: str) -> None:
        assert self.process.stdin is not None and self.process.stdout is not None
        self.process.stdin.write(json.dumps({"op": "setenv", "name": name,
                                             "value": value}) + "\n")
        self.process.stdin.flush()
        self.process.stdout.readline()

    def close(self) -> None:
        if self.process.poll() is None:
            assert self.process.stdin is not None
            self.process.stdin.close()
            self.process.wait(timeout=60)


@dataclass
class Project:
    """A header tree, a masquerade directory, a cache and a ledger in one temporary directory."""

    root: Path
    backend: str
    env: dict[str, str] = field(default_factory=dict)

    @property
    def compiler_name(self) -> str:
        return "nvcc" if self.backend == "nvcc" else "g++"

    @property
    def include_dirs(self) -> list[Path]:
        return [self.root / "inc", self.root / "third_a", self.root / "third"]

    @property
    def cache(self) -> Path:
        return self.root / "cache"

    @property
    def ledger(self) -> Path:
        return self.root / "ledger.db"

    def setup(self) -> None:
        from cacheaudit.shim import install_masquerade

        _write(self.root / "inc" / "mylib" / "api.cuh",
               "#pragma once\n#include <cutlite/tile.h>\n#define API_VALUE 100\n")
        (self.root / "third_a").mkdir(parents=True, exist_ok=True)
        _write(self.root / "third" / "cutlite" / "tile.h",
               "#pragma once\n#include <cutlite/detail.h>\n#define TILE_VALUE (10 + DETAIL)\n")
        _write(self.root / "third" / "cutlite" / "detail.h", "#pragma once\n#define DETAIL 1\n")
        _write(self.root / "envA" / "envconst.h", "#pragma once\n#define ENV_VALUE 1000\n")
        _write(self.root / "envB" / "envconst.h", "#pragma once\n#define ENV_VALUE 2000\n")
        install_masquerade(str(self.root / "masq"))
        env = {k: v for k, v in os.environ.items()
               if not k.startswith(("CACHEAUDIT", "NVCC_", "DG_", "EP_", "DJ_", "PYTEST_"))
               and k not in ("CPATH", "C_INCLUDE_PATH", "CPLUS_INCLUDE_PATH")}
        env.update({
            "PATH": os.pathsep.join([str(self.root / "masq"), os.path.dirname(sys.executable),
                                     env.get("PATH", os.defpath)]),
            "PYTHONPATH": os.pathsep.join([str(ROOT), str(ROOT / "tests")]),
            "HOME": str(self.root / "home"),
            "CACHEAUDIT_LEDGER": str(self.ledger),
            "DG_JIT_CACHE_DIR": str(self.cache),
            "DG_JIT_NVCC_COMPILER": str(self.root / "masq" / self.compiler_name),
            "CPATH": str(self.root / "envA"),
            "TMPDIR": str(self.root / "tmp"),
        })
        (self.root / "tmp").mkdir(exist_ok=True)
        self.env = env

    def driver(self, **changes: str | None) -> Driver:
        return Driver(self, self._env(changes))

    def _env(self, changes: dict[str, str | None]) -> dict[str, str]:
        env = dict(self.env)
        for name, value in changes.items():
            if value is None:
                env.pop(name, None)
            else:
                env[name] = value
        return env

    def once(self, source: str = SOURCE, **changes: str | None) -> dict[str, Any]:
        driver = self.driver(**changes)
        try:
            return driver.compile(source)
        finally:
            driver.close()

    def fresh(self, source: str = SOURCE, **changes: str | None) -> str | None:
        """The ground truth: the same request in a new process against an empty cache."""
        fresh_cache = self.root / f"fresh-{len(list(self.root.glob('fresh-*')))}"
        answer = self.once(source, DG_JIT_CACHE_DIR=str(fresh_cache),
                           CACHEAUDIT_DISABLE="1", **changes)
        return answer.get("digest")

    def scan(self, **changes: str | None) -> dict[str, Any]:
        env = self._env(changes)
        done = subprocess.run(
            [sys.executable, "-m", "cacheaudit", "scan", str(self.cache), "--json",
             "--ledger", str(self.ledger), "--fail-on", "never", "--no-progress"],
            capture_output=True, text=True, env=env, cwd=self.root, timeout=600)
        if done.returncode != 0:
            raise RuntimeError(f"scan failed ({done.returncode}): {done.stderr}")
        return json.loads(done.stdout)

    def wrapper(self, name: str, body: str) -> Path:
        """A compiler wrapper script in tools/, as the real compiler behind the shim."""
        real = shutil.which(self.compiler_name, path=os.environ.get("PATH"))
        path = self.root / "tools" / name
        _write(path, "#!/bin/sh\n" + textwrap.dedent(body).replace("REAL", str(real)),
               executable=True)
        return path


@dataclass
class Outcome:
    scenario: str
    event: str
    stale: bool | None
    codes: list[str]
    errors: list[str]
    expected: str
    recorded: list[str] = field(default_factory=list)

    def row(self) -> str:
        stale = {True: "stale", False: "fresh", None: "n/a"}[self.stale]
        return (f"| {self.scenario} | {self.event} | {stale} | {self.expected} | "
                f"{', '.join(sorted(set(self.codes))) or '-'} |")


Scenario = Callable[[Project], Outcome]


def _outcome(name: str, expected: str, served: dict[str, Any], fresh: str | None,
             report: dict[str, Any]) -> Outcome:
    findings = report["findings"]
    return Outcome(scenario=name, event=served.get("event", "error"),
                   stale=None if served.get("digest") is None else served["digest"] != fresh,
                   codes=[f["code"] for f in findings],
                   errors=[f["code"] for f in findings if f["severity"] == "error"],
                   expected=expected)


def nothing_changed(p: Project) -> Outcome:
    p.once()
    served = p.once()
    return _outcome("nothing changed", "no error", served, p.fresh(), p.scan())


def tracked_header_edited(p: Project) -> Outcome:
    p.once()
    _write(p.root / "inc" / "mylib" / "api.cuh",
           "#pragma once\n#include <cutlite/tile.h>\n#define API_VALUE 200\n")
    served = p.once()
    return _outcome("tracked header edited", "miss, no stale finding", served, p.fresh(),
                    p.scan())


def untracked_header_edited(p: Project) -> Outcome:
    p.once()
    _write(p.root / "third" / "cutlite" / "detail.h", "#pragma once\n#define DETAIL 2\n")
    served = p.once()
    return _outcome("untracked header edited", "CA101", served, p.fresh(), p.scan())


def quoted_include(p: Project) -> Outcome:
    served = p.once(SOURCE.replace("#include <envconst.h>", '#include "envconst.h"'))
    from cacheaudit.ledger import Ledger

    with Ledger.open(str(p.ledger)) as ledger:
        refused = [r for r in ledger.records() if r.runtime_error]
    # The runtime refused before compiling: no entry exists, so there is no cache to scan.
    report = p.scan() if p.cache.exists() else {"findings": []}
    outcome = _outcome("quoted include", "the runtime's error recorded", served, None, report)
    outcome.recorded = [str(r.runtime_error) for r in refused]
    return outcome


def cpath_switched(p: Project) -> Outcome:
    p.once()
    served = p.once(CPATH=str(p.root / "envB"))
    return _outcome("CPATH pointed elsewhere", "CA202", served,
                    p.fresh(CPATH=str(p.root / "envB")), p.scan(CPATH=str(p.root / "envB")))


def append_flags_changed(p: Project) -> Outcome:
    p.once()
    served = p.once(NVCC_APPEND_FLAGS="-DEXTRA=5")
    return _outcome("NVCC_APPEND_FLAGS changed", "CA202", served,
                    p.fresh(NVCC_APPEND_FLAGS="-DEXTRA=5"), p.scan(NVCC_APPEND_FLAGS="-DEXTRA=5"))


def compiler_replaced(p: Project) -> Outcome:
    variable = "CACHEAUDIT_REAL_NVCC" if p.backend == "nvcc" else "CACHEAUDIT_REAL_GXX"
    tool = p.wrapper(p.compiler_name, 'exec REAL -DVARIANT=1 "$@"\n')
    p.once(**{variable: str(tool)})
    p.wrapper(p.compiler_name, 'exec REAL -DVARIANT=2 "$@"\n')  # same path, same --version
    served = p.once(**{variable: str(tool)})
    fresh = p.once(DG_JIT_CACHE_DIR=str(p.root / "fresh-compiler"),
                   **{variable: str(tool)}).get("digest")
    return _outcome("compiler at the same path replaced", "CA301", served, fresh,
                    p.scan(**{variable: str(tool)}))


def header_edited_while_runtime_lives(p: Project) -> Outcome:
    driver = p.driver()
    try:
        driver.compile()
        _write(p.root / "inc" / "mylib" / "api.cuh",
               "#pragma once\n#include <cutlite/tile.h>\n#define API_VALUE 300\n")
        served = driver.compile()
        # Scanned while the process that hashed the header still runs.
        return _outcome("tracked header edited while the runtime object lives", "CA106",
                        served, p.fresh(), p.scan())
    finally:
        driver.close()


def header_shadowed(p: Project) -> Outcome:
    p.once()
    _write(p.root / "third_a" / "cutlite" / "detail.h", "#pragma once\n#define DETAIL 7\n")
    served = p.once()
    return _outcome("header appearing earlier in the -I order", "CA105", served, p.fresh(),
                    p.scan())


def tracked_header_shadowed(p: Project) -> Outcome:
    # A tracked header found in a later include directory, then shadowed in an earlier one:
    # DeepJIT's parser searches include_dirs in the same order, so the new key misses.
    source = "#include <mylib/extra.cuh>\n" + SOURCE
    _write(p.root / "third" / "mylib" / "extra.cuh", "#pragma once\n#define EXTRA 1\n")
    p.once(source)
    _write(p.root / "third_a" / "mylib" / "extra.cuh", "#pragma once\n#define EXTRA 2\n")
    served = p.once(source)
    return _outcome("tracked header shadowed earlier in the runtime's include order",
                    "miss, no stale finding", served, p.fresh(source), p.scan())


def dependency_deleted(p: Project) -> Outcome:
    p.once()
    # A fresh compile now fails: the served binary could not be built any more.
    (p.root / "third" / "cutlite" / "detail.h").unlink()
    served = p.once()
    return _outcome("dependency deleted", "CA104", served, p.fresh(), p.scan())


def edited_during_compile(p: Project) -> Outcome:
    variable = "CACHEAUDIT_REAL_NVCC" if p.backend == "nvcc" else "CACHEAUDIT_REAL_GXX"
    detail = p.root / "third" / "cutlite" / "detail.h"
    marker = p.root / "tools" / "raced"
    # The compiler reads the header, and it is rewritten before the compile ends; the shim's own
    # `--version` probe and dependency pass run the same wrapper and must not race.
    tool = p.wrapper(p.compiler_name, f"""
        case "$*" in *--version*|*-MF*) exec REAL "$@";; esac
        REAL "$@"; status=$?
        if [ ! -e {marker} ]; then
            touch {marker}
            printf '#pragma once\\n#define DETAIL 9\\n' > {detail}
        fi
        exit $status
    """)
    p.once(**{variable: str(tool)})
    served = p.once(**{variable: str(tool)})
    return _outcome("header edited during the compile", "CA401", served,
                    p.fresh(**{variable: str(tool)}), p.scan(**{variable: str(tool)}))


SCENARIOS: dict[str, Scenario] = {
    "nothing_changed": nothing_changed,
    "tracked_header_edited": tracked_header_edited,
    "untracked_header_edited": untracked_header_edited,
    "quoted_include": quoted_include,
    "cpath_switched": cpath_switched,
    "append_flags_changed": append_flags_changed,
    "compiler_replaced": compiler_replaced,
    "header_edited_while_runtime_lives": header_edited_while_runtime_lives,
    "header_shadowed": header_shadowed,
    "tracked_header_shadowed": tracked_header_shadowed,
    "dependency_deleted": dependency_deleted,
    "edited_during_compile": edited_during_compile,
}
NVCC_ONLY = {"append_flags_changed"}


def run(name: str, backend: str, workdir: Path) -> Outcome:
    project = Project(workdir, backend)
    project.setup()
    return SCENARIOS[name](project)


def main() -> None:
    import tempfile

    backends = ["g++"] + (["nvcc"] if shutil.which("nvcc") else [])
    for backend in backends:
        print(f"\n### {backend}\n")
        print("| scenario | runtime's answer | ground truth | expected | cacheaudit's codes |")
        print("|---|---|---|---|---|")
        for name in SCENARIOS:
            if name in NVCC_ONLY and backend != "nvcc":
                continue
            with tempfile.TemporaryDirectory(prefix="cacheaudit-truth-") as workdir:
                outcome = run(name, "gxx" if backend == "g++" else "nvcc", Path(workdir))
            print(outcome.row(), flush=True)


if __name__ == "__main__":
    main()
