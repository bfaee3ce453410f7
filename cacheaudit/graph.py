"""Include graphs: what a compile actually read, as the compiler itself reports it.

A runtime's cache key is a claim about the inputs of a compile; the compiler's own dependency output
is the evidence to check it against. This module turns that output into `IncludeGraph`s:

- `parse_depfile` reads the Make-syntax depfiles that gcc, clang and nvcc write (`-M`, `-MD`);
- `graph_from_depfile` captures the state of every file listed, keeping the compile's primary
  sources apart so that kernels with different generated sources share one graph of headers;
- `start_dependency_pass` runs the compiler's `-M` pass next to the real compile, so that the shim
  learns the graph without changing the user's command line or output;
- `parse_ninja_deps_log` and `parse_ninja_deps` read what ninja kept of the depfiles (the binary
  `.ninja_deps`, and `ninja -t deps`), for torch-style build directories.

A compiler that writes no depfile reports its reads its own way: the runtime package that knows
the format reads it, and raises `DepfileError` for text it cannot read, as the parsers here do.

Only the standard library (and xxhash, through digest) is imported: the shim runs this on every
compile and `import cacheaudit` must stay cheap.
"""

from __future__ import annotations

import contextlib
import os
import re
import subprocess
import sys
import tempfile
import time
from collections.abc import Collection, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import IO

from cacheaudit import children
from cacheaudit.digest import StateCache, normalise_path, path_stat_key
from cacheaudit.model import FileState, GraphFile, IncludeGraph

__all__ = [
    "STDERR_LIMIT",
    "DepRule",
    "DependencyPass",
    "DependencyResult",
    "DepfileError",
    "NinjaDeps",
    "NinjaDepsLogError",
    "decode_depfile",
    "depfile_inputs",
    "depfile_option",
    "graph_from_depfile",
    "parse_depfile",
    "parse_ninja_deps",
    "parse_ninja_deps_log",
    "start_dependency_pass",
]


class DepfileError(ValueError):
    """Text that is not a Make depfile; the message names the line and shows the offending rule."""


@dataclass(frozen=True)
class DepRule:
    """One Make rule of a depfile: `targets: prerequisites`, with every name unescaped."""

    targets: tuple[str, ...]
    prerequisites: tuple[str, ...]


# --------------------------------------------------------------------------------------------
# Depfile parsing
#
# Escaping rules, as gcc writes them (libcpp/mkdeps.cc, `munge`) and as ninja reads them
# (src/depfile_parser.in.cc, ninja >= 1.10), both read through the code search:
#
#   * backslash-newline (LF or CRLF) continues the logical line; it separates names like a blank.
#   * a space or tab preceded by 2N+1 backslashes is N backslashes plus that space or tab, inside
#     the name (gcc doubles the backslashes that precede a blank, and only those);
#     a blank preceded by 2N backslashes is those 2N backslashes, ending the name (ninja's
#     reading; gcc never doubles a name's trailing backslashes, so 2N is what it wrote).
#   * `\#` is `#`; further backslashes before it are kept as they are (gcc escapes `#` with one
#     backslash and does not double the backslashes before it).
#   * `$$` is `$` (gcc and clang double every `$`).
#   * `\:` is `:` unless whitespace or the end follows it, as ninja does (one mkdeps.cc revision
#     escaped `:` like `#`; gcc 12 does not escape `:` at all, checked on this machine).
#   * every other backslash is a plain character: `Dir\Library\Foo.rc` keeps its backslashes.
#   * a target list ends at a `:` followed by whitespace, a newline or the end, so targets may
#     contain colons (gcc 12 writes `c:dir/x.h:` for -MP) and nvcc's `t.o : t.cu` works.
#     In prerequisites a colon is an ordinary character.
#
# Where we part from ninja and GNU make, because of what nvcc 13 writes (it escapes only spaces:
# `#`, `$` and tabs stay raw, and it leaves blank lines between its -MP rules):
#
#   * an unescaped `#` is an ordinary character, not a comment (make) or a separator (ninja);
#   * a lone `$` (not `$$`) is an ordinary character, not a variable reference or a separator;
#   * only space and tab separate names; every other character (quotes, `&`, `;`, `|`, unicode,
#     a lone `\r`) belongs to the name. A NUL byte means the text is not a depfile.
#
# What no reader can undo, since nvcc 13 loses it when writing: a space in its *target* is not
# escaped (`k ern.o : k\ ern.cu` reads as two targets; harmless, targets are not inputs), a tab
# in a path is written raw (the path splits in two), and backslashes in paths become `/`.
# --------------------------------------------------------------------------------------------

_PLAIN = re.compile(r"[^\\$: \t\r\n\x00]+")
_BLANKS = frozenset(" \t")


def _rule_excerpt(text: str, start: int) -> str:
    end = text.find("\n", start)
    line = text[start:end if end >= 0 else len(text)].strip()
    return line if len(line) <= 80 else line[:77] + "..."


# Where the comparison of what follows a line end with a known name stops: a character that a
# compiler may escape, or a `.` (the default target swaps the source's suffix for `.o`).
_ESCAPABLE = re.compile(r"[ \t#$\\:\r\n.]")


def _continues_a_known_name(word: str, text: str, after: int, newline: str,
                            names: Collection[str]) -> bool:
    """Whether the raw line end that ends `text[:after]` lies inside one of `names`: the part of
    `word` after its last `/`, with the line end, starts a path component of a known name, and
    the text after the line end goes on as that name does (up to its next character a compiler
    may escape, or its next `.`). The target gcc writes for `a<LF>b.cc` is `a<LF>b.o`, so a
    source's components vouch for the target too."""
    if not word:
        return False
    probe = word.rsplit("/", 1)[-1] + newline
    for name in names:
        at = name.find(probe)
        while at >= 0:
            if at == 0 or name[at - 1] == "/":
                rest = name[at + len(probe):]
                plain = rest[:m.start()] if (m := _ESCAPABLE.search(rest)) else rest
                # At the end of the text or of a blank line only a name that goes on with a
                # line end continues: anything else there is the end of a rule.
                if text.startswith(plain, after) and after < len(text) and (
                        text[after] not in "\r\n" or rest.startswith(text[after])):
                    return True
            at = name.find(probe, at + 1)
    return False


def parse_depfile(text: str, names: Collection[str] = ()) -> list[DepRule]:
    """Parse the Make rules of a compiler-written depfile, unescaping every name.

    Strict about structure (every non-empty rule needs targets and a colon), lenient about
    characters, because a depfile that we misread silently would hide an input from the audit.

    `names` are files the compile is known to name (its sources, as the command line or as
    absolute paths spell them). gcc, clang and nvcc write a line end inside a name raw, so a
    raw line end is read as part of a name only where it continues one of these; elsewhere it
    ends the rule, as make reads it.
    """
    names = [name for name in names if "\n" in name]
    rules: list[DepRule] = []
    targets: list[str] = []
    prerequisites: list[str] = []
    word: list[str] = []
    in_targets = True
    saw_colon = False
    rule_start = 0
    rule_line = 1
    line = 1
    n = len(text)
    i = 0

    def end_word() -> None:
        name = "".join(word)
        word.clear()
        if name:
            (targets if in_targets else prerequisites).append(name)

    def end_rule() -> None:
        nonlocal in_targets, saw_colon
        end_word()
        if targets or prerequisites or saw_colon:
            excerpt = _rule_excerpt(text, rule_start)
            if not saw_colon:
                raise DepfileError(f"line {rule_line}: no ':' in rule {excerpt!r}; not a depfile")
            if not targets:
                raise DepfileError(f"line {rule_line}: rule without a target {excerpt!r}")
            rules.append(DepRule(tuple(targets), tuple(prerequisites)))
        targets.clear()
        prerequisites.clear()
        in_targets = True
        saw_colon = False

    def newline_at(j: int) -> int:
        """Length of the newline at `j` (1 for LF, 2 for CRLF), else 0."""
        if j < n:
            if text[j] == "\n":
                return 1
            if text[j] == "\r" and j + 1 < n and text[j + 1] == "\n":
                return 2
        return 0

    while i < n:
        if not (word or targets or prerequisites or saw_colon):
            rule_start, rule_line = i, line
        plain = _PLAIN.match(text, i)
        if plain:
            word.append(plain.group())
            i = plain.end()
            continue
        c = text[i]
        if c in _BLANKS:
            end_word()
            i += 1
        elif c == "\n" or (c == "\r" and newline_at(i)):
            newline = text[i:i + newline_at(i)]
            if names and _continues_a_known_name("".join(word), text, i + len(newline),
                                                 newline, names):
                word.append(newline)
                i += len(newline)
                line += 1
                continue
            end_rule()
            i += newline_at(i)
            line += 1
        elif c == "\r":
            word.append(c)
            i += 1
        elif c == "$":
            word.append("$")
            i += 2 if text.startswith("$", i + 1) else 1
        elif c == ":":
            after = i + 1
            separator = (
                after >= n
                or text[after] in _BLANKS
                or newline_at(after)
                or (text[after] == "\\" and newline_at(after + 1))
            )
            if separator and names and newline_at(after):
                # `a:<LF>b.o` from a source `a:<LF>b.cc`: the colon is inside the name.
                newline = text[after:after + newline_at(after)]
                separator = not _continues_a_known_name(
                    "".join(word) + ":", text, after + len(newline), newline, names)
            if in_targets and separator:
                end_word()
                in_targets = False
                saw_colon = True
            else:
                word.append(":")
            i += 1
        elif c == "\\":
            j = i
            while j < n and text[j] == "\\":
                j += 1
            k = j - i
            nxt = text[j] if j < n else ""
            if nxt in _BLANKS:
                if k % 2:
                    word.append("\\" * (k // 2) + nxt)
                    i = j + 1
                else:
                    word.append("\\" * k)
                    end_word()
                    i = j + 1
            elif newline_at(j):
                if k % 2:
                    # Backslash-newline continues the line; backslashes before it are kept.
                    word.append("\\" * (k - 1))
                    end_word()
                    i = j + newline_at(j)
                    line += 1
                else:
                    word.append("\\" * k)
                    i = j
            elif nxt == "#":
                word.append("\\" * (k - 1) + "#")
                i = j + 1
            elif nxt == ":":
                after = j + 1
                if after >= n or text[after] in _BLANKS or newline_at(after):
                    word.append("\\" * k)
                    i = j
                else:
                    word.append("\\" * (k - 1) + ":")
                    i = j + 1
            else:
                word.append("\\" * k)
                i = j
        else:  # NUL
            raise DepfileError(f"line {line}: NUL character; not a depfile")
    end_rule()
    return rules


def depfile_inputs(rules: Iterable[DepRule]) -> list[str]:
    """Every prerequisite once, as written, in first-seen order.

    Targets are never inputs: the phony rules of `-MP` name files that are already prerequisites
    of the main rule, and the main rule's target is the compile's output.
    """
    seen: dict[str, None] = {}
    for rule in rules:
        for name in rule.prerequisites:
            seen.setdefault(name, None)
    return list(seen)


def decode_depfile(data: bytes) -> str:
    """Depfile bytes as text that maps back to the exact file names (`os.fsencode` inverts it)."""
    return data.decode("utf-8", "surrogateescape")


# --------------------------------------------------------------------------------------------
# From a depfile to an include graph
# --------------------------------------------------------------------------------------------


def graph_from_depfile(
    text: str,
    cwd: str,
    sources: Collection[str],
    cache: StateCache,
    method: str,
) -> tuple[tuple[FileState, ...], IncludeGraph]:
    """Capture every file a depfile lists; return (source states, include graph of the rest).

    Paths are resolved against `cwd` and made symlink-free, so that nvcc's `bin/../targets/...`
    and a header reached through two spellings are one file (the first spelling is kept as
    `written`). Primary sources stay out of the graph: thousands of kernels with different
    generated sources but the same headers then share one stored graph. Source states come in the
    order of `sources`; a source that the depfile does not list is not returned, since this
    reports what the compiler read. A listed file that is gone now is kept as a missing state:
    the compiler did read it.

    Raises DepfileError when `text` is not a depfile.
    """
    source_order = {normalise_path(s, cwd): index for index, s in enumerate(sources)}
    source_states: dict[str, FileState] = {}
    files: list[GraphFile] = []
    seen: set[str] = set()
    for written in depfile_inputs(parse_depfile(text, sources)):
        path = normalise_path(written, cwd)
        if path in seen:
            continue
        seen.add(path)
        state = cache.capture(path)
        if path in source_order:
            source_states[path] = state
        else:
            files.append(GraphFile(state=state, written=written))
    ordered = tuple(source_states[p] for p in sorted(source_states, key=source_order.__getitem__))
    return ordered, IncludeGraph(files=tuple(files), method=method)


# --------------------------------------------------------------------------------------------
# The compiler's own dependency pass, run next to the compile
# --------------------------------------------------------------------------------------------

STDERR_LIMIT = 4096
"""Bytes of a dependency pass's stderr that are kept: enough for the first errors and the end."""

_STDERR_TAIL = 1024


def depfile_option(argv: Sequence[str], cwd: str | None = None) -> str | None:
    """The depfile path an argv asks for (`-MF f`, `-MFf`, `--dependency-output[=]f`), last wins.

    Made absolute against `cwd`, since the pass writes it relative to its own working directory.
    """
    found: str | None = None
    args = list(argv)
    for index, arg in enumerate(args):
        value: str | None = None
        if arg in ("-MF", "--dependency-output"):
            if index + 1 < len(args):
                value = args[index + 1]
        elif arg.startswith("--dependency-output="):
            value = arg.split("=", 1)[1]
        elif arg.startswith("-MF="):
            value = arg[4:]
        elif arg.startswith("-MF") and len(arg) > 3:
            value = arg[3:]
        if value:
            found = value
    if found is not None and cwd and not os.path.isabs(found):
        found = os.path.join(cwd, found)
    return found


@dataclass(frozen=True)
class DependencyResult:
    """How a dependency pass ended. Never an exception: the shim must not break the compile.

    `exit_code` is None when the pass did not exit by itself: it could not be started (`error`
    says why, e.g. the compiler does not exist), it was killed (`signal`), or it ran past the
    timeout (`timed_out`, then killed). `depfile_text` is None unless the pass wrote its depfile
    (or, without `-MF`, printed the rules on stdout) and exited with status 0.
    """

    argv: tuple[str, ...]
    exit_code: int | None
    stderr: str
    depfile_text: str | None
    duration_ns: int = 0
    signal: int | None = None
    timed_out: bool = False
    error: str | None = None

    @property
    def ok(self) -> bool:
        return self.exit_code == 0 and self.depfile_text is not None


def _truncate(data: bytes, limit: int = STDERR_LIMIT, tail: int = _STDERR_TAIL) -> str:
    """Head and tail of a stream: compilers print the first error first and a summary last."""
    if len(data) <= limit:
        return data.decode("utf-8", "replace")
    head = data[: limit - tail].decode("utf-8", "replace")
    rest = data[-tail:].decode("utf-8", "replace")
    return f"{head}\n[... {len(data) - limit} bytes left out ...]\n{rest}"


class DependencyPass:
    """A compiler's `-M` pass running in the background: a child of cacheaudit's own
    (`cacheaudit.children`), in its own process group, within `limits`, killed with its parent.

    Output goes to anonymous temporary files rather than pipes, so a pass that prints a lot never
    blocks while nobody reads it. The process group lets `kill` take nvcc's children (cicc, the
    host preprocessor) down with it. Nothing is created next to the user's files: the depfile path
    is the caller's, and the caller removes it.
    """

    def __init__(self, argv: Sequence[str], cwd: str, env: Mapping[str, str],
                 depfile: str | None, limits: children.Limits = children.PASS_LIMITS) -> None:
        self.argv: tuple[str, ...] = tuple(argv)
        self.cwd = cwd
        self.depfile = depfile
        self.started_ns = time.monotonic_ns()
        self.process: subprocess.Popen[bytes] | None = None
        self._result: DependencyResult | None = None
        self._stdout: IO[bytes] | None = None
        self._stderr: IO[bytes] | None = None
        # A depfile already there must not pass for this run's output.
        self._depfile_before = path_stat_key(depfile) if depfile else None
        try:
            # Closed in _close(), once the pass has ended: they outlive this method.
            self._stdout = tempfile.TemporaryFile()  # noqa: SIM115
            self._stderr = tempfile.TemporaryFile()  # noqa: SIM115
            self.process = children.start(self.argv, cwd=cwd, env=env, stdout=self._stdout,
                                          stderr=self._stderr, limits=limits)
        except (OSError, ValueError, subprocess.SubprocessError) as exc:
            self._close()
            self._result = DependencyResult(
                argv=self.argv, exit_code=None, stderr="", depfile_text=None,
                error=_start_error(exc, self.argv[0] if self.argv else "", cwd))

    @property
    def running(self) -> bool:
        return self.process is not None and self._result is None and self.process.poll() is None

    def wait(self, timeout: float | None = None) -> DependencyResult:
        """The result, waiting at most `timeout` seconds; a pass still running then is killed.

        Calling it again returns the same result.
        """
        if self._result is not None:
            return self._result
        assert self.process is not None
        timed_out = False
        try:
            try:
                returncode = self.process.wait(timeout)
            except subprocess.TimeoutExpired:
                timed_out = True
                self._kill_group()
                returncode = self.process.wait()
        finally:
            # Ended, timed out or interrupted (Ctrl-C in the wait): nothing of it stays behind.
            children.finish(self.process)
        duration_ns = time.monotonic_ns() - self.started_ns
        stderr, stdout = self._read_streams()
        exit_code = returncode if returncode >= 0 else None
        killed_by = -returncode if returncode < 0 else None
        depfile_text: str | None = None
        error: str | None = None
        if timed_out:
            error = f"dependency pass timed out after {timeout:g} s and was killed"
        elif killed_by is not None:
            error = f"dependency pass killed by signal {killed_by}"
        elif exit_code != 0:
            error = f"dependency pass exited with status {exit_code}"
        else:
            depfile_text, error = self._read_depfile(stdout)
        self._result = DependencyResult(
            argv=self.argv, exit_code=exit_code, stderr=stderr, depfile_text=depfile_text,
            duration_ns=duration_ns, signal=killed_by, timed_out=timed_out, error=error)
        return self._result

    def kill(self) -> None:
        """Stop the pass and its children, if still running; safe to call at any time, twice."""
        if self.process is None or self._result is not None:
            return
        if self.process.poll() is None:
            self._kill_group()
        self.wait()

    def _kill_group(self) -> None:
        assert self.process is not None
        # The leader is not reaped yet, so its pid (the group id) cannot have been reused.
        children.kill_group(self.process.pid)

    def _read_streams(self) -> tuple[str, bytes]:
        stderr = b""
        stdout = b""
        try:
            if self._stderr is not None:
                self._stderr.seek(0)
                stderr = self._stderr.read()
            if self._stdout is not None and self.depfile is None:
                self._stdout.seek(0)
                stdout = self._stdout.read()
        except OSError:
            pass
        finally:
            self._close()
        return _truncate(stderr), stdout

    def _read_depfile(self, stdout: bytes) -> tuple[str | None, str | None]:
        if self.depfile is None:
            return decode_depfile(stdout), None
        key = path_stat_key(self.depfile)
        if key is None:
            return None, f"depfile not written: {self.depfile}"
        if key == self._depfile_before:
            return None, f"depfile not rewritten by this pass: {self.depfile}"
        try:
            with open(self.depfile, "rb") as handle:
                return decode_depfile(handle.read()), None
        except OSError as exc:
            return None, f"depfile unreadable: {self.depfile}: {exc.strerror or exc}"

    def _close(self) -> None:
        for stream in (self._stdout, self._stderr):
            if stream is not None:
                with contextlib.suppress(OSError):
                    stream.close()
        self._stdout = self._stderr = None

    def __enter__(self) -> DependencyPass:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.kill()


def _start_error(exc: BaseException, compiler: str, cwd: str) -> str:
    if isinstance(exc, OSError):
        reason = exc.strerror or str(exc)
        if exc.filename is not None and os.fspath(exc.filename) == cwd:
            return f"cannot start dependency pass: working directory {cwd!r}: {reason}"
        return f"cannot start compiler {compiler!r}: {reason}"
    return f"cannot start compiler {compiler!r}: {type(exc).__name__}: {exc}"


def start_dependency_pass(
    compiler: str,
    dependency_argv: Sequence[str],
    cwd: str,
    env: Mapping[str, str],
    *,
    depfile: str | None = None,
    limits: children.Limits = children.PASS_LIMITS,
) -> DependencyPass:
    """Start `[compiler, *dependency_argv]` now and return without waiting.

    `compiler` must be the real compiler, not the shim. The depfile is `depfile` if given, else
    the `-MF` path in the argv; without either, the rules are read from the pass's stdout.
    A compiler that cannot be started does not raise: `wait()` then returns a result with
    `exit_code=None` and `error` saying why, so the compile itself goes on untouched. The pass
    runs within `limits` (address space; CPU time if given), and dies with this process.
    """
    argv = [compiler, *dependency_argv]
    if depfile is None:
        depfile = depfile_option(dependency_argv, cwd)
    elif not os.path.isabs(depfile):
        depfile = os.path.join(cwd, depfile)
    return DependencyPass(argv, cwd, env, depfile, limits)


# --------------------------------------------------------------------------------------------
# ninja's deps log


@dataclass(frozen=True)
class NinjaDeps:
    """One target of `ninja -t deps`: what ninja recorded from the compiler's depfile."""

    target: str
    inputs: tuple[str, ...]
    mtime_ns: int | None
    # ninja's VALID/STALE verdict (deps mtime against the output's); the binary log has none.
    valid: bool | None = None


class NinjaDepsLogError(DepfileError):
    """A .ninja_deps this parser does not understand (another version, a bad checksum)."""


_DEPS_HEADER = b"# ninjadeps\n"


def parse_ninja_deps_log(data: bytes) -> dict[str, NinjaDeps]:
    """Every output's latest deps record, from the bytes of a version-4 `.ninja_deps`: what
    `ninja -t deps` prints, without starting ninja (torch and FlashInfer builds keep one)."""
    if not data.startswith(_DEPS_HEADER) or len(data) < len(_DEPS_HEADER) + 4:
        raise NinjaDepsLogError("not a ninja deps log (bad header)")
    order = sys.byteorder
    pos = len(_DEPS_HEADER)
    version = int.from_bytes(data[pos:pos + 4], order)
    if version != 4:
        raise NinjaDepsLogError(f"ninja deps log version {version}; this reader knows version 4")
    pos += 4
    nodes: list[str] = []
    found: dict[int, tuple[int, tuple[int, ...]]] = {}
    end = len(data)
    while pos + 4 <= end:
        header = int.from_bytes(data[pos:pos + 4], order)
        size = header & 0x7FFFFFFF
        body_start = pos + 4
        if size % 4 or body_start + size > end:
            break  # a torn tail: ninja truncates the log there too
        body = data[body_start:body_start + size]
        pos = body_start + size
        if header & 0x80000000:
            if size < 12:
                break
            words = [int.from_bytes(body[i:i + 4], order) for i in range(0, size, 4)]
            found[words[0]] = (words[1] | (words[2] << 32), tuple(words[3:]))
        else:
            if size <= 4:
                break
            checksum = int.from_bytes(body[-4:], order)
            if checksum != (~len(nodes)) & 0xFFFFFFFF:
                raise NinjaDepsLogError(f"ninja deps log: bad checksum for node {len(nodes)}")
            nodes.append(os.fsdecode(body[:-4].rstrip(b"\0")))
    out: dict[str, NinjaDeps] = {}
    for node, (mtime, ids) in found.items():
        if node >= len(nodes) or any(i >= len(nodes) for i in ids):
            raise NinjaDepsLogError("ninja deps log: a deps record names an unknown node")
        out[nodes[node]] = NinjaDeps(nodes[node], tuple(nodes[i] for i in ids), mtime)
    return out


_NINJA_TARGET = re.compile(
    r"^(?P<target>.+?): #deps (?P<count>\d+), deps mtime (?P<mtime>\d+) \((?P<state>[A-Z]+)\)$")


def parse_ninja_deps(text: str) -> list[NinjaDeps]:
    """`ninja -t deps` output: a `target: #deps N, deps mtime T (VALID|STALE)` line, then the
    N inputs indented by four spaces, then a blank line. ninja (>= 1.10) prints deps mtimes in
    nanoseconds; paths are as the depfile wrote them, relative to the build directory."""
    found: list[NinjaDeps] = []
    current: dict[str, object] | None = None
    inputs: list[str] = []

    def close() -> None:
        if current is not None:
            found.append(NinjaDeps(target=str(current["target"]), inputs=tuple(inputs),
                                   mtime_ns=current["mtime"],  # type: ignore[arg-type]
                                   valid=bool(current["valid"])))

    for line in text.splitlines():
        if line.startswith("    ") and current is not None:
            inputs.append(line[4:])
            continue
        match = _NINJA_TARGET.match(line)
        if match:
            close()
            current = {"target": match.group("target"), "mtime": int(match.group("mtime")),
                       "valid": match.group("state") == "VALID"}
            inputs = []
        elif line.strip():
            raise DepfileError(f"not `ninja -t deps` output: {line[:120]!r}")
    close()
    return found
