"""Argv parsing: what a compiler command line does, read from its effective argv.

`parse_command` finds the sources, the other inputs, the output, the include directories, the
forced includes and the intent (a compile, a link, a query or a listing to stdout);
`output_paths` the files the command writes, the drivers' default names included;
`ParsedCommand.dependency_argv` the same command as the compiler's own dependency pass
(`dependency`).
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from dataclasses import dataclass

from cacheaudit.compilers.dependency import dependency_argv
from cacheaudit.compilers.options import ArgUnit, split_units

__all__ = ["ParsedCommand", "output_paths", "parse_command"]

_SOURCE_SUFFIXES = frozenset({
    ".c", ".cc", ".cp", ".cpp", ".cxx", ".c++", ".C", ".CPP", ".CC", ".cu", ".m", ".mm", ".M",
    ".i", ".ii", ".mi", ".mii", ".s", ".S", ".sx", ".hip",
})
_NVCC_LANGUAGES = frozenset({"c", "c++", "cu"})

_GCC_QUERIES = ("--version", "-dumpversion", "-dumpfullversion", "-dumpmachine", "-dumpspecs",
                "--help", "-###", "--target-help", "-fsyntax-only")
_GCC_QUERY_PREFIXES = ("-print-", "--print-", "--help=")
_NVCC_QUERIES = frozenset({"--version", "--help", "--dryrun", "--list-gpu-code",
                           "--list-gpu-arch"})

_INCLUDE_OPTIONS = {"-I": "-I", "-isystem": "-isystem", "-iquote": "-iquote",
                    "-idirafter": "-idirafter", "--include-path": "-I",
                    "--system-include": "-isystem", "-cxx-isystem": "-isystem",
                    "-isystem-after": "-idirafter"}


# Options naming a file the preprocessor reads before the source, by their canonical names.
_FORCED_INCLUDE_OPTIONS = ("-include", "-imacros", "-include-pch")


def _forced_includes(kind: str, units: Sequence[ArgUnit]) -> list[tuple[str, str]]:
    """(option, file) of every forced include `units` name, with those in the words passed on
    to the host compiler (nvcc `-Xcompiler`) or the preprocessor (`-Wp,`, `-Xpreprocessor`),
    which are read as a gcc command of their own."""
    found: list[tuple[str, str]] = []
    passed_on: list[str] = []
    for unit in units:
        name = unit.name
        if name is None:
            continue
        if kind == "nvcc":
            if name == "--pre-include":
                found.extend(("-include", v) for v in _nvcc_values(unit))
            elif name == "--compiler-options":
                passed_on.extend(_nvcc_values(unit))
        elif name in _FORCED_INCLUDE_OPTIONS and unit.value is not None:
            found.append((name, unit.value))
        elif name.startswith("-Wp,"):
            passed_on.extend(part for part in name[4:].split(",") if part)
        elif name == "-Xpreprocessor" and unit.value is not None:
            passed_on.append(unit.value)
    if passed_on:
        found.extend(_forced_includes("gcc", split_units("gcc", passed_on)))
    return found


def _is_source_name(path: str) -> bool:
    return os.path.splitext(path)[1] in _SOURCE_SUFFIXES


def _nvcc_values(unit: ArgUnit) -> list[str]:
    """nvcc splits list-valued options on commas (`-I/a,/b` is two directories, measured)."""
    return [v for v in (unit.value or "").split(",") if v]


@dataclass(frozen=True)
class ParsedCommand:
    """What a compiler command line does, read from its effective argv."""

    kind: str
    tokens: tuple[str, ...]
    units: tuple[ArgUnit, ...]
    sources: tuple[str, ...]
    objects: tuple[str, ...]
    output: str | None
    include_dirs: tuple[tuple[str, str], ...]
    is_compile: bool
    queries: tuple[str, ...] = ()
    forced_includes: tuple[tuple[str, str], ...] = ()
    """(option, file) of each file the preprocessor reads before the source: `-include`,
    `-imacros`, clang's `-include-pch`, nvcc's `--pre-include`, also where `-Xcompiler`,
    `-Wp,` or `-Xpreprocessor` pass them on; the file as written."""

    @property
    def is_link(self) -> bool:
        """Inputs but no compile phase switch and no query: the driver links them."""
        if self.queries or not (self.sources or self.objects):
            return False
        return not (self._names() & _PHASE_NAMES)

    @property
    def records(self) -> bool:
        """Whether the shim should record this command: a compile or a link, not a query."""
        return self.is_compile or self.is_link

    def _names(self) -> set[str]:
        return {u.name for u in self.units if u.name is not None}

    def has(self, name: str) -> bool:
        return name in self._names()

    def value_of(self, name: str) -> str | None:
        """The last value of an option (nvcc: last wins, with a warning; gcc: last wins)."""
        values = [u.value for u in self.units if u.name == name and u.value is not None]
        return values[-1] if values else None

    def dependency_argv(self, depfile: str) -> list[str]:
        """Arguments (without argv[0]) for the compiler's own `-M` pass with the same flags.

        Output, phase and dependency options go (`-o`, `-c`, `-S`, `-E`, `-M*`; for nvcc also
        `-cubin`, `-ptx`, `-fatbin`, `-lib`, `-link`, `-dlink`, `-odir`, the long spellings,
        and options that write side files: `-keep`, `-keep-dir`, `-save-temps`, `-time`,
        `-fdevice-time-trace`, `-run`); `-dc`/`-dw` become `-rdc=true`/`-rdc=false`; link
        inputs (objects) go; everything else stays in order; `-M -MF <depfile>` is appended.
        `-M` (not `-MM`) so that system headers are listed too.
        """
        return dependency_argv(self, depfile)


_PHASE_NAMES = frozenset({
    "-c", "-S", "-E", "-M", "-MM", "--compile", "--preprocess", "--cubin", "--ptx", "--fatbin",
    "--cuda", "--optix-ir", "--ltoir", "--lib", "--device-c", "--device-w",
    "--generate-dependencies", "--generate-nonsystem-dependencies", "-fsyntax-only",
})


def parse_command(kind: str, tokens: Sequence[str]) -> ParsedCommand:
    """Sources, other inputs, output, include directories, forced includes and intent of a
    command line.

    `tokens` are the effective argv texts. Sources are positional inputs with a source suffix,
    or any positional after `-x LANG` (gcc/clang: from there on until `-x none`; nvcc: `-x` with
    c, c++ or cu applies to every input). Headers are not sources. A command is a compile when it
    has a source and is no query (`--version`, `-dumpversion`, `-dumpmachine`, `-print-*`,
    `--help`, `-###`, `-fsyntax-only`, nvcc `-dryrun`, `-V`, `-h`, `-code-ls`, `-arch-ls`) and
    not a preprocess or dependency listing to stdout or a depfile (`-E` without `-o`, `-M`, `-MM`).
    """
    tokens = tuple(tokens)
    units = split_units(kind, tokens)
    sources: list[str] = []
    objects: list[str] = []
    includes: list[tuple[str, str]] = []
    queries: list[str] = []
    output: str | None = None
    language: str | None = None
    nvcc_language = None
    if kind == "nvcc":
        for unit in units:
            if unit.name == "--x" and unit.value in _NVCC_LANGUAGES:
                nvcc_language = unit.value
    for unit in units:
        name = unit.name
        if name is None:
            value = unit.value or ""
            if nvcc_language or (language and language != "none") or _is_source_name(value):
                sources.append(value)
            else:
                objects.append(value)
            continue
        if kind == "nvcc":
            if name in _NVCC_QUERIES:
                queries.append(unit.tokens[0])
            elif name == "--output-file":
                output = unit.value
            elif name in _INCLUDE_OPTIONS:
                includes.extend((_INCLUDE_OPTIONS[name], v) for v in _nvcc_values(unit))
            continue
        if name in _GCC_QUERIES or name.startswith(_GCC_QUERY_PREFIXES):
            queries.append(unit.tokens[0])
        elif name == "-o":
            output = unit.value
        elif name == "-x":
            language = unit.value
        elif name in _INCLUDE_OPTIONS and unit.value is not None:
            includes.append((_INCLUDE_OPTIONS[name], unit.value))
    names = {u.name for u in units}
    listing_only = (("--generate-dependencies" in names or "--generate-nonsystem-dependencies"
                     in names or "-M" in names or "-MM" in names)
                    or (("-E" in names or "--preprocess" in names) and output is None))
    is_compile = bool(sources) and not queries and not listing_only
    return ParsedCommand(kind=kind, tokens=tokens, units=tuple(units), sources=tuple(sources),
                         objects=tuple(objects), output=output, include_dirs=tuple(includes),
                         is_compile=is_compile, queries=tuple(queries),
                         forced_includes=tuple(_forced_includes(kind, units)))


_NVCC_DEFAULT_SUFFIX = (("--cubin", ".cubin"), ("--ptx", ".ptx"), ("--fatbin", ".fatbin"),
                        ("--optix-ir", ".optixir"), ("--ltoir", ".ltoir"), ("--compile", ".o"),
                        ("--device-c", ".o"), ("--device-w", ".o"), ("--cuda", ".cu.cpp.ii"))


def output_paths(kind: str, command: ParsedCommand, cwd: str) -> list[str]:
    """Absolute paths of the files the command writes: the output and a `-MD` depfile.

    Without `-o` the drivers' defaults apply (measured for nvcc 13.0 with `-dryrun`):
    `-c` -> `<stem>.o` per source; gcc `-S` -> `<stem>.s`; nvcc `-cubin`/`-ptx`/`-fatbin`/
    `-optix-ir` -> `<stem>.<ext>` (under `-odir` if given); `-lib` -> `a.a`; `-dlink` ->
    `a_dlink.o`; a link -> `a.out`;
    `-E` and queries -> nothing (stdout).
    """
    if not command.records:
        return []
    out: list[str] = []
    stems = [os.path.splitext(os.path.basename(s))[0] for s in command.sources]
    if command.output is not None:
        out.append(command.output)
    elif kind == "nvcc":
        odir = command.value_of("--output-directory") or ""
        for name, suffix in _NVCC_DEFAULT_SUFFIX:
            if command.has(name):
                out.extend(os.path.join(odir, stem + suffix) for stem in stems)
                break
        else:
            if command.has("--lib"):
                out.append("a.a")
            elif command.has("--device-link"):
                out.append("a_dlink.o")
            elif command.has("--preprocess") or command.queries:
                pass
            elif command.is_link or command.is_compile:
                out.append("a.out")
    elif command.has("-c"):
        out.extend(stem + ".o" for stem in stems)
    elif command.has("-S"):
        out.extend(stem + ".s" for stem in stems)
    elif command.is_link:
        out.append("a.out")
    md_names = (("--generate-dependencies-with-compile",
                 "--generate-nonsystem-dependencies-with-compile") if kind == "nvcc"
                else ("-MD", "-MMD"))
    if any(command.has(n) for n in md_names):
        depfile = command.value_of("--dependency-output" if kind == "nvcc" else "-MF")
        if depfile is None:
            base = command.output if command.output is not None else (
                stems[0] if stems else None)
            if base is not None:
                depfile = os.path.splitext(base)[0] + ".d"
        if depfile is not None and depfile != "-":
            out.append(depfile)
    return [os.path.abspath(os.path.join(cwd, p)) for p in out]
