"""The audit's checks: pure functions of an `AuditContext`, an entry, its compile record and its
runtime's policy, each returning findings. None runs a subprocess or writes the ledger; what they
need from either the scan has put in the context.

- `inputs`: the files the compile read against the disk now (CA101-CA106)
- `environment`: the environment, per entry and once per scan (CA201-CA204)
- `compiler`: the compiler and host compiler now (CA301, CA302)
- `entry`: the entry as a whole (CA401, CA402) and why it stays unverified (CA501)
- `rebuild`: the rebuild oracle's comparisons and proofs (CA403, CA404), imported by
  `audit.verify` from its module
"""

from cacheaudit.audit.checks.compiler import compiler_findings
from cacheaudit.audit.checks.entry import (
    internal_error_finding,
    leftover_finding,
    modified_during_compile,
    no_policy_finding,
    no_record_finding,
    problem_findings,
    registry_finding,
    tracked_set_findings,
)
from cacheaudit.audit.checks.environment import (
    configuration_findings,
    environment_findings,
    scan_environment_findings,
)
from cacheaudit.audit.checks.inputs import (
    find_shadows,
    input_findings,
    memory_hits_after,
    search_directories,
    shadow_findings,
    tracked_change_findings,
)

__all__ = [
    "compiler_findings",
    "configuration_findings",
    "environment_findings",
    "find_shadows",
    "input_findings",
    "internal_error_finding",
    "leftover_finding",
    "memory_hits_after",
    "modified_during_compile",
    "no_policy_finding",
    "no_record_finding",
    "problem_findings",
    "registry_finding",
    "scan_environment_findings",
    "search_directories",
    "shadow_findings",
    "tracked_change_findings",
    "tracked_set_findings",
]
