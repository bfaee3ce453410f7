"""Header fingerprints: a digest over the headers a compile really reads, for a runtime's key.

cuda.core's program cache refuses to key a compile that reads files it cannot see
(`include_path`, `pre_include`, PCH options, an `options.name` with a directory) unless the caller
passes `extra_digest`, "a digest over the header/PCH bytes the compile will read"; its own
docstring calls a `fingerprint_headers(options.include_path)` that the package does not ship.
This module is that helper:

    from cacheaudit.headers import fingerprint_headers

    fp = fingerprint_headers(source, options)          # the headers NVRTC reads, with states
    key = make_program_cache_key(code=source, code_type="c++", options=options,
                                 target_type="cubin", extra_digest=fp.digest)
    print(fp.paths)                                    # what the digest covers

How the headers are found, best evidence first (`method="auto"` tries them in this order):

1. `"trace"`: NVRTC itself, through `cuda.bindings.nvrtc`, compiles the source once with
   `--fdevice-time-trace` and `--fdevice-syntax-only` (front end only: every header is opened,
   no code is generated) under the same options; the trace's "Processing Header File" events
   list every header opened, nested ones included, with resolved paths (platform-notes.md §2):
   the NVRTC trace pass of `cacheaudit.runtimes.nvrtc.trace`, which the NVRTC adapter runs too.
   A relative path there (a quoted include of a program name without a directory) was resolved
   against the process's working directory, so it is resolved the same way here.
2. `"scan"` (NVRTC cannot be loaded): `#include` lines followed textually through the same search
   rules (the including file's directory, then `include_path`; angle includes through
   `include_path` only, as NVRTC has no system directories). Every branch of an `#if` is
   followed, so the set is a superset of what the compiler opens: the digest may change when an
   unused header changes, never the other way round. `#include MACRO` cannot be followed and is
   named in `notes`.
3. `"tree"` (no source given, the `fingerprint_headers(options.include_path)` form of cuda.core's
   docstring): every file under each include directory, plus the pre-included headers.

The digest is SHA-256 (cuda.core's FIPS-approved hash; it takes any bytes-like value, mixed in as
`bytes(extra_digest)`) over the sorted absolute paths of the headers with their sizes and xxh3-128
content hashes, and the names that could not be resolved. Nothing else enters it: not the source,
not the options (cuda.core's key covers those), not the method. So it changes exactly when a
header's content changes, or a different set of headers is read. `HeaderFingerprint` converts to
bytes (`bytes(fp) == fp.digest`), so it can be passed as `extra_digest` directly.

A trace costs one NVRTC front-end pass (tens of milliseconds). Fingerprinting the same source
again in the same process re-traces only when a header it recorded changed (one `stat` per header
otherwise); a header newly created earlier on the search path is not noticed by that shortcut
(`retrace=True` forces a new trace). Importing this module imports no CUDA package.
"""

from __future__ import annotations

import hashlib
import os
import re
import threading
from collections import OrderedDict
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

from cacheaudit import scratch
from cacheaudit.digest import StateCache, changed_files, normalise_path, read_file
from cacheaudit.model import FileState, GraphFile, IncludeGraph
from cacheaudit.runtimes.nvrtc.trace import (
    NvrtcUnavailable,
    nvrtc_shadow_options,
    result_name,
    trace_pass,
)

__all__ = [
    "METHODS",
    "FingerprintError",
    "HeaderFingerprint",
    "digest_now",
    "digest_of",
    "fingerprint_headers",
    "header_digest",
    "issued",
]

TRACE = "nvrtc --fdevice-time-trace"
SCAN = "#include scan"
TREE = "include-path tree"
METHODS = {"trace": TRACE, "scan": SCAN, "tree": TREE}

_DIGEST_TAG = b"cacheaudit.headers/1"
_DEFAULT_NAME = "default_program"
"""What cuda.core calls a program whose `ProgramOptions.name` is None."""



class FingerprintError(RuntimeError):
    """The requested method cannot run (NVRTC unavailable for `method="trace"`, no source for
    `"scan"`)."""


@dataclass(frozen=True)
class HeaderFingerprint:
    """The headers a compile reads, their states when fingerprinted, and the digest over them.

    `files` are sorted by path; each `GraphFile.written` is the path as the compiler reported it
    (relative for headers found through the working directory). `missing` are include names that
    could not be resolved (scan) or that NVRTC reported without a file (none for a trace).
    """

    digest: bytes
    files: tuple[GraphFile, ...]
    method: str
    name: str
    cwd: str
    include_path: tuple[str, ...] = ()
    pre_include: tuple[str, ...] = ()
    missing: tuple[str, ...] = ()
    notes: tuple[str, ...] = ()

    def __bytes__(self) -> bytes:
        # cuda.core mixes `bytes(extra_digest)` into its key: the fingerprint can be passed as is.
        return self.digest

    @property
    def hexdigest(self) -> str:
        return self.digest.hex()

    @property
    def paths(self) -> tuple[str, ...]:
        return tuple(f.path for f in self.files)

    @property
    def states(self) -> tuple[FileState, ...]:
        return tuple(f.state for f in self.files)

    @property
    def from_working_directory(self) -> tuple[str, ...]:
        """Headers reached through a relative name: resolved against the working directory, so
        they change with wherever the process happens to run."""
        return tuple(f.path for f in self.files if not os.path.isabs(f.written))

    def graph(self) -> IncludeGraph:
        return IncludeGraph(files=self.files, method=self.method)

    def changed(self, cache: StateCache | None = None) -> list[tuple[FileState, FileState]]:
        """(recorded, now) for every covered header whose content differs now."""
        return changed_files(self.states, cache)

    def current_digest(self, cache: StateCache | None = None) -> bytes:
        """The digest over the same headers as they are on disk now (same set, new content)."""
        return digest_now(self.paths, self.missing, cache)

    def describe(self) -> str:
        lines = [f"{self.hexdigest} over {len(self.files)} header(s) ({self.method}):"]
        lines += [f"  {f.path}" + ("" if os.path.isabs(f.written) else
                                   f"  (as {f.written!r}, from the working directory)")
                  for f in self.files]
        lines += [f"  unresolved: {name}" for name in self.missing]
        lines += [f"  note: {note}" for note in self.notes]
        return "\n".join(lines)

    def to_dict(self) -> dict[str, Any]:
        return {"digest": self.hexdigest, "method": self.method, "name": self.name,
                "cwd": self.cwd, "include_path": list(self.include_path),
                "pre_include": list(self.pre_include),
                "files": [f.path for f in self.files],
                "written": [f.written for f in self.files],
                "missing": list(self.missing), "notes": list(self.notes)}


def digest_of(states: Iterable[FileState], missing: Iterable[str] = ()) -> bytes:
    """The fingerprint digest over file states: paths, sizes and content hashes, sorted by path,
    then the unresolved names. Public so that an audit can recompute it from a record."""
    hasher = hashlib.sha256(_DIGEST_TAG)

    def part(data: bytes) -> None:
        hasher.update(len(data).to_bytes(8, "big"))
        hasher.update(data)

    for state in sorted(states, key=lambda s: s.path):
        part(state.path.encode("utf-8", "surrogateescape"))
        if not state.exists:
            part(b"absent")
        elif state.digest is None:
            part(f"unreadable:{state.error}".encode("utf-8", "surrogateescape"))
        else:
            part(f"{state.size}:{state.digest}".encode("ascii"))
    for name in sorted(set(missing)):
        part(b"missing:" + name.encode("utf-8", "surrogateescape"))
    return hasher.digest()


def digest_now(paths: Iterable[str], missing: Iterable[str] = (),
               cache: StateCache | None = None) -> bytes:
    """The fingerprint digest over `paths` as they are on disk now, with the same unresolved
    names: what a fingerprint (or a record of one) would give if it were taken again."""
    cache = cache or StateCache()
    return digest_of([cache.capture(p) for p in paths], missing)


# ------------------------------------------------------------------------------------ registry

_ISSUED: OrderedDict[bytes, HeaderFingerprint] = OrderedDict()
_ISSUED_MAX = 1024
_LOCK = threading.Lock()


def issued(digest: object) -> HeaderFingerprint | None:
    """The fingerprint this process computed with this digest, if any: how an adapter learns
    which files a caller's `extra_digest` covers."""
    if isinstance(digest, HeaderFingerprint):
        return digest
    try:
        raw = bytes(digest)  # type: ignore[call-overload]
    except (TypeError, ValueError):
        return None
    with _LOCK:
        return _ISSUED.get(raw)


def _register(fingerprint: HeaderFingerprint) -> None:
    with _LOCK:
        _ISSUED.pop(fingerprint.digest, None)
        _ISSUED[fingerprint.digest] = fingerprint
        while len(_ISSUED) > _ISSUED_MAX:
            _ISSUED.popitem(last=False)


# ------------------------------------------------------------------------------------ options


def _as_list(value: object) -> list[Any]:
    """cuda.core's str-or-sequence option shape: a str is one item, None or False none."""
    if value is None or value is False:
        return []
    if isinstance(value, (str, bytes, os.PathLike)):
        return [value]
    if isinstance(value, Sequence):
        return list(value)
    return [value]


def _text(value: object) -> str:
    if isinstance(value, bytes):
        return value.decode("utf-8", "surrogateescape")
    return os.fspath(value) if isinstance(value, os.PathLike) else str(value)


@dataclass
class _Request:
    code: bytes | None
    name: str
    include_path: list[str]
    pre_include: list[str]
    no_source_include: bool
    flags: list[bytes]
    notes: list[str] = field(default_factory=list)


def _macro_flags(define_macro: object, undefine_macro: object) -> list[bytes]:
    flags = []
    for macro in _as_list(define_macro):
        if isinstance(macro, (tuple, list)) and len(macro) == 2:
            flags.append(f"--define-macro={_text(macro[0])}={_text(macro[1])}".encode())
        else:
            flags.append(f"--define-macro={_text(macro)}".encode())
    flags += [f"--undefine-macro={_text(m)}".encode() for m in _as_list(undefine_macro)]
    return flags


def _request(source: object, options: object, *, include_path: object, pre_include: object,
             define_macro: object, undefine_macro: object, name: str | None, arch: str | None,
             std: str | None, no_source_include: bool | None, target_type: str,
             extra_options: Sequence[str | bytes]) -> _Request:
    code = None
    if isinstance(source, str):
        code = source.encode("utf-8")
    elif isinstance(source, (bytes, bytearray)):
        code = bytes(source)
    notes: list[str] = []
    flags: list[bytes] = []
    if options is not None:
        # The exact flags cuda.core hands NVRTC for these options.
        flags = [bytes(f) for f in options.as_bytes("nvrtc", target_type)]  # type: ignore[attr-defined]
        include_path = include_path if include_path is not None else getattr(
            options, "include_path", None)
        pre_include = pre_include if pre_include is not None else getattr(
            options, "pre_include", None)
        if name is None:
            name = getattr(options, "name", None)
        if no_source_include is None:
            no_source_include = bool(getattr(options, "no_source_include", False))
        extra = _macro_flags(define_macro, undefine_macro)
        if arch is not None:
            extra.append(f"-arch={arch}".encode())
        if std is not None:
            extra.append(f"--std={std}".encode())
        flags += extra
        included = {f for f in flags if f.startswith(b"--include-path=")}
        preincluded = {f for f in flags if f.startswith(b"--pre-include=")}
        flags += [f for d in _as_list(include_path)
                  if (f := f"--include-path={_text(d)}".encode()) not in included]
        flags += [f for h in _as_list(pre_include)
                  if (f := f"--pre-include={_text(h)}".encode()) not in preincluded]
    else:
        if arch is not None:
            flags.append(f"-arch={arch}".encode())
        flags += _macro_flags(define_macro, undefine_macro)
        flags += [f"--include-path={_text(d)}".encode() for d in _as_list(include_path)]
        flags += [f"--pre-include={_text(h)}".encode() for h in _as_list(pre_include)]
        if no_source_include:
            flags.append(b"--no-source-include")
        if std is not None:
            flags.append(f"--std={std}".encode())
    flags += [f if isinstance(f, bytes) else f.encode() for f in extra_options]
    # Options that would stop NVRTC from reading headers (PCH) or write files go; so does the
    # trace's own --fdevice-syntax-only, which it adds itself.
    kept = [f for f in nvrtc_shadow_options(flags)
            if f.partition(b"=")[0] not in (b"--fdevice-syntax-only", b"-fdevice-syntax-only")]
    dropped = [f for f in flags if f not in kept]
    if dropped:
        notes.append("dropped from the trace (they write files or replace header reads): "
                     + " ".join(f.decode("utf-8", "replace") for f in dropped))
    flags = kept
    return _Request(code=code, name=name or _DEFAULT_NAME,
                    include_path=[_text(d) for d in _as_list(include_path)],
                    pre_include=[_text(h) for h in _as_list(pre_include)],
                    no_source_include=bool(no_source_include), flags=flags, notes=notes)


# ------------------------------------------------------------------------------------ methods


def _trace(request: _Request) -> tuple[list[str], list[str]]:
    """Headers NVRTC opened (as it reported them), and notes: the NVRTC trace pass, in a private
    directory. Raises NvrtcUnavailable."""
    assert request.code is not None
    notes: list[str] = []
    with scratch.temporary_directory("trace") as tmp:
        traced = trace_pass(request.code, request.name.encode(), request.flags,
                            os.path.join(tmp, "trace"))
    if not traced.ok:
        notes.append(f"NVRTC reported {result_name(traced.code)}: {traced.log[:500]}")
    if traced.headers is None:
        if traced.written:
            raise FingerprintError(str(traced.problem))
        if notes:
            raise FingerprintError(f"NVRTC wrote no trace: {notes[0]}")
        raise NvrtcUnavailable("NVRTC accepted --fdevice-time-trace but wrote no trace")
    return traced.headers, notes


_INCLUDE_RE = re.compile(rb'^[ \t]*#[ \t]*include[ \t]*([<"])([^>"\r\n]+)[>"]', re.MULTILINE)
_MACRO_INCLUDE_RE = re.compile(rb"^[ \t]*#[ \t]*include[ \t]+([A-Za-z_]\w*)", re.MULTILINE)


def _resolve(name: str, directories: Iterable[str]) -> str | None:
    for directory in directories:
        candidate = os.path.join(directory, name)
        if os.path.isfile(candidate):
            return candidate
    return None


def _scan(request: _Request, cwd: str) -> tuple[list[tuple[str, str]], list[str], list[str]]:
    """(resolved path, name as written) for every header reached, unresolved names, notes."""
    include_dirs = [normalise_path(d, cwd) for d in request.include_path]
    source_dir = os.path.dirname(request.name)
    main_dir = None if request.no_source_include else normalise_path(source_dir or ".", cwd)
    found: list[tuple[str, str]] = []
    missing: list[str] = []
    notes: list[str] = []
    seen: set[str] = set()
    queue: list[tuple[bytes, str | None, bool]] = []
    if request.code is not None:
        queue.append((request.code, main_dir, True))
    for header in request.pre_include:
        path = _resolve(header, ([main_dir] if main_dir else []) + include_dirs)
        if path is None:
            missing.append(header)
            continue
        # Only a header found in the main directory is "from the working directory"; one found
        # through include_path is written as its resolved path.
        in_main = main_dir is not None and path == os.path.join(main_dir, header)
        written = header if in_main and not os.path.isabs(header) else path
        if normalise_path(path) not in seen:
            seen.add(normalise_path(path))
            found.append((normalise_path(path), written))
            queue.append((_read(path), os.path.dirname(normalise_path(path)), False))
    while queue:
        code, directory, is_main = queue.pop()
        for match in _MACRO_INCLUDE_RE.finditer(code):
            notes.append(f"#include {match.group(1).decode('utf-8', 'replace')} names a macro: "
                         "its header cannot be followed without the preprocessor")
        for match in _INCLUDE_RE.finditer(code):
            quoted = match.group(1) == b'"'
            name = match.group(2).decode("utf-8", "surrogateescape")
            if os.path.isabs(name):
                search: list[str] = [""]
            elif quoted:
                search = ([directory] if directory else []) + include_dirs
            else:
                search = include_dirs
            path = _resolve(name, search)
            if path is None:
                if name not in missing:
                    missing.append(name)
                continue
            real = normalise_path(path)
            if real in seen:
                continue
            seen.add(real)
            # A quoted include of the main source resolves in the working directory first, and
            # then through include_path: only the first of those is "from the working directory".
            relative = (quoted and is_main and not source_dir and directory == main_dir
                        and directory is not None and path == os.path.join(directory, name))
            found.append((real, name if relative else real))
            queue.append((_read(real), os.path.dirname(real), False))
    if missing:
        notes.append(f"{len(missing)} include name(s) not found in the search path (NVRTC's "
                     "own headers, or ones behind #if branches not taken): "
                     + ", ".join(missing[:10]))
    return found, missing, notes


def _read(path: str) -> bytes:
    # A FIFO or device among the headers would block or never end a plain read.
    try:
        return read_file(path)
    except OSError:
        return b""


def _tree(request: _Request, cwd: str) -> tuple[list[tuple[str, str]], list[str]]:
    found: list[tuple[str, str]] = []
    missing: list[str] = []
    for directory in request.include_path:
        top = normalise_path(directory, cwd)
        if not os.path.isdir(top):
            missing.append(directory)
            continue
        for dirpath, dirnames, filenames in os.walk(top):
            dirnames.sort()
            for filename in sorted(filenames):
                path = os.path.join(dirpath, filename)
                if os.path.isfile(path):
                    found.append((normalise_path(path), path))
    for header in request.pre_include:
        path = _resolve(header, [cwd] + [normalise_path(d, cwd) for d in request.include_path])
        if path is None:
            missing.append(header)
        else:
            in_cwd = path == os.path.join(cwd, header)
            found.append((normalise_path(path), header if in_cwd else normalise_path(path)))
    return found, missing


# ------------------------------------------------------------------------------------ the helper

_STATES = StateCache()
_TRACES: OrderedDict[tuple[object, ...], tuple[tuple[tuple[str, str], ...], tuple[str, ...],
                                               tuple[FileState, ...], str]] = OrderedDict()
_TRACES_MAX = 256


def fingerprint_headers(
    source: str | bytes | Sequence[str] | None = None,
    options: Any = None,
    *,
    include_path: str | Sequence[str] | None = None,
    pre_include: str | Sequence[str] | None = None,
    define_macro: Any = None,
    undefine_macro: Any = None,
    name: str | None = None,
    arch: str | None = None,
    std: str | None = None,
    no_source_include: bool | None = None,
    target_type: str = "cubin",
    extra_options: Sequence[str | bytes] = (),
    method: str = "auto",
    retrace: bool = False,
    cache: StateCache | None = None,
) -> HeaderFingerprint:
    """Fingerprint the headers a compile of `source` under `options` reads (see the module
    docstring for the methods). `options` is a `cuda.core.ProgramOptions` (its flags are used as
    cuda.core passes them to NVRTC); the keywords add to or stand in for it. A list or tuple as
    the first argument is taken as the include path (cuda.core's docstring form) and fingerprints
    the whole tree. Raises FingerprintError when the requested method cannot run, or NVRTC fails
    before writing its trace (the compile itself would fail the same way)."""
    if method not in ("auto", *METHODS):
        raise ValueError(f"method must be auto, trace, scan or tree, not {method!r}")
    if isinstance(source, (list, tuple)):
        if include_path is not None:
            raise ValueError("include_path given twice (as the first argument and by keyword)")
        include_path, source = list(source), None
    request = _request(source, options, include_path=include_path, pre_include=pre_include,
                       define_macro=define_macro, undefine_macro=undefine_macro, name=name,
                       arch=arch, std=std, no_source_include=no_source_include,
                       target_type=target_type, extra_options=extra_options)
    cache = cache or _STATES
    cwd = os.getcwd()
    notes = list(request.notes)
    if request.code is None:
        if method not in ("auto", "tree"):
            raise FingerprintError(f"method {method!r} needs the source: only the include "
                                   "tree can be fingerprinted without it")
        pairs, missing = _tree(request, cwd)
        return _finish(pairs, missing, TREE, request, cwd, notes, cache)
    if method in ("auto", "trace"):
        memo_key = (hashlib.sha256(request.code).digest(), tuple(request.flags), request.name,
                    cwd)
        reused = None if retrace else _reusable(memo_key, cache)
        if reused is not None:
            pairs, missing, trace_notes = reused
            return _finish(list(pairs), list(missing), TRACE, request, cwd,
                           notes + list(trace_notes), cache)
        try:
            reported, trace_notes = _trace(request)
        except NvrtcUnavailable as exc:
            if method == "trace":
                raise FingerprintError(str(exc)) from exc
            notes.append(f"NVRTC trace unavailable ({exc}); headers found by scanning "
                         "#include lines instead")
        else:
            # NVRTC reports what it opened: nothing it reported is missing.
            missing: list[str] = []
            pairs, skipped = _reported_paths(reported, cwd)
            if skipped:
                trace_notes.append("not files (NVRTC built-ins): " + ", ".join(skipped))
            fingerprint = _finish(pairs, missing, TRACE, request, cwd, notes + trace_notes,
                                  cache)
            with _LOCK:
                _TRACES[memo_key] = (tuple(pairs), tuple(missing), fingerprint.states,
                                     "\n".join(trace_notes))
                while len(_TRACES) > _TRACES_MAX:
                    _TRACES.popitem(last=False)
            return fingerprint
    pairs, missing, scan_notes = _scan(request, cwd)
    return _finish(pairs, missing, SCAN, request, cwd, notes + scan_notes, cache)


def header_digest(source: str | bytes | Sequence[str] | None = None, options: Any = None,
                  **kwargs: Any) -> bytes:
    """`fingerprint_headers(...).digest`: the bytes to pass as cuda.core's `extra_digest`."""
    return fingerprint_headers(source, options, **kwargs).digest


def _reported_paths(reported: Sequence[str], cwd: str
                    ) -> tuple[list[tuple[str, str]], list[str]]:
    pairs: list[tuple[str, str]] = []
    skipped: list[str] = []
    seen: set[str] = set()
    for written in reported:
        path = normalise_path(written, cwd)
        if not os.path.isfile(path):
            # NVRTC's own in-memory headers (__nv_nvrtc_builtin_header.h) have no file.
            skipped.append(written)
            continue
        if path not in seen:
            seen.add(path)
            pairs.append((path, written))
    return pairs, skipped


def _reusable(memo_key: tuple[object, ...], cache: StateCache
              ) -> tuple[tuple[tuple[str, str], ...], tuple[str, ...], tuple[str, ...]] | None:
    with _LOCK:
        memo = _TRACES.get(memo_key)
    if memo is None:
        return None
    pairs, missing, states, notes = memo
    if changed_files(states, cache):
        return None  # a header changed: it may include other headers now
    return pairs, missing, tuple(n for n in notes.split("\n") if n)


def _finish(pairs: Sequence[tuple[str, str]], missing: Sequence[str], method: str,
            request: _Request, cwd: str, notes: Sequence[str],
            cache: StateCache) -> HeaderFingerprint:
    files = tuple(sorted((GraphFile(state=cache.capture(path), written=written)
                          for path, written in pairs), key=lambda f: f.path))
    fingerprint = HeaderFingerprint(
        digest=digest_of((f.state for f in files), missing), files=files, method=method,
        name=request.name, cwd=cwd, include_path=tuple(request.include_path),
        pre_include=tuple(request.pre_include), missing=tuple(missing),
        notes=tuple(dict.fromkeys(n for n in notes if n)))
    _register(fingerprint)
    return fingerprint

