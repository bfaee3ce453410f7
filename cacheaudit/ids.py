"""Random ids, standard library `os` only: `uuid` imports `platform` and more, which every
shim process (a record id a compile) and every session's first process (a run id) would pay."""

from __future__ import annotations

import os


def uuid4_hex() -> str:
    """A random id, as `uuid.uuid4().hex` writes it: 32 hex digits of a version-4 UUID of the
    RFC 4122 variant, from `os.urandom` as `uuid4` draws it."""
    raw = bytearray(os.urandom(16))
    raw[6] = (raw[6] & 0x0F) | 0x40
    raw[8] = (raw[8] & 0x3F) | 0x80
    return raw.hex()


def hostname() -> str:
    """This host's name as `socket.gethostname()` gives it, without importing `socket` (which
    builds its enums on import, ~2 ms of every shim process): on POSIX both are the kernel's
    node name (glibc's `gethostname` is `uname`'s nodename; macOS reads `kern.hostname` for
    both), decoded alike; elsewhere `socket` itself."""
    uname = getattr(os, "uname", None)
    if uname is not None:
        return uname().nodename
    import socket

    return socket.gethostname()
