"""Stand-ins, in the standard library alone, for what a session's first process would otherwise
import: `NamedTuple` without `typing`, and `xxh64_hexdigest` without `xxhash`.

`NamedTuple` without `typing`: the class syntax of `typing.NamedTuple` (fields annotated in the
body, defaults after them, methods, properties, docstrings), built on `collections.namedtuple`.

`typing` imports `re` and `enum` and costs a Python process ~20 ms of CPU on a loaded 2-core
machine; every process that prepares a recording session (the start-up hook's first process,
`pytest --cacheaudit`) reads the runtimes' specs, whose classes are named tuples. Modules import
it as `typing.NamedTuple` for checkers and as this one at run time:

    TYPE_CHECKING = False
    if TYPE_CHECKING:
        from typing import NamedTuple
    else:
        from cacheaudit.plain import NamedTuple
"""

from __future__ import annotations

import collections

_RESERVED = frozenset({"__dict__", "__weakref__", "__annotations__", "__module__",
                       "__qualname__", "__orig_bases__"})


class _NamedTupleMeta(type):
    def __new__(mcls, name: str, bases: tuple[type, ...], namespace: dict[str, object]
                ) -> type:
        fields = list(namespace.get("__annotations__", {}))
        defaults = [namespace[field] for field in fields if field in namespace]
        if fields[len(fields) - len(defaults):] != [f for f in fields if f in namespace]:
            raise TypeError(f"{name}: a field without a default follows one with a default")
        base = collections.namedtuple(name, fields, defaults=defaults,
                                      module=namespace.get("__module__"))
        body = {key: value for key, value in namespace.items()
                if key not in _RESERVED and key not in fields}
        body["__slots__"] = ()
        created = type(name, (base,), body)
        created.__module__ = str(namespace.get("__module__", base.__module__))
        created.__qualname__ = str(namespace.get("__qualname__", name))
        created.__annotations__ = dict(namespace.get("__annotations__", {}))
        return created


_NamedTupleBase = type.__new__(_NamedTupleMeta, "NamedTuple", (), {})


class _NamedTupleBaseEntry:
    """What `class X(NamedTuple)` names: its base becomes one whose metaclass builds X (as
    `typing.NamedTuple` does it, through `__mro_entries__`)."""

    def __mro_entries__(self, bases: tuple[object, ...]) -> tuple[type]:
        return (_NamedTupleBase,)


NamedTuple = _NamedTupleBaseEntry()


_PRIME64 = (0x9E3779B185EBCA87, 0xC2B2AE3D27D4EB4F, 0x165667B19E3779F9, 0x85EBCA77C2B2AE63,
            0x27D4EB2F165667C5)
_MASK64 = (1 << 64) - 1


def _rotl(value: int, bits: int) -> int:
    return ((value << bits) | (value >> (64 - bits))) & _MASK64


def _round(accumulator: int, lane: int) -> int:
    accumulator = (accumulator + lane * _PRIME64[1]) & _MASK64
    return (_rotl(accumulator, 31) * _PRIME64[0]) & _MASK64


def xxh64_hexdigest(data: bytes, seed: int = 0) -> str:
    """`xxhash.xxh64_hexdigest(data, seed)`, the same digits, for the short strings that name
    a session's directories and links (a path, a compiler setting): importing `xxhash` costs a
    session's first process ~2 ms, this some tens of microseconds on a path. Not for file
    contents (pure Python: ~1 us a byte); tests check it against `xxhash` on every length."""
    p1, p2, p3, p4, p5 = _PRIME64
    length = len(data)
    offset = 0
    if length >= 32:
        v1 = (seed + p1 + p2) & _MASK64
        v2 = (seed + p2) & _MASK64
        v3 = seed & _MASK64
        v4 = (seed - p1) & _MASK64
        while offset + 32 <= length:
            v1 = _round(v1, int.from_bytes(data[offset:offset + 8], "little"))
            v2 = _round(v2, int.from_bytes(data[offset + 8:offset + 16], "little"))
            v3 = _round(v3, int.from_bytes(data[offset + 16:offset + 24], "little"))
            v4 = _round(v4, int.from_bytes(data[offset + 24:offset + 32], "little"))
            offset += 32
        hashed = (_rotl(v1, 1) + _rotl(v2, 7) + _rotl(v3, 12) + _rotl(v4, 18)) & _MASK64
        for lane in (v1, v2, v3, v4):
            hashed = (((hashed ^ _round(0, lane)) * p1) + p4) & _MASK64
    else:
        hashed = (seed + p5) & _MASK64
    hashed = (hashed + length) & _MASK64
    while offset + 8 <= length:
        lane = _round(0, int.from_bytes(data[offset:offset + 8], "little"))
        hashed = (_rotl(hashed ^ lane, 27) * p1 + p4) & _MASK64
        offset += 8
    if offset + 4 <= length:
        word = int.from_bytes(data[offset:offset + 4], "little")
        hashed = (_rotl(hashed ^ ((word * p1) & _MASK64), 23) * p2 + p3) & _MASK64
        offset += 4
    while offset < length:
        hashed = (_rotl(hashed ^ ((data[offset] * p5) & _MASK64), 11) * p1) & _MASK64
        offset += 1
    hashed ^= hashed >> 33
    hashed = (hashed * p2) & _MASK64
    hashed ^= hashed >> 29
    hashed = (hashed * p3) & _MASK64
    hashed ^= hashed >> 32
    return f"{hashed:016x}"
