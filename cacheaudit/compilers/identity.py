"""Compiler identity: who really compiles, with which binary, version and host compiler.

A path is not an identity: `identify` follows the PATH lookup and the wrappers (`wrappers`) to the
binary that runs, hashes it, keeps its full `--version` text (run with the caller's environment, so
that wrappers are honoured) and, for nvcc, identifies the host compiler chosen by `-ccbin`,
`NVCC_CCBIN` or PATH. `--version` results are memoised across processes (`IdentityMemo`; the shim
keeps one in a file, `memo.FileMemo`) under a key of the files' stat along the whole chain.

Nothing here runs a subprocess at import time; only `identify` runs one (`--version`).
"""

from __future__ import annotations

import dataclasses
import functools
import os
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Protocol

from cacheaudit import children
from cacheaudit.compilers.command import parse_command
from cacheaudit.compilers.effective import effective_argv
from cacheaudit.compilers.kinds import compiler_kind
from cacheaudit.compilers.wrappers import resolve
from cacheaudit.digest import hash_file, is_settled
from cacheaudit.model import CompileRecord, CompilerIdentity, json_digest
from cacheaudit.programs import find_program, is_executable_file

__all__ = [
    "DictMemo",
    "IdentityMemo",
    "host_compiler_path",
    "identify",
    "identify_recorded",
    "identity_cache_key",
    "recorded_distrust",
]

class IdentityMemo(Protocol):
    """Where `identify` keeps `--version` results across processes (a ledger table, say).

    `identify` asks `get(key)` before running `--version` and calls `put(key, identity)` after a
    successful run, where `key` is `identity_cache_key(...)`: equal keys mean the same files with
    the same size, mtime, ctime and inode along the whole chain, so the stored version text and
    digest still hold. The stored identity's host is not used (host compilers are identified,
    and memoised, on their own).
    """

    def get(self, key: str) -> CompilerIdentity | None: ...

    def put(self, key: str, identity: CompilerIdentity) -> None: ...


class DictMemo:
    """An in-process `IdentityMemo`: enough for a long-lived adapter or a test."""

    def __init__(self) -> None:
        self.entries: dict[str, CompilerIdentity] = {}
        self.hits = 0

    def get(self, key: str) -> CompilerIdentity | None:
        found = self.entries.get(key)
        if found is not None:
            self.hits += 1
        return found

    def put(self, key: str, identity: CompilerIdentity) -> None:
        self.entries[key] = identity


_LOCALE_VARIABLES = ("LANGUAGE", "LC_ALL", "LC_MESSAGES", "LANG")


def identity_cache_key(path: str, resolved: str, wrappers: Sequence[str],
                       env: Mapping[str, str]) -> str | None:
    """A key under which a compiler's `--version` text and digest may be reused, or None.

    It covers the path run (drivers print their own name: `g++ (Debian ...)`), every hop and the
    resolved binary with (device, inode, size, mtime_ns, ctime_ns), and the locale variables (gcc
    translates `--version`). None when a file cannot be stat'ed or the binary changed within the
    timestamp-granularity window (`digest.is_settled`), when a stat match proves nothing.
    """
    parts: list[object] = ["cacheaudit-compiler-identity-v2", path, resolved]
    now = time.time_ns()
    for hop in (*wrappers, resolved):
        try:
            st = os.stat(hop)
        except OSError:
            return None
        if not is_settled(st, now):
            return None
        parts.append((hop, st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns))
    parts.append(tuple((name, env.get(name)) for name in _LOCALE_VARIABLES))
    return json_digest(parts)


def _run_version(path: str, env: Mapping[str, str], timeout: float,
                 cwd: str | None) -> tuple[str, str | None]:
    """(stdout then stderr, error). A child of cacheaudit's own (`cacheaudit.children`): its
    whole process group is killed at the deadline, with its parent, or by `children.kill_all`
    (the shim's SIGTERM)."""
    try:
        done = children.run([path, "--version"], timeout=timeout, env=env, cwd=cwd)
    except (OSError, InterruptedError) as exc:
        return "", f"cannot run {path} --version: {exc.strerror or exc}"
    text = (done.stdout + done.stderr).decode("utf-8", "surrogateescape")
    if done.timed_out:
        return text, f"{path} --version did not finish within {timeout:g} s"
    if done.returncode < 0:
        return text, f"{path} --version was killed by signal {-done.returncode}"
    if done.returncode != 0:
        return text, f"{path} --version exited with status {done.returncode}"
    return text, None


def host_compiler_path(argv_tokens: Sequence[str], env: Mapping[str, str], cwd: str,
                       skip: Callable[[str], bool] | None = None) -> tuple[str, str | None]:
    """(name as nvcc would run it, absolute path or None) of nvcc's host compiler.

    Measured with nvcc 13.0 (`-dryrun`): the last `-ccbin`/`--compiler-bindir` of the effective
    argv wins, else `NVCC_CCBIN`. A directory X (relative to the working directory) means
    `X/gcc` (not `X/g++`: nvcc fails with "X/gcc: No such file" when only g++ is there; it runs
    `X/g++` only to link); a value with a slash is a path relative to the working directory;
    a bare name is looked up on PATH. Without either, nvcc runs `gcc` from PATH for every
    preprocess and compile step (and `g++` only for the final link).
    """
    command = parse_command("nvcc", argv_tokens)
    ccbin = command.value_of("--compiler-bindir") or env.get("NVCC_CCBIN") or None
    search_path = env.get("PATH")
    if ccbin is None:
        return "gcc", find_program("gcc", search_path, skip)
    candidate = os.path.join(cwd, ccbin)
    if os.path.isdir(candidate):
        name = os.path.join(ccbin, "gcc")
        full = os.path.abspath(os.path.join(cwd, name))
        return name, full if is_executable_file(full) else None
    if "/" in ccbin:
        full = os.path.abspath(candidate)
        return ccbin, full if is_executable_file(full) else None
    return ccbin, find_program(ccbin, search_path, skip)


def identify(invoked: str, *, env: Mapping[str, str],
             skip: Callable[[str], bool] | None = None, timeout: float = 10.0,
             argv: Sequence[str] = (), cwd: str | None = None,
             memo: IdentityMemo | None = None, path: str | None = None) -> CompilerIdentity:
    """Who compiles when `invoked` runs with `env` (and, for nvcc, `argv`): never raises.

    `path` is the PATH lookup (with `skip`), `resolved` the binary after symlinks and forwarding
    scripts, `wrappers` the hops, `version_text` the full `--version` output (stdout then stderr)
    of `path` run with `env` (so wrappers are honoured), `digest`/`size`/`mtime_ns` those of
    `resolved`. For nvcc, `host` is the host compiler's identity (see `host_compiler_path`);
    `argv` may be the argv as given or the effective argv. Failures leave `error` set on the
    identity concerned and keep whatever was collected; a host failure stays on `host`.
    `path`, when given, is the program already chosen for `invoked` (the shim's
    `CACHEAUDIT_REAL_<NAME>` override, say): it is used instead of a PATH lookup.
    """
    try:
        cwd = cwd or os.getcwd()
        found = os.path.abspath(os.path.join(cwd, path)) if path else None
        return _identify(invoked, env=env, skip=skip, timeout=timeout, argv=argv, cwd=cwd,
                         memo=memo, found=found)
    except Exception as exc:  # noqa: BLE001 - identity is evidence; it must never break a compile
        return CompilerIdentity(invoked=invoked, path="", resolved="",
                                kind=compiler_kind(invoked), version_text="", digest=None,
                                error=f"internal error: {type(exc).__name__}: {exc}")


def _identify(invoked: str, *, env: Mapping[str, str], skip: Callable[[str], bool] | None,
              timeout: float, argv: Sequence[str], cwd: str, memo: IdentityMemo | None,
              found: str | None = None) -> CompilerIdentity:
    kind = compiler_kind(invoked)
    search_path = env.get("PATH")
    if found is not None:
        where = f"at {found}"
        found = found if is_executable_file(found) else None
    elif "/" in invoked:
        where = "as a path"
        candidate = os.path.abspath(os.path.join(cwd, invoked))
        found = candidate if is_executable_file(candidate) else None
    else:
        where = "on PATH"
        found = find_program(invoked, search_path, skip)
    if found is None:
        return CompilerIdentity(invoked=invoked, path="", resolved="", kind=kind,
                                version_text="", digest=None,
                                error=f"compiler {invoked!r} not found {where}")
    path = os.path.abspath(found)
    resolution = resolve(path, search_path, skip)
    if kind == "unknown":
        for name in (resolution.resolved, *reversed(resolution.chain)):
            if compiler_kind(name) != "unknown":
                kind = compiler_kind(name)
                break
    host = None
    if kind == "nvcc":
        host = _host_identity(argv, env, cwd, skip, timeout, memo)
    base = CompilerIdentity(invoked=invoked, path=path, resolved=resolution.resolved,
                            kind=kind, version_text="", digest=None, wrappers=resolution.chain,
                            host=host)
    if resolution.problem is not None:
        return dataclasses.replace(base, error=resolution.problem)
    key = identity_cache_key(path, resolution.resolved, resolution.chain, env)
    if memo is not None and key is not None:
        known = memo.get(key)
        if known is not None and known.error is None:
            return dataclasses.replace(base, version_text=known.version_text,
                                       digest=known.digest, size=known.size,
                                       mtime_ns=known.mtime_ns)
    errors: list[str] = []
    size, mtime_ns, digest = -1, 0, None
    try:
        st = os.stat(resolution.resolved)
        size, mtime_ns = st.st_size, st.st_mtime_ns
        digest = hash_file(resolution.resolved)
    except OSError as exc:
        errors.append(f"cannot read {resolution.resolved}: {exc.strerror or exc}")
    version_text, version_error = _run_version(path, env, timeout, cwd)
    if version_error:
        errors.append(version_error)
    identity = dataclasses.replace(base, version_text=version_text, digest=digest, size=size,
                                   mtime_ns=mtime_ns, error="; ".join(errors) or None)
    if memo is not None and key is not None and identity.error is None and key == (
            identity_cache_key(path, resolution.resolved, resolution.chain, env)):
        memo.put(key, dataclasses.replace(identity, host=None))
    return identity


def _host_identity(argv: Sequence[str], env: Mapping[str, str], cwd: str,
                   skip: Callable[[str], bool] | None, timeout: float,
                   memo: IdentityMemo | None) -> CompilerIdentity:
    tokens = [t.text for t in effective_argv("nvcc", argv, env, cwd)]
    name, full = host_compiler_path(tokens, env, cwd, skip)
    if full is None:
        return CompilerIdentity(invoked=name, path="", resolved="", kind=compiler_kind(name),
                                version_text="", digest=None,
                                error=f"host compiler {name!r} not found")
    return _identify(name, env=env, skip=skip, timeout=timeout, argv=(), cwd=cwd, memo=memo,
                     found=full)


def identify_recorded(recorded: CompilerIdentity, *, env: Mapping[str, str],
                      distrust: str | None, skip: Callable[[str], bool] | None = None,
                      timeout: float = 10.0) -> CompilerIdentity:
    """The compiler a ledger record names, as it is now; never raises.

    A path from a ledger is data: it is run (`identify`, which runs `--version`) only when
    `distrust` is None (this user's seal vouches for the record's compiler) and the binary it
    resolves to is still the recorded one (the same file and content digest). Otherwise it is
    identified without running anything: the resolution, stat and digest of what is there now,
    the version text taken as recorded when the binary is the same and left empty when not,
    and `error` None (nothing failed; the checks compare digests). Same cost as `identify` for a
    sealed, unchanged compiler: the digest is taken once either way.
    """
    path = recorded.path
    try:
        if not path or not is_executable_file(path):
            return dataclasses.replace(recorded, path=path, resolved="", digest=None,
                                       version_text="", host=None,
                                       error=f"compiler {path or recorded.invoked!r} not found")
        resolution = resolve(path, env.get("PATH"), skip)
        st = os.stat(resolution.resolved)
        digest = hash_file(resolution.resolved)
    except Exception as exc:  # noqa: BLE001 - identity is evidence; it must never break a scan
        return dataclasses.replace(recorded, digest=None, version_text="", host=None,
                                   error=f"cannot read {path}: {type(exc).__name__}: {exc}")
    same = digest == recorded.digest and resolution.resolved == recorded.resolved
    if distrust is None and same and resolution.problem is None:
        return identify(recorded.invoked, env=env, skip=skip, timeout=timeout, path=path)
    return CompilerIdentity(
        invoked=recorded.invoked, path=path, resolved=resolution.resolved, kind=recorded.kind,
        version_text=recorded.version_text if same else "", digest=digest,
        wrappers=resolution.chain, size=st.st_size, mtime_ns=st.st_mtime_ns,
        host=recorded.host if same else None)


@functools.lru_cache(maxsize=64)
def _digest_of(path: str, size: int, mtime_ns: int, ino: int) -> str | None:
    try:
        return hash_file(path)
    except OSError:
        return None


def recorded_distrust(record: CompileRecord, env: Mapping[str, str]) -> str | None:
    """Why the compiler a ledger record names may not be run now, or None: it may when this
    user's seal vouches for the record's compiler (`seal.compiler_trust`) and the binary it
    resolved to is still the recorded one (same content digest; hashed once per file state).
    For a runtime policy that runs a recorded tool (Triton's `ptxas --version`)."""
    recorded = record.compiler
    if recorded is None or not recorded.path:
        return "the record names no compiler"
    from cacheaudit import seal  # not on the shim's path: only the rebuild oracle asks

    why = seal.compiler_trust(record, seal.user_key(env, create=False), env)
    if why is not None:
        return why
    try:
        st = os.stat(recorded.resolved or recorded.path)
    except OSError as exc:
        return f"{recorded.resolved or recorded.path} cannot be read ({exc.strerror or exc})"
    if _digest_of(recorded.resolved or recorded.path, st.st_size, st.st_mtime_ns,
                  st.st_ino) != recorded.digest:
        return f"{recorded.resolved or recorded.path} is no longer the recorded binary"
    return None
