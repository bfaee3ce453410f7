"""What a snapshot reports of Triton's own tools: the ptxas it assembles with."""

from __future__ import annotations

import importlib.util
import os
from collections.abc import Mapping
from typing import Any

from cacheaudit import probes


def _triton_ptxas(env: Mapping[str, str]) -> str | None:
    explicit = env.get("TRITON_PTXAS_PATH")
    if explicit:
        return explicit
    spec = importlib.util.find_spec("triton")  # located, not imported
    if spec is None or not spec.submodule_search_locations:
        return None
    for location in spec.submodule_search_locations:
        candidate = os.path.join(location, "backends", "nvidia", "bin", "ptxas")
        if os.path.exists(candidate):
            return candidate
    return None


def compilers(env: Mapping[str, str], timeout: float) -> list[dict[str, Any]]:
    return [probes.compiler("ptxas (triton)", _triton_ptxas(env), env, timeout)]
