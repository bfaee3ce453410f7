"""Seals: which recorded commands the rebuild oracle may run without asking.

The rebuild oracle (`cacheaudit verify`) runs a compile record's command again. A ledger is a
plain SQLite file: another user's ledger, one restored from a CI artefact, or one edited after
the fact would otherwise let whoever wrote it choose the options and environment of a compile
the oracle runs. So every compile record is sealed when it is written: an HMAC-SHA256 over the
command (argv, effective argv, working directory, environment, record id), keyed by a secret of
the user who writes it. The oracle runs a record's command only when the seal checks out with the
current user's secret; anything else (no seal, another key, a command changed since) needs the
user's `--yes`.

The secret is 32 random bytes in `$XDG_CONFIG_HOME/cacheaudit/seal.key` (default
`~/.config/cacheaudit/seal.key`), mode 0600 in a 0700 directory, created on first use (the
first recorded compile). Standard library only: the shim's recording path imports it.
"""

from __future__ import annotations

import dataclasses
import hashlib
import hmac
import json
import os
from collections.abc import Mapping
from typing import NamedTuple

from cacheaudit.model import CompileRecord

VERSION = "v2"
"""v2 covers the compiler the record names too (its path, resolved binary and digest), so that
a scan may run that compiler's `--version` for a sealed record; a v1 seal (command only) still
vouches for the command."""
_VERSIONS = ("v1", "v2")
KEY_BYTES = 32
KEY_FILE = "seal.key"


def key_path(env: Mapping[str, str]) -> str:
    """Where the current user's sealing secret lives under `env`."""
    config = env.get("XDG_CONFIG_HOME") or os.path.join(
        env.get("HOME") or os.path.expanduser("~"), ".config")
    return os.path.join(config, "cacheaudit", KEY_FILE)


def user_key(env: Mapping[str, str], *, create: bool = True) -> bytes | None:
    """The current user's secret, created (0600, in a 0700 directory) when `create` and there is
    none yet; None when it cannot be read or made. A file another user owns, one others can
    read, or one of the wrong size is no secret: None."""
    path = key_path(env)
    try:
        return _read_key(path)
    except FileNotFoundError:
        if not create:
            return None
    except OSError:
        return None
    try:
        os.makedirs(os.path.dirname(path), mode=0o700, exist_ok=True)
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600)
    except FileExistsError:
        pass  # another process made it first: read theirs
    except OSError:
        return None
    else:
        with os.fdopen(fd, "wb") as handle:
            handle.write(os.urandom(KEY_BYTES))
    try:
        return _read_key(path)
    except OSError:
        return None


def _read_key(path: str) -> bytes | None:
    fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
    try:
        st = os.fstat(fd)
        if st.st_uid != os.geteuid() or st.st_mode & 0o077 or st.st_size != KEY_BYTES:
            return None
        data = os.read(fd, KEY_BYTES + 1)
    finally:
        os.close(fd)
    return data if len(data) == KEY_BYTES else None


def key_id(key: bytes) -> str:
    """A public name for a secret: tells "sealed by someone else" from "changed since"."""
    return hashlib.sha256(b"cacheaudit-seal-id:" + key).hexdigest()[:16]


def command_text(record: CompileRecord, version: str = VERSION) -> bytes:
    """What a seal covers: everything of a record the oracle's command is made from, and (v2)
    the compiler it names, which a scan may run (`--version`)."""
    covered: dict[str, object] = {
        "record": record.record_id,
        "argv": list(record.argv),
        "effective": [[t.text, t.origin] for t in record.effective_argv],
        "cwd": record.cwd,
        "env": sorted([str(k), str(v)] for k, v in record.env.items()),
    }
    if version != "v1":
        compiler = record.compiler
        covered["compiler"] = None if compiler is None else [
            compiler.invoked, compiler.path, compiler.resolved, compiler.digest]
    return json.dumps(covered, sort_keys=True, ensure_ascii=False).encode(
        "utf-8", "surrogateescape")


def seal_of(record: CompileRecord, key: bytes, version: str = VERSION) -> str:
    mac = hmac.new(key, command_text(record, version), hashlib.sha256).hexdigest()
    return f"{version}:{key_id(key)}:{mac}"


def sealed(record: CompileRecord, env: Mapping[str, str]) -> CompileRecord:
    """`record` with its seal, for a compile that has a command; unchanged when it has none or
    no secret can be had (it is then unsealed, and the oracle asks before running it)."""
    if record.event != "compile" or not record.argv or record.reconstructed:
        return record
    key = user_key(env)
    if key is None:
        return record
    return dataclasses.replace(record, seal=seal_of(record, key))


class SealCheck(NamedTuple):
    trusted: bool
    reason: str
    """Why not, in words ("" when trusted)."""
    covers_compiler: bool = False
    """The seal vouches for the record's compiler too (v2)."""


def check(record: CompileRecord, key: bytes | None,
          env: Mapping[str, str] | None = None) -> SealCheck:
    """Whether `record`'s command is as the current user (`key`) wrote it. With `env` (the
    environment `key` was read under) a seal made with another secret says where this user's
    secret is and which one sealed it, as far as can be known: the same user's secret under
    another XDG_CONFIG_HOME or HOME is not another user's."""
    if not record.seal:
        return SealCheck(False, "its command carries no seal (written before sealing, or by "
                                "a writer without a secret)")
    parts = record.seal.split(":")
    known = len(parts) == 3 and parts[0] in _VERSIONS
    if key is None:
        here = f" at {key_path(env)}" if env is not None else ""
        return SealCheck(False, f"there is no sealing secret{here} to check it with"
                         + (_found_elsewhere(parts[1], env) if known and env else ""))
    if not known:
        return SealCheck(False, "its seal is not one this cacheaudit writes")
    if parts[1] != key_id(key):
        return SealCheck(False, _other_secret(parts[1], key, env))
    if not hmac.compare_digest(record.seal, seal_of(record, key, parts[0])):
        return SealCheck(False, "its command was changed after it was written (the seal does "
                                "not match)")
    return SealCheck(True, "", covers_compiler=parts[0] != "v1")


def _other_secret(sealing_id: str, key: bytes, env: Mapping[str, str] | None) -> str:
    """Why a seal made with another secret than `key` does not check out, claiming no more
    than is known: which secret made it is known only when it is one of this user's."""
    if env is None:
        return (f"it was sealed with another secret (key {sealing_id}) than the one this "
                f"check uses (key {key_id(key)})")
    elsewhere = _found_elsewhere(sealing_id, env)
    if elsewhere:
        return f"it was not sealed with the secret at {key_path(env)}{elsewhere}"
    return (f"it was sealed with another secret (key {sealing_id}) than the one at "
            f"{key_path(env)} (key {key_id(key)}): one kept under another XDG_CONFIG_HOME or "
            "HOME, or another user's or machine's (a ledger copied from elsewhere)")


def _found_elsewhere(sealing_id: str, env: Mapping[str, str]) -> str:
    """", but with this user's secret at P: <what differs>" when a secret of this user's at
    another of the places it is looked for made the seal; "" when none did."""
    for place in _other_key_paths(env):
        try:
            other = _read_key(place)
        except OSError:
            continue
        if other is not None and key_id(other) == sealing_id:
            config = env.get("XDG_CONFIG_HOME")
            setting = (f"XDG_CONFIG_HOME={config}" if config
                       else f"HOME={env.get('HOME') or '~'} with XDG_CONFIG_HOME unset")
            return (f", but with this user's secret at {place}, where {setting} does not "
                    "point: run with the XDG_CONFIG_HOME and HOME it was recorded under")
    return ""


def _other_key_paths(env: Mapping[str, str]) -> list[str]:
    """Where else this user's secret is found under a usual environment: the default under
    HOME and under the account's home, and under this process's XDG_CONFIG_HOME."""
    current = key_path(env)
    homes = [env.get("HOME"), os.environ.get("HOME"), os.path.expanduser("~")]
    places = [key_path({"HOME": home}) for home in homes if home]
    if os.environ.get("XDG_CONFIG_HOME"):
        places.append(key_path(os.environ))
    return [place for place in dict.fromkeys(places) if place != current]


def compiler_trust(record: CompileRecord, key: bytes | None,
                   env: Mapping[str, str] | None = None) -> str | None:
    """Why the compiler `record` names may not be run (its `--version`), or None when this
    user's seal vouches for it (a v2 seal that checks out); `env` as for `check`."""
    checked = check(record, key, env)
    if not checked.trusted:
        return f"record {record.record_id[:12]}: {checked.reason}"
    if not checked.covers_compiler:
        return f"record {record.record_id[:12]}: its seal predates sealing the compiler"
    return None
