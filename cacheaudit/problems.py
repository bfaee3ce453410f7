"""Problems of cacheaudit's own, reported where the user will see them without being stopped.

Stdlib only: the post-import hooks, the adapters and the recorder all report through here, and
none of them may fail the user's compile, import or test because reporting failed.
"""

from __future__ import annotations

import sys

RECORDING = "recording failed, the compile is unaffected: "


def report_problem(problem: str, stream: object = None, *, prefix: str = RECORDING) -> None:
    """One line on stderr, prefixed so that users can tell it from the compiler's own output
    (by default as a recording problem that left the compile alone)."""
    import contextlib  # here, not above: every session's first process imports this module

    target = stream if stream is not None else sys.stderr
    with contextlib.suppress(Exception):
        target.write(f"cacheaudit: {prefix}{problem}\n")  # type: ignore[attr-defined]
        target.flush()  # type: ignore[attr-defined]
