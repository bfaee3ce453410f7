"""What the audit of a scope found (`RunReport`) and what the scope did (`Counts`): plain
values, apart from the judge (`cacheaudit.audit.scope`), so that an integration that had
nothing to audit reports it without importing the judge (the pytest plugin of a session that
recorded nothing and knows no cache root)."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Mapping, Sequence

    from cacheaudit.ledger.sessions import SessionWrites
    from cacheaudit.model import CompileRecord, Finding
    from cacheaudit.watch import Observation


@dataclass(frozen=True)
class Counts:
    """What a scope did, counted once for every output.

    `compiles`: builds (an in-process observer's compile record, or a compile through the shim
    that no such record's span holds; link steps are invocations, not builds); `disk_hits`:
    disk-hit records plus the entries seen hit only by a marker or by their opens;
    `invocations`: compiler processes the shim recorded; `entries_judged`: the entries the scope
    answers for, `possibly_served` of them because their opens could not be observed."""

    compiles: int = 0
    disk_hits: int = 0
    disk_hits_unrecorded: int = 0
    memory_hits: int = 0
    invocations: int = 0
    entries_judged: int = 0
    possibly_served: int = 0

    def as_dict(self) -> dict[str, int]:
        return dataclasses.asdict(self)

    def text(self) -> str:
        hits = _many(self.disk_hits, "disk hit")
        if self.disk_hits_unrecorded:
            hits += f" ({self.disk_hits_unrecorded} seen by a hit marker or file opens)"
        judged = f"{_many(self.entries_judged, 'entry', 'entries')} judged"
        if self.possibly_served:
            judged += f" ({self.possibly_served} may have been served: opens not observed)"
        return (f"{_many(self.compiles, 'compile')}, {hits}, "
                f"{_many(self.memory_hits, 'memory hit')}, "
                f"{_many(self.invocations, 'compiler invocation')} through the shim; {judged}")


def _many(number: int, one: str, many: str | None = None) -> str:
    return f"{number} {one if number == 1 else many or one + 's'}"


@dataclass
class RunReport:
    """What a scope did with JIT caches, and the findings about it."""

    run_uuid: str
    records: list[CompileRecord]
    findings: list[Finding]
    roots: list[tuple[str, str]] = field(default_factory=list)
    counts: Counts = field(default_factory=Counts)
    unobserved: dict[str, str] = field(default_factory=dict)
    """Entry -> why the run may have been served it unseen (only those with findings kept)."""

    def events(self) -> dict[str, int]:
        """The counts under the record event names (`--report-json`'s `events`)."""
        return {"compile": self.counts.compiles, "disk-hit": self.counts.disk_hits,
                "memory-hit": self.counts.memory_hits}

    def summary(self) -> str:
        return self.counts.text()


def nothing_to_audit(ledger: SessionWrites, run_uuid: str, env: Mapping[str, str],
                     roots: Sequence[str] = (), observation: Observation | None = None) -> bool:
    """Whether `audit_run` of `run_uuid` can only report nothing: it judges the entries of the
    cache roots that the run's records touched, those known to the ledger and to `env` (and
    `roots`, given) and those the observer planned to watch (`audit_scope`); with no record of
    the run and none of those roots it judges no entry, counts nothing and finds nothing, and
    its report is `RunReport(run_uuid, [], [])`. So is it where the observer watched every
    entry of the roots known at the start and saw none opened, and no other root is known now
    (`Observation.saw_nothing`): every entry the scope could answer for is one it built or
    opened. Cheap: one record is asked for, no entry read.
    """
    from cacheaudit.watch import known_roots

    if ledger.has_records_of(run_uuid):
        return False
    if observation is not None and observation.plan.roots:
        return observation.saw_nothing() and set(known_roots(ledger, env, roots)) <= set(
            observation.plan.roots)
    return not known_roots(ledger, env, roots)
