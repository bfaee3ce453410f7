"""The environments a scope's observers saw its entries under (what the CA202 check of an entry
of a run compares the build's environment with).

A scan outside any scope judges an entry against the auditing process's environment: that is
what the next hit would see. Inside a scope (a `cacheaudit run`, a test session, a test) the
evidence is what the run itself saw: the environment of the run's own latest observation of the
entry (its compile record, or a hit record an in-process observer wrote). A job that sets
`NVCC_APPEND_FLAGS` itself compiled and was served under that value, whatever the controlling
process's environment says. Where nothing observed the environment of the run's hit (a hit seen
only by its file opens or by a runtime's marker), the auditing process's environment stands in,
and the finding says so.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

from cacheaudit.model import CompileRecord

STAND_IN = ("the auditing process's environment stands in for the run's: no observer saw the "
            "environment of this run's use of the entry")


@dataclass(frozen=True)
class SeenUnder:
    """One observation of an entry: when, under which compile-affecting environment, by what."""

    started_ns: int
    env: Mapping[str, str]
    how: str


@dataclass(frozen=True)
class ObservedEnvironments:
    """Per entry, the environment of a scope's latest hit record; and the runs whose own compile
    records count as observations of the entries they built."""

    runs: frozenset[str] = frozenset()
    hits: Mapping[str, SeenUnder] = field(default_factory=dict)

    @classmethod
    def of(cls, runs: Iterable[str], records: Iterable[CompileRecord]) -> ObservedEnvironments:
        hits: dict[str, SeenUnder] = {}
        for record in sorted(records, key=lambda r: (r.started_ns, r.record_id)):
            if record.event == "compile" or not record.entry or not record.env:
                continue
            hits[record.entry] = SeenUnder(
                record.started_ns, dict(record.env),
                f"the environment of this run's {record.event} of the entry "
                f"({record.observer or 'an in-process observer'})")
        return cls(frozenset(runs), hits)

    def latest(self, entry: str, compile_record: CompileRecord) -> SeenUnder | None:
        """The run's latest observation of `entry`, built by `compile_record`: a later hit record,
        else the compile itself when it belongs to one of the runs; None when the run saw the
        entry only where no environment is known."""
        hit = self.hits.get(entry)
        if hit is not None and hit.started_ns >= compile_record.started_ns:
            return hit
        if compile_record.run_uuid and compile_record.run_uuid in self.runs:
            return SeenUnder(compile_record.started_ns, dict(compile_record.env),
                             "the environment of this run's own compile of the entry")
        return hit
