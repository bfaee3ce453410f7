"""Property-based fuzzing of every parser of text cacheaudit did not write itself (issue 13).

Each parser gets arbitrary input and input that is nearly right (a real document with one value
replaced by any JSON value, or deleted): it returns a result or raises the one error type its
docstring names, within a deadline. Where a writer exists (gcc's depfile escaping, the quoting
of response and options files) the text it writes is parsed back to what went in; for depfiles
that writer is also a real g++ run on files with awkward names.

The default run uses a fixed profile (derandomized, a few hundred inputs per parser, about 20 s
in all); the slow case runs every parser again with five times the inputs. Each run leaves its
counts for docs/reliability.md through `reliability_figure("fuzzing", ...)`.
"""

from __future__ import annotations

import contextlib
import copy
import json
import os
import sqlite3
import struct
import subprocess
import tempfile
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from cacheaudit import bounded
from cacheaudit.compilers import tokenizers
from cacheaudit.compilers.command import output_paths, parse_command
from cacheaudit.exceptions import TokenizeError, UsageError
from cacheaudit.graph import (
    DepfileError,
    DepRule,
    NinjaDepsLogError,
    depfile_inputs,
    parse_depfile,
    parse_ninja_deps,
    parse_ninja_deps_log,
)

from support import GXX, deadline, needs_gxx, reliability_figure

# ------------------------------------------------------------------------------------------
# The profile, and the counting harness
# ------------------------------------------------------------------------------------------

SCALE_LONG = 3
"""How many times the default inputs the slow case tries."""


@dataclass
class Fuzzer:
    """One parser's property: `check(value)` for each generated `value`, counted."""

    parser: str
    strategy: st.SearchStrategy[Any]
    check: Callable[[Any], None]
    examples: int
    regressions: tuple[Any, ...] = ()

    def run(self, scale: int = 1, case_suffix: str = "") -> None:
        count = 0

        def counted(value: Any) -> None:
            nonlocal count
            count += 1
            self.check(value)

        test = given(self.strategy)(counted)
        for regression in self.regressions:
            test = example(regression)(test)
        test = settings(
            max_examples=self.examples * scale, derandomize=True, database=None,
            deadline=5_000, print_blob=True,
            suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much,
                                   HealthCheck.data_too_large],
        )(test)
        failures = 0
        try:
            # A parser that hangs on an input fails the case instead of stalling the suite.
            with deadline(60 * scale):
                test()
        except BaseException as exc:
            # Hypothesis raises one group for several distinct failures.
            failures = len(getattr(exc, "exceptions", ())) or 1
            raise
        finally:
            reliability_figure("fuzzing", self.parser + case_suffix, inputs=count,
                               failures=failures, regressions=len(self.regressions),
                               profile="derandomized", max_examples=self.examples * scale)


# ------------------------------------------------------------------------------------------
# Strategies shared by several parsers
# ------------------------------------------------------------------------------------------

_LEAVES = (st.none() | st.booleans() | st.integers(-(2 ** 70), 2 ** 70)
           | st.floats(allow_nan=False) | st.text(max_size=12)
           | st.sampled_from(["", "\x00", "/", "..", "/dev/zero", "\udcff", "a\nb", "-ccbin"]))
json_values = st.recursive(
    _LEAVES, lambda inner: st.lists(inner, max_size=4)
    | st.dictionaries(st.text(max_size=8), inner, max_size=4), max_leaves=12)


@st.composite
def mutations(draw: st.DrawFn, base: Any) -> Any:
    """`base` with one to three of its values replaced by any JSON value, or deleted."""
    document = copy.deepcopy(base)
    for _ in range(draw(st.integers(1, 3))):
        node = document
        while True:
            if isinstance(node, dict) and node:
                key = draw(st.sampled_from(sorted(node)))
            elif isinstance(node, list) and node:
                key = draw(st.integers(0, len(node) - 1))
            else:
                break
            child = node[key]
            if isinstance(child, dict | list) and child and draw(st.booleans()):
                node = child
                continue
            if isinstance(node, dict) and draw(st.integers(0, 4)) == 0:
                del node[key]
            else:
                node[key] = draw(json_values)
            break
    return document


def documents(base: Any) -> st.SearchStrategy[bytes]:
    """Bytes for a JSON file whose writer we do not trust: nearly `base`, any JSON, any text
    of JSON's characters, any bytes, and deep nesting."""
    text = st.text(alphabet=st.sampled_from('[]{}"\\:,ab0 \n\x00é'), max_size=200)
    return st.one_of(
        mutations(base).map(lambda d: json.dumps(d).encode()),
        mutations(base).map(lambda d: json.dumps(d).encode()),
        json_values.map(lambda d: json.dumps(d).encode()),
        text.map(lambda t: t.encode("utf-8", "surrogatepass")),
        st.binary(max_size=120),
        st.integers(60, 3000).map(lambda n: b"[" * n + b"]" * n),
    )


def _surrogate_free(text: str) -> bool:
    try:
        text.encode()
    except UnicodeEncodeError:
        return False
    return True


# ------------------------------------------------------------------------------------------
# Depfiles (cacheaudit/graph.py)
# ------------------------------------------------------------------------------------------


def gcc_escape(name: str) -> str:
    """A name as gcc 12's mkdeps.cc writes it: `$` doubled, `#` after a backslash, a blank after
    a backslash with the backslashes before it doubled; colons and newlines as they are."""
    out: list[str] = []
    slashes = 0
    for char in name:
        if char == "\\":
            slashes += 1
            out.append(char)
            continue
        out.append({"$": "$$", "#": "\\#"}.get(char, char) if char not in " \t"
                   else "\\" * slashes + "\\" + char)
        slashes = 0
    return "".join(out)


def _depfile_text(text: str) -> None:
    try:
        rules = parse_depfile(text)
    except DepfileError:
        return
    assert all(rule.targets and all(rule.targets) and all(rule.prerequisites)
               for rule in rules), rules


_DEPFILE_CHARS = st.sampled_from(list("ab.o/ :\\#$\t\n\r\x00é")) | st.characters()
DEPFILE_TEXT = Fuzzer("depfile: any text", st.text(alphabet=_DEPFILE_CHARS, max_size=80),
                      _depfile_text, examples=400)

# A compile's source with a newline in its name, as gcc writes it (raw), among ordinary headers.
_NAME_CHARS = st.sampled_from(list("ab.-_ #$:\\é字\t%&;'\"")) | st.characters(
    blacklist_categories=("Cs",), blacklist_characters="\n\r\x00")
_name_parts = st.text(alphabet=_NAME_CHARS, min_size=1, max_size=6)


def _representable(name: str) -> bool:
    # gcc cannot write these unambiguously: trailing odd backslashes, `\:`, a trailing colon.
    trailing = len(name) - len(name.rstrip("\\"))
    return trailing % 2 == 0 and "\\:" not in name and not name.endswith(":") and (
        not name.startswith("\n") and "\\\n" not in name and not name.endswith("\n"))


_newline_sources = st.lists(_name_parts, min_size=2, max_size=3).map("\n".join).filter(
    _representable)
_headers = st.lists(_name_parts.filter(_representable), max_size=4)


def _newline_round_trip(case: tuple[str, list[str], int]) -> None:
    source, headers, fold = case
    target = source.rsplit(".", 1)[0] + ".o"
    names = [source, *headers]
    line = gcc_escape(target) + ":"
    for index, name in enumerate(names):
        if fold and index % fold == 0:
            line += " \\\n "
        line += " " + gcc_escape(name)
    rules = parse_depfile(line + "\n", ["/work/src/" + source])
    assert rules == [DepRule((target,), tuple(names))], (line, rules)


DEPFILE_NEWLINE = Fuzzer(
    "depfile: a source named with newlines, gcc's escaping",
    st.tuples(_newline_sources, _headers, st.integers(0, 3)), _newline_round_trip, examples=300,
    regressions=(("ker\nnel.cc", ["inc/ker"], 0), ("a\n\nb.cc", [], 0),
                 ("a\n.cc", ["a"], 1), ("0:\n0", [], 0)))


# The same with the real writer: g++ -M on files with those names, awkward directories included.
_FILE_CHARS = st.sampled_from(list("ab_ #$:\\\t%&;'é字")) | st.characters(
    blacklist_categories=("Cs", "Cc"), blacklist_characters='"/')


def _gcc_can_name(name: str) -> bool:
    trailing = len(name) - len(name.rstrip("\\"))
    return trailing % 2 == 0 and "\\:" not in name and "\\\n" not in name and (
        not name.startswith(("\n", "-")) and not name.endswith("\n") and ".." not in name)


def _real_gcc_depfile(case: tuple[str, str, str]) -> None:
    source_stem, directory, header_stem = case
    with tempfile.TemporaryDirectory(prefix="cacheaudit-fuzz-") as root:
        header = Path(root, directory, header_stem + ".h")
        header.parent.mkdir(parents=True, exist_ok=True)
        header.write_text("#define H 1\n")
        source = Path(root, source_stem + ".cc")
        source.write_text(f'#include "{directory}/{header.name}"\nint k() {{ return H; }}\n')
        done = subprocess.run([GXX or "g++", "-M", source.name], cwd=root, capture_output=True,
                              timeout=60)
        assert done.returncode == 0, done.stderr
        text = done.stdout.decode("utf-8", "surrogateescape")
        read = {os.path.realpath(os.path.join(root, name))
                for name in depfile_inputs(parse_depfile(text, [str(source)]))}
        expected = {os.path.realpath(source), os.path.realpath(header)}
        assert expected <= read and len(read - expected) <= 1, (text, read)


_plain_names = st.text(alphabet=_FILE_CHARS, min_size=1, max_size=6).filter(_gcc_can_name)
REAL_GCC_DEPFILE = Fuzzer(
    "depfile: written by a real g++ -M",
    st.tuples(st.lists(_plain_names, min_size=1, max_size=3).map("\n".join).filter(
        _gcc_can_name), _plain_names, _plain_names),
    _real_gcc_depfile, examples=30,
    regressions=(("ker\nnel", "d i#r$", "h:1"), ("a b\\\\", "x", "\\#y")))


# ------------------------------------------------------------------------------------------
# Argv, response files and options files (cacheaudit/compilers/)
# ------------------------------------------------------------------------------------------

_ARG_CHARS = st.sampled_from(list(" \t\n\r\"'\\@#=-a\x00\x0b\x0c")) | st.characters(
    blacklist_categories=("Cs",))


def _split_any(text: str) -> None:
    for split in (tokenizers.split_gcc_response_file, tokenizers.split_clang_response_file,
                  tokenizers.split_nvcc_options_file, tokenizers.split_nvcc_env):
        try:
            tokens = split(text)
        except TokenizeError:
            continue
        assert isinstance(tokens, list) and all(isinstance(t, str) for t in tokens)


SPLITTERS = Fuzzer("response and options files, NVCC_*_FLAGS: any text",
                   st.text(alphabet=_ARG_CHARS, max_size=60), _split_any, examples=400)


def _quote_round_trip(tokens: list[str]) -> None:
    no_nul = [t for t in tokens if "\x00" not in t]
    gcc = " ".join(tokenizers.quote_gcc_response_file(t) for t in no_nul)
    assert tokenizers.split_gcc_response_file(gcc) == no_nul
    nvcc = "\n".join(tokenizers.quote_nvcc_options_file(t) for t in tokens)
    assert tokenizers.split_nvcc_options_file(nvcc) == tokens, nvcc


QUOTING = Fuzzer("argv quoting: gcc @file and nvcc -optf round trip",
                 st.lists(st.text(alphabet=_ARG_CHARS, max_size=12), max_size=6),
                 _quote_round_trip, examples=300)

_OPTIONS = st.sampled_from(["-o", "-c", "-x", "cu", "none", "-I", "-isystem", "-M", "-MF", "-E",
                            "--output-file", "--x", "-ccbin", "--cubin", "-odir", "--version",
                            "k.cu", "k.cc", "", "-", "=", "--include-path=", "-Xcompiler",
                            "-Wp,-MD,x.d", "@file", "-optf", "--options-file", "-dryrun"])


def _command(case: tuple[str, list[str]]) -> None:
    kind, tokens = case
    command = parse_command(kind, tokens)
    assert set(command.sources) <= set(tokens) | {""}
    output_paths(kind, command, "/work")
    command.dependency_argv("/tmp/d.d")


COMMANDS = Fuzzer("compile commands: any argv",
                  st.tuples(st.sampled_from(["gcc", "clang", "nvcc", "hipcc"]),
                            st.lists(_OPTIONS | st.text(alphabet=_ARG_CHARS, max_size=8),
                                     max_size=10)),
                  _command, examples=300)


# ------------------------------------------------------------------------------------------
# Cache metadata: DeepJIT meta.json, DeepGEMM's kernel.cu head, Triton's metadata
# ------------------------------------------------------------------------------------------

_ENV = {"PATH": os.environ.get("PATH", "/usr/bin"), "HOME": "/nonexistent"}
_D1 = "0123456789abcdef0123456789abcdef"
_DEEPJIT_META = {
    "command": "/usr/local/cuda/bin/nvcc /tmp/BUILD/kernel.cu --cubin --output-file "
               "/tmp/BUILD/kernel.cubin -O3 --include-path /pkg/deep_gemm/include",
    "config": {"python_library_root": "/pkg/deep_gemm", "extra_signature": "cutlass-4.2",
               "include_dirs": ["/pkg/deep_gemm/include"], "include_prefixes": ["deep_gemm/"]},
    "compiler_info": {"path": "/usr/local/cuda/bin/nvcc",
                      "version": "Cuda compilation tools, release 12.9, V12.9.86\n"},
    "compiler_options": {"arch": "sm_90a", "cpp_standard": 20},
}


@dataclass
class ScanOutcome:
    entries: list[Any]
    findings: list[Any]


def _scan_root(root: str) -> ScanOutcome:
    from cacheaudit.audit.options import AuditOptions
    from cacheaudit.audit.scan import scan

    result = scan([root], dict(_ENV), options=AuditOptions(reconstruct=False))
    return ScanOutcome(list(result.entries), list(result.findings))


@contextlib.contextmanager
def _temporary_root() -> Iterator[str]:
    with tempfile.TemporaryDirectory(prefix="cacheaudit-fuzz-") as root:
        yield root


def _deepjit_meta(data: bytes) -> None:
    with _temporary_root() as root:
        entry = Path(root, "cache", f"gemm_fp8.{_D1}")
        entry.mkdir(parents=True)
        Path(root, "tmp").mkdir()
        (entry / "kernel.cu").write_bytes(b'extern "C" __global__ void k() {}\n')
        (entry / "kernel.cubin").write_bytes(b"\x7fELF" + bytes(60))
        (entry / "meta.json").write_bytes(data)
        (entry / ".committed").write_bytes(b"")
        outcome = _scan_root(root)
        # The entry is judged whatever its meta.json holds: one entry, never an abort.
        assert [e.path for e in outcome.entries] == [str(entry)], outcome.entries


DEEPJIT_META = Fuzzer("DeepJIT meta.json (scan)", documents(_DEEPJIT_META), _deepjit_meta,
                      examples=150)


def _deepgemm_head(head: bytes) -> None:
    from cacheaudit.runtimes.deepgemm.layout import parse_head

    include_hash, problem, _is_deepep = parse_head(head)
    assert include_hash is None or len(include_hash) == 32
    assert problem is None or isinstance(problem, str)


DEEPGEMM_HEAD = Fuzzer(
    "DeepGEMM kernel.cu include-hash line",
    st.one_of(st.binary(max_size=80),
              st.binary(max_size=60).map(lambda b: b"// Includes' hash value: " + b)),
    _deepgemm_head, examples=300)

_TRITON_DIR = "A" * 52
_TRITON_META = {"hash": "00" * 32, "target": {"backend": "cuda", "arch": 90, "warp_size": 32},
                "name": "add_kernel", "num_warps": 4, "num_stages": 3, "debug": False,
                "triton_version": "3.9.0", "shared": 0}


def _triton_group(directory: str) -> dict[str, Any]:
    return {"child_paths": {f"add_kernel.{ext}": f"{directory}/add_kernel.{ext}"
                            for ext in ("json", "cubin", "source", "ttir", "ptx")}}


def _triton_metadata(case: tuple[bytes, bytes | None]) -> None:
    meta, group = case
    with _temporary_root() as root:
        directory = Path(root, _TRITON_DIR)
        directory.mkdir()
        (directory / "add_kernel.cubin").write_bytes(b"\x7fELF" + bytes(60))
        (directory / "add_kernel.source").write_text("def add_kernel(): pass\n")
        (directory / "add_kernel.json").write_bytes(meta)
        group_text = group if group is not None else json.dumps(
            _triton_group(str(directory))).encode()
        (directory / "__grp__add_kernel.json").write_bytes(group_text)
        outcome = _scan_root(root)
        assert [e.path for e in outcome.entries] == [str(directory)], outcome.entries


TRITON_METADATA = Fuzzer(
    "Triton metadata and group files (scan)",
    st.tuples(documents(_TRITON_META),
              st.none() | documents(_triton_group("/c/" + _TRITON_DIR))),
    _triton_metadata, examples=150,
    regressions=((json.dumps(_TRITON_META).encode(),
                  json.dumps({"child_paths": {"add_kernel.json": "/a\u0000b"}}).encode()),))


# ------------------------------------------------------------------------------------------
# ninja: build.ninja, `ninja -t deps`, .ninja_deps (runtimes/torch_ext/, graph.py)
# ------------------------------------------------------------------------------------------

_BUILD_NINJA = (
    "ninja_required_version = 1.3\ncxx = c++\nnvcc = /usr/local/cuda/bin/nvcc\n\n"
    "cflags = -DTORCH_EXTENSION_NAME=ext -isystem /torch/include -fPIC -std=c++17\n"
    "post_cflags =\nldflags = -shared -L/torch/lib -lc10\n\n"
    "rule compile\n  command = $cxx -MMD -MF $out.d $cflags -c $in -o $out $post_cflags\n"
    "  depfile = $out.d\n  deps = gcc\n\n"
    "rule link\n  command = $cxx $in $ldflags -o $out\n\n"
    "build main.o: compile /src/ext/main.cpp\nbuild ext.so: link main.o\n\ndefault ext.so\n")
_NINJA_CHARS = st.sampled_from(list("$: \n=|#abo.")) | st.characters(blacklist_categories=("Cs",))


@st.composite
def _ninja_texts(draw: st.DrawFn) -> str:
    lines = _BUILD_NINJA.split("\n")
    for _ in range(draw(st.integers(1, 3))):
        at = draw(st.integers(0, len(lines) - 1))
        edit = draw(st.sampled_from(["replace", "insert", "delete", "splice"]))
        noise = draw(st.text(alphabet=_NINJA_CHARS, max_size=30))
        if edit == "replace":
            lines[at] = noise
        elif edit == "insert":
            lines.insert(at, noise)
        elif edit == "delete":
            del lines[at]
        else:
            cut = draw(st.integers(0, len(lines[at])))
            lines[at] = lines[at][:cut] + noise + lines[at][cut:]
        if not lines:
            break
    return "\n".join(lines)


def _build_file(text: str) -> None:
    from cacheaudit.runtimes.torch_ext.ninja import NinjaSyntaxError, parse_build_file

    try:
        build = parse_build_file(text, "/b/build.ninja")
    except NinjaSyntaxError:
        return
    for edge in build.compile_edges:
        assert isinstance(edge, tuple)
    assert all(isinstance(path, str) for path in build.sources + build.objects)
    assert build.library is None or isinstance(build.library, str)
    json.dumps(build.meta())


BUILD_NINJA = Fuzzer("torch build.ninja", st.one_of(_ninja_texts(), st.text(_NINJA_CHARS)),
                     _build_file, examples=300)

_DEPS_TEXT = ("main.o: #deps 3, deps mtime 1700000000123456789 (VALID)\n"
              "    /src/ext/main.cpp\n    /torch/include/torch.h\n    /usr/include/stdio.h\n\n"
              "ext.so: #deps 0, deps mtime 1700000000123456789 (STALE)\n\n")


def _deps_text(text: str) -> None:
    try:
        found = parse_ninja_deps(text)
    except DepfileError:
        return
    assert all(isinstance(d.mtime_ns, int) and d.target for d in found)


@st.composite
def _spliced(draw: st.DrawFn, base: str, alphabet: st.SearchStrategy[str]) -> str:
    cut = draw(st.integers(0, len(base)))
    end = draw(st.integers(cut, min(len(base), cut + 20)))
    return base[:cut] + draw(st.text(alphabet, max_size=20)) + base[end:]


NINJA_DEPS_TEXT = Fuzzer("ninja -t deps output", st.one_of(
    _spliced(_DEPS_TEXT, _NINJA_CHARS), st.text(_NINJA_CHARS, max_size=80)), _deps_text,
    examples=300)


def _deps_log_bytes(nodes: list[str], outputs: list[tuple[int, list[int]]]) -> bytes:
    """A version-4 .ninja_deps as ninja writes it (src/deps_log.cc): path records with their
    checksum, then deps records (high bit of the size set)."""
    order = "<" if os.sys.byteorder == "little" else ">"
    out = bytearray(b"# ninjadeps\n" + struct.pack(order + "i", 4))
    for index, name in enumerate(nodes):
        data = name.encode()
        padding = (4 - len(data) % 4) % 4
        out += struct.pack(order + "I", len(data) + padding + 4) + data + b"\0" * padding
        out += struct.pack(order + "I", ~index & 0xFFFFFFFF)
    for node, deps in outputs:
        body = struct.pack(order + "iII", node, 0x1234, 0x1) + b"".join(
            struct.pack(order + "i", d) for d in deps)
        out += struct.pack(order + "I", len(body) | 0x80000000) + body
    return bytes(out)


_VALID_LOG = _deps_log_bytes(["main.o", "/src/main.cpp", "/inc/a.h"], [(0, [1, 2])])


@st.composite
def _log_mutations(draw: st.DrawFn) -> bytes:
    data = bytearray(_VALID_LOG)
    for _ in range(draw(st.integers(1, 4))):
        at = draw(st.integers(0, len(data) - 1))
        data[at] = draw(st.integers(0, 255))
    cut = draw(st.integers(0, len(data)))
    return bytes(data[:cut] if draw(st.booleans()) else data)


def _deps_log(data: bytes) -> None:
    try:
        found = parse_ninja_deps_log(data)
    except NinjaDepsLogError:
        return
    assert all(isinstance(k, str) for k in found)


NINJA_DEPS_LOG = Fuzzer("ninja .ninja_deps", st.one_of(
    _log_mutations(), st.binary(max_size=80).map(lambda b: _VALID_LOG[:16] + b)), _deps_log,
    examples=300, regressions=(_VALID_LOG,))


# ------------------------------------------------------------------------------------------
# NVRTC device time traces (runtimes/nvrtc/trace.py)
# ------------------------------------------------------------------------------------------

_TRACE = {"traceEvents": [
    {"name": "Processing Header File", "ph": "X", "args": {"detail": "/inc/a.h"}},
    {"name": "Processing Header File", "ph": "X", "args": {"detail": "/inc/b.h"}},
    {"name": "Total Frontend", "ph": "X", "args": {}}]}


def _trace(data: bytes) -> None:
    from cacheaudit.runtimes.nvrtc.trace import device_time_trace_headers

    try:
        headers = device_time_trace_headers(data.decode("utf-8", "surrogateescape"))
    except DepfileError:
        return
    assert all(isinstance(h, str) and h for h in headers)


NVRTC_TRACE = Fuzzer("NVRTC device time trace", documents(_TRACE), _trace, examples=300,
                     regressions=(b"[" * 100_000 + b"]" * 100_000,
                                  b'{"traceEvents": [{"name": "Processing Header File", '
                                  b'"args": ["x"]}]}'))


# ------------------------------------------------------------------------------------------
# Ledger values, spool files, snapshots, bounded JSON
# ------------------------------------------------------------------------------------------


def _a_record() -> Any:
    from cacheaudit.ledger import new_record_id
    from cacheaudit.model import (
        ArgToken,
        CompileRecord,
        CompilerIdentity,
        FileState,
        GraphFile,
        IncludeGraph,
    )

    state = FileState(path="/w/k.cu", exists=True, size=10, mtime_ns=1_000, ctime_ns=2_000,
                      inode=42, digest="d" * 32, settled=True)
    header = FileState(path="/inc/a.h", exists=True, size=5, mtime_ns=1_000, ctime_ns=2_000,
                       inode=43, digest="e" * 32, settled=True)
    compiler = CompilerIdentity(invoked="g++", path="/usr/bin/g++", resolved="/usr/bin/g++-12",
                                kind="gcc", version_text="g++ 12\n", digest="b" * 32,
                                wrappers=("/usr/bin/g++",))
    return CompileRecord(
        record_id=new_record_id(), event="compile", started_ns=1_700_000_000_000_000_000,
        runtime="deepjit", kernel="gemm", compiler=compiler, argv=("k.cu", "-c"),
        effective_argv=(ArgToken("k.cu"), ArgToken("-c"), ArgToken("-DX=1", "env:CXXFLAGS")),
        cwd="/w", env={"CXXFLAGS": "-DX=1"}, sources=(state,),
        graph=IncludeGraph((GraphFile(header, "a.h"),), "g++ -M"), outputs=(state,),
        tracked=("/inc/a.h",), exit_code=0, duration_ns=1_000, pid=1, host="box",
        observer="shim:g++", notes=("a note",))


def _ledger_blob(case: tuple[int, bytes]) -> None:
    from cacheaudit.ledger import Ledger, RunInfo

    which, body = case
    with tempfile.TemporaryDirectory(prefix="cacheaudit-fuzz-") as directory:
        path = os.path.join(directory, "ledger.db")
        record = _a_record()
        with Ledger.open(path) as ledger:
            ledger.add_records([record], RunInfo(run_uuid="run-1", label="fuzz"))
        with contextlib.closing(sqlite3.connect(path)) as conn, conn:
            ids = [row[0] for row in conn.execute("SELECT id FROM blobs ORDER BY id")]
            conn.execute("UPDATE blobs SET body = ? WHERE id = ?",
                         (body.decode("utf-8", "surrogateescape").encode("utf-8", "replace")
                          .decode(), ids[which % len(ids)]))
        with Ledger.open(path) as ledger:
            [read] = ledger.records()
            assert read.record_id == record.record_id
            json.dumps(read.to_dict() if hasattr(read, "to_dict") else str(read), default=str)


LEDGER_BLOBS = Fuzzer(
    "ledger values (argv, environment, notes, extra, tracked)",
    st.tuples(st.integers(0, 20), st.one_of(documents(["k.cu", "-c"]),
                                            documents({"CXXFLAGS": "-DX=1"}),
                                            documents([["-DX=1", "env:CXXFLAGS"]]))),
    _ledger_blob, examples=120,
    regressions=((0, b'{"a": 1}'), (1, b"[1, 2]"), (2, b"[[1, 2, 3]]"), (3, b"7")))


def _spool_file(data: bytes) -> None:
    from cacheaudit.ledger import Ledger
    from cacheaudit.ledger.spool import ingest_spool, spool_dir

    with tempfile.TemporaryDirectory(prefix="cacheaudit-fuzz-") as directory:
        path = os.path.join(directory, "ledger.db")
        os.makedirs(spool_dir(path))
        spooled = os.path.join(spool_dir(path), "r.json")
        Path(spooled).write_bytes(data)
        with Ledger.open(path) as ledger:
            added = ingest_spool(ledger)
            records = ledger.records()
            assert added == len(records)
            # Ingested (the file is gone) or set aside (`.bad`), never left to break the next.
            assert not os.path.exists(spooled)
            assert added == 1 or os.path.exists(spooled + ".bad")
            for read in records:
                str(read)


def _spool_base() -> Any:
    from cacheaudit.ledger import RunInfo
    from cacheaudit.ledger.spool import record_to_json

    return record_to_json(_a_record(), RunInfo(run_uuid="run-1", label="fuzz"))


def _spool_edited(edit: Callable[[dict[str, Any]], None]) -> bytes:
    document = _spool_base()
    edit(document)
    return json.dumps(document).encode()


SPOOL = Fuzzer("spool files", documents(_spool_base()), _spool_file, examples=150,
               regressions=(  # values sqlite3 cannot bind: ProgrammingError, once every report
                   _spool_edited(lambda d: d["run"].update(host=[])),
                   _spool_edited(lambda d: d["record"].update(event=[]))))

_SNAPSHOT = {
    "format": 1, "taken": "2026-01-01T00:00:00Z",
    "system": {"python": "3.12.1", "platform": "Linux"},
    "packages": {"torch": "2.13.0", "triton": "3.9.0"},
    "compilers": [{"name": "nvcc", "path": "/usr/bin/nvcc", "resolved": "/usr/bin/nvcc",
                   "version": "13.0", "xxh3": "a" * 32, "status": "ok"}],
    "environment": {"variables": {"CUDA_HOME": "/usr/local/cuda"},
                    "jit_settings": [{"setting": "TRITON_CACHE_DIR", "value": "/c",
                                      "from": "env"}]},
    "caches": [{"root": "/c", "layout": "triton", "entries": 3, "bytes": 10, "last_change": 1}],
}


def _snapshot(data: bytes) -> None:
    from cacheaudit.snapshot import diff, load_snapshot

    with tempfile.TemporaryDirectory(prefix="cacheaudit-fuzz-") as directory:
        path = os.path.join(directory, "snapshot.json")
        Path(path).write_bytes(data)
        try:
            loaded = load_snapshot(path)
        except UsageError as exc:
            assert "\n" not in str(exc), exc
            return
        json.dumps(diff(loaded, _SNAPSHOT), default=str)
        json.dumps(diff(_SNAPSHOT, loaded), default=str)


SNAPSHOTS = Fuzzer("snapshots (diff)", documents(_SNAPSHOT), _snapshot, examples=300,
                   regressions=tuple(json.dumps({**_SNAPSHOT, **part}).encode() for part in (
                       {"packages": None}, {"environment": None}, {"compilers": None},
                       {"caches": None}, {"packages": {"torch": {}}},
                       {"environment": {"jit_settings": None}})))


def _bounded(data: bytes) -> None:
    try:
        value = bounded.loads(data, max_bytes=4096, max_depth=16)
    except bounded.Refused as exc:
        assert exc.reason and "\n" not in exc.reason
        return
    assert json.loads(data) == value or value != value  # NaN is the one value unequal to itself


BOUNDED = Fuzzer("bounded JSON reader", documents(_DEEPJIT_META), _bounded, examples=400)


# ------------------------------------------------------------------------------------------
# The cases
# ------------------------------------------------------------------------------------------

FUZZERS = [DEPFILE_TEXT, DEPFILE_NEWLINE, REAL_GCC_DEPFILE, SPLITTERS, QUOTING, COMMANDS,
           DEEPJIT_META, DEEPGEMM_HEAD, TRITON_METADATA, BUILD_NINJA, NINJA_DEPS_TEXT,
           NINJA_DEPS_LOG, NVRTC_TRACE, LEDGER_BLOBS, SPOOL, SNAPSHOTS, BOUNDED]


def _needs(fuzzer: Fuzzer) -> Any:
    return pytest.param(fuzzer, id=fuzzer.parser,
                        marks=[needs_gxx] if fuzzer is REAL_GCC_DEPFILE else [])


@pytest.mark.parametrize("fuzzer", [_needs(f) for f in FUZZERS])
def test_parser_returns_or_raises_its_own_error(fuzzer: Fuzzer) -> None:
    fuzzer.run()


@pytest.mark.slow
@pytest.mark.parametrize("fuzzer", [_needs(f) for f in FUZZERS])
def test_parser_returns_or_raises_its_own_error_long(fuzzer: Fuzzer) -> None:
    fuzzer.run(scale=SCALE_LONG, case_suffix=" (long)")
