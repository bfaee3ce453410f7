"""The human output as a person sees it: golden files of every format and command at 80 and 160
columns, from real scans of the demo's minijit cache after the untracked edit (the reference
runtime, a real compile through the shim, a real ledger), a cache of 400 stale entries, and a
scan inside tmux at 80 columns; `evict` (`--dry-run` and a real one) and `stats` too (the pytest
plugin's section is in test_pytest_plugin.py, from a real session).

Regenerate the golden files with `CACHEAUDIT_UPDATE_GOLDEN=1 pytest tests/test_render_golden.py`
and read the diff: temporary paths, times, durations, 32-digit keys and ids, and what depends on
this machine's compiler (its path, version, digest, the binaries' digests) are replaced by
placeholders (`normalise`). JSON is not here: its contract and schema are tested on their own.

Every verdict rests on ground truth: the demo compiled the same request again into an empty
cache, and that fresh binary differs from the one the runtime served.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import re
import shlex
import shutil
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import jsonschema
import pytest
import xxhash

from cacheaudit.exceptions import ExitCode

from support import needs_gxx

GOLDEN = Path(__file__).resolve().parent / "golden"
UPDATE = os.environ.get("CACHEAUDIT_UPDATE_GOLDEN") == "1"
ROOT = Path(__file__).resolve().parent.parent
WIDTHS = (80, 160)

pytestmark = needs_gxx


@dataclass
class Demo:
    """The demo's workdir after its three requests: one entry, served stale twice."""

    workdir: Path
    entry: Path
    served: str
    """The digest of the binary the runtime served after the header edit."""
    fresh: str
    """The digest of a fresh compile of the same request into an empty cache."""
    env: dict[str, str]
    replacements: dict[str, str]
    events: tuple[str, ...] = ()
    """What the runtime answered the demo's requests, in order."""

    def cacheaudit(self, *args: str, columns: int | None = 80,
                   **env: str) -> subprocess.CompletedProcess[str]:
        run_env = dict(self.env, **env)
        run_env.pop("COLUMNS", None)
        if columns is not None:
            run_env["COLUMNS"] = str(columns)
        return subprocess.run([sys.executable, "-m", "cacheaudit", *args], capture_output=True,
                              text=True, env=run_env, cwd=self.workdir, timeout=300)


def _short_tmp() -> str:
    """A short temporary directory: at 80 columns an entry's path must fit a line whole."""
    base = "/tmp" if os.access("/tmp", os.W_OK) else tempfile.gettempdir()
    return tempfile.mkdtemp(prefix="ca-", dir=base)


def _environment(workdir: Path) -> dict[str, str]:
    """The demo's scan environment (its third request set CPATH), free of the caller's."""
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("CACHEAUDIT", "NVCC_", "DG_", "EP_", "DJ_", "PYTEST_"))
           and k not in ("CPATH", "C_INCLUDE_PATH", "CPLUS_INCLUDE_PATH", "COLUMNS", "LINES",
                         "NO_COLOR", "FORCE_COLOR")}
    env.update({"CACHEAUDIT_LEDGER": str(workdir / "ledger.db"),
                "DG_JIT_CACHE_DIR": str(workdir / "cache"), "HOME": str(workdir),
                # The real compiler (`cacheaudit run` puts its own shim in front of it); its
                # --version is what the demo's key hashed through the demo's shim.
                "DG_JIT_NVCC_COMPILER": shutil.which("g++") or "g++",
                "CPATH": str(workdir / "alt"), "TZ": "UTC",
                "PYTHONPATH": os.pathsep.join([str(ROOT), env.get("PYTHONPATH", "")])})
    return env


def _make_demo(workdir: Path) -> Demo:
    from cacheaudit.demo import run_demo

    # Outside any test's name: the shim records PYTEST_CURRENT_TEST as the compile's test.
    current = os.environ.pop("PYTEST_CURRENT_TEST", None)
    try:
        result = run_demo(workdir=str(workdir), compiler="g++", say=lambda _line: None)
    finally:
        if current is not None:
            os.environ["PYTEST_CURRENT_TEST"] = current
    edited = result.steps[1]
    # Ground truth: the request after the header edit was served the old binary.
    assert edited.event == "disk-hit" and edited.fresh_digest is not None
    assert edited.binary_digest != edited.fresh_digest, "the demo's entry is not stale"
    [entry] = (workdir / "cache" / "cache").iterdir()
    demo = Demo(workdir=workdir, entry=entry, served=edited.binary_digest,
                fresh=edited.fresh_digest, env=_environment(workdir), replacements={},
                events=tuple(step.event for step in result.steps))
    demo.replacements = _machine_specific(demo)
    return demo


def _machine_specific(demo: Demo) -> dict[str, str]:
    """What this machine's compiler puts into the output, each with its placeholder."""
    shown = demo.cacheaudit("report", "--json")
    [record] = json.loads(shown.stdout)["records"]
    compiler = record["compiler"]
    found: dict[str, str] = {}
    for line in (compiler["version_text"] or "").splitlines():
        if line.strip():
            found[line.strip()] = "<compiler --version line>"
    found[compiler["version"]] = "<compiler version>"
    if compiler["resolved"] and compiler["resolved"] != compiler["path"]:
        found[compiler["resolved"]] = "<compiler behind the path>"
    found[compiler["path"]] = "<compiler>"
    found[compiler["digest"][:12]] = "<compiler digest>"
    for state in record["outputs"]:
        found[state["digest"][:12]] = "<binary digest>"
    found[record["inputs"]["graph"]["digest"][:8]] = "<graph digest>"
    return found


@pytest.fixture(scope="module")
def demo() -> Iterator[Demo]:
    workdir = Path(_short_tmp())
    try:
        yield _make_demo(workdir)
    finally:
        shutil.rmtree(workdir, ignore_errors=True)


def normalise(text: str, demo: Demo) -> str:
    """The output with what differs between runs and machines replaced by placeholders."""
    for value, placeholder in sorted(demo.replacements.items(), key=lambda kv: -len(kv[0])):
        text = text.replace(value, placeholder)
    text = text.replace(str(demo.workdir), "<tmp>")
    text = text.replace(Path(str(demo.workdir)).as_uri(), "file://<tmp>")
    # The runtime's build directory: <pid>-<8 hex>-<8 hex>-<8 hex>.
    text = re.sub(r"/\d+-[0-9a-f]{8}-[0-9a-f]{8}-[0-9a-f]{8}/", "/<build>/", text)
    text = re.sub(r"\d{4}-\d\d-\d\d \d\d:\d\d:\d\d", "<time>", text)
    text = re.sub(r"\b\d+ ms\b", "<n> ms", text)
    text = re.sub(r"\bpid \d+", "pid <n>", text)
    return re.sub(r"\b[0-9a-f]{32}\b", "<32 hex>", text)


def check_golden(name: str, text: str) -> None:
    path = GOLDEN / f"{name}.txt"
    if UPDATE:
        GOLDEN.mkdir(exist_ok=True)
        path.write_text(text, encoding="utf-8")
        return
    assert path.exists(), f"no golden file {path.name}: run with CACHEAUDIT_UPDATE_GOLDEN=1"
    expected = path.read_text(encoding="utf-8")
    assert text == expected, (f"{path.name} differs (CACHEAUDIT_UPDATE_GOLDEN=1 rewrites it):\n"
                              + "".join(_diff(expected, text)))


def _diff(expected: str, actual: str) -> list[str]:
    import difflib

    return list(difflib.unified_diff(expected.splitlines(True), actual.splitlines(True),
                                     "golden", "now"))


def _paths_whole(text: str, paths: list[str]) -> list[str]:
    """The paths that no line of `text` holds whole."""
    lines = text.splitlines()
    return [p for p in paths if not any(p in line for line in lines)]


# ------------------------------------------------------------------------------ scan


SCAN_FORMATS = ("full", "concise", "markdown", "github", "sarif")


@pytest.mark.parametrize("columns", WIDTHS)
@pytest.mark.parametrize("output_format", SCAN_FORMATS)
def test_scan_golden(demo: Demo, output_format: str, columns: int):
    done = demo.cacheaudit("scan", str(demo.workdir / "cache"), "--output-format",
                           output_format, columns=columns)
    assert done.returncode == ExitCode.FINDINGS, done.stderr
    header = demo.workdir / "third_party" / "cutlite" / "tile.h"
    # The stale entry's cause is named by its path, whole, in every format.
    assert str(header) in done.stdout and str(demo.entry) in done.stdout
    if output_format in ("full", "concise"):
        assert f"{header}: CA101 error" in done.stdout
        assert "CPATH: CA202 error" in done.stdout
        assert done.stdout.rstrip().splitlines()[-1].endswith("unverifiable")
    if output_format == "full":
        assert not _paths_whole(done.stdout, [str(header), str(demo.entry)])
        if columns == 160:
            assert max(len(line) for line in done.stdout.splitlines()) <= columns
    check_golden(f"scan-{output_format}-{columns}", normalise(done.stdout, demo))


@pytest.mark.parametrize("columns", WIDTHS)
def test_scan_quiet_golden(demo: Demo, columns: int):
    done = demo.cacheaudit("scan", str(demo.workdir / "cache"), "--quiet", columns=columns)
    assert done.returncode == ExitCode.FINDINGS
    assert "CA101 error" not in done.stdout and done.stdout.startswith("cacheaudit: 2 errors")
    check_golden(f"scan-quiet-{columns}", normalise(done.stdout, demo))
    # Nothing at all on success: no finding of the selected codes.
    clean = demo.cacheaudit("scan", str(demo.workdir / "cache"), "--quiet", "--select", "CA3",
                            columns=columns)
    assert clean.returncode == ExitCode.CLEAN and clean.stdout == "", clean.stdout


def test_the_old_names_still_work(demo: Demo):
    table = demo.cacheaudit("scan", str(demo.workdir / "cache"), "--format", "table")
    full = demo.cacheaudit("scan", str(demo.workdir / "cache"), "--output-format", "full")
    assert table.stdout == full.stdout
    as_json = demo.cacheaudit("scan", str(demo.workdir / "cache"), "--json")
    assert json.loads(as_json.stdout)["counts"]["CA101"] == 1
    bad = demo.cacheaudit("scan", str(demo.workdir / "cache"), "--output-format", "xml")
    assert bad.returncode == ExitCode.USAGE and "--output-format must be one of" in bad.stderr


def test_colour_follows_color_no_color_and_force_color(demo: Demo):
    cache = str(demo.workdir / "cache")
    red = "\x1b[1;31m"
    assert red in demo.cacheaudit("scan", cache, "--color", "always").stdout
    assert "\x1b[" not in demo.cacheaudit("scan", cache, "--color", "never",
                                          FORCE_COLOR="1").stdout
    assert "\x1b[" not in demo.cacheaudit("scan", cache).stdout  # auto, not a terminal
    assert red in demo.cacheaudit("scan", cache, FORCE_COLOR="1").stdout
    assert red not in demo.cacheaudit("scan", cache, FORCE_COLOR="1", NO_COLOR="1").stdout
    bad = demo.cacheaudit("scan", cache, "--color", "sometimes")
    assert bad.returncode == ExitCode.USAGE and "--color must be one of" in bad.stderr


# A minimal structure check of SARIF 2.1.0, written from the specification's required
# properties (the official schema, https://json.schemastore.org/sarif-2.1.0.json, is not
# available offline here): what GitHub code scanning needs to read a log.
SARIF_STRUCTURE: dict[str, Any] = {
    "type": "object",
    "required": ["version", "runs"],
    "properties": {
        "version": {"const": "2.1.0"},
        "$schema": {"type": "string"},
        "runs": {"type": "array", "minItems": 1, "items": {
            "type": "object", "required": ["tool", "results"],
            "properties": {
                "tool": {"type": "object", "required": ["driver"], "properties": {
                    "driver": {"type": "object", "required": ["name", "rules"], "properties": {
                        "name": {"type": "string"}, "version": {"type": "string"},
                        "rules": {"type": "array", "items": {
                            "type": "object", "required": ["id", "shortDescription", "helpUri"],
                            "properties": {
                                "id": {"type": "string"},
                                "shortDescription": {"type": "object", "required": ["text"]},
                                "helpUri": {"type": "string"},
                                "defaultConfiguration": {"type": "object", "properties": {
                                    "level": {"enum": ["none", "note", "warning", "error"]}}},
                            }}}}}}},
                "results": {"type": "array", "items": {
                    "type": "object", "required": ["ruleId", "message"],
                    "properties": {
                        "ruleId": {"type": "string"}, "ruleIndex": {"type": "integer"},
                        "level": {"enum": ["none", "note", "warning", "error"]},
                        "message": {"type": "object", "required": ["text"],
                                    "properties": {"text": {"type": "string"}}},
                        "locations": {"type": "array", "items": {"type": "object", "properties": {
                            "physicalLocation": {
                                "type": "object", "required": ["artifactLocation"],
                                "properties": {"artifactLocation": {
                                    "type": "object", "required": ["uri"],
                                    "properties": {"uri": {"type": "string",
                                                           "pattern": "^file:///"}}}}},
                            "logicalLocations": {"type": "array", "items": {
                                "type": "object", "required": ["name"]}}}}},
                        "relatedLocations": {"type": "array"},
                        "properties": {"type": "object"},
                    }}},
            }}},
    },
}


def test_sarif_is_sarif_2_1_0_located_at_the_changed_header(demo: Demo):
    done = demo.cacheaudit("scan", str(demo.workdir / "cache"), "--output-format", "sarif")
    log = json.loads(done.stdout)
    jsonschema.validate(log, SARIF_STRUCTURE)
    [run] = log["runs"]
    rules = [rule["id"] for rule in run["tool"]["driver"]["rules"]]
    from cacheaudit.model import FINDING_CODES

    assert rules == sorted(FINDING_CODES)
    assert all(rule["helpUri"] == f"docs/findings/{rule['id']}.md"
               for rule in run["tool"]["driver"]["rules"])
    for result in run["results"]:
        assert rules[result["ruleIndex"]] == result["ruleId"]
    [stale] = [r for r in run["results"] if r["ruleId"] == "CA101"]
    header = demo.workdir / "third_party" / "cutlite" / "tile.h"
    assert stale["locations"][0]["physicalLocation"]["artifactLocation"]["uri"] == \
        header.as_uri()
    assert stale["relatedLocations"][0]["physicalLocation"]["artifactLocation"]["uri"] == \
        demo.entry.as_uri()
    assert stale["level"] == "error" and stale["properties"]["entry"] == str(demo.entry)
    [drift] = [r for r in run["results"] if r["ruleId"] == "CA202"]
    assert drift["locations"][0]["logicalLocations"] == [{"name": "CPATH", "kind": "variable"}]


def test_github_annotations_escape_what_the_runner_reads():
    from cacheaudit.model import Finding
    from cacheaudit.render import View, github

    finding = Finding("CA101", "/src/a,b:c%.h", "changed\nthere", entry="/cache/e",
                      recorded="x", current="y", how="hash", hint="evict the entry (/cache/e)")
    [annotation, *_summary] = github([finding], ["scanned"], View()).splitlines()
    head, _, message = annotation.partition("::")[2].partition("::")
    assert head == ("error file=/src/a%2Cb%3Ac%25.h,title=CA101 stale hit%3A untracked "
                    "dependency changed%2C key unchanged")
    assert message.startswith("changed%0Athere%0A1 entry: /cache/e%0A")
    assert "\n" not in message and "%0Afix: evict the entry (/cache/e)%0A" in message


# ------------------------------------------------------------------------------ the other commands


@pytest.mark.parametrize("columns", WIDTHS)
def test_explain_golden(demo: Demo, columns: int):
    done = demo.cacheaudit("explain", str(demo.entry), columns=columns)
    assert done.returncode == 0, done.stderr
    assert " ".join(done.stdout.split()).startswith(f"{demo.entry}: deepjit kernel scaled_tile")
    assert "matches the entry's key" in done.stdout
    check_golden(f"explain-full-{columns}", normalise(done.stdout, demo))


@pytest.mark.parametrize("columns", WIDTHS)
@pytest.mark.parametrize("output_format", ("full", "concise"))
def test_report_golden(demo: Demo, output_format: str, columns: int):
    done = demo.cacheaudit("report", "--output-format", output_format, columns=columns)
    assert done.returncode == 0, done.stderr
    assert f"{demo.entry}: deepjit kernel scaled_tile, compile at" in " ".join(done.stdout.split())
    assert "shim:" not in done.stdout  # said as "through the compiler shim (g++)"
    assert done.stdout.rstrip().endswith("cacheaudit: 1 recorded compile")
    check_golden(f"report-{output_format}-{columns}", normalise(done.stdout, demo))


JOB = """\
import sys
import xxhash
from cacheaudit.demo import KERNEL, load_minijit

minijit = load_minijit()
work = sys.argv[1]
config = minijit.Config(work, "DG", include_dirs=[work + "/include", work + "/third_party"],
                        include_prefixes=["mylib/"])
kernel = minijit.Runtime(config, backend="gxx").compile("scaled_tile", KERNEL)
print(kernel.event, xxhash.xxh3_128_hexdigest(open(kernel.binary, "rb").read()))
"""


@pytest.mark.parametrize("columns", WIDTHS)
def test_run_golden(demo: Demo, columns: int):
    job = demo.workdir / "job.py"
    job.write_text(JOB)
    done = demo.cacheaudit("run", "--", sys.executable, str(job), str(demo.workdir),
                           columns=columns)
    assert done.returncode == 0, done.stderr
    event, served = done.stdout.split()
    # Ground truth: the job was served the stale binary, not what a fresh compile gives.
    assert event == "disk-hit" and served == demo.served != demo.fresh
    header = demo.workdir / "third_party" / "cutlite" / "tile.h"
    assert f"{header}: CA101 error" in done.stderr
    # The summary last: the verdict, then the run's counts.
    tail = done.stderr[done.stderr.rindex("\ncacheaudit: ") + 1:]
    assert tail.startswith("cacheaudit: 2 errors") and "judged in run" in " ".join(tail.split())
    check_golden(f"run-full-{columns}", normalise(done.stderr, demo))


# ------------------------------------------------------------------------------ 400 stale entries


@pytest.fixture(scope="module")
def many() -> Iterator[tuple[Demo, list[str]]]:
    """The demo's stale entry and 399 byte-for-byte copies of it under other keys: each holds
    the binary the recorded compile wrote (the scan ties each to that compile), each stale by
    the demo's ground truth."""
    workdir = Path(_short_tmp())
    try:
        demo = _make_demo(workdir)
        entries = [str(demo.entry)]
        for number in range(1, 400):
            key = hashlib.md5(f"k{number}".encode()).hexdigest()
            copy = demo.entry.parent / f"scaled_tile.{key}"
            shutil.copytree(demo.entry, copy, copy_function=shutil.copy2)
            entries.append(str(copy))
        for entry in entries:
            binary = Path(entry) / "kernel.so"
            assert xxhash.xxh3_128_hexdigest(binary.read_bytes()) == demo.served != demo.fresh
        yield demo, sorted(entries)
    finally:
        shutil.rmtree(workdir, ignore_errors=True)


def test_400_stale_entries_are_all_in_the_output(many: tuple[Demo, list[str]]):
    demo, entries = many
    cache = str(demo.workdir / "cache")
    as_json = json.loads(demo.cacheaudit("scan", cache, "--json").stdout)
    assert as_json["counts"]["CA101"] == 400 and as_json["matched"] == 400
    assert {f["entry"] for f in as_json["findings"] if f["code"] == "CA101"} == set(entries)
    for output_format in ("concise", "markdown", "github", "sarif"):
        shown = demo.cacheaudit("scan", cache, "--output-format", output_format).stdout
        assert not _paths_whole(shown, entries), output_format
    verbose = demo.cacheaudit("scan", cache, "--verbose").stdout
    assert not _paths_whole(verbose, entries)
    assert verbose.count(": CA101 error") == 1  # one block: the 400 findings are identical
    # Without --verbose: ten of them, and how many more and where.
    default = demo.cacheaudit("scan", cache).stdout
    assert f"and 390 more in {demo.entry.parent} (--verbose lists every one)" in \
        " ".join(default.split())
    [verdict] = [line for line in default.splitlines() if line.startswith("cacheaudit: ")]
    assert re.match(r"cacheaudit: \d+ errors, \d+ warnings: 400 CA101, ", verdict), verdict


@pytest.mark.parametrize("columns", WIDTHS)
def test_400_stale_entries_golden(many: tuple[Demo, list[str]], columns: int):
    demo, _entries = many
    done = demo.cacheaudit("scan", str(demo.workdir / "cache"), columns=columns)
    check_golden(f"scan-400-full-{columns}", normalise(done.stdout, demo))


# ------------------------------------------------------------------------------ a terminal


TMUX = shutil.which("tmux")


@pytest.mark.skipif(TMUX is None, reason="tmux is not installed")
@pytest.mark.parametrize("command", ("scan", "explain"))
def test_under_tmux_at_80_columns_no_path_is_broken(demo: Demo, command: str):
    """A real terminal 80 columns wide (rich asks it for its size): every path the findings
    name, and the entry's, is on one screen line whole."""
    assert len(str(demo.entry)) < 80 - 6, "the temporary directory is too long for the check"
    # A private server whose socket lives (and is removed) with the demo's directory.
    socket = str(demo.workdir / f"tmux-{uuid.uuid4().hex[:8]}")
    target = str(demo.entry) if command == "explain" else str(demo.workdir / "cache")
    env = " ".join(f"{name}={shlex.quote(value)}" for name, value in demo.env.items()
                   if name not in ("TMUX", "TERM"))
    shell = (f"env -i {env} TERM=xterm-256color {shlex.quote(sys.executable)} -m cacheaudit "
             f"{command} {shlex.quote(target)}; "
             f"tmux -S {shlex.quote(socket)} wait-for -S finished; sleep 60")
    base = [TMUX, "-S", socket, "-f", os.devnull]
    try:
        subprocess.run([*base, "new-session", "-d", "-x", "80", "-y", "50", "-s", "ca", shell],
                       check=True, timeout=30)
        subprocess.run([*base, "wait-for", "finished"], check=True, timeout=120)
        time.sleep(0.2)
        screen = subprocess.run([*base, "capture-pane", "-p", "-S", "-", "-t", "ca"],
                                check=True, capture_output=True, text=True, timeout=30).stdout
    finally:
        subprocess.run([*base, "kill-server"], capture_output=True, timeout=30)
        with contextlib.suppress(FileNotFoundError):
            os.unlink(socket)
    as_json = json.loads(demo.cacheaudit("scan", str(demo.workdir / "cache"), "--json").stdout)
    paths = {str(demo.entry)} | {f["subject"] for f in as_json["findings"]
                                 if f["subject"].startswith("/")}
    assert "CA101 error" in screen, screen
    assert not _paths_whole(screen, sorted(paths)), screen


def test_a_name_that_is_not_utf8_is_shown_escaped_in_every_format():
    """Entry and file names are bytes: one that is not UTF-8 (held as surrogates) must not fail
    an output that is UTF-8 and strict; it is shown as `\\xff`, and SARIF's URI keeps the byte
    percent-encoded."""
    import io

    from rich.console import Console

    from cacheaudit.model import Finding
    from cacheaudit.render import View, render

    header, entry = os.fsdecode(b"/src/x\xff/k.h"), os.fsdecode(b"/cache/e\xfe")
    finding = Finding("CA101", header, "changed", entry=entry, recorded="a", current="b",
                      how="hash", hint=f"evict the entry ({entry})")
    for output_format in ("full", "concise", "markdown", "github", "sarif"):
        buffer = io.BytesIO()
        stream = io.TextIOWrapper(buffer, encoding="utf-8", errors="strict")
        render([finding], ["scanned"], View(format=output_format),
               Console(file=stream, color_system=None, soft_wrap=True))
        stream.flush()
        shown = buffer.getvalue().decode("utf-8")
        if output_format == "sarif":
            [result] = json.loads(shown)["runs"][0]["results"]
            uri = result["locations"][0]["physicalLocation"]["artifactLocation"]["uri"]
            assert uri == "file:///src/x%FF/k.h" and result["properties"]["entry"] == (
                "/cache/e\\xfe")
            continue
        assert "/src/x\\xff/k.h" in shown and "/cache/e\\xfe" in shown, output_format


# ------------------------------------------------------------------------------ evict, stats


def _sized(text: str) -> str:
    """Byte counts depend on this machine's compiler (the binary's size): placeholders."""
    return re.sub(r"\b\d+ bytes?\b", "<n> bytes", text)


def _next_request(demo: Demo) -> tuple[str, str]:
    """The demo's request once more, in a new runtime process: its event and binary digest."""
    job = demo.workdir / "job.py"
    job.write_text(JOB)
    done = subprocess.run([sys.executable, str(job), str(demo.workdir)], capture_output=True,
                          text=True, env=demo.env, cwd=demo.workdir, timeout=300, check=True)
    event, digest = done.stdout.split()
    return event, digest


@pytest.fixture
def own_demo() -> Iterator[Demo]:
    """A demo of its own, for a test that changes its cache."""
    workdir = Path(_short_tmp())
    try:
        yield _make_demo(workdir)
    finally:
        shutil.rmtree(workdir, ignore_errors=True)


@pytest.mark.parametrize("columns", WIDTHS)
def test_evict_dry_run_golden(demo: Demo, columns: int):
    before = sorted(p.name for p in demo.entry.iterdir())
    done = demo.cacheaudit("evict", str(demo.workdir / "cache"), "--dry-run", columns=columns)
    assert done.returncode == ExitCode.CLEAN, done.stdout + done.stderr
    header = demo.workdir / "third_party" / "cutlite" / "tile.h"
    # The entry the demo's ground truth calls stale (served != fresh) is the one chosen, for the
    # header whose edit the key missed, each path whole on a line.
    assert " ".join(done.stdout.split()).startswith(
        f"{demo.entry}: would evict (CA101 error)"), done.stdout
    assert f"finding CA101 {header}" in " ".join(done.stdout.split())
    assert not _paths_whole(done.stdout, [str(demo.entry), str(header)])
    assert max(len(line) for line in done.stdout.splitlines()) <= columns, done.stdout
    assert done.stdout.rstrip().splitlines()[-1].startswith("would evict 1 of 1 entry in 1 root")
    assert sorted(p.name for p in demo.entry.iterdir()) == before, "a dry run changed the entry"
    check_golden(f"evict-dry-run-{columns}", _sized(normalise(done.stdout, demo)))


@pytest.mark.parametrize("columns", WIDTHS)
def test_evict_golden(own_demo: Demo, columns: int):
    demo = own_demo
    done = demo.cacheaudit("evict", str(demo.workdir / "cache"), columns=columns)
    assert done.returncode == ExitCode.CLEAN, done.stdout + done.stderr
    assert " ".join(done.stdout.split()).startswith(
        f"{demo.entry}: evicted (CA101 error)"), done.stdout
    assert not _paths_whole(done.stdout, [str(demo.entry)])
    assert max(len(line) for line in done.stdout.splitlines()) <= columns, done.stdout
    assert not demo.entry.exists()
    # Ground truth: the next request compiles, and gets what a fresh compile gives.
    assert _next_request(demo) == ("compile", demo.fresh) and demo.fresh != demo.served
    check_golden(f"evict-full-{columns}", _sized(normalise(done.stdout, demo)))


@pytest.mark.parametrize("columns", WIDTHS)
def test_stats_golden(demo: Demo, columns: int):
    done = demo.cacheaudit("stats", str(demo.workdir / "cache"), columns=columns)
    assert done.returncode == 0, done.stdout + done.stderr
    cache = demo.workdir / "cache"
    assert done.stdout.startswith(f"{cache}: deepjit"), done.stdout
    words = " ".join(done.stdout.split())
    # The demo's one entry, stale by its ground truth (served != fresh), built by its one
    # recorded compile; its two disk hits ran in processes nothing recorded, so the runtime's
    # hit marker (touched after the build) is what counts one of them.
    assert demo.served != demo.fresh and demo.events == ("compile", "disk-hit", "disk-hit")
    assert "entries 1, " in words and "compiles 1 " in words and "stale 1, " in words, words
    assert "hits 1 from disk (1 seen by a hit marker), 0 in memory" in words, words
    assert "hit rate 50.0%" in words, words
    assert not _paths_whole(done.stdout, [str(cache)])
    assert max(len(line) for line in done.stdout.splitlines()) <= columns, done.stdout
    check_golden(f"stats-full-{columns}", _sized(normalise(done.stdout, demo)))
