"""What a snapshot reports of NVRTC: its version and library, asked in a child process."""

from __future__ import annotations

import os
import sys
from collections.abc import Mapping
from typing import Any

from cacheaudit import probes


def _nvrtc(env: Mapping[str, str], timeout: float) -> dict[str, Any]:
    """NVRTC's version and library, asked in a child process: loading it here could hang or
    crash the snapshot, and importing cuda here would cost the caller."""
    probe = ("import json\nfrom cuda.bindings import nvrtc\nerr, major, minor = "
             "nvrtc.nvrtcVersion()\nimport cuda.pathfinder as p\n"
             "lib = p.load_nvidia_dynamic_lib('nvrtc')\n"
             "print(json.dumps({'version': f'{major}.{minor}', "
             "'library': getattr(lib, 'abs_path', None)}))")
    output, problem = probes.run([sys.executable, "-c", probe], timeout, env)
    if output is None:
        return {"name": "nvrtc", "status": problem}
    import json

    try:
        data = json.loads(output.strip().splitlines()[-1])
    except (ValueError, IndexError):
        return {"name": "nvrtc", "status": f"{probes.COULD_NOT_COLLECT}: unreadable answer"}
    entry = {"name": "nvrtc", "version": data.get("version"), "path": data.get("library"),
             "status": "ok"}
    if entry["path"] and os.path.exists(entry["path"]):
        from cacheaudit.digest import hash_file

        entry["xxh3"] = hash_file(entry["path"])
    return entry


def compilers(env: Mapping[str, str], timeout: float) -> list[dict[str, Any]]:
    return [_nvrtc(env, timeout)]
