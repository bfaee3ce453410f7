"""Runtime specs: what a runtime package declares about itself, as plain data.

Each package under `cacheaudit/runtimes/` has a `spec.py` with one `SPEC = RuntimeSpec(...)`:
its name, where its cache lives, which variables pick its compiler, which packages a snapshot
reports, its docs page, and which of its modules hold the layout reader, the policy and the
adapter. The registry (`cacheaudit.runtimes`) lists the packages and loads the modules a spec
names only when they are asked for, so reading every spec costs a start-up hook almost nothing:
this module and the specs import nothing beyond the standard library.

The core (the environment registry, sessions, the snapshot, the audit, the CLI) learns about a
runtime only through these fields; none of it names a runtime.
"""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass(frozen=True)
class CompilerSetting:
    """An environment variable through which a runtime is told which compiler to run.

    A recording session points it at the shim when `session_fills` is set and the user left it
    unset (the runtime would otherwise find the real compiler on its own, bypassing the shim);
    never while one of `unless_set` is set, since the runtime then follows that one (DeepGEMM
    2.8 falls back to `DJ_JIT_NVCC_COMPILER`).
    """

    name: str
    compiler: str = "nvcc"
    """The compiler kind the variable names, as the shim's stand-in name ("nvcc", "g++")."""
    session_fills: bool = False
    unless_set: tuple[str, ...] = ()


@dataclass(frozen=True)
class RuntimeSpec:
    """One runtime, as the registry and the core see it."""

    name: str
    """The runtime id written into records, entries and findings ("deepjit", "torch-ext")."""
    title: str
    """How a person names it ("DeepJIT", "torch.utils.cpp_extension")."""
    package: str = ""
    """The dotted name of the runtime's package (set by the registry)."""
    layout: str | None = None
    """Module of the package (or a dotted path) whose `LAYOUT` reads this runtime's cache."""
    policy: str | None = None
    """Module of the package (or a dotted path) whose `POLICIES[name]` judges its entries."""
    adapter: str | None = None
    """Module of the package whose `ADAPTER` hooks the runtime in-process."""
    adapter_imports: str | None = None
    """The runtime's module whose first import arms the adapter ("triton")."""
    cache_variables: tuple[str, ...] = ()
    """Variables that name the runtime's cache roots, for messages and the snapshot."""
    compiler_settings: tuple[CompilerSetting, ...] = ()
    packages: tuple[str, ...] = ()
    """Distribution names a snapshot reports the version of."""
    snapshot: str | None = None
    """Module of the package whose `compilers(env, timeout)` adds the runtime's own tools
    (Triton's ptxas, NVRTC) to a snapshot."""
    environment: str | None = None
    """Module of the package that declares the runtime's environment to the registry
    (`cacheaudit.runtimes.environment`): `ROWS`, the variables it defines
    (`cacheaudit.envvars.variable`) and its readings of generic ones (`reads`), each with its
    source; optional `FAMILIES` (`cacheaudit.envvars.Family`: names read by pattern) and
    `CATEGORIES` (categories of its own, which change output)."""
    variants: tuple[str, ...] = ()
    """Variants the environment rows may name as "runtime:variant" ("rocm", "nvrtc")."""
    docs: str = ""
    """Its page, relative to the repository's docs/ ("runtimes/deepjit.md")."""
    notes: tuple[str, ...] = field(default_factory=tuple)

    def module(self, name: str) -> str:
        """The dotted module path of one of the spec's module fields."""
        return name if "." in name else f"{self.package}.{name}"
