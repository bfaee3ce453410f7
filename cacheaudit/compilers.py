"""Compiler identity and effective argv: who really compiled, and with which options.

Two questions of the design card are answered here. "Which compiler?" needs more than a path:
`/usr/local/bin/nvcc` is a shell script that execs the real driver, `/usr/bin/cc` is a chain of
symlinks through `/etc/alternatives`, and nvcc compiles host code with a second compiler chosen by
`-ccbin`, `NVCC_CCBIN` or PATH. "Which options?" needs more than argv: nvcc splices in
`NVCC_PREPEND_FLAGS`, `NVCC_APPEND_FLAGS` and `-optf` files, gcc and clang splice in `@file`
response files, and each does so with its own quoting rules, measured against the real tools (see
the `split_*` functions for the evidence).

Nothing here runs a subprocess at import time; only `identify` runs one (`--version`).
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
import re
import shlex
import signal
import stat as stat_module
import subprocess
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Protocol

from cacheaudit.digest import hash_file, is_settled
from cacheaudit.exceptions import TokenizeError
from cacheaudit.model import ArgToken, CompilerIdentity, json_digest
from cacheaudit.programs import find_program, is_executable_file

__all__ = [
    "RAW_SUFFIX",
    "ArgUnit",
    "ArgvExpansion",
    "DictMemo",
    "IdentityMemo",
    "ParsedCommand",
    "compiler_kind",
    "effective_argv",
    "expand_argv",
    "find_program",
    "host_compiler_path",
    "identify",
    "identity_cache_key",
    "output_paths",
    "parse_command",
    "quote_gcc_response_file",
    "quote_nvcc_env",
    "quote_nvcc_options_file",
    "resolve_wrappers",
    "split_clang_response_file",
    "split_gcc_response_file",
    "split_nvcc_env",
    "split_nvcc_options_file",
]

# ----------------------------------------------------------------------------------------------
# Kinds


_KIND_RE = re.compile(
    r"^(?:.*-)?(?P<name>nvcc|hipcc|clang\+\+|clang|g\+\+|gcc|c\+\+|cc)"
    r"(?:-\d+(?:\.\d+)*)?(?:\.exe|\.pl|\.bin)?$")
_KIND_OF = {"nvcc": "nvcc", "hipcc": "hipcc", "clang": "clang", "clang++": "clang",
            "gcc": "gcc", "g++": "gcc", "cc": "gcc", "c++": "gcc"}


def compiler_kind(name: str) -> str:
    """The driver family of a compiler name, from its basename only.

    Drivers behave by name (ccache hashes the basename for that reason), and a triplet prefix or
    a version suffix (`x86_64-linux-gnu-g++-12`, `clang++-18`) does not change the family. Tools
    that merely share a prefix (`gcc-ar-12`, `clang-tidy`) are "unknown".
    """
    match = _KIND_RE.match(os.path.basename(name))
    return _KIND_OF[match.group("name")] if match else "unknown"


# ----------------------------------------------------------------------------------------------
# PATH lookup and wrapper resolution


_MAX_HOPS = 40
_MAX_SCRIPT_BYTES = 64 * 1024
_SHELLS = frozenset({"sh", "bash", "dash", "ksh", "mksh", "zsh", "ash"})
_ENV_PROGRAMS = frozenset({"env", "/usr/bin/env", "/bin/env"})
_SET_LINE = re.compile(r"^set(?:\s+(?:[-+][A-Za-z]+|-o\s+\w+))*\s*(?:#.*)?$")
_EXEC_LINE = re.compile(r'^exec\s+(?P<body>.*?)\s+"\$(?:@|\{@\})"\s*(?:#.*)?$')
# Anything a shell would expand or interpret is outside what we read "for certain".
_SAFE_BODY = re.compile(r"""^[A-Za-z0-9_./+=:@%,'" -]+$""")
_ASSIGNMENT = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*=")


@dataclass(frozen=True)
class _Resolution:
    resolved: str
    chain: tuple[str, ...]
    problem: str | None = None


def _shell_script_target(path: str, search_path: str | None,
                         skip: Callable[[str], bool] | None) -> str | None:
    """The program a pure forwarding shell script execs, or None when that is not certain.

    Only scripts of the form `#!/bin/sh` + comments + `set -e`-style lines + one
    `exec [env NAME=value ...] PROGRAM "$@"` are read; an interpreter other than a POSIX shell
    (hipcc is Perl), any other command, any expansion, or a relative PROGRAM path means the
    script itself is taken as the compiler.
    """
    try:
        with open(path, "rb") as handle:
            if handle.read(2) != b"#!":
                return None
            if os.fstat(handle.fileno()).st_size > _MAX_SCRIPT_BYTES:
                return None
            data = b"#!" + handle.read(_MAX_SCRIPT_BYTES)
    except OSError:
        return None
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError:
        return None
    lines = text.splitlines()
    interpreter = lines[0][2:].split()
    if not interpreter:
        return None
    if interpreter[0] in _ENV_PROGRAMS:
        interpreter = interpreter[1:]
    if not interpreter or os.path.basename(interpreter[0]) not in _SHELLS:
        return None
    if any(not flag.startswith("-") for flag in interpreter[1:]):
        return None
    target: str | None = None
    for line in lines[1:]:
        stripped = line.strip()
        if not stripped or stripped.startswith("#") or _SET_LINE.match(stripped):
            continue
        match = _EXEC_LINE.match(stripped)
        if match is None or target is not None:
            return None
        target = _exec_target(match.group("body"), search_path, skip)
        if target is None:
            return None
    return target


def _exec_target(body: str, search_path: str | None,
                 skip: Callable[[str], bool] | None) -> str | None:
    if not _SAFE_BODY.match(body):
        return None
    try:
        words = shlex.split(body)
    except ValueError:
        return None
    if words and words[0] in _ENV_PROGRAMS:
        words = words[1:]
        while words:
            if _ASSIGNMENT.match(words[0]):
                name, _, value = words[0].partition("=")
                if name == "PATH":
                    search_path = value
                words = words[1:]
            elif words[0] == "-u" and len(words) > 1:
                words = words[2:]
            else:
                break
    if len(words) != 1 or not words[0] or words[0].startswith("-"):
        return None
    program = words[0]
    if "/" in program:
        return program if os.path.isabs(program) else None
    return find_program(program, search_path, skip)


def _resolve(path: str, search_path: str | None,
             skip: Callable[[str], bool] | None) -> _Resolution:
    chain: list[str] = []
    seen_scripts: set[str] = set()
    current = os.path.abspath(path)
    for _ in range(_MAX_HOPS):
        if os.path.islink(current):
            try:
                target = os.readlink(current)
            except OSError as exc:
                return _Resolution(os.path.realpath(current), tuple(chain),
                                   f"cannot read symlink {current}: {exc.strerror or exc}")
            chain.append(current)
            current = os.path.join(os.path.realpath(os.path.dirname(current)), target)
            continue
        real = os.path.realpath(current)
        if not os.path.exists(real):
            return _Resolution(real, tuple(chain), f"{current} does not exist")
        if real in seen_scripts:
            return _Resolution(real, tuple(chain), f"wrapper loop: {real} execs itself again")
        target = _shell_script_target(real, search_path, skip)
        if target is None:
            return _Resolution(real, tuple(chain))
        seen_scripts.add(real)
        chain.append(current)
        current = target
    return _Resolution(os.path.realpath(current), tuple(chain),
                       f"more than {_MAX_HOPS} symlinks and wrappers")


def resolve_wrappers(path: str, *, search_path: str | None = None,
                     skip: Callable[[str], bool] | None = None) -> tuple[str, tuple[str, ...]]:
    """The binary that really runs when `path` is executed, and the hops to it, outermost first.

    A hop is a symlink (each link of a chain such as `/usr/bin/cc -> /etc/alternatives/cc ->
    /usr/bin/gcc -> gcc-12`, because `update-alternatives` flipping one of them is a classic
    silent compiler change) or a forwarding shell script (see `_shell_script_target`). Bare program
    names in scripts are looked up along `search_path` (None: `os.defpath`) with `skip`. On a loop
    the file where the loop closes is returned; `identify` reports it as an error.
    """
    resolution = _resolve(path, search_path, skip)
    return resolution.resolved, resolution.chain


# ----------------------------------------------------------------------------------------------
# Tokenisers


def _nvcc_env_raw_split(value: str) -> list[str]:
    # nvcc's first pass: a space or tab outside double quotes separates; a quote inside quotes
    # preceded by a backslash character does not close (even when that backslash was itself
    # escaped); backslashes are not looked at outside quotes. Everything is kept.
    tokens: list[str] = []
    current: list[str] = []
    quoted = False
    for index, char in enumerate(value):
        if char == '"':
            if not (quoted and index > 0 and value[index - 1] == "\\"):
                quoted = not quoted
            current.append(char)
        elif char in " \t" and not quoted:
            if current:
                tokens.append("".join(current))
                current = []
        else:
            current.append(char)
    if quoted:
        raise TokenizeError("Stray '\"' character: unterminated double quote")
    if current:
        tokens.append("".join(current))
    return tokens


def _nvcc_env_unescape(raw: str) -> list[str]:
    # nvcc's second pass over each first-pass token: a backslash escapes the next character and
    # is removed; quotes group and are kept; an escaped space, tab or quote outside quotes, a
    # trailing backslash and an unterminated quote are errors.
    tokens: list[str] = []
    current: list[str] = []
    have = False
    quoted = False
    index = 0
    while index < len(raw):
        char = raw[index]
        if char == "\\":
            if index + 1 >= len(raw):
                raise TokenizeError("Stray '' character: backslash at the end")
            escaped = raw[index + 1]
            if not quoted and escaped in " \t":
                raise TokenizeError("Stray '' character: escaped blank outside quotes")
            if not quoted and escaped == '"':
                raise TokenizeError("Stray '\"' character: escaped quote outside quotes")
            current.append(escaped)
            have = True
            index += 2
            continue
        if char == '"':
            quoted = not quoted
            current.append(char)
            have = True
        elif char in " \t" and not quoted:
            if have:
                tokens.append("".join(current))
                current, have = [], False
        else:
            current.append(char)
            have = True
        index += 1
    if quoted:
        raise TokenizeError("Stray '\"' character: unterminated double quote")
    if have:
        tokens.append("".join(current))
    return tokens


def split_nvcc_env(value: str) -> list[str]:
    """Tokens of an `NVCC_PREPEND_FLAGS` / `NVCC_APPEND_FLAGS` value, exactly as nvcc splits it.

    Measured with nvcc 13.0.88 (`nvcc -dryrun`, comparing the `-D` values passed to the host
    preprocessor; 15,000 generated strings over `a " \\ space tab newline CR '`, all agreeing):

    - only space and tab separate; a newline or CR is an ordinary character
      (`-DX=1\\n-DY=2` is one define `X=1\\n-DY=2`); an empty or blank value gives no tokens;
    - double quotes group and are KEPT (`-DX="1 + 2"` stays `-DX="1 + 2"`); a token that
      starts with a quote stays one token (nvcc then takes it as a file name);
    - a backslash escapes the next character and is removed (`a\\b` -> `ab`, `a\\\\b` -> `a\\b`,
      inside quotes too: `"a\\"b"` -> `"a"b"`);
    - single quotes and `#` are ordinary characters;
    - nvcc fails with "Stray" errors, and this raises `TokenizeError`, on: an unterminated quote,
      a trailing backslash, an escaped space/tab/quote outside quotes, and `\\\\"` closing a
      quoted part (nvcc's splitter sees a quote preceded by a backslash as escaped).
    """
    tokens: list[str] = []
    for raw in _nvcc_env_raw_split(value):
        tokens.extend(_nvcc_env_unescape(raw))
    return tokens


def _optf_raw_split(text: str) -> list[str]:
    tokens: list[str] = []
    current: list[str] = []
    have = False
    quoted = False
    index = 0
    while index < len(text):
        char = text[index]
        if char == "\\":
            if index + 1 >= len(text):
                raise TokenizeError("Stray '' character: backslash at the end")
            current.append(text[index:index + 2])
            have = True
            index += 2
            continue
        if char == '"':
            quoted = not quoted
            current.append(char)
            have = True
        elif char in " \t\n\r" and not quoted:
            if have:
                tokens.append("".join(current))
                current, have = [], False
        else:
            current.append(char)
            have = True
        index += 1
    if quoted:
        raise TokenizeError("Stray '\"' character: unterminated double quote")
    if have:
        tokens.append("".join(current))
    return tokens


def _unescape(token: str, drop_quotes: bool) -> str:
    out: list[str] = []
    index = 0
    while index < len(token):
        char = token[index]
        if char == "\\":
            if index + 1 >= len(token):
                raise TokenizeError("Stray '' character: backslash at the end")
            out.append(token[index + 1])
            index += 2
            continue
        if not (drop_quotes and char == '"'):
            out.append(char)
        index += 1
    return "".join(out)


def split_nvcc_options_file(text: str) -> list[str]:
    """Tokens of an nvcc `-optf` file, exactly as nvcc 13.0 reads it.

    Measured like `split_nvcc_env` (15,000 generated files, all agreeing). nvcc unescapes an
    options file twice, which explains every oddity:

    1. split: space, tab, newline and CR outside double quotes separate; a backslash protects the
       next character (so `a\\ b` is one token); an unterminated quote is an error;
    2. first round, per token: a backslash escapes the next character and is removed, quotes kept;
       then leading and trailing spaces and tabs are stripped and a token left empty is dropped;
    3. second round: quotes are removed and a backslash escapes the next character again.

    Hence `-DQ="a b"` -> `-DQ=a b`, `-DX="a"b"c"` -> `-DX=abc`, `-DX=a\\ b` -> `-DX=a b`,
    `-DX=a\\\\b` -> `-DX=ab` (two rounds), `-DX=\\"q\\"` -> `-DX=q`, `-DX="a\\"b"` -> `-DX=ab`.
    Single quotes and `#` are ordinary characters; there is no comment syntax. A backslash at
    the end of a token after either round raises `TokenizeError` (nvcc: "Stray '' character").
    """
    tokens: list[str] = []
    for raw in _optf_raw_split(text):
        once = _unescape(raw, drop_quotes=False).strip(" \t")
        if once:
            tokens.append(_unescape(once, drop_quotes=True))
    return tokens


_LIBIBERTY_SPACE = " \t\n\v\f\r"


def split_gcc_response_file(text: str) -> list[str]:
    """Tokens of a gcc `@file`, by libiberty's `buildargv` (checked against g++ 12).

    Whitespace (space, tab, newline, VT, FF, CR) separates; single and double quotes group and
    are removed; a backslash escapes the next character everywhere, inside single quotes too; an
    unterminated quote runs to the end; a trailing backslash vanishes; `""` is an empty argument;
    a file of only whitespace gives nothing; the text stops at a NUL byte (C strings).
    """
    text = text.split("\0", 1)[0]
    if not text.strip(_LIBIBERTY_SPACE):
        return []
    args: list[str] = []
    index, end = 0, len(text)
    while index < end:
        while index < end and text[index] in _LIBIBERTY_SPACE:
            index += 1
        if index >= end:
            break
        arg: list[str] = []
        squote = dquote = bsquote = False
        while index < end:
            char = text[index]
            if char in _LIBIBERTY_SPACE and not (squote or dquote or bsquote):
                break
            if bsquote:
                bsquote = False
                arg.append(char)
            elif char == "\\":
                bsquote = True
            elif squote:
                if char == "'":
                    squote = False
                else:
                    arg.append(char)
            elif dquote:
                if char == '"':
                    dquote = False
                else:
                    arg.append(char)
            elif char == "'":
                squote = True
            elif char == '"':
                dquote = True
            else:
                arg.append(char)
            index += 1
        args.append("".join(arg))
    return args


_LLVM_SPACE = " \t\r\n"


def split_clang_response_file(text: str) -> list[str]:
    """Tokens of a clang `@file`, by LLVM's `cl::TokenizeGNUCommandLine` (read, not measured here).

    It differs from libiberty in three details: only space, tab, CR and newline separate; a
    backslash at the very end is kept; an empty token (`""`) is dropped.
    """
    args: list[str] = []
    token: list[str] = []
    index, end = 0, len(text)
    while index < end:
        if not token:
            while index < end and text[index] in _LLVM_SPACE:
                index += 1
            if index >= end:
                break
        char = text[index]
        if char == "\\" and index + 1 < end:
            token.append(text[index + 1])
            index += 2
            continue
        if char in "\"'":
            index += 1
            while index < end and text[index] != char:
                if text[index] == "\\" and index + 1 < end:
                    index += 1
                token.append(text[index])
                index += 1
            if index >= end:
                break
            index += 1
            continue
        if char in _LLVM_SPACE:
            if token:
                args.append("".join(token))
            token = []
            index += 1
            continue
        token.append(char)
        index += 1
    if token:
        args.append("".join(token))
    return args


def _escape_backslash_quote(text: str) -> str:
    return text.replace("\\", "\\\\").replace('"', '\\"')


def quote_nvcc_options_file(token: str) -> str:
    """A spelling of `token` that `split_nvcc_options_file` (and nvcc) reads back as that token.

    Any text works, blanks, quotes and backslashes included: the options file is unescaped
    twice, so the token is escaped twice and wrapped in quotes that survive the first round.
    """
    return '"' + _escape_backslash_quote(_escape_backslash_quote(token)) + '"'


def quote_nvcc_env(token: str) -> str:
    """A spelling of `token` for `NVCC_*_FLAGS`, or `TokenizeError` when none exists.

    nvcc keeps quotes in these variables, so a token is representable only when its quotes pair
    up, its blanks sit between paired quotes, and no backslash ends a quoted part.
    """
    spelled = token.replace("\\", "\\\\")
    try:
        if split_nvcc_env(spelled) == [token]:
            return spelled
    except TokenizeError:
        pass
    raise TokenizeError(f"{token!r} cannot be spelled in NVCC_APPEND_FLAGS")


def quote_gcc_response_file(token: str) -> str:
    """A spelling of `token` that gcc's `@file` reader gives back unchanged (any text, no NUL)."""
    return "'" + token.replace("\\", "\\\\").replace("'", "\\'") + "'"


# ----------------------------------------------------------------------------------------------
# Effective argv

RAW_SUFFIX = "#raw"
"""Appended to a token's origin when the text could not be tokenised and is kept whole."""

_OPTF_DEPTH = 16
_GCC_AT_FILE_LIMIT = 2000  # libiberty's iteration_limit: gcc fails past it


@dataclass(frozen=True)
class ArgvExpansion:
    """The effective argv and what went wrong building it (notes for `CompileRecord.notes`)."""

    tokens: tuple[ArgToken, ...]
    notes: tuple[str, ...] = ()


def _read_text(path: str) -> str:
    # Only regular files, checked before opening: opening a FIFO blocks, and reading
    # /dev/stdin would eat the compiler's input.
    if not stat_module.S_ISREG(os.stat(path).st_mode):
        raise OSError(f"{path} is not a regular file")
    with open(path, "rb") as handle:
        return handle.read().decode("utf-8", "surrogateescape")


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
                 ancestors: tuple[str, ...]) -> list[ArgToken]:
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
                text = _read_text(path)
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
            expanded.extend(_expand_optf(file_tokens, cwd, notes, (*ancestors, path)))
        out.extend(literal if failed else expanded)
    return out


def _expand_at_files(tokens: Sequence[ArgToken], cwd: str, kind: str, notes: list[str],
                     ancestors: tuple[str, ...], budget: list[int]) -> list[ArgToken]:
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
            text = _read_text(path)
        except OSError as exc:
            # A missing or unreadable @file stays a literal argument, as libiberty and LLVM do.
            if not isinstance(exc, FileNotFoundError):
                notes.append(f"{token.text}: not read ({exc.strerror or exc}); kept literally")
            out.append(token)
            continue
        budget[0] -= 1
        origin = f"file:{path}"
        inner = [ArgToken(t, origin) for t in split(text)]
        out.extend(_expand_at_files(inner, cwd, kind, notes, (*ancestors, path), budget))
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
        tokens = _expand_optf(combined, cwd, notes, ())
    elif kind in ("gcc", "clang", "hipcc"):
        tokens = _expand_at_files(given, cwd, kind, notes, (), [_GCC_AT_FILE_LIMIT])
    else:
        tokens = given
    return ArgvExpansion(tuple(tokens), tuple(notes))


def effective_argv(kind: str, argv: Sequence[str], env: Mapping[str, str],
                   cwd: str) -> tuple[ArgToken, ...]:
    """The arguments the compiler really acts on, each labelled with where it came from.

    `argv` excludes argv[0]. See `expand_argv` for the rules and for the notes this drops.
    """
    return expand_argv(kind, argv, env, cwd).tokens


# ----------------------------------------------------------------------------------------------
# Option tables

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


def _units(kind: str, tokens: Sequence[str]) -> list[ArgUnit]:
    parse = _parse_nvcc_unit if kind == "nvcc" else _parse_gcc_unit
    units: list[ArgUnit] = []
    index = 0
    while index < len(tokens):
        unit = parse(tokens, index)
        units.append(unit)
        index += len(unit.tokens)
    return units


def _is_source_name(path: str) -> bool:
    return os.path.splitext(path)[1] in _SOURCE_SUFFIXES


def _nvcc_values(unit: ArgUnit) -> list[str]:
    """nvcc splits list-valued options on commas (`-I/a,/b` is two directories, measured)."""
    return [v for v in (unit.value or "").split(",") if v]


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
        drop = _NVCC_DROP if self.kind == "nvcc" else _GCC_DROP
        out: list[str] = []
        for unit in self.units:
            if unit.name is None:
                if unit.value in self.objects:
                    continue
                out.extend(unit.tokens)
            elif unit.name in drop:
                continue
            elif self.kind == "nvcc" and unit.name in _NVCC_REPLACE:
                out.extend(_NVCC_REPLACE[unit.name])
            elif self.kind != "nvcc" and unit.name.startswith(("-Wp,-M", "-save-temps=")):
                continue
            else:
                out.extend(unit.tokens)
        out.extend(["-M", "-MF", depfile])
        return out


_PHASE_NAMES = frozenset({
    "-c", "-S", "-E", "-M", "-MM", "--compile", "--preprocess", "--cubin", "--ptx", "--fatbin",
    "--cuda", "--optix-ir", "--ltoir", "--lib", "--device-c", "--device-w",
    "--generate-dependencies", "--generate-nonsystem-dependencies", "-fsyntax-only",
})


def parse_command(kind: str, tokens: Sequence[str]) -> ParsedCommand:
    """Sources, other inputs, output, include directories and intent of a command line.

    `tokens` are the effective argv texts. Sources are positional inputs with a source suffix,
    or any positional after `-x LANG` (gcc/clang: from there on until `-x none`; nvcc: `-x` with
    c, c++ or cu applies to every input). Headers are not sources. A command is a compile when it
    has a source and is no query (`--version`, `-dumpversion`, `-dumpmachine`, `-print-*`,
    `--help`, `-###`, `-fsyntax-only`, nvcc `-dryrun`, `-V`, `-h`, `-code-ls`, `-arch-ls`) and
    not a preprocess or dependency listing to stdout or a depfile (`-E` without `-o`, `-M`, `-MM`).
    """
    tokens = tuple(tokens)
    units = _units(kind, tokens)
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
                         is_compile=is_compile, queries=tuple(queries))


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


# ----------------------------------------------------------------------------------------------
# Identity


class IdentityMemo(Protocol):
    """Where `identify` keeps `--version` results across processes (a ledger table, say).

    `identify` asks `get(key)` before running `--version` and calls `put(key, identity)` after a
    successful run, where `key` is `identity_cache_key(...)`: equal keys mean the same files with
    the same size, mtime, ctime and inode along the whole chain, so the stored version text and
    digest still hold. The stored identity's host is not used (host compilers are identified,
    and memoised, on their own).
    """

    def get(self, key: str) -> CompilerIdentity | None: ...

    def put(self, key: str, identity: CompilerIdentity) -> None: ...


class DictMemo:
    """An in-process `IdentityMemo`: enough for a long-lived adapter or a test."""

    def __init__(self) -> None:
        self.entries: dict[str, CompilerIdentity] = {}
        self.hits = 0

    def get(self, key: str) -> CompilerIdentity | None:
        found = self.entries.get(key)
        if found is not None:
            self.hits += 1
        return found

    def put(self, key: str, identity: CompilerIdentity) -> None:
        self.entries[key] = identity


_LOCALE_VARIABLES = ("LANGUAGE", "LC_ALL", "LC_MESSAGES", "LANG")


def identity_cache_key(path: str, resolved: str, wrappers: Sequence[str],
                       env: Mapping[str, str]) -> str | None:
    """A key under which a compiler's `--version` text and digest may be reused, or None.

    It covers the path run (drivers print their own name: `g++ (Debian ...)`), every hop and the
    resolved binary with (size, mtime_ns, ctime_ns, inode), and the locale variables (gcc
    translates `--version`). None when a file cannot be stat'ed or the binary changed within the
    timestamp-granularity window (`digest.is_settled`), when a stat match proves nothing.
    """
    parts: list[object] = ["cacheaudit-compiler-identity-v1", path, resolved]
    now = time.time_ns()
    for hop in (*wrappers, resolved):
        try:
            st = os.stat(hop)
        except OSError:
            return None
        if not is_settled(st, now):
            return None
        parts.append((hop, st.st_size, st.st_mtime_ns, st.st_ctime_ns, st.st_ino))
    parts.append(tuple((name, env.get(name)) for name in _LOCALE_VARIABLES))
    return json_digest(parts)


def _run_version(path: str, env: Mapping[str, str], timeout: float,
                 cwd: str | None) -> tuple[str, str | None]:
    """(stdout then stderr, error). Runs in its own session so that a hang is killed whole."""
    try:
        proc = subprocess.Popen([path, "--version"], stdin=subprocess.DEVNULL,
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=dict(env),
                                cwd=cwd, start_new_session=True)
    except OSError as exc:
        return "", f"cannot run {path} --version: {exc.strerror or exc}"
    try:
        out, err = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        with contextlib.suppress(OSError):
            os.killpg(proc.pid, signal.SIGKILL)
        try:
            out, err = proc.communicate(timeout=5)
        except subprocess.TimeoutExpired:
            proc.kill()
            out, err = b"", b""
        text = (out + err).decode("utf-8", "surrogateescape")
        return text, f"{path} --version did not finish within {timeout:g} s"
    text = (out + err).decode("utf-8", "surrogateescape")
    if proc.returncode != 0:
        return text, f"{path} --version exited with status {proc.returncode}"
    return text, None


def host_compiler_path(argv_tokens: Sequence[str], env: Mapping[str, str], cwd: str,
                       skip: Callable[[str], bool] | None = None) -> tuple[str, str | None]:
    """(name as nvcc would run it, absolute path or None) of nvcc's host compiler.

    Measured with nvcc 13.0 (`-dryrun`): the last `-ccbin`/`--compiler-bindir` of the effective
    argv wins, else `NVCC_CCBIN`. A directory X (relative to the working directory) means
    `X/gcc` (not `X/g++`: nvcc fails with "X/gcc: No such file" when only g++ is there; it runs
    `X/g++` only to link); a value with a slash is a path relative to the working directory;
    a bare name is looked up on PATH. Without either, nvcc runs `gcc` from PATH for every
    preprocess and compile step (and `g++` only for the final link).
    """
    command = parse_command("nvcc", argv_tokens)
    ccbin = command.value_of("--compiler-bindir") or env.get("NVCC_CCBIN") or None
    search_path = env.get("PATH")
    if ccbin is None:
        return "gcc", find_program("gcc", search_path, skip)
    candidate = os.path.join(cwd, ccbin)
    if os.path.isdir(candidate):
        name = os.path.join(ccbin, "gcc")
        full = os.path.abspath(os.path.join(cwd, name))
        return name, full if is_executable_file(full) else None
    if "/" in ccbin:
        full = os.path.abspath(candidate)
        return ccbin, full if is_executable_file(full) else None
    return ccbin, find_program(ccbin, search_path, skip)


def identify(invoked: str, *, env: Mapping[str, str],
             skip: Callable[[str], bool] | None = None, timeout: float = 10.0,
             argv: Sequence[str] = (), cwd: str | None = None,
             memo: IdentityMemo | None = None, path: str | None = None) -> CompilerIdentity:
    """Who compiles when `invoked` runs with `env` (and, for nvcc, `argv`): never raises.

    `path` is the PATH lookup (with `skip`), `resolved` the binary after symlinks and forwarding
    scripts, `wrappers` the hops, `version_text` the full `--version` output (stdout then stderr)
    of `path` run with `env` (so wrappers are honoured), `digest`/`size`/`mtime_ns` those of
    `resolved`. For nvcc, `host` is the host compiler's identity (see `host_compiler_path`);
    `argv` may be the argv as given or the effective argv. Failures leave `error` set on the
    identity concerned and keep whatever was collected; a host failure stays on `host`.
    `path`, when given, is the program already chosen for `invoked` (the shim's
    `CACHEAUDIT_REAL_<NAME>` override, say): it is used instead of a PATH lookup.
    """
    try:
        cwd = cwd or os.getcwd()
        found = os.path.abspath(os.path.join(cwd, path)) if path else None
        return _identify(invoked, env=env, skip=skip, timeout=timeout, argv=argv, cwd=cwd,
                         memo=memo, found=found)
    except Exception as exc:  # noqa: BLE001 - identity is evidence; it must never break a compile
        return CompilerIdentity(invoked=invoked, path="", resolved="",
                                kind=compiler_kind(invoked), version_text="", digest=None,
                                error=f"internal error: {type(exc).__name__}: {exc}")


def _identify(invoked: str, *, env: Mapping[str, str], skip: Callable[[str], bool] | None,
              timeout: float, argv: Sequence[str], cwd: str, memo: IdentityMemo | None,
              found: str | None = None) -> CompilerIdentity:
    kind = compiler_kind(invoked)
    search_path = env.get("PATH")
    if found is not None:
        where = f"at {found}"
        found = found if is_executable_file(found) else None
    elif "/" in invoked:
        where = "as a path"
        candidate = os.path.abspath(os.path.join(cwd, invoked))
        found = candidate if is_executable_file(candidate) else None
    else:
        where = "on PATH"
        found = find_program(invoked, search_path, skip)
    if found is None:
        return CompilerIdentity(invoked=invoked, path="", resolved="", kind=kind,
                                version_text="", digest=None,
                                error=f"compiler {invoked!r} not found {where}")
    path = os.path.abspath(found)
    resolution = _resolve(path, search_path, skip)
    if kind == "unknown":
        for name in (resolution.resolved, *reversed(resolution.chain)):
            if compiler_kind(name) != "unknown":
                kind = compiler_kind(name)
                break
    host = None
    if kind == "nvcc":
        host = _host_identity(argv, env, cwd, skip, timeout, memo)
    base = CompilerIdentity(invoked=invoked, path=path, resolved=resolution.resolved,
                            kind=kind, version_text="", digest=None, wrappers=resolution.chain,
                            host=host)
    if resolution.problem is not None:
        return dataclasses.replace(base, error=resolution.problem)
    key = identity_cache_key(path, resolution.resolved, resolution.chain, env)
    if memo is not None and key is not None:
        known = memo.get(key)
        if known is not None and known.error is None:
            return dataclasses.replace(base, version_text=known.version_text,
                                       digest=known.digest, size=known.size,
                                       mtime_ns=known.mtime_ns)
    errors: list[str] = []
    size, mtime_ns, digest = -1, 0, None
    try:
        st = os.stat(resolution.resolved)
        size, mtime_ns = st.st_size, st.st_mtime_ns
        digest = hash_file(resolution.resolved)
    except OSError as exc:
        errors.append(f"cannot read {resolution.resolved}: {exc.strerror or exc}")
    version_text, version_error = _run_version(path, env, timeout, cwd)
    if version_error:
        errors.append(version_error)
    identity = dataclasses.replace(base, version_text=version_text, digest=digest, size=size,
                                   mtime_ns=mtime_ns, error="; ".join(errors) or None)
    if memo is not None and key is not None and identity.error is None and key == (
            identity_cache_key(path, resolution.resolved, resolution.chain, env)):
        memo.put(key, dataclasses.replace(identity, host=None))
    return identity


def _host_identity(argv: Sequence[str], env: Mapping[str, str], cwd: str,
                   skip: Callable[[str], bool] | None, timeout: float,
                   memo: IdentityMemo | None) -> CompilerIdentity:
    tokens = [t.text for t in effective_argv("nvcc", argv, env, cwd)]
    name, full = host_compiler_path(tokens, env, cwd, skip)
    if full is None:
        return CompilerIdentity(invoked=name, path="", resolved="", kind=compiler_kind(name),
                                version_text="", digest=None,
                                error=f"host compiler {name!r} not found")
    return _identify(name, env=env, skip=skip, timeout=timeout, argv=(), cwd=cwd, memo=memo,
                     found=full)
