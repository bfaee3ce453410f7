"""Probes of the machine for the snapshot: a command run with a time limit, a compiler identified.

Every probe has a time limit and a fallback of its own: a missing tool or a hanging command makes
its answer say so (`COULD_NOT_COLLECT`), and never raises. Runtime packages use these for the
tools they add to a snapshot (their spec's `snapshot` module).
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from typing import Any

from cacheaudit import children

COULD_NOT_COLLECT = "could not collect"


def run(argv: list[str], timeout: float, env: Mapping[str, str],
        limits: children.Limits = children.PASS_LIMITS) -> tuple[str | None, str]:
    """(output, "") or (None, why not): a probe never raises and never waits past `timeout`. It
    is a child of cacheaudit's own (`cacheaudit.children`: its process group killed at the
    deadline or with this process, within `limits`)."""
    try:
        done = children.run(argv, timeout=timeout, env=env, limits=limits)
    except FileNotFoundError:
        return None, f"{COULD_NOT_COLLECT}: {argv[0]} not found"
    except OSError as exc:
        return None, f"{COULD_NOT_COLLECT}: {exc.strerror or exc}"
    if done.timed_out:
        return None, f"{COULD_NOT_COLLECT}: {os.path.basename(argv[0])} did not answer within " \
                     f"{timeout:g} s"
    stdout = done.stdout.decode("utf-8", "replace")
    if done.returncode != 0:
        stderr = done.stderr.decode("utf-8", "replace")
        return None, (f"{COULD_NOT_COLLECT}: {os.path.basename(argv[0])} exited "
                      f"{done.returncode}: {(stderr or stdout).strip()[:200]}")
    return stdout, ""


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
