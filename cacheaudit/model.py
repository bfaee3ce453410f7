"""The shared vocabulary: file states, include graphs, compiler identities, records, findings.

Plain frozen dataclasses with no behaviour beyond comparison and (de)serialisation, so that every
layer (observers, ledger, audit, output) can exchange them without importing one another.
"""

from __future__ import annotations

import dataclasses
import enum
import functools
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any, Literal, NamedTuple

import xxhash

from cacheaudit.evidence import Evidence

Event = Literal["compile", "disk-hit", "memory-hit"]

MEMORY_PREFIX = "<memory>/"
"""Paths of inputs and outputs that never touched the disk (NVRTC's in-memory headers, a cubin
handed back in memory): their size and digest are real, there is no file to stat later."""
EVENTS: tuple[Event, ...] = ("compile", "disk-hit", "memory-hit")


class Severity(str, enum.Enum):
    """How bad a finding is; ordered so that `--fail-on` can compare."""

    INFO = "info"
    WARNING = "warning"
    ERROR = "error"

    @property
    def rank(self) -> int:
        return _SEVERITY_RANK[self]


_SEVERITY_RANK = {Severity.INFO: 0, Severity.WARNING: 1, Severity.ERROR: 2}


@dataclass(frozen=True)
class FindingCode:
    code: str
    name: str
    severity: Severity


# Stable once released, like ccache's statistics numbers: a code is never reused; a retired one
# stays here, marked in its name, so that old ledgers still render.
_E, _W, _I = Severity.ERROR, Severity.WARNING, Severity.INFO
FINDING_CODES: dict[str, FindingCode] = {
    code: FindingCode(code, name, severity)
    for code, severity, name in (
        ("CA101", _E, "stale hit: untracked dependency changed, key unchanged"),
        ("CA102", _W, "untracked dependency: a future edit would go unseen"),
        ("CA103", _E, "tracked input changed but the key did not"),
        ("CA104", _W, "dependency vanished since the build"),
        ("CA105", _E, "a header earlier in the search path shadows the recorded one"),
        ("CA106", _E, "in-memory staleness: file changed after the runtime hashed it"),
        ("CA201", _W, "implicit input set: compile-affecting variable not in the key"),
        ("CA202", _E, "environment drift: implicit input differs from build time"),
        ("CA203", _I, "prefix fallback in effect"),
        ("CA204", _W, "configuration changed after the runtime was constructed"),
        ("CA301", _E, "compiler drift: same path, different binary or version"),
        ("CA302", _E, "host compiler drift behind nvcc"),
        ("CA401", _E, "input modified during the compile"),
        ("CA402", _W, "corrupt or partial cache entry"),
        ("CA403", _E, "rebuild oracle: a fresh compile differs from the cached binary"),
        ("CA404", _W, "non-deterministic build: same inputs, different binaries"),
        ("CA501", _W, "unverifiable: a file unreadable or a compiler missing"),
    )
}


def content_digest(data: bytes) -> str:
    """The one content hash of the project: xxh3-128, as hex."""
    return xxhash.xxh3_128_hexdigest(data)


def json_digest(parts: Iterable[Any]) -> str:
    """A stable digest over a sequence of parts, by their `repr`, used for content addressing.

    `repr` tells a list from a tuple: callers pass values of one shape (as stored, or as rebuilt
    from JSON), never a mix.
    """
    hasher = xxhash.xxh3_128()
    for part in parts:
        text = repr(part).encode("utf-8", "surrogateescape")
        hasher.update(len(text).to_bytes(8, "little"))
        hasher.update(text)
    return hasher.hexdigest()


def graph_digest(method: str, files: Iterable[tuple[str, FileState]]) -> str:
    """`IncludeGraph.digest` of the graph of `files` ((path as written, state) pairs, in order)
    obtained by `method`, without building the graph (the ledger's batch writer addresses a
    record's sources and outputs by it)."""
    return json_digest(
        [method]
        + [(written, s.path, s.exists, s.size, s.mtime_ns, s.ctime_ns, s.inode, s.digest,
            s.settled) for written, s in files]
    )


class FileState(NamedTuple):
    """What a file was at one moment: the stat fields that betray a change, and its content hash.

    `settled` is False when the file's mtime or ctime fell inside the timestamp-granularity window
    at capture time: a same-size rewrite within that window would leave every stat field equal, so
    a later stat match is no proof of equal content (ccache's "too new" rule).

    A NamedTuple rather than a dataclass: an audit builds one per header per entry, and tuple
    construction is four times cheaper than a frozen dataclass's.
    """

    path: str
    exists: bool
    size: int = -1
    mtime_ns: int = 0
    ctime_ns: int = 0
    inode: int = 0
    digest: str | None = None
    settled: bool = True
    error: str | None = None

    @classmethod
    def missing(cls, path: str, error: str | None = None) -> FileState:
        return cls(path=path, exists=False, error=error)

    @property
    def readable(self) -> bool:
        return self.exists and self.digest is not None

    def stat_key(self) -> tuple[int, int, int, int]:
        return (self.size, self.mtime_ns, self.ctime_ns, self.inode)

    def same_content(self, other: FileState) -> bool:
        return self.exists == other.exists and self.size == other.size and (
            self.digest == other.digest
        )

    def to_dict(self) -> dict[str, Any]:
        return self._asdict()

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> FileState:
        return cls(**{name: data[name] for name in cls._fields if name in data})


@dataclass(frozen=True)
class GraphFile:
    """One file of an include graph: its state (under the realpath) and the path as written."""

    state: FileState
    written: str

    @property
    def path(self) -> str:
        return self.state.path


@dataclass(frozen=True)
class IncludeGraph:
    """Every file a compile read besides its primary sources, as reported by the compiler itself.

    Stored once by `digest`: thousands of kernels built against one CUTLASS tree share a graph.
    """

    files: tuple[GraphFile, ...]
    method: str

    @functools.cached_property
    def digest(self) -> str:
        return graph_digest(self.method, ((f.written, f.state) for f in self.files))

    @property
    def paths(self) -> tuple[str, ...]:
        return tuple(f.path for f in self.files)

    def by_path(self) -> dict[str, GraphFile]:
        return {f.path: f for f in self.files}


Origin = str
"""Where an argument token came from: "argv", "env:NVCC_PREPEND_FLAGS", "env:NVCC_APPEND_FLAGS",
"file:<path>" for a response or options file."""


@dataclass(frozen=True)
class ArgToken:
    text: str
    origin: Origin = "argv"

    def to_list(self) -> list[str]:
        return [self.text, self.origin]


@dataclass(frozen=True)
class CompilerIdentity:
    """Who compiled: the name as invoked, how it resolved, and what the binary really is."""

    invoked: str
    path: str
    resolved: str
    kind: str
    version_text: str
    digest: str | None
    wrappers: tuple[str, ...] = ()
    size: int = -1
    mtime_ns: int = 0
    host: CompilerIdentity | None = None
    error: str | None = None

    @property
    def version_line(self) -> str:
        """The most telling line of `--version`: nvcc's release line, else the first line."""
        lines = [ln for ln in self.version_text.splitlines() if ln.strip()]
        for line in lines:
            if "release" in line:
                return line.strip()
        return lines[0].strip() if lines else ""

    @property
    def identity_digest(self) -> str:
        return json_digest([self.resolved, self.digest, self.version_text,
                            self.host.identity_digest if self.host else None])

    def to_dict(self) -> dict[str, Any]:
        data = dataclasses.asdict(self)
        data["wrappers"] = list(self.wrappers)
        return data

    @classmethod
    def from_dict(cls, data: Mapping[str, Any] | None) -> CompilerIdentity | None:
        if not data:
            return None
        values = {f.name: data[f.name] for f in dataclasses.fields(cls) if f.name in data}
        values["wrappers"] = tuple(values.get("wrappers") or ())
        values["host"] = cls.from_dict(data.get("host"))
        return cls(**values)


@dataclass(frozen=True)
class CompileRecord:
    """One observed compile or cache lookup, with the four answers of the design card.

    1. `compiler`; 2. `argv` and `effective_argv` (labelled by origin) with `env`;
    3. `event`; 4. `sources` and `graph` (the inputs) with `tracked` when the runtime's policy
    or adapter knows which of them entered the key.
    """

    record_id: str
    event: Event
    started_ns: int
    runtime: str | None = None
    kernel: str | None = None
    key: str | None = None
    entry: str | None = None
    compiler: CompilerIdentity | None = None
    argv: tuple[str, ...] = ()
    effective_argv: tuple[ArgToken, ...] = ()
    cwd: str = ""
    env: Mapping[str, str] = field(default_factory=dict)
    sources: tuple[FileState, ...] = ()
    graph: IncludeGraph | None = None
    outputs: tuple[FileState, ...] = ()
    tracked: tuple[str, ...] | None = None
    exit_code: int | None = None
    signal: int | None = None
    duration_ns: int = 0
    pid: int = 0
    host: str = ""
    test_id: str | None = None
    observer: str = ""
    notes: tuple[str, ...] = ()
    extra: Mapping[str, Any] = field(default_factory=dict)
    """What one runtime's observer notes for its own policy alone (Triton's key parts, NVRTC's
    PCH event, ...), each runtime's keys declared in its package's `extra.py`. A fact that
    another module reads is a field of its own below, never a key here (`__post_init__` refuses
    one)."""

    # Facts that cross module boundaries: written by an observer or the ledger, read by the
    # audit or the output. Stored in the ledger's `extra` JSON under their own names
    # (`STORED_FACTS`), so that adding them needed no schema change.
    run_uuid: str | None = None
    """The run the record belongs to, filled in by the ledger when it reads the record (it lives
    in the `runs` table, not with the record, so writing never stores it); None on a record
    that was built here and not read back."""
    graph_id: int | None = None
    """The ledger's row id of the include graph, set only on a record read without its graphs
    (`Ledger.records(with_graphs=False)`): `Ledger.load_graph(graph_id)` loads it later."""
    reconstructed: bool = False
    """The compile was not observed: a scan rebuilt its include graph afterwards from the
    entry's command (what the compiler reads now, not what it read then). Every fact of such a
    record is an inference made after the build: which files were read, their content (taken
    from files unchanged since the build by their mtime and ctime, see `unknown_at_build` for
    the others), the compiler; its environment is unknown. Findings on it say so."""
    unknown_at_build: tuple[str, ...] = ()
    """Inputs of a reconstructed record whose content at build time is unknown: their mtime or
    ctime is later than the entry's build, so what the scan found is not what the compiler read.
    Their stored state carries no digest; only a rebuild can tell whether they changed."""
    modified_during_compile: tuple[str, ...] = ()
    """Inputs whose mtime or ctime was not older than the compile's start: the compiler may have
    read another version than the one hashed afterwards (CA401)."""
    runtime_process: str | None = None
    """`host:pid:start-ticks` of the runtime's own process, recorded by a shim inside a session
    (whose run id is shared by every process below it), for in-memory staleness (CA106)."""
    graph_problem: str | None = None
    """Why the record has no include graph (NVRTC wrote no trace, the trace was left out, ...),
    told to the user instead of a silent gap."""
    runtime_error: str | None = None
    """The runtime refused the lookup or compile (DeepJIT's "non-standard include"): its
    message, shown by the output."""
    redacted_argv: tuple[int, ...] = ()
    """Positions in `argv` of the words stored redacted (a credential's value replaced by
    "<redacted>", `envvars.redact_argv`): the command as stored is not the one that ran, so
    the rebuild oracle refuses to run it again. Words of `effective_argv`, `notes` and the
    run's command are redacted by the same rules."""
    seal: str | None = None
    """`cacheaudit.seal`'s HMAC over the record's command, made when it was written with the
    writing user's secret: the rebuild oracle reruns without asking only commands this user
    wrote and nobody changed since."""

    def __post_init__(self) -> None:
        # An observer still writing a typed fact into `extra` would hide it from every reader.
        misplaced = _FACT_NAMES.intersection(self.extra)
        if misplaced:
            raise ValueError(f"CompileRecord.extra holds {', '.join(sorted(misplaced))}: "
                             "typed fields of CompileRecord, pass them as such")

    @property
    def succeeded(self) -> bool:
        return self.exit_code in (0, None) and self.signal is None

    def stored_extra(self) -> dict[str, Any]:
        """`extra` with the stored facts under their own names: the ledger's JSON column and
        the spool's `extra`. A fact at its default is left out, as it was when facts were keys
        of `extra`, so equal records keep sharing one stored value."""
        stored = dict(self.extra)
        if self.reconstructed:
            stored["reconstructed"] = True
        if self.modified_during_compile:
            stored["modified_during_compile"] = list(self.modified_during_compile)
        if self.unknown_at_build:
            stored["unknown_at_build"] = list(self.unknown_at_build)
        if self.redacted_argv:
            stored["redacted_argv"] = list(self.redacted_argv)
        for name in ("runtime_process", "graph_problem", "runtime_error", "seal"):
            value = getattr(self, name)
            if value is not None:
                stored[name] = value
        return stored


STORED_FACTS: tuple[str, ...] = (
    "reconstructed", "modified_during_compile", "unknown_at_build", "runtime_process",
    "graph_problem", "runtime_error", "seal", "redacted_argv")
"""The `CompileRecord` facts kept in the stored `extra` JSON object, under these names."""

LEDGER_FACTS = ("run_uuid", "graph_id")
"""Facts the ledger fills in on reading, never stored with the record (an older reader put
them into `extra`; a stored copy is dropped on reading)."""

_FACT_NAMES = frozenset(STORED_FACTS + LEDGER_FACTS)


def split_stored_extra(stored: Mapping[str, Any] | None) -> tuple[dict[str, Any], dict[str, Any]]:
    """A stored `extra` object as (the facts, as `CompileRecord` keyword arguments; the rest,
    the record's `extra`): the inverse of `CompileRecord.stored_extra`."""
    rest = dict(stored or {})
    facts: dict[str, Any] = {}
    for name in LEDGER_FACTS:
        rest.pop(name, None)
    if rest.pop("reconstructed", False):
        facts["reconstructed"] = True
    for name in ("modified_during_compile", "unknown_at_build"):
        paths = rest.pop(name, None)
        if isinstance(paths, (list, tuple)):
            facts[name] = tuple(str(path) for path in paths)
    positions = rest.pop("redacted_argv", None)
    if isinstance(positions, (list, tuple)):
        facts["redacted_argv"] = tuple(int(p) for p in positions if isinstance(p, int))
    for name in ("runtime_process", "graph_problem", "runtime_error", "seal"):
        value = rest.pop(name, None)
        if value is not None:
            facts[name] = str(value)
    return facts, rest


@dataclass(frozen=True)
class Finding:
    """A verdict with a stable code and its evidence: the subject, both values, and how we know."""

    code: str
    subject: str
    message: str
    recorded: str | None = None
    current: str | None = None
    how: str = ""
    record_id: str | None = None
    entry: str | None = None
    runtime: str | None = None
    kernel: str | None = None
    inferred: bool = False
    hint: str = ""
    tests: tuple[str, ...] = ()
    """The tests involved, when the run was a pytest session: the one that built the entry and
    those that hit it."""
    evidence: Evidence | None = None
    """`recorded` and `current` as data (file states, variables, compiler identities, times),
    where the check that made the finding has them; None on findings read back from a ledger,
    which stores the prose only."""

    @property
    def severity(self) -> Severity:
        return FINDING_CODES[self.code].severity

    @property
    def name(self) -> str:
        return FINDING_CODES[self.code].name

    def to_dict(self) -> dict[str, Any]:
        data = dataclasses.asdict(self)
        data["severity"] = self.severity.value
        data["name"] = self.name
        data["tests"] = list(self.tests)
        data["evidence"] = None if self.evidence is None else self.evidence.to_dict()
        return data


@dataclass(frozen=True)
class CacheEntry:
    """One cached artefact as a reader found it on disk, with the key the runtime gave it.

    `committed_ns` is the runtime's own disk-hit signal where it has one (DeepJIT touches
    `.committed` on every hit); `problems` are reasons the entry is corrupt or partial (CA402).
    """

    runtime: str
    layout: str
    root: str
    path: str
    kernel: str
    key: str | None
    binary: FileState | None = None
    source: FileState | None = None
    committed_ns: int | None = None
    meta: Mapping[str, Any] = field(default_factory=dict)
    include_hash: str | None = None
    files: tuple[str, ...] = ()
    problems: tuple[str, ...] = ()

    @property
    def built_ns(self) -> int | None:
        """When the binary was written: the entry's build time as far as the disk can tell."""
        return self.binary.mtime_ns if self.binary is not None and self.binary.exists else None


@dataclass(frozen=True)
class CacheLeftover:
    """Something in a cache root that is not an entry: a crashed writer's temporary directory,
    an unrecognised directory in the entry area. Reported as CA402 evidence."""

    runtime: str
    layout: str
    root: str
    path: str
    reason: str
    mtime_ns: int = 0
