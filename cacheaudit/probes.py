"""Probes of the machine for the snapshot: a command run with a time limit, a compiler identified.

Every probe has a time limit and a fallback of its own: a missing tool or a hanging command makes
its answer say so (`COULD_NOT_COLLECT`), and never raises. Runtime packages use these for the
tools they add to a snapshot (their spec's `snapshot` module).
"""

from __future__ import annotations

import os
import subprocess
from collections.abc import Mapping
from typing import Any

COULD_NOT_COLLECT = "could not collect"


def run(argv: list[str], timeout: float, env: Mapping[str, str]) -> tuple[str | None, str]:
    """(output, "") or (None, why not): a probe never raises and never waits past `timeout`."""
    try:
        done = subprocess.run(argv, capture_output=True, text=True, timeout=timeout,
                              env=dict(env), stdin=subprocess.DEVNULL, errors="replace")
    except FileNotFoundError:
        return None, f"{COULD_NOT_COLLECT}: {argv[0]} not found"
    except subprocess.TimeoutExpired:
        return None, f"{COULD_NOT_COLLECT}: {os.path.basename(argv[0])} did not answer within " \
                     f"{timeout:g} s"
    except OSError as exc:
        return None, f"{COULD_NOT_COLLECT}: {exc.strerror or exc}"
    if done.returncode != 0:
        return None, (f"{COULD_NOT_COLLECT}: {os.path.basename(argv[0])} exited "
                      f"{done.returncode}: {(done.stderr or done.stdout).strip()[:200]}")
    return done.stdout, ""


def compiler(name: str, path: str | None, env: Mapping[str, str], timeout: float
              ) -> dict[str, Any]:
    if path is None:
        return {"name": name, "status": f"{COULD_NOT_COLLECT}: not found"}
    from cacheaudit.compilers import identify
    from cacheaudit.switches import is_masquerade_dir

    identity = identify(path, env=env, skip=is_masquerade_dir, timeout=timeout, path=path)
    entry: dict[str, Any] = {
        "name": name, "path": identity.path, "resolved": identity.resolved,
        "wrappers": list(identity.wrappers), "version": identity.version_line,
        "version_text": identity.version_text, "xxh3": identity.digest,
        "status": identity.error or "ok"}
    if identity.host is not None:
        entry["host"] = {"path": identity.host.path, "resolved": identity.host.resolved,
                         "version": identity.host.version_line, "xxh3": identity.host.digest,
                         "status": identity.host.error or "ok"}
    return entry


def which(name: str, env: Mapping[str, str]) -> str | None:
    from cacheaudit.compilers import find_program
    from cacheaudit.switches import is_masquerade_dir

    return find_program(name, env.get("PATH", os.defpath), is_masquerade_dir)
