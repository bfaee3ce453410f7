"""Inductor's default cache directories, from the standard library only: a
session reads them without the reader (`cacheaudit.runtimes.default_roots`)."""

from __future__ import annotations

import os

from cacheaudit.roots import unique_paths

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Mapping


_REPLACED = str.maketrans(dict.fromkeys('\\/:*?"<>|', "_"))
"""The characters torch replaces in the user's name (`re.sub(r'[\\/:*?"<>|]', "_", user)`)."""


def default_cache_dir(env: Mapping[str, str]) -> str:
    """`default_cache_dir()` under `env`: tempfile's directory (TMPDIR, TEMP, TMP, else /tmp)
    and getpass's user (LOGNAME, USER, LNAME, USERNAME, else the password database), with the
    characters torch replaces replaced (cache_dir_utils.py:24)."""
    temp = next((env[name] for name in ("TMPDIR", "TEMP", "TMP")
                 if env.get(name) and os.path.isdir(env[name])), None)
    if temp is None:
        if env is os.environ:
            import tempfile  # only here: tempfile imports random and shutil

            temp = tempfile.gettempdir()
        else:
            temp = "/tmp"
    user = next((env[name] for name in ("LOGNAME", "USER", "LNAME", "USERNAME") if env.get(name)),
                None)
    if user is None:
        try:
            # What getpass.getuser() falls back to, without getpass's imports (termios, ...).
            import pwd

            user = pwd.getpwuid(os.getuid()).pw_name
        except (KeyError, OSError, ImportError):
            user = f"uid_{os.getuid()}"
    return os.path.join(temp, "torchinductor_" + user.translate(_REPLACED))


def default_roots(env: Mapping[str, str]) -> list[str]:
    """cache_dir() (TORCHINDUCTOR_CACHE_DIR, made absolute, else the default), then the
    default directory, which holds the precompiled headers whatever the variable says."""
    default = default_cache_dir(env)
    explicit = env.get("TORCHINDUCTOR_CACHE_DIR")
    roots = [os.path.abspath(explicit)] if explicit else []
    return unique_paths([*roots, default])
