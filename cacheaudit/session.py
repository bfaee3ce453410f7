"""A recording session: the environment that makes every compile below a process go through the
shim and every Python process below it start cacheaudit's adapters.

Shared by `cacheaudit run`, the pytest plugin and the start-up hook. The session never changes
which compiler a runtime would have used: where the user or the runtime's defaults named one, the
shim is told to hand over to exactly that one (`CACHEAUDIT_REAL_<NAME>`).
"""

from __future__ import annotations

import os
import shutil
import tempfile
import uuid
from collections.abc import Mapping
from dataclasses import dataclass, field

from cacheaudit.recorder import RUN_LABEL_VARIABLE, RUN_VARIABLE
from cacheaudit.shim import MASQUERADE_NAMES, install_masquerade, real_variable

ACTIVE = "CACHEAUDIT"
CONFIG = "CACHEAUDIT_CONFIG"
LEDGER = "CACHEAUDIT_LEDGER"
SHIMS = "CACHEAUDIT_SHIMS"

# Settings through which runtimes name their nvcc, each pointed at the shim; DeepJIT's prefixes
# fall back to DJ_JIT_NVCC_COMPILER, so setting that one covers DeepGEMM 2.8+ and DeepEP too.
_NVCC_SETTINGS = ("DG_JIT_NVCC_COMPILER", "EP_JIT_NVCC_COMPILER", "DJ_JIT_NVCC_COMPILER",
                  "FLASHINFER_NVCC", "PYTORCH_NVCC")
_ALWAYS = ("DJ_JIT_NVCC_COMPILER", "FLASHINFER_NVCC")
# CXX/CC name a host compiler for torch and friends; a masqueraded name takes its place.
_CXX_SETTINGS = {"CXX": "c++", "CC": "cc"}


@dataclass
class Session:
    run_uuid: str
    ledger: str
    shims: str
    env: dict[str, str] = field(default_factory=dict)
    owns_shims: bool = True

    def close(self) -> None:
        if self.owns_shims:
            shutil.rmtree(self.shims, ignore_errors=True)


def enabled(env: Mapping[str, str]) -> bool:
    """Whether the start-up hook should activate cacheaudit in a process with this environment."""
    if env.get("CACHEAUDIT_DISABLE", "") not in ("", "0"):
        return False
    return env.get(ACTIVE, "") not in ("", "0") or bool(env.get(CONFIG))


def prepare(env: Mapping[str, str], *, ledger: str, label: str,
            run_uuid: str | None = None) -> Session:
    """The environment for a recorded run: shims first on PATH, runtimes' compiler settings at
    the shim, the run id and the ledger for every record below."""
    child = dict(env)
    run_uuid = run_uuid or child.get(RUN_VARIABLE) or uuid.uuid4().hex
    shims = child.get(SHIMS)
    owns = False
    if not (shims and os.path.isdir(shims)):
        shims = shared_shims(env)
        if shims is None:
            shims = tempfile.mkdtemp(prefix="cacheaudit-shims-")
            install_masquerade(shims)
            owns = True
    child.update({ACTIVE: "1", RUN_VARIABLE: run_uuid, RUN_LABEL_VARIABLE: label,
                  LEDGER: os.path.abspath(ledger), SHIMS: shims})
    path = child.get("PATH", os.defpath).split(os.pathsep)
    child["PATH"] = os.pathsep.join([shims] + [p for p in path if p != shims])
    _point_at_shims(child, env, shims)
    return Session(run_uuid=run_uuid, ledger=os.path.abspath(ledger), shims=shims, env=child,
                   owns_shims=owns)


def shared_shims(env: Mapping[str, str]) -> str | None:
    """The masquerade directory every session of this installation shares, created once.

    Its path ends up in compile commands (torch writes `$CXX` into build.ninja, DeepJIT keys on
    its nvcc's path): a fresh directory per session would make ninja rebuild every extension in
    every session. None where the cache directory is not writable.
    """
    import xxhash

    from cacheaudit.shim import ShimError, shim_executable

    try:
        target = os.path.realpath(shim_executable())
    except ShimError:
        return None
    cache = env.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    installation = xxhash.xxh64_hexdigest(os.fsencode(target))
    directory = os.path.join(cache, "cacheaudit", "shims", installation)
    if all(os.path.realpath(os.path.join(directory, name)) == target
           for name in MASQUERADE_NAMES):
        return directory
    parent = os.path.dirname(directory)
    try:
        os.makedirs(parent, exist_ok=True)
        staging = tempfile.mkdtemp(prefix=".staging-", dir=parent)
    except OSError:
        return None
    try:
        install_masquerade(staging)
        shutil.rmtree(directory, ignore_errors=True)
        # Two sessions may race here: the loser's rename fails and its staging copy goes.
        os.rename(staging, directory)
    except Exception:  # noqa: BLE001 - OSError or install_masquerade's UsageError
        shutil.rmtree(staging, ignore_errors=True)
    return directory if os.path.isdir(directory) else None


def _point_at_shims(child: dict[str, str], original: Mapping[str, str], shims: str) -> None:
    nvcc = os.path.join(shims, "nvcc")
    chosen = [original[name] for name in _NVCC_SETTINGS
              if original.get(name) and not original[name].startswith(shims)]
    if chosen:
        # The runtime would have used this nvcc: the shim hands over to it, not to PATH's.
        child.setdefault(real_variable("nvcc"), chosen[0])
    elif original.get("CUDA_HOME") or original.get("CUDA_PATH"):
        # DeepJIT and DeepGEMM take CUDA_HOME/bin/nvcc before PATH's nvcc.
        home = original.get("CUDA_HOME") or original.get("CUDA_PATH", "")
        candidate = os.path.join(home, "bin", "nvcc")
        if os.access(candidate, os.X_OK):
            child.setdefault(real_variable("nvcc"), candidate)
    # Without any nvcc there is nothing to stand in for; pointing a runtime at the shim would
    # only turn "nvcc not found" into "the shim found no nvcc" (and change what runtimes that
    # choose a backend by the setting's presence, such as the reference runtime, decide).
    have_nvcc = bool(chosen) or real_variable("nvcc") in child or shutil.which(
        "nvcc", path=os.pathsep.join(p for p in child.get("PATH", "").split(os.pathsep)
                                     if p != shims)) is not None
    for name in _NVCC_SETTINGS:
        if original.get(name) or (name in _ALWAYS and have_nvcc):
            child[name] = nvcc
    for name, masquerade in _CXX_SETTINGS.items():
        value = original.get(name)
        if value in MASQUERADE_NAMES:
            # A bare name finds the masquerade first on PATH; rewriting it would change the
            # command line the runtime keys on (torch's build.ninja) for nothing.
            continue
        if value and not value.startswith(shims):
            child.setdefault(real_variable(masquerade), value)
            child[name] = os.path.join(shims, masquerade)
