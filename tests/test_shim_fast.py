"""The shim's fixed cost: queries handed over at once, the identity memo, the compile started
first, and what the compiler sees of itself (argv[0], descriptors). Real compilers, real
subprocesses."""

from __future__ import annotations

import json
import os
import stat
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest
import xxhash

from cacheaudit import switches
from cacheaudit.compilers import compiler_kind, identity_cache_key, parse_command
from cacheaudit.digest import SETTLE_WINDOW_NS
from cacheaudit.programs import compiler_name
from cacheaudit.recorder import identity_memo_path
from cacheaudit.shim import (
    LAUNCHER,
    driver_family,
    install_masquerade,
    is_query,
    launcher_text,
    stand_in_name,
)

from support import GXX, ShimEnv, needs_gxx

SETTLE_S = SETTLE_WINDOW_NS / 1e9 + 0.2
"""Past the timestamp-granularity window: a file written before is settled, its stat a key."""


def _script(path: Path, body: str) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("#!/bin/sh\n" + textwrap.dedent(body))
    path.chmod(path.stat().st_mode | stat.S_IXUSR | stat.S_IXGRP | stat.S_IXOTH)
    return path


def _imported(stderr: bytes) -> set[str]:
    return {line.rsplit("|", 1)[-1].strip() for line in stderr.decode().splitlines()
            if line.startswith("import time")}


# --------------------------------------------------------------------------------- queries

# (kind, argv, a query the shim hands over at once)
QUERIES = [
    ("gcc", ["--version"], True),
    ("gcc", ["-v"], True),
    ("gcc", ["-dumpmachine"], True),
    ("gcc", ["-dumpfullversion", "-dumpversion"], True),
    ("gcc", ["-print-file-name=libstdc++.so"], True),
    ("gcc", ["-m32", "-print-multi-directory"], True),
    ("gcc", ["-print-prog-name=cc1plus"], True),
    ("gcc", ["-###"], True),
    ("gcc", ["-O2", "-march=native", "-Q", "--help=target"], False),  # -Q: not known here
    ("gcc", ["-march=native", "--help=target"], True),
    ("gcc", ["-E", "-dM", "-x", "c++", "/dev/null"], True),
    ("gcc", ["-v", "-E", "-x", "c++", "-"], True),
    ("gcc", ["-E", "-I", "inc", "-DX=1", "-std=c++17", "k.cpp"], True),
    ("gcc", ["-M", "k.cpp"], True),
    ("clang", ["-E", "-P", "--target=x86_64-linux-gnu", "k.c"], True),
    ("gcc", ["-E", "k.cpp", "-o", "k.i"], False),
    ("gcc", ["-E", "-ok.i", "k.cpp"], False),
    ("gcc", ["-M", "-MF", "k.d", "k.cpp"], False),
    ("gcc", ["-E", "-MD", "k.cpp"], False),
    ("gcc", ["-E", "-Wp,-MD,k.d", "k.cpp"], False),
    ("gcc", ["-E", "-save-temps", "k.cpp"], False),
    ("gcc", ["-E", "@args"], False),
    ("gcc", ["-D", "-E", "k.cpp"], False),  # -D's value: a compile to a.out
    ("gcc", ["-c", "k.cpp"], False),
    ("gcc", ["-v", "-c", "k.cpp", "-o", "k.o"], False),
    ("gcc", ["-c", "k.cpp", "-dumpversion"], False),  # the full parser decides
    ("gcc", ["k.cpp"], False),
    ("gcc", [], False),
    ("nvcc", ["--version"], True),
    ("nvcc", ["-V"], True),
    ("nvcc", ["--list-gpu-arch"], True),
    ("nvcc", ["-dryrun", "-arch=sm_90"], True),
    ("nvcc", ["-E", "-x", "cu", "-I", "inc", "k.cu"], True),
    ("nvcc", ["-E", "k.cu", "-o", "k.ii"], False),
    ("nvcc", ["-cubin", "-arch=sm_90", "k.cu"], False),
    ("nvcc", ["-E", "-optf", "opts", "k.cu"], False),
    ("unknown", ["-E", "k.cpp"], False),
]


@pytest.mark.parametrize(("kind", "argv", "expected"), QUERIES,
                         ids=[f"{k}:{' '.join(a) or '(none)'}" for k, a, _ in QUERIES])
def test_a_query_is_told_without_the_parser_and_the_parser_agrees(kind, argv, expected):
    """Ground truth: `compilers.parse_command`, which decides the long way; everything the
    shim hands over early must be a command it would not record."""
    assert is_query(argv, kind) is expected, (kind, argv)
    if expected:
        assert not parse_command(kind, argv).records, (kind, argv)


def test_environment_flags_send_an_nvcc_preprocess_the_long_way():
    assert is_query(["-E", "k.cu"], "nvcc", {})
    # NVCC_APPEND_FLAGS="-o k.ii" would write a file: the full parser reads the effective argv.
    assert not is_query(["-E", "k.cu"], "nvcc", {"NVCC_APPEND_FLAGS": "-o k.ii"})
    assert is_query(["--version"], "nvcc", {"NVCC_APPEND_FLAGS": "-O2"})


@pytest.mark.parametrize("name", ["g++", "gcc", "c++", "cc", "clang", "clang++", "clang++-18",
                                  "x86_64-linux-gnu-g++-12", "nvcc", "hipcc", "gcc-ar-12",
                                  "clang-tidy", "g++-12.2", "nvcc.exe", "hipcc.pl", "ld",
                                  "3f2a9c01d4-g++-12"])
def test_the_query_paths_driver_family_is_compiler_kind(name):
    assert driver_family(compiler_name(name)) == compiler_kind(compiler_name(name)), name


def test_a_stand_in_name_for_a_setting_keeps_its_compiler_name():
    for value, family in (("/opt/cuda-12.8/bin/nvcc", "nvcc"), ("g++-12", "g++"),
                          ("/usr/bin/my-wrapper", "g++")):
        name = stand_in_name(value, family)
        assert compiler_kind(compiler_name(name)) == compiler_kind(
            os.path.basename(value) if compiler_kind(value) != "unknown" else family), name


@needs_gxx
def test_a_query_imports_only_the_lookup_in_python_without_site(shim_env: ShimEnv,
                                                               tmp_path: Path):
    """`nvcc --version` runs for every DeepJIT key, Inductor runs `-print-*` and `-E` probes:
    each reaches the compiler with no module of cacheaudit beyond the shim's first step, no
    `site`, and none of `re`, `typing`, `collections`, `subprocess`."""
    for args in (["--version"], ["-print-prog-name=cc1plus"], ["-E", "-dM", "-x", "c++",
                                                                "/dev/null"]):
        shimmed = shim_env.run(["g++", *args], cwd=tmp_path, env={"PYTHONPROFILEIMPORTTIME": "1"})
        assert shimmed.returncode == 0, shimmed.stderr
        imported = _imported(shimmed.stderr)
        ours = sorted(m for m in imported if m.startswith("cacheaudit") or m == "xxhash")
        assert ours == ["cacheaudit", "cacheaudit.programs", "cacheaudit.shim",
                        "cacheaudit.switches"], args
        heavy = imported & {"site", "re", "typing", "collections", "subprocess", "signal",
                            "dataclasses", "enum"}
        assert heavy == set(), (args, heavy)
        bare = shim_env.run(["g++", *args], cwd=tmp_path, env=shim_env.bare_env())
        without_timing = b"\n".join(line for line in shimmed.stderr.splitlines()
                                    if not line.startswith(b"import time"))
        assert (shimmed.stdout, without_timing) == (bare.stdout, bare.stderr.rstrip(b"\n")), args
    assert not shim_env.ledger.exists()


RECORDING_NEVER = {"cacheaudit.ledger.reads", "cacheaudit.ledger.queries",
                   "cacheaudit.ledger.spool", "cacheaudit.ledger.store",
                   "cacheaudit.ledger.combine", "cacheaudit.audit", "uuid", "platform",
                   "socket"}
"""What a shim that records a compile into a ledger without a spool never imports: the
ledger's readers and its spool (it writes through `LedgerWriter`), the judge, `uuid` with
`platform` (its ids are drawn by `cacheaudit.ids`), and `socket` (`ids.hostname`)."""


@needs_gxx
def test_a_recorded_compile_imports_the_ledgers_write_path_only(shim_env: ShimEnv,
                                                                tmp_path: Path):
    (tmp_path / "one.cpp").write_text("int one() { return 1; }\n")
    for _ in range(2):  # the first makes the ledger (its schema through sqlite-utils)
        shimmed = shim_env.run(["g++", "-c", "one.cpp", "-o", "one.o"], cwd=tmp_path,
                               env={"PYTHONPROFILEIMPORTTIME": "1"})
        assert shimmed.returncode == 0, shimmed.stderr
    imported = _imported(shimmed.stderr)
    assert "cacheaudit.ledger.writer" in imported, "the shim recorded nothing"
    assert imported & RECORDING_NEVER == set(), sorted(imported & RECORDING_NEVER)
    records = shim_env.records()
    assert [os.path.basename(r.sources[0].path) for r in records] == ["one.cpp"] * 2


@needs_gxx
def test_a_query_execs_the_compiler_in_the_shims_own_process(shim_env: ShimEnv, tmp_path: Path):
    """No Python process stays while the compiler answers: it has the pid the caller started."""
    fake = _script(tmp_path / "userbin" / "g++", 'echo "$$"\n')
    process = subprocess.Popen(["g++", "-dumpmachine"], cwd=tmp_path, stdout=subprocess.PIPE,
                               env=dict(shim_env.env, CACHEAUDIT_REAL_GXX=str(fake)))
    out, _ = process.communicate(timeout=60)
    assert process.returncode == 0
    assert int(out) == process.pid


# ---------------------------------------------------------------- what the compiler sees


def _collect_gcc(stderr: bytes) -> list[bytes]:
    return [line for line in stderr.splitlines() if line.startswith(b"COLLECT_GCC=")]


@needs_gxx
@pytest.mark.parametrize("compiles", [False, True], ids=["g++ -v", "g++ -v -c"])
def test_the_compiler_sees_the_name_the_user_gave(shim_env: ShimEnv, tmp_path: Path,
                                                  compiles: bool):
    """gcc prints argv[0] as COLLECT_GCC (torch Inductor keys its ISA probes and PCHs on that
    output): through the shim, the query and the recorded compile print what the bare g++
    prints."""
    (tmp_path / "k.cpp").write_text("int k() { return 1; }\n")
    args = ["-v", "-c", "k.cpp", "-o", "k.o"] if compiles else ["-v"]
    shimmed = shim_env.run(["g++", *args], cwd=tmp_path)
    bare = shim_env.run(["g++", *args], cwd=tmp_path, env=shim_env.bare_env())
    assert shimmed.returncode == bare.returncode == 0, shimmed.stderr
    assert _collect_gcc(bare.stderr) == [b"COLLECT_GCC=g++"]
    assert _collect_gcc(shimmed.stderr) == _collect_gcc(bare.stderr)
    assert len(shim_env.records()) == (1 if compiles else 0)


@needs_gxx
def test_a_setting_that_names_another_compiler_is_run_by_that_name(shim_env: ShimEnv,
                                                                   tmp_path: Path):
    """CACHEAUDIT_REAL_GXX names the program as the user's setting wrote it: the compiler gets
    that spelling, as a bare run of the setting would give it."""
    assert GXX is not None
    real = os.path.realpath(GXX)
    done = shim_env.run(["g++", "-v"], cwd=tmp_path, env={"CACHEAUDIT_REAL_GXX": real})
    assert done.returncode == 0, done.stderr
    assert _collect_gcc(done.stderr) == [f"COLLECT_GCC={real}".encode()]


@needs_gxx
def test_the_compile_keeps_the_descriptors_the_shim_inherited(shim_env: ShimEnv,
                                                               tmp_path: Path):
    """make passes its jobserver to compilers as inherited descriptors (`-flto=jobserver`):
    the recorded compile gets them as the bare one does."""
    (tmp_path / "k.c").write_text("int k;\n")
    fake = _script(tmp_path / "userbin" / "gcc", f"""
        case "$*" in *-MF*) exec {GXX} "$@";; esac
        [ -e /proc/$$/fd/$JOBSERVER ] && echo "has $JOBSERVER"
        exec {GXX} "$@"
    """)
    read_end, write_end = os.pipe()
    os.set_inheritable(read_end, True)
    try:
        env = dict(shim_env.env, CACHEAUDIT_REAL_GCC=str(fake), JOBSERVER=str(read_end))
        runs = [subprocess.run([command, "-c", "k.c", "-o", "k.o"], cwd=tmp_path, env=env,
                               capture_output=True, pass_fds=(read_end,), timeout=120)
                for command in ("gcc", str(fake))]
    finally:
        os.close(read_end)
        os.close(write_end)
    shimmed, bare = runs
    assert bare.stdout == f"has {read_end}\n".encode(), bare.stderr
    assert shimmed.stdout == bare.stdout, shimmed.stderr
    assert len(shim_env.records()) == 1


# ---------------------------------------------------------------------- the identity memo


def _versioned_compiler(path: Path, version: str, log: Path) -> Path:
    """A compiler of the user's own: answers `--version` itself (and logs that it was asked),
    compiles with g++."""
    return _script(path, f"""
        if [ "$1" = --version ]; then echo asked >> {log}; echo "{version}"; exit 0; fi
        exec {GXX} "$@"
    """)


@needs_gxx
def test_a_compilers_identity_is_taken_once_per_binary_and_again_when_it_is_replaced(
        shim_env: ShimEnv, tmp_path: Path):
    (tmp_path / "k.cpp").write_text("int k() { return 1; }\n")
    log = tmp_path / "asked.log"
    compiler = _versioned_compiler(tmp_path / "userbin" / "g++", "fakecc 1.0", log)
    env = {"CACHEAUDIT_REAL_GXX": str(compiler)}
    time.sleep(SETTLE_S)

    def compile_once() -> None:
        done = shim_env.run(["g++", "-c", "k.cpp", "-o", "k.o"], cwd=tmp_path, env=env)
        assert done.returncode == 0, done.stderr

    def asked() -> int:
        return len(log.read_text().splitlines()) if log.exists() else 0

    compile_once()
    compile_once()
    first, second = sorted(shim_env.records(), key=lambda r: r.started_ns)
    assert asked() == 1, "the second compile ran --version again"
    for record in (first, second):
        assert record.compiler.version_text == "fakecc 1.0\n"
        assert record.compiler.digest == xxhash.xxh3_128_hexdigest(compiler.read_bytes())
    memo = Path(identity_memo_path(shim_env.env))
    assert stat.S_IMODE(memo.stat().st_mode) == 0o600

    # Replaced (a new inode, as an upgrade installs it): identified afresh.
    staging = tmp_path / "userbin" / "g++.new"
    _versioned_compiler(staging, "fakecc 2.0", log)
    os.replace(staging, compiler)
    time.sleep(SETTLE_S)
    compile_once()
    third = max(shim_env.records(), key=lambda r: r.started_ns)
    assert asked() == 2
    truth = subprocess.run([str(compiler), "--version"], capture_output=True, text=True).stdout
    assert third.compiler.version_text == truth == "fakecc 2.0\n"
    assert third.compiler.digest == xxhash.xxh3_128_hexdigest(compiler.read_bytes())


@needs_gxx
@pytest.mark.parametrize("mode", [0o600, 0o666], ids=["private", "world-writable"])
def test_a_memo_anyone_else_may_write_is_not_believed(shim_env: ShimEnv, tmp_path: Path,
                                                     mode: int):
    """A forged entry under the compiler's true key: taken from a private memo (so the key is
    the shim's), never from one that another account could have written."""
    (tmp_path / "k.cpp").write_text("int k() { return 1; }\n")
    log = tmp_path / "asked.log"
    compiler = _versioned_compiler(tmp_path / "userbin" / "g++", "fakecc 1.0", log)
    time.sleep(SETTLE_S)
    env = shim_env.env
    key = identity_cache_key(str(compiler), str(compiler), (), env)
    assert key is not None
    memo = Path(identity_memo_path(env))
    memo.write_text(json.dumps({"format": "cacheaudit-compiler-identities-v1", "compilers": {
        key: {"resolved": str(compiler), "version_text": "forged 9.9\n", "digest": "0" * 32,
              "size": 1, "mtime_ns": 1}}}))
    memo.chmod(mode)
    done = shim_env.run(["g++", "-c", "k.cpp", "-o", "k.o"], cwd=tmp_path,
                        env={"CACHEAUDIT_REAL_GXX": str(compiler)})
    assert done.returncode == 0, done.stderr
    [record] = shim_env.records()
    if mode == 0o600:
        assert record.compiler.version_text == "forged 9.9\n"
        assert not log.exists()
    else:
        assert record.compiler.version_text == "fakecc 1.0\n"
        assert log.read_text() == "asked\n"


# ------------------------------------------------------- inputs hashed while the compile runs


@needs_gxx
def test_a_header_changed_after_it_was_hashed_is_recorded_as_it_is_after_the_compile(
        shim_env: ShimEnv, header_tree: Path):
    """The dependency pass ends long before this compile (which sleeps first), so the shim has
    hashed every header when the compile rewrites one: the record holds the header as it is
    after the compile (fresh hash: ground truth) and flags it."""
    header = header_tree / "inc" / "lib" / "detail.h"
    racing = _script(header_tree / "racing-g++", f"""
        case "$*" in *--version*|*-MF*) exec {GXX} "$@";; esac
        sleep 1.5
        echo '#pragma once' > {header}
        echo '#define DETAIL_VALUE 12' >> {header}
        exec {GXX} "$@"
    """)
    env = {"CACHEAUDIT_REAL_GXX": str(racing), "CPATH": str(header_tree / "cpath")}
    done = shim_env.run(["g++", "-c", "-I../inc", "k.cpp", "-o", "../out/k.o"],
                        cwd=header_tree / "src", env=env)
    assert done.returncode == 0, done.stderr
    [record] = shim_env.records()
    recorded = {f.path: f.state for f in record.graph.files}[str(header)]
    assert recorded.digest == xxhash.xxh3_128_hexdigest(header.read_bytes())
    assert list(record.modified_during_compile) == [str(header)]
    untouched = header_tree / "inc" / "lib" / "api.h"
    assert ({f.path: f.state for f in record.graph.files}[str(untouched)].digest
            == xxhash.xxh3_128_hexdigest(untouched.read_bytes()))


# ------------------------------------------------------------------------- the launcher


def test_the_start_up_hook_tells_a_shim_started_without_site(tmp_path: Path):
    masq = tmp_path / "masq"
    install_masquerade(str(masq), names=["g++"])
    assert switches.in_shim_process([sys.executable, "-S", str(masq / "g++"), "-c", "k.cpp"])
    assert switches.in_shim_process([sys.executable, str(masq / "g++")])
    assert not switches.in_shim_process([sys.executable, "-S", str(tmp_path / "tool.py")])
    assert not switches.in_shim_process([sys.executable, "-c", "pass"])


@needs_gxx
def test_a_launcher_whose_installation_moved_still_finds_it(tmp_path: Path):
    """The launcher names the installation it was written for; one that moved since is found
    through `site`, and the query still reaches the compiler."""
    masq = tmp_path / "masq"
    install_masquerade(str(masq), names=["g++"])
    (masq / LAUNCHER).write_text(launcher_text(sys.executable, str(tmp_path / "gone")))
    env = dict(os.environ, PYTHONPATH="")  # only the launcher's path, then site's
    shimmed = subprocess.run([str(masq / "g++"), "-dumpmachine"], capture_output=True, env=env,
                             timeout=60)
    bare = subprocess.run([GXX or "g++", "-dumpmachine"], capture_output=True, timeout=60)
    assert (shimmed.returncode, shimmed.stdout, shimmed.stderr) == (
        0, bare.stdout, bare.stderr)


@needs_gxx
def test_a_python_path_too_long_for_a_shebang_goes_through_sh(tmp_path: Path):
    deep = tmp_path.joinpath(*["d" * 40] * 4)
    deep.mkdir(parents=True)
    python = deep / "python3"
    python.symlink_to(sys.executable)
    text = launcher_text(str(python), os.path.dirname(os.path.dirname(
        os.path.abspath(switches.__file__))))
    assert text.startswith("#!/bin/sh\n")
    masq = tmp_path / "masq"
    install_masquerade(str(masq), names=["g++"])
    (masq / LAUNCHER).write_text(text)
    shimmed = subprocess.run([str(masq / "g++"), "-dumpversion"], capture_output=True,
                             timeout=60)
    bare = subprocess.run([GXX or "g++", "-dumpversion"], capture_output=True, timeout=60)
    assert (shimmed.returncode, shimmed.stdout) == (0, bare.stdout), shimmed.stderr


def test_links_lead_to_the_launcher_and_reinstalling_keeps_them(tmp_path: Path):
    masq = tmp_path / "masq"
    install_masquerade(str(masq))
    launcher = masq / LAUNCHER
    assert os.access(launcher, os.X_OK)
    assert launcher.read_text().splitlines()[0] == f"#!{sys.executable} -S"
    before = {name: os.lstat(masq / name).st_ino for name in ("g++", "nvcc")}
    install_masquerade(str(masq))  # a second session: nothing to change
    assert {name: os.lstat(masq / name).st_ino for name in before} == before
    assert all(os.readlink(masq / name) == LAUNCHER for name in before)
