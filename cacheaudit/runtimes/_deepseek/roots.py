"""Where DeepJIT, DeepGEMM and DeepEP put their caches by default: the helpers their specs'
`default_roots` share (standard library `os` only, so that a session reads them without a
reader)."""

from __future__ import annotations

import os

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Mapping


def env_path_list(env: Mapping[str, str], name: str) -> list[str] | None:
    """The non-empty items of a colon-separated path variable, or None when it is unset.

    An empty item makes DeepJIT panic ("disk cache path list contains an empty path"); the
    remaining items are still returned, since caches written under an earlier setting may sit
    there.
    """
    value = env.get(name)
    if value is None:
        return None
    return [item for item in value.split(":") if item]


def home_default(env: Mapping[str, str], name: str) -> str | None:
    """`$HOME/<name>`, or None without a HOME: DeepJIT asserts that HOME is set, and DeepGEMM
    then uses a path relative to the process's working directory, which no scan can know."""
    home = env.get("HOME")
    return os.path.join(home, name) if home else None
