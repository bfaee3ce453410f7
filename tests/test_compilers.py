"""Compiler identity and effective argv, checked against the real g++ and nvcc.

The tokenisers are tested three ways: tables of measured cases, an oracle that hands the same
strings to nvcc (`-dryrun`) or g++ (`-E -dM`) and compares what the compiler made of them, and
hypothesis properties (quote and split back, concatenation). Wrapper scripts, symlink chains and
loops are real files under tmp_path; the only stand-in compilers are scripts where a real one
cannot be made to misbehave (hang).
"""

from __future__ import annotations

import os
import re
import stat
import subprocess
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from cacheaudit.compilers import (
    RAW_SUFFIX,
    DictMemo,
    compiler_kind,
    effective_argv,
    expand_argv,
    find_program,
    host_compiler_path,
    identify,
    identity_cache_key,
    output_paths,
    parse_command,
    quote_gcc_response_file,
    quote_nvcc_env,
    quote_nvcc_options_file,
    resolve_wrappers,
    split_clang_response_file,
    split_gcc_response_file,
    split_nvcc_env,
    split_nvcc_options_file,
)
from cacheaudit.digest import hash_file
from cacheaudit.exceptions import TokenizeError
from cacheaudit.model import ArgToken

from support import GCC, GXX, NVCC, needs_gxx, needs_nvcc


def _env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("NVCC_")}
    env.update(extra)
    return env


def _script(path: Path, body: str) -> Path:
    path.write_text(body)
    path.chmod(0o755)
    return path


def _run_text(argv: list[str], env: dict[str, str] | None = None,
              cwd: Path | None = None) -> str:
    proc = subprocess.run(argv, capture_output=True, env=env, stdin=subprocess.DEVNULL,
                          cwd=cwd, check=False)
    return (proc.stdout + proc.stderr).decode("utf-8", "surrogateescape")


# ----------------------------------------------------------------------------------------------
# kinds and PATH lookup


@pytest.mark.parametrize(("name", "kind"), [
    ("nvcc", "nvcc"), ("/usr/local/cuda/bin/nvcc", "nvcc"), ("gcc", "gcc"), ("g++", "gcc"),
    ("cc", "gcc"), ("c++", "gcc"), ("g++-12", "gcc"), ("x86_64-linux-gnu-g++-12", "gcc"),
    ("x86_64-conda-linux-gnu-c++", "gcc"), ("/usr/bin/x86_64-linux-gnu-gcc-12", "gcc"),
    ("clang", "clang"), ("clang++", "clang"), ("clang-18", "clang"), ("clang++-18", "clang"),
    ("hipcc", "hipcc"), ("gcc-ar-12", "unknown"), ("clang-tidy", "unknown"),
    ("cc1plus", "unknown"), ("mpicc", "unknown"), ("ccache", "unknown"), ("python3", "unknown"),
])
def test_compiler_kind(name: str, kind: str) -> None:
    assert compiler_kind(name) == kind


def test_find_program_order_skip_and_slash(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    d0, d1, d2, d3 = (tmp_path / n for n in ("d0", "d1", "d2", "d3"))
    for d in (d0, d1, d2, d3):
        d.mkdir()
    (d0 / "tool").mkdir()                                 # a directory is not a program
    (d1 / "tool").write_text("not executable")            # neither is a plain file
    _script(d2 / "tool", "#!/bin/sh\nexit 0\n")
    _script(d3 / "tool", "#!/bin/sh\nexit 0\n")
    path = os.pathsep.join(map(str, (d0, d1, d2, d3)))
    assert find_program("tool", path) == str(d2 / "tool")
    assert find_program("tool", path, skip=lambda d: d == str(d2)) == str(d3 / "tool")
    assert find_program("tool", path, skip=lambda d: d in (str(d2), str(d3))) is None
    assert find_program(str(d3 / "tool"), "") == str(d3 / "tool")
    assert find_program(str(d1 / "tool"), path) is None
    monkeypatch.chdir(d3)
    assert find_program("tool", os.pathsep + str(d2)) == str(d3 / "tool")  # "" means "."
    assert find_program("./tool", None) == "./tool"


# ----------------------------------------------------------------------------------------------
# wrappers


@needs_gxx
def test_resolve_wrapper_script_and_symlink_chain(tmp_path: Path) -> None:
    real = os.path.realpath(GXX)  # type: ignore[arg-type]
    wrapper = _script(tmp_path / "g++", f'#!/bin/sh\n# forwards\nset -e\nexec {GXX} "$@"\n')
    (tmp_path / "b").symlink_to(wrapper)
    (tmp_path / "a").symlink_to(tmp_path / "b")
    resolved, chain = resolve_wrappers(str(tmp_path / "a"))
    assert resolved == real
    assert chain[:3] == (str(tmp_path / "a"), str(tmp_path / "b"), str(wrapper))
    assert chain[3] == GXX


@needs_gxx
@pytest.mark.parametrize("line", [
    'exec env LC_ALL=C "{gxx}" "$@"',
    "exec '{gxx}' \"${{@}}\"  # trailing comment",
    'exec env -u FOO {gxx} "$@"',
    'exec g++ "$@"',
])
def test_resolve_wrapper_forms(tmp_path: Path, line: str) -> None:
    wrapper = _script(tmp_path / "w", "#!/usr/bin/env bash\n\n" + line.format(gxx=GXX) + "\n")
    resolved, chain = resolve_wrappers(str(wrapper), search_path=os.path.dirname(GXX))  # type: ignore[type-var]
    assert resolved == os.path.realpath(GXX)  # type: ignore[arg-type]
    assert chain[0] == str(wrapper)


@needs_gxx
@pytest.mark.parametrize("body", [
    '#!/bin/sh\necho hi\nexec {gxx} "$@"\n',          # another command
    '#!/bin/sh\nexec "$CXX" "$@"\n',                  # an expansion
    '#!/bin/sh\nexec {gxx} -O2 "$@"\n',               # adds flags: the script is the compiler
    '#!/bin/sh\nexec ./g++ "$@"\n',                   # relative to an unknown cwd
    '#!/usr/bin/python3\nexec {gxx} "$@"\n',          # not a shell
    '#!/bin/sh\nexec {gxx} "$@"\nexec {gxx} "$@"\n',  # two execs
    '#!/bin/sh\nexec {gxx} "$@"\n' + "#" * 70000,      # too large to read for certain
])
def test_resolve_gives_up_on_uncertain_scripts(tmp_path: Path, body: str) -> None:
    wrapper = _script(tmp_path / "w", body.format(gxx=GXX))
    assert resolve_wrappers(str(wrapper)) == (str(wrapper), ())


def test_resolve_wrapper_loop_and_identify_reports_it(tmp_path: Path) -> None:
    _script(tmp_path / "a", f'#!/bin/sh\nexec {tmp_path / "b"} "$@"\n')
    _script(tmp_path / "b", f'#!/bin/sh\nexec {tmp_path / "a"} "$@"\n')
    (tmp_path / "l1").symlink_to(tmp_path / "l2")
    (tmp_path / "l2").symlink_to(tmp_path / "l1")
    resolved, chain = resolve_wrappers(str(tmp_path / "a"))
    assert resolved == str(tmp_path / "a")
    assert chain == (str(tmp_path / "a"), str(tmp_path / "b"))
    started = time.monotonic()
    ident = identify(str(tmp_path / "a"), env=_env(), timeout=30)
    assert ident.error is not None and "loop" in ident.error
    assert time.monotonic() - started < 5  # never ran the looping script
    ident = identify(str(tmp_path / "l1"), env=_env())
    assert ident.error is not None


@needs_nvcc
def test_installed_nvcc_wrapper_resolves() -> None:
    resolved, chain = resolve_wrappers(NVCC)  # type: ignore[arg-type]
    assert os.path.basename(resolved) == "nvcc"
    assert _shebang_free(resolved)
    if chain:
        assert chain[0] == NVCC


def _shebang_free(path: str) -> bool:
    with open(path, "rb") as handle:
        return handle.read(2) != b"#!"


# ----------------------------------------------------------------------------------------------
# identity


@needs_gxx
def test_identify_real_gxx() -> None:
    env = _env()
    ident = identify("g++", env=env)
    assert ident.error is None
    assert ident.kind == "gcc"
    assert ident.path == GXX
    assert ident.resolved == os.path.realpath(GXX)  # type: ignore[arg-type]
    assert ident.version_text == _run_text([GXX, "--version"], env)  # type: ignore[list-item]
    assert ident.digest == hash_file(ident.resolved)
    st_ = os.stat(ident.resolved)
    assert (ident.size, ident.mtime_ns) == (st_.st_size, st_.st_mtime_ns)
    assert ident.host is None


@needs_nvcc
@needs_gxx
def test_identify_real_nvcc_and_default_host() -> None:
    env = _env()
    ident = identify("nvcc", env=env)
    assert ident.error is None
    assert ident.kind == "nvcc"
    raw = subprocess.run([NVCC, "--version"], capture_output=True, env=env, check=True)  # type: ignore[list-item]
    assert ident.version_text.encode("utf-8", "surrogateescape") == raw.stdout + raw.stderr
    assert "release" in ident.version_line
    assert ident.digest == hash_file(ident.resolved)
    assert ident.host is not None and ident.host.error is None
    # nvcc runs `gcc` from PATH for preprocessing and host compiles (see host_compiler_path).
    assert ident.host.invoked == "gcc"
    assert ident.host.path == GCC
    assert ident.host.version_text == _run_text([GCC, "--version"], env)  # type: ignore[list-item]


@needs_nvcc
@needs_gxx
def test_identify_nvcc_host_from_ccbin_directory(tmp_path: Path) -> None:
    hostdir = tmp_path / "hostbin"
    hostdir.mkdir()
    _script(hostdir / "gcc", f'#!/bin/sh\nexec {GCC} "$@"\n')
    _script(hostdir / "g++", f'#!/bin/sh\nexec {GXX} "$@"\n')
    opts = tmp_path / "host.optf"
    opts.write_text(f"--compiler-bindir={hostdir}\n")
    env = _env()
    ways = [
        ({"argv": ["-ccbin", str(hostdir)]}, env),
        ({"argv": [f"--compiler-bindir={hostdir}", "-c", "x.cu"]}, env),
        ({"argv": ["-ccbin", "g++"]}, _env(NVCC_APPEND_FLAGS=f"-ccbin {hostdir}")),
        ({"argv": ["-optf", str(opts)]}, env),
        ({}, _env(NVCC_CCBIN=str(hostdir))),
    ]
    for kwargs, run_env in ways:
        ident = identify("nvcc", env=run_env, cwd=str(tmp_path), **kwargs)  # type: ignore[arg-type]
        host = ident.host
        assert host is not None and host.error is None, kwargs
        assert host.invoked == str(hostdir / "gcc")
        assert host.wrappers[0] == str(hostdir / "gcc")
        assert host.resolved == os.path.realpath(GCC)  # type: ignore[arg-type]
        assert host.version_text == _run_text([GCC, "--version"], run_env)  # type: ignore[list-item]


@needs_nvcc
def test_identify_nvcc_host_missing_is_reported_not_raised(tmp_path: Path) -> None:
    hostdir = tmp_path / "only-gxx"
    hostdir.mkdir()
    _script(hostdir / "g++", "#!/bin/sh\nexit 0\n")
    ident = identify("nvcc", env=_env(), argv=["-ccbin", str(hostdir)])
    assert ident.error is None
    assert ident.host is not None and ident.host.error is not None
    assert "not found" in ident.host.error


def _dryrun_host(argv: list[str], env: dict[str, str], cwd: Path) -> str:
    out = _run_text([NVCC, "-dryrun", *argv, "-c", "x.cu"], env, cwd)  # type: ignore[list-item]
    for line in out.splitlines():
        if line.startswith("#$ ") and " -E -x c++" in line:
            return line[3:].split(" ")[0].replace('"', "")
    raise AssertionError(out[-2000:])


@needs_nvcc
@needs_gxx
def test_host_compiler_path_matches_nvcc_dryrun(tmp_path: Path) -> None:
    hostdir = tmp_path / "hb"
    hostdir.mkdir()
    _script(hostdir / "gcc", f'#!/bin/sh\nexec {GCC} "$@"\n')
    (tmp_path / "x.cu").write_text("__global__ void k() {}\n")
    cases = [([], _env()), (["-ccbin", str(hostdir)], _env()), (["-ccbin", "hb"], _env()),
             (["-ccbin", "g++"], _env()), ([], _env(NVCC_CCBIN=str(hostdir))),
             (["-ccbin", "g++"], _env(NVCC_CCBIN=str(hostdir)))]
    for argv, env in cases:
        nvcc_says = _dryrun_host(argv, env, tmp_path)
        name, full = host_compiler_path(argv, env, str(tmp_path))
        assert name == nvcc_says, (argv, name, nvcc_says)
        assert full is not None


def test_identify_failures_never_raise(tmp_path: Path) -> None:
    missing = identify("no-such-compiler-xyz", env={"PATH": str(tmp_path)})
    assert missing.error is not None and "not found" in missing.error
    hang = _script(tmp_path / "hangcc", "#!/bin/sh\nsleep 30\n")
    started = time.monotonic()
    ident = identify(str(hang), env=_env(), timeout=0.5)
    assert time.monotonic() - started < 10
    assert ident.error is not None and "did not finish" in ident.error
    assert ident.digest == hash_file(str(hang))  # what could be collected is kept
    failing = _script(tmp_path / "failcc", "#!/bin/sh\necho boom >&2\nexit 3\n")
    ident = identify(str(failing), env=_env())
    assert ident.version_text == "boom\n"
    assert ident.error is not None and "status 3" in ident.error
    # A program already chosen for the name (the shim's CACHEAUDIT_REAL_<NAME>) is used as is.
    chosen = identify("gcc", env=_env(), path=str(failing))
    assert (chosen.invoked, chosen.path, chosen.kind) == ("gcc", str(failing), "gcc")
    gone = identify("gcc", env=_env(), path=str(tmp_path / "gone"))
    assert gone.error is not None and "not found" in gone.error


@pytest.mark.skipif(os.geteuid() == 0, reason="root reads every file")
def test_identify_unreadable_binary(tmp_path: Path) -> None:
    blob = tmp_path / "blobcc"
    blob.write_text("#!/bin/sh\necho v1\n")
    blob.chmod(stat.S_IXUSR)
    ident = identify(str(blob), env=_env())
    assert ident.error is not None and ident.digest is None


@needs_gxx
def test_identity_memo_skips_version_run(tmp_path: Path) -> None:
    memo = DictMemo()
    env = _env()
    first = identify("g++", env=env, memo=memo)
    assert first.error is None and len(memo.entries) == 1 and memo.hits == 0
    second = identify("g++", env=env, memo=memo)
    assert memo.hits == 1
    assert second == first
    key = identity_cache_key(first.path, first.resolved, first.wrappers, env)
    assert key in memo.entries
    assert identity_cache_key(first.path, first.resolved, first.wrappers,
                              {**env, "LC_ALL": "de_DE.UTF-8"}) != key
    fresh = _script(tmp_path / "fresh", "#!/bin/sh\necho v1\n")
    # Written just now: a stat match would prove nothing, so no key and no memo.
    assert identity_cache_key(str(fresh), str(fresh), (), env) is None
    identify(str(fresh), env=env, memo=memo)
    assert len(memo.entries) == 1


# ----------------------------------------------------------------------------------------------
# tokenisers: measured tables

ENV_CASES: list[tuple[str, list[str] | None]] = [
    ("-DX=1", ["-DX=1"]),
    ("-DX=1\n-DY=2", ["-DX=1\n-DY=2"]),
    ("-DX=1\t-DY=2  -DZ", ["-DX=1", "-DY=2", "-DZ"]),
    ('-DX="1 + 2"', ['-DX="1 + 2"']),
    ('-DX=a"b c"d', ['-DX=a"b c"d']),
    ('"-DX=1"', ['"-DX=1"']),
    ("-DX=a\\b", ["-DX=ab"]),
    ("-DX=a\\\\b", ["-DX=a\\b"]),
    ('-DX="a\\"b"', ['-DX="a"b"']),
    ('-DX="a\\ b"', ['-DX="a b"']),
    ("-DZ='s t'", ["-DZ='s", "t'"]),
    ("-DX=#x", ["-DX=#x"]),
    ("", []),
    ("  \t ", []),
    ('-DX=a\\"b', None),
    ("-DX=a\\ b", None),
    ('-DX="a', None),
    ("-DX=a\\", None),
    ('-DX="a\\\\"', None),
]


@pytest.mark.parametrize(("value", "expected"), ENV_CASES)
def test_split_nvcc_env_table(value: str, expected: list[str] | None) -> None:
    if expected is None:
        with pytest.raises(TokenizeError):
            split_nvcc_env(value)
    else:
        assert split_nvcc_env(value) == expected


OPTF_CASES: list[tuple[str, list[str] | None]] = [
    ('-DQ="a b"', ["-DQ=a b"]),
    ('-DX="a"b"c"', ["-DX=abc"]),
    ("-DX=a\\ b", ["-DX=a b"]),
    ("-DX=a\\qb", ["-DX=aqb"]),
    ("-DX=a\\\\b", ["-DX=ab"]),
    ('-DX=\\"q\\"', ["-DX=q"]),
    ('-DX="a\\"b"', ["-DX=ab"]),
    ('-DX="a\\\\\\"b"', ['-DX=a"b']),
    ("-DX=\\\\\\\\", ["-DX=\\"]),
    ("-DZ='s t'", ["-DZ='s", "t'"]),
    ("#comment -DY", ["#comment", "-DY"]),
    ("-DA=1\n-DB=2\r\n\t-DC=3 ", ["-DA=1", "-DB=2", "-DC=3"]),
    ("-DX=a \\  -DY=1", ["-DX=a", "-DY=1"]),
    ('-DX=a " " -DY=1', ["-DX=a", " ", "-DY=1"]),
    ("", []),
    ('-DX="a', None),
    ("-DX=a\\", None),
    ("-DX=\\\\", None),
]


@pytest.mark.parametrize(("text", "expected"), OPTF_CASES)
def test_split_nvcc_options_file_table(text: str, expected: list[str] | None) -> None:
    if expected is None:
        with pytest.raises(TokenizeError):
            split_nvcc_options_file(text)
    else:
        assert split_nvcc_options_file(text) == expected


@pytest.mark.parametrize(("text", "gcc", "clang"), [
    ("-DQ1=1 -DQ2=2", ["-DQ1=1", "-DQ2=2"], ["-DQ1=1", "-DQ2=2"]),
    ("-DQ1='a b' \"c d\"", ["-DQ1=a b", "c d"], ["-DQ1=a b", "c d"]),
    ("-DQ1=a\\ b", ["-DQ1=a b"], ["-DQ1=a b"]),
    ("'a\\'b'", ["a'b"], ["a'b"]),
    ("a\\", ["a"], ["a\\"]),
    ('"" x', ["", "x"], ["x"]),
    ("a\vb\fc", ["a", "b", "c"], ["a\vb\fc"]),
    ('"open', ["open"], ["open"]),
    (" \n\t ", [], []),
    ("a\0b c", ["a"], ["a\0b", "c"]),
])
def test_split_response_files_table(text: str, gcc: list[str], clang: list[str]) -> None:
    assert split_gcc_response_file(text) == gcc
    assert split_clang_response_file(text) == clang


# ----------------------------------------------------------------------------------------------
# tokenisers: the nvcc oracle


def _dryrun_defines(text: str) -> list[str]:
    """The -D values nvcc hands the host preprocessor, from `nvcc -dryrun` output.

    nvcc prints each value as `-D "..."`, escaping `"` as `\\"` and nothing else, so the value
    ends at the first quote not preceded by a backslash (values ending in a backslash are
    ambiguous and kept out of the oracle tables).
    """
    start = text.index("-D__CUDA_ARCH__=")
    stop = text.index(" -D__CUDACC_VER_MAJOR__", start)
    values = []
    for part in text[start:stop].split(' -D "')[1:]:
        part = part.rstrip(" ")
        assert part.endswith('"'), part
        values.append(part[:-1].replace('\\"', '"'))
    return values


def _nvcc_oracle(mode: str, value: str, workdir: Path, index: int) -> tuple[bool, object]:
    env = _env()
    argv = [NVCC, "-dryrun", "-cubin", "-arch=sm_90"]
    if mode == "env":
        env["NVCC_APPEND_FLAGS"] = value
    else:
        optf = workdir / f"case{index}.optf"
        optf.write_bytes(value.encode("utf-8", "surrogateescape"))
        argv += ["-optf", str(optf)]
    argv += [str(workdir / "t.cu"), "-o", str(workdir / "t.cubin")]
    proc = subprocess.run(argv, capture_output=True, env=env, cwd=workdir, check=False)  # type: ignore[arg-type]
    text = (proc.stdout + proc.stderr).decode("utf-8", "surrogateescape")
    if proc.returncode != 0 or "-D__CUDA_ARCH__=" not in text:
        return False, text
    return True, _dryrun_defines(text)


ORACLE_ENV = [v for v, _ in ENV_CASES if not v.endswith("\\") and "'" not in v and '"-D' not in v]
ORACLE_ENV += ['-DA="x y" -DB=a\\\\\\\\b', "-DA=1\r-DB=2", '-DA="a\\\\"b" -DB=x', "-DA=$HOME",
               '-DA="a b"c"d e" -DB=""', '-DA=\\q\\\\ -DB=" \\t "']
ORACLE_OPTF = [v for v, _ in OPTF_CASES if not v.endswith("\\") and "'" not in v
               and "#" not in v and '" "' not in v]
ORACLE_OPTF += ['-DA="x y"\n  -DB=a\\\\\\\\b', "-DA=\\\"\\\\\\\"\\\\\" -DB=1", "-DA=1\r\n-DB=2",
                "-DA=\v\f", '-DA="  lead"']
# Tokens of any content, spelled with quote_nvcc_options_file: nvcc must read them back.
ROUND_TRIP_TOKENS = ["-DA=a b", '-DA=a"b', "-DA=a\\b", "-DA= x", '-DA=\\"q\\"', "-DA=\ttab",
                     "-DA=new\nline", '-DA="', "-DA=#'"]


@needs_nvcc
def test_tokenisers_agree_with_nvcc(tmp_path: Path) -> None:
    (tmp_path / "t.cu").write_text("__global__ void k() {}\n")
    cases = [("env", v) for v in ORACLE_ENV] + [("optf", v) for v in ORACLE_OPTF]
    cases.append(("optf", "\n".join(quote_nvcc_options_file(t) for t in ROUND_TRIP_TOKENS)))
    with ThreadPoolExecutor(8) as pool:
        results = list(pool.map(lambda c: _nvcc_oracle(c[1][0], c[1][1], tmp_path, c[0]),
                                enumerate(cases)))
    for (mode, value), (ok, nvcc_result) in zip(cases, results, strict=True):
        split = split_nvcc_env if mode == "env" else split_nvcc_options_file
        try:
            mine = split(value)
        except TokenizeError:
            assert not ok, (mode, value, nvcc_result)
            assert "Stray" in str(nvcc_result), (mode, value, nvcc_result)
            continue
        assert ok, (mode, value, nvcc_result)
        assert all(t.startswith("-D") for t in mine), (mode, value, mine)
        # nvcc strips trailing blanks from a -D value wherever it came from (argv too).
        assert nvcc_result == [t[2:].rstrip(" \t") for t in mine], (mode, value, mine)
    assert split_nvcc_options_file(cases[-1][1]) == ROUND_TRIP_TOKENS


# ----------------------------------------------------------------------------------------------
# tokenisers: properties

_ANY_TEXT = st.text(st.characters(blacklist_categories=("Cs",), blacklist_characters="\0"),
                    max_size=12)
_SEPARATORS = st.text(st.sampled_from(" \t\n\r"), min_size=1, max_size=3)


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(_ANY_TEXT, max_size=6), st.data())
def test_options_file_quote_round_trip(tokens: list[str], data: st.DataObject) -> None:
    text = ""
    for token in tokens:
        text += quote_nvcc_options_file(token) + data.draw(_SEPARATORS)
    assert split_nvcc_options_file(text) == tokens


@settings(max_examples=300, deadline=None)
@given(st.lists(_ANY_TEXT, max_size=6), st.data())
def test_gcc_response_file_quote_round_trip(tokens: list[str], data: st.DataObject) -> None:
    text = "".join(quote_gcc_response_file(t) + data.draw(_SEPARATORS) for t in tokens)
    assert split_gcc_response_file(text) == tokens
    assert split_clang_response_file(text) == [t for t in tokens if t]


_PLAIN = st.text(st.characters(blacklist_characters=' \t"\0', blacklist_categories=("Cs",)),
                 min_size=1, max_size=5)
_QUOTED_INNER = st.text(st.characters(blacklist_characters='"\\\0', blacklist_categories=("Cs",)),
                        max_size=5)


@st.composite
def _env_token(draw: st.DrawFn) -> tuple[str, str]:
    """(spelling, token) for NVCC_*_FLAGS: plain parts with backslashes escaped, quoted parts."""
    spelled, token = "", ""
    for _ in range(draw(st.integers(1, 3))):
        if draw(st.booleans()):
            part = draw(_PLAIN)
            spelled += part.replace("\\", "\\\\")
            token += part
        else:
            inner = draw(_QUOTED_INNER)
            spelled += f'"{inner}"'
            token += f'"{inner}"'
    return spelled, token


@settings(max_examples=300, deadline=None)
@given(st.lists(_env_token(), max_size=6), st.data())
def test_nvcc_env_spelling_round_trip(pairs: list[tuple[str, str]], data: st.DataObject) -> None:
    text = "".join(s + data.draw(st.text(st.sampled_from(" \t"), min_size=1, max_size=2))
                   for s, _ in pairs)
    assert split_nvcc_env(text) == [t for _, t in pairs]
    for _, token in pairs:
        assert split_nvcc_env(quote_nvcc_env(token)) == [token]


_ENV_ALPHABET = st.text(st.sampled_from(['a', '"', "\\", " ", "\t", "\n", "'"]), max_size=10)


def _blank_outside_quotes(token: str) -> bool:
    quoted = False
    for char in token:
        if char == '"':
            quoted = not quoted
        elif char in " \t" and not quoted:
            return True
    return quoted


@settings(max_examples=500, deadline=None)
@given(_ENV_ALPHABET)
def test_nvcc_env_tokens_have_no_unquoted_blank(value: str) -> None:
    try:
        tokens = split_nvcc_env(value)
    except TokenizeError:
        return
    assert all(tokens)
    if "\\" not in value:
        assert not any(_blank_outside_quotes(t) for t in tokens)
        if '"' not in value:
            assert tokens == [t for t in re.split(r"[ \t]+", value) if t]


@settings(max_examples=500, deadline=None)
@given(_ENV_ALPHABET, _ENV_ALPHABET, st.sampled_from([" ", "\t", "  "]))
def test_nvcc_env_concatenation(left: str, right: str, sep: str) -> None:
    try:
        a, b = split_nvcc_env(left), split_nvcc_env(right)
    except TokenizeError:
        return
    assert split_nvcc_env(left + sep + right) == a + b


@settings(max_examples=500, deadline=None)
@given(_ENV_ALPHABET, _ENV_ALPHABET, st.sampled_from([" ", "\n", "\r\n", "\t"]))
def test_nvcc_options_file_concatenation(left: str, right: str, sep: str) -> None:
    try:
        a, b = split_nvcc_options_file(left), split_nvcc_options_file(right)
    except TokenizeError:
        return
    assert split_nvcc_options_file(left + sep + right) == a + b


# ----------------------------------------------------------------------------------------------
# effective argv


def test_effective_argv_nvcc_labels(tmp_path: Path) -> None:
    (tmp_path / "sub").mkdir()
    inner = tmp_path / "sub" / "inner.optf"
    inner.write_text("-DINNER=1")
    outer = tmp_path / "outer.optf"
    outer.write_text('-DOUTER="a b"\n-optf sub/inner.optf\n')
    second = tmp_path / "second.optf"
    second.write_text("-DSECOND")
    env = {"NVCC_PREPEND_FLAGS": "-DPRE=1", "NVCC_APPEND_FLAGS": "-DX=1"}
    tokens = effective_argv("nvcc", ["-cubin", "-optf", "outer.optf", "@rsp",
                                     "--options-file=second.optf,sub/inner.optf", "k.cu"],
                            env, str(tmp_path))
    assert tokens == (
        ArgToken("-DPRE=1", "env:NVCC_PREPEND_FLAGS"),
        ArgToken("-cubin", "argv"),
        ArgToken("-DOUTER=a b", f"file:{outer}"),
        ArgToken("-DINNER=1", f"file:{inner}"),
        ArgToken("@rsp", "argv"),  # nvcc has no response files: @rsp is an input name
        ArgToken("-DSECOND", f"file:{second}"),
        ArgToken("-DINNER=1", f"file:{inner}"),
        ArgToken("k.cu", "argv"),
        ArgToken("-DX=1", "env:NVCC_APPEND_FLAGS"),
    )
    via_env = effective_argv("nvcc", [], {"NVCC_APPEND_FLAGS": "-optf=second.optf"},
                             str(tmp_path))
    assert via_env == (ArgToken("-DSECOND", f"file:{second}"),)


def test_effective_argv_nvcc_problems_are_notes(tmp_path: Path) -> None:
    bad = tmp_path / "bad.optf"
    bad.write_text('-DX="unterminated')
    loop = tmp_path / "loop.optf"
    loop.write_text("-DL -optf loop.optf")
    expansion = expand_argv("nvcc", ["-optf", "missing.optf", "-optf", "bad.optf", "-optf",
                                     "loop.optf", "-optf"], {}, str(tmp_path))
    assert expansion.tokens == (
        ArgToken("-optf", "argv"), ArgToken("missing.optf", "argv"),
        ArgToken('-DX="unterminated', f"file:{bad}{RAW_SUFFIX}"),
        ArgToken("-DL", f"file:{loop}"), ArgToken("-optf", f"file:{loop}"),
        ArgToken("loop.optf", f"file:{loop}"),
        ArgToken("-optf", "argv"),
    )
    notes = "\n".join(expansion.notes)
    for fragment in ("missing.optf", "bad.optf", "recursive", "without a file name"):
        assert fragment in notes
    rejected = expand_argv("nvcc", ["-c"], {"NVCC_APPEND_FLAGS": '-DX=a\\"b -DY'}, "/")
    assert rejected.tokens == (ArgToken("-c", "argv"),
                               ArgToken('-DX=a\\"b -DY', f"env:NVCC_APPEND_FLAGS{RAW_SUFFIX}"))
    assert len(rejected.notes) == 1 and "NVCC_APPEND_FLAGS" in rejected.notes[0]
    # The options of the variables and argv form one list, as in nvcc: a trailing -optf takes
    # the first appended token as its file.
    joined = effective_argv("nvcc", ["-optf"], {"NVCC_APPEND_FLAGS": "second.optf"},
                            str(tmp_path))
    assert joined == (ArgToken("-optf", "argv"),
                      ArgToken("second.optf", "env:NVCC_APPEND_FLAGS"))


def test_effective_argv_gcc_at_files(tmp_path: Path) -> None:
    (tmp_path / "d").mkdir()
    nested = tmp_path / "nested.rsp"
    nested.write_text("-DNESTED")
    top = tmp_path / "d" / "top.rsp"
    top.write_text("-DTOP='a b'\n@nested.rsp @missing.rsp\n")
    selfref = tmp_path / "self.rsp"
    selfref.write_text("@self.rsp")
    expansion = expand_argv("gcc", ["-c", "@d/top.rsp", "@d", "@self.rsp", "x.c"], {},
                            str(tmp_path))
    assert expansion.tokens == (
        ArgToken("-c", "argv"),
        ArgToken("-DTOP=a b", f"file:{top}"),
        ArgToken("-DNESTED", f"file:{nested}"),   # nested names are relative to the cwd
        ArgToken("@missing.rsp", f"file:{top}"),  # a missing @file stays literal, as in gcc
        ArgToken("@d", "argv"),
        ArgToken("@self.rsp", f"file:{selfref}"),
        ArgToken("x.c", "argv"),
    )
    assert any("directory" in n for n in expansion.notes)
    assert any("recursive" in n for n in expansion.notes)
    assert effective_argv("unknown", ["@d/top.rsp"], {}, str(tmp_path)) == (
        ArgToken("@d/top.rsp", "argv"),)


def test_option_files_that_are_not_regular_files_are_not_read(tmp_path: Path) -> None:
    os.mkfifo(tmp_path / "fifo")  # opening it for reading would block forever
    gcc = expand_argv("gcc", ["@fifo", "x.c"], {}, str(tmp_path))
    assert [t.text for t in gcc.tokens] == ["@fifo", "x.c"] and len(gcc.notes) == 1
    nvcc = expand_argv("nvcc", ["-optf", "fifo", "x.cu"], {}, str(tmp_path))
    assert [t.text for t in nvcc.tokens] == ["-optf", "fifo", "x.cu"] and len(nvcc.notes) == 1


@needs_gxx
def test_gcc_at_file_expansion_matches_gxx(tmp_path: Path) -> None:
    rsp = tmp_path / "defs.rsp"
    rsp.write_text("-DQA=1 -DQB='two words'\n\"-DQC=x y\" -DQD=a\\ b -DQE=\"q\\\"uote\"\n"
                   "-DQF=back\\\\slash\t@inner.rsp -DQH='it\\'s'\n")
    (tmp_path / "inner.rsp").write_text("-DQG=inner")
    tokens = [t.text for t in effective_argv("gcc", ["-E", "-dM", "@defs.rsp"], {},
                                             str(tmp_path))]
    expected = {}
    for token in tokens:
        if token.startswith("-DQ"):
            name, _, value = token[2:].partition("=")
            expected[name] = value
    assert len(expected) == 8
    proc = subprocess.run([GXX, "-E", "-dM", "@defs.rsp", "-x", "c++", "/dev/null"],  # type: ignore[list-item]
                          capture_output=True, text=True, cwd=tmp_path, check=True)
    seen = {}
    for line in proc.stdout.splitlines():
        match = re.match(r"#define (Q[A-Z]) (.*)$", line)
        if match:
            seen[match.group(1)] = match.group(2)
    assert seen == expected


# ----------------------------------------------------------------------------------------------
# parsed commands


def test_parse_gcc_command() -> None:
    cmd = parse_command("gcc", [
        "-c", "-O2", "-Iinc", "-I", "inc2", "-isystem", "/sys", "-iquote", "q", "-idirafter",
        "late", "--include-directory=long", "-include", "pre.h", "-MMD", "-MF", "k.d", "-D",
        "X=1", "k.cpp", "-oout/k.o", "helper.o", "-x", "c++", "noext", "-x", "none", "lib.a",
        "-Wp,-MD,wp.d", "-Xlinker", "-rpath", "-lfoo",
    ])
    assert cmd.sources == ("k.cpp", "noext")
    assert cmd.objects == ("helper.o", "lib.a")
    assert cmd.output == "out/k.o"
    assert cmd.include_dirs == (("-I", "inc"), ("-I", "inc2"), ("-isystem", "/sys"),
                                ("-iquote", "q"), ("-idirafter", "late"), ("-I", "long"))
    assert cmd.is_compile and cmd.records
    assert cmd.dependency_argv("/tmp/dep.d") == [
        "-O2", "-Iinc", "-I", "inc2", "-isystem", "/sys", "-iquote", "q", "-idirafter", "late",
        "--include-directory=long", "-include", "pre.h", "-D", "X=1", "k.cpp", "-x", "c++",
        "noext", "-x", "none", "-Xlinker", "-rpath", "-lfoo", "-M", "-MF", "/tmp/dep.d"]
    assert output_paths("gcc", cmd, "/w") == ["/w/out/k.o", "/w/k.d"]


@pytest.mark.parametrize(("kind", "argv", "is_compile", "records"), [
    ("gcc", ["--version"], False, False),
    ("gcc", ["-dumpmachine"], False, False),
    ("gcc", ["-print-file-name=libc.so"], False, False),
    ("gcc", ["-E", "k.c"], False, False),
    ("gcc", ["-E", "k.c", "-o", "k.i"], True, True),
    ("gcc", ["-M", "k.c"], False, False),
    ("gcc", ["k.o", "-o", "prog"], False, True),
    ("gcc", ["k.h"], False, True),
    ("gcc", ["-fsyntax-only", "k.c"], False, False),
    ("nvcc", ["--version"], False, False),
    ("nvcc", ["-V"], False, False),
    ("nvcc", ["-dryrun", "-cubin", "k.cu"], False, False),
    ("nvcc", ["-cubin", "k.cu"], True, True),
    ("nvcc", ["-x", "cu", "kernel.txt", "-ptx"], True, True),
    ("nvcc", ["-E", "k.cu"], False, False),
    ("nvcc", ["k.o", "-o", "prog"], False, True),
    ("nvcc", ["-rdc", "true", "k.cu", "-c"], True, True),
])
def test_parse_command_intent(kind: str, argv: list[str], is_compile: bool,
                              records: bool) -> None:
    cmd = parse_command(kind, argv)
    assert (cmd.is_compile, cmd.records) == (is_compile, records)


def test_parse_nvcc_command() -> None:
    cmd = parse_command("nvcc", [
        "-cubin", "-arch", "sm_90", "-I/a,/b", "--include-path", "c", "-isystem=/s",
        "--system-include", "/t", "-Xcompiler", "-fPIC", "-rdc", "true", "-odir", "objs",
        "--output-file=k.cubin", "-MD", "-MF", "k.d", "-MT", "tgt", "-keep", "-dc", "k.cu",
        "--generate-dependencies-with-compile", "-Werror", "all-warnings", "@resp", "-O3",
    ])
    assert cmd.sources == ("k.cu",)
    assert cmd.objects == ("@resp",)
    assert cmd.output == "k.cubin"
    assert cmd.include_dirs == (("-I", "/a"), ("-I", "/b"), ("-I", "c"), ("-isystem", "/s"),
                                ("-isystem", "/t"))
    assert cmd.dependency_argv("dep.d") == [
        "-arch", "sm_90", "-I/a,/b", "--include-path", "c", "-isystem=/s", "--system-include",
        "/t", "-Xcompiler", "-fPIC", "-rdc", "true", "-rdc=true", "k.cu", "-Werror",
        "all-warnings", "-O3", "-M", "-MF", "dep.d"]
    defaults = parse_command("nvcc", ["-ptx", "-odir", "out", "a.cu", "b.cu"])
    assert output_paths("nvcc", defaults, "/w") == ["/w/out/a.ptx", "/w/out/b.ptx"]
    assert output_paths("nvcc", parse_command("nvcc", ["-lib", "a.cu"]), "/w") == ["/w/a.a"]
    # nvcc 13.0 writes a_dlink.o for a device link without -o (measured).
    assert output_paths("nvcc", parse_command("nvcc", ["-dlink", "-arch=sm_90", "x.o"]),
                        "/w") == ["/w/a_dlink.o"]
    assert output_paths("nvcc", parse_command("nvcc", ["-cubin", "-MD", "a.cu"]), "/w") == [
        "/w/a.cubin", "/w/a.d"]


def _dependency_pass(compiler: str, kind: str, argv: list[str], cwd: Path) -> tuple[str, Path]:
    effective = [t.text for t in effective_argv(kind, argv, _env(), str(cwd))]
    command = parse_command(kind, effective)
    assert command.is_compile
    depfile = cwd / "pass.d"
    proc = subprocess.run([compiler, *command.dependency_argv(str(depfile))], cwd=cwd,
                          capture_output=True, text=True, env=_env(), check=False)
    assert proc.returncode == 0, proc.stderr
    return depfile.read_text(), depfile


@needs_gxx
def test_dependency_argv_runs_with_gxx(tmp_path: Path) -> None:
    (tmp_path / "inc").mkdir()
    (tmp_path / "inc" / "mine.h").write_text("#pragma once\n#define MINE 1\n")
    (tmp_path / "k.cpp").write_text(
        "#include <mine.h>\n#include <cstdio>\nint f() { return MINE; }\n")
    (tmp_path / "flags.rsp").write_text("-Iinc -O2")
    text, _ = _dependency_pass(GXX, "gcc", ["-c", "@flags.rsp", "-MD", "-MF", "orig.d",  # type: ignore[arg-type]
                                            "k.cpp", "-o", "out/k.o"], tmp_path)
    assert "inc/mine.h" in text
    assert "/usr/include/stdio.h" in text or "stdio.h" in text
    assert "/usr/" in text  # -M, not -MM: system headers are listed
    assert not (tmp_path / "out").exists()
    assert not (tmp_path / "orig.d").exists()


@needs_nvcc
def test_dependency_argv_runs_with_nvcc(tmp_path: Path) -> None:
    (tmp_path / "inc").mkdir()
    (tmp_path / "inc" / "mine.h").write_text("#pragma once\n#define MINE 1\n")
    (tmp_path / "k.cu").write_text("#include <mine.h>\n__global__ void k(int* o) { *o = MINE; }\n")
    (tmp_path / "flags.optf").write_text("-Iinc")
    text, _ = _dependency_pass(NVCC, "nvcc", [  # type: ignore[arg-type]
        "-cubin", "-arch=sm_90", "-optf", "flags.optf", "-MD", "-MF", "orig.d", "-keep-dir",
        "kept", "-dc", "k.cu", "-o", "out.cubin"], tmp_path)
    assert "inc/mine.h" in text
    assert "cuda_runtime.h" in text
    assert "/usr/include/" in text
    assert not (tmp_path / "out.cubin").exists()
    assert not (tmp_path / "orig.d").exists()
    assert not (tmp_path / "k.cubin").exists()
