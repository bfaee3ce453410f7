"""The dependency argv: a compile command rewritten into the compiler's own `-M` pass.

The include graph comes from the compiler itself. When the command did not write a depfile, the
same flags are run again with `-M -MF <depfile>` instead of the output, phase and dependency
options, so that the preprocessor reads exactly what the compile read (`-dc`/`-dw` keep their
relocatable-device-code half, which defines `__CUDACC_RDC__`).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from cacheaudit.compilers.command import ParsedCommand

__all__ = ["dependency_argv"]

# Dependency-pass rewriting: what to drop, per kind (canonical names).
_GCC_DROP = frozenset({"-o", "-c", "-S", "-E", "-M", "-MM", "-MD", "-MMD", "-MF", "-MT", "-MQ",
                       "-MP", "-MG", "-save-temps"})
_NVCC_DROP = frozenset({
    "--output-file", "--compile", "--preprocess", "--cubin", "--ptx", "--fatbin", "--cuda",
    "--optix-ir", "--ltoir", "--lib", "--link", "--device-link", "--output-directory",
    "--generate-dependencies", "--generate-nonsystem-dependencies",
    "--generate-dependencies-with-compile", "--generate-nonsystem-dependencies-with-compile",
    "--dependency-output", "--dependency-target-name", "--generate-dependency-targets",
    "--keep", "--keep-dir", "--save-temps", "--time", "--fdevice-time-trace", "--run",
    "--run-args",
})
# Phase options that also switch relocatable device code, which defines __CUDACC_RDC__ and so
# can change what the preprocessor reads: keep that half.
_NVCC_REPLACE = {"--device-c": ("-rdc=true",), "--device-w": ("-rdc=false",)}


def dependency_argv(command: ParsedCommand, depfile: str) -> list[str]:
    """`ParsedCommand.dependency_argv`: the rules are in its docstring."""
    drop = _NVCC_DROP if command.kind == "nvcc" else _GCC_DROP
    out: list[str] = []
    for unit in command.units:
        if unit.name is None:
            if unit.value in command.objects:
                continue
            out.extend(unit.tokens)
        elif unit.name in drop:
            continue
        elif command.kind == "nvcc" and unit.name in _NVCC_REPLACE:
            out.extend(_NVCC_REPLACE[unit.name])
        elif command.kind != "nvcc" and unit.name.startswith(("-Wp,-M", "-save-temps=")):
            continue
        else:
            out.extend(unit.tokens)
    out.extend(["-M", "-MF", depfile])
    return out
