"""What the audit may run: the one rule for every program a scan, verify or explain starts.

Nothing read from a cache, from a ledger another user wrote or from a record this user did not
seal chooses what cacheaudit executes (docs/security.md):

- the compiler is the one the user's configuration resolves now (`resolve_compiler`: the
  runtime's compiler setting, `Policy.compiler_variables`; the CUDA toolkit's place for nvcc;
  the name on PATH), of the known kind (nvcc, gcc, clang, hipcc) the command names; what the
  command names as its program is never run;
- the command's options pass `checked_options`: response files expanded (so that what is
  checked is what runs), then the allowlist of `compilers.allowed`, by kind; nvcc's host
  compiler (`-ccbin`) only when it names the host compiler the configuration resolves anyway;
- what the compiler would read first is fit to be read (`refuse_inputs`): the sources and
  forced includes regular files of bounded size, the include directories directories outside
  the device trees, so that no FIFO hangs a compiler and no device feeds it without end;
- a compiler named by a ledger record is run (`--version`) only when the user's configuration
  resolves that same file now (`configured_program`), or the record is sealed by this user
  and the binary is still the one recorded (`identify_recorded_compiler`,
  `compilers.identify_recorded`).

Used by the scan's reconstruction (`scan.py`), the rebuild oracle (`verify.py`) and the
compiler identities a scan takes.
"""

from __future__ import annotations

import os
import re
import stat
from collections.abc import Mapping, Sequence
from typing import NamedTuple

from cacheaudit import bounded, compilers, seal
from cacheaudit.audit.context import AuditContext, CompilerNow
from cacheaudit.model import CacheEntry, CompileRecord, CompilerIdentity
from cacheaudit.runtimes import policy_for
from cacheaudit.shim import ShimError, find_real_compiler, resolve_lookup
from cacheaudit.spec import KIND_DEFAULTS
from cacheaudit.switches import is_masquerade_dir

KNOWN_KINDS = ("nvcc", "gcc", "clang", "hipcc")

STAND_IN = re.compile(r"^[0-9a-f]{10}-")
"""The prefix of a session's stand-in link for a compiler setting (`shim.stand_in_name`)."""


def named_kind(name: str) -> str:
    """The compiler kind a command's program name says (a stand-in's prefix removed)."""
    return compilers.compiler_kind(STAND_IN.sub("", os.path.basename(name)))


def _policy_variables(entry: CacheEntry, env: Mapping[str, str]) -> tuple[str, ...]:
    try:
        return tuple(policy_for(entry.runtime).compiler_variables(entry, env))
    except KeyError:
        return ()


def resolve_compiler(entry: CacheEntry, name: str, env: Mapping[str, str]
                     ) -> tuple[str | None, str]:
    """(path, how) of the compiler the user's configuration gives for an entry built by a
    compiler called `name` (only its kind is taken from it); (None, why) when there is none."""
    name = STAND_IN.sub("", os.path.basename(name))
    kind = compilers.compiler_kind(name)
    if kind == "unknown":
        return None, (f"{name!r} is no compiler of a known kind "
                      f"({', '.join(KNOWN_KINDS)})")
    path_value = env.get("PATH", os.defpath)
    found, how = None, ""
    for variable in _policy_variables(entry, env):
        value = env.get(variable, "")
        if value and named_kind(value) == kind:
            found, how = compilers.find_program(value, path_value), variable
            break
    if found is None and kind == "nvcc":
        found, how = resolve_lookup(KIND_DEFAULTS["nvcc"], env), "the CUDA toolkit's place"
    if found is None:
        found, how = compilers.find_program(name, path_value, is_masquerade_dir), "PATH"
    if found is None or not compilers.is_executable_file(found):
        return None, f"no {name} found through {how or 'PATH'}"
    if is_masquerade_dir(os.path.dirname(found)):
        # The setting names cacheaudit's own shim: the compiler behind it is the one it runs.
        try:
            found = find_real_compiler(STAND_IN.sub("", os.path.basename(found)), env)
        except ShimError as exc:
            return None, str(exc)
        how += ", past cacheaudit's shim"
    return found, how


def configured_program(entry: CacheEntry, recorded: CompilerIdentity,
                       env: Mapping[str, str]) -> bool:
    """Whether the compiler a ledger record names is the one the user's configuration resolves
    now anyway (`resolve_compiler` for its kind; for a tool of no compiler kind, such as
    Triton's ptxas, a `Policy.compiler_variables` setting naming that file): then running it
    is the user's choice, whatever the ledger says."""
    path = recorded.path
    if not path:
        return False
    if named_kind(recorded.invoked or path) != "unknown":
        found, _how = resolve_compiler(entry, recorded.invoked or path, env)
        return found is not None and _same_file(found, path)
    path_value = env.get("PATH", os.defpath)
    for variable in _policy_variables(entry, env):
        value = env.get(variable, "")
        found = compilers.find_program(value, path_value) if value else None
        if found is not None and _same_file(found, path):
            return True
    return False


def same_program(named: str, resolved: str, cwd: str, env: Mapping[str, str]) -> bool:
    """Whether the program a command names (`named`, as written) is `resolved`, the compiler the
    configuration gives: the same file, or cacheaudit's shim standing in for it, or a bare
    name the user's PATH resolves to it."""
    if "/" not in named:
        found = compilers.find_program(named, env.get("PATH", os.defpath), is_masquerade_dir)
        return found is not None and _same_file(found, resolved)
    path = os.path.join(cwd, named)
    if is_masquerade_dir(os.path.dirname(path)):
        try:
            path = find_real_compiler(STAND_IN.sub("", os.path.basename(path)), env)
        except ShimError:
            return False
    return _same_file(path, resolved)


def _same_file(a: str, b: str) -> bool:
    try:
        return os.path.samefile(a, b)
    except OSError:
        return False


# nvcc's host compiler: what the user's configuration names, by the same rules nvcc applies.
_HOST_VARIABLES = ("NVCC_CCBIN", "CUDAHOSTCXX", "CXX", "CC")


def configured_host_compilers(env: Mapping[str, str], cwd: str) -> list[str]:
    """The host compilers the user's configuration names for nvcc: `NVCC_CCBIN`,
    `CUDAHOSTCXX`, `CXX`, `CC` (each resolved as nvcc resolves `-ccbin`), and gcc, g++, cc,
    c++, clang and clang++ on the user's PATH (nvcc's own choice without `-ccbin` is gcc)."""
    found: list[str] = []
    for variable in _HOST_VARIABLES:
        value = env.get(variable)
        if value:
            _name, full = compilers.host_compiler_path(["-ccbin", value], env, cwd,
                                                       is_masquerade_dir)
            if full is not None:
                found.append(full)
    path_value = env.get("PATH", os.defpath)
    for name in ("gcc", "g++", "cc", "c++", "clang", "clang++"):
        full = compilers.find_program(name, path_value, is_masquerade_dir)
        if full is not None:
            found.append(full)
    return found


def host_compiler(value: str, cwd: str, env: Mapping[str, str]) -> tuple[str | None, str]:
    """(the host compiler to pass as `-ccbin`, "") when `value` names one the user's
    configuration resolves anyway (the same file); else (None, why)."""
    _name, full = compilers.host_compiler_path(["-ccbin", value], env, cwd)
    if full is None:
        return None, f"-ccbin {value} names no host compiler that exists"
    if compilers.compiler_kind(os.path.basename(full)) not in ("gcc", "clang"):
        return None, f"-ccbin {value} names {full}, no host compiler of a known kind"
    for candidate in configured_host_compilers(env, cwd):
        if _same_file(candidate, full):
            return candidate, ""
    return None, (f"-ccbin {value} names {full}, which is not a host compiler the user's "
                  f"configuration resolves ({', '.join(_HOST_VARIABLES)} or PATH)")


class Checked(NamedTuple):
    """A command's options as they may run, or the refusal."""

    args: list[str] | None
    """The options to run (argv after the compiler); None when refused."""
    refused: str = ""
    """The option or file refused and why, in words ("-B/x/: it picks a program ...")."""
    dropped: tuple[str, ...] = ()


def checked_options(kind: str, args: Sequence[str], cwd: str, env: Mapping[str, str],
                    purpose: str = "dependency") -> Checked:
    """`args` (argv after the compiler, as a cache or an unsealed record wrote it) as they may
    reach a compiler of `kind` that cacheaudit runs, for a `purpose` of "dependency" (a `-M`
    pass) or "compile": response files and nvcc `-optf` files expanded in place (bounded to
    regular files, as the compilers read them), every option screened (`compilers.allowed`),
    nvcc's `-ccbin` kept only as the host compiler the configuration resolves."""
    expansion = compilers.expand_argv(kind, list(args), {}, cwd)
    screened = compilers.screen_options(kind, [t.text for t in expansion.tokens], purpose)
    if screened.refused is not None:
        option, why = screened.refused
        origin = next((t.origin for t in expansion.tokens if t.text == option.split(" ")[0]
                       and t.origin.startswith("file:")), None)
        where = f" (from {origin[5:]})" if origin else ""
        unread = _unread_file_note(option, expansion.notes)
        return Checked(None, f"{option}{where}: {why}" + (f" ({unread})" if unread else ""))
    out = list(screened.args)
    for value in screened.host_compilers:
        chosen, why = host_compiler(value, cwd, env)
        if chosen is None:
            return Checked(None, f"{why}: it would pick the program nvcc runs")
        out += ["--compiler-bindir", chosen]
    return Checked(out, "", screened.dropped)


def _unread_file_note(option: str, notes: Sequence[str]) -> str:
    """What the expansion said of the response or options file `option` names (why it stayed
    unread: not a regular file, too large), or ""."""
    name = option[1:] if option.startswith("@") else option.split("=", 1)[-1].split(" ")[-1]
    if option.startswith("@") or option.split("=")[0].split(" ")[0] in ("-optf",
                                                                       "--options-file"):
        return next((note for note in notes if name and name in note), "")
    return ""


# ------------------------------------------------------------------ what the compiler reads


SOURCE_LIMIT = bounded.SOURCE_BYTES
"""The largest source or forced include a compiler is run on: a generated kernel is kilobytes."""

# Where no include directory of a real build lies, and where a header read never ends.
_DEVICE_TREES = ("/dev", "/proc", "/sys")

# The order a relative forced include is looked for after the working directory: gcc's
# `#include "..."` chain (the system directories are the user's own, not the command's).
_SEARCH_ORDER = ("-iquote", "-I", "-isystem", "-idirafter")


def refuse_inputs(entry: CacheEntry, command: compilers.ParsedCommand,
                  cwd: str) -> tuple[str, str] | None:
    """(path, why) when what a command makes the compiler read first is not fit to be read,
    else None: each source and each forced include (`-include`, `-imacros`, nvcc's
    `--pre-include`, also through `-Xcompiler` or `-Wp,`) must be a regular file of at most
    `SOURCE_LIMIT` bytes (a FIFO would hang the compiler, `/dev/zero` feed it without end),
    and each include directory that exists must be a directory outside the device trees.
    Asked by the scan's reconstruction and the rebuild oracle before any compiler runs."""
    sources = [os.path.join(cwd, source) for source in command.sources]
    if entry.source is not None and entry.source.path not in sources:
        sources.append(entry.source.path)
    for path in sources:
        refused = _unfit_file(path, os.path.basename(path), "a source")
        if refused is not None:
            return path, refused
    for _option, directory in command.include_dirs:
        path = os.path.join(cwd, directory)
        try:
            st = os.stat(path)
        except FileNotFoundError:
            continue  # compilers skip a missing include directory
        except OSError as exc:
            return path, f"include directory {directory} cannot be reached ({exc.strerror or exc})"
        if not stat.S_ISDIR(st.st_mode):
            return path, (f"include directory {directory} is {bounded.file_kind(st.st_mode)}, "
                          "not a directory")
        real = os.path.realpath(path)
        if any(real == tree or real.startswith(tree + "/") for tree in _DEVICE_TREES):
            return path, f"include directory {directory} lies in {real}, a device tree"
    for option, name in command.forced_includes:
        path = _forced_include_path(name, command, cwd)
        refused = _unfit_file(path, f"{option} {name}", "a forced include")
        if refused is not None:
            return path, refused
    return None


def _unfit_file(path: str, shown: str, what: str) -> str | None:
    """Why the file at `path` (`shown` in the message) is not fit for a compiler to read;
    None when it is, or does not exist (the compiler then says so itself)."""
    try:
        st = os.stat(path)
    except FileNotFoundError:
        return None
    except OSError as exc:
        return f"{shown} cannot be reached ({exc.strerror or exc})"
    if not stat.S_ISREG(st.st_mode):
        return f"{shown} is {bounded.file_kind(st.st_mode)}, not a regular file"
    if st.st_size > SOURCE_LIMIT:
        return f"{shown} is {st.st_size:,} bytes, more than the {SOURCE_LIMIT:,} {what} may have"
    return None


def _forced_include_path(name: str, command: compilers.ParsedCommand, cwd: str) -> str:
    """The file a forced include names, found as the preprocessor finds it: the working
    directory first, then the command's quote and include directories in gcc's order; the
    working directory's path when none holds it."""
    first = os.path.join(cwd, name)
    if os.path.isabs(name):
        return first
    directories = sorted(command.include_dirs, key=lambda d: _SEARCH_ORDER.index(d[0])
                         if d[0] in _SEARCH_ORDER else len(_SEARCH_ORDER))
    for candidate in (first, *(os.path.join(cwd, d, name) for _o, d in directories)):
        if os.path.exists(candidate):
            return candidate
    return first


# ------------------------------------------------------------------ compiler identities


def identify_compiler(context: AuditContext, path: str) -> CompilerNow:
    """The compiler at `path` now, identified once per scan (runs its `--version`): only for a
    compiler the user's configuration resolved (`resolve_compiler`); a path read
    from a ledger goes through `identify_recorded_compiler`."""
    if path not in context.compilers:
        if not os.path.exists(path):
            context.compilers[path] = CompilerNow(None, f"{path} no longer exists")
        else:
            now = compilers.identify(path, env=context.env, skip=is_masquerade_dir, path=path)
            context.compilers[path] = CompilerNow(now, now.error)
    return context.compilers[path]


def identify_recorded_compiler(context: AuditContext, entry: CacheEntry, record: CompileRecord,
                               key: bytes | None) -> CompilerNow:
    """The compiler a ledger record names, now, once per scan: its `--version` is run only when
    the user's configuration resolves that file anyway (`configured_program`), or
    for a record this user's seal (`key`) vouches for and a binary still the recorded one;
    else it is identified by stat and digest alone (`compilers.identify_recorded`)."""
    recorded = record.compiler
    assert recorded is not None
    path = recorded.path
    if path not in context.compilers:
        if not path or not os.path.exists(path):
            context.compilers[path] = CompilerNow(None, f"{path} no longer exists")
        elif configured_program(entry, recorded, context.env):
            now = compilers.identify(path, env=context.env, skip=is_masquerade_dir, path=path)
            context.compilers[path] = CompilerNow(now, now.error)
        else:
            distrust = seal.compiler_trust(record, key)
            now = compilers.identify_recorded(recorded, env=context.env, skip=is_masquerade_dir,
                                              distrust=distrust)
            same = now.digest == recorded.digest and now.resolved == recorded.resolved
            not_run = "" if distrust is None and same else (
                distrust or f"{now.resolved or path} is no longer the recorded binary")
            context.compilers[path] = CompilerNow(now, now.error, not_run)
    return context.compilers[path]
