# torch.utils.cpp_extension build directories (torch 2.13, `_jit_compile`, `_get_build_directory`,
# `_write_ninja_file`, `FileBaton`), as `load` and `load_inline` leave them.
#
#   <root>/                      TORCH_EXTENSIONS_DIR when set (even to a relative path); else
#                                <user cache>/torch_extensions/py<XY><abiflags>_<cpu|cuNNN|rocmNNN>/
#                                where <user cache> is $XDG_CACHE_HOME (when set, even empty) or
#                                ~/.cache on Linux, ~/Library/Caches on macOS; realpath'd.
#                                `build_directory=` replaces <root>/<name> with any directory.
#     <name>/                    one entry: the build directory of extension <name>
#       build.ninja              rewritten by every build (only when its text changes):
#                                  cxx = <CXX or c++, ccache/sccache prepended when on PATH>
#                                  cflags = -DTORCH_EXTENSION_NAME=<name>[_vN] ... -I<user dirs>
#                                           -isystem <torch include dirs> -isystem <Python.h dir>
#                                           -fPIC -std=c++20 <extra_cflags>
#                                  post_cflags, cuda_cflags, cuda_post_cflags, ldflags = ...
#                                  rule compile: $cxx -MMD -MF $out.d $cflags -c $in -o $out
#                                                $post_cflags, depfile = $out.d, deps = gcc
#                                  rule cuda_compile: $nvcc [-MD -MF $out.d] $cuda_cflags ...
#                                  rule link: $cxx $in $ldflags -o $out
#                                  build <src stem>[.cuda|.sycl].o: <rule> <abs source>
#                                  build <name>[_vN].so: link <objects>
#                                  default <name>[_vN].so
#       .ninja_deps              binary deps log (format below): for each object, the headers
#                                the compiler's -MMD depfile listed, i.e. no header reached
#                                through -isystem (torch's, Python's, the user's) or
#                                C/CPLUS_INCLUDE_PATH; CPATH headers are listed
#       .ninja_log               "# ninja log v7", then per output: start end mtime path hash
#       <stem>.o, <name>.so      the objects and the library; `<name>_v<N>.so` when the same
#                                process rebuilt the extension N times (the versioner renames
#                                the module); a new process starts again at <name>.so, so older
#                                `_vN` libraries are never loaded again
#       main.cpp, cuda.cu,       load_inline's generated sources (written only when changed)
#       sycl.sycl
#       lock                     FileBaton: created O_CREAT|O_EXCL and held open by the building
#                                process, removed on release. A killed build leaves it behind and
#                                every later load() of the extension waits for it forever
#                                (pytorch/pytorch#189245)
#
# .ninja_deps, version 4 (ninja >= 1.10; src/deps_log.cc), integers in host byte order:
#   "# ninjadeps\n", uint32 version, then records, each a uint32 header whose high bit marks a
#   deps record and whose low 31 bits give the size of the rest (a multiple of 4):
#   node record   path, NUL-padded to 4 bytes, then uint32 checksum = ~id (ids count from 0)
#   deps record   int32 output id, uint32 mtime low, uint32 mtime high (ns), int32 input ids...
#   A later deps record for the same output replaces an earlier one; a truncated tail is what a
#   killed ninja leaves and is ignored, as ninja does.
"""Reader for torch.utils.cpp_extension build directories: one CacheEntry per extension.

torch keeps no key on disk: its in-process versioner lives in memory, and across processes ninja
decides from build.ninja's command lines and file mtimes. The entry's key is therefore a digest
of the commands build.ninja holds (what ninja compares with its log), and its meta carries the
parsed build file so that the policy can rerun the compile's dependency pass and ninja's own
decision. The ninja-file and deps-log parsers here are shared with the torch-ext policy and
adapter.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
import time
from collections.abc import Iterator, Mapping
from typing import TYPE_CHECKING, Any, NamedTuple

from cacheaudit.digest import StateCache
from cacheaudit.layout import Layout, read_file, unlistable
from cacheaudit.model import CacheEntry, CacheLeftover, FileState, json_digest

if TYPE_CHECKING:
    from cacheaudit.graph import NinjaDeps

RUNTIME = "torch-ext"
LAYOUT_NAME = "torch_ext"

BUILD_FILE = "build.ninja"
DEPS_LOG = ".ninja_deps"
LOCK = "lock"
INLINE_SOURCES = ("main.cpp", "cuda.cu", "sycl.sycl")
COMPILE_RULES = ("compile", "cuda_compile", "sycl_compile")
WRAPPERS = ("ccache", "sccache")
"""Launchers `_wrap_compiler` puts before the compiler when they are on PATH."""

# `_get_build_directory`: py<major><minor><abiflags>_<accelerator>.
BUILD_FOLDER_RE = re.compile(r"py\d+[a-z]*_(?:cpu|cu\d+|rocm\d+|xpu\w*)")
VERSIONED_RE = re.compile(r"(?P<name>.+)_v(?P<version>\d+)$")


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
    """A build.ninja as torch writes it: its variables, rules, edges and default target."""

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
        """The compile edges' inputs, absolute (torch writes them absolute already)."""
        return tuple(_absolute(i, self.directory) for e in self.compile_edges for i in e.inputs)

    @property
    def objects(self) -> tuple[str, ...]:
        return tuple(o for e in self.compile_edges for o in e.outputs)

    @property
    def key(self) -> str:
        """What ninja compares between builds besides mtimes: every edge's command line, in
        order. Stable across processes, and unchanged by a rewrite that keeps the commands."""
        return json_digest(["torch-ext build commands", *(e.command for e in self.edges)])

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
    """Parse the subset of the ninja language torch writes (variables, rules, builds, default).

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
            raise NinjaSyntaxError(f"line {number}: {keyword} is not written by torch")
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


def _absolute(path: str, directory: str) -> str:
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
                paths.update(_absolute(p, directory) for p in entry.inputs)
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
    """Ask the `ninja` torch would run (`ninja` on PATH, in the build directory) what it would do.

    `-n` writes neither .ninja_log nor .ninja_deps; `-d explain` adds, on stderr, why each output
    is dirty (an input newer than it, a changed command, a missing deps record).
    """
    started = time.monotonic_ns()
    try:
        done = subprocess.run(["ninja", "-n", "-v", "-d", "explain"], cwd=directory,
                              env=dict(os.environ if env is None else env),
                              stdin=subprocess.DEVNULL, capture_output=True, timeout=timeout)
    except (OSError, subprocess.SubprocessError) as exc:
        return DryRun(work=None, error=f"ninja -n could not run: {type(exc).__name__}: {exc}",
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


# ------------------------------------------------------------------------------ the lock


def lock_holders(path: str) -> list[int] | None:
    """Pids of processes that hold `path` open (FileBaton keeps its descriptor for the whole
    build); None when /proc cannot say: not Linux, or no holder among the processes whose
    descriptors can be read while some cannot (another user's build sharing the directory
    would be one of those)."""
    if not os.path.isdir("/proc/self/fd"):
        return None
    target = os.path.realpath(path)
    holders = []
    hidden = False
    try:
        pids = [p for p in os.listdir("/proc") if p.isdigit()]
    except OSError:
        return None
    for pid in pids:
        fd_dir = f"/proc/{pid}/fd"
        try:
            fds = os.listdir(fd_dir)
        except FileNotFoundError:
            continue  # the process exited after /proc was listed
        except OSError:
            hidden = True
            continue
        for fd in fds:
            try:
                if os.readlink(f"{fd_dir}/{fd}") == target:
                    holders.append(int(pid))
                    break
            except OSError:
                continue
    if not holders and hidden:
        return None
    return holders


def lock_problem(path: str, now_ns: int | None = None) -> str | None:
    """Why a `lock` file in a build directory is a problem, or None while a build holds it."""
    try:
        st = os.stat(path)
    except OSError:
        return None
    holders = lock_holders(path)
    age_s = ((now_ns or time.time_ns()) - st.st_mtime_ns) / 1e9
    if holders:
        return None
    if holders is None:
        return (f"a FileBaton lock file {age_s:.0f} s old: if no build is running, every later "
                f"load() of this extension waits for it forever (pytorch/pytorch#189245)")
    return (f"stale FileBaton lock file, {age_s:.0f} s old and held open by no process: a killed "
            f"build left it, and every later load() of this extension waits for it forever "
            f"(pytorch/pytorch#189245); remove it")


# ------------------------------------------------------------------------------ the reader


def default_root(env: Mapping[str, str]) -> str | None:
    """torch's root for this environment: TORCH_EXTENSIONS_DIR, else `get_default_build_root()`
    (the user cache dir + torch_extensions, realpath'd), without the py<XY>_<acc> level, which
    depends on the interpreter and torch build that will run (the reader descends into it)."""
    explicit = env.get("TORCH_EXTENSIONS_DIR")
    if explicit is not None:
        return explicit or None
    if sys.platform == "darwin":
        home = env.get("HOME")
        base = os.path.join(home, "Library", "Caches") if home else None
    elif "XDG_CACHE_HOME" in env:
        base = env["XDG_CACHE_HOME"]
    else:
        home = env.get("HOME")
        base = os.path.join(home, ".cache") if home else None
    if base is None:
        return None
    return os.path.realpath(os.path.join(base, "torch_extensions"))


def _is_build_dir(path: str) -> bool:
    return os.path.isfile(os.path.join(path, BUILD_FILE))


def _subdirs(path: str) -> list[os.DirEntry[str]]:
    """The directories in `path`, sorted by name. Raises OSError as os.scandir does."""
    with os.scandir(path) as it:
        return sorted((e for e in it if e.is_dir()), key=lambda e: e.name)


def _children(path: str) -> list[os.DirEntry[str]]:
    try:
        return _subdirs(path)
    except OSError:
        return []


class TorchExtReader(Layout):
    """The `Reader` for torch extension build directories (see the module header)."""

    layout = LAYOUT_NAME
    runtime = RUNTIME

    def default_roots(self, env: Mapping[str, str]) -> list[str]:
        root = default_root(env)
        return [root] if root else []

    def is_root(self, path: str) -> bool:
        """A build directory itself, a directory of build directories, or torch's default root
        with its py<XY>_<acc> level."""
        if _is_build_dir(path):
            return True
        for child in _children(path):
            if _is_build_dir(child.path):
                return True
            if BUILD_FOLDER_RE.fullmatch(child.name) and any(
                    _is_build_dir(c.path) for c in _children(child.path)):
                return True
        return False

    def read(self, root: str, cache: StateCache) -> Iterator[CacheEntry | CacheLeftover]:
        if _is_build_dir(root):
            yield from read_build_dir(root, root, cache)
            return
        yield from self._level(root, root, cache, descend=True)

    def _level(self, root: str, path: str, cache: StateCache, *, descend: bool
               ) -> Iterator[CacheEntry | CacheLeftover]:
        """The extension directories in `path`; with `descend`, also those one py<XY>_<acc>
        level down. A directory that cannot be listed is said so, not passed over as empty."""
        try:
            children = _subdirs(path)
        except FileNotFoundError:
            return
        except OSError as exc:
            yield unlistable(RUNTIME, LAYOUT_NAME, root, path, exc)
            return
        for child in children:
            if descend and BUILD_FOLDER_RE.fullmatch(child.name) and not _is_build_dir(
                    child.path):
                yield from self._level(root, child.path, cache, descend=False)
            else:
                yield from self._one(root, child.path, cache)

    def _one(self, root: str, path: str, cache: StateCache) -> Iterator[CacheEntry | CacheLeftover]:
        if _is_build_dir(path):
            yield from read_build_dir(root, path, cache)
            return
        try:
            names = set(os.listdir(path))
        except FileNotFoundError:
            return  # removed since its parent was listed
        except OSError as exc:
            yield unlistable(RUNTIME, LAYOUT_NAME, root, path, exc)
            return
        lock = os.path.join(path, LOCK)
        if LOCK in names and (why := lock_problem(lock)) is not None:
            yield CacheLeftover(runtime=RUNTIME, layout=LAYOUT_NAME, root=root, path=lock,
                                reason=why, mtime_ns=_mtime(lock))
        elif not names:
            yield CacheLeftover(
                runtime=RUNTIME, layout=LAYOUT_NAME, root=root, path=path, mtime_ns=_mtime(path),
                reason="empty extension directory: torch created it for a load() that never "
                       "wrote build.ninja (interrupted, or it failed before the build)")


def _mtime(path: str) -> int:
    try:
        return os.stat(path).st_mtime_ns
    except OSError:
        return 0


def read_build_dir(root: str, path: str, cache: StateCache
                   ) -> Iterator[CacheEntry | CacheLeftover]:
    """One build directory: the entry, then its leftovers (older `_vN` libraries)."""
    real = os.path.realpath(path)
    problems: list[str] = []
    try:
        names = set(os.listdir(real))
    except OSError as exc:
        names = set()
        problems.append(f"the build directory cannot be listed ({type(exc).__name__}: "
                        f"{exc.strerror or exc}): its lock, inline sources and older libraries "
                        "cannot be checked")
    meta: dict[str, Any] = {}
    build: BuildFile | None = None
    try:
        build = read_build_file(os.path.join(real, BUILD_FILE))
    except (OSError, NinjaSyntaxError) as exc:
        problems.append(f"{BUILD_FILE} cannot be read: {exc}")
    if build is not None:
        meta = build.meta()
        problems.extend(f"{BUILD_FILE}: {p}" for p in build.problems)
    library = build.library if build is not None else None
    if LOCK in names and (why := lock_problem(os.path.join(real, LOCK))) is not None:
        problems.append(why)

    binary: FileState | None = None
    if library is not None:
        binary = cache.capture(_absolute(library, real))
        if not binary.exists:
            problems.append(f"{BUILD_FILE} names {library}, which is missing: the last build "
                            f"failed or was interrupted (the next load() in a new process "
                            f"builds it again)")
        elif binary.digest is None:
            problems.append(f"{library} cannot be read: {binary.error}")
    elif build is not None:
        problems.append(f"{BUILD_FILE} names no library (no default target, no link edge)")

    source_path = next((os.path.join(real, n) for n in INLINE_SOURCES if n in names), None)
    if source_path is None and build is not None and build.sources:
        source_path = build.sources[0]
    source = cache.capture(source_path) if source_path else None
    if source is not None and not source.exists:
        problems.append(f"the source {source_path} is gone: ninja fails on the next load()")

    from cacheaudit.graph import NinjaDepsLogError

    try:
        deps = read_deps_log(real)
        meta["deps"] = {out: list(e.inputs) for out, e in deps.items()}
    except (OSError, NinjaDepsLogError) as exc:
        meta["deps_error"] = str(exc)

    kernel = os.path.basename(real)
    if library is not None:
        stem = os.path.splitext(os.path.basename(library))[0] or library
        match = VERSIONED_RE.fullmatch(stem)
        kernel = match.group("name") if match else stem
        if match:
            meta["version"] = int(match.group("version"))

    yield CacheEntry(runtime=RUNTIME, layout=LAYOUT_NAME, root=root, path=real, kernel=kernel,
                     key=build.key if build is not None else None, binary=binary, source=source,
                     meta=meta, files=tuple(sorted(names)), problems=tuple(problems))

    current = os.path.basename(library) if library else None
    for name in sorted(names):
        stem, suffix = os.path.splitext(name)
        match = VERSIONED_RE.fullmatch(stem)
        if suffix in (".so", ".pyd", ".dylib") and match and match.group("name") == kernel \
                and name != current:
            leftover = os.path.join(real, name)
            yield CacheLeftover(
                runtime=RUNTIME, layout=LAYOUT_NAME, root=root, path=leftover,
                mtime_ns=_mtime(leftover),
                reason=f"library of in-process rebuild {match.group('version')} of {kernel}: "
                       f"torch's versioner names rebuilds within one process {kernel}_v<N>, and "
                       f"a new process starts again at {kernel}{suffix}, so no load() uses it "
                       f"again")


LAYOUT = TorchExtReader()
