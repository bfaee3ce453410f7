"""The core names no runtime: runtime knowledge lives in its package under cacheaudit/runtimes/.

Every identifier and every string in the code of the modules outside cacheaudit/runtimes/ is
checked; docstrings and comments may name runtimes as examples. (The import layering itself is the
import-linter contract in pyproject.toml, which .ci/run checks.)
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

import cacheaudit

PACKAGE = Path(cacheaudit.__file__).parent
RUNTIME_WORDS = re.compile(
    r"deepjit|deepgemm|deepep|deep_gemm|deep_ep|triton|torch|nvrtc|cuda.core|cuda_core|cupy|"
    r"flashinfer|minijit|\b(?:DG|EP|DJ)_", re.IGNORECASE)

# Where a runtime's name is the point: the one list of runtimes, the public name of cuda.core's
# header helper, the demo, which drives the reference runtime (DeepJIT's semantics), and the
# SQL comments of the ledger's schema, which name example values.
ALLOWED: dict[str, set[str] | None] = {
    "spec.py": {"BUILT_IN"}, "headers.py": None, "demo.py": None, "ledger/schema.py": {"SCHEMA"}}


def _docstrings(tree: ast.AST) -> set[int]:
    """ids of the string constants that are docstrings (of a module, class or function, or the
    attribute docstring after an assignment)."""
    found: set[int] = set()
    for node in ast.walk(tree):
        body = getattr(node, "body", None)
        if not isinstance(body, list):
            continue
        for position, statement in enumerate(body):
            if (isinstance(statement, ast.Expr) and isinstance(statement.value, ast.Constant)
                    and isinstance(statement.value.value, str)
                    and (position == 0 or isinstance(body[position - 1],
                                                     (ast.Assign, ast.AnnAssign)))):
                found.add(id(statement.value))
    return found


def _names_in_code(path: Path, allowed: set[str] | None = None) -> list[tuple[int, str]]:
    tree = ast.parse(path.read_text(encoding="utf-8"))
    skipped: set[int] = _docstrings(tree)
    for node in ast.walk(tree):
        if isinstance(node, ast.Assign) and allowed and any(
                isinstance(t, ast.Name) and t.id in allowed for t in node.targets):
            skipped.update(id(child) for child in ast.walk(node))
    hits = []
    for node in ast.walk(tree):
        if id(node) in skipped:
            continue
        text = (node.value if isinstance(node, ast.Constant) and isinstance(node.value, str)
                else node.id if isinstance(node, ast.Name)
                else node.attr if isinstance(node, ast.Attribute)
                else node.name if isinstance(node, (ast.FunctionDef, ast.ClassDef, ast.alias))
                else None)
        if text and RUNTIME_WORDS.search(text) and not text.startswith("cacheaudit.runtimes"):
            hits.append((getattr(node, "lineno", 0), text[:60]))
    return hits


def test_the_core_names_no_runtime() -> None:
    offending = {}
    for path in sorted(PACKAGE.rglob("*.py")):
        relative = path.relative_to(PACKAGE).as_posix()
        allowed = ALLOWED.get(relative, set())
        if relative.startswith("runtimes/") or allowed is None:
            continue
        if hits := _names_in_code(path, allowed):
            offending[relative] = hits
    assert offending == {}


def test_the_check_sees_a_runtime_named_in_code(tmp_path: Path) -> None:
    module = tmp_path / "leaky.py"
    module.write_text('"""Docstrings may say DeepGEMM."""\nSETTING = "DG_JIT_NVCC_COMPILER"\n')
    assert _names_in_code(module) == [(2, "DG_JIT_NVCC_COMPILER")]


def _contracts() -> dict[str, dict]:
    try:
        import tomllib
    except ModuleNotFoundError:  # Python 3.10
        import tomli as tomllib  # type: ignore[no-redef]

    with open(PACKAGE.parent / "pyproject.toml", "rb") as handle:
        config = tomllib.load(handle)
    return {c["id"]: c for c in config["tool"]["importlinter"]["contracts"]}


def _top_level_modules() -> set[str]:
    return {f"cacheaudit.{p.stem if p.is_file() else p.name}" for p in PACKAGE.iterdir()
            if (p.suffix == ".py" and p.stem != "__init__")
            or (p.is_dir() and (p / "__init__.py").exists())}


def test_the_import_contracts_cover_every_module_and_runtime() -> None:
    """A module or runtime package that the contracts do not list would go unchecked."""
    from cacheaudit.spec import BUILT_IN

    contracts = _contracts()
    layered = {m.strip() for layer in contracts["layers"]["layers"]
               for m in layer.replace("|", ":").split(":")}
    assert _top_level_modules() - layered == set()
    packages = {f"cacheaudit.runtimes.{name}" for name in BUILT_IN}
    assert set(contracts["runtimes-independent"]["modules"]) == packages
    outside = contracts["no-runtime-code-outside"]
    assert set(outside["forbidden_modules"]) == packages | {
        "cacheaudit.runtimes._deepseek", "cacheaudit.runtimes._ninja"}
    assert set(outside["source_modules"]) == _top_level_modules() - {
        "cacheaudit.runtimes", "cacheaudit.headers"}
