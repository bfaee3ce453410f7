"""Checks of the compiler that built an entry against the one at the same path now: compiler
drift the key does not see (CA301), host compiler drift behind nvcc (CA302), and a compiler that
is gone (CA501). The identities now are taken by the scan (`AuditContext.compilers`)."""

from __future__ import annotations

from cacheaudit.audit.context import AuditContext
from cacheaudit.evidence import CompilerEvidence, Evidence
from cacheaudit.findings import compiler_evidence, make_finding
from cacheaudit.model import CacheEntry, CompileRecord, Finding
from cacheaudit.policy import Policy


def compiler_findings(context: AuditContext, entry: CacheEntry, record: CompileRecord,
                      policy: Policy, current: str | None = None) -> list[Finding]:
    """`current`: the compiler the runtime would run now, where it looks its compiler up by
    name (`Policy.looks_up_compiler_by_name`) and finds another path; None judges the
    recorded path."""
    recorded = record.compiler
    if recorded is None or record.reconstructed:
        return []
    if current is not None:
        return _resolved_elsewhere(context, entry, record, policy, current)
    found = context.compilers[recorded.path]  # identified by the scan before judging
    if found.identity is None:
        return [make_finding("CA501", subject=recorded.path, entry=entry, record=record,
                             message=f"the compiler that built this entry is gone: {found.error}",
                             recorded=recorded.version_line, current="absent",
                             how="stat of the recorded compiler path",
                             evidence=Evidence(compiler_evidence(recorded), CompilerEvidence(
                                 path=recorded.path, exists=False)))]
    now = found.identity
    findings = []
    if found.not_run and (now.digest != recorded.digest or now.resolved != recorded.resolved):
        return [make_finding(
            "CA501", subject=recorded.path, entry=entry, record=record,
            message=f"the compiler at {recorded.path} is not the binary that built this entry, "
                    f"and it was not run to read its version ({found.not_run}): whether "
                    f"{entry.runtime}'s key changes with it is unknown",
            recorded=f"{recorded.resolved} xxh3 {(recorded.digest or '-')[:16]} "
                     f"({recorded.version_line})",
            current=f"{now.resolved} xxh3 {(now.digest or '-')[:16]} (not run)",
            how="content hash of the compiler now; a compiler a ledger names runs only for a "
                "record this user sealed (docs/security.md)")]
    if (now.digest != recorded.digest or now.version_text != recorded.version_text
            or now.resolved != recorded.resolved) and not policy.compiler_change_in_key(
                recorded, now):
        findings.append(make_finding(
            "CA301", subject=recorded.path, entry=entry, record=record,
            message=f"the compiler at {recorded.path} is not the one that built this entry, "
                    f"and {entry.runtime}'s key does not change with it",
            recorded=compiler_evidence(recorded), current=compiler_evidence(now),
            how="content hash and --version of the compiler now"))
    old_host, new_host = recorded.host, now.host
    if old_host is not None and new_host is not None and (
            old_host.digest != new_host.digest or old_host.version_text
            != new_host.version_text or old_host.resolved != new_host.resolved):
        findings.append(make_finding(
            "CA302", subject=old_host.path, entry=entry, record=record,
            message=f"nvcc's host compiler changed; it preprocesses and compiles part of "
                    f"every kernel, and {entry.runtime}'s key never covers it",
            recorded=f"{old_host.resolved} ({old_host.version_line})",
            current=f"{new_host.resolved} ({new_host.version_line})",
            how="identity of the host compiler nvcc would use now",
            evidence=Evidence(compiler_evidence(old_host), compiler_evidence(new_host))))
    return findings


def _resolved_elsewhere(context: AuditContext, entry: CacheEntry, record: CompileRecord,
                        policy: Policy, current: str) -> list[Finding]:
    """CA301 for a runtime that looks its compiler up again in each process and now finds
    another binary (`current`) than the one that built the entry, its key unchanged."""
    recorded = record.compiler
    assert recorded is not None
    now = context.compilers[current].identity  # identified by the scan before judging
    if now is None:
        return []  # nothing runs there: the runtime's next compile fails, no hit is stale
    if (now.digest == recorded.digest and now.version_text == recorded.version_text
            and now.resolved == recorded.resolved) or policy.compiler_change_in_key(
                recorded, now):
        return []
    return [make_finding(
        "CA301", subject=current, entry=entry, record=record,
        message=f"{entry.runtime} would now run {current}, not {recorded.path} that built this "
                f"entry, and its key does not change with it: the next process is served the "
                f"binary the old compiler built",
        recorded=compiler_evidence(recorded), current=compiler_evidence(now),
        how="the compiler the name the runtime was given resolves to now (under the "
            "audit's environment), against the recorded identity: content hash and --version")]
