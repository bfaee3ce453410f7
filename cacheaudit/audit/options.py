"""What a user asks of an audit: which codes to keep, whether to reconstruct or recompute keys,
and the `--fail-on` threshold."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from cacheaudit.model import Finding, Severity


@dataclass(frozen=True)
class AuditOptions:
    select: frozenset[str] = frozenset()
    ignore: frozenset[str] = frozenset()
    reconstruct: bool = True
    verify_keys: bool = False
    include_dirs: tuple[str, ...] = ()
    """Include trees the user named (`--include-dir`), for policies whose runtime takes its
    headers from an installed package (`Policy.for_audit`)."""


def fails(findings: Iterable[Finding], fail_on: str) -> bool:
    """Whether any finding reaches the `--fail-on` threshold (error, warning, info or never)."""
    if fail_on == "never":
        return False
    threshold = Severity(fail_on).rank
    return any(f.severity.rank >= threshold for f in findings)


def keep(findings: Iterable[Finding], options: AuditOptions) -> list[Finding]:
    """`--select`/`--ignore` by code or code prefix (`CA1` selects CA101-CA106)."""
    def wanted(code: str) -> bool:
        if options.select and not any(code.startswith(s) for s in options.select):
            return False
        return not any(code.startswith(i) for i in options.ignore)

    return [f for f in findings if wanted(f.code)]
