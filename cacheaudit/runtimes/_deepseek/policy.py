"""The policy base of the DeepSeek family: the `<PREFIX>_JIT_*` settings a runtime reads and how.

DeepJIT, DeepGEMM and DeepEP read settings named `<PREFIX>_JIT_<SUFFIX>`, each in its own way (a
flavour of `environment.py`'s rules); their policies say which prefixes, and for an entry which of
them its runtime read, so that CA203 and CA204 (`checks.py`) judge the right family.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import NamedTuple

from cacheaudit.model import CacheEntry
from cacheaudit.policy import Policy


class EnvFamilies(NamedTuple):
    """The `<PREFIX>_JIT_*` families one entry's runtime reads, and the evidence for them."""

    prefixes: tuple[str, ...]
    """Empty when nothing says which of the policy's families the runtime read."""
    how: str


class FamilyPolicy(Policy):
    """A policy of a runtime that reads `<PREFIX>_JIT_*` settings."""

    env_prefixes: tuple[str, ...] = ()
    """The `<PREFIX>_JIT_*` families this runtime reads (for CA203, CA204)."""

    flavour: str | None = None
    """How it reads them: a flavour of `environment.FLAVOURS`."""

    def env_families(self, entry: CacheEntry, env: Mapping[str, str]) -> EnvFamilies:
        """Which of `env_prefixes` the runtime that built `entry` reads, judged from the entry
        and `env` (the environment it was configured from). Default: all of them, with nothing
        to say which."""
        return EnvFamilies(self.env_prefixes, "")

    def compiler_variables(self, entry: CacheEntry, env: Mapping[str, str]) -> tuple[str, ...]:
        """`<P>_JIT_NVCC_COMPILER` of the families that built `entry` (all of them when nothing
        says which), then the spec's settings (DeepJIT's `DJ_` fallback)."""
        from cacheaudit.spec import spec

        prefixes = self.env_families(entry, env).prefixes or self.env_prefixes
        own = tuple(f"{prefix}_JIT_NVCC_COMPILER" for prefix in prefixes)
        declared = spec(self.runtime)
        # A pattern setting (`<P>_JIT_NVCC_COMPILER`) names no variable: `own` holds its names.
        named = tuple(s.name for s in declared.compiler_settings
                      if s.pattern is None) if declared else ()
        return tuple(dict.fromkeys(own + named))
