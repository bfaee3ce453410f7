"""Compiler identity and effective argv: who really compiled, and with which options.

Two questions of the design card are answered here. "Which compiler?" needs more than a path:
`/usr/local/bin/nvcc` is a shell script that execs the real driver, `/usr/bin/cc` is a chain of
symlinks through `/etc/alternatives`, and nvcc compiles host code with a second compiler chosen by
`-ccbin`, `NVCC_CCBIN` or PATH. "Which options?" needs more than argv: nvcc splices in
`NVCC_PREPEND_FLAGS`, `NVCC_APPEND_FLAGS` and `-optf` files, gcc and clang splice in `@file`
response files, and each does so with its own quoting rules, measured against the real tools (see
the `split_*` functions for the evidence).

One concern per module, lowest first:

- `kinds`: the driver family of a compiler name (`compiler_kind`);
- `wrappers`: the binary behind symlinks and forwarding scripts (`resolve_wrappers`);
- `tokenizers`: the compilers' own splitting and quoting (`split_*`, `quote_*`);
- `effective`: the effective argv with each token's origin (`expand_argv`, `effective_argv`);
- `options`: the option tables and the units an argv splits into (`ArgUnit`);
- `dependency`: a command rewritten into the compiler's own `-M` pass;
- `allowed`: which options of a command someone else wrote may reach a compiler cacheaudit runs;
- `command`: what a command line does (`parse_command`, `ParsedCommand`, `output_paths`);
- `identity`: who compiles (`identify`, `host_compiler_path`, `IdentityMemo`, `DictMemo`);
- `memo`: `FileMemo`, the identities the shim keeps in a file beside the ledger.

Everything public is re-exported here, so callers import from `cacheaudit.compilers`. The PATH
lookup itself lives in `cacheaudit.programs` (stdlib only, for the shim's query path) and is
re-exported too. Nothing here runs a subprocess at import time; only `identify` runs one
(`--version`).
"""

from __future__ import annotations

from cacheaudit.compilers.command import ParsedCommand, output_paths, parse_command
from cacheaudit.compilers.effective import (
    RAW_SUFFIX,
    ArgvExpansion,
    effective_argv,
    expand_argv,
)
from cacheaudit.compilers.identity import (
    DictMemo,
    IdentityMemo,
    host_compiler_path,
    identify,
    identify_recorded,
    identity_cache_key,
    recorded_distrust,
)
from cacheaudit.compilers.kinds import compiler_kind
from cacheaudit.compilers.memo import FileMemo
from cacheaudit.compilers.options import ArgUnit
from cacheaudit.compilers.tokenizers import (
    quote_gcc_response_file,
    quote_nvcc_env,
    quote_nvcc_options_file,
    split_clang_response_file,
    split_gcc_response_file,
    split_nvcc_env,
    split_nvcc_options_file,
)
from cacheaudit.compilers.wrappers import resolve_wrappers
from cacheaudit.programs import find_program, is_executable_file

TYPE_CHECKING = False
if TYPE_CHECKING:
    from cacheaudit.compilers.allowed import Screened, screen_options


def __getattr__(name: str) -> object:
    """`allowed` on first use: the rebuild oracle screens commands, every shim compile imports
    this package and screens nothing."""
    if name in ("Screened", "screen_options"):
        from cacheaudit.compilers import allowed

        return getattr(allowed, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")

__all__ = [
    "RAW_SUFFIX",
    "ArgUnit",
    "ArgvExpansion",
    "DictMemo",
    "FileMemo",
    "IdentityMemo",
    "ParsedCommand",
    "Screened",
    "compiler_kind",
    "effective_argv",
    "expand_argv",
    "find_program",
    "host_compiler_path",
    "identify",
    "identify_recorded",
    "identity_cache_key",
    "is_executable_file",
    "output_paths",
    "parse_command",
    "quote_gcc_response_file",
    "quote_nvcc_env",
    "quote_nvcc_options_file",
    "recorded_distrust",
    "resolve_wrappers",
    "screen_options",
    "split_clang_response_file",
    "split_gcc_response_file",
    "split_nvcc_env",
    "split_nvcc_options_file",
]
