"""Option tables: which options of nvcc and gcc/clang take a value, and how it may be spelled.

An argv is split into units (`ArgUnit`): one option with its value, or one positional input,
under the option's canonical name, so that `-o x`, `-ox`, `--output-file=x` and `-o=x` read
alike where the compiler takes them alike. The tables were measured against nvcc 13.0 and read
from the gcc and clang drivers; an option they do not know is taken as a flag.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

__all__ = ["ArgUnit", "split_units"]

# nvcc 13.0 `--help`: (long, short) of options that take a value. Both spellings accept
# `name value` and `name=value`; only the short forms in _NVCC_ATTACHED also accept `-Dvalue`
# (measured: `-ofoo`, `-MFfoo`, `-isystem/x`, `-xcu` are "Unknown option").
_NVCC_VALUE_OPTIONS: tuple[tuple[str, str], ...] = (
    ("--dependency-output", "-MF"), ("--output-file", "-o"), ("--pre-include", "-include"),
    ("--library", "-l"), ("--define-macro", "-D"), ("--undefine-macro", "-U"),
    ("--include-path", "-I"), ("--system-include", "-isystem"), ("--library-path", "-L"),
    ("--output-directory", "-odir"), ("--compiler-bindir", "-ccbin"),
    ("--archiver-binary", "-arbin"), ("--cudart", "-cudart"), ("--cudadevrt", "-cudadevrt"),
    ("--libdevice-directory", "-ldir"), ("--target-directory", "-target-dir"),
    ("--optimization-info", "-opt-info"), ("--optimize", "-O"), ("--Ofast-compile", "-Ofc"),
    ("--dopt", "-dopt"), ("--ftemplate-backtrace-limit", "-ftemplate-backtrace-limit"),
    ("--ftemplate-depth", "-ftemplate-depth"), ("--x", "-x"), ("--std", "-std"),
    ("--machine", "-m"), ("--compiler-options", "-Xcompiler"), ("--linker-options", "-Xlinker"),
    ("--archive-options", "-Xarchive"), ("--ptxas-options", "-Xptxas"),
    ("--nvlink-options", "-Xnvlink"),
    ("--static-global-template-stub", "-static-global-template-stub"),
    ("--device-entity-has-hidden-visibility", "-device-entity-has-hidden-visibility"),
    ("--threads", "-t"), ("--split-compile", "-split-compile"),
    ("--split-compile-extended", "-split-compile-extended"),
    ("--fdevice-time-trace", "-fdevice-time-trace"), ("--keep-dir", "-keep-dir"),
    ("--time", "-time"), ("--run-args", "-run-args"), ("--input-drive-prefix", "-idp"),
    ("--dependency-drive-prefix", "-ddp"), ("--drive-prefix", "-dp"),
    ("--dependency-target-name", "-MT"), ("--gpu-architecture", "-arch"),
    ("--gpu-code", "-code"), ("--generate-code", "-gencode"),
    ("--relocatable-device-code", "-rdc"), ("--entries", "-e"),
    ("--maxrregcount", "-maxrregcount"), ("--ftz", "-ftz"), ("--prec-div", "-prec-div"),
    ("--prec-sqrt", "-prec-sqrt"), ("--fmad", "-fmad"), ("--default-stream", "-default-stream"),
    ("--Werror", "-Werror"), ("--diag-error", "-diag-error"),
    ("--diag-suppress", "-diag-suppress"), ("--diag-warn", "-diag-warn"),
    ("--host-linker-script", "-hls"), ("--brief-diagnostics", "-brief-diag"),
    ("--jump-table-density", "-jtd"), ("--device-stack-protector", "-device-stack-protector"),
    ("--compress-mode", "-compress-mode"), ("--frandom-seed", "-frandom-seed"),
    ("--sanitize", "-sanitize"), ("--options-file", "-optf"), ("--qpp-config", "-qpp-config"),
)
_NVCC_FLAG_OPTIONS: tuple[tuple[str, str], ...] = (
    ("--cuda", "-cuda"), ("--cubin", "-cubin"), ("--fatbin", "-fatbin"), ("--ptx", "-ptx"),
    ("--optix-ir", "-optix-ir"), ("--ltoir", "-ltoir"), ("--preprocess", "-E"),
    ("--generate-dependencies", "-M"), ("--generate-nonsystem-dependencies", "-MM"),
    ("--generate-dependencies-with-compile", "-MD"),
    ("--generate-nonsystem-dependencies-with-compile", "-MMD"),
    ("--generate-dependency-targets", "-MP"), ("--compile", "-c"), ("--device-c", "-dc"),
    ("--device-w", "-dw"), ("--device-link", "-dlink"), ("--link", "-link"), ("--lib", "-lib"),
    ("--run", "-run"), ("--objdir-as-tempdir", "-objtemp"), ("--profile", "-pg"),
    ("--debug", "-g"), ("--device-debug", "-G"), ("--generate-line-info", "-lineinfo"),
    ("--dlink-time-opt", "-dlto"), ("--lto", "-lto"), ("--shared", "-shared"),
    ("--m64", "-m64"), ("--dryrun", "-dryrun"), ("--verbose", "-v"),
    ("--fdevice-syntax-only", "-fdevice-syntax-only"), ("--keep", "-keep"),
    ("--save-temps", "-save-temps"), ("--clean-targets", "-clean"),
    ("--no-device-link", "-nodlink"), ("--use_fast_math", "-use_fast_math"),
    ("--disable-warnings", "-w"), ("--list-gpu-code", "-code-ls"),
    ("--list-gpu-arch", "-arch-ls"), ("--relocatable-link", "-r"), ("--help", "-h"),
    ("--version", "-V"),
)
_NVCC_ATTACHED = ("-D", "-U", "-I", "-L", "-l", "-O", "-t")


def _nvcc_table() -> tuple[dict[str, str], dict[str, str]]:
    values: dict[str, str] = {}
    flags: dict[str, str] = {}
    for long, short in _NVCC_VALUE_OPTIONS:
        values[long] = values[short] = long
    for long, short in _NVCC_FLAG_OPTIONS:
        flags[long] = flags[short] = long
    return values, flags


_NVCC_VALUES, _NVCC_FLAGS = _nvcc_table()

# gcc/clang options whose value may be attached (`-Ifoo`) or separate (`-I foo`); canonical is
# the spelling itself. Longest first so that `-iwithprefixbefore` wins over `-iwithprefix`.
_GCC_JOINED_OR_SEPARATE = tuple(sorted((
    "-o", "-I", "-D", "-U", "-L", "-l", "-x", "-MF", "-MT", "-MQ", "-include", "-imacros",
    "-isystem", "-iquote", "-idirafter", "-iprefix", "-iwithprefix", "-iwithprefixbefore",
    "-isysroot", "-imultilib", "-imultiarch", "-cxx-isystem", "-isystem-after", "-iframework",
    "-F", "-MJ", "-include-pch",
), key=len, reverse=True))
# Options that take the next argument only when spelled alone.
_GCC_SEPARATE = frozenset({
    "-A", "-B", "-T", "-u", "-e", "-z", "-Xlinker", "-Xassembler", "-Xpreprocessor", "-Xclang",
    "-aux-info", "--param", "-dumpbase", "-dumpbase-ext", "-dumpdir", "-wrapper", "-target",
    "-mllvm", "-arch", "-Xopenmp-target", "-Xcuda-ptxas", "-Xcuda-fatbinary", "-ivfsoverlay",
    "-gcc-toolchain", "-framework", "-install_name", "-rpath", "--serialize-diagnostics",
    "-index-store-path", "-Xarch_host", "-Xarch_device", "--sysroot", "-specs", "-G",
    "-Xoffload-linker", "-Xlinker-only",
})
_GCC_LONG = {
    "--output": "-o", "--include-directory": "-I", "--include-directory-after": "-idirafter",
    "--define-macro": "-D", "--undefine-macro": "-U", "--language": "-x",
    "--include": "-include", "--imacros": "-imacros", "--library-directory": "-L",
    "--include-prefix": "-iprefix", "--include-with-prefix": "-iwithprefix",
    "--include-with-prefix-after": "-iwithprefix",
    "--include-with-prefix-before": "-iwithprefixbefore", "--param": "--param",
    "--sysroot": "--sysroot", "--assert": "-A", "--prefix": "-B",
}
_GCC_FLAGS = frozenset({"-c", "-S", "-E", "-M", "-MM", "-MD", "-MMD", "-MP", "-MG", "-I-"})


@dataclass(frozen=True)
class ArgUnit:
    """One option with its value, or one positional input, and the tokens that spelled it.

    `name` is the canonical option (nvcc: the long spelling, `--output-file`; gcc/clang: the
    short spelling, `-o`), or None for a positional input. Unknown options are flags.
    """

    name: str | None
    value: str | None
    tokens: tuple[str, ...]


def _parse_nvcc_unit(tokens: Sequence[str], index: int) -> ArgUnit:
    token = tokens[index]
    if not token.startswith("-") or token == "-":
        return ArgUnit(None, token, (token,))
    if token in _NVCC_FLAGS:
        return ArgUnit(_NVCC_FLAGS[token], None, (token,))
    if token in _NVCC_VALUES:
        if index + 1 < len(tokens):
            return ArgUnit(_NVCC_VALUES[token], tokens[index + 1], (token, tokens[index + 1]))
        return ArgUnit(_NVCC_VALUES[token], None, (token,))
    name, eq, value = token.partition("=")
    if eq and name in _NVCC_VALUES:
        return ArgUnit(_NVCC_VALUES[name], value, (token,))
    if eq and name in _NVCC_FLAGS:
        return ArgUnit(_NVCC_FLAGS[name], value, (token,))
    if token[:2] in _NVCC_ATTACHED and len(token) > 2:
        return ArgUnit(_NVCC_VALUES[token[:2]], token[2:], (token,))
    return ArgUnit(token, None, (token,))


def _parse_gcc_unit(tokens: Sequence[str], index: int) -> ArgUnit:
    token = tokens[index]
    if not token.startswith("-") or token == "-":
        return ArgUnit(None, token, (token,))
    if token in _GCC_FLAGS:
        return ArgUnit(token, None, (token,))
    following = tokens[index + 1] if index + 1 < len(tokens) else None
    if token in _GCC_SEPARATE or token in _GCC_JOINED_OR_SEPARATE or token in _GCC_LONG:
        name = _GCC_LONG.get(token, token)
        if following is None:
            return ArgUnit(name, None, (token,))
        return ArgUnit(name, following, (token, following))
    if token.startswith("--"):
        name, eq, value = token.partition("=")
        if eq and name in _GCC_LONG:
            return ArgUnit(_GCC_LONG[name], value, (token,))
        return ArgUnit(token, None, (token,))
    for prefix in _GCC_JOINED_OR_SEPARATE:
        if token.startswith(prefix) and len(token) > len(prefix):
            return ArgUnit(prefix, token[len(prefix):], (token,))
    return ArgUnit(token, None, (token,))


def split_units(kind: str, tokens: Sequence[str]) -> list[ArgUnit]:
    """The units of an effective argv (`kind` "nvcc" or any gcc-like driver), in order."""
    parse = _parse_nvcc_unit if kind == "nvcc" else _parse_gcc_unit
    units: list[ArgUnit] = []
    index = 0
    while index < len(tokens):
        unit = parse(tokens, index)
        units.append(unit)
        index += len(unit.tokens)
    return units
