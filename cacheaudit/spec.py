"""Runtime specs: what a runtime package declares about itself, as plain data.

Each package under `cacheaudit/runtimes/` has a `spec.py` with one `SPEC = RuntimeSpec(...)`:
its name, where its cache lives, which variables pick its compiler, which packages a snapshot
reports, its docs page, and which of its modules hold the layout reader, the policy and the
adapter. `BUILT_IN` below is the one list of runtimes, a line each; `specs()` reads them (and
any named in `CACHEAUDIT_RUNTIMES`) by name. `cacheaudit.runtimes` loads the modules a spec names
only when they are asked for, so reading every spec costs a start-up hook almost nothing: this
module and the specs import nothing beyond the standard library. A built-in spec module also
holds the runtime's default cache roots (`default_roots(env)`, below its `SPEC`, standard
library only): one module a runtime is all a session's first process reads of it.

The core (the environment registry, sessions, the snapshot, the audit, the CLI) learns about a
runtime only through these fields; none of it names a runtime. A spec is data read by name, not
code the core calls: the layering (docs/design.md) holds although the core reads the specs.
"""

from __future__ import annotations

import os

from cacheaudit.plain import import_module, memoized

TYPE_CHECKING = False
if TYPE_CHECKING:
    import re
    from typing import NamedTuple
else:
    from cacheaudit.plain import NamedTuple  # `typing` would cost every session's start

CUDA_TOOLKIT_NVCC = ("$CUDA_HOME/bin/nvcc", "$CUDA_PATH/bin/nvcc", "nvcc",
                     "/usr/local/cuda/bin/nvcc")
"""Where a runtime finds nvcc when nothing names it: the CUDA home (`CUDA_HOME`, else
`CUDA_PATH`), else `which nvcc`, else /usr/local/cuda; the order of torch's `_find_cuda_home`,
DeepJIT's `CUDA::find_cuda_toolkit` and DeepGEMM's `_find_cuda_home`."""

KIND_DEFAULTS: dict[str, tuple[str, ...]] = {"nvcc": CUDA_TOOLKIT_NVCC}
"""A compiler kind's usual place, for settings that declare no `default`; any other kind is its
own name on PATH."""


class CompilerSetting(NamedTuple):
    """An environment variable through which a runtime is told which compiler to run.

    A recording session points it at the shim when `session_fills` is set and the user left it
    unset (the runtime would otherwise find the real compiler on its own, bypassing the shim);
    never while one of `unless_set` is set, since the runtime then follows that one (DeepGEMM
    2.8 falls back to `DJ_JIT_NVCC_COMPILER`).

    A setting with a `pattern` stands for every variable whose name fits it (DeepJIT's
    `<P>_JIT_NVCC_COMPILER`, for whatever prefix P a library built on it chose); `name` then
    only says how people read it ("<P>_JIT_NVCC_COMPILER") and is never looked up.
    """

    name: str
    compiler: str = "nvcc"
    """The compiler kind the variable names, as the shim's stand-in name ("nvcc", "g++")."""
    session_fills: bool = False
    unless_set: tuple[str, ...] = ()
    default: tuple[str, ...] | None = None
    """Where the runtime looks for its compiler while the setting is unset, in order; what a
    filled-in setting hands over to, worked out by the shim at each compile in the compile's
    own environment (a job that sets CUDA_HOME itself keeps its toolkit). `$VAR/rest` is taken
    when VAR is set and not empty, whether or not the file exists (the runtimes do the same); a
    bare name is looked up on PATH past the masquerade directories; an absolute path is taken
    when it exists. None: the kind's usual place (`KIND_DEFAULTS`), else its name on PATH."""
    path_in_key_if: tuple[str, str] = ()
    """(package, file): when the package the job would import holds this file, the runtime
    installed keys the compiler's path (DeepGEMM's Python JIT), so no stand-in can be invisible
    to its key: the session leaves the setting as the user had it, and the runtime's adapter
    records in-process. Empty: the key never holds the path."""

    pattern: str | None = None
    """A regular expression the whole variable name must match, for a family of settings the
    runtime reads under names nobody can list (`<P>_JIT_NVCC_COMPILER` for any P). A session
    points each such variable that is set at the shim, handing over to exactly what it names;
    it never fills one in (`session_fills` does not apply: no session can know which names
    the runtime will read), and a variable another setting declares by name is that
    setting's. None (the default): the setting is the one variable `name`."""

    def matches(self, variable: str) -> bool:
        """Whether `variable` is this setting: its `name`, or a name fitting its `pattern`."""
        if self.pattern is None:
            return variable == self.name
        if not variable.endswith(literal_tail(self.pattern)):
            return False  # what the pattern's last characters spell, without compiling it
        return _compiled(self.pattern).fullmatch(variable) is not None

    def lookup(self) -> tuple[str, ...]:
        """`default`, or the kind's usual place."""
        if self.default is not None:
            return self.default
        return KIND_DEFAULTS.get(self.compiler, (self.compiler,))


_REGEX_SPECIAL = frozenset(".^$*+?{}[]\\|()")


@memoized
def literal_tail(pattern: str) -> str:
    """The characters every name that fully matches `pattern` ends with, found without `re`
    (which a session's first process would otherwise import to match each variable of its
    environment against DeepJIT's `<P>_JIT_NVCC_COMPILER`): the pattern's last characters up to
    its last special one. Empty, which proves nothing, for a pattern with an alternative, an
    escape or an inline flag anywhere in it."""
    if "|" in pattern or "\\" in pattern or "(?" in pattern:
        return ""
    start = len(pattern)
    while start > 0 and pattern[start - 1] not in _REGEX_SPECIAL:
        start -= 1
    return pattern[start:]


@memoized
def _compiled(pattern: str) -> re.Pattern[str]:
    import re  # only for a pattern setting matched: most sessions set no such variable

    return re.compile(pattern)


class RuntimeSpec(NamedTuple):
    """One runtime, as the registry and the core see it. (Named tuples, not dataclasses: the
    start-up hook reads every spec, and `dataclasses` would cost each Python process of a
    session its imports of `inspect` and `ast`.)"""

    name: str
    """The runtime id written into records, entries and findings ("deepjit", "torch-ext")."""
    title: str
    """How a person names it ("DeepJIT", "torch.utils.cpp_extension")."""
    package: str = ""
    """The dotted name of the runtime's package (set by the registry)."""
    layout: str | None = None
    """Module of the package (or a dotted path) whose `LAYOUT` reads this runtime's cache."""
    roots: str | None = None
    """Module of the package (or a dotted path) whose `default_roots(env)` lists the cache roots
    the runtime uses under an environment, existing or not, in lookup order: what the layout's
    `default_roots` returns, in a module of the standard library only, so that a session knows
    the roots to watch without loading a reader (`cacheaudit.runtimes.default_roots`). The
    built-in runtimes name their spec module itself ("spec"). None: the layout's
    `default_roots` (a reader loaded for it)."""
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
    (`cacheaudit.envvars.registry`): `ROWS`, the variables it defines
    (`cacheaudit.envvars.variable`) and its readings of generic ones (`reads`), each with its
    source; optional `FAMILIES` (`cacheaudit.envvars.Family`: names read by pattern) and
    `CATEGORIES` (categories of its own, which change output)."""
    variants: tuple[str, ...] = ()
    """Variants the environment rows may name as "runtime:variant" ("rocm", "nvrtc")."""
    docs: str = ""
    """Its page, relative to the repository's docs/ ("runtimes/deepjit.md")."""

    def module(self, name: str) -> str:
        """The dotted module path of one of the spec's module fields."""
        return name if "." in name else f"{self.package}.{name}"


# ------------------------------------------------------------------------------ the registry

# One line per runtime: its package under cacheaudit/runtimes/.
BUILT_IN = (
    "deepjit",     # deepseek-ai/DeepJIT, and DeepGEMM 2.8+ / DeepEP-Ascend built on it
    "deepgemm",    # DeepGEMM up to 2.6 (C++ JIT) and its 2025 Python JIT
    "deepep",      # DeepEP's EPv2 JIT (DeepGEMM's recipe)
    "torch_ext",   # torch.utils.cpp_extension load / load_inline
    "triton",
    "nvrtc",       # NVRTC through cuda-python
    "cuda_core",   # cuda.core Program and its program cache
    "cupy",
    "flashinfer",
    "inductor",    # torch.compile's Inductor: FX graph, AOTAutograd and C++ kernel caches
)

EXTRA_VARIABLE = "CACHEAUDIT_RUNTIMES"
"""Runtimes outside cacheaudit (a plugin, a toy runtime in tests): dotted package paths separated
by ":", each read like a built-in one."""


def _package_names() -> list[str]:
    extra = [name for name in os.environ.get(EXTRA_VARIABLE, "").split(":") if name]
    return list(dict.fromkeys([f"cacheaudit.runtimes.{name}" for name in BUILT_IN] + extra))


@memoized
def specs() -> tuple[RuntimeSpec, ...]:
    """Every runtime's spec, built-in ones first, in registry order. A spec module is plain
    data (it imports this module and nothing else of cacheaudit), read by name.

    Fails open: a package named in `CACHEAUDIT_RUNTIMES` that cannot be read (a typo, a plugin
    that is not installed in this environment, a spec that raises) is left out, said once on
    stderr, and every other runtime keeps working; so is a second spec claiming a runtime id
    already taken."""
    found: dict[str, RuntimeSpec] = {}
    for package in _package_names():
        try:
            declared = import_module(f"{package}.spec").SPEC
            if not isinstance(declared, RuntimeSpec):
                raise TypeError(f"SPEC is a {type(declared).__name__}, not a RuntimeSpec")
        except Exception as exc:  # noqa: BLE001 - one bad plugin never stops cacheaudit
            _left_out(package, f"{type(exc).__name__}: {exc}")
            continue
        if declared.name in found:
            _left_out(package, f"runtime {declared.name!r} is already declared by "
                               f"{found[declared.name].package}")
            continue
        found[declared.name] = declared._replace(package=package)
    return tuple(found.values())


def _left_out(package: str, why: str) -> None:
    from cacheaudit.problems import report_problem

    report_problem(f"{EXTRA_VARIABLE}: runtime package {package!r} left out: {why}", prefix="")


def spec(runtime: str) -> RuntimeSpec | None:
    """The spec of the runtime with this id, None for a runtime nobody declared."""
    return by_name().get(runtime)


@memoized
def by_name() -> dict[str, RuntimeSpec]:
    return {s.name: s for s in specs()}


def names() -> list[str]:
    return [s.name for s in specs()]
