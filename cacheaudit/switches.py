"""The environment variables that switch cacheaudit on and off, and how they are read.

Standard library only, and nothing imported at the top but `os`: the start-up hook reads these in
every Python process of a session (`python -c pass` included), before it knows whether there is
anything to do, and the shim reads them before it hands a compiler query over.
"""

from __future__ import annotations

import os

# Annotations only: `collections.abc` would cost every Python process of a session (and the
# shim's query path) more than all of this module.
TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Mapping, Sequence

ACTIVE = "CACHEAUDIT"
"""Set by `cacheaudit run` and the pytest plugin: the start-up hook arms the adapters."""
CONFIG = "CACHEAUDIT_CONFIG"
LEDGER = "CACHEAUDIT_LEDGER"
SHIMS = "CACHEAUDIT_SHIMS"
"""The masquerade directory a session prepared; set once the environment is prepared."""
DISABLE_VARIABLE = "CACHEAUDIT_DISABLE"
RUNTIMES = "CACHEAUDIT_RUNTIMES"
"""Runtime packages outside cacheaudit (`cacheaudit.spec.EXTRA_VARIABLE`, which reads them)."""
ADAPTER_IMPORTS = "CACHEAUDIT_ADAPTER_IMPORTS"
"""Set by a session for its child processes: the top-level modules whose first import arms the
adapters (`cacheaudit.runtimes.arming_names`), so that their start-up hook reads no spec."""
RUN_VARIABLE = "CACHEAUDIT_RUN"
RUN_LABEL_VARIABLE = "CACHEAUDIT_RUN_LABEL"
REDACT_ARGV = "CACHEAUDIT_REDACT_ARGV"
"""Set to 0 (or false, no, off) to store command lines verbatim (`cacheaudit.ledger.redact`)."""

MARKER = ".cacheaudit-shim"
"""The file that marks a masquerade directory as ours (to every shim and `shim install`)."""


def flag_set(env: Mapping[str, str], name: str) -> bool:
    """A switch variable as every part of cacheaudit reads it: set, non-empty and not "0"."""
    return env.get(name, "") not in ("", "0")


def enabled(env: Mapping[str, str]) -> bool:
    """Whether the start-up hook should activate cacheaudit in a process with this environment."""
    if flag_set(env, DISABLE_VARIABLE):
        return False
    return flag_set(env, ACTIVE) or bool(env.get(CONFIG))


def is_masquerade_dir(directory: str) -> bool:
    return os.path.isfile(os.path.join(directory or ".", MARKER))


# Interpreter options a script's `#!` line may carry before the script (the masquerade
# directory's launcher runs `python -S`).
_INTERPRETER_FLAGS = frozenset({"-S", "-s", "-E", "-I", "-B", "-u", "-P", "-O", "-OO"})


def in_shim_process(argv: Sequence[str]) -> bool:
    """Whether this interpreter runs the shim: its script is a masquerade link (or the
    `cacheaudit-shim` script itself). The start-up hook stays out of such processes.
    `argv` is `sys.orig_argv`: the interpreter, its options, then the script."""
    index = 1
    while index < len(argv) and argv[index] in _INTERPRETER_FLAGS:
        index += 1
    script = argv[index] if index < len(argv) else ""
    return (os.path.basename(script).startswith("cacheaudit-shim")
            or is_masquerade_dir(os.path.dirname(script)))
