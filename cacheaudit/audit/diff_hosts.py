"""`diff --by-host`: in a combined ledger (ranks, nodes), the kernels whose binary or inputs
differ between hosts for the same key, the hosts grouped by what they agree on, the odd ones
out named, and what makes them odd (the compiler, host compiler, options, variables, inputs).

The comparison runs over content classes (`diff_fleet.FleetReader`), folded per kernel while
the compiles are read, from one combined ledger or from each host's ledger in place, so that a
fleet of a thousand hosts and ten million records is one upsert a compile; only the kernels
that differ are read back as records, to say how.
"""

from __future__ import annotations

import os
from collections import Counter
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field

from cacheaudit.audit.diff import KernelDiff, compare_pair
from cacheaudit.audit.diff_fleet import SIGNATURE_PARTS, FleetReader, HostCompile, Identity
from cacheaudit.ledger import Ledger
from cacheaudit.ledger.spool import open_ledger

PARTS = SIGNATURE_PARTS
"""What a host's compile of a kernel is compared on."""


@dataclass
class HostGroup:
    """Hosts whose compiles of one kernel agree on every part."""

    hosts: list[str]
    record_uuid: str  # one compile of the group, to read back
    source: str = ""  # the ledger that holds it


@dataclass
class HostKernel:
    """A kernel (runtime, kernel, key) that not every host built alike."""

    runtime: str | None
    kernel: str | None
    key: str | None
    groups: list[HostGroup]  # largest first: groups[0] is the majority
    parts: list[str]  # the parts that differ between the groups
    odd: list[KernelDiff] = field(default_factory=list)
    """For each host outside the majority, its compile against the majority's (record_a)."""

    @property
    def odd_hosts(self) -> list[str]:
        return [host for group in self.groups[1:] for host in group.hosts]


@dataclass
class FleetDiff:
    ledger: str  # the first ledger read (the combined one, when one is given)
    hosts: list[str]
    kernels: int  # identities compared (compiled on two hosts or more)
    compiles: int
    differing: list[HostKernel]
    ledgers: list[str] = field(default_factory=list)  # every ledger read
    skipped: list[str] = field(default_factory=list)  # "path: why" of each that could not be

    @property
    def same(self) -> bool:
        return not self.differing

    @property
    def odd_hosts(self) -> Counter[str]:
        """How many differing kernels each odd host is odd in."""
        return Counter(host for kernel in self.differing for host in kernel.odd_hosts)


def _group(compiles: Iterable[HostCompile]) -> tuple[list[HostGroup], list[str]] | None:
    """Hosts grouped by signature, largest group first (ties by first host name), and the parts
    that differ between the groups; None when every host agrees or one host built it. A host
    that built the kernel twice differently counts in both groups."""
    by_signature: dict[tuple[int, ...], dict[str, HostCompile]] = {}
    hosts: set[str] = set()
    for compile_ in compiles:
        by_signature.setdefault(compile_.signature, {}).setdefault(compile_.host, compile_)
        hosts.add(compile_.host)
    if len(by_signature) < 2 or len(hosts) < 2:
        return None
    groups = []
    for members in by_signature.values():
        first = members[min(members)]
        groups.append(HostGroup(sorted(members), first.record_uuid, first.source))
    groups.sort(key=lambda g: (-len(g.hosts), g.hosts[0]))
    signatures = list(by_signature)
    parts = [part for index, part in enumerate(PARTS)
             if len({signature[index] for signature in signatures}) > 1]
    return groups, parts


def _order(identity: Identity) -> tuple[tuple[bool, str], ...]:
    return tuple((value is not None, value or "") for value in identity)


def diff_by_host(sources: Ledger | Sequence[str], *, explain: int = 50) -> FleetDiff:
    """Every kernel compiled on two hosts or more, grouped by host, over one combined ledger
    or the hosts' own ledgers read in place; the first `explain` differing kernels are read
    back and compared record against record (how they differ).

    Two passes (`FleetReader`): the first folds every compile into its kernel's signatures,
    the second reads back the compiles of the kernels whose hosts disagree, and groups their
    hosts. A ledger that cannot be read is skipped and named (`FleetDiff.skipped`)."""
    paths = [sources.path] if isinstance(sources, Ledger) else [os.fspath(s) for s in sources]
    with FleetReader(paths) as reader:
        read = reader.read()
        shared = [identity for identity, kernel in read.kernels.items() if kernel.many_hosts]
        candidates = sorted((i for i in shared if len(read.kernels[i].signatures) > 1),
                            key=_order)
        compiles: dict[Identity, list[HostCompile]] = {}
        for compile_ in reader.compiles_of(candidates):
            compiles.setdefault(compile_.identity, []).append(compile_)
    differing: list[HostKernel] = []
    for identity in candidates:
        found = _group(compiles.get(identity, []))
        if found is not None:
            differing.append(HostKernel(*identity, groups=found[0], parts=found[1]))
    _explain(sources if isinstance(sources, Ledger) else None, differing[:explain])
    first = read.sources[0] if read.sources else (paths[0] if paths else "")
    return FleetDiff(first, sorted(read.hosts), len(shared), read.compiles, differing,
                     read.sources, read.skipped)


def _explain(ledger: Ledger | None, kernels: list[HostKernel]) -> None:
    """Each odd group's compile compared with the majority's: what makes the odd ones odd.
    The records are read from the ledger that holds each (`ledger`, when it is the one)."""
    wanted: dict[str, set[str]] = {}
    for kernel in kernels:
        for group in kernel.groups:
            wanted.setdefault(group.source, set()).add(group.record_uuid)
    records = {}
    for source, uuids in wanted.items():
        if ledger is not None and os.path.abspath(ledger.path) == source:
            records.update(ledger.records_by_uuid(uuids))
            continue
        with open_ledger(source, create=False) as opened:
            records.update(opened.records_by_uuid(uuids))
    for kernel in kernels:
        majority = records.get(kernel.groups[0].record_uuid)
        for group in kernel.groups[1:]:
            odd = records.get(group.record_uuid)
            if majority is not None and odd is not None:
                kernel.odd.append(compare_pair(majority, odd))
