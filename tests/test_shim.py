"""The compiler shim, run for real: real compilers, real files, real subprocesses."""

from __future__ import annotations

import os
import signal
import stat
import subprocess
import sys
import textwrap
import time
import types
from pathlib import Path

import pytest
import xxhash

from cacheaudit.graph import depfile_inputs, parse_depfile
from cacheaudit.shim import MASQUERADE_NAMES, install_masquerade
from cacheaudit.switches import MARKER
from fixtures import reference_tu

from support import NVCC, ShimEnv, needs_gxx, needs_nvcc


def _script(path: Path, body: str) -> Path:
    path.write_text("#!/bin/sh\n" + textwrap.dedent(body))
    path.chmod(path.stat().st_mode | stat.S_IXUSR | stat.S_IXGRP | stat.S_IXOTH)
    return path


def _compiler_deps(argv: list[str], cwd: Path, env: dict[str, str], depfile: Path) -> set[str]:
    """The compiler's own `-M` list for the same command, as realpaths."""
    subprocess.run([*argv, "-M", "-MF", str(depfile)], cwd=cwd, env=env, check=True,
                   capture_output=True)
    return {os.path.realpath(os.path.join(cwd, p))
            for p in depfile_inputs(parse_depfile(depfile.read_text()))}


def _recorded_inputs(record) -> set[str]:
    return {s.path for s in record.sources} | set(record.graph.paths)


@needs_gxx
def test_gxx_shared_object_records_the_four_answers(shim_env: ShimEnv, header_tree: Path):
    args = ["-shared", "-fPIC", "-I", "../inc", "k.cpp", "-o", "../out/k.so"]
    extra = {"CPATH": str(header_tree / "cpath")}
    done = shim_env.run(["g++", *args], cwd=header_tree / "src", env=extra)
    assert done.returncode == 0, done.stderr
    assert done.stderr == b""
    [record] = shim_env.records()
    # 1. the compiler
    assert record.compiler.kind == "gcc"
    assert os.path.realpath(record.compiler.resolved) == record.compiler.resolved
    assert record.compiler.version_text.startswith("g++")
    # 2. the options, and the environment that changed the compile
    assert list(record.argv) == args
    assert record.env["CPATH"] == str(header_tree / "cpath")
    # 3. the event
    assert record.event == "compile" and record.exit_code == 0
    # 4. the inputs: exactly what the compiler's own -M pass lists for the same command
    expected = _compiler_deps(["g++", *args[:-2]], header_tree / "src",
                              shim_env.bare_env(extra), header_tree / "check.d")
    assert _recorded_inputs(record) == expected
    assert [s.path for s in record.sources] == [str(header_tree / "src" / "k.cpp")]
    paths = set(record.graph.paths)
    for header in ("src/local.h", "inc/lib/api.h", "inc/lib/detail.h", "cpath/envconst.h"):
        assert str(header_tree / header) in paths
    so = header_tree / "out" / "k.so"
    [output] = record.outputs
    assert output.path == str(so)
    assert output.digest == xxhash.xxh3_128_hexdigest(so.read_bytes())


@needs_nvcc
def test_nvcc_cubin_records_graph_and_env_injected_flags(shim_env: ShimEnv, header_tree: Path):
    args = ["-cubin", "-arch=sm_90", "-I../inc", "k.cu", "-o", "../out/k.cubin"]
    extra = {"CPATH": str(header_tree / "cpath"), "NVCC_APPEND_FLAGS": "-DEXTRA=1"}
    done = shim_env.run(["nvcc", *args], cwd=header_tree / "src", env=extra)
    assert done.returncode == 0, done.stderr
    [record] = shim_env.records()
    assert record.compiler.kind == "nvcc"
    assert "release" in record.compiler.version_line
    assert record.compiler.host is not None and record.compiler.host.kind == "gcc"
    last = record.effective_argv[-1]
    assert (last.text, last.origin) == ("-DEXTRA=1", "env:NVCC_APPEND_FLAGS")
    assert [t.origin for t in record.effective_argv[:-1]] == ["argv"] * len(args)
    expected = _compiler_deps(["nvcc", *args[:-2]], header_tree / "src",
                              shim_env.bare_env(extra), header_tree / "check.d")
    assert _recorded_inputs(record) == expected
    # nvcc writes CUDA headers as <cuda>/bin/../targets/...: stored realpath'd, written form kept
    cuda = [f for f in record.graph.files if "/bin/../" in f.written]
    assert cuda and all("/../" not in f.path for f in cuda)
    cubin = header_tree / "out" / "k.cubin"
    assert record.outputs[0].digest == xxhash.xxh3_128_hexdigest(cubin.read_bytes())
    # The cubin equals the one the bare nvcc builds: the shim changed nothing.
    bare = shim_env.run([NVCC, *args[:-1], "../out/bare.cubin"], cwd=header_tree / "src",
                        env=shim_env.bare_env(extra))
    assert bare.returncode == 0
    assert (header_tree / "out" / "bare.cubin").read_bytes() == cubin.read_bytes()


@needs_gxx
def test_a_failing_compile_is_byte_identical_and_recorded(shim_env: ShimEnv, header_tree: Path):
    (header_tree / "src" / "bad.cpp").write_text('#include "missing.h"\nint f() { return 1; }\n')
    argv = ["g++", "-c", "bad.cpp", "-o", "../out/bad.o"]
    shimmed = shim_env.run(argv, cwd=header_tree / "src")
    bare = shim_env.run(argv, cwd=header_tree / "src", env=shim_env.bare_env())
    assert shimmed.returncode == bare.returncode != 0
    assert shimmed.stderr == bare.stderr and b"missing.h" in bare.stderr
    assert shimmed.stdout == bare.stdout
    [record] = shim_env.records()
    assert record.exit_code == bare.returncode


@needs_nvcc
def test_nvcc_failure_is_byte_identical(shim_env: ShimEnv, header_tree: Path):
    (header_tree / "src" / "bad.cu").write_text("__global__ void k() { undeclared(); }\n")
    argv = ["nvcc", "-cubin", "-arch=sm_90", "bad.cu", "-o", "../out/bad.cubin"]
    shimmed = shim_env.run(argv, cwd=header_tree / "src")
    bare = shim_env.run(argv, cwd=header_tree / "src", env=shim_env.bare_env())
    assert (shimmed.returncode, shimmed.stdout, shimmed.stderr) == (
        bare.returncode, bare.stdout, bare.stderr)
    assert bare.returncode != 0
    assert shim_env.records()[0].exit_code == bare.returncode


@pytest.mark.parametrize("name", ["g++", pytest.param("nvcc", marks=needs_nvcc)])
def test_version_is_byte_identical_and_not_recorded(shim_env: ShimEnv, tmp_path: Path, name):
    shimmed = shim_env.run([name, "--version"], cwd=tmp_path)
    bare = shim_env.run([name, "--version"], cwd=tmp_path, env=shim_env.bare_env())
    assert (shimmed.returncode, shimmed.stdout, shimmed.stderr) == (
        bare.returncode, bare.stdout, bare.stderr)
    assert not shim_env.ledger.exists()


def test_a_query_imports_nothing_of_cacheaudit_but_the_lookup(shim_env: ShimEnv, tmp_path: Path):
    """`nvcc --version` runs for every DeepJIT key: it reaches the compiler with no module of
    cacheaudit beyond the shim, its switches and the PATH lookup (no compilers, digest, model,
    xxhash)."""
    shimmed = shim_env.run(["g++", "--version"], cwd=tmp_path,
                           env={"PYTHONPROFILEIMPORTTIME": "1"})
    assert shimmed.returncode == 0, shimmed.stderr
    imported = {line.rsplit("|", 1)[-1].strip()
                for line in shimmed.stderr.decode().splitlines() if line.startswith("import time")}
    ours = sorted(m for m in imported if m.startswith("cacheaudit") or m == "xxhash")
    assert ours == ["cacheaudit", "cacheaudit.programs", "cacheaudit.shim",
                    "cacheaudit.switches"]


def test_stdout_stderr_bytes_and_exit_status_pass_through(shim_env: ShimEnv, tmp_path: Path):
    (tmp_path / "x.c").write_text("int x;\n")
    fake = _script(tmp_path / "fake-gcc", r"""
        printf 'out\377\000bytes' ; printf 'err\nno newline' >&2 ; exit 3
    """)
    env = {"CACHEAUDIT_REAL_GCC": str(fake)}
    shimmed = shim_env.run(["gcc", "-c", "x.c"], cwd=tmp_path, env=env)
    bare = subprocess.run([str(fake), "-c", "x.c"], cwd=tmp_path, capture_output=True)
    assert shimmed.stdout == bare.stdout == b"out\xff\x00bytes"
    assert shimmed.stderr == bare.stderr
    assert shimmed.returncode == 3
    [record] = shim_env.records()
    assert record.exit_code == 3 and record.compiler.path == str(fake)


def test_death_by_signal_is_reproduced(shim_env: ShimEnv, tmp_path: Path):
    (tmp_path / "x.c").write_text("int x;\n")
    fake = _script(tmp_path / "fake-gcc", "kill -TERM $$\nsleep 5\n")
    done = shim_env.run(["gcc", "-c", "x.c"], cwd=tmp_path, env={"CACHEAUDIT_REAL_GCC": str(fake)})
    assert done.returncode == -signal.SIGTERM
    [record] = shim_env.records()
    assert record.signal == signal.SIGTERM and record.exit_code is None


def test_a_signal_sent_to_the_shim_reaches_the_compiler(shim_env: ShimEnv, tmp_path: Path):
    (tmp_path / "x.c").write_text("int x;\n")
    seen = tmp_path / "seen"
    fake = _script(tmp_path / "fake-gcc", f"""
        case "$*" in *--version*|*-MF*) echo fake; exit 0;; esac
        trap 'echo got-term > {seen}; exit 42' TERM
        echo started > {tmp_path / 'started'}
        i=0; while [ $i -lt 300 ]; do sleep 0.1; i=$((i+1)); done
    """)
    env = dict(shim_env.env, CACHEAUDIT_REAL_GCC=str(fake))
    proc = subprocess.Popen(["gcc", "-c", "x.c"], cwd=tmp_path, env=env)
    deadline = time.monotonic() + 60
    while not (tmp_path / "started").exists():
        assert time.monotonic() < deadline
        time.sleep(0.05)
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(timeout=60) == 42
    assert seen.read_text().strip() == "got-term"


def test_a_signal_during_the_import_of_children_still_reaches_the_compiler(
        monkeypatch: pytest.MonkeyPatch):
    # The CI failure this pins: SIGTERM landed while `cacheaudit.children` was half imported
    # (in sys.modules, no `kill_all` yet); the handler failed on it before passing the signal on,
    # and the compiler ran to its end.
    from cacheaudit.shimrun import Compile, SignalForwarder

    monkeypatch.setitem(sys.modules, "cacheaudit.children", types.ModuleType("cacheaudit.children"))
    compiler = Compile(os.posix_spawn("/bin/sleep", ["sleep", "30"], dict(os.environ)))
    forwarder = SignalForwarder()
    forwarder.attach(compiler)
    try:
        forwarder.receive(signal.SIGTERM, None)
        assert compiler.wait() == -signal.SIGTERM, "the compiler (sleep) never got SIGTERM"
    finally:
        compiler.send_signal(signal.SIGKILL)
        compiler.wait()


@needs_gxx
def test_recording_failure_never_fails_the_compile_and_loses_nothing(
        shim_env: ShimEnv, header_tree: Path):
    not_a_ledger = header_tree / "notes.txt"
    not_a_ledger.write_text("my notes\n")
    env = {"CACHEAUDIT_LEDGER": str(not_a_ledger), "CPATH": str(header_tree / "cpath")}
    done = shim_env.run(["g++", "-c", "-I../inc", "k.cpp", "-o", "../out/k.o"],
                        cwd=header_tree / "src", env=env)
    assert done.returncode == 0
    assert (header_tree / "out" / "k.o").exists()
    lines = done.stderr.decode().splitlines()
    assert len(lines) == 1 and lines[0].startswith("cacheaudit: recording failed")
    assert "not a cacheaudit ledger" in lines[0]
    assert not_a_ledger.read_text() == "my notes\n"
    spooled = list((header_tree / "notes.txt.spool").glob("*.json"))
    assert len(spooled) == 1


@needs_gxx
def test_the_shim_ends_without_teardown_but_keeps_status_record_and_exit_functions(
        shim_env: ShimEnv, tmp_path: Path):
    # The recording path skips the interpreter's teardown (`shimrun._end_now`): the compile's
    # status, its record, what the process wrote to stderr and every exit function registered in
    # it (here by a sitecustomize, as coverage's would be) must all survive that.
    site_dir = tmp_path / "site"
    site_dir.mkdir()
    ran = tmp_path / "exit-functions-ran"
    (site_dir / "sitecustomize.py").write_text(
        "import atexit, sys\n"
        "sys.stderr.write('buffered by the shim process')\n"
        f"atexit.register(lambda: open({str(ran)!r}, 'w').write('ran'))\n")
    (tmp_path / "ok.c").write_text("int ok;\n")
    (tmp_path / "bad.c").write_text("int bad = ;\n")
    env = {"PYTHONPATH": str(site_dir)}
    ok = shim_env.run(["gcc", "-c", "ok.c", "-o", "ok.o"], cwd=tmp_path, env=env)
    assert ok.returncode == 0 and (tmp_path / "ok.o").exists(), ok.stderr
    assert ran.read_text() == "ran", "the shim's exit functions did not run"
    assert b"buffered by the shim process" in ok.stderr
    ran.unlink()
    bad = shim_env.run(["gcc", "-c", "bad.c", "-o", "bad.o"], cwd=tmp_path, env=env)
    bare = subprocess.run(["gcc", "-c", "bad.c", "-o", "bad.o"], cwd=tmp_path,
                          env=shim_env.bare_env(), capture_output=True)
    assert bare.returncode != 0 and bad.returncode == bare.returncode
    assert ran.read_text() == "ran"
    records = {Path(r.sources[0].path).name: r.exit_code for r in shim_env.records()}
    assert records == {"ok.c": 0, "bad.c": bare.returncode}


@needs_gxx
def test_unwritable_ledger_still_compiles(shim_env: ShimEnv, header_tree: Path):
    env = {"CACHEAUDIT_LEDGER": "/proc/cacheaudit/ledger.db", "CPATH": str(header_tree / "cpath")}
    done = shim_env.run(["g++", "-c", "-I../inc", "k.cpp", "-o", "../out/k.o"],
                        cwd=header_tree / "src", env=env)
    assert done.returncode == 0 and (header_tree / "out" / "k.o").exists()
    assert done.stderr.decode().count("\n") == 1
    assert "not recorded: " in done.stderr.decode()


@needs_nvcc
def test_no_recursion_when_the_host_compiler_is_masqueraded_too(
        shim_env: ShimEnv, header_tree: Path):
    # nvcc finds g++ on PATH; the masquerade directory is first there, and holds g++.
    done = shim_env.run(["nvcc", "-c", "-I../inc", "k.cu", "-o", "../out/k.o"],
                        cwd=header_tree / "src", env={"CPATH": str(header_tree / "cpath")})
    assert done.returncode == 0, done.stderr
    records = shim_env.records()
    assert [r.observer for r in records] == ["shim:nvcc"]


def test_a_real_compiler_that_is_the_shim_itself_is_refused(shim_env: ShimEnv, tmp_path: Path):
    env = {"CACHEAUDIT_REAL_GCC": str(shim_env.bin / "gcc")}
    done = shim_env.run(["gcc", "--version"], cwd=tmp_path, env=env)
    assert done.returncode == 127
    assert b"cannot find the real gcc" in done.stderr


@needs_gxx
def test_input_modified_during_the_compile_is_flagged(shim_env: ShimEnv, header_tree: Path):
    header = header_tree / "inc" / "lib" / "detail.h"
    # Only the compile itself races; the shim's `--version` probe and dependency pass run the
    # same script and must not edit the header a second time.
    racing = _script(header_tree / "racing-g++", f"""
        case "$*" in *--version*|*-MF*) exec g++ "$@";; esac
        sleep 0.3
        echo '#pragma once' > {header}
        echo '#define DETAIL_VALUE 11' >> {header}
        exec g++ "$@"
    """)
    env = {"CACHEAUDIT_REAL_GXX": str(racing), "CPATH": str(header_tree / "cpath")}
    done = shim_env.run(["g++", "-c", "-I../inc", "k.cpp", "-o", "../out/k.o"],
                        cwd=header_tree / "src", env=env)
    assert done.returncode == 0, done.stderr
    [record] = shim_env.records()
    assert list(record.modified_during_compile) == [str(header)]


@needs_gxx
def test_response_file_tokens_are_labelled_and_followed(shim_env: ShimEnv, header_tree: Path):
    rsp = header_tree / "src" / "flags.rsp"
    rsp.write_text('-I../inc "-DEXTRA=2"\n')
    done = shim_env.run(["g++", "-c", "@flags.rsp", "k.cpp", "-o", "../out/k.o"],
                        cwd=header_tree / "src", env={"CPATH": str(header_tree / "cpath")})
    assert done.returncode == 0, done.stderr
    [record] = shim_env.records()
    from_file = [t for t in record.effective_argv if t.origin.startswith("file:")]
    assert [t.text for t in from_file] == ["-I../inc", "-DEXTRA=2"]
    assert str(header_tree / "inc" / "lib" / "api.h") in record.graph.paths


def test_shim_install_lays_out_names_and_protects_foreign_files(tmp_path: Path):
    masq = tmp_path / "bin"
    install_masquerade(str(masq))
    assert (masq / MARKER).exists()
    for name in MASQUERADE_NAMES:
        assert os.path.islink(masq / name)
    install_masquerade(str(masq))  # twice is fine
    other = tmp_path / "other"
    other.mkdir()
    (other / "nvcc").write_text("#!/bin/sh\n")
    from cacheaudit.exceptions import UsageError

    with pytest.raises(UsageError, match="not the shim"):
        install_masquerade(str(other), names=["nvcc"])
    assert (other / "nvcc").read_text() == "#!/bin/sh\n"


def test_cli_shim_install(tmp_path: Path):
    done = subprocess.run([sys.executable, "-m", "cacheaudit", "shim", "install",
                           str(tmp_path / "b"), "--name", "nvcc"], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    assert os.path.islink(tmp_path / "b" / "nvcc")
    assert not (tmp_path / "b" / "g++").exists()


@needs_nvcc
@pytest.mark.slow
@pytest.mark.skipif(reference_tu.cutlass_include() is None, reason="nvidia-cutlass not installed")
def test_cutlass_reference_tu_graph_equals_nvcc_m(shim_env: ShimEnv, tmp_path: Path):
    include = reference_tu.cutlass_include()
    source = reference_tu.write_source(str(tmp_path / "tu"))
    flags = reference_tu.nvcc_flags(include)
    done = shim_env.run(["nvcc", *flags, "-cubin", source, "-o", "ref.cubin"],
                        cwd=tmp_path / "tu")
    assert done.returncode == 0, done.stderr[-2000:]
    [record] = shim_env.records()
    expected = _compiler_deps(["nvcc", *flags, source], tmp_path / "tu", shim_env.bare_env(),
                              tmp_path / "check.d")
    assert len(expected) > 800
    assert _recorded_inputs(record) == expected


def test_a_signal_the_parent_ignores_stays_ignored_in_the_compiler(shim_env: ShimEnv,
                                                                    tmp_path: Path):
    (tmp_path / "x.c").write_text("int x;\n")
    fake = _script(tmp_path / "fake-gcc", """
        case "$*" in *-MF*) exit 0;; esac
        grep '^SigIgn' /proc/$$/status
    """)
    env = dict(shim_env.env, CACHEAUDIT_REAL_GCC=str(fake))

    def ignore_hangup() -> None:  # as nohup does
        signal.signal(signal.SIGHUP, signal.SIG_IGN)

    shimmed = subprocess.run(["gcc", "-c", "x.c"], cwd=tmp_path, env=env, capture_output=True,
                             preexec_fn=ignore_hangup, timeout=120)
    bare = subprocess.run([str(fake), "-c", "x.c"], cwd=tmp_path, capture_output=True,
                          preexec_fn=ignore_hangup, timeout=120)
    assert shimmed.returncode == 0, shimmed.stderr
    ignored = int(shimmed.stdout.split()[1], 16)
    assert ignored & (1 << (signal.SIGHUP - 1))
    assert shimmed.stdout == bare.stdout


def test_the_start_up_hook_stays_out_of_shim_processes(shim_env: ShimEnv, tmp_path: Path):
    (tmp_path / "x.c").write_text("int x;\n")
    fake = _script(tmp_path / "fake-gcc", "exit 0\n")
    env = dict(shim_env.env, CACHEAUDIT_REAL_GCC=str(fake), CACHEAUDIT="1")
    env.pop("CACHEAUDIT_SHIMS", None)
    # A build tool that is not Python (make, ninja): nothing prepared a session before the shim.
    done = subprocess.run(["sh", "-c", "gcc -c x.c && gcc -c x.c"], cwd=tmp_path, env=env,
                          capture_output=True, timeout=120)
    assert done.returncode == 0, done.stderr
    records = shim_env.records()
    assert len(records) == 2
    # One parent process, one run: no shim started a session of its own.
    assert len({r.run_uuid for r in records}) == 1


@needs_gxx
def test_a_session_record_names_the_runtime_process_behind_the_shell(shim_env: ShimEnv,
                                                                     header_tree: Path):
    """A session's run id is shared by every process below it: each record keeps the runtime's
    own process, found past the shell the runtime compiled through (DeepJIT's popen)."""
    import socket

    from cacheaudit.processes import process_stat

    command = "cd ../src && g++ -fPIC -shared -I ../inc k.cpp -o ../out/k.so"
    cpath = {"CPATH": str(header_tree / "cpath")}
    done = shim_env.run(["sh", "-c", command], cwd=header_tree / "inc",
                        env={**cpath, "CACHEAUDIT_RUN": "session-1"})
    assert done.returncode == 0, done.stderr
    [record] = shim_env.records()
    assert record.run_uuid == "session-1"
    stat = process_stat(os.getpid())
    assert stat is not None
    assert record.runtime_process == f"{socket.gethostname()}:{os.getpid()}:{stat[2]}"
    # Outside a session the run id is that process already: nothing is added.
    done = shim_env.run(["sh", "-c", command], cwd=header_tree / "inc", env=cpath)
    assert done.returncode == 0, done.stderr
    assert shim_env.records()[-1].runtime_process is None


def _headers_gxx_reads(argv: list[str], cwd: Path, env: dict[str, str]) -> set[str]:
    """Ground truth independent of any depfile: `g++ -H` prints each header it opens."""
    done = subprocess.run([*argv, "-H", "-fsyntax-only"], cwd=cwd, env=env, check=True,
                          capture_output=True)
    return {os.path.realpath(os.path.join(cwd, line.lstrip(b".").strip().decode()))
            for line in done.stderr.splitlines() if line.startswith(b".")}


@needs_gxx
def test_a_source_named_with_a_newline_keeps_its_include_graph(shim_env: ShimEnv,
                                                               header_tree: Path):
    # gcc writes a newline in a name raw (mkdeps.cc escapes only blanks, '#' and '$'), so the
    # depfile's target and prerequisite span two lines each: issue 13, item 8.
    source_dir = header_tree / "src"
    source = source_dir / "ker\nnel.cpp"
    source.write_text((source_dir / "k.cpp").read_text())
    args = ["-c", "-I", "../inc", source.name, "-o", "../out/k.o"]
    extra = {"CPATH": str(header_tree / "cpath")}
    done = shim_env.run(["g++", *args], cwd=source_dir, env=extra)
    assert done.returncode == 0, done.stderr
    [record] = shim_env.records()
    assert [s.path for s in record.sources] == [str(source)]
    assert record.graph is not None, f"no include graph for {source!r}: {record.notes}"
    read = _headers_gxx_reads(["g++", *args[:-3], source.name], source_dir,
                              shim_env.bare_env(extra))
    assert str(header_tree / "inc" / "lib" / "detail.h") in read
    # The graph may also list the implicit pre-include (stdc-predef.h), which -H does not show.
    assert read <= set(record.graph.paths), f"headers of {source!r} missing from the graph"
    assert set(record.graph.paths) - read <= {"/usr/include/stdc-predef.h"}
