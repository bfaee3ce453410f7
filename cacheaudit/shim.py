"""The compiler shim: stands in for nvcc, g++, gcc, c++, clang++, hipcc and records each compile.

It is installed as a masquerade directory of symlinks (`cacheaudit shim install DIR`) or named
directly in a runtime's compiler setting (`DG_JIT_NVCC_COMPILER=DIR/nvcc`). The links lead to the
directory's launcher (`LAUNCHER`), which runs this module in a Python without `site` (`-S`).

This module is the shim's first step and imports nothing but `os`, `sys`, `cacheaudit.programs`
and `cacheaudit.switches` (`tests/test_shim_fast.py` counts them): it finds the real compiler
and hands over to it, by `exec`, every call that records nothing (a query such as `--version`,
`-dumpversion`, `-print-*`, a preprocess to stdout; a disabled shim; a nested one). A compile is
started at once, before anything else of cacheaudit is imported, and recorded beside it
(`cacheaudit.shimrun`).

Transparency is the first rule: the same bytes on stdout and stderr, the same exit status, the
same death by signal, `--version` byte-identical (DeepJIT hashes it), the same argv[0] when the
name the user gave leads to the same program (gcc prints it as COLLECT_GCC and finds its own
files by it), and a compile that runs and succeeds even when recording fails; that failure is
reported once on stderr.
"""

from __future__ import annotations

import os
import sys

from cacheaudit.programs import compiler_name, find_program
from cacheaudit.switches import DISABLE_VARIABLE, MARKER, flag_set, is_masquerade_dir

# Annotations only: `typing` and `collections` cost a query more than the rest of this module.
TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Mapping, Sequence
    from typing import NoReturn

# What a masquerade directory holds: every name below, each a symlink to the directory's
# launcher, the launcher, and a marker file that tells any shim (and `cacheaudit shim install`)
# that the directory is ours.
MASQUERADE_NAMES = ("nvcc", "gcc", "g++", "cc", "c++", "clang", "clang++", "hipcc")
LAUNCHER = ".cacheaudit-shim-launcher"

# Set in the real compiler's environment: a shim reached from inside a compile (nvcc calling
# a masqueraded g++ by absolute path) hands straight through instead of recording twice.
ACTIVE_VARIABLE = "CACHEAUDIT_SHIM_ACTIVE"

_MAX_DEPTH = 8

# ---------------------------------------------------------------------------------- queries

# Calls that compile nothing, alone or together, for any compiler (DeepJIT hashes `nvcc
# --version`, torch runs `c++ -dumpversion`-style probes).
_QUERY_FLAGS = frozenset({"--version", "-V", "-v", "-dumpversion", "-dumpfullversion",
                          "-dumpmachine", "--help", "-h", "--list-gpu-arch", "--list-gpu-code"})

# Options that make the driver answer and compile nothing, whatever else the command holds
# (`compilers.parse_command` reads them so too).
_GCC_ASKS = frozenset({"--version", "-dumpversion", "-dumpfullversion", "-dumpmachine",
                       "-dumpspecs", "--help", "-###", "--target-help"})
_GCC_ASK_PREFIXES = ("-print-", "--print-", "--help=")
_NVCC_ASKS = frozenset({"--version", "-V", "--help", "-h", "--dryrun", "-dryrun",
                        "--list-gpu-arch", "-arch-ls", "--list-gpu-code", "-code-ls"})
# Preprocessing or a dependency listing, to stdout when nothing names an output.
_GCC_TO_STDOUT = frozenset({"-E", "-M", "-MM"})
_NVCC_TO_STDOUT = frozenset({"-E", "--preprocess", "-M", "--generate-dependencies", "-MM",
                             "--generate-nonsystem-dependencies"})
# Options that steer what is asked or preprocessed and write nothing: exact tokens, prefixes
# of one-token spellings, and options whose value is the next token. Anything else (an output,
# a depfile, `-Wp,`, `-Xclang`, a response file, a spec file) sends the command the long way,
# where the full parser decides.
_GCC_STEERING = frozenset({"-v", "-w", "-P", "-C", "-CC", "-H", "-undef", "-pthread",
                           "-nostdinc", "-nostdinc++", "-dM", "-dD", "-dN", "-dI", "-dU"})
_GCC_STEERING_PREFIXES = ("-m", "-f", "-O", "-std=", "--std=", "--target=", "-W", "-g", "-D",
                          "-U", "-I", "-x", "-isystem", "-iquote", "-idirafter")
_GCC_NOT_STEERING = ("-fdump", "-fplugin", "-Wp,", "-Wa,", "-Wl,", "-mllvm")
_GCC_STEERING_WITH_VALUE = frozenset({"-x", "-I", "-D", "-U", "-isystem", "-iquote",
                                      "-idirafter", "-include", "-imacros", "-target"})
_NVCC_STEERING = frozenset({"-w", "--disable-warnings", "-m64", "--m64"})
_NVCC_STEERING_PREFIXES = ("-D", "-U", "-I", "-std=", "--std=", "-arch=", "--gpu-architecture=",
                           "--x=", "-x=", "--define-macro=", "--undefine-macro=",
                           "--include-path=")
_NVCC_STEERING_WITH_VALUE = frozenset({
    "-x", "--x", "-I", "--include-path", "-D", "--define-macro", "-U", "--undefine-macro",
    "-arch", "--gpu-architecture", "-std", "--std", "-isystem", "--system-include",
    "-include", "--pre-include"})


def driver_family(name: str) -> str:
    """`compilers.compiler_kind` without `re` (a test holds them equal): "nvcc", "gcc",
    "clang", "hipcc" or "unknown", from the basename."""
    base = os.path.basename(name)
    for suffix in (".exe", ".pl", ".bin"):
        if base.endswith(suffix):
            base = base[:-len(suffix)]
            break
    head, dash, version = base.rpartition("-")
    if dash and head and version and all(part.isdigit() and part.isascii()
                                         for part in version.split(".")):
        base = head
    for family, kind in (("clang++", "clang"), ("clang", "clang"), ("nvcc", "nvcc"),
                         ("hipcc", "hipcc"), ("g++", "gcc"), ("gcc", "gcc"), ("c++", "gcc"),
                         ("cc", "gcc")):
        if base == family or base.endswith("-" + family):
            return kind
    return "unknown"


def is_query(argv: Sequence[str], kind: str | None = None,
             env: Mapping[str, str] | None = None) -> bool:
    """Whether a call asks and compiles nothing, so that there is nothing to record.

    Without `kind`: only version and help flags. With it ("gcc", "clang", "nvcc"), also a
    command holding a query (`-dumpmachine`, `-print-file-name=X`, `-###`, nvcc `-dryrun`) with
    options that only steer it, and a preprocess or dependency listing to stdout (`-E`, `-M`
    with inputs, include directories, macros and language options, no output, no depfile, no
    response file). Conservative: what it does not know takes the long way, where
    `compilers.parse_command` decides (it agrees on everything this calls a query).
    """
    if not argv:
        return False
    if all(token in _QUERY_FLAGS for token in argv):
        return True
    if kind == "nvcc":
        if env is not None and (env.get("NVCC_PREPEND_FLAGS") or env.get("NVCC_APPEND_FLAGS")):
            return False
        asks, ask_prefixes, to_stdout = _NVCC_ASKS, (), _NVCC_TO_STDOUT
        steering, prefixes, not_steering = _NVCC_STEERING, _NVCC_STEERING_PREFIXES, ()
        with_value = _NVCC_STEERING_WITH_VALUE
    elif kind in ("gcc", "clang"):
        asks, ask_prefixes, to_stdout = _GCC_ASKS, _GCC_ASK_PREFIXES, _GCC_TO_STDOUT
        steering, prefixes, not_steering = _GCC_STEERING, _GCC_STEERING_PREFIXES, \
            _GCC_NOT_STEERING
        with_value = _GCC_STEERING_WITH_VALUE
    else:
        return False
    asked = listed = inputs = False
    index = 0
    while index < len(argv):
        token = argv[index]
        index += 1
        if token in asks or (ask_prefixes and token.startswith(ask_prefixes)):
            asked = True
        elif token in to_stdout:
            listed = True
        elif token in with_value:
            if index == len(argv):
                return False
            index += 1
        elif token == "-" or not token.startswith(("-", "@")):
            inputs = True
        elif token in steering or (token.startswith(prefixes)
                                    and not token.startswith(not_steering)):
            continue
        else:
            return False
    return (asked and not inputs) or (listed and not asked)


# ------------------------------------------------------------------------ the real compiler


class ShimError(Exception):
    """The shim cannot even start the real compiler; exits like a shell that found no program."""


def _shim_targets() -> set[str]:
    """Real paths that are this shim, so that a lookup can never land on itself."""
    targets = {os.path.realpath(sys.argv[0])}
    main = sys.modules.get("__main__")
    if main is not None and getattr(main, "__file__", None):
        targets.add(os.path.realpath(main.__file__))  # type: ignore[arg-type]
    return targets


def strip_masquerade_dirs(path_value: str) -> str:
    return os.pathsep.join(d for d in path_value.split(os.pathsep) if not is_masquerade_dir(d))


def stand_in_name(value: str, family: str) -> str:
    """The masquerade name for a compiler setting that names something other than a bare
    family name: unique to the value, and ending in a name the shim can tell the kind of."""
    from cacheaudit.plain import xxh64_hexdigest

    base = os.path.basename(value)
    digest = xxh64_hexdigest(value.encode("utf-8", "surrogateescape"))[:10]
    return f"{digest}-{base if driver_family(base) != 'unknown' else family}"


def real_variable(name: str) -> str:
    """The override variable for a name: `g++` gives CACHEAUDIT_REAL_GXX."""
    cleaned = name.upper().replace("+", "X").replace("-", "_").replace(".", "_")
    return f"CACHEAUDIT_REAL_{cleaned}"


def lookup_variable(name: str) -> str:
    """The variable holding a filled-in setting's lookup order (`CompilerSetting.lookup()`,
    joined by os.pathsep): `nvcc` gives CACHEAUDIT_LOOKUP_NVCC."""
    return real_variable(name).replace("CACHEAUDIT_REAL_", "CACHEAUDIT_LOOKUP_", 1)


def resolve_lookup(order: Sequence[str], env: Mapping[str, str]) -> str | None:
    """The compiler a runtime would take by `order` (`CompilerSetting.default`'s rules) in `env`,
    never one of ours; None when no candidate applies."""
    path_value = env.get("PATH", os.defpath)
    for candidate in order:
        if candidate.startswith("$"):
            variable, _, rest = candidate[1:].partition("/")
            home = env.get(variable)
            if home:
                return os.path.join(home, rest) if rest else home
        elif os.sep not in candidate:
            found = find_program(candidate, path_value, is_masquerade_dir)
            if found:
                return found
        elif os.path.exists(candidate):
            return candidate
    return None


def find_real_compiler(name: str, env: Mapping[str, str]) -> str:
    """The compiler this shim stands in for: CACHEAUDIT_REAL_<NAME>; else, for a setting the
    session filled in, the runtime's own lookup order (CACHEAUDIT_LOOKUP_<NAME>) in this
    compile's environment; else `name` on PATH past us."""
    own = _shim_targets()
    explicit = env.get(real_variable(name))
    lookup = None if explicit else env.get(lookup_variable(name))
    candidates: list[str | None] = []
    if explicit:
        candidates.append(find_program(explicit, env.get("PATH", os.defpath), is_masquerade_dir))
    elif lookup:
        candidates.append(resolve_lookup(lookup.split(os.pathsep), env))
    else:
        # A stand-in link whose variable a runtime scrubbed: the compiler's own name is the best
        # guess left.
        name = compiler_name(name)
        candidates.append(find_program(name, env.get("PATH", os.defpath), is_masquerade_dir))
        if name == "nvcc":
            # Runtimes find nvcc through CUDA_HOME as often as through PATH.
            for root in (env.get("CUDA_HOME"), env.get("CUDA_PATH"), "/usr/local/cuda"):
                if root:
                    candidates.append(find_program(os.path.join(root, "bin", "nvcc"), None))
    for candidate in candidates:
        if candidate and os.path.realpath(candidate) not in own:
            return candidate
    where = (real_variable(name) if explicit else lookup_variable(name) if lookup else "PATH")
    raise ShimError(f"cannot find the real {name} (looked in {where}, skipping shim directories)")


def program_name(name: str, real: str, env: Mapping[str, str],
                 child_env: Mapping[str, str]) -> str:
    """The argv[0] the real compiler gets: the name the user gave (the link's name, or what
    CACHEAUDIT_REAL_<NAME> says as written) when it leads, on the compiler's own PATH, to the
    same program as `real`, as a bare run of that name would see it; else `real`.

    gcc prints argv[0] as COLLECT_GCC (`g++ -v`) and finds its own files by it, and torch
    Inductor keys its ISA probes and precompiled headers on that output.
    """
    given = env.get(real_variable(name)) or (
        None if env.get(lookup_variable(name)) else compiler_name(name))
    if not given or given == real:
        return real
    found = find_program(given, child_env.get("PATH", os.defpath))
    try:
        if found is not None and os.path.samefile(found, real):
            return given
    except OSError:
        pass
    return real


class Invocation:
    """The compiler name the shim runs as, and the arguments for it."""

    __slots__ = ("argv", "name")

    def __init__(self, name: str, argv: tuple[str, ...]) -> None:
        self.name = name
        self.argv = argv


def _invocation(argv: Sequence[str]) -> Invocation:
    """`nvcc ARGS` through a masquerade symlink, or `cacheaudit-shim nvcc ARGS` called directly."""
    name = os.path.basename(argv[0]) if argv else "cacheaudit-shim"
    rest = tuple(argv[1:])
    if name.startswith(("cacheaudit-shim", "shim.py", LAUNCHER)):
        if not rest:
            raise ShimError("usage: cacheaudit-shim COMPILER [ARGS...]")
        return Invocation(rest[0], rest[1:])
    return Invocation(name, rest)


def _exec(real: str, argv0: str, argv: Sequence[str], env: Mapping[str, str]) -> NoReturn:
    # Python ignores SIGPIPE and SIGXFSZ at start-up and exec keeps what is ignored; a compiler
    # started by a shell has them at their default (`_signal`: `signal` would import `enum`).
    import _signal

    for sig in (_signal.SIGPIPE, _signal.SIGXFSZ):
        _signal.signal(sig, _signal.SIG_DFL)
    try:
        os.execve(real, [argv0, *argv], env)
    except OSError as exc:
        from cacheaudit.shimrun import cannot_run_status

        sys.stderr.write(f"cacheaudit-shim: cannot run {real}: {exc.strerror}\n")
        sys.exit(cannot_run_status(exc))


def compiler_env(env: Mapping[str, str]) -> dict[str, str]:
    """The environment the real compiler runs in: our directories off PATH, so that it finds the
    real host compiler, and the nesting depth, so that a shim reached anyway hands through."""
    child = dict(env)
    child[ACTIVE_VARIABLE] = str(_depth(env) + 1)
    if "PATH" in child:
        child["PATH"] = strip_masquerade_dirs(child["PATH"])
    return child


def _depth(env: Mapping[str, str]) -> int:
    try:
        return max(0, int(env.get(ACTIVE_VARIABLE, "0")))
    except ValueError:
        return 1


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv if argv is None else argv)
    env = dict(os.environ)
    try:
        invocation = _invocation(argv)
        real = find_real_compiler(invocation.name, env)
        if _depth(env) >= _MAX_DEPTH:
            raise ShimError(f"{invocation.name} leads back into the shim {_MAX_DEPTH} times; "
                            f"is {real_variable(invocation.name)} a wrapper that calls the shim?")
    except ShimError as exc:
        sys.stderr.write(f"cacheaudit-shim: {exc}\n")
        return 127
    child_env = compiler_env(env)
    argv0 = program_name(invocation.name, real, env, child_env)
    if (_depth(env) or flag_set(env, DISABLE_VARIABLE)
            or is_query(invocation.argv, driver_family(compiler_name(invocation.name)), env)):
        _exec(real, argv0, invocation.argv, child_env)
    # Imported only now: a query never pays for it, and a compile starts before the rest.
    from cacheaudit.shimrun import compile_and_record

    return compile_and_record(invocation.name, real, argv0, invocation.argv, env, child_env)


# ------------------------------------------------------------------- the masquerade directory


def shim_executable() -> str:
    """The `cacheaudit-shim` script of this installation: what a masquerade directory's links
    lead to where no launcher can be written beside them, and what names the installation."""
    beside_python = os.path.join(os.path.dirname(sys.executable), "cacheaudit-shim")
    if os.access(beside_python, os.X_OK):
        return beside_python
    import shutil

    found = shutil.which("cacheaudit-shim")
    if found is None:
        raise ShimError("the cacheaudit-shim script is not installed (reinstall cacheaudit)")
    return os.path.abspath(found)


_SHEBANG_LIMIT = 127
"""Bytes of a `#!` line every Linux kernel reads (5.1 and later read 255)."""


def launcher_text(python: str, root: str) -> str:
    """The launcher a masquerade directory's links lead to: this installation's shim in
    `python` without `site` (-S: 6 ms of a query's 13 on the machine of docs/shim.md), with the
    directory that holds the cacheaudit package, `root`, last on its path (PYTHONPATH still goes
    first). The recording path loads `site` itself (`shimrun`); an installation that moved
    since is found through `site` too."""
    body = ("# cacheaudit's compiler shim, as the masquerade links beside it run it: Python\n"
            "# without `site`, so that a compiler query is handed over before anything else is\n"
            "# imported. Written by `cacheaudit shim install`.\n"
            "import sys\n"
            f"sys.path.append({root!r})\n"
            "try:\n"
            "    from cacheaudit.shim import main\n"
            "except ImportError:\n"
            "    import site\n"
            "    site.main()\n"
            "    from cacheaudit.shim import main\n"
            "sys.exit(main())\n")
    shebang = f"#!{python} -S"
    if len(shebang.encode()) <= _SHEBANG_LIMIT and not any(c.isspace() for c in python):
        return f"{shebang}\n{body}"
    # Too long for the kernel, or a path with a blank: sh finds the interpreter (pip does so).
    import shlex

    return ("#!/bin/sh\n"
            f"'''exec' {shlex.quote(python)} -S \"$0\" \"$@\"\n"
            "' '''\n" + body)


def write_launcher(directory: str) -> str:
    """`directory/LAUNCHER` for this interpreter and installation, rewritten atomically when
    it says anything else; returns its path. Raises OSError."""
    import cacheaudit

    root = os.path.dirname(os.path.dirname(os.path.abspath(cacheaudit.__file__)))
    text = launcher_text(sys.executable, root)
    launcher = os.path.join(directory, LAUNCHER)
    try:
        with open(launcher, encoding="utf-8") as handle:
            if handle.read() == text and os.access(launcher, os.X_OK):
                return launcher
    except (OSError, UnicodeDecodeError):
        pass
    staging = f"{launcher}.{os.getpid()}.tmp"
    with open(staging, "w", encoding="utf-8") as handle:
        handle.write(text)
    os.chmod(staging, 0o755)
    os.replace(staging, launcher)
    return launcher


def install_masquerade(directory: str, names: Sequence[str] | None = None,
                       force: bool = False) -> list[str]:
    """Fill `directory` with compiler names that lead to the shim; returns what was done."""
    from cacheaudit.exceptions import UsageError

    chosen = tuple(names) if names else MASQUERADE_NAMES
    unknown = [n for n in chosen if "/" in n or not n]
    if unknown:
        raise UsageError(f"not a compiler name: {unknown[0]!r}")
    try:
        target = shim_executable()
    except ShimError as exc:
        raise UsageError(str(exc)) from exc
    _make_masquerade_dir(directory)
    done: list[str] = []
    for name in chosen:
        link = os.path.join(directory, name)
        if os.path.lexists(link) and not is_link_to(link, target) and not force:
            raise UsageError(f"{link} exists and is not the shim (use --force to replace it)")
        try:
            link_to_shim(directory, name, target)
        except OSError as exc:
            raise UsageError(f"cannot write {link}: {exc.strerror or exc}") from exc
        done.append(f"{link} -> {os.readlink(link)}")
    mark_masquerade_dir(directory)
    return done


def _make_masquerade_dir(directory: str) -> None:
    """The directory and its parents (sessions lay out theirs under the cache directory); a file
    of that name is not replaced, and what cannot be made is a usage error, in one line."""
    from cacheaudit.exceptions import UsageError

    if os.path.lexists(directory) and not os.path.isdir(directory):
        raise UsageError(f"{directory}: not a directory (give a new name, or a directory to "
                         "fill)")
    try:
        os.makedirs(directory, exist_ok=True)
    except OSError as exc:
        raise UsageError(f"cannot create {directory}: {exc.strerror or exc}") from exc


def is_link_to(link: str, target: str) -> bool:
    """Whether `link` is a link of ours: to the `target` script, or to its directory's
    launcher."""
    if not os.path.islink(link):
        return False
    real = os.path.realpath(link)
    return real in (os.path.realpath(target),
                    os.path.realpath(os.path.join(os.path.dirname(link), LAUNCHER)))


def link_to_shim(directory: str, name: str, target: str) -> str:
    """`directory/name` -> the directory's launcher (written or refreshed here), or to `target`,
    the `cacheaudit-shim` script, where no launcher can be written; replaced atomically: a
    compile running through the old link in another session never sees the name missing."""
    link = os.path.join(directory, name)
    try:
        write_launcher(directory)
        leads_to = LAUNCHER
    except OSError:
        leads_to = target
    try:
        if os.readlink(link) == leads_to:
            return link
    except OSError:
        pass
    staging = os.path.join(directory, f".{name}.{os.getpid()}.tmp")
    try:  # noqa: SIM105 - not `contextlib`: a session's first process makes its links
        os.remove(staging)
    except FileNotFoundError:
        pass
    os.symlink(leads_to, staging)
    os.replace(staging, link)
    return link


READY_SUFFIX = ".ready"
"""Beside a shared masquerade directory (`<directory>.ready`, outside it: writing it must not
change the directory it describes): the state `install_masquerade` left it in."""


def _ready_stamp(directory: str) -> str | None:
    """What a complete masquerade directory of this installation looks like in one line: the
    launcher it needs (this interpreter, this package), the names, the directory's mtime (a
    link added, removed or replaced changes it) and the launcher's size and mtime. None where
    the directory or its launcher cannot be read."""
    import cacheaudit

    try:
        directory_st = os.stat(directory)
        launcher_st = os.lstat(os.path.join(directory, LAUNCHER))
    except OSError:
        return None
    root = os.path.dirname(os.path.dirname(os.path.abspath(cacheaudit.__file__)))
    return repr((launcher_text(sys.executable, root), MASQUERADE_NAMES, directory_st.st_ino,
                 directory_st.st_mtime_ns, launcher_st.st_ino, launcher_st.st_mode,
                 launcher_st.st_size, launcher_st.st_mtime_ns))


def masquerade_ready(directory: str) -> bool:
    """Whether `directory` is as `install_masquerade(directory, force=True)` left it, told by
    one read of its stamp and two stats, not link by link; False when unsure."""
    try:
        with open(directory + READY_SUFFIX, encoding="utf-8") as handle:
            stamp = handle.read(1 << 16)
    except (OSError, UnicodeDecodeError):
        return False
    return stamp == _ready_stamp(directory)


def stamp_masquerade_ready(directory: str) -> None:
    """Write `directory`'s stamp (by rename); nothing when it cannot be written."""
    stamp = _ready_stamp(directory)
    if stamp is None:
        return
    path = directory + READY_SUFFIX
    staging = f"{path}.{os.getpid()}.tmp"
    try:
        with open(staging, "w", encoding="utf-8") as handle:
            handle.write(stamp)
        os.replace(staging, path)
    except OSError:
        import contextlib

        with contextlib.suppress(OSError):
            os.remove(staging)


def mark_masquerade_dir(directory: str) -> None:
    marker = os.path.join(directory, MARKER)
    if os.path.isfile(marker):
        return
    staging = f"{marker}.{os.getpid()}.tmp"
    with open(staging, "w", encoding="utf-8") as handle:
        handle.write("This directory holds cacheaudit compiler shims; PATH lookups of the real\n"
                     "compiler skip it.\n")
    os.replace(staging, marker)


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
