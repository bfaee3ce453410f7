"""ninja's side of a build directory: build.ninja parsed, the deps log read, the dry run asked.

What a runtime that builds through ninja needs (torch.utils.cpp_extension, and FlashInfer's JIT,
which writes a build.ninja of the same shape and runs ninja in the module's directory:
flashinfer 0.7.4 `jit/cpp_ext.py` `generate_ninja_build_for_op`, lines 252-401, adapted from
torch's `_write_ninja_file`), and nothing of one runtime's layout:

- `parse_build_file` / `read_build_file`: the subset of the ninja language such runtimes write
  (variables, rules, builds, default), every edge's command evaluated as ninja would run it
  (`BuildFile`, `NinjaEdge`);
- `read_deps_log`: `.ninja_deps`, the headers the compiler's depfile listed for each object, and
  `tracked_paths`, what ninja's decision covers;
- `ninja_dry_run`: `ninja -n -d explain`, whether ninja would do any work and why (`DryRun`);
- `strip_wrapper`: a command's tokens past a ccache/sccache launcher.

.ninja_deps, version 4 (ninja >= 1.10; src/deps_log.cc), integers in host byte order:
  "# ninjadeps\n", uint32 version, then records, each a uint32 header whose high bit marks a
  deps record and whose low 31 bits give the size of the rest (a multiple of 4):
  node record   path, NUL-padded to 4 bytes, then uint32 checksum = ~id (ids count from 0)
  deps record   int32 output id, uint32 mtime low, uint32 mtime high (ns), int32 input ids...
  A later deps record for the same output replaces an earlier one; a truncated tail is what a
  killed ninja leaves and is ignored, as ninja does.
"""

from __future__ import annotations

import os
import re
import time
from collections.abc import Iterator, Mapping
from typing import TYPE_CHECKING, Any, NamedTuple

from cacheaudit.layout import read_file
from cacheaudit.model import json_digest

if TYPE_CHECKING:
    from cacheaudit.graph import NinjaDeps

__all__ = [
    "BUILD_FILE",
    "COMPILE_RULES",
    "DEPS_LOG",
    "WRAPPERS",
    "BuildFile",
    "DryRun",
    "NinjaEdge",
    "NinjaSyntaxError",
    "build_path",
    "ninja_dry_run",
    "parse_build_file",
    "read_build_file",
    "read_deps_log",
    "shell_escape",
    "strip_wrapper",
    "tracked_paths",
]

BUILD_FILE = "build.ninja"
DEPS_LOG = ".ninja_deps"
COMPILE_RULES = ("compile", "cuda_compile", "sycl_compile")
"""The rules that compile a translation unit, as torch names them (FlashInfer names its two the
same: cpp_ext.py:311-319); an edge with `deps` is one
whatever its rule is called."""
WRAPPERS = ("ccache", "sccache")
"""Launchers put before the compiler (torch's `_wrap_compiler`, when they are on PATH)."""


# ------------------------------------------------------------------------------ build.ninja


class NinjaEdge(NamedTuple):
    """One `build` statement, with its command evaluated as ninja would run it.

    NamedTuples rather than dataclasses here: the adapter imports this module in every process
    that loads an extension, and a frozen dataclass costs ~2 ms to define."""

    rule: str
    outputs: tuple[str, ...]
    inputs: tuple[str, ...]
    command: str
    deps: str = ""
    depfile: str = ""


class BuildFile(NamedTuple):
    """A build.ninja (as torch and FlashInfer write it): its variables, rules, edges and default
    target."""

    path: str
    digest: str
    variables: Mapping[str, str]
    rules: Mapping[str, Mapping[str, str]]
    edges: tuple[NinjaEdge, ...]
    defaults: tuple[str, ...]
    problems: tuple[str, ...] = ()

    @property
    def directory(self) -> str:
        return os.path.dirname(self.path)

    @property
    def compile_edges(self) -> tuple[NinjaEdge, ...]:
        return tuple(e for e in self.edges if e.rule in COMPILE_RULES or e.deps)

    @property
    def library(self) -> str | None:
        """The library (or executable) the build produces: the default target, else the last
        link edge's output."""
        if self.defaults:
            return self.defaults[0]
        links = [e for e in self.edges if e.rule == "link" and e.outputs]
        return links[-1].outputs[0] if links else None

    @property
    def sources(self) -> tuple[str, ...]:
        """The compile edges' inputs, absolute (torch and FlashInfer write them so already)."""
        return tuple(build_path(i, self.directory) for e in self.compile_edges for i in e.inputs)

    @property
    def objects(self) -> tuple[str, ...]:
        return tuple(o for e in self.compile_edges for o in e.outputs)

    def commands_key(self, label: str) -> str:
        """What ninja compares between builds besides mtimes: every edge's command line, in
        order, under a runtime's `label`. Stable across processes, and unchanged by a rewrite
        that keeps the commands."""
        return json_digest([label, *(e.command for e in self.edges)])

    def meta(self) -> dict[str, Any]:
        """The parts of the build file an audit shows and a policy needs, JSON-able."""
        return {
            "build_ninja": self.path,
            "build_ninja_digest": self.digest,
            "variables": dict(self.variables),
            "commands": [{"rule": e.rule, "outputs": list(e.outputs), "inputs": list(e.inputs),
                          "command": e.command} for e in self.edges],
            "sources": list(self.sources),
            "objects": list(self.objects),
            "library": self.library,
        }


_VARNAME = re.compile(r"[a-zA-Z0-9_-]+")
_BRACED = re.compile(r"[a-zA-Z0-9_.-]+")
_SHELL_SAFE = frozenset("ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789_+-./")


def shell_escape(text: str) -> str:
    """ninja's GetShellEscapedString: as is when every character is known safe, else quoted."""
    if all(c in _SHELL_SAFE for c in text):
        return text
    return "'" + text.replace("'", "'\\''") + "'"


def _as_is(text: str) -> str:
    return text


class NinjaSyntaxError(ValueError):
    """A build.ninja this parser cannot read; the message names the line."""


def _scan(text: str, lookup: Any, *, path: bool = False) -> list[str]:
    """Evaluate ninja's `$` escapes in `text`. With `path`, unescaped spaces split the result
    into several paths (build lines); otherwise one string is returned in a list."""
    parts: list[str] = []
    words: list[str] = []
    i, n = 0, len(text)
    while i < n:
        c = text[i]
        if c == "$":
            nxt = text[i + 1] if i + 1 < n else ""
            if nxt in ("$", " ", ":"):
                parts.append(nxt)
                i += 2
            elif nxt == "{":
                end = text.find("}", i + 2)
                if end < 0 or not _BRACED.fullmatch(text[i + 2:end]):
                    raise NinjaSyntaxError(f"bad $-escape in {text[:80]!r}")
                parts.append(lookup(text[i + 2:end]))
                i = end + 1
            else:
                match = _VARNAME.match(text, i + 1)
                if not match:
                    raise NinjaSyntaxError(f"bad $-escape in {text[:80]!r}")
                parts.append(lookup(match.group()))
                i = match.end()
        elif path and c == " ":
            if parts:
                words.append("".join(parts))
                parts = []
            i += 1
        else:
            parts.append(c)
            i += 1
    if path:
        if parts:
            words.append("".join(parts))
        return words
    return ["".join(parts)]


def _logical_lines(text: str) -> Iterator[tuple[int, str]]:
    """Lines with `$`-newline continuations joined (the next line's indent dropped)."""
    pending = ""
    start = 0
    for number, raw in enumerate(text.splitlines(), 1):
        line = raw if not pending else raw.lstrip(" ")
        if not pending:
            start = number
        trailing = len(line) - len(line.rstrip("$"))
        if trailing % 2:
            pending += line[:-1]
            continue
        yield start, pending + line
        pending = ""
    if pending:
        yield start, pending


def parse_build_file(text: str, path: str, digest: str = "") -> BuildFile:
    """Parse the subset of the ninja language torch and FlashInfer write (variables, rules, builds,
    default).

    Raises NinjaSyntaxError on anything else that would change the commands (`include`,
    `subninja`); `pool` blocks are skipped.
    """
    variables: dict[str, str] = {}
    rules: dict[str, dict[str, str]] = {}
    raw_edges: list[tuple[str, list[str], list[str], dict[str, str]]] = []
    defaults: list[str] = []
    block: dict[str, str] | None = None

    def file_lookup(name: str) -> str:
        return variables.get(name, "")

    for number, line in _logical_lines(text):
        stripped = line.strip()
        if not stripped or stripped.startswith("#"):
            continue
        if line[0] == " ":
            if block is None:
                raise NinjaSyntaxError(f"line {number}: indented line outside a block")
            name, sep, value = stripped.partition("=")
            if not sep:
                raise NinjaSyntaxError(f"line {number}: expected 'name = value'")
            block[name.strip()] = value.lstrip(" ")
            continue
        keyword, _, rest = stripped.partition(" ")
        if keyword == "rule":
            block = rules.setdefault(rest.strip(), {})
        elif keyword == "build":
            outs_text, sep, ins_text = _split_build(rest)
            if not sep:
                raise NinjaSyntaxError(f"line {number}: build line without ':'")
            outs = _scan(outs_text, file_lookup, path=True)
            ins = _scan(ins_text, file_lookup, path=True)
            if not ins:
                raise NinjaSyntaxError(f"line {number}: build line without a rule")
            outputs = outs[:outs.index("|")] if "|" in outs else outs
            rule, inputs = ins[0], ins[1:]
            for marker in ("|", "||", "|@"):
                if marker in inputs:
                    inputs = inputs[:inputs.index(marker)]
            block = {}
            raw_edges.append((rule, outputs, inputs, block))
        elif keyword == "default":
            defaults.extend(_scan(rest, file_lookup, path=True))
            block = None
        elif keyword == "pool":
            block = {}
        elif keyword in ("include", "subninja"):
            raise NinjaSyntaxError(
                f"line {number}: {keyword} is not written into a module's build.ninja")
        else:
            name, sep, value = stripped.partition("=")
            if not sep:
                raise NinjaSyntaxError(f"line {number}: unexpected {stripped[:60]!r}")
            variables[name.strip()] = _scan(value.lstrip(" "), file_lookup)[0]
            block = None

    edges = []
    problems = []
    for rule_name, outputs, inputs, bindings in raw_edges:
        if rule_name == "phony":
            continue
        rule = rules.get(rule_name)
        if rule is None:
            problems.append(f"build {' '.join(outputs)} uses the undefined rule {rule_name}")
            continue
        # Edge bindings are evaluated in the file scope when parsed; rule bindings lazily, in
        # the edge's scope (ninja's EdgeEnv: $in/$out, edge bindings, rule bindings, file).
        local = {k: _scan(v, file_lookup)[0] for k, v in bindings.items()}

        def edge_lookup(name: str, rule: Mapping[str, str] = rule,
                        local: Mapping[str, str] = local, outputs: list[str] = outputs,
                        inputs: list[str] = inputs, depth: int = 0,
                        shell: bool = False) -> str:
            escape = shell_escape if shell else _as_is
            if name == "in":
                return " ".join(escape(p) for p in inputs)
            if name == "in_newline":
                return "\n".join(escape(p) for p in inputs)
            if name == "out":
                return " ".join(escape(p) for p in outputs)
            if name in local:
                return local[name]
            if name in rule and depth < 8:
                return _scan(rule[name], lambda inner: edge_lookup(
                    inner, depth=depth + 1, shell=shell))[0]
            return variables.get(name, "")

        # The command sees $in/$out shell-escaped; depfile and deps see them as they are
        # (ninja's EdgeEnv kShellEscape vs kDoNotEscape).
        edges.append(NinjaEdge(rule=rule_name, outputs=tuple(outputs), inputs=tuple(inputs),
                               command=edge_lookup("command", shell=True),
                               deps=edge_lookup("deps"), depfile=edge_lookup("depfile")))
    return BuildFile(path=path, digest=digest, variables=variables,
                     rules={k: dict(v) for k, v in rules.items()}, edges=tuple(edges),
                     defaults=tuple(defaults), problems=tuple(problems))


def _split_build(rest: str) -> tuple[str, str, str]:
    """Split a build line at its first unescaped ':' (`$:` is a colon inside a path)."""
    i = 0
    while i < len(rest):
        if rest[i] == "$":
            i += 2
            continue
        if rest[i] == ":":
            return rest[:i], ":", rest[i + 1:]
        i += 1
    return rest, "", ""


def read_build_file(path: str) -> BuildFile:
    """Parse a build.ninja from disk. Raises OSError or NinjaSyntaxError."""
    import xxhash

    data = read_file(path)
    return parse_build_file(data.decode("utf-8", "surrogateescape"), path,
                            xxhash.xxh3_128_hexdigest(data))


# ------------------------------------------------------------------------------ .ninja_deps


def read_deps_log(directory: str) -> dict[str, NinjaDeps]:
    """The deps log of a build directory; {} when there is none yet. Raises NinjaDepsLogError
    or OSError."""
    from cacheaudit.graph import parse_ninja_deps_log

    try:
        data = read_file(os.path.join(directory, DEPS_LOG))
    except FileNotFoundError:
        return {}
    return parse_ninja_deps_log(data)


def build_path(path: str, directory: str) -> str:
    """A path as build.ninja names it, absolute against the build directory and realpath'd."""
    return os.path.realpath(path if os.path.isabs(path) else os.path.join(directory, path))


def tracked_paths(build: BuildFile, deps: Mapping[str, NinjaDeps]) -> frozenset[str]:
    """What ninja's decision covers: every compile edge's sources plus the headers its deps log
    holds for the edge's object (all realpath'd). The command lines are the other half."""
    directory = build.directory
    paths = set(build.sources)
    for edge in build.compile_edges:
        for output in edge.outputs:
            entry = deps.get(output)
            if entry is not None:
                paths.update(build_path(p, directory) for p in entry.inputs)
    return frozenset(paths)


def strip_wrapper(tokens: list[str]) -> tuple[list[str], str | None]:
    """A command's tokens without a leading ccache/sccache, and the wrapper's name."""
    if tokens and os.path.basename(tokens[0]) in WRAPPERS and len(tokens) > 1:
        return tokens[1:], os.path.basename(tokens[0])
    return tokens, None


# ------------------------------------------------------------------------------ ninja's decision


class DryRun(NamedTuple):
    """What `ninja -n -d explain` said about a build directory."""

    work: bool | None
    """True: ninja would run commands; False: "no work to do"; None: the dry run failed."""
    commands: tuple[str, ...] = ()
    explain: tuple[str, ...] = ()
    error: str | None = None
    duration_ns: int = 0


def ninja_dry_run(directory: str, env: Mapping[str, str] | None = None,
                  timeout: float = 60.0) -> DryRun:
    """Ask the `ninja` a runtime would run (`ninja` on PATH, in the build directory) what it
    would do.

    `-n` writes neither .ninja_log nor .ninja_deps; `-d explain` adds, on stderr, why each output
    is dirty (an input newer than it, a changed command, a missing deps record).
    """
    # Here, not at the top: the layouts that read this module are loaded by every observer
    # (the start-up hook, the pytest plugin), which never asks ninja anything.
    import subprocess

    from cacheaudit import children

    started = time.monotonic_ns()
    try:
        done = children.run(["ninja", "-n", "-v", "-d", "explain"], cwd=directory,
                            env=os.environ if env is None else env, timeout=timeout)
    except (OSError, subprocess.SubprocessError) as exc:
        return DryRun(work=None, error=f"ninja -n could not run: {type(exc).__name__}: {exc}",
                      duration_ns=time.monotonic_ns() - started)
    if done.timed_out:
        return DryRun(work=None, error=f"ninja -n did not finish within {timeout:g} s",
                      duration_ns=time.monotonic_ns() - started)
    duration = time.monotonic_ns() - started
    out = done.stdout.decode("utf-8", "surrogateescape")
    err = done.stderr.decode("utf-8", "surrogateescape")
    explain = tuple(line[len("ninja explain: "):] for line in err.splitlines()
                    if line.startswith("ninja explain: "))
    if done.returncode != 0:
        message = " ".join(line for line in (err + out).splitlines()
                           if not line.startswith("ninja explain: "))
        return DryRun(work=None, explain=explain, duration_ns=duration,
                      error=f"ninja -n exited {done.returncode}: {message.strip()[:500]}")
    commands = tuple(line.split("] ", 1)[1] for line in out.splitlines()
                     if line.startswith("[") and "] " in line)
    return DryRun(work=bool(commands), commands=commands, explain=explain, duration_ns=duration)
