"""`diff --by-host`: in a combined ledger (ranks, nodes), the kernels whose binary or inputs
differ between hosts for the same key, the hosts grouped by what they agree on, the odd ones
out named, and what makes them odd (the compiler, host compiler, options, variables, inputs).

The comparison runs over content classes (`diff_queries.host_compiles`), one compact row per
compile, so that a fleet of a thousand hosts and ten million records is a few set-wise queries
and one pass; only the kernels that differ are read back as records, to say how.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass, field

from cacheaudit.audit.diff import KernelDiff, compare_pair
from cacheaudit.audit.diff_queries import (
    SIGNATURE_PARTS,
    HostCompile,
    content_classes,
    host_compiles,
)
from cacheaudit.ledger import Ledger

PARTS = SIGNATURE_PARTS
"""What a host's compile of a kernel is compared on."""


@dataclass
class HostGroup:
    """Hosts whose compiles of one kernel agree on every part."""

    hosts: list[str]
    record_uuid: str  # one compile of the group, to read back


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
    ledger: str
    hosts: list[str]
    kernels: int  # identities compared (compiled on two hosts or more)
    compiles: int
    differing: list[HostKernel]

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
    by_signature: dict[tuple[int, ...], dict[str, str]] = {}
    hosts: set[str] = set()
    for compile_ in compiles:
        by_signature.setdefault(compile_.signature, {}).setdefault(compile_.host,
                                                                   compile_.record_uuid)
        hosts.add(compile_.host)
    if len(by_signature) < 2 or len(hosts) < 2:
        return None
    groups = [HostGroup(sorted(members), members[min(members)])
              for members in by_signature.values()]
    groups.sort(key=lambda g: (-len(g.hosts), g.hosts[0]))
    signatures = list(by_signature)
    parts = [part for index, part in enumerate(PARTS)
             if len({signature[index] for signature in signatures}) > 1]
    return groups, parts


def _order(identity: tuple[str | None, ...]) -> tuple[tuple[bool, str], ...]:
    return tuple((value is not None, value or "") for value in identity)


def diff_by_host(ledger: Ledger, *, explain: int = 50) -> FleetDiff:
    """Every kernel compiled on two hosts or more, grouped by host; the first `explain`
    differing kernels are read back and compared record against record (how they differ).

    Two passes: the first reads every compile once, in the table's order, and keeps per kernel
    only its first host, whether another host built it, and its distinct signatures (one, on
    a fleet that agrees); the second reads the compiles of the differing kernels alone, by
    the kernel index, and groups their hosts."""
    classes = content_classes(ledger)
    hosts: set[str] = set()
    compiles = 0
    seen: dict[tuple[str | None, ...], list] = {}  # identity -> [first host, many, signatures]
    for compile_ in host_compiles(ledger, classes):
        compiles += 1
        hosts.add(compile_.host)
        kernel = seen.get(compile_.identity)
        if kernel is None:
            seen[compile_.identity] = [compile_.host, False, {compile_.signature}]
            continue
        if not kernel[1] and compile_.host != kernel[0]:
            kernel[1] = True
        kernel[2].add(compile_.signature)
    shared = [identity for identity, (_host, many, _sigs) in seen.items() if many]
    differing: list[HostKernel] = []
    for identity in sorted((i for i in shared if len(seen[i][2]) > 1), key=_order):
        found = _group(host_compiles(ledger, classes, identity))  # type: ignore[arg-type]
        if found is not None:
            differing.append(HostKernel(*identity, groups=found[0], parts=found[1]))
    _explain(ledger, differing[:explain])
    return FleetDiff(ledger.path, sorted(hosts), len(shared), compiles, differing)


def _explain(ledger: Ledger, kernels: list[HostKernel]) -> None:
    """Each odd group's compile compared with the majority's: what makes the odd ones odd."""
    wanted = {g.record_uuid for kernel in kernels for g in kernel.groups}
    records = ledger.records_by_uuid(wanted)
    for kernel in kernels:
        majority = records.get(kernel.groups[0].record_uuid)
        for group in kernel.groups[1:]:
            odd = records.get(group.record_uuid)
            if majority is not None and odd is not None:
                kernel.odd.append(compare_pair(majority, odd))
