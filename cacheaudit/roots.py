"""What the runtimes' default cache roots are computed with, standard library `os` only.

Each runtime package declares where its cache lives under an environment beside its spec, in
`spec.py` (named by the spec's `roots` field), apart from its layout reader: a recording session
learns the roots it watches without importing a single reader (`cacheaudit.runtimes.
default_roots`), and imports the readers only where one of those roots exists. The layouts'
`default_roots` return the same lists, from the same functions.
"""

from __future__ import annotations

import os


def unique_paths(paths: list[str]) -> list[str]:
    """Each path once (compared after normpath), first occurrence first."""
    seen: set[str] = set()
    out: list[str] = []
    for path in paths:
        norm = os.path.normpath(path)
        if norm not in seen:
            seen.add(norm)
            out.append(norm)
    return out
