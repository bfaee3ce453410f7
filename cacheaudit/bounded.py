"""Bounded reading of JSON that someone else wrote: size and nesting depth checked first.

cacheaudit parses JSON it did not write: a runtime's metadata in a cache (DeepJIT's meta.json,
Triton's `<name>.json`), a spooled record, a value in a ledger that came from another machine, a
snapshot attached to a bug report. `json.loads` recurses once per nesting level, so a document
nested 100,000 deep raises RecursionError (which nothing expects, and which used to end a whole
scan), and its memory grows with the input. Here every such document is refused before decoding
when it is larger than its limit or nested deeper than its limit, and every failure is one
`Refused` (a ValueError) with a one-line reason, so the caller can make it a finding for that one
file and go on.

The depth check runs at C speed on the raw text and is skipped when the text holds fewer
openers than the limit: strings are cut out (`outside_strings`; an unterminated one runs to the
end), empty pairs peeled off, and the running depth taken only where that cannot decide
(`exceeds_depth`). Standard library only: the ledger, the layouts and the tell layer all use it.
"""

from __future__ import annotations

import json
import os
import stat
from collections.abc import Callable
from itertools import accumulate
from typing import Any

MAX_DEPTH = 64
"""Nesting levels a document may have. The deepest JSON cacheaudit itself or a runtime writes
is under 10 levels (a record's extra facts); Python's own decoder fails near 1,000."""

CACHE_FILE_BYTES = 4 * 1024 * 1024
"""A runtime's metadata file in a cache: DeepJIT's meta.json and Triton's metadata are a few
kilobytes (the largest seen, with a long command line and `nvcc --version`, under 20 KB)."""

RECORD_BYTES = 64 * 1024 * 1024
"""A spooled record, a value stored in a ledger, a snapshot: a record whose include graph lists
20,000 headers is about 4 MB as JSON."""

SOURCE_BYTES = 16 * 1024 * 1024
"""A source file cacheaudit hands to a compiler for a dependency pass (a generated kernel is a
few kilobytes; a large hand-written translation unit a few hundred)."""

_OPEN_FLAGS = os.O_RDONLY | getattr(os, "O_NONBLOCK", 0) | getattr(os, "O_CLOEXEC", 0)

# Everything but quotes and brackets goes before the depth is counted.
_NOT_SYNTAX = bytes(b for b in range(256) if b not in b'"[]{}')
_ONE_KIND = bytes.maketrans(b"{}", b"[]")
_STEP = bytes.maketrans(b"[]", b"\x01\xff")
_CHUNK = 1 << 16
_PEEL_PASSES = 8


class Refused(ValueError):
    """A document refused or unreadable as JSON. `kind` is "size", "depth", "syntax" or "file";
    `reason` (also str()) is one line that names the limit or the decoder's complaint."""

    def __init__(self, kind: str, reason: str) -> None:
        super().__init__(reason)
        self.kind = kind
        self.reason = reason


def _size_text(count: int) -> str:
    return f"{count / (1024 * 1024):.0f} MiB" if count >= 1024 * 1024 else f"{count:,} bytes"


def _deepest(brackets: bytes, stop: int) -> int:
    """The running depth's maximum over a text of `[` and `]` only, given up as soon as it passes
    `stop` (a document nested 100,000 deep is judged on its first kilobyte)."""
    deepest = level = 0
    for start in range(0, len(brackets), _CHUNK):
        part = brackets[start:start + _CHUNK]
        # +1 and -1 as signed bytes: iterated and summed in C, no call per bracket.
        deepest = max(deepest, level + max(accumulate(memoryview(part.translate(_STEP)).cast("b"))))
        level += part.count(b"[") - part.count(b"]")
        if deepest > stop:
            break
    return deepest


def outside_strings(data: bytes) -> bytes:
    """The brackets of a UTF-8 JSON text that lie outside its strings, in order, all spelt
    `[` and `]` (depth counts both kinds alike).

    Escapes go first (a run of backslashes pairs up from its start, as the decoder reads it;
    then escaped quotes), then everything but quotes and brackets. Any two adjacent quotes can
    go then without moving a bracket into or out of a string (most strings hold no bracket, so
    nearly all quotes go here), and what lies between odd and even quotes is inside a string.
    An unterminated string runs to the end. Where the text stops being JSON, the decoder stops
    too, before it nests any deeper than the valid part before that point: counting on is safe.
    """
    reduced = (data.replace(b"\\\\", b"").replace(b'\\"', b"").translate(None, _NOT_SYNTAX)
               .replace(b'""', b""))
    bare = b"".join(reduced.split(b'"')[::2]) if b'"' in reduced else reduced
    return bare.translate(_ONE_KIND)


def exceeds_depth(data: bytes, max_depth: int) -> bool:
    """Whether the brackets outside strings (`outside_strings`) of a JSON text nest deeper than
    `max_depth` (an unbalanced text counts its openers as it goes).

    The innermost empty pairs are peeled off a few times (C speed: a flat list of 10
    million `{}` goes in one pass); each pass lowers the deepest level by at most one, so what
    remains bounds the depth from both sides, and only a text whose depth lies within the
    passes of the limit is measured in full.
    """
    bare = outside_strings(data)
    peeled, passes = bare, 0
    while peeled and passes < _PEEL_PASSES:
        shorter = peeled.replace(b"[]", b"")
        if len(shorter) == len(peeled):
            break
        peeled, passes = shorter, passes + 1
    remaining = _deepest(peeled, max_depth)
    if remaining > max_depth:
        return True
    if remaining + passes <= max_depth:
        return False
    return _deepest(bare, max_depth) > max_depth


def check(data: bytes | str, *, max_bytes: int, max_depth: int = MAX_DEPTH) -> None:
    """Raise `Refused` when `data` is over `max_bytes` (characters for a str) or nests deeper
    than `max_depth`; cheap when it holds fewer openers than `max_depth`. Bytes are taken as
    UTF-8 (`loads` re-encodes the UTF-16 and UTF-32 the decoder also accepts)."""
    if len(data) > max_bytes:
        raise Refused("size", f"is larger than the limit of {_size_text(max_bytes)}")
    raw = data.encode("utf-8", "surrogatepass") if isinstance(data, str) else data
    if raw.count(b"[") + raw.count(b"{") <= max_depth:
        return
    if exceeds_depth(raw, max_depth):
        raise Refused("depth", f"nests more than {max_depth} levels deep (the limit)")


def loads(data: bytes | str, *, max_bytes: int = RECORD_BYTES,
          max_depth: int = MAX_DEPTH) -> Any:
    """`json.loads` within limits. Raises only `Refused`: "size" and "depth" before any
    decoding, "syntax" for what the decoder rejects (its message kept, bad UTF-8 included)."""
    try:
        if isinstance(data, (bytes, bytearray)):
            data = bytes(data)
            encoding = json.detect_encoding(data)
            if encoding not in ("utf-8", "utf-8-sig"):
                # The depth count reads UTF-8 only: other encodings the decoder accepts are
                # decoded first (a wrong one is a syntax error, as the decoder would say).
                data = data.decode(encoding)
        check(data, max_bytes=max_bytes, max_depth=max_depth)
        return json.loads(data)
    except Refused:
        raise
    except (ValueError, RecursionError, TypeError) as exc:
        # UnicodeDecodeError is a ValueError; RecursionError cannot happen under the depth limit
        # and is caught all the same: whatever the decoder meets stays this document's problem.
        raise Refused("syntax", _one_line(str(exc))) from None


def loads_or(data: bytes | str, default: Any, *, max_bytes: int = RECORD_BYTES,
             max_depth: int = MAX_DEPTH) -> Any:
    """`loads`, or `default` where it refuses (a value whose loss the caller can live with)."""
    try:
        return loads(data, max_bytes=max_bytes, max_depth=max_depth)
    except Refused:
        return default


def _one_line(text: str) -> str:
    return " ".join(text.split())[:300]


def read_bytes(path: str, max_bytes: int) -> bytes:
    """The bytes of a regular file of at most `max_bytes`, read without following it into a
    FIFO or device: O_NONBLOCK keeps the open from waiting for a writer, fstat refuses anything
    but a regular file, and at most `max_bytes + 1` bytes are read. Raises OSError as open and
    read do, `Refused` ("file" or "size") for the rest."""
    fd = os.open(path, _OPEN_FLAGS)
    try:
        mode = os.fstat(fd).st_mode
        if not stat.S_ISREG(mode):
            raise Refused("file", f"is {file_kind(mode)}, not a regular file")
        chunks: list[bytes] = []
        got = 0
        while got <= max_bytes:
            chunk = os.read(fd, max_bytes + 1 - got)
            if not chunk:
                break
            chunks.append(chunk)
            got += len(chunk)
        if got > max_bytes:
            raise Refused("size", f"is larger than the limit of {_size_text(max_bytes)}")
        return b"".join(chunks)
    finally:
        os.close(fd)


def load_file(path: str, *, max_bytes: int = CACHE_FILE_BYTES, max_depth: int = MAX_DEPTH,
              decode: Callable[[bytes], bytes | str] | None = None) -> Any:
    """A JSON file parsed within limits: `read_bytes` then `loads`. `decode` turns the bytes
    into the text to parse (the spool keeps undecodable path bytes with surrogateescape).
    Raises OSError (missing, unreadable) or `Refused`."""
    data = read_bytes(path, max_bytes)
    return loads(decode(data) if decode is not None else data, max_bytes=max_bytes,
                 max_depth=max_depth)


def file_kind(mode: int) -> str:
    """What a file mode is, in words ("a FIFO", "a character device", "a directory", ...)."""
    for test, words in ((stat.S_ISFIFO, "a FIFO"), (stat.S_ISCHR, "a character device"),
                        (stat.S_ISBLK, "a block device"), (stat.S_ISSOCK, "a socket"),
                        (stat.S_ISDIR, "a directory"), (stat.S_ISLNK, "a symlink"),
                        (stat.S_ISREG, "a regular file")):
        if test(mode):
            return words
    return "not a regular file"
