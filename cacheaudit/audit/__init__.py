"""The judge: cache entries and compile records, checked against the disk and environment now.

- `context`: what a judgement needs (the loaded records, the environment now, the file-state
  cache, compiler identities, memos), one typed object
- `checks`: pure functions over the context, per concern (inputs, environment, compiler, entry)
- `scan`: all the I/O around them (roots, records, reconstruction, compilers, attributions)
- `scope`: the audit of a scope (a run, a window, a test: `audit_scope`, `audit_run`), its
  counts and the observer of the entries' opens (`ScopeObserver`); `run`: what it asks of a
  run's records (`audit_records`, `roots_of`); `observations`: the environments a scope saw

Reads the ledger and the disk; writes nothing but reconstructed records and attributions back to
the ledger (so that the next scan need not repeat the work).
"""

from cacheaudit.lazy import export_lazily

TYPE_CHECKING = False
if TYPE_CHECKING:
    from cacheaudit.audit.checks import modified_during_compile, search_directories
    from cacheaudit.audit.context import AuditContext, CompilerNow, live_process, runtime_process
    from cacheaudit.audit.execution import identify_compiler
    from cacheaudit.audit.options import AuditOptions, fails, keep
    from cacheaudit.audit.report import Counts, RunReport
    from cacheaudit.audit.run import audit_records, roots_of
    from cacheaudit.audit.scan import Auditor, ScanResult, discover, scan
    from cacheaudit.audit.scope import (
        Observation,
        Scope,
        ScopeObserver,
        audit_run,
        audit_scope,
    )

# Each name is imported from its module on first use: the judge (checks, scan, the runtimes'
# policies) costs tens of milliseconds, and a session that recorded nothing and knows no cache
# root needs only `RunReport` (docs/performance.md).
export_lazily(__name__, {
    "modified_during_compile": "checks", "search_directories": "checks",
    "AuditContext": "context", "CompilerNow": "context", "live_process": "context",
    "runtime_process": "context",
    "identify_compiler": "execution",
    "AuditOptions": "options", "fails": "options", "keep": "options",
    "Counts": "report", "RunReport": "report",
    "audit_records": "run", "roots_of": "run",
    "Auditor": "scan", "ScanResult": "scan", "discover": "scan", "scan": "scan",
    "Observation": "scope", "Scope": "scope", "ScopeObserver": "scope", "audit_run": "scope",
    "audit_scope": "scope",
})

__all__ = [
    "AuditContext",
    "AuditOptions",
    "Auditor",
    "CompilerNow",
    "Counts",
    "Observation",
    "RunReport",
    "ScanResult",
    "Scope",
    "ScopeObserver",
    "audit_records",
    "audit_run",
    "audit_scope",
    "discover",
    "fails",
    "identify_compiler",
    "keep",
    "live_process",
    "modified_during_compile",
    "roots_of",
    "runtime_process",
    "scan",
    "search_directories",
]
