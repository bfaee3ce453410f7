"""A recording session: the environment that makes every compile below a process go through the
shim and every Python process below it start cacheaudit's adapters.

Shared by `cacheaudit run`, the pytest plugin and the start-up hook. The session never changes
which compiler anything runs: a bare name (`nvcc`, `c++`) reaches the masquerade link of that name
first on PATH, which hands over to the same name further down PATH; a setting that names another
compiler (`CXX=g++-12`, `DG_JIT_NVCC_COMPILER=/opt/cuda-12.8/bin/nvcc`) gets a link of its own
whose `CACHEAUDIT_REAL_<LINK>` names exactly that compiler, so two settings never share one,
unless a runtime keys the setting's text (`CompilerSetting.path_in_key_if`: Inductor's `CXX`
wherever torch is importable), which is left as the user wrote it.
"""

from __future__ import annotations

import os
import sys

from cacheaudit.exceptions import UsageError
from cacheaudit.ids import uuid4_hex
from cacheaudit.shim import (
    MASQUERADE_NAMES,
    install_masquerade,
    link_to_shim,
    lookup_variable,
    masquerade_ready,
    real_variable,
    resolve_lookup,
    stamp_masquerade_ready,
    strip_masquerade_dirs,
)
from cacheaudit.spec import CompilerSetting
from cacheaudit.switches import (
    ACTIVE,
    ADAPTER_IMPORTS,
    LEDGER,
    REDACT_ARGV,
    RUN_LABEL_VARIABLE,
    RUN_VARIABLE,
    SHIMS,
)

# Not `collections.abc` (nor `typing`): the start-up hook prepares a session in the first
# Python process of every session, most of which compile nothing.
TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Mapping
    from typing import Any

_SHELL_SPECIAL = frozenset(" \t\r\n\"'\\")
"""The characters that make `shlex.split` (POSIX mode, no comments) do anything but return a
non-empty value as its one word: whitespace, quotes and the backslash."""

# CXX/CC name a host compiler for torch and friends; a masqueraded name takes its place.
_CXX_SETTINGS = {"CXX": "c++", "CC": "cc"}


def _compiler_settings() -> list[CompilerSetting]:
    """The settings through which runtimes name their compiler (their specs'
    `compiler_settings`), each pointed at the shim; one per variable.

    Those with `session_fills` are set even when the user left them unset, to a link that finds
    the compiler the way the runtime would at each compile (`CompilerSetting.lookup()`: for nvcc
    the CUDA home, then PATH), but never while one of their `unless_set` is set: a runtime
    that falls back to another setting (DeepGEMM 2.8+ to DJ_JIT_NVCC_COMPILER) must keep
    following the user's.
    """
    from cacheaudit import runtimes

    found: dict[str, CompilerSetting] = {}
    for declared in runtimes.specs():
        for setting in declared.compiler_settings:
            if setting.pattern is None:
                found.setdefault(setting.name, setting)
    return list(found.values())


def _pattern_settings(original: Mapping[str, str],
                      named: set[str]) -> list[tuple[str, CompilerSetting]]:
    """(variable, setting) for each variable set in `original` that a pattern setting of a spec
    covers (`CompilerSetting.pattern`) and no setting declares by name, in name order."""
    from cacheaudit import runtimes

    patterns = [setting for declared in runtimes.specs()
                for setting in declared.compiler_settings if setting.pattern is not None]
    found: list[tuple[str, CompilerSetting]] = []
    if not patterns:
        return found
    for variable in sorted(original):
        if variable in named:
            continue
        setting = next((s for s in patterns if s.matches(variable)), None)
        if setting is not None:
            found.append((variable, setting))
    return found


class Session:
    """A prepared session: its run, its ledger, the masquerade directory and the environment
    for everything below it. (A plain class, not a dataclass: `dataclasses` imports `inspect`,
    ~10 ms of the start-up of a process that prepares its own session.)"""

    __slots__ = ("env", "ledger", "owner_pid", "owns_shims", "run_uuid", "shims")

    def __init__(self, run_uuid: str, ledger: str, shims: str, env: dict[str, str] | None = None,
                 owns_shims: bool = True, owner_pid: int | None = None) -> None:
        self.run_uuid = run_uuid
        self.ledger = ledger
        self.shims = shims
        self.env: dict[str, str] = {} if env is None else env
        self.owns_shims = owns_shims
        self.owner_pid = os.getpid() if owner_pid is None else owner_pid

    def __repr__(self) -> str:
        return (f"Session(run_uuid={self.run_uuid!r}, ledger={self.ledger!r}, "
                f"shims={self.shims!r}, owns_shims={self.owns_shims!r}, "
                f"owner_pid={self.owner_pid!r})")

    def close(self) -> None:
        # A forked child exiting normally runs the parent's atexit hooks too: the directory is
        # the parent's to remove.
        if self.owns_shims and os.getpid() == self.owner_pid:
            import shutil

            shutil.rmtree(self.shims, ignore_errors=True)


def prepare(env: Mapping[str, str], *, ledger: str, label: str,
            run_uuid: str | None = None) -> Session:
    """The environment for a recorded run: shims first on PATH, runtimes' compiler settings at
    the shim, the run id and the ledger for every record below."""
    child = dict(env)
    run_uuid = run_uuid or child.get(RUN_VARIABLE) or uuid4_hex()
    shims = child.get(SHIMS)
    owns = False
    if not (shims and os.path.isdir(shims)):
        shims = shared_shims(env)
        if shims is None:
            from cacheaudit import scratch

            shims = scratch.make_directory("shims")
            install_masquerade(shims)
            owns = True
    child.update({ACTIVE: "1", RUN_VARIABLE: run_uuid, RUN_LABEL_VARIABLE: label,
                  LEDGER: os.path.abspath(ledger), SHIMS: shims})
    path = [p for p in child.get("PATH", os.defpath).split(os.pathsep) if p != shims]
    child["PATH"] = os.pathsep.join([shims, *path])
    _pin_cuda_home(child, env, os.pathsep.join(path))
    _point_at_shims(child, env, shims)
    _keep_argv_setting(child)
    from cacheaudit import runtimes

    child[ADAPTER_IMPORTS] = runtimes.arming_text()
    return Session(run_uuid=run_uuid, ledger=os.path.abspath(ledger), shims=shims, env=child,
                   owns_shims=owns)


def _keep_argv_setting(child: dict[str, str]) -> None:
    """`redact-argv = false` in `[tool.cacheaudit]` reaches every recorder below as
    CACHEAUDIT_REDACT_ARGV=0 (a variable the user set wins); a table that cannot be read
    leaves redaction on."""
    from cacheaudit.config import load_settings

    if REDACT_ARGV in child:
        return
    try:
        keep = not load_settings(table_only=True).redact_argv
    except Exception:  # noqa: BLE001 - fail open: redaction stays on
        return
    if keep:
        child[REDACT_ARGV] = "0"


def shared_shims(env: Mapping[str, str]) -> str | None:
    """The masquerade directory every session of this installation shares.

    Its path ends up in compile commands (torch writes `$CXX` into build.ninja, DeepGEMM's
    Python JIT keys on its nvcc's path): a fresh directory per session would make ninja rebuild
    every extension in every session. Links are added in place and never removed, since another
    session may be compiling through them. None where the cache directory is not writable.
    """
    from cacheaudit.plain import xxh64_hexdigest
    from cacheaudit.shim import ShimError, shim_executable

    try:
        target = shim_executable()
    except ShimError:
        return None
    cache = env.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    installation = xxh64_hexdigest(os.fsencode(os.path.realpath(target)))
    directory = os.path.join(cache, "cacheaudit", "shims", installation)
    if masquerade_ready(directory):  # as the last install left it: one read, two stats
        return directory
    try:
        install_masquerade(directory, force=True)
    except (OSError, UsageError):
        return None
    stamp_masquerade_ready(directory)
    return directory


def _pin_cuda_home(child: dict[str, str], original: Mapping[str, str], path: str) -> None:
    """Set CUDA_HOME to the toolkit the runtimes would find on the user's PATH, where neither
    CUDA_HOME nor CUDA_PATH names one.

    torch, DeepJIT, DeepGEMM and DeepEP all fall back to `dirname(dirname(which nvcc))`: with the
    masquerade directory first on PATH that would be the shims' parent, which holds no include/
    or bin/nvcc, and their CUDA builds would break. Pinned, they find what they found before.
    """
    if original.get("CUDA_HOME") or original.get("CUDA_PATH"):
        return
    nvcc = _which("nvcc", path)
    if nvcc is not None:
        child["CUDA_HOME"] = os.path.dirname(os.path.dirname(nvcc))


def _which(name: str, path: str) -> str | None:
    """`shutil.which(name, path=path)`, without importing `shutil` (and its `fnmatch`, `re`,
    `zlib`, `bz2` and `lzma`) where it would do the same: POSIX, a bare name."""
    if sys.platform == "win32" or os.path.dirname(name):
        import shutil

        return shutil.which(name, path=path)
    if not path:
        return None
    for directory in dict.fromkeys(path.split(os.pathsep)):  # normcase is the identity here
        candidate = os.path.join(directory, name)
        if (os.path.exists(candidate) and os.access(candidate, os.F_OK | os.X_OK)
                and not os.path.isdir(candidate)):
            return candidate
    return None


def _stand_in(child: dict[str, str], shims: str, value: str, family: str) -> str | None:
    """The masquerade path a compiler setting is pointed at, None to leave it as it is.

    A bare family name needs nothing: the link of that name hands over to PATH's. Anything else
    gets a link of its own whose CACHEAUDIT_REAL_ variable names exactly that value.
    """
    from cacheaudit.shim import ShimError, shim_executable, stand_in_name

    if value == family:
        return os.path.join(shims, family)
    name = stand_in_name(value, family)
    try:
        link = link_to_shim(shims, name, shim_executable())
    except (OSError, ShimError):
        return None
    child[real_variable(name)] = value
    return link


def _point_at_shims(child: dict[str, str], original: Mapping[str, str], shims: str) -> None:
    """Runtimes' compiler settings at the shim, each handing over to what it named before, or,
    where the session fills one in, to what the runtime itself would have found at that
    compile.

    A spec's pattern setting (`CompilerSetting.pattern`: DeepJIT's `<P>_JIT_NVCC_COMPILER`)
    covers every variable fitting it that the user set; none is filled in.

    Settings of several words (`ccache g++`) are left alone: the wrapper runs the compiler by
    name, and PATH leads that name through the shim. So is a setting whose runtime keys the
    compiler's path (`CompilerSetting.path_in_key_if`): a stand-in would change the key. That
    holds for `CXX` and `CC` too when a runtime declares them so (Inductor keys `CXX` as
    written): such a setting given by path, or by a name of its own (`g++-12`), runs
    unrecorded by the shim, and the runtime's adapter records the compile in-process.
    """

    def single(value: str | None) -> bool:
        if not value or value.startswith(shims + os.sep):
            return False
        if not _SHELL_SPECIAL.intersection(value):
            return True  # what shlex.split makes one word of, without importing it (and `re`)
        import shlex

        try:
            return len(shlex.split(value)) == 1
        except ValueError:
            return False

    # What the runtimes would search, had the shims not gone first on PATH.
    unshimmed = {**child, "PATH": strip_masquerade_dirs(original.get("PATH", os.defpath))}
    settings = _compiler_settings()
    for variable, pattern_setting in _pattern_settings(original, {s.name for s in settings}):
        # Set ones only, handed over to exactly what they name: the runtime keys the compiler's
        # `--version` text, not its path, so the stand-in is invisible to its key; an unset one
        # stays unset, since which of these names the runtime reads nobody can tell.
        value = original.get(variable)
        if single(value):
            assert value is not None
            _point(child, variable, _stand_in(child, shims, value, pattern_setting.compiler))
    left_alone: set[str] = set()
    for setting in settings:
        name, family = setting.name, setting.compiler
        if setting.path_in_key_if and keys_compiler_path(setting, child):
            left_alone.add(name)
            continue
        if name in _CXX_SETTINGS:
            continue  # a runtime that declares CXX or CC keeps the host compilers' rules below
        value = original.get(name)
        if single(value):
            assert value is not None
            _point(child, name, _stand_in(child, shims, value, family))
        elif (not value and setting.session_fills
              and not any(original.get(other) for other in setting.unless_set)
              and resolve_lookup(setting.lookup(), unshimmed) is not None):
            # Without the compiler there is nothing to stand in for; pointing a runtime at the
            # shim would only turn "nvcc not found" into "the shim found no nvcc".
            _point(child, name, _lookup_stand_in(child, shims, setting.lookup(), family))
    for name, family in _CXX_SETTINGS.items():
        value = original.get(name)
        if name in left_alone:
            continue  # a runtime keys its text (Inductor's CXX): a stand-in would be keyed
        if value in MASQUERADE_NAMES or not single(value):
            # A bare name finds the masquerade first on PATH; rewriting it would change the
            # command line the runtime keys on (torch's build.ninja) for nothing.
            continue
        assert value is not None
        _point(child, name, _stand_in(child, shims, value, family))


def _lookup_stand_in(child: dict[str, str], shims: str, order: tuple[str, ...],
                     family: str) -> str | None:
    """A link for a setting the session fills in: the shim follows the runtime's own lookup
    `order` at each compile, in that compile's environment, so that a job that sets CUDA_HOME
    (or PATH) itself runs the toolkit it would run unrecorded. Resolving it here, once, would
    pin the toolkit the session started with."""
    from cacheaudit.shim import ShimError, shim_executable, stand_in_name

    text = os.pathsep.join(order)
    name = stand_in_name(text, family)
    try:
        link = link_to_shim(shims, name, shim_executable())
    except (OSError, ShimError):
        return None
    child.pop(real_variable(name), None)
    child[lookup_variable(name)] = text
    return link


def keys_compiler_path(setting: CompilerSetting, env: Mapping[str, str]) -> bool:
    """Whether the package the job would import (PYTHONPATH, then this interpreter's path) holds
    `setting.path_in_key_if`'s file, found without importing it: a runtime whose key holds its
    compiler's path must see the path the user gave it."""
    package, relative = setting.path_in_key_if
    search = [p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p] + sys.path
    try:
        found = _path_finder().find_spec(package, search)
    except (ImportError, ValueError):
        return False
    locations = (found.submodule_search_locations or []) if found is not None else []
    return any(os.path.isfile(os.path.join(location, relative)) for location in locations)


def _path_finder() -> Any:
    """`importlib.machinery.PathFinder`, without importing `importlib` (and its `warnings`)
    where the interpreter's own start-up already holds it."""
    try:
        import _frozen_importlib_external

        return _frozen_importlib_external.PathFinder
    except (ImportError, AttributeError):  # another implementation than CPython's
        import importlib.machinery

        return importlib.machinery.PathFinder


def _point(child: dict[str, str], setting: str, stand_in: str | None) -> None:
    if stand_in is not None:
        child[setting] = stand_in
