"""JSON as a contract: the one envelope every JSON document of cacheaudit has, the rule that
carries paths that are not UTF-8, and the schema shipped with the package.

Every command that prints JSON builds its document with `document` and writes it with `dumps`;
docs/json.md is the reference of the fields, the path rule and the versioning policy, and
`cacheaudit/schema/output.schema.json` (draft 2020-12) is the same contract for programs.

The path rule. POSIX paths are bytes; cacheaudit holds them as str decoded with
surrogateescape, so a byte that is not UTF-8 is a lone surrogate, which UTF-8 JSON cannot hold.
In the JSON every string is valid UTF-8: a string that holds such bytes is written with each of
them replaced by U+FFFD, and the object that holds it gets a member named like it with
`_bytes` appended whose value is the exact bytes in base64 (RFC 4648, with padding); for a list
of strings, `_bytes` is a list of the same length holding null where the string needed no help.
`recover` reads a member back by that rule. Strings that are object keys, or that sit in a list
inside a list, have the replacement only (none of cacheaudit's documents puts a path there).
"""

from __future__ import annotations

import base64
import json
import os
import time
from collections.abc import Mapping
from functools import cache
from typing import Any

from cacheaudit import __version__
from cacheaudit.evidence import utc_iso

TOOL = "cacheaudit"
BYTES_SUFFIX = "_bytes"

VERSIONS: dict[str, int] = {
    "scan": 1,
    "verify": 1,
    "verify-plan": 1,
    "records": 1,
    "explanation": 1,
    "run": 1,
    "demo": 1,
    # 1 was the snapshot's own `"format": 1`, before the envelope; `diff` still reads it.
    "snapshot": 2,
    "snapshot-diff": 1,
    "run-diff": 1,
    "host-diff": 1,
    "evict": 1,
    "stats": 1,
}
"""Each kind of document and its format version. An added field keeps the version; a field
removed, renamed or given another meaning bumps it (docs/json.md, "Versions")."""

ENVELOPE_KEYS = ("format", "version", "tool", "command", "generated")


def format_name(kind: str) -> str:
    return f"{TOOL}/{kind}"


def document(kind: str, command: str, payload: Mapping[str, Any],
             generated_ns: int | None = None) -> dict[str, Any]:
    """The envelope of a `kind` document (`VERSIONS`) printed by `command`, then `payload`'s
    members (which may not reuse the envelope's names)."""
    clash = set(ENVELOPE_KEYS).intersection(payload)
    if clash:
        raise ValueError(f"a {kind} payload may not hold envelope members: {sorted(clash)}")
    return {"format": format_name(kind), "version": VERSIONS[kind],
            "tool": {"name": TOOL, "version": __version__}, "command": command,
            "generated": utc_iso(time.time_ns() if generated_ns is None else generated_ns),
            **payload}


def dumps(data: Any) -> str:
    """`data` as the JSON text cacheaudit prints: the path rule applied, valid UTF-8 always."""
    return json.dumps(portable(data), indent=2, ensure_ascii=False)


# ------------------------------------------------------------------------------ the path rule


def is_utf8(text: str) -> bool:
    if text.isascii():
        return True
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


def raw_bytes(text: str) -> bytes:
    """The bytes a surrogate-escaped str stands for (`os.fsencode` on POSIX); a surrogate that
    no decoding made (U+D800) is kept as its own UTF-8 form."""
    try:
        return text.encode("utf-8", "surrogateescape")
    except UnicodeEncodeError:
        return text.encode("utf-8", "surrogatepass")


def readable(text: str) -> str:
    """`text` as valid Unicode: each byte that is not UTF-8 as U+FFFD."""
    return text if is_utf8(text) else raw_bytes(text).decode("utf-8", "replace")


def _companion(text: str) -> str | None:
    return None if is_utf8(text) else base64.b64encode(raw_bytes(text)).decode("ascii")


def portable(value: Any) -> Any:
    """`value` (plain data: dicts, lists, tuples, str, numbers, None) with the path rule
    applied: every string valid UTF-8, each member whose string or strings were not given its
    `_bytes` companion."""
    if isinstance(value, str):
        return readable(value)
    if isinstance(value, Mapping):
        out: dict[str, Any] = {}
        companions: dict[str, Any] = {}
        for key, item in value.items():
            name = readable(str(key))
            out[name] = portable(item)
            if isinstance(item, str):
                if (exact := _companion(item)) is not None:
                    companions[name + BYTES_SUFFIX] = exact
            elif isinstance(item, (list, tuple)):
                exacts = [_companion(v) if isinstance(v, str) else None for v in item]
                if any(e is not None for e in exacts):
                    companions[name + BYTES_SUFFIX] = exacts
        out.update(companions)
        return out
    if isinstance(value, (list, tuple)):
        return [portable(item) for item in value]
    return value


def recover(holder: Mapping[str, Any], key: str, index: int | None = None) -> str:
    """The exact string of member `key` (item `index` of it, for a list) of an object read
    from cacheaudit's JSON, as a surrogate-escaped str: `os.fsencode` of it is the path's
    bytes."""
    value = holder[key] if index is None else holder[key][index]
    exact = holder.get(key + BYTES_SUFFIX)
    if index is not None and isinstance(exact, list):
        exact = exact[index]
    if isinstance(exact, str):
        return os.fsdecode(base64.b64decode(exact, validate=True))
    return value


# ------------------------------------------------------------------------------ the schema


SCHEMA_RESOURCE = "output.schema.json"


@cache
def schema() -> dict[str, Any]:
    """The JSON Schema (draft 2020-12) of every document, shipped as package data in
    `cacheaudit/schema/` (a directory, not a module)."""
    from importlib import resources

    text = resources.files("cacheaudit").joinpath("schema").joinpath(
        SCHEMA_RESOURCE).read_text("utf-8")
    return json.loads(text)
