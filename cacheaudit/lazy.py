"""Packages whose public names load from their modules on first use (PEP 562).

`cacheaudit.ledger` and `cacheaudit.audit` re-export names from a dozen modules each; importing
them all up front costs a process that needs one value (the start-up hook, a session that
compiled nothing, the shim before its dependency pass) tens of milliseconds. `export_lazily`
keeps `from package import Name` and `package.Name` working: the module that holds a name is
imported when the name is first asked for. Standard library only (`sys`), no `typing`.
"""

from __future__ import annotations

import sys

from cacheaudit.plain import import_module

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Mapping

_ModuleType = type(sys)


class _LazyPackage(_ModuleType):  # type: ignore[misc,valid-type]
    """A package of `export_lazily`: importing its submodule `combine` leaves the package's
    `combine` the function that the submodule defines (as an eager `from .combine import
    combine` did), not the submodule that the import system sets as the package's attribute."""

    def __setattr__(self, name: str, value: object) -> None:
        homes = self.__dict__.get("_lazy_homes", {})
        if (isinstance(value, _ModuleType) and homes.get(name) == name
                and value.__name__ == f"{self.__name__}.{name}"):
            value = getattr(value, name)
        super().__setattr__(name, value)


def export_lazily(package: str, homes: Mapping[str, str]) -> None:
    """Serve each of `homes` (public name -> the submodule of `package` that defines it) from
    that submodule, imported on the name's first use."""
    module = sys.modules[package]
    namespace = vars(module)

    def __getattr__(name: str) -> object:
        home = homes.get(name)
        if home is None:
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        value = getattr(import_module(f"{package}.{home}"), name)
        namespace[name] = value
        return value

    def __dir__() -> list[str]:
        return sorted({*namespace, *homes})

    namespace.update(_lazy_homes=dict(homes), __getattr__=__getattr__, __dir__=__dir__)
    module.__class__ = _LazyPackage
