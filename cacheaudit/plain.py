"""Stand-ins, in the standard library's built-in modules alone, for what a session's first
process would otherwise import: `NamedTuple` without `typing` or `collections`, `memoized`
without `functools`, and `xxh64_hexdigest` without `xxhash`.

`NamedTuple` without `typing`: the class syntax of `typing.NamedTuple` (fields annotated in the
body, defaults after them, methods, properties, docstrings), built here rather than on
`collections.namedtuple`: `collections` (with `keyword`, `operator`, `reprlib` and
`itertools`) is ~2 ms of a Python process that imports nothing else of it, and `functools`
imports it too.

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

import sys

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Callable, Iterable
    from functools import cache as memoized
    from typing import Any

try:
    from _collections import _tuplegetter  # what collections.namedtuple's fields are
except ImportError:  # another implementation than CPython's
    def _tuplegetter(index: int, doc: str | None) -> Any:
        return property(lambda self: self[index], doc=doc)

MappingProxyType = type(type.__dict__)
"""`types.MappingProxyType` (which `types` itself takes from the same place)."""

_RESERVED = frozenset({"__dict__", "__weakref__", "__annotations__", "__module__",
                       "__qualname__", "__orig_bases__"})


def _tuple_class(name: str, fields: tuple[str, ...], defaults: dict[str, Any],
                 body: dict[str, Any]) -> type:
    """A tuple class with `collections.namedtuple`'s behaviour: fields by name and position,
    defaults, `_make`, `_replace`, `_asdict`, `_fields`, `_field_defaults`, its repr, pickling
    and pattern matching."""
    count = len(fields)
    positions = frozenset(fields)

    def __new__(cls: type, *args: Any, **kwargs: Any) -> Any:
        if len(args) == count and not kwargs:
            return tuple.__new__(cls, args)
        if len(args) > count:
            raise TypeError(f"{name}() takes {count} positional arguments but {len(args)} "
                            "were given")
        values = list(args)
        for field in fields[len(args):]:
            if field in kwargs:
                values.append(kwargs.pop(field))
            elif field in defaults:
                values.append(defaults[field])
            else:
                raise TypeError(f"{name}() missing required argument: {field!r}")
        if kwargs:
            extra = next(iter(kwargs))
            why = "multiple values for" if extra in positions else "an unexpected keyword"
            raise TypeError(f"{name}() got {why} argument {extra!r}")
        return tuple.__new__(cls, values)

    def _make(cls: type, iterable: Iterable[Any]) -> Any:
        made = tuple.__new__(cls, iterable)
        if len(made) != count:
            raise TypeError(f"Expected {count} arguments, got {len(made)}")
        return made

    def _replace(self: tuple[Any, ...], **changes: Any) -> Any:
        made = self._make([changes.pop(f) if f in changes else v  # type: ignore[attr-defined]
                           for f, v in zip(fields, self, strict=True)])
        if changes:
            raise ValueError(f"Got unexpected field names: {list(changes)!r}")
        return made

    def __repr__(self: tuple[Any, ...]) -> str:
        shown = ", ".join(f"{f}={v!r}" for f, v in zip(fields, self, strict=True))
        return f"{type(self).__name__}({shown})"

    namespace: dict[str, Any] = {
        "__slots__": (), "_fields": fields, "_field_defaults": dict(defaults),
        "__match_args__": fields, "__new__": __new__, "_make": classmethod(_make),
        "_replace": _replace, "__repr__": __repr__,
        "_asdict": lambda self: dict(zip(fields, self, strict=True)),
        "__getnewargs__": lambda self: tuple(self),
    }
    for index, field in enumerate(fields):
        namespace[field] = _tuplegetter(index, f"Alias for field number {index}")
    namespace.update(body)
    return type(name, (tuple,), namespace)


class _NamedTupleMeta(type):
    def __new__(mcls, name: str, bases: tuple[type, ...], namespace: dict[str, object]
                ) -> type:
        annotations = dict(namespace.get("__annotations__", {}))  # type: ignore[call-overload]
        fields = tuple(annotations)
        defaults = {field: namespace[field] for field in fields if field in namespace}
        if list(fields[len(fields) - len(defaults):]) != list(defaults):
            raise TypeError(f"{name}: a field without a default follows one with a default")
        body = {key: value for key, value in namespace.items()
                if key not in _RESERVED and key not in fields}
        created = _tuple_class(name, fields, defaults, body)
        created.__module__ = str(namespace.get("__module__", __name__))
        created.__qualname__ = str(namespace.get("__qualname__", name))
        created.__annotations__ = annotations
        return created


_NamedTupleBase = type.__new__(_NamedTupleMeta, "NamedTuple", (), {})


class _NamedTupleBaseEntry:
    """What `class X(NamedTuple)` names: its base becomes one whose metaclass builds X (as
    `typing.NamedTuple` does it, through `__mro_entries__`)."""

    def __mro_entries__(self, bases: tuple[object, ...]) -> tuple[type]:
        return (_NamedTupleBase,)


NamedTuple = _NamedTupleBaseEntry()


class _Memoized:
    """A function's results by its arguments (hashable, positional or by keyword), with
    `cache_clear()`: `functools.cache` without importing `functools`, for the functions a
    session's first process calls (the specs, the runtimes' layouts). Unbounded, as
    `functools.cache`: each memoized function takes a handful of distinct arguments."""

    def __init__(self, function: Callable[..., Any]) -> None:
        self._function = function
        self._results: dict[Any, Any] = {}
        self.__wrapped__ = function
        self.__doc__ = function.__doc__
        self.__name__ = function.__name__
        self.__qualname__ = function.__qualname__

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        key = (args, tuple(kwargs.items())) if kwargs else args
        try:
            return self._results[key]
        except KeyError:
            pass
        result = self._results[key] = self._function(*args, **kwargs)
        return result

    def cache_clear(self) -> None:
        self._results.clear()


class PausedCollector:
    """`with PausedCollector():` Python's cycle collector off for the block, then as it was.

    For cacheaudit's own bursts of work whose objects survive them: a batch of ledger rows and
    the ids interned for it, the modules a `pytest --cacheaudit` session imports at its start
    and its end. The collections they would set off walk the user's whole heap and free
    nothing of ours; with the collector paused, the block adds at most one young collection
    (its allocations are still counted, and the next allocation after it collects).
    Measured: a 200-test session without it ran three full collections where pytest alone ran
    two, +20-30 ms of the session's +50 ms."""

    __slots__ = ("_was_enabled",)

    def __enter__(self) -> None:
        import gc  # built in: no file read

        self._was_enabled = gc.isenabled()
        gc.disable()

    def __exit__(self, *exc: object) -> None:
        if self._was_enabled:
            import gc

            gc.enable()


def import_module(name: str) -> Any:
    """`importlib.import_module(name)` for an absolute name, without importing `importlib`
    (and its `warnings`)."""
    __import__(name)
    return sys.modules[name]


if not TYPE_CHECKING:  # checkers read `functools.cache`, whose signature this one has
    memoized = _Memoized


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
