"""Two runs (or two ledgers) compared kernel by kernel: which of the four answers differ, how,
and the first kernel, in the order the runs used them, whose binary or inputs differ.

A kernel use is one record. Uses are matched by (runtime, kernel, key), the n-th use of an
identity on one side with the n-th on the other; those left over by (runtime, kernel) alone
(the key itself differs then); the rest are on one side only. Each matched pair is compared on:

1. the compiler: path, resolved binary, version, binary digest, and the host compiler behind it;
2. the effective options, token by token with each token's origin (argv, env:NVCC_APPEND_FLAGS,
   a response file), and the compile-affecting variables;
3. the event: fresh compile, disk hit, memory hit;
4. the inputs: primary sources and include graph files added, removed, or changed (both
   digests); and the binaries the compile wrote, by content digest.

Stat fields (mtime, inode), times, pids and hosts are never differences: the same header
unpacked again on another machine is the same input. Inputs and binaries are compared where
both uses are compiles; a hit carries what its runtime knew (key, variables) and is compared
on that.
"""

from __future__ import annotations

import difflib
from collections import defaultdict
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field

from cacheaudit.model import ArgToken, CompileRecord, CompilerIdentity, FileState

Identity = tuple[str | None, str | None, str | None]

UNSET = None
"""A variable's value where it was not set."""


@dataclass(frozen=True)
class Change:
    """One answer that differs: what (`subject`: a field, a variable, a file), before, after."""

    subject: str
    before: str | None
    after: str | None


@dataclass(frozen=True)
class TokenChange:
    """An option token one side has and the other has not, with where it came from."""

    change: str  # "added" (in B only) or "removed" (in A only)
    text: str
    origin: str


@dataclass(frozen=True)
class FileChange:
    change: str  # "added", "removed", "changed"
    path: str
    before: str | None  # the digest in A
    after: str | None   # the digest in B


@dataclass
class KernelDiff:
    """One kernel use matched on both sides, and how its answers differ."""

    runtime: str | None
    kernel: str | None
    key_a: str | None
    key_b: str | None
    matched_by: str  # "key" or "kernel"
    position: int  # in the order of use (A's; a kernel only in B by B's order, after A's)
    record_a: CompileRecord
    record_b: CompileRecord
    key: list[Change] = field(default_factory=list)
    compiler: list[Change] = field(default_factory=list)
    options: list[TokenChange] = field(default_factory=list)
    environment: list[Change] = field(default_factory=list)
    event: list[Change] = field(default_factory=list)
    inputs: list[FileChange] = field(default_factory=list)
    binary: list[Change] = field(default_factory=list)

    @property
    def binary_or_inputs_differ(self) -> bool:
        return bool(self.key or self.compiler or self.options or self.environment
                    or self.inputs or self.binary)

    @property
    def differs(self) -> bool:
        return self.binary_or_inputs_differ or bool(self.event)

    @property
    def answers(self) -> list[str]:
        """The answers that differ, by the design card's names."""
        names = (("key", self.key), ("compiler", self.compiler), ("options", self.options),
                 ("environment", self.environment), ("event", self.event),
                 ("inputs", self.inputs), ("binary", self.binary))
        return [name for name, changes in names if changes]

    @property
    def why(self) -> str:
        """One line: what differs, most telling first (a variable, then options, ...)."""
        parts: list[str] = []
        parts += [f"{c.subject}: {_shown(c.before)} -> {_shown(c.after)}" for c in self.environment]
        parts += [f"{'+' if t.change == 'added' else '-'}{t.text} ({t.origin})"
                  for t in self.options]
        parts += [f"compiler {c.subject}: {_shown(c.before)} -> {_shown(c.after)}"
                  for c in self.compiler]
        parts += [f"key: {_shown(c.before)} -> {_shown(c.after)}" for c in self.key]
        parts += [f"{f.path} {f.change}" for f in self.inputs]
        parts += [f"binary {_short(c.before)} -> {_short(c.after)}" for c in self.binary]
        parts += [f"{c.before} -> {c.after}" for c in self.event]
        return "; ".join(parts)


@dataclass(frozen=True)
class OneSided:
    """A kernel use present on one side only."""

    side: str  # "a" or "b"
    position: int
    record: CompileRecord


@dataclass
class RunDiff:
    """Side A against side B, every matched kernel, and those on one side only."""

    a: str  # how each side was named: "run <id> in <ledger>", "<ledger>"
    b: str
    kernels: list[KernelDiff]
    only: list[OneSided]
    uses_a: int
    uses_b: int

    @property
    def differing(self) -> list[KernelDiff]:
        return [k for k in self.kernels if k.differs]

    @property
    def identical(self) -> int:
        return sum(1 for k in self.kernels if not k.differs)

    @property
    def first(self) -> KernelDiff | None:
        """The first kernel, in the order the runs used them, whose binary or inputs differ."""
        return next((k for k in sorted(self.kernels, key=lambda k: k.position)
                     if k.binary_or_inputs_differ), None)

    @property
    def same(self) -> bool:
        return not self.differing and not self.only


def _shown(value: str | None) -> str:
    return "(unset)" if value is None else repr(value) if value == "" else value


def _short(digest: str | None) -> str:
    return "(none)" if digest is None else digest[:12]


def identity_of(record: CompileRecord) -> Identity:
    return (record.runtime, record.kernel, record.key)


def match(a: Sequence[CompileRecord], b: Sequence[CompileRecord]
          ) -> tuple[list[tuple[int, int, str]], list[int], list[int]]:
    """Pairs (index in a, index in b, "key" or "kernel"), then the unmatched indexes of each."""
    pairs: list[tuple[int, int, str]] = []
    left_a, left_b = list(range(len(a))), list(range(len(b)))
    for rule, identity in (("key", identity_of),
                           ("kernel", lambda r: (r.runtime, r.kernel))):
        waiting: dict[tuple[str | None, ...], list[int]] = defaultdict(list)
        for index in left_b:
            waiting[identity(b[index])].append(index)
        unmatched_a: list[int] = []
        taken: set[int] = set()
        for index in left_a:
            queue = waiting.get(identity(a[index]))
            if queue:
                partner = queue.pop(0)
                taken.add(partner)
                pairs.append((index, partner, rule))
            else:
                unmatched_a.append(index)
        left_a, left_b = unmatched_a, [i for i in left_b if i not in taken]
    return pairs, left_a, left_b


def compare(a: Sequence[CompileRecord], b: Sequence[CompileRecord], *, label_a: str = "A",
            label_b: str = "B") -> RunDiff:
    """Every use of `a` and `b` (each in its order of use) matched and compared."""
    pairs, only_a, only_b = match(a, b)
    kernels = [compare_pair(a[i], b[j], rule, position=i) for i, j, rule in pairs]
    only = [OneSided("a", i, a[i]) for i in only_a] + [
        OneSided("b", len(a) + j, b[j]) for j in only_b]
    kernels.sort(key=lambda k: k.position)
    return RunDiff(label_a, label_b, kernels, sorted(only, key=lambda o: o.position),
                   len(a), len(b))


def compare_pair(a: CompileRecord, b: CompileRecord, matched_by: str = "key",
                 position: int = 0) -> KernelDiff:
    found = KernelDiff(a.runtime, a.kernel, a.key, b.key, matched_by, position, a, b)
    if a.key != b.key:
        found.key.append(Change("key", a.key, b.key))
    if a.event != b.event:
        found.event.append(Change("event", a.event, b.event))
    found.environment = environment_changes(a.env, b.env)
    if a.event == "compile" and b.event == "compile":
        found.compiler = compiler_changes(a.compiler, b.compiler)
        found.options = option_changes(a.effective_argv or _argv_tokens(a),
                                       b.effective_argv or _argv_tokens(b))
        found.inputs = input_changes(_inputs(a), _inputs(b))
        found.binary = binary_changes(a.outputs, b.outputs)
    return found


def _argv_tokens(record: CompileRecord) -> tuple[ArgToken, ...]:
    return tuple(ArgToken(word) for word in record.argv)


def environment_changes(a: Mapping[str, str], b: Mapping[str, str]) -> list[Change]:
    return [Change(name, a.get(name, UNSET), b.get(name, UNSET))
            for name in sorted(set(a) | set(b)) if a.get(name) != b.get(name)]


def _compiler_fields(compiler: CompilerIdentity | None) -> dict[str, str | None]:
    if compiler is None:
        return {}
    fields = {"path": compiler.path, "resolved": compiler.resolved,
              "version": compiler.version_line, "digest": compiler.digest}
    host = compiler.host
    if host is not None:
        fields.update({"host path": host.path, "host resolved": host.resolved,
                       "host version": host.version_line, "host digest": host.digest})
    return fields


def compiler_changes(a: CompilerIdentity | None, b: CompilerIdentity | None) -> list[Change]:
    fields_a, fields_b = _compiler_fields(a), _compiler_fields(b)
    return [Change(name, fields_a.get(name), fields_b.get(name))
            for name in dict.fromkeys([*fields_a, *fields_b])
            if fields_a.get(name) != fields_b.get(name)]


def option_changes(a: Sequence[ArgToken], b: Sequence[ArgToken]) -> list[TokenChange]:
    """Tokens (with their origins) removed from A and added in B, in argv order."""
    words_a = [(t.text, t.origin) for t in a]
    words_b = [(t.text, t.origin) for t in b]
    changes: list[TokenChange] = []
    matcher = difflib.SequenceMatcher(a=words_a, b=words_b, autojunk=False)
    for tag, i1, i2, j1, j2 in matcher.get_opcodes():
        if tag in ("replace", "delete"):
            changes += [TokenChange("removed", t, o) for t, o in words_a[i1:i2]]
        if tag in ("replace", "insert"):
            changes += [TokenChange("added", t, o) for t, o in words_b[j1:j2]]
    return changes


def _inputs(record: CompileRecord) -> dict[str, FileState]:
    found = {s.path: s for s in record.sources}
    if record.graph is not None:
        found.update((f.path, f.state) for f in record.graph.files)
    return found


def _content(state: FileState) -> str | None:
    return state.digest if state.exists else None


def input_changes(a: Mapping[str, FileState], b: Mapping[str, FileState]) -> list[FileChange]:
    """Files read on one side only, and those read on both whose content differs."""
    changes = []
    for path in dict.fromkeys([*a, *b]):
        before, after = a.get(path), b.get(path)
        if before is None and after is not None:
            changes.append(FileChange("added", path, None, _content(after)))
        elif after is None and before is not None:
            changes.append(FileChange("removed", path, _content(before), None))
        elif before is not None and after is not None and (
                before.exists != after.exists or _content(before) != _content(after)):
            changes.append(FileChange("changed", path, _content(before), _content(after)))
    return changes


def binary_digests(outputs: Iterable[FileState]) -> list[str]:
    return sorted(s.digest for s in outputs if s.exists and s.digest)


def binary_changes(a: Sequence[FileState], b: Sequence[FileState]) -> list[Change]:
    """The binaries by content: the same bytes written elsewhere are the same binary."""
    before, after = binary_digests(a), binary_digests(b)
    if before == after:
        return []
    return [Change("binary", ", ".join(before) or None, ", ".join(after) or None)]
