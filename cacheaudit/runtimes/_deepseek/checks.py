"""The audit's questions about the `<PREFIX>_JIT_*` settings DeepJIT, DeepGEMM and DeepEP share.

The audit itself knows no runtime's settings; the three runtimes' policies answer through two
hooks of the policy base, implemented here once for the family:

- `scan_findings` (CA203): how each family the scanned entries' runtimes read resolves in the
  scan's environment. DeepJIT takes `DJ_JIT_<X>` when `<PREFIX>_JIT_<X>` is unset; DeepGEMM <= 2.6
  and DeepEP's EPv2 JIT read only their own prefix and ignore a `DJ_` value.
- `configuration_changes` (CA204): the settings a runtime read when constructed (its process's
  first compile) that a later compile's environment gives another value.

The rules for resolving a setting (lookup order, defaults, which are read at construction) are
the environment registry's (`resolve_jit_settings`, one flavour per runtime).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from cacheaudit.envvars import redact
from cacheaudit.evidence import VariableEvidence
from cacheaudit.findings import make_finding
from cacheaudit.model import CacheEntry, Finding
from cacheaudit.policy import ConfigurationChange
from cacheaudit.runtimes import policy_for
from cacheaudit.runtimes._deepseek.environment import FLAVOUR_NAMES, resolve_jit_settings
from cacheaudit.runtimes._deepseek.policy import FamilyPolicy

SCAN_FAMILY = "deepseek"
"""The `scan_family` of the three runtimes' policies: a `DJ_` value reaches all of them."""

FALLBACK_PREFIX = "DJ"


def _jit_part(env: Mapping[str, str]) -> dict[str, str]:
    return {name: value for name, value in env.items() if "_JIT_" in name}


def configuration_changes(policy: FamilyPolicy, entry: CacheEntry, first_env: Mapping[str, str],
                          env: Mapping[str, str]) -> list[ConfigurationChange]:
    """CA204's evidence for one compile: each setting of the families the runtime read (settled
    at construction, so judged by `first_env`) that it reads at construction and that `env`
    resolves to another value."""
    if policy.flavour is None or _jit_part(first_env) == _jit_part(env):
        return []  # the common case, thousands of times a scan: nothing to resolve
    families = policy.env_families(entry, first_env)
    changes: list[ConfigurationChange] = []
    for prefix in families.prefixes:
        before = {s.suffix: s for s in resolve_jit_settings(
            prefix, first_env, flavour=policy.flavour)}
        for now in resolve_jit_settings(prefix, env, flavour=policy.flavour):
            then = before.get(now.suffix)
            if then is None or now.read_at != "construction" or then.value == now.value:
                continue
            changes.append(ConfigurationChange(
                setting=f"{prefix}_{now.suffix}",
                recorded=f"{then.name or 'default'}={then.value}",
                current=f"{now.name or 'default'}={now.value}",
                how=f"env prefix {prefix}: {families.how}"))
    return changes


def prefix_fallback_findings(entries: Sequence[CacheEntry],
                             env: Mapping[str, str]) -> list[Finding]:
    """CA203 for the families the entries' runtimes read in `env`: a `DJ_JIT_<X>` set while
    `<prefix>_JIT_<X>` is not, taken or ignored depending on the runtime."""
    if not any(name.startswith(f"{FALLBACK_PREFIX}_") for name in env):
        return []  # CA203 is about a DJ_ value taken or ignored: none is set
    findings: list[Finding] = []
    for (prefix, flavour), why in sorted(_families_found(entries, env).items()):
        findings += _prefix_lookup(prefix, flavour, why, env)
    return findings


def _families_found(entries: Sequence[CacheEntry],
                    env: Mapping[str, str]) -> dict[tuple[str, str], str]:
    """(prefix, flavour) -> why, for the `<PREFIX>_JIT_*` families the entries' runtimes read in
    this environment. Where nothing tells a DeepJIT entry's prefix, each family its runtime can
    have counts, since a `DJ_` value reaches any of them."""
    found: dict[tuple[str, str], str] = {}
    for entry in entries:
        try:
            policy = policy_for(entry.runtime)
        except KeyError:
            continue
        if not isinstance(policy, FamilyPolicy) or policy.flavour is None:
            continue
        families = policy.env_families(entry, env)
        prefixes = families.prefixes or policy.env_prefixes
        how = families.how if families.prefixes else (
            f"{families.how}, so it may be any of {', '.join(p + '_' for p in prefixes)}")
        for prefix in prefixes:
            found.setdefault((prefix, policy.flavour), f"the runtime of {entry.path} ({how})")
    return found


def _prefix_lookup(prefix: str, flavour: str, why: str, env: Mapping[str, str]) -> list[Finding]:
    """CA203 for one family: a `DJ_JIT_<X>` set while `<prefix>_JIT_<X>` is not, which
    DeepJIT takes in its place and DeepGEMM <= 2.6 and DeepEP's EPv2 JIT ignore."""
    findings = []
    runtime = FLAVOUR_NAMES[flavour]
    for setting in resolve_jit_settings(prefix, env, flavour=flavour):
        own = f"{prefix}_{setting.suffix}"
        fallback = f"{FALLBACK_PREFIX}_{setting.suffix}"
        if setting.origin == "fallback":
            findings.append(make_finding(
                "CA203", subject=own,
                message=f"{own} is unset; a {runtime} runtime with env prefix {prefix} "
                        f"falls back to {setting.name}",
                current=VariableEvidence(str(setting.name), setting.value),
                how=f"{runtime}'s lookup order: prefixed, then DJ_, then the default; "
                    f"{prefix}_ is read by {why}"))
        elif setting.origin == "default" and fallback in setting.ignored:
            default = setting.default if setting.default is not None else "(none)"
            findings.append(make_finding(
                "CA203", subject=own,
                message=f"{own} is unset and {fallback} is set, but {runtime} reads only "
                        f"{prefix}_ variables: it ignores {fallback} and uses its default "
                        f"({default})",
                current=VariableEvidence(fallback, redact(fallback, env[fallback])),
                how=f"{runtime}'s lookup: {prefix}_ only, no DJ_ fallback; {why}"))
    return findings
