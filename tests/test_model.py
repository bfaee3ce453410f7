"""The shared vocabulary: typed record facts, and where `extra` keys may live."""

from __future__ import annotations

import ast
import importlib
from pathlib import Path

import pytest

import cacheaudit
from cacheaudit.model import LEDGER_FACTS, STORED_FACTS, CompileRecord, split_stored_extra

PACKAGE = Path(cacheaudit.__file__).parent
TYPED_FACTS = frozenset(STORED_FACTS + LEDGER_FACTS)


def _record(**fields: object) -> CompileRecord:
    return CompileRecord(record_id="r", event="compile", started_ns=1, **fields)  # type: ignore[arg-type]


@pytest.mark.parametrize("name", sorted(TYPED_FACTS))
def test_a_typed_fact_passed_in_extra_is_refused(name: str) -> None:
    with pytest.raises(ValueError, match=f"extra holds {name}"):
        _record(extra={name: "x"})


def test_stored_extra_and_its_split_are_inverse() -> None:
    record = _record(extra={"pch": {"event": "reused"}}, reconstructed=True,
                     modified_during_compile=("/a.h", "/b.h"), runtime_process="h:1:2",
                     graph_problem="no trace", runtime_error="refused")
    stored = record.stored_extra()
    assert stored["modified_during_compile"] == ["/a.h", "/b.h"]
    facts, rest = split_stored_extra(stored)
    assert rest == {"pch": {"event": "reused"}}
    assert _record(extra=rest, **facts) == record
    assert _record().stored_extra() == {} and split_stored_extra(None) == ({}, {})


def test_a_malformed_stored_fact_is_dropped_not_raised() -> None:
    # Ledgers written by someone else are data: a wrong type never stops a read.
    facts, rest = split_stored_extra({"modified_during_compile": 5, "runtime_error": 3})
    assert facts == {"runtime_error": "3"} and rest == {}


def _extra_keys(tree: ast.AST) -> set[str]:
    """String keys read or written on something named `extra` (`extra["k"]`,
    `record.extra.get("k")`, `extra = {"k": ...}`, `extra={"k": ...}` in a call)."""

    def is_extra(node: ast.AST) -> bool:
        return (isinstance(node, ast.Name) and node.id == "extra") or (
            isinstance(node, ast.Attribute) and node.attr == "extra")

    def literal_keys(node: ast.AST | None) -> set[str]:
        if not isinstance(node, ast.Dict):
            return set()
        return {k.value for k in node.keys
                if isinstance(k, ast.Constant) and isinstance(k.value, str)}

    keys: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Subscript) and is_extra(node.value):
            if isinstance(node.slice, ast.Constant) and isinstance(node.slice.value, str):
                keys.add(node.slice.value)
        elif isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and (
                node.func.attr == "get" and is_extra(node.func.value) and node.args):
            first = node.args[0]
            if isinstance(first, ast.Constant) and isinstance(first.value, str):
                keys.add(first.value)
        elif isinstance(node, (ast.Assign, ast.AnnAssign)):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            if any(is_extra(t) for t in targets):
                keys |= literal_keys(node.value)
        if isinstance(node, ast.Call):
            for keyword in node.keywords:
                if keyword.arg == "extra":
                    keys |= literal_keys(keyword.value)
    return keys


def test_extra_keys_are_a_runtime_s_own_and_declared_in_its_package() -> None:
    """A fact another module reads is a typed field; a runtime's private keys are declared in
    its package's `extra.py` (`KEYS`), so that a rewritten adapter cannot add one unseen."""
    outside: dict[str, set[str]] = {}
    undeclared: dict[str, set[str]] = {}
    for path in sorted(PACKAGE.rglob("*.py")):
        keys = _extra_keys(ast.parse(path.read_text(encoding="utf-8")))
        if not keys:
            continue
        relative = path.relative_to(PACKAGE)
        if relative.parts[0] != "runtimes" or len(relative.parts) < 3:
            outside[str(relative)] = keys
            continue
        package = relative.parts[1]
        try:
            declared = importlib.import_module(f"cacheaudit.runtimes.{package}.extra").KEYS
        except ModuleNotFoundError:
            declared = frozenset()
        if keys - declared or keys & TYPED_FACTS:
            undeclared[str(relative)] = keys - declared
    assert outside == {}
    assert undeclared == {}


def test_declared_keys_are_no_typed_fact() -> None:
    for path in sorted((PACKAGE / "runtimes").glob("*/extra.py")):
        module = importlib.import_module(f"cacheaudit.runtimes.{path.parent.name}.extra")
        assert not module.KEYS & TYPED_FACTS, path
