"""Effective argv: the arguments a compiler really acts on, each with where it came from.

nvcc splices `NVCC_PREPEND_FLAGS` and `NVCC_APPEND_FLAGS` around its argv and replaces every
`-optf` by its file's tokens; gcc and clang replace `@file` response files in place. Each token
keeps its origin (`argv`, `env:NAME`, `file:PATH`), so that a finding can say which variable or
file injected an option. Splitting follows the compilers' own rules (`tokenizers`).

Response and options files may be data someone else wrote (a cache entry's command names
them): only regular files are read, opened without waiting (a FIFO, `/dev/zero`), and all the
files one command expands hold at most `EXPANSION_BYTES` together (a sparse file of 100 GB, or
one file named 10,000 times, would otherwise be read into memory). A file past that stays a
literal argument, with a note, as an unreadable one does.
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from cacheaudit import bounded
from cacheaudit.compilers.tokenizers import (
    split_clang_response_file,
    split_gcc_response_file,
    split_nvcc_env,
    split_nvcc_options_file,
)
from cacheaudit.exceptions import TokenizeError
from cacheaudit.model import ArgToken

__all__ = ["RAW_SUFFIX", "ArgvExpansion", "effective_argv", "expand_argv"]

RAW_SUFFIX = "#raw"
"""Appended to a token's origin when the text could not be tokenised and is kept whole."""

_OPTF_DEPTH = 16
_GCC_AT_FILE_LIMIT = 2000  # libiberty's iteration_limit: gcc fails past it

EXPANSION_BYTES = 64 * 1024 * 1024
"""The most bytes of response and options files one command's expansion reads, all files
together: real ones are kilobytes (a large link's a few megabytes)."""


@dataclass(frozen=True)
class ArgvExpansion:
    """The effective argv and what went wrong building it (notes for `CompileRecord.notes`)."""

    tokens: tuple[ArgToken, ...]
    notes: tuple[str, ...] = ()


def _read_text(path: str, left: list[int]) -> str:
    """A response or options file's text, within the `left[0]` bytes the expansion has still
    to read (taken off it). Only a regular file, opened without waiting: opening a FIFO would
    block, and reading /dev/stdin would eat the compiler's input. OSError for the rest."""
    try:
        data = bounded.read_bytes(path, max(left[0], 0))
    except bounded.Refused as exc:
        why = (f"would take the files this command names past the {EXPANSION_BYTES:,} bytes "
               "cacheaudit reads of them" if exc.kind == "size" else exc.reason)
        raise OSError(f"{path} {why}") from None
    left[0] -= len(data)
    return data.decode("utf-8", "surrogateescape")


def _env_tokens(name: str, env: Mapping[str, str], notes: list[str]) -> list[ArgToken]:
    value = env.get(name)
    if not value:
        return []
    origin = f"env:{name}"
    try:
        return [ArgToken(t, origin) for t in split_nvcc_env(value)]
    except TokenizeError as exc:
        notes.append(f"{name}: nvcc rejects this value ({exc}); kept as one raw token")
        return [ArgToken(value, origin + RAW_SUFFIX)]


def _optf_option(tokens: Sequence[ArgToken], index: int) -> tuple[ArgToken | None, int] | None:
    """(value token, tokens consumed) when tokens[index] is an options-file option."""
    text = tokens[index].text
    if text in ("-optf", "--options-file"):
        if index + 1 < len(tokens):
            return tokens[index + 1], 2
        return None, 1
    for prefix in ("-optf=", "--options-file="):
        if text.startswith(prefix):
            return ArgToken(text[len(prefix):], tokens[index].origin), 1
    return None


def _expand_optf(tokens: Sequence[ArgToken], cwd: str, notes: list[str],
                 ancestors: tuple[str, ...], left: list[int]) -> list[ArgToken]:
    out: list[ArgToken] = []
    index = 0
    while index < len(tokens):
        found = _optf_option(tokens, index)
        if found is None:
            out.append(tokens[index])
            index += 1
            continue
        value, consumed = found
        literal = list(tokens[index:index + consumed])
        index += consumed
        if value is None:
            notes.append(f"{literal[0].text} without a file name; kept literally")
            out.extend(literal)
            continue
        expanded: list[ArgToken] = []
        failed = False
        # nvcc takes a comma-separated list, each name relative to the working directory (also
        # inside an options file, measured).
        for name in (n for n in value.text.split(",") if n):
            path = os.path.abspath(os.path.join(cwd, name))
            if path in ancestors or len(ancestors) >= _OPTF_DEPTH:
                notes.append(f"-optf {name}: nested too deep or recursive; kept literally")
                failed = True
                break
            try:
                text = _read_text(path, left)
            except OSError as exc:
                notes.append(f"-optf {name}: cannot read {path}: {exc.strerror or exc} "
                             "(nvcc fails: could not open options file); kept literally")
                failed = True
                break
            origin = f"file:{path}"
            try:
                file_tokens = [ArgToken(t, origin) for t in split_nvcc_options_file(text)]
            except TokenizeError as exc:
                notes.append(f"-optf {path}: nvcc rejects this file ({exc}); "
                             "kept as one raw token")
                file_tokens = [ArgToken(text, origin + RAW_SUFFIX)]
            expanded.extend(_expand_optf(file_tokens, cwd, notes, (*ancestors, path), left))
        out.extend(literal if failed else expanded)
    return out


def _expand_at_files(tokens: Sequence[ArgToken], cwd: str, kind: str, notes: list[str],
                     ancestors: tuple[str, ...], budget: list[int],
                     left: list[int]) -> list[ArgToken]:
    split = split_clang_response_file if kind in ("clang", "hipcc") else split_gcc_response_file
    out: list[ArgToken] = []
    for token in tokens:
        if not token.text.startswith("@") or len(token.text) < 2:
            out.append(token)
            continue
        # Relative names, nested ones included, are relative to the working directory (g++ 12
        # measured; LLVM's default without RelativeNames).
        path = os.path.abspath(os.path.join(cwd, token.text[1:]))
        if os.path.isdir(path):
            notes.append(f"{token.text}: is a directory (the compiler fails); kept literally")
            out.append(token)
            continue
        if path in ancestors or budget[0] <= 0:
            notes.append(f"{token.text}: recursive or too many @-files (the compiler fails); "
                         "kept literally")
            out.append(token)
            continue
        try:
            text = _read_text(path, left)
        except OSError as exc:
            # A missing or unreadable @file stays a literal argument, as libiberty and LLVM do.
            if not isinstance(exc, FileNotFoundError):
                notes.append(f"{token.text}: not read ({exc.strerror or exc}); kept literally")
            out.append(token)
            continue
        budget[0] -= 1
        origin = f"file:{path}"
        inner = [ArgToken(t, origin) for t in split(text)]
        out.extend(_expand_at_files(inner, cwd, kind, notes, (*ancestors, path), budget, left))
    return out


def expand_argv(kind: str, argv: Sequence[str], env: Mapping[str, str],
                cwd: str) -> ArgvExpansion:
    """The effective argv with notes; never raises on the content of flags or files.

    For nvcc: `NVCC_PREPEND_FLAGS` + argv + `NVCC_APPEND_FLAGS`, then every `-optf` /
    `--options-file` (separate, `=` and comma-list forms, also inside the variables and nested
    in files) replaced by its file's tokens. nvcc has no `@file` (it takes `@x` as an input).
    For gcc, clang and hipcc: `@file` response files expanded in place, nested ones too.
    A value the compiler itself would reject is kept whole as one token whose origin ends with
    `RAW_SUFFIX`; an unreadable options file keeps its option literally; both add a note.
    """
    notes: list[str] = []
    given = [ArgToken(str(a), "argv") for a in argv]
    if kind == "nvcc":
        combined = (_env_tokens("NVCC_PREPEND_FLAGS", env, notes) + given
                    + _env_tokens("NVCC_APPEND_FLAGS", env, notes))
        tokens = _expand_optf(combined, cwd, notes, (), [EXPANSION_BYTES])
    elif kind in ("gcc", "clang", "hipcc"):
        tokens = _expand_at_files(given, cwd, kind, notes, (), [_GCC_AT_FILE_LIMIT],
                                  [EXPANSION_BYTES])
    else:
        tokens = given
    return ArgvExpansion(tuple(tokens), tuple(notes))


def effective_argv(kind: str, argv: Sequence[str], env: Mapping[str, str],
                   cwd: str) -> tuple[ArgToken, ...]:
    """The arguments the compiler really acts on, each labelled with where it came from.

    `argv` excludes argv[0]. See `expand_argv` for the rules and for the notes this drops.
    """
    return expand_argv(kind, argv, env, cwd).tokens
