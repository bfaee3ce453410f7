"""Progress of a long scan where no terminal shows a bar: a line on stderr at most every
`interval` seconds (a CI log wants a sign of life, not a line per entry)."""

from __future__ import annotations

import time
from collections.abc import Callable

PROGRESS_INTERVAL_S = 10.0


class ProgressLines:
    """A `progress(done, total)` callback that writes "LABEL: DONE/TOTAL entries" through
    `write` once `interval` seconds have passed since the start or the last line, and never more
    often: a scan shorter than the interval stays silent. `clock` is a monotonic clock in
    seconds."""

    def __init__(self, write: Callable[[str], None], *, label: str = "cacheaudit: auditing",
                 interval: float = PROGRESS_INTERVAL_S,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self._write = write
        self._label = label
        self._interval = interval
        self._clock = clock
        self._last = clock()

    def __call__(self, done: int, total: int) -> None:
        now = self._clock()
        if now - self._last < self._interval:
            return
        self._last = now
        self._write(f"{self._label}: {done}/{total} entries\n")
