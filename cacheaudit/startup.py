"""The start-up hook: cacheaudit in any Python process whose environment asks for it.

Installed with the package as `cacheaudit-startup.pth` (and the PEP 829 form
`cacheaudit-startup.start`, which Python 3.15+ prefers). The `.pth` line reads two environment
variables and does nothing else unless `CACHEAUDIT=1` (set by `cacheaudit run` and the pytest
plugin, inherited by child processes) or `CACHEAUDIT_CONFIG` is set; `CACHEAUDIT_DISABLE=1` opts a
process out. When on, it arms the in-process adapters (each installs when its runtime is first
imported) and, where no session prepared the environment yet, prepares one so that compilers run
by this process and its children go through the shim. Running it twice does nothing the second
time; any error is reported in one line and the process goes on.
"""

from __future__ import annotations

import atexit
import os
import sys

_started = False


def process_startup() -> bool:
    """Activate cacheaudit in this process if the environment asks; True if it did."""
    global _started
    if _started:
        return False
    # Only the switches here: this runs in every Python process of a session, most of which
    # compile nothing; the rest of cacheaudit is imported when it is needed.
    from cacheaudit import switches

    if switches.in_shim_process(sys.orig_argv):
        # The shim records its compile itself; a session or adapters here would only cost the
        # compile start-up time and split one build across runs.
        return False
    if not switches.enabled(os.environ):
        return False
    _started = True
    try:
        if not os.environ.get(switches.SHIMS):
            from cacheaudit import session

            prepared = session.prepare(os.environ, ledger=_ledger_setting(),
                                       label="startup")
            os.environ.update(prepared.env)
            atexit.register(prepared.close)
        from cacheaudit import runtimes

        runtimes.activate()
    except Exception as exc:  # noqa: BLE001 - a start-up hook never stops the program
        sys.stderr.write(f"cacheaudit: start-up hook failed: {type(exc).__name__}: {exc}\n")
    return True


def _ledger_setting() -> str:
    """The same precedence as the CLI's: CACHEAUDIT_LEDGER, then the configuration's ledger."""
    from cacheaudit.config import Settings, ledger_location, load_settings
    from cacheaudit.switches import CONFIG, LEDGER

    config = os.environ.get(CONFIG)
    settings = load_settings(os.path.dirname(os.path.abspath(config))) if config else Settings()
    return ledger_location(os.environ.get(LEDGER), settings)


def pth_entry() -> None:
    """The PEP 829 `.start` entry point (process_startup applies the same gate as the `.pth`
    line)."""
    process_startup()
