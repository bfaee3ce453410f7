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

import functools
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


@functools.cache
def _validator() -> Any:
    import jsonschema

    from cacheaudit import contract

    return jsonschema.Draft202012Validator(contract.schema())


def checked(text: str) -> dict[str, Any]:
    """A JSON document cacheaudit printed, parsed and validated against the schema shipped in
    the package (docs/json.md): every scan and verify the truth table runs checks the contract."""
    document = json.loads(text)
    errors = [f"{list(e.absolute_path)}: {e.message}" for e in _validator().iter_errors(document)]
    if errors:
        raise AssertionError(f"not valid against the shipped schema: {errors[:5]}")
    return document


def _digest(path: str | None) -> str | None:
    if path is None or not os.path.exists(path):
        return None
    return xxhash.xxh3_128_hexdigest(Path(path).read_bytes())


class Driver:
    """One runtime process; requests go in as JSON lines, answers come back the same way."""

    def __init__(self, project: Project, env: dict[str, str]) -> None:
        config = json.dumps({"root": str(project.root), "backend": project.backend,
                             "command_form": project.command_form,
                             "include_dirs": [str(d) for d in project.include_dirs],
                             "include_prefixes": ["mylib/"]})
        self.process = subprocess.Popen(
            [sys.executable, str(DRIVER), config], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
            stderr=subprocess.PIPE, text=True, env=env, cwd=project.root)

    def compile(self, source: str = SOURCE, name: str = "gemm",
                post_hook: str | None = None) -> dict[str, Any]:
        assert self.process.stdin is not None and self.process.stdout is not None
        self.process.stdin.write(json.dumps({"op": "compile", "name": name, "source": source,
                                             "post_hook": post_hook}) + "\n")
        self.process.stdin.flush()
        line = self.process.stdout.readline()
        if not line:
            raise RuntimeError(f"the driver died: {self.process.stderr.read()}")  # type: ignore[union-attr]
        answer = json.loads(line)
        answer["digest"] = _digest(answer.get("binary"))
        return answer

    def crash_next_build(self) -> None:
        """The next miss dies between the compile and the commit (the process exits)."""
        assert self.process.stdin is not None and self.process.stdout is not None
        self.process.stdin.write(json.dumps({"op": "crash"}) + "\n")
        self.process.stdin.flush()
        self.process.stdout.readline()

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
    shared_ledger: Path | None = None
    """Another project's ledger, for two caches that one ledger knows (twin checkouts)."""
    verify_scans: bool = False
    """Run the rebuild oracle (`verify`) right after each scan, under the scan's environment."""
    verified: list[tuple[int, dict[str, Any], str]] = field(default_factory=list)
    """Each scan's oracle, in order: (exit status, `verify --json` report, stderr)."""
    command_form: str = "joined"
    """How the runtime writes meta.json's command: "joined" (DeepJIT up to e5bdee2) or
    "quoted" (every word shell-quoted, DeepJIT since 24eb539)."""

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
        return self.shared_ledger or self.root / "ledger.db"

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

    def once(self, source: str = SOURCE, post_hook: str | None = None,
             **changes: str | None) -> dict[str, Any]:
        driver = self.driver(**changes)
        try:
            return driver.compile(source, post_hook=post_hook)
        finally:
            driver.close()

    def fresh(self, source: str = SOURCE, post_hook: str | None = None,
              **changes: str | None) -> str | None:
        """The ground truth: the same request in a new process against an empty cache."""
        fresh_cache = self.root / f"fresh-{len(list(self.root.glob('fresh-*')))}"
        answer = self.once(source, post_hook, DG_JIT_CACHE_DIR=str(fresh_cache),
                           CACHEAUDIT_DISABLE="1", **changes)
        return answer.get("digest")

    def scan(self, **changes: str | None) -> dict[str, Any]:
        done = self.scan_process(str(self.cache), **changes)
        if done.returncode != 0:
            raise RuntimeError(f"scan failed ({done.returncode}): {done.stderr}")
        if self.verify_scans:
            self.verified.append(self.verify(**changes))
        return checked(done.stdout)

    def verify(self, *args: str, **changes: str | None) -> tuple[int, dict[str, Any], str]:
        """(exit status, report, stderr) of `cacheaudit verify` on the cache, as a user runs it."""
        done = subprocess.run(
            [sys.executable, "-m", "cacheaudit", "verify", str(self.cache), *args, "--json",
             "--ledger", str(self.ledger), "--fail-on", "never"],
            capture_output=True, text=True, env=self._env(changes), cwd=self.root, timeout=600)
        return done.returncode, checked(done.stdout) if done.stdout.strip() else {}, \
            done.stderr

    def scan_process(self, *arguments: str, fail_on: str = "never",
                     **changes: str | None) -> subprocess.CompletedProcess[str]:
        """`cacheaudit scan ARGUMENTS --json` as a user runs it: its exit status, its output."""
        return subprocess.run(
            [sys.executable, "-m", "cacheaudit", "scan", *arguments, "--json",
             "--ledger", str(self.ledger), "--fail-on", fail_on, "--no-progress"],
            capture_output=True, text=True, env=self._env(changes), cwd=self.root, timeout=600)

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
    findings: list[dict[str, Any]] = field(default_factory=list)
    """The last scan's findings, for assertions on their subjects."""
    notes: dict[str, Any] = field(default_factory=dict)
    """What a scenario observed besides (an earlier scan, the records the scan tied)."""
    project: Project | None = None
    """The project whose cache the last scan judged (set by `run` where a scenario does not)."""
    served: dict[str, Any] = field(default_factory=dict)
    """The runtime's answer to the last request (its entry `path`, `binary`, `digest`)."""

    def row(self) -> str:
        stale = {True: "stale", False: "fresh", None: "n/a"}[self.stale]
        return (f"| {self.scenario} | {self.event} | {stale} | {self.expected} | "
                f"{', '.join(sorted(set(self.codes))) or '-'} |")


Scenario = Callable[[Project], Outcome]


def _outcome(name: str, expected: str, served: dict[str, Any], fresh: str | None,
             report: dict[str, Any]) -> Outcome:
    findings = report["findings"]
    return Outcome(scenario=name, event=served.get("event", "error"), served=served,
                   stale=None if served.get("digest") is None else served["digest"] != fresh,
                   codes=[f["code"] for f in findings],
                   errors=[f["code"] for f in findings if f["severity"] == "error"],
                   expected=expected, findings=findings)


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


# ---------------------------------------------------------------- entry identity and evidence age
# (issue 11: each entry tied to the compile that built it; evidence that knows its age)


def _real_compiler(p: Project) -> str:
    return str(shutil.which(p.compiler_name, path=os.environ.get("PATH")))


def _tied_records(p: Project) -> dict[str, dict[str, Any]]:
    """Entry path -> the compile record a scan tied to it (written back into the ledger)."""
    from cacheaudit.ledger import Ledger

    with Ledger.open(str(p.ledger)) as ledger:
        return {r.entry: {"record": r.record_id, "started_ns": r.started_ns,
                          "observer": r.observer, "reconstructed": r.reconstructed}
                for r in ledger.records(where="r.event = 'compile' AND r.entry_id IS NOT NULL",
                                        with_graphs=False)}


def twin_caches(p: Project) -> Outcome:
    # Two checkouts (A = p, B = twin) with the same kernel and one ledger: B builds first, so
    # A's compile is the newest with this very binary.
    twin = Project(p.root / "twin", p.backend, shared_ledger=p.ledger,
                   verify_scans=p.verify_scans)
    twin.setup()
    twin.once()
    p.once()
    _write(p.root / "third" / "cutlite" / "detail.h", "#pragma once\n#define DETAIL 2\n")
    p.once()
    served = twin.once()
    outcome = _outcome("twin caches: A's untracked header edited, B scanned",
                       "no error, nothing of A", served, twin.fresh(), twin.scan())
    a_tree = [str(p.root / name) for name in ("inc", "third", "envA", "cache")]
    for tree in a_tree:
        shutil.rmtree(tree)
    outcome.notes = {"a_tree": a_tree, "after_a_deleted": twin.scan()["findings"]}
    outcome.project = twin
    return outcome


def identical_binaries_new_key(p: Project) -> Outcome:
    p.once()
    # A comment-only edit of a tracked header: a new key, a byte-identical binary.
    _write(p.root / "inc" / "mylib" / "api.cuh",
           "#pragma once\n// tile sizes tuned\n#include <cutlite/tile.h>\n#define API_VALUE 100\n")
    served = p.once()
    outcome = _outcome("comment-only edit of a tracked header: identical binary, new key",
                       "each entry its own record", served, p.fresh(), p.scan())
    entries = sorted(e for e in (p.cache / "cache").iterdir())
    binaries = [next(e.glob("kernel.so"), None) or next(e.glob("kernel.cubin")) for e in entries]
    outcome.notes = {"entries": [str(e) for e in entries],
                     "binary_ns": {str(e): b.stat().st_mtime_ns
                                   for e, b in zip(entries, binaries, strict=True)},
                     "same_binary": len({b.read_bytes() for b in binaries}) == 1,
                     "tied": _tied_records(p)}
    return outcome


def link_step_taken_as_build(p: Project) -> Outcome:
    # The compile goes unrecorded (the runtime's compiler setting names a wrapper, not the
    # shim), while its host link step reaches g++ by name through the PATH shim, as nvcc's
    # does: the link record's output is the entry's kernel.so, and it compiled no kernel.cu.
    tool = p.root / "tools" / "g++"
    _write(tool, textwrap.dedent(f"""\
        #!{sys.executable}
        import os, subprocess, sys
        real, args = {_real_compiler(p)!r}, sys.argv[1:]
        if any(a == "--version" or a.startswith("-M") for a in args):
            os.execv(real, [real, *args])
        out = args[args.index("-o") + 1]
        rest = [a for i, a in enumerate(args)
                if a not in ("-shared", "-o") and (i == 0 or args[i - 1] != "-o")]
        obj = out[:-len(".so")] + ".o"
        code = subprocess.call([real, *rest, "-c", "-o", obj])
        sys.exit(code or subprocess.call(["g++", "-shared", "-fPIC", "-o", out, obj]))
        """), executable=True)
    setting = {"DG_JIT_NVCC_COMPILER": str(tool)}
    p.once(**setting)
    first = p.scan(**setting)
    _write(p.root / "third" / "cutlite" / "detail.h", "#pragma once\n#define DETAIL 2\n")
    served = p.once(**setting)
    outcome = _outcome("a link step through the PATH shim, the compile unrecorded",
                       "CA101, not tied to the link", served, p.fresh(**setting),
                       p.scan(**setting))
    from cacheaudit.ledger import Ledger

    with Ledger.open(str(p.ledger)) as ledger:
        links = [r.record_id for r in ledger.records(with_graphs=False)
                 if r.observer.startswith("shim:") and "-shared" in r.argv]
    outcome.notes = {"links": links, "first": first}
    return outcome


_HOOK = "import sys\nwith open(sys.argv[1], 'ab') as handle:\n    handle.write(b'post-hook')\n"


def rewritten_binary(p: Project) -> Outcome:
    # DeepJIT's post hook rewrites the binary after the compiler: the recorded output is not
    # the entry's binary, the record still compiled the entry's own kernel.cu.
    _write(p.root / "scripts" / "hook.py", _HOOK)
    p.once(post_hook="scripts/hook.py")
    first = p.scan()
    _write(p.root / "third" / "cutlite" / "detail.h", "#pragma once\n#define DETAIL 2\n")
    served = p.once(post_hook="scripts/hook.py")
    outcome = _outcome("a post hook rewrote the binary; an untracked header edited", "CA101",
                       served, p.fresh(post_hook="scripts/hook.py"), p.scan())
    outcome.notes = {"first": first}
    return outcome


def rebuilt_inputs_restored(p: Project) -> Outcome:
    # Built before recording; a tracked and an untracked header edited, scanned (which
    # reconstructs the entry's inputs), restored, scanned again.
    unrecorded = {"DG_JIT_NVCC_COMPILER": _real_compiler(p), "CACHEAUDIT_DISABLE": "1"}
    p.once(**unrecorded)
    edited = {p.root / "inc" / "mylib" / "api.cuh": "#define API_VALUE 999\n",
              p.root / "third" / "cutlite" / "detail.h": "#define DETAIL 999\n"}
    originals = {path: path.read_text() for path in edited}
    for path, line in edited.items():
        _write(path, originals[path] + line)
    first = p.scan()
    for path, text in originals.items():
        _write(path, text)
    served = p.once(**unrecorded)
    outcome = _outcome("inputs edited before the first scan of an unrecorded build, restored",
                       "no error", served, p.fresh(DG_JIT_NVCC_COMPILER=_real_compiler(p)),
                       p.scan())
    outcome.notes = {"edited": [str(path) for path in edited], "first": first}
    return outcome


def unknown_tracked_set(p: Project) -> Outcome:
    # The entry lost its meta.json (DeepJIT hits on .committed alone): which headers its key
    # covers cannot be computed. A tracked header is edited, and the runtime misses.
    built = p.once()
    (Path(built["path"]) / "meta.json").unlink()
    api = p.root / "inc" / "mylib" / "api.cuh"
    _write(api, "#pragma once\n#include <cutlite/tile.h>\n#define API_VALUE 200\n")
    served = p.once()
    outcome = _outcome("tracked set unknown, a tracked header edited", "CA501, never CA101",
                       served, p.fresh(), p.scan())
    outcome.notes = {"entry": built["path"], "header": str(api)}
    return outcome


IDENTITY_SCENARIOS: dict[str, Scenario] = {
    "twin_caches": twin_caches,
    "identical_binaries_new_key": identical_binaries_new_key,
    "link_step_taken_as_build": link_step_taken_as_build,
    "rewritten_binary": rewritten_binary,
    "rebuilt_inputs_restored": rebuilt_inputs_restored,
    "unknown_tracked_set": unknown_tracked_set,
}


# ------------------------------------------------ caches built without recording (issue 12, part)
# (the newest DeepJIT's quoted command, a root holding only a killed first build)


def quoted_command_unrecorded(p: Project) -> Outcome:
    # The newest DeepJIT writes meta.json's command shell-quoted; built before recording, a
    # CUTLASS-like header outside the tracked prefixes edited: the scan reconstructs the entry's
    # inputs from that command and reports the header.
    p.command_form = "quoted"
    unrecorded = {"DG_JIT_NVCC_COMPILER": _real_compiler(p), "CACHEAUDIT_DISABLE": "1"}
    built = p.once(**unrecorded)
    detail = p.root / "third" / "cutlite" / "detail.h"
    _write(detail, "#pragma once\n#define DETAIL 2\n")
    served = p.once(**unrecorded)
    outcome = _outcome("the newest DeepJIT's quoted command, built unrecorded; untracked header "
                       "edited", "reported (CA101 or CA501 saying why)", served,
                       p.fresh(DG_JIT_NVCC_COMPILER=_real_compiler(p)), p.scan())
    meta = json.loads((Path(built["path"]) / "meta.json").read_text())
    # The rebuild oracle from the layout's own (quoted) command turns the suspicion into proof.
    verified = p.scan_process(str(p.cache), "--verify")
    outcome.notes = {"entry": built["path"], "header": str(detail), "command": meta["command"],
                     "verified": (verified.returncode, verified.stdout, verified.stderr)}
    return outcome


def killed_first_build(p: Project) -> Outcome:
    # The first build in a new root is killed before its commit: tmp/<build>/ and no cache/.
    driver = p.driver()
    try:
        driver.crash_next_build()
        served = driver.compile()
    finally:
        driver.close()
    explicit = p.scan_process(str(p.cache))
    default = p.scan_process()
    failing = p.scan_process(str(p.cache), fail_on="warning")
    report = checked(explicit.stdout) if explicit.returncode == 0 else {"findings": []}
    outcome = _outcome("a root holding only a killed first build", "found; CA402 leftover",
                       served, None, report)
    outcome.notes = {"build": served.get("path"), "cache": str(p.cache),
                     "explicit": (explicit.returncode, explicit.stderr),
                     "default": (default.returncode, default.stdout, default.stderr),
                     "failing": failing.returncode}
    return outcome


DEEPJIT_LAYOUT_SCENARIOS: dict[str, Scenario] = {
    "quoted_command_unrecorded": quoted_command_unrecorded,
    "killed_first_build": killed_first_build,
}


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
    **IDENTITY_SCENARIOS,
    **DEEPJIT_LAYOUT_SCENARIOS,
}
NVCC_ONLY = {"append_flags_changed"}
GXX_ONLY = {"link_step_taken_as_build"}  # its wrapper stands in for nvcc's g++ link step


def run(name: str, backend: str, workdir: Path, verify_scans: bool = False) -> Outcome:
    project = Project(workdir, backend, verify_scans=verify_scans)
    project.setup()
    outcome = SCENARIOS[name](project)
    outcome.project = outcome.project or project
    return outcome


def main() -> None:
    import tempfile

    backends = ["g++"] + (["nvcc"] if shutil.which("nvcc") else [])
    for backend in backends:
        print(f"\n### {backend}\n")
        print("| scenario | runtime's answer | ground truth | expected | cacheaudit's codes |")
        print("|---|---|---|---|---|")
        for name in SCENARIOS:
            if (name in NVCC_ONLY and backend != "nvcc") or (name in GXX_ONLY
                                                             and backend != "g++"):
                continue
            with tempfile.TemporaryDirectory(prefix="cacheaudit-truth-") as workdir:
                outcome = run(name, "gxx" if backend == "g++" else "nvcc", Path(workdir))
            print(outcome.row(), flush=True)


if __name__ == "__main__":
    main()
