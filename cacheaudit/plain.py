"""`NamedTuple` without `typing`: the class syntax of `typing.NamedTuple` (fields annotated in the
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
