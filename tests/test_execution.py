"""Nothing a cache names is executed: reconstruction and the rebuild oracle run only what the
user's configuration resolves, with options from an allowlist (docs/security.md).

Real files and real `cacheaudit scan` / `cacheaudit verify --yes` subprocesses over a DeepJIT
root built by the reference runtime (fixtures/minijit, g++ mode) without recording: one healthy
entry, whose verdict is checked against a fresh compile (an untracked header edited after the
build: the served binary differs from a fresh one, and the scan must say which header), and
one hostile entry beside it whose `meta.json` command tries to make cacheaudit run a program
of its own: `/bin/sh` on a kernel.cu that is a shell script, a script called `g++` or `nvcc` in
the cache, or the real g++ with an option that picks a program (`-B` with a fake `cc1plus`,
`-wrapper`, `-fplugin` with a real shared object whose constructor runs at load, a response
file carrying `-B`). Every such program writes a marker file; the marker must never appear.
"""

from __future__ import annotations

import json
import os
import shutil
import sqlite3
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from cacheaudit.compilers import screen_options

from support import NVCC, needs_gxx, reliability_figure
from truth_table import Project, _real_compiler, _write

HOSTILE = "hostile." + "e" * 32


def cacheaudit(p: Project, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "cacheaudit", *args, "--json",
                           "--ledger", str(p.ledger), "--fail-on", "never"],
                          capture_output=True, text=True, env=p.env, cwd=p.root, timeout=300)


@pytest.fixture
def built(tmp_path: Path) -> tuple[Project, dict[str, Any], str]:
    """A root with one entry built unrecorded by the real g++, then an untracked header edited:
    (project, the served answer, the fresh digest). Truth: the served binary is stale."""
    p = Project(tmp_path / "p", "gxx")
    p.root.mkdir()
    p.setup()
    p.env.pop("XDG_CONFIG_HOME", None)
    unrecorded = {"DG_JIT_NVCC_COMPILER": _real_compiler(p), "CACHEAUDIT_DISABLE": "1"}
    served = p.once(**unrecorded)
    _write(p.root / "third" / "cutlite" / "detail.h", "#pragma once\n#define DETAIL 2\n")
    fresh = p.fresh(DG_JIT_NVCC_COMPILER=_real_compiler(p))
    assert fresh is not None and served["digest"] != fresh  # truth: the entry is stale
    return p, served, fresh


def hostile_entry(served: dict[str, Any], command: str) -> tuple[Path, str]:
    """A copy of the healthy entry under another name whose meta.json command is `command`
    (`{build}` standing for the directory it says it built in, `{entry}` for the entry);
    (the entry, the build directory its command names)."""
    healthy = Path(served["path"])
    entry = healthy.parent / HOSTILE
    shutil.copytree(healthy, entry)
    meta = json.loads((entry / "meta.json").read_text())
    build = str(Path(served["path"]).parent.parent / "tmp" / "hostile-build")
    meta["command"] = command.format(build=build, entry=entry, outside=entry.parents[2])
    (entry / "meta.json").write_text(json.dumps(meta))
    return entry, build


def marker_script(path: Path, marker: Path) -> None:
    _write(path, f"#!/bin/sh\ntouch {marker}\nexit 0\n", executable=True)


def refusals(report: dict[str, Any], entry: Path) -> list[dict[str, Any]]:
    return [f for f in report["findings"] if f["entry"] == str(entry) and f["code"] == "CA501"]


def judged_healthy(p: Project, report: dict[str, Any], served: dict[str, Any]) -> None:
    """The healthy neighbour was reconstructed and the header that makes it stale named, as the
    fresh compile shows it must be (CA101, or CA501 where the scan cannot know what the header
    held at the build: it changed after it, which an unrecorded build leaves open)."""
    detail = str(p.root / "third" / "cutlite" / "detail.h")
    healthy = [(f["code"], f["subject"]) for f in report["findings"]
               if f["entry"] == served["path"]]
    assert ("CA101", detail) in healthy or ("CA501", detail) in healthy, healthy
    assert report["reconstructed"] >= 1


CASES = {
    # name: (meta.json command, what the marker-writing program is, words of the refusal)
    "/bin/sh runs kernel.cu": (
        "/bin/sh {build}/kernel.cu -o {build}/kernel.so", "kernel.cu",
        "'sh' is no compiler of a known kind"),
    "a script called g++ in the cache": (
        "{build}/g++ -x c++ {build}/kernel.cu -fPIC -shared -o {build}/kernel.so", "g++",
        "which is not the compiler the user's configuration resolves"),
    "a script called nvcc in the cache": (
        "{build}/nvcc {build}/kernel.cu --cubin --output-file {build}/kernel.so", "nvcc",
        "which is not the compiler the user's configuration resolves" if NVCC else
        "no nvcc found through"),
}


@needs_gxx
@pytest.mark.parametrize("case", list(CASES))
def test_a_program_the_cache_names_is_never_run(built: tuple[Project, dict[str, Any], str],
                                                case: str):
    p, served, _fresh = built
    command, program, words = CASES[case]
    entry, _build = hostile_entry(served, command)
    marker = p.root / "MARKER"
    if program == "kernel.cu":
        (entry / "kernel.cu").write_text(f"touch {marker}\n")
    else:
        marker_script(entry / program, marker)
    named = str(entry / program) if program != "kernel.cu" else "/bin/sh"

    done = cacheaudit(p, "scan", "--no-progress", str(p.cache))
    assert done.returncode == 0, done.stderr
    report = json.loads(done.stdout)
    assert not marker.exists(), f"scan ran {named}"
    [refusal] = refusals(report, entry)
    assert refusal["subject"] == named
    assert words in refusal["message"] and "not run" in refusal["message"], refusal
    judged_healthy(p, report, served)

    done = cacheaudit(p, "verify", "--yes", str(p.cache))
    assert not marker.exists(), f"verify ran {named}"
    verdicts = json.loads(done.stdout)
    if program == "kernel.cu":
        [unverified] = refusals(verdicts, entry)
        assert "'sh' is no compiler of a known kind" in unverified["message"]
    # The healthy entry's proof agrees with the fresh compile: stale.
    assert any(f["code"] == "CA403" and f["subject"] == served["path"]
               for f in verdicts["findings"]), verdicts["findings"]
    reliability_figure("faults", f"a cache entry whose command is {case}",
                       markers_written=0, scans=1, verifies=1, entries=2,
                       healthy_judged=1)


def _plugin(directory: Path, marker: Path) -> Path:
    """A real shared object whose constructor writes the marker when loaded (as -fplugin
    loads it, before gcc checks it is a plugin)."""
    source = directory / "plugin.c"
    _write(source, f'#include <stdio.h>\n__attribute__((constructor)) static void run(void)'
                   f' {{ FILE *f = fopen("{marker}", "w"); if (f) fclose(f); }}\n')
    plugin = directory / "plugin.so"
    subprocess.run(["gcc", "-shared", "-fPIC", "-o", str(plugin), str(source)], check=True)
    source.unlink()
    return plugin


OPTION_CASES = {
    "-B a directory with a fake cc1plus": ("-B{entry}/evil/", "-B"),
    "-wrapper a script": ("-wrapper {entry}/wrap.sh", "-wrapper"),
    "-fplugin a shared object": ("-fplugin={entry}/plugin.so", "-fplugin"),
    "a response file carrying -B": ("@{entry}/options.rsp", "-B"),
    "a response file outside the entry carrying -B": ("@{outside}/options.rsp", "-B"),
    "-Wp, carrying -fplugin": ("-Wp,-fplugin={entry}/plugin.so", "-Wp,-fplugin"),
}


@needs_gxx
@pytest.mark.parametrize("case", list(OPTION_CASES))
def test_an_option_that_picks_a_program_is_refused(built: tuple[Project, dict[str, Any], str],
                                                   case: str):
    p, served, _fresh = built
    option, words = OPTION_CASES[case]
    compiler = _real_compiler(p)
    entry, _build = hostile_entry(
        served, f"{compiler} -x c++ {{build}}/kernel.cu {option} -fPIC -shared "
                "-o {build}/kernel.so")
    marker = p.root / "MARKER"
    marker_script(entry / "evil" / "cc1plus", marker)
    marker_script(entry / "evil" / "cc1", marker)
    marker_script(entry / "wrap.sh", marker)
    _plugin(entry, marker)
    (entry / "options.rsp").write_text(f"-B{entry}/evil/\n")
    (entry.parents[2] / "options.rsp").write_text(f"-B{entry}/evil/\n")

    done = cacheaudit(p, "scan", "--no-progress", str(p.cache))
    assert done.returncode == 0, done.stderr
    report = json.loads(done.stdout)
    assert not marker.exists(), f"scan ran what {option} picks"
    [refusal] = refusals(report, entry)
    assert refusal["subject"] == str(entry)
    message = refusal["message"]
    assert "an option of its command is refused" in message and words in message, message
    assert "picks a program" in message or "loads one" in message, message
    if case.startswith("a response file"):
        rsp = entry.parents[2] if "outside" in case else entry
        assert f"(from {rsp}/options.rsp)" in message, message
    judged_healthy(p, report, served)

    done = cacheaudit(p, "verify", "--yes", str(p.cache))
    assert not marker.exists(), f"verify ran what {option} picks"
    verdicts = json.loads(done.stdout)
    [unverified] = refusals(verdicts, entry)
    assert "an option of the command is refused" in unverified["message"]
    assert words in unverified["message"], unverified
    assert any(f["code"] == "CA403" and f["subject"] == served["path"]
               for f in verdicts["findings"])
    reliability_figure("faults", f"a cache entry whose g++ command carries {case}",
                       markers_written=0, scans=1, verifies=1, entries=2, healthy_judged=1)


@pytest.mark.skipif(NVCC is None, reason="nvcc is not on PATH: nvcc checks skipped")
@needs_gxx
def test_ccbin_runs_only_the_host_compiler_the_configuration_resolves(
        built: tuple[Project, dict[str, Any], str]):
    """-ccbin in an nvcc command: the gcc on the user's PATH is accepted (the pass runs, the
    graph is taken), a gcc of the cache's own is refused before nvcc starts."""
    p, served, _fresh = built
    nvcc = str(NVCC)
    gcc = shutil.which("gcc", path=p.env["PATH"])
    marker = p.root / "MARKER"
    entry, _build = hostile_entry(
        served, f"{nvcc} -x cu {{build}}/kernel.cu --cubin --output-file {{build}}/kernel.so "
                f"-ccbin {{entry}}/bin -I {p.root}/inc -I {p.root}/third")
    marker_script(entry / "bin" / "gcc", marker)
    done = cacheaudit(p, "scan", "--no-progress", str(p.cache))
    report = json.loads(done.stdout)
    assert not marker.exists()
    [refusal] = refusals(report, entry)
    assert f"-ccbin {entry}/bin names {entry}/bin/gcc, which is not a host compiler the " \
           "user's configuration resolves" in refusal["message"], refusal

    meta = json.loads((entry / "meta.json").read_text())
    meta["command"] = meta["command"].replace(f"-ccbin {entry}/bin", f"-ccbin {gcc}")
    (entry / "meta.json").write_text(json.dumps(meta))
    done = cacheaudit(p, "scan", "--no-progress", str(p.cache))
    report = json.loads(done.stdout)
    assert not refusals(report, entry) or all(
        "refused" not in f["message"] for f in refusals(report, entry)), refusals(report, entry)
    assert report["reconstructed"] == 2
    reliability_figure("faults", "an nvcc command whose -ccbin names a gcc in the cache",
                       markers_written=0, scans=2, entries=2)


# ------------------------------------------------------------------ what the compiler would read


FORCED_INCLUDE_CASES = {
    # name: (the option in the entry's command, the file it names, words of the refusal)
    "-include /dev/zero": ("-include /dev/zero", "/dev/zero",
                           "-include /dev/zero is a character device, not a regular file"),
    "-imacros a FIFO": ("-imacros {entry}/pipe.h", "{entry}/pipe.h",
                        "-imacros {entry}/pipe.h is a FIFO, not a regular file"),
    "-Wp, carrying -include of a FIFO": (
        "-Wp,-include,{entry}/pipe.h", "{entry}/pipe.h",
        "-include {entry}/pipe.h is a FIFO, not a regular file"),
    "a relative -include found through -I": (
        "-I {entry}/inc -include zero.h", "{entry}/inc/zero.h",
        "-include zero.h is a character device, not a regular file"),
}


@needs_gxx
@pytest.mark.parametrize("case", list(FORCED_INCLUDE_CASES))
def test_a_forced_include_that_is_no_regular_file_is_refused_before_any_compiler(
        built: tuple[Project, dict[str, Any], str], case: str):
    """`-include FILE` / `-imacros FILE` make the preprocessor read FILE before the source: a
    device would feed it without end, a FIFO hang it. The scan and the oracle refuse the entry
    before a compiler starts, as for its source, and judge the healthy entry beside it."""
    p, served, _fresh = built
    option, named, words = FORCED_INCLUDE_CASES[case]
    compiler = _real_compiler(p)
    entry, _build = hostile_entry(
        served, f"{compiler} -x c++ {{build}}/kernel.cu {option} -fPIC -shared "
                "-o {build}/kernel.so")
    os.mkfifo(entry / "pipe.h")
    (entry / "inc").mkdir()
    os.symlink("/dev/zero", entry / "inc" / "zero.h")
    named, words = named.format(entry=entry), words.format(entry=entry)

    done = cacheaudit(p, "scan", "--no-progress", str(p.cache))
    assert done.returncode == 0, done.stderr
    report = json.loads(done.stdout)
    [refusal] = refusals(report, entry)
    assert refusal["subject"] == named, refusal
    assert f"{words}: not compiled" in refusal["message"], refusal
    assert not [f for f in refusals(report, served["path"]) if "not compiled" in f["message"]]
    judged_healthy(p, report, served)

    done = cacheaudit(p, "verify", "--yes", str(p.cache))
    verdicts = json.loads(done.stdout)
    [unverified] = refusals(verdicts, entry)
    assert f"{words}: not compiled" in unverified["message"], unverified
    assert any(f["code"] == "CA403" and f["subject"] == served["path"]
               for f in verdicts["findings"]), verdicts["findings"]
    reliability_figure("faults", f"a cache entry whose g++ command carries {case}",
                       compilers_started_on_it=0, scans=1, verifies=1, entries=2,
                       healthy_judged=1)


@needs_gxx
def test_a_response_file_too_large_to_read_is_refused_unread(
        built: tuple[Project, dict[str, Any], str]):
    """A response file that is a sparse 100 GB file (no disk used): reading it would take the
    memory of the machine. Response and options files are read only within 64 MiB for the whole
    command, so it stays unread and the entry is refused with a CA501 that says why; the healthy
    entry beside it is judged."""
    p, served, _fresh = built
    compiler = _real_compiler(p)
    entry, _build = hostile_entry(
        served, f"{compiler} -x c++ {{build}}/kernel.cu @{{entry}}/big.rsp -fPIC -shared "
                "-o {build}/kernel.so")
    with open(entry / "big.rsp", "wb") as sparse:
        sparse.truncate(100 * 1024**3)

    done = cacheaudit(p, "scan", "--no-progress", str(p.cache))
    assert done.returncode == 0, done.stderr
    report = json.loads(done.stdout)
    [refusal] = refusals(report, entry)
    assert refusal["subject"] == str(entry), refusal
    message = refusal["message"]
    assert f"an option of its command is refused: @{entry}/big.rsp: a response file that " \
           "cannot be read" in message, refusal
    assert "past the 67,108,864 bytes cacheaudit reads of them" in message, refusal
    judged_healthy(p, report, served)

    done = cacheaudit(p, "verify", "--yes", str(p.cache))
    verdicts = json.loads(done.stdout)
    [unverified] = refusals(verdicts, entry)
    assert "past the 67,108,864 bytes" in unverified["message"], unverified
    assert any(f["code"] == "CA403" and f["subject"] == served["path"]
               for f in verdicts["findings"]), verdicts["findings"]
    reliability_figure("faults", "a cache entry whose g++ command names a sparse 100 GB "
                       "response file", scans=1, verifies=1, entries=2, healthy_judged=1)


@needs_gxx
def test_a_depfile_the_scan_cannot_read_is_a_ca501_for_that_entry(
        built: tuple[Project, dict[str, Any], str]):
    """A header whose directory has a line end in its name, in a directory no source shares:
    g++ writes the line end raw into the depfile, which then cannot be read as one. The entry
    gets a CA501 saying so (not an internal error), and the healthy entry beside it is judged."""
    p, served, _fresh = built
    compiler = _real_compiler(p)
    entry, _build = hostile_entry(
        served, f"'{compiler}' '-x' 'c++' '{{build}}/kernel.cu' '-I{{entry}}/odd\ndir' "
                "'-fPIC' '-shared' '-o' '{build}/kernel.so'")
    _write(entry / "odd\ndir" / "odd.h", "#pragma once\n#define ODD 1\n")
    (entry / "kernel.cu").write_text('#include "odd.h"\nint k() { return ODD; }\n')

    done = cacheaudit(p, "scan", "--no-progress", str(p.cache))
    assert done.returncode == 0, done.stderr
    report = json.loads(done.stdout)
    [refusal] = refusals(report, entry)
    assert refusal["subject"] == str(entry), refusal
    message = refusal["message"]
    assert "the dependency pass over its recorded command wrote a depfile that cannot be " \
           "read" in message, refusal
    assert "no ':' in rule" in message and "internal error" not in refusal["how"], refusal
    judged_healthy(p, report, served)
    reliability_figure("faults", "a reconstruction whose depfile cannot be parsed (a header "
                       "directory named with a line end)", scans=1, entries=2, healthy_judged=1)


@pytest.mark.parametrize(("kind", "args", "forced"), [
    ("gcc", ["-include", "a.h"], [("-include", "a.h")]),
    ("gcc", ["-includea.h", "--include=b.h", "--imacros", "c.h"],
     [("-include", "a.h"), ("-include", "b.h"), ("-imacros", "c.h")]),
    ("gcc", ["-Xpreprocessor", "-imacros", "-Xpreprocessor", "m.h"], [("-imacros", "m.h")]),
    ("clang", ["-include-pch", "p.pch"], [("-include-pch", "p.pch")]),
    ("nvcc", ["--pre-include", "a.h,b.h", "-include=c.h"],
     [("-include", "a.h"), ("-include", "b.h"), ("-include", "c.h")]),
    ("nvcc", ["-Xcompiler", "-include,h.h", "--compiler-options=-imacros,/m.h"],
     [("-include", "h.h"), ("-imacros", "/m.h")]),
])
def test_forced_includes_are_found_in_every_spelling(kind: str, args: list[str],
                                                     forced: list[tuple[str, str]]):
    from cacheaudit.compilers import parse_command

    assert list(parse_command(kind, ["k.cu", *args]).forced_includes) == forced


# ------------------------------------------------------------------------------ the allowlist


def test_real_runtime_commands_pass_the_allowlist():
    """DeepJIT's and DeepGEMM's own flags (fixtures/minijit, runtimes/deepgemm/rebuild.py) are
    kept whole for a compile; a dependency pass leaves ptxas's options out."""
    from cacheaudit.runtimes.deepgemm import python_jit, rebuild

    deepjit = ["/b/kernel.cu", "--cubin", "--output-file", "/b/kernel.cubin",
               "--gpu-architecture=sm_90a", "-O3", "--compiler-options=-O3", "--use_fast_math",
               "--ptxas-options=--verbose", "--ptxas-options=--register-usage-level=10",
               "--generate-line-info", "-std=c++17", "--include-path", "/inc"]
    assert screen_options("nvcc", deepjit, "compile").args == tuple(deepjit)
    pass_ = screen_options("nvcc", deepjit)
    assert pass_.refused is None and "--ptxas-options=--verbose" in pass_.dropped
    for kind in ("nvcc", "gxx"):
        for flags in rebuild.flag_strings(kind, "/inc", {}, "DG")[:3]:
            args = ["/b/kernel.cu", "-o", "/b/kernel.cubin", *flags.split()]
            checked = screen_options("nvcc" if kind == "nvcc" else "gcc", args, "compile")
            assert checked.refused is None and checked.args == tuple(args), (flags, checked)
    for release in python_jit.RELEASES:  # DeepGEMM's Python JIT, every flag list it tries
        for flags, _disabled in python_jit._flag_lists(release, "/inc", {}):
            args = ["/e/kernel.cu", "-o", "/e/kernel.cubin", *flags]
            assert screen_options("nvcc", args, "compile").args == tuple(args), flags
    gxx = ["-x", "c++", "/b/kernel.cu", "-shared", "-fPIC", "-o", "/b/kernel.so", "-O3",
           "-ffast-math", "-g", "-std=c++17", "-I", "/inc", "-Wl,-rpath,/lib"]
    assert screen_options("gcc", gxx, "compile").args == tuple(gxx)
    assert screen_options("gcc", gxx).dropped == ("-Wl,-rpath,/lib",)


@pytest.mark.parametrize(("kind", "args", "refused"), [
    ("gcc", ["-B/x/"], "-B/x/"), ("gcc", ["-B", "/x"], "-B /x"),
    ("gcc", ["-wrapper", "/x,a"], "-wrapper /x,a"), ("gcc", ["-fplugin=/p.so"], "-fplugin=/p.so"),
    ("gcc", ["-specs=/s"], "-specs=/s"), ("gcc", ["--ld-path=/ld"], "--ld-path=/ld"),
    ("gcc", ["-fuse-ld=/ld"], "-fuse-ld=/ld"),
    ("gcc", ["-no-integrated-cpp"], "-no-integrated-cpp"),
    ("clang", ["-Xclang", "-load"], "-Xclang -load"),
    ("gcc", ["-Xpreprocessor", "-fplugin=/p"], "-Xpreprocessor -fplugin=/p"),
    ("gcc", ["-Wl,-plugin=/p.so"], "-Wl,-plugin=/p.so"), ("gcc", ["-frobnicate=@"], None),
    ("gcc", ["--frobnicate"], "--frobnicate"),
    ("nvcc", ["-Xcompiler", "-B/x"], "-Xcompiler -B/x"),
    ("nvcc", ["--compiler-options=-O3,-wrapper"], "--compiler-options=-O3,-wrapper"),
    ("nvcc", ["-arbin", "/ar"], "-arbin /ar"), ("nvcc", ["--run"], "--run"),
    ("nvcc", ["-forward-unknown-to-host-compiler"], "-forward-unknown-to-host-compiler"),
    ("nvcc", ["-Xlinker", "-plugin=/p"], "-Xlinker -plugin=/p"),
    ("nvcc", ["--frobnicate"], "--frobnicate"),
])
def test_options_that_pick_programs_or_are_unknown_are_refused(kind: str, args: list[str],
                                                               refused: str | None):
    purpose = "compile" if "-plugin" in " ".join(args) else "dependency"
    screened = screen_options(kind, ["k.cu", *args], purpose)
    if refused is None:
        assert screened.refused is None, screened
    else:
        assert screened.refused is not None and screened.refused[0] == refused, screened


# ------------------------------------------------------------------ a compiler a ledger names


@needs_gxx
def test_a_compiler_path_changed_in_the_ledger_is_identified_without_running_it(
        tmp_path: Path):
    """A recorded compile's compiler is asked its --version by a scan only while this user's
    seal vouches for the record; a path changed in the SQLite file afterwards (to a script that
    writes a marker) is identified by its digest alone: a CA501 naming it, nothing run."""
    p = Project(tmp_path / "p", "gxx")
    p.root.mkdir()
    p.setup()
    p.env.pop("XDG_CONFIG_HOME", None)
    served = p.once()
    assert served["digest"] == p.fresh()  # truth: fresh
    done = cacheaudit(p, "scan", "--no-progress", str(p.cache))
    report = json.loads(done.stdout)
    assert [f for f in report["findings"] if f["severity"] == "error"] == []
    assert report["matched"] == 1

    marker = p.root / "MARKER"
    script = p.root / "tools" / "g++"
    marker_script(script, marker)
    with sqlite3.connect(p.ledger) as db:
        changed = db.execute("UPDATE compilers SET path = ?, resolved = ? WHERE kind = 'gcc' "
                             "AND host_id IS NULL", (str(script), str(script))).rowcount
    assert changed >= 1
    done = cacheaudit(p, "scan", "--no-progress", str(p.cache))
    assert done.returncode == 0, done.stderr
    report = json.loads(done.stdout)
    assert not marker.exists(), "scan ran the compiler the ledger names"
    [finding] = [f for f in report["findings"] if f["subject"] == str(script)]
    assert finding["code"] == "CA501" and finding["entry"] == served["path"], finding
    assert "not the binary that built this entry, and it was not run" in finding["message"]
    assert "changed after it was written" in finding["message"], finding
    assert finding["current"].endswith("(not run)")
    reliability_figure("faults", "a ledger record whose compiler path was changed to a script",
                       markers_written=0, scans=2, records_changed=changed)


def test_a_recorded_compiler_runs_only_under_this_users_seal_and_unchanged(tmp_path: Path):
    """`compilers.identify_recorded` / `recorded_distrust` on a real script that writes a marker
    when run: unsealed, sealed by another user's secret, or sealed but changed since, it is
    identified by digest and not run; sealed by this user and unchanged, its --version runs
    (the healthy scan's one subprocess, as before)."""
    import dataclasses

    from cacheaudit import compilers, seal
    from cacheaudit.model import CompileRecord
    from cacheaudit.switches import is_masquerade_dir

    marker = tmp_path / "MARKER"
    script = tmp_path / "bin" / "g++"
    _write(script, f"#!/bin/sh\necho 'g++ (fake) 1'\ntouch {marker}\n", executable=True)
    env = {"PATH": os.defpath, "HOME": str(tmp_path / "home")}
    recorded = compilers.identify(str(script), env=env, path=str(script))
    marker.unlink()
    record = CompileRecord(record_id="r" * 32, event="compile", started_ns=1, compiler=recorded,
                           argv=("-c", "k.cpp"), cwd=str(tmp_path))
    runs = 0

    def identified(rec: CompileRecord) -> tuple[str | None, Any]:
        nonlocal runs
        key = seal.user_key(env, create=False)
        now = compilers.identify_recorded(rec.compiler, env=env, skip=is_masquerade_dir,
                                          distrust=seal.compiler_trust(rec, key))
        ran = marker.exists()
        runs += ran
        if ran:
            marker.unlink()
        return compilers.recorded_distrust(rec, env), (ran, now)

    why, (ran, now) = identified(record)  # no seal at all
    assert not ran and "carries no seal" in str(why)
    assert now.digest == recorded.digest and now.version_text == recorded.version_text
    sealed = seal.sealed(record, env)  # creates this user's secret
    assert identified(sealed)[0] is None and identified(sealed)[1][0]
    changed = dataclasses.replace(sealed, compiler=dataclasses.replace(
        recorded, path=str(tmp_path / "other")))
    why, (ran, _) = identified(changed)
    assert not ran and "changed after it was written" in str(why)
    _write(script, f"#!/bin/sh\necho 'g++ (fake) 2'\ntouch {marker}\n", executable=True)
    why, (ran, now) = identified(sealed)
    assert not ran and "no longer the recorded binary" in str(why)
    assert now.digest != recorded.digest and now.version_text == ""
    assert runs == 2  # only the sealed, unchanged one (asked twice)
