"""cuda.core's program-cache key: what `make_program_cache_key` hashes, observed and recomputed.

Source: cuda_core/cuda/core/utils/_program_cache/_keys.py (`make_program_cache_key`, key schema
v2, cuda-core 1.2.2). The key is SHA-256 over labelled, length-prefixed parts, in this order:

1. "schema" (2); the backend's version probe: for C++ (NVRTC) "nvrtc" = "<major>.<minor>" of
   `nvrtcVersion()` (a failed probe mixes "nvrtc_probe_failed" and the exception's class name);
2. "code_type", "target_type", "code" (the source text as UTF-8);
3. "option_count" and each "option": `ProgramOptions.as_bytes("nvrtc", target_type)`;
4. "names_count" and each "name": the sorted name expressions, tagged "s:" or "b:";
5. "options_name" (`ProgramOptions.name`, when not None) and "extra_digest" (when given).

One recipe, two halves, so that what is recorded is what is recomputed:

- at the compile (the adapter): `key_observer` wraps `make_program_cache_key` and hands every key
  and the keyword arguments it was made from to the adapter's memory, changing neither the key
  nor any exception; `describe_key` turns those arguments into the record's `key_inputs`, field
  by field (JSON-able), `hit_key_inputs` into the part a hit record carries; `covered_reads`
  says which of the files the compile read the key covers;
- at the audit (the policy): `recorded_key_inputs` reads them back, `recompute_key` hashes them
  as cuda.core does, `entry_name` names the FileStreamProgramCache entry of a key.

Importing this module imports no CUDA package and little of cacheaudit (the policy imports it):
cuda.core's private `_keys` (its schema version, its NVRTC version probe), cacheaudit's header
fingerprints and the adapter helpers are imported when asked.
"""

from __future__ import annotations

import dataclasses
import functools
import hashlib
import re
from collections.abc import Callable, Container, Mapping
from typing import TYPE_CHECKING, Any

from cacheaudit.model import CompileRecord

if TYPE_CHECKING:
    from cacheaudit.adapter import Switch
    from cacheaudit.model import IncludeGraph
    from cacheaudit.runtimes.cuda_core.headers import HeaderFingerprint

__all__ = [
    "CODE_LIMIT",
    "FROM_CALLER",
    "FROM_HEADERS",
    "KEY_RECIPE",
    "ORIGINAL_ATTRIBUTE",
    "KeyRecipeError",
    "as_key_bytes",
    "code_bytes",
    "covered_reads",
    "describe_key",
    "digest_hex",
    "digest_source",
    "entry_name",
    "fingerprint_files",
    "hit_key_inputs",
    "is_unguarded",
    "key_observer",
    "observer_switch",
    "recompute_key",
    "recorded_key_inputs",
]

KEY_RECIPE = ("cuda.core program-cache key (schema v2): NVRTC major.minor, code type and "
              "target, the source text, the NVRTC option flags, name expressions, options.name "
              "and extra_digest; files enter only through extra_digest")

CODE_LIMIT = 256 * 1024
"""Sources up to this size are kept in the compile record, so that the key can be recomputed."""

FROM_HEADERS = "cacheaudit.headers"
"""`extra_digest_source` of a digest this process's `cacheaudit.headers` issued: its files and
recipe are known."""
FROM_CALLER = "caller"
"""`extra_digest_source` of any other digest: what it covers is not known."""

_PROBE_FAILED = "probe_failed:"
"""How `nvrtc_version` records a failed probe: the key then mixes the exception's class name."""

ORIGINAL_ATTRIBUTE = "__cacheaudit_original__"
"""Where each hook of the cuda.core adapter keeps the function it wraps."""
_SWITCH_ATTRIBUTE = "__cacheaudit_switch__"
"""Where the key observer keeps the switch it records under."""

_QUOTED_INCLUDE = re.compile(rb'^[ \t]*#[ \t]*include[ \t]*"([^"\r\n]+)"', re.MULTILINE)
_MACRO_INCLUDE = re.compile(rb"^[ \t]*#[ \t]*include[ \t]+[A-Za-z_]", re.MULTILINE)


# ------------------------------------------------------------------------------ the key as given


def as_key_bytes(key: object) -> bytes:
    """A cache key as bytes, as cuda.core's `_as_key_bytes` makes it: str keys are UTF-8, so
    "k" and b"k" are one entry."""
    if isinstance(key, (bytes, bytearray)):
        return bytes(key)
    if isinstance(key, str):
        return key.encode("utf-8")
    return repr(key).encode("utf-8", "surrogateescape")


def code_bytes(code: object) -> bytes:
    """The source as the key hashes it (a str as UTF-8)."""
    if isinstance(code, str):
        return code.encode("utf-8")
    if isinstance(code, (bytes, bytearray, memoryview)):
        return bytes(code)
    return str(code).encode("utf-8", "surrogateescape")


def digest_hex(digest: object) -> str | None:
    """An `extra_digest` as hex (it is mixed in as `bytes(extra_digest)`); None when it has no
    bytes."""
    try:
        return bytes(digest).hex()  # type: ignore[call-overload]
    except (TypeError, ValueError):
        return None


def digest_source(extra_digest: object, fingerprint: HeaderFingerprint | None) -> str | None:
    """Who made the `extra_digest` (`FROM_HEADERS`, `FROM_CALLER`), given the fingerprint this
    process issued with it, if any; None without a digest."""
    if extra_digest is None:
        return None
    return FROM_HEADERS if fingerprint is not None else FROM_CALLER


# ------------------------------------------------------------------------------ key inputs


def _options_summary(options: object) -> dict[str, object]:
    from cacheaudit.adapter import jsonable

    if not dataclasses.is_dataclass(options):
        return {"repr": repr(options)}
    return {f.name: jsonable(getattr(options, f.name)) for f in dataclasses.fields(options)
            if getattr(options, f.name, None) is not None}


@functools.lru_cache(maxsize=1)
def _nvrtc_version() -> str:
    """The version probe cuda.core mixes into NVRTC keys ("13.0"), or its failure label."""
    try:
        from cuda.core.utils._program_cache import _keys

        major, minor = _keys._nvrtc_version()
        return f"{major}.{minor}"
    except Exception as exc:  # noqa: BLE001 - cuda.core keys the failure's class name the same way
        return f"{_PROBE_FAILED}{type(exc).__name__}"


def _option_bytes(options: object, code_type: str, target_type: str) -> list[bytes] | None:
    """The option bytes cuda.core's key hashes: `as_bytes("nvrtc")` for C++ (its
    `_NvrtcBackend.option_fingerprint`), `as_bytes("nvvm")` for NVVM. PTX keys hash the linker's
    view, which needs a driver probe: not repeated here (None)."""
    backend = {"c++": "nvrtc", "nvvm": "nvvm"}.get(code_type)
    if backend is None:
        return None
    try:
        return [bytes(o) for o in options.as_bytes(backend, target_type)]  # type: ignore[attr-defined]
    except Exception:  # noqa: BLE001 - the key itself was made: this is evidence only
        return None


def _name_tags(name_expressions: object) -> list[str]:
    tags = []
    for name in name_expressions or ():  # type: ignore[attr-defined]
        if isinstance(name, bytes):
            tags.append("b:" + name.decode("utf-8", "surrogateescape"))
        else:
            tags.append("s:" + str(name))
    return sorted(tags)


def is_unguarded(code: object, options: object, extra_digest: object = None,
                 code_type: str = "c++") -> bool:
    """The case cuda.core's header guard misses: NVRTC, a program name without a directory
    (NVRTC then resolves quoted includes against the process's working directory), a quoted
    `#include` (or one through a macro) in the source, and no `extra_digest`."""
    if str(code_type).lower() != "c++" or extra_digest is not None:
        return False
    if getattr(options, "no_source_include", False):
        return False  # measured: NVRTC then no longer searches the working directory
    name = getattr(options, "name", None)
    if isinstance(name, str) and ("/" in name or "\\" in name):
        return False  # refused by cuda.core without an extra_digest
    raw = code_bytes(code)
    return bool(_QUOTED_INCLUDE.search(raw) or _MACRO_INCLUDE.search(raw))


def describe_key(code: object, code_type: str, options: object, target_type: str,
                 name_expressions: object = (), extra_digest: object = None,
                 *, keep_code: bool = True) -> dict[str, Any]:
    """What a cuda.core program-cache key covers, field by field (JSON-able): the compile
    record's `extra["key_inputs"]`, from which the policy recomputes the key."""
    from cacheaudit.runtimes.cuda_core.headers import issued

    code_type = str(code_type).lower()
    target_type = str(target_type).lower()
    raw = code_bytes(code)
    option_bytes = _option_bytes(options, code_type, target_type)
    fingerprint = issued(extra_digest) if extra_digest is not None else None
    try:
        from cuda.core.utils._program_cache import _keys

        schema: object = _keys._KEY_SCHEMA_VERSION
    except Exception:  # noqa: BLE001
        schema = None
    name = getattr(options, "name", None)
    inputs: dict[str, Any] = {
        "schema": schema,
        "code_type": code_type,
        "target_type": target_type,
        "code_sha256": hashlib.sha256(raw).hexdigest(),
        "code_size": len(raw),
        "name": name,
        "options": _options_summary(options),
        "option_bytes": None if option_bytes is None else [
            o.decode("utf-8", "surrogateescape") for o in option_bytes],
        "name_expressions": _name_tags(name_expressions),
        "nvrtc_version": _nvrtc_version() if code_type == "c++" else None,
        "extra_digest": digest_hex(extra_digest) if extra_digest is not None else None,
        "extra_digest_source": digest_source(extra_digest, fingerprint),
        "unguarded": is_unguarded(raw, options, extra_digest, code_type),
        "quoted_includes": sorted({m.decode("utf-8", "surrogateescape")
                                   for m in _QUOTED_INCLUDE.findall(raw)}),
    }
    if fingerprint is not None:
        inputs["fingerprint"] = fingerprint.to_dict()
    if keep_code and len(raw) <= CODE_LIMIT:
        inputs["code"] = raw.decode("utf-8", "surrogateescape")
    return inputs


def hit_key_inputs(kwargs: Mapping[str, Any],
                   fingerprint: HeaderFingerprint | None) -> dict[str, Any]:
    """The part of the key's inputs a hit record carries (the compile record has the rest):
    `kwargs` as `make_program_cache_key` was called, `fingerprint` the one issued with its
    `extra_digest`, if any."""
    options = kwargs.get("options")
    digest = kwargs.get("extra_digest")
    return {
        "name": getattr(options, "name", None),
        "extra_digest": None if digest is None else digest_hex(digest),
        "extra_digest_source": digest_source(digest, fingerprint),
        "unguarded": is_unguarded(kwargs.get("code"), options, digest,
                                  kwargs.get("code_type", "c++")),
    }


def covered_reads(kwargs: Mapping[str, Any], inputs: Mapping[str, Any]
                  ) -> tuple[IncludeGraph | None, tuple[str, ...] | None, str | None, list[str]]:
    """The files a compile read, as far as they can be known, and which of them its key
    covers: the include graph, the tracked paths (None: not known), how a later hit of the key
    is to watch them ("extra-digest": covered by a `cacheaudit.headers` fingerprint; "untracked":
    outside the key; None: not watched), and notes. `kwargs` as `make_program_cache_key` was
    called, `inputs` its `describe_key`. May run NVRTC's trace pass (`fingerprint_headers`)."""
    from cacheaudit.runtimes.cuda_core.headers import fingerprint_headers, issued

    notes: list[str] = []
    extra_digest = kwargs.get("extra_digest")
    fingerprint = issued(extra_digest) if extra_digest is not None else None
    if fingerprint is not None:
        return fingerprint.graph(), fingerprint.paths, "extra-digest", notes
    if inputs.get("code_type") != "c++":
        return None, None, None, notes
    raw = code_bytes(kwargs.get("code"))
    options = kwargs.get("options")
    reads_files = (inputs.get("unguarded") or extra_digest is not None) and (
        b"#" in raw or getattr(options, "pre_include", None))
    if not reads_files:
        return None, (), None, notes
    try:
        traced = fingerprint_headers(raw, options, target_type=inputs["target_type"])
    except Exception as exc:  # noqa: BLE001 - evidence, not a failure
        notes.append(f"the headers this compile read could not be found: "
                     f"{type(exc).__name__}: {exc}")
        return None, (() if extra_digest is None else None), None, notes
    notes += [f"header trace: {n}" for n in traced.notes if not n.startswith("not files")]
    if extra_digest is None:
        # Nothing the compile read from disk is in the key.
        return traced.graph(), (), "untracked", notes
    notes.append("extra_digest came from the caller, not from cacheaudit.headers: whether "
                 "it covers these headers is not known")
    return traced.graph(), None, None, notes


# ------------------------------------------------------------------------------ the observer


_PARAMETERS = ("code", "code_type", "options", "target_type", "name_expressions", "extra_digest")
"""`make_program_cache_key`'s parameters (cuda-core 1.2.2), all keyword-only; the last two have
defaults."""
_GIVEN_NOT = object()


def _known_signature(function: Callable[..., Any]) -> tuple[object, object] | None:
    """The defaults of `name_expressions` and `extra_digest` when `function` takes exactly the
    keyword-only parameters of `_PARAMETERS` (the first four required), else None."""
    import inspect

    try:
        parameters = list(inspect.signature(function).parameters.values())
    except (TypeError, ValueError):
        return None
    if (tuple(p.name for p in parameters) != _PARAMETERS
            or any(p.kind is not p.KEYWORD_ONLY for p in parameters)
            or any(p.default is not p.empty for p in parameters[:4])
            or any(p.default is p.empty for p in parameters[4:])):
        return None
    return parameters[4].default, parameters[5].default


def key_observer(original: Callable[..., bytes], switch: Switch,
                 note: Callable[[bytes, dict[str, Any]], None],
                 problem: Callable[[BaseException, str], None],
                 known: Container[bytes] = ()) -> Callable[..., bytes]:
    """`make_program_cache_key` wrapped: while `switch` is on, each key it returns (as bytes)
    that is not in `known`, and the keyword arguments it was made from, go to `note`, and what
    goes wrong there to `problem` (fail open). The key and any exception are the original's.

    `known` is what the caller already holds the inputs of: equal keys were made from equal
    inputs (the key is a hash of them), so a key made again, which is every cache hit's, costs
    one membership test (a disk hit is ~30-60 us, and its budget a few of them). Where the
    original has the signature of cuda-core 1.2.2, the wrapper has it too: arguments bound
    straight to parameters, not gathered in a dict and spread again for every call."""

    defaults = _known_signature(original)
    if defaults is None:
        @functools.wraps(original)
        def make_program_cache_key(*args: Any, **kwargs: Any) -> bytes:
            key = original(*args, **kwargs)
            if switch.on:
                try:
                    if key not in known:
                        note(key if type(key) is bytes else as_key_bytes(key), kwargs)
                except Exception as exc:  # noqa: BLE001 - fail open
                    problem(exc, "key")
            return key
    else:
        names_default, digest_default = defaults

        @functools.wraps(original)
        def make_program_cache_key(  # type: ignore[misc]
                *args: Any, code: Any = _GIVEN_NOT, code_type: Any = _GIVEN_NOT,
                options: Any = _GIVEN_NOT, target_type: Any = _GIVEN_NOT,
                name_expressions: Any = _GIVEN_NOT, extra_digest: Any = _GIVEN_NOT,
                **rest: Any) -> bytes:
            if (args or rest or code is _GIVEN_NOT or code_type is _GIVEN_NOT
                    or options is _GIVEN_NOT or target_type is _GIVEN_NOT):
                # Not a call the original accepts: it raises its own error, about what was
                # given.
                given = {name: value for name, value in zip(_PARAMETERS, (
                    code, code_type, options, target_type, name_expressions, extra_digest),
                    strict=True) if value is not _GIVEN_NOT}
                return original(*args, **given, **rest)
            # The original's defaults, given: the same call to a Python function.
            if name_expressions is _GIVEN_NOT:
                name_expressions = names_default
            if extra_digest is _GIVEN_NOT:
                extra_digest = digest_default
            key = original(code=code, code_type=code_type, options=options,
                           target_type=target_type, name_expressions=name_expressions,
                           extra_digest=extra_digest)
            if switch.on:
                try:
                    if key not in known:
                        note(key if type(key) is bytes else as_key_bytes(key), {
                            "code": code, "code_type": code_type, "options": options,
                            "target_type": target_type, "name_expressions": name_expressions,
                            "extra_digest": extra_digest})
                except Exception as exc:  # noqa: BLE001 - fail open
                    problem(exc, "key")
            return key

    setattr(make_program_cache_key, ORIGINAL_ATTRIBUTE, original)
    setattr(make_program_cache_key, _SWITCH_ATTRIBUTE, switch)
    return make_program_cache_key


def observer_switch(function: object) -> Switch | None:
    """The switch of a key observer (ours, perhaps from another copy of this module), else
    None."""
    from cacheaudit.adapter import Switch

    switch = getattr(function, _SWITCH_ATTRIBUTE, None)
    return switch if isinstance(switch, Switch) else None


# ------------------------------------------------------------------------------ the key recomputed


class KeyRecipeError(ValueError):
    """The recorded key inputs do not allow the key to be recomputed (the message says why)."""


def recompute_key(inputs: Mapping[str, Any], extra_digest: bytes | None) -> bytes:
    """cuda.core's key for an NVRTC (C++) compile, from a compile record's `key_inputs` and an
    `extra_digest` (the recorded one, or one recomputed from the headers now)."""
    if inputs.get("code_type") != "c++":
        raise KeyRecipeError(f"only NVRTC (c++) keys are recomputed, not "
                             f"{inputs.get('code_type')!r} (their version probes need a driver "
                             "or libNVVM)")
    if inputs.get("schema") != 2:
        raise KeyRecipeError(f"key schema {inputs.get('schema')!r}: only schema 2 is known")
    code = inputs.get("code")
    if code is None:
        raise KeyRecipeError("the source text was too large to keep in the record")
    options = inputs.get("option_bytes")
    if options is None:
        raise KeyRecipeError("the option flags were not recorded")
    version = str(inputs.get("nvrtc_version"))
    hasher = hashlib.sha256(usedforsecurity=False)

    def update(label: str, payload: bytes) -> None:
        hasher.update(label.encode("ascii"))
        hasher.update(len(payload).to_bytes(8, "big"))
        hasher.update(payload)

    update("schema", b"2")
    if version.startswith(_PROBE_FAILED):
        update("nvrtc_probe_failed", version.split(":", 1)[1].encode())
    else:
        update("nvrtc", version.encode("ascii"))
    update("code_type", b"c++")
    update("target_type", str(inputs.get("target_type")).encode("ascii"))
    update("code", str(code).encode("utf-8", "surrogateescape"))
    update("option_count", str(len(options)).encode("ascii"))
    for option in options:
        update("option", str(option).encode("utf-8", "surrogateescape"))
    names = list(inputs.get("name_expressions") or [])
    update("names_count", str(len(names)).encode("ascii"))
    for name in names:
        update("name", str(name).encode("utf-8", "surrogateescape"))
    if inputs.get("name") is not None:
        update("options_name", str(inputs["name"]).encode("utf-8", "surrogateescape"))
    if extra_digest is not None:
        update("extra_digest", bytes(extra_digest))
    return hasher.digest()


def entry_name(key: bytes) -> str:
    """The file name FileStreamProgramCache gives a key: sha256 hex (entries/<2>/<62>)."""
    return hashlib.sha256(key, usedforsecurity=False).hexdigest()


def recorded_key_inputs(record: CompileRecord | None) -> Mapping[str, Any]:
    """A record's `key_inputs` (`describe_key`, `hit_key_inputs`); {} when it has none."""
    if record is None:
        return {}
    inputs = record.extra.get("key_inputs")
    return inputs if isinstance(inputs, Mapping) else {}


def fingerprint_files(inputs: Mapping[str, Any]) -> list[str]:
    """The files a recorded `cacheaudit.headers` fingerprint covers; [] without one."""
    fingerprint = inputs.get("fingerprint")
    if isinstance(fingerprint, Mapping):
        return [str(p) for p in fingerprint.get("files") or []]
    return []
