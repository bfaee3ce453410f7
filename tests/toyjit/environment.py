"""ToyJIT's environment: its own variables, and what its key holds of the generic ones."""

from __future__ import annotations

from cacheaudit.envvars import Reading, Variable, reads, variable

RUNTIME = "toyjit"

ROWS: tuple[Variable | Reading, ...] = (
    variable("TOYJIT_CACHE_DIR", "cache-location", "ToyJIT's cache root",
             not_in_key=(RUNTIME,), source="tests/toyjit/runtime.py"),
    variable("TOYJIT_FLAGS", "compiler-flags", "options ToyJIT adds to every compile",
             in_key=(RUNTIME,), source="tests/toyjit/runtime.py key_of"),
    variable("TOYJIT_CXX", "compiler-choice", "the compiler ToyJIT runs",
             not_in_key=(RUNTIME,), source="tests/toyjit/runtime.py compile"),
    *(reads(name, not_in_key=(RUNTIME,), source="tests/toyjit/runtime.py key_of")
      for name in ("CPATH", "CPLUS_INCLUDE_PATH", "PATH")),
)
