"""`diff --by-host`: in a combined ledger (ranks, nodes), the kernels whose binary or inputs
differ between hosts for the same key, the hosts grouped by what they agree on, the odd ones
out named, and what makes them odd (the compiler, host compiler, options, variables, inputs).

The comparison runs over content classes (`diff_queries.host_compiles`), one compact row per
compile, so that a fleet of a thousand hosts and ten million records is a few set-wise queries
and one pass; only the kernels that differ are read back as records, to say how.
"""

from __future__ import annotations

from collections import Counter, defaultdict
from collections.abc import Iterable
from dataclasses import dataclass, field

from cacheaudit.audit.diff import KernelDiff, compare_pair
from cacheaudit.audit.diff_queries import HostCompile, content_classes, host_compiles
from cacheaudit.ledger import Ledger

PARTS = ("compiler", "options", "environment", "sources", "graph", "binary")
"""What a host's compile of a kernel is compared on, as `HostCompile` names them."""


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


def _signature(compile_: HostCompile) -> tuple[int, ...]:
    return tuple(getattr(compile_, part) for part in PARTS)


def _group(compiles: Iterable[HostCompile]) -> list[HostGroup] | None:
    """Hosts grouped by signature, largest group first (ties by first host name); None when
    every host agrees. A host that built the kernel twice differently counts in both groups."""
    by_signature: dict[tuple[int, ...], dict[str, str]] = defaultdict(dict)
    for compile_ in compiles:
        by_signature[_signature(compile_)].setdefault(compile_.host, compile_.record_uuid)
    if len(by_signature) < 2:
        return None
    groups = [HostGroup(sorted(hosts), hosts[min(hosts)]) for hosts in by_signature.values()]
    groups.sort(key=lambda g: (-len(g.hosts), g.hosts[0]))
    return groups


def _differing_parts(signatures: list[tuple[int, ...]]) -> list[str]:
    return [part for index, part in enumerate(PARTS)
            if len({signature[index] for signature in signatures}) > 1]


def diff_by_host(ledger: Ledger, *, explain: int = 50) -> FleetDiff:
    """Every kernel compiled on two hosts or more, grouped by host; the first `explain`
    differing kernels are read back and compared record against record (how they differ)."""
    classes = content_classes(ledger)
    hosts: set[str] = set()
    kernels = compiles = 0
    differing: list[HostKernel] = []
    signatures: dict[str, tuple[int, ...]] = {}
    current: list[HostCompile] = []

    def close() -> None:
        nonlocal kernels
        if len({c.host for c in current}) < 2:
            return
        kernels += 1
        groups = _group(current)
        if groups is None:
            return
        head = current[0]
        parts = _differing_parts([signatures[g.record_uuid] for g in groups])
        differing.append(HostKernel(head.runtime, head.kernel, head.key, groups, parts))

    for compile_ in host_compiles(ledger, classes):
        compiles += 1
        hosts.add(compile_.host)
        if current and (compile_.runtime, compile_.kernel, compile_.key) != (
                current[0].runtime, current[0].kernel, current[0].key):
            close()
            current, signatures = [], {}
        current.append(compile_)
        signatures.setdefault(compile_.record_uuid, _signature(compile_))
    if current:
        close()
    _explain(ledger, differing[:explain])
    return FleetDiff(ledger.path, sorted(hosts), kernels, compiles, differing)


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
