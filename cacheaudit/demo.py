"""`cacheaudit demo`: a stale JIT cache made and caught, in a temporary directory.

The reference runtime (fixtures/minijit, DeepJIT's cache semantics) builds a kernel through the
compiler shim. Then a CUTLASS-style header it never hashes is edited, and NVCC_APPEND_FLAGS is set
(CPATH is pointed elsewhere when only g++ is present): the runtime answers with its old binary,
which a fresh compile proves stale, and `scan` names every cause with its evidence. Nothing
outside the temporary directory is touched, the user's own ledger and caches included.
"""

from __future__ import annotations

import os
import shutil
import tempfile
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from types import ModuleType
from typing import TYPE_CHECKING, Any

from cacheaudit import contract, documents
from cacheaudit.audit import ScanResult, scan
from cacheaudit.exceptions import UsageError
from cacheaudit.ledger import Ledger
from cacheaudit.output import escape_markup, summary_line
from cacheaudit.render import Totals, View, print_prose
from cacheaudit.render import render as render_findings
from cacheaudit.shim import ShimError, find_real_compiler, install_masquerade

if TYPE_CHECKING:
    from rich.console import Console

KERNEL = """\
#include <mylib/gemm.cuh>

#ifdef __CUDACC__
__global__
#endif
void scaled_tile(float* out) { out[0] = TILE_ROWS * TILE_COLS * SCALE; }
"""
GEMM_CUH = """\
#pragma once
#include <cutlite/tile.h>
#ifndef SCALE
#define SCALE 1.0f
#endif
"""
TILE_H = "#pragma once\n#define TILE_ROWS 64\n#define TILE_COLS 64\n"
TILE_H_EDITED = "#pragma once\n#define TILE_ROWS 128\n#define TILE_COLS 64\n"


def load_minijit() -> ModuleType:
    """The reference runtime: shipped in the wheel as `cacheaudit._minijit`, and importable as
    `fixtures.minijit` from a source checkout (editable installs put the checkout on the path)."""
    try:
        from cacheaudit import _minijit  # type: ignore[attr-defined]

        return _minijit
    except ImportError:
        from fixtures import minijit

        return minijit


@dataclass
class Step:
    title: str
    event: str
    key: str
    binary_digest: str | None
    fresh_digest: str | None = None

    @property
    def stale(self) -> bool | None:
        if self.fresh_digest is None:
            return None
        return self.binary_digest != self.fresh_digest


@dataclass
class DemoResult:
    workdir: str
    backend: str
    steps: list[Step] = field(default_factory=list)
    scan: ScanResult | None = None
    changed_variable: str = ""


@contextmanager
def _environment(values: dict[str, str | None]) -> Iterator[None]:
    """The runtime reads os.environ when it is built and its compiler inherits it: set what the
    demo needs for the duration, and put everything back."""
    saved = {name: os.environ.get(name) for name in values}
    try:
        for name, value in values.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value
        yield
    finally:
        for name, value in saved.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value


def _write(path: str, text: str) -> None:
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, "w", encoding="utf-8") as handle:
        handle.write(text)


def _digest(path: str) -> str:
    from cacheaudit.digest import hash_file

    return hash_file(path)


def _nvcc_available() -> bool:
    # The demo compiles through the shim: an nvcc is there when the shim would find one.
    try:
        find_real_compiler("nvcc", os.environ)
    except ShimError:
        return False
    return True


def choose_backend(compiler: str) -> str:
    """The compiler the demo builds with; UsageError when it is not installed."""
    if compiler == "auto":
        if _nvcc_available():
            return "nvcc"
        compiler = "g++"
    if compiler == "nvcc" and not _nvcc_available():
        raise UsageError("the demo with --compiler nvcc needs nvcc on PATH (or under CUDA_HOME)")
    if compiler == "g++" and shutil.which("g++") is None:
        raise UsageError("the demo needs g++ (or nvcc) on PATH to build its kernel")
    return compiler


def run_demo(workdir: str | None = None, say: Callable[[str], None] = print,
             compiler: str = "auto") -> DemoResult:
    """Run the demo in `workdir`, a new temporary directory by default; one made here is
    removed again when the demo fails, and left to the caller when it succeeds."""
    backend = choose_backend(compiler)
    minijit = load_minijit()
    made = workdir is None
    workdir = workdir or tempfile.mkdtemp(prefix="cacheaudit-demo-")
    try:
        return _run(minijit, workdir, backend, say)
    except BaseException:
        if made:
            shutil.rmtree(workdir, ignore_errors=True)
        raise


def _run(minijit: ModuleType, workdir: str, backend: str,
         say: Callable[[str], None]) -> DemoResult:
    result = DemoResult(workdir=workdir, backend=backend)
    include, third = os.path.join(workdir, "include"), os.path.join(workdir, "third_party")
    _write(os.path.join(include, "mylib", "gemm.cuh"), GEMM_CUH)
    _write(os.path.join(third, "cutlite", "tile.h"), TILE_H)
    _write(os.path.join(workdir, "alt", "cutlite", "tile.h"), TILE_H_EDITED)
    masq = os.path.join(workdir, "shims")
    install_masquerade(masq, names=["nvcc", "g++", "gcc"])
    base: dict[str, str | None] = {
        "CACHEAUDIT_LEDGER": os.path.join(workdir, "ledger.db"),
        "DG_JIT_CACHE_DIR": os.path.join(workdir, "cache"),
        "DG_JIT_NVCC_COMPILER": os.path.join(masq, "nvcc" if backend == "nvcc" else "g++"),
        "PATH": os.pathsep.join([masq, os.environ.get("PATH", os.defpath)]),
        "HOME": workdir, "NVCC_APPEND_FLAGS": None, "NVCC_PREPEND_FLAGS": None, "CPATH": None,
        "CACHEAUDIT_RUN": None, "CACHEAUDIT_DISABLE": None,
    }
    config = minijit.Config(workdir, "DG", include_dirs=[include, third],
                            include_prefixes=["mylib/"])
    kind = "nvcc" if backend == "nvcc" else "gxx"

    def request(title: str, extra: dict[str, str | None]) -> Step:
        with _environment({**base, **extra}):
            kernel = minijit.Runtime(config, backend=kind).compile("scaled_tile", KERNEL)
        step = Step(title, kernel.event, kernel.key, _digest(kernel.binary))
        say(f"  {title}: the runtime answered [bold]{kernel.event}[/bold] (key {kernel.key[:12]})")
        return step

    def fresh(extra: dict[str, str | None]) -> str:
        """The ground truth: the same request against an empty cache, without the shim."""
        empty = tempfile.mkdtemp(prefix="fresh-", dir=workdir)
        with _environment({**base, **extra, "DG_JIT_CACHE_DIR": empty,
                           "CACHEAUDIT_DISABLE": "1"}):
            return _digest(minijit.Runtime(config, backend=kind).compile(
                "scaled_tile", KERNEL).binary)

    say(f"[bold]1.[/bold] A DeepJIT-style runtime builds a kernel with {backend}, through the "
        f"cacheaudit shim:")
    result.steps.append(request("first request", {}))

    say("[bold]2.[/bold] Edit third_party/cutlite/tile.h (CUTLASS-style: reached through "
        "<mylib/gemm.cuh>, never hashed) and ask again from a new runtime object, as a new "
        "process would:")
    _write(os.path.join(third, "cutlite", "tile.h"), TILE_H_EDITED)
    step = request("after the header edit", {})
    step.fresh_digest = fresh({})
    result.steps.append(step)

    if backend == "nvcc":
        variable, value = "NVCC_APPEND_FLAGS", "-DSCALE=2.0f"
    else:
        variable, value = "CPATH", os.path.join(workdir, "alt")
    result.changed_variable = variable
    say(f"[bold]3.[/bold] Set {escape_markup(f'{variable}={value}')} and ask again:")
    step = request(f"with {variable} set", {variable: value})
    step.fresh_digest = fresh({variable: value})
    result.steps.append(step)
    for done in result.steps[1:]:
        verdict = "a fresh compile gives different bytes: [bold red]stale[/bold red]" if (
            done.stale) else "a fresh compile gives the same bytes"
        say(f"  {done.title}: served the binary of key {done.key[:12]}; {verdict}")

    say(f"[bold]4.[/bold] cacheaudit scan {escape_markup(os.path.join(workdir, 'cache'))}:")
    with _environment({**base, variable: value}), Ledger.open(
            os.path.join(workdir, "ledger.db")) as ledger:
        result.scan = scan([os.path.join(workdir, "cache")], dict(os.environ), ledger=ledger)
    return result


def result_json(result: DemoResult) -> str:
    """`demo --json`: each request with the binary served and a fresh compile's (xxh3-128),
    then the scan's findings as `scan --json` gives them."""
    scan = result.scan
    payload: dict[str, Any] = {
        "workdir": result.workdir, "backend": result.backend,
        "changed_variable": result.changed_variable,
        "steps": [{"title": s.title, "event": s.event, "key": s.key,
                   "binary": s.binary_digest, "fresh": s.fresh_digest, "stale": s.stale}
                  for s in result.steps]}
    if scan is not None:
        payload["summary"] = summary_line(len(scan.entries), len(scan.roots), scan.matched,
                                          scan.reconstructed, scan.findings)
        payload["totals"] = documents.scan_totals(
            entries=len(scan.entries), roots=len(scan.roots), matched=scan.matched,
            reconstructed=scan.reconstructed, findings=len(scan.findings))
    payload.update(documents.findings_payload(scan.findings if scan is not None else []))
    return contract.dumps(contract.document("demo", "demo", payload))


def render(result: DemoResult, console: Console) -> None:
    """The demo's findings and what they show, for a person."""
    scan = result.scan
    if scan is None:
        return
    totals = Totals(len(scan.entries), len(scan.roots), scan.matched, scan.reconstructed)
    render_findings(scan.findings, [totals.text()], View(width=console.width), console)
    print_prose(console, escape_markup(
        "The runtime served the same binary three times while the code it was built from "
        f"changed twice: its key covers neither the edited header nor "
        f"{result.changed_variable}. Each finding names the input, its recorded and current "
        "value, and how that was established."))
