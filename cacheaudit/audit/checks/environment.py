"""Checks of the environment (CA201-CA204).

Per entry: a compile-affecting variable the key misses that differs from build time (CA202;
inside a scope, judged against the environment the scope's observers saw the entry under), and
a setting the runtime read at construction that changed before this compile (CA204, whose
settings the runtime's policy names). Once per scan: a variable set now that the scanned
runtimes' keys miss (CA201), and what each runtime's policy says about the scan's environment
(`Policy.scan_findings`: a DeepSeek runtime's `DJ_` fallback, CA203, for example).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from cacheaudit import envvars
from cacheaudit.audit.context import AuditContext
from cacheaudit.audit.observations import STAND_IN
from cacheaudit.evidence import Evidence, VariableEvidence
from cacheaudit.findings import make_finding, ns_text
from cacheaudit.model import CacheEntry, CompileRecord, Finding
from cacheaudit.policy import Policy


def environment_findings(context: AuditContext, entry: CacheEntry, record: CompileRecord,
                         policy: Policy) -> list[Finding]:
    """CA202: an implicit input of the runtime that differs between the recorded compile and
    the environment the entry is judged under: inside a scope, the environment of the scope's
    latest observation of the entry (its own compile or hit record), else, and where no
    observer saw the hit's environment, this process's environment (the finding says which)."""
    if record.reconstructed:
        return []  # a reconstruction knows the files, not the environment of the original compile
    findings = []
    nvcc = record.compiler is None or record.compiler.kind == "nvcc"
    env_now: Mapping[str, str] = context.env_now
    # The registry's statuses for this entry's kind: a runtime whose layers key different
    # variables declares a variant per layer (Policy.environment_variant).
    variant = policy.environment_variant(entry)
    how = "recorded compile environment against this environment"
    against = "this environment"
    if context.observed is not None:
        seen = context.observed.latest(entry.path, record)
        if seen is None:
            how = f"recorded compile environment against this environment; {STAND_IN}"
        else:
            env_now, against = seen.env, seen.how
            how = f"recorded compile environment against {seen.how}"
    for name in sorted(set(record.env) | set(env_now)):
        if envvars.selects_compiler(name) or not envvars.is_implicit_input(name, entry.runtime,
                                                                          variant):
            continue
        if name.startswith("NVCC_") and not nvcc:
            continue  # only nvcc reads NVCC_*: a g++ build did not change with them
        then, now = record.env.get(name), env_now.get(name)
        if then != now:
            findings.append(make_finding(
                "CA202", subject=name, entry=entry, record=record,
                message=f"{name} changes what the compiler does but not {entry.runtime}'s "
                        f"key: a hit under {against} serves a binary built under the recorded "
                        f"value",
                recorded="(unset)" if then is None else then,
                current="(unset)" if now is None else now, how=how,
                evidence=Evidence(VariableEvidence(name, then), VariableEvidence(name, now))))
    return findings


def configuration_findings(context: AuditContext, entry: CacheEntry, record: CompileRecord,
                           policy: Policy) -> list[Finding]:
    """CA204: a setting the runtime reads once, at construction, differs between the first
    compile of the runtime's process and this one; the runtime went on with the first
    value."""
    if not policy.reads_configuration_once:
        return []
    construction = context.construction(record, policy)
    if construction is None or construction.started_ns >= record.started_ns:
        return []
    started_ns, first_env, process = construction
    return [make_finding(
        "CA204", subject=change.setting, entry=entry, record=record,
        message=f"{change.setting} changed after the runtime read its configuration (its "
                f"first compile in {process}, {ns_text(started_ns)}): {entry.runtime} still "
                f"used the first value for this compile",
        recorded=change.recorded, current=change.current,
        how=f"environment of the first compile in {process} against this compile's; "
            f"{change.how}")
        for change in policy.configuration_changes(entry, first_env, record.env)]


def scan_environment_findings(context: AuditContext, entries: Sequence[CacheEntry],
                              judged: Sequence[tuple[CacheEntry, Policy]]) -> list[Finding]:
    """The scan's environment, judged once for the runtimes of `entries`: CA201, then what
    each family of policies (`Policy.scan_family`) says of it for its entries in `judged`."""
    findings = []
    # Each runtime is judged in the variants its scanned entries are classed by
    # (`Policy.environment_variant`; None for an entry without a policy, and for most runtimes):
    # a variable is an implicit input of the scan when some scanned entry's key misses it.
    variants: dict[str, set[str | None]] = {e.runtime: set() for e in entries}
    with_policy: set[int] = set()
    for entry, policy in judged:
        with_policy.add(id(entry))
        variants[entry.runtime].add(policy.environment_variant(entry))
    for entry in entries:
        if id(entry) not in with_policy:
            variants[entry.runtime].add(None)
    # A runtime the registry cannot judge is reported per entry (CA501), not here.
    views = {r: [context.registry(r, v) for v in sorted(kinds, key=str)]
             for r, kinds in variants.items() if context.registry(r).problem is None}
    for name, value in sorted(context.env_now.items()):
        if envvars.selects_compiler(name):
            continue
        blind = sorted(r for r, kinds in views.items()
                       if any(name in view.implicit_now for view in kinds))
        if blind:
            findings.append(make_finding(
                "CA201", subject=name,
                message=f"{name} is set and changes compiles, but the key of "
                        f"{', '.join(blind)} does not include it: entries built under "
                        f"another value are served as if it were the same",
                current=value, how="this environment against the variable registry",
                evidence=Evidence(current=VariableEvidence(name, value))))
    families: dict[str, tuple[Policy, list[CacheEntry]]] = {}
    for entry, policy in judged:
        family = policy.scan_family or f"runtime:{policy.runtime}"
        families.setdefault(family, (policy, []))[1].append(entry)
    for first, members in families.values():
        findings += first.scan_findings(members, context.env)
    return findings
