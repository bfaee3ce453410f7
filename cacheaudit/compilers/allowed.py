"""Which options of a command cacheaudit did not write may reach a compiler it runs.

A scan reconstructs an entry built before recording by running the compiler's dependency pass
over the entry's own command (DeepJIT's `meta.json`), and the rebuild oracle runs a command
again; a command read from a cache, or from a ledger record this user did not seal, is data
someone else wrote. The compiler is always one the user's configuration resolves
(`cacheaudit.audit.execution`); the options are screened here, by kind, against an allowlist
of families that change what is compiled but never which program runs:

- defines and undefines, include directories and forced includes, `-std`, `-x`, `-O` levels,
  debug levels, machine and architecture options (`-m...`, nvcc's `-arch`/`-code`/`-gencode`),
  language and feature flags (`-f...`) and warnings (`-W...`), phase and output options (the
  dependency pass replaces them), nvcc's numeric and diagnostic options;
- options for programs a dependency pass never starts (assembler, linker, ptxas, nvlink) are
  left out of it (`purpose="dependency"`), and checked for a compile (`purpose="compile"`:
  linker options from a small allowlist of their own, since a linker loads plugins);
- options that pick programs (`-B`, `-wrapper`, `-fplugin`, `-specs`, `--ld-path`, `-fuse-ld`,
  `-no-integrated-cpp`, `-Xclang`, nvcc's `-arbin`, `--run`, ...) are refused, whether given
  directly or inside `-Xcompiler`, `-Wp,` or `-Xpreprocessor`; nvcc's host compiler
  (`-ccbin`/`--compiler-bindir`) is handed back to the caller, which accepts it only when it
  names the host compiler the user's configuration resolves anyway;
- anything else is refused as unknown: an allowlist, so that a new option that runs a program
  is refused before anyone knows it does.

Response files and `-optf` files are expanded by the caller before screening, so that what is
screened is what runs. Pure: nothing here reads a file or runs a program.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass

from cacheaudit.compilers.options import ArgUnit, split_units

__all__ = ["Screened", "screen_options"]


@dataclass(frozen=True)
class Screened:
    """What may be passed on of a command's options (after argv[0])."""

    args: tuple[str, ...]
    """The options kept, in order; nvcc's host compiler is not among them."""
    host_compilers: tuple[str, ...] = ()
    """nvcc's `-ccbin`/`--compiler-bindir` values, for the caller to match against the user's
    configuration (and to pass on as the program it resolves)."""
    dropped: tuple[str, ...] = ()
    """Options left out because the pass never starts the program they are for."""
    refused: tuple[str, str] | None = None
    """(the option as written, why) of the first option refused; None when none is."""


# gcc/clang: options whose value or presence changes what is compiled, never which program runs.
_GCC_VALUE_KEPT = frozenset({
    "-D", "-U", "-I", "-isystem", "-iquote", "-idirafter", "-include", "-imacros", "-iprefix",
    "-iwithprefix", "-iwithprefixbefore", "-isysroot", "--sysroot", "-cxx-isystem",
    "-isystem-after", "-x", "-o", "-MF", "-MT", "-MQ", "--param", "-A", "-L", "-l", "-u",
    "-imultilib", "-imultiarch",
})
_GCC_FLAGS_KEPT = frozenset({
    "-c", "-S", "-E", "-M", "-MM", "-MD", "-MMD", "-MP", "-MG", "-I-", "-shared", "-static",
    "-rdynamic", "-pthread", "-pthreads", "-pedantic", "-pedantic-errors", "-ansi", "-w",
    "-pipe", "-undef", "-trigraphs", "-C", "-CC", "-P", "-H", "-nostdinc", "-nostdinc++",
    "-nostdlibinc", "-nostdlib", "-nodefaultlibs", "-nostartfiles", "-s", "-pie", "-no-pie",
    "-static-libgcc", "-static-libstdc++", "-shared-libgcc", "-v", "-Qunused-arguments",
    "-nocudainc", "-nocudalib", "--cuda-host-only", "--cuda-device-only", "-dD", "-dI", "-dN",
    "-save-temps", "-fsyntax-only",
})
_GCC_PREFIXES_KEPT = ("-std=", "-O", "-g", "-f", "-W", "-m", "-stdlib=", "--std=",
                      "--cuda-gpu-arch=", "--offload-arch=", "--target=", "-save-temps=",
                      "-march=", "-mtune=", "-MD", "-MMD")
# Within the kept prefixes: what picks a program (or loads code into one).
_GCC_PICKS = ("-B", "--prefix", "-wrapper", "-fplugin", "-fpass-plugin", "-specs", "--specs",
              "--ld-path", "-fuse-ld", "-no-integrated-cpp", "-Xclang", "-gcc-toolchain",
              "--gcc-toolchain", "--cuda-path", "-mllvm", "-fcompare-debug", "-iplugindir",
              "--rtlib", "-rtlib", "-ccc-", "--hip-path", "--rocm-path", "-fload-pass")
# Options passed to the assembler and the linker: a dependency pass starts neither.
_GCC_DOWNSTREAM = ("-Wa,", "-Wl,", "-Xlinker", "-Xassembler", "-Xoffload-linker",
                   "-Xcuda-ptxas", "-Xcuda-fatbinary")
# Linker options a compile may carry: none loads a plugin or picks a program.
_LINKER_KEPT = re.compile(
    r"^(-rpath(=.*)?|--?rpath-link(=.*)?|-soname(=.*)?|-h|-z|[a-z]+(=.*)?|--?no-undefined|"
    r"--?as-needed|--?no-as-needed|-O\d?|--?gc-sections|--?build-id(=.*)?|-Bsymbolic(-functions)?|"
    r"--?export-dynamic|-E|-s|--?strip-(all|debug)|--?hash-style=\w+|--?enable-new-dtags|"
    r"--?disable-new-dtags|--?whole-archive|--?no-whole-archive|--?start-group|--?end-group|"
    r"--?version-script=.*|-L.*|-l.*|/.*|[^-].*)$")


def _gcc_option(unit: ArgUnit, purpose: str) -> tuple[str, str | None]:
    """("keep" | "drop" | "refuse", why) for one gcc/clang unit."""
    name = unit.name
    assert name is not None
    text = " ".join(unit.tokens)
    if any(name == p or name.startswith(p) for p in _GCC_PICKS if p != "-B") or \
            name.startswith("-B") or name == "-fuse-ld":
        return "refuse", "it picks a program for the compiler to run (or loads one into it)"
    if name.startswith("-Wp,") or name == "-Xpreprocessor":
        parts = name[4:].split(",") if name.startswith("-Wp,") else [unit.value or ""]
        for part in parts:
            inner = split_units("gcc", [part])
            if not inner or inner[0].name is None:
                continue
            verdict, why = _gcc_option(inner[0], purpose)
            if verdict == "refuse":
                return "refuse", f"it passes {part} to the preprocessor: {why}"
        return "keep", None
    if name.startswith(_GCC_DOWNSTREAM) or name in _GCC_DOWNSTREAM:
        if purpose == "dependency":
            return "drop", None
        if name.startswith("-Wa,") or name in ("-Xassembler", "-Xcuda-ptxas",
                                               "-Xcuda-fatbinary"):
            return "keep", None
        parts = name[4:].split(",") if name.startswith("-Wl,") else [unit.value or ""]
        for part in parts:
            if not _LINKER_KEPT.match(part) or "plugin" in part:
                return "refuse", (f"it passes {part} to the linker, which is not an option "
                                  "cacheaudit passes on (a linker loads plugins)")
        return "keep", None
    if name in _GCC_VALUE_KEPT or name in _GCC_FLAGS_KEPT:
        return "keep", None
    if name.startswith(_GCC_PREFIXES_KEPT) and re.fullmatch(r"-[-A-Za-z0-9_=+.,:/@ ]*", text):
        return "keep", None
    if name.startswith("@"):
        return "refuse", "a response file that cannot be read as part of the command"
    return "refuse", "not an option of the families cacheaudit passes on (an allowlist)"


# nvcc: canonical (long) names kept, with or without a value.
_NVCC_KEPT = frozenset({
    "--output-file", "--compile", "--cubin", "--ptx", "--fatbin", "--cuda", "--preprocess",
    "--device-c", "--device-w", "--optix-ir", "--ltoir", "--generate-dependencies",
    "--generate-nonsystem-dependencies", "--generate-dependencies-with-compile",
    "--generate-nonsystem-dependencies-with-compile", "--dependency-output",
    "--dependency-target-name", "--generate-dependency-targets", "--define-macro",
    "--undefine-macro", "--include-path", "--system-include", "--pre-include", "--std", "--x",
    "--optimize", "--dopt", "--gpu-architecture", "--gpu-code", "--generate-code",
    "--relocatable-device-code", "--maxrregcount", "--ftz", "--prec-div", "--prec-sqrt",
    "--fmad", "--use_fast_math", "--default-stream", "--debug", "--device-debug",
    "--generate-line-info", "--machine", "--m64", "--threads", "--split-compile",
    "--split-compile-extended", "--Werror", "--diag-error", "--diag-suppress", "--diag-warn",
    "--disable-warnings", "--verbose", "--ftemplate-backtrace-limit", "--ftemplate-depth",
    "--static-global-template-stub", "--device-entity-has-hidden-visibility", "--keep",
    "--keep-dir", "--save-temps", "--library", "--library-path", "--shared", "--cudart",
    "--cudadevrt", "--lto", "--dlink-time-opt", "--Ofast-compile", "--fdevice-syntax-only",
    "--frandom-seed", "--jump-table-density", "--device-stack-protector", "--compress-mode",
    "--objdir-as-tempdir", "--profile", "--entries", "--optimization-info",
    "--brief-diagnostics", "--fdevice-time-trace", "--time", "--link", "--lib",
    "--device-link", "--no-device-link", "--output-directory", "--sanitize",
    "--relocatable-link", "--clean-targets",
})
# Spellings nvcc's table lists as no option but accepts (flags measured on nvcc 13.0 --help).
_NVCC_PREFIXES_KEPT = ("--expt-", "-expt-", "--extended-lambda", "-extended-lambda",
                       "--Wno-", "-Wno-", "--Wreorder", "-Wreorder", "--Wext-", "-Wext-",
                       "--Wdefault-", "-Wdefault-", "--Wmissing-", "-Wmissing-",
                       "--display-error-number", "--no-display-error-number",
                       "--diag_suppress", "-diag_suppress", "--resource-usage", "-res-usage",
                       "--restrict", "-restrict", "--source-in-ptx", "-src-in-ptx",
                       "--extra-device-vectorization", "-extra-device-vectorization",
                       "--allow-unsupported-compiler", "-allow-unsupported-compiler",
                       "--no-host-device-", "-no-host-device-", "--no-compress",
                       "-no-compress", "--keep-device-functions", "-keep-device-functions",
                       "--dont-use-profile", "-noprof", "--disable-optimizer-constants",
                       "-disable-optimizer-consts", "--Wdeprecated-", "-Wno-deprecated-")
# Options for a program nvcc starts, spelled out whole and kept because they change nothing a
# program could be made to do: fatbinary compressing what it packs (FlashInfer's JIT passes it
# on every .cu, flashinfer-python 0.7.4 jit/core.py:780). Any other value of -Xfatbin is
# refused: fatbinary has options that read and write files.
_NVCC_INERT = frozenset({"-Xfatbin=-compress-all", "--fatbin-options=-compress-all",
                         "-Xfatbin=--compress-all", "--fatbin-options=--compress-all"})
# Options for programs an nvcc dependency pass never starts.
_NVCC_DOWNSTREAM = frozenset({"--ptxas-options", "--nvlink-options", "--linker-options",
                              "--archive-options"})
_NVCC_PICKS = {
    "--archiver-binary": "it picks the archiver nvcc runs",
    "--run": "it runs the program the compile builds",
    "--run-args": "it runs the program the compile builds",
    "--options-file": "an options file that cannot be read as part of the command",
    "--qpp-config": "it picks the QNX host compiler's configuration",
    "--libdevice-directory": "it picks where nvcc loads libdevice from",
    "--target-directory": "it picks the toolkit's target tree",
    "--forward-unknown-to-host-compiler": "it forwards unchecked options to the host compiler",
    "-forward-unknown-to-host-compiler": "it forwards unchecked options to the host compiler",
    "--forward-unknown-opts": "it forwards unchecked options to the host compiler",
    "-forward-unknown-opts": "it forwards unchecked options to the host compiler",
    "--dryrun": "it runs nothing, so no dependency list comes of it",
}


def _nvcc_option(unit: ArgUnit, purpose: str) -> tuple[str, str | None]:
    name = unit.name
    assert name is not None
    if name in _NVCC_PICKS:
        return "refuse", _NVCC_PICKS[name]
    if name == "--compiler-options":
        for part in (unit.value or "").split(","):
            inner = split_units("gcc", [part]) if part else []
            if not inner or inner[0].name is None:
                if part:
                    return "refuse", f"it passes {part}, no option, to the host compiler"
                continue
            verdict, why = _gcc_option(inner[0], purpose)
            if verdict == "refuse":
                return "refuse", f"it passes {part} to the host compiler: {why}"
        return "keep", None
    if name in _NVCC_DOWNSTREAM:
        if purpose == "dependency":
            return "drop", None
        if name == "--linker-options":
            for part in (unit.value or "").split(","):
                if not _LINKER_KEPT.match(part) or "plugin" in part:
                    return "refuse", (f"it passes {part} to the linker, which is not an option "
                                      "cacheaudit passes on (a linker loads plugins)")
        return "keep", None
    if name in _NVCC_KEPT or name.startswith(_NVCC_PREFIXES_KEPT) or name in _NVCC_INERT:
        return "keep", None
    return "refuse", "not an option of the families cacheaudit passes on (an allowlist)"


def screen_options(kind: str, args: Sequence[str], purpose: str = "dependency") -> Screened:
    """The options of `args` (argv after argv[0], response files already expanded) that may
    reach a compiler of `kind` that cacheaudit runs: for a dependency pass (`"dependency"`,
    options for programs it never starts left out) or a compile (`"compile"`). Stops at the
    first refusal; a kind outside nvcc, gcc, clang and hipcc refuses everything."""
    if kind not in ("nvcc", "gcc", "clang", "hipcc"):
        return Screened((), refused=(kind, "no compiler of a known kind"))
    kept: list[str] = []
    hosts: list[str] = []
    dropped: list[str] = []
    judge = _nvcc_option if kind == "nvcc" else _gcc_option
    for unit in split_units("nvcc" if kind == "nvcc" else "gcc", args):
        if unit.name is None:
            if unit.value and unit.value.startswith("@") and kind != "nvcc":
                return Screened(tuple(kept), tuple(hosts), tuple(dropped), (
                    unit.value, "a response file that cannot be read as part of the command"))
            kept.extend(unit.tokens)
            continue
        if kind == "nvcc" and unit.name == "--compiler-bindir":
            if unit.value is None:
                return Screened(tuple(kept), tuple(hosts), tuple(dropped),
                                (" ".join(unit.tokens), "it names no host compiler"))
            hosts.append(unit.value)
            continue
        verdict, why = judge(unit, purpose)
        if verdict == "refuse":
            return Screened(tuple(kept), tuple(hosts), tuple(dropped),
                            (" ".join(unit.tokens), why or "refused"))
        if verdict == "drop":
            dropped.append(" ".join(unit.tokens))
        else:
            kept.extend(unit.tokens)
    return Screened(tuple(kept), tuple(hosts), tuple(dropped))
