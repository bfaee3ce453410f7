"""JSON as a contract (docs/json.md): every command that prints JSON, run for real, gives one
envelope and validates against the schema shipped in the package; a path that is not UTF-8
survives the round trip by the documented rule.

The caches are built by the reference runtime (fixtures/minijit, DeepJIT's semantics) through
the compiler shim, as in the truth table; staleness is the truth table's ground truth (the
binary served against a fresh compile into an empty cache).
"""

from __future__ import annotations

import base64
import json
import os
import sqlite3
import subprocess
import sys
from pathlib import Path
from typing import Any

import jsonschema
import pytest
from hypothesis import given
from hypothesis import strategies as st

from cacheaudit import contract
from cacheaudit.exceptions import ExitCode
from cacheaudit.model import content_digest

from support import valid_document
from truth_table import SOURCE, Project, _write

DETAIL_H = ("third", "cutlite", "detail.h")


def _run(env: dict[str, str], *args: str, cwd: Path) -> subprocess.CompletedProcess[bytes]:
    """`cacheaudit ARGS` as a user runs it; the output as bytes, so that its encoding is
    checked here and not papered over by a decoder."""
    return subprocess.run([sys.executable, "-m", "cacheaudit", *args], capture_output=True,
                          env=env, cwd=cwd, timeout=600)


@pytest.fixture
def project(tmp_path: Path) -> Project:
    project = Project(tmp_path / "p", "gxx")
    project.setup()
    return project


def _stale(project: Project) -> tuple[dict[str, Any], str | None]:
    """Build, edit an untracked header, ask again: (the hit, a fresh compile's digest)."""
    project.once()
    _write(project.root.joinpath(*DETAIL_H), "#pragma once\n#define DETAIL 4\n")
    served = project.once()
    return served, project.fresh()


def test_every_json_command_prints_one_enveloped_document_that_validates(
        project: Project, tmp_path: Path):
    served, fresh = _stale(project)
    assert served["event"] == "disk-hit" and served["digest"] != fresh  # stale: ground truth
    env, cwd = project.env, project.root
    ledger = ("--ledger", str(project.ledger))

    scanned = valid_document(_run(env, "scan", str(project.cache), "--json", "--fail-on",
                                  "never", *ledger, cwd=cwd).stdout, "scan")
    header = str(project.root.joinpath(*DETAIL_H))
    [stale] = [f for f in scanned["findings"] if f["code"] == "CA101"]
    assert (stale["subject"], stale["entry"]) == (header, served["path"])
    recorded, current = stale["evidence"]["recorded"], stale["evidence"]["current"]
    assert recorded["path"] == current["path"] == header
    assert current["digest"] == {"algorithm": "xxh3-128",
                                 "value": content_digest(Path(header).read_bytes())}
    assert (current["bytes"], current["mtime_ns"]) == (Path(header).stat().st_size,
                                                       Path(header).stat().st_mtime_ns)
    assert recorded["digest"]["value"] != current["digest"]["value"]
    assert scanned["severity_counts"]["error"] == sum(
        1 for f in scanned["findings"] if f["severity"] == "error") >= 1
    assert scanned["totals"] == {"roots": 1, "entries": 1, "matched": 1, "reconstructed": 0,
                                 "unverified": 0, "findings": len(scanned["findings"])}

    records = valid_document(_run(env, "report", "--json", "--graph", *ledger, cwd=cwd).stdout,
                             "records")
    assert {r["event"] for r in records["records"]} >= {"compile", "disk-hit"}
    conn = sqlite3.connect(project.ledger)
    try:
        recorded = conn.execute("SELECT count(*) FROM records").fetchone()[0]
    finally:
        conn.close()
    assert recorded >= 2 and records["total"] == len(records["records"]) == recorded
    cut = valid_document(_run(env, "report", "--json", "--limit", "1", *ledger, cwd=cwd).stdout,
                         "records")
    assert len(cut["records"]) == 1 and cut["total"] == recorded, \
        f"report --limit 1 of {recorded} records in {project.ledger} does not say how many"
    assert cut["records"][0]["record_id"] == records["records"][-1]["record_id"]  # newest
    explained = valid_document(_run(env, "explain", served["path"], "--json", *ledger,
                                    cwd=cwd).stdout, "explanation")
    assert explained["entry"]["path"] == served["path"]

    plan = valid_document(_run(env, "verify", served["path"], "--dry-run", "--json", *ledger,
                               cwd=cwd).stdout, "verify-plan")
    assert [c["entry"] for c in plan["commands"]] == [served["path"]]
    verified = valid_document(_run(env, "verify", served["path"], "--json", "--fail-on",
                                   "never", *ledger, cwd=cwd).stdout, "verify")
    assert [v["outcome"] for v in verified["verdicts"]] == ["stale"]
    assert verified["outcomes"] == {"stale": 1}

    report = tmp_path / "run.json"
    done = _run(env, "run", "--report-json", str(report), *ledger, "--", sys.executable, "-c",
                "pass", cwd=cwd)
    assert done.returncode == 0, done.stderr
    ran = valid_document(report.read_bytes(), "run")
    assert ran["argv"] == [sys.executable, "-c", "pass"] and ran["exit_status"] == 0

    before = _run(env, "snapshot", "--json", "--timeout", "10", *ledger, cwd=cwd).stdout
    taken = valid_document(before, "snapshot")
    assert taken["ledger"]["status"] == "ok"
    (tmp_path / "before.json").write_bytes(before)
    after = _run(dict(env, NVCC_APPEND_FLAGS="-DX=1"), "snapshot", "--json", "--timeout", "10",
                 *ledger, cwd=cwd).stdout
    (tmp_path / "after.json").write_bytes(after)
    differences = valid_document(_run(env, "diff", str(tmp_path / "before.json"),
                                      str(tmp_path / "after.json"), "--json", cwd=cwd).stdout,
                                 "snapshot-diff")
    assert ("NVCC_APPEND_FLAGS", "") in {(r["item"], r["field"]) for r in
                                         differences["groups"]["environment"]}


def test_demo_json_keep_prints_the_document_alone_and_the_hint_on_stderr(tmp_path: Path):
    home = tmp_path / "home"
    home.mkdir()
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("CACHEAUDIT", "NVCC_", "DG_", "PYTEST_"))}
    env.update(HOME=str(home), CACHEAUDIT_LEDGER=str(tmp_path / "mine.db"),
               TMPDIR=str(tmp_path))
    done = _run(env, "demo", "--json", "--keep", "--compiler", "g++", cwd=tmp_path)
    assert done.returncode == ExitCode.CLEAN, done.stderr
    demo = valid_document(done.stdout, "demo")
    assert os.path.isdir(demo["workdir"])
    assert f"kept {demo['workdir']}:" in done.stderr.decode()  # whole, on stderr
    # The demo's own ground truth: the hit after the edit served the first binary, and a
    # fresh compile gives other bytes; the scan names the edited header.
    first, edited = demo["steps"][0], demo["steps"][1]
    assert edited["binary"] == first["binary"] != edited["fresh"] and edited["stale"] is True
    stale = [f for f in demo["findings"] if f["code"] == "CA101"]
    assert [os.path.basename(f["subject"]) for f in stale] == ["tile.h"]
    assert demo["severity_counts"]["error"] == demo["counts"]["CA101"] + demo["counts"].get(
        "CA202", 0)


# ------------------------------------------------------------------------------ paths


def _moved_out_of_utf8(project: Project) -> tuple[bytes, str]:
    """The cache root renamed to a name that is not UTF-8 (the runtime uses it from then on):
    (its bytes, the same as a surrogate-escaped str)."""
    moved = os.fsencode(project.root) + b"/cache-\xff\xfe"
    os.rename(os.fsencode(project.cache), moved)
    return moved, os.fsdecode(moved)


def test_a_stale_entry_under_a_name_that_is_not_utf8_is_valid_json_and_its_path_recovered(
        project: Project):
    project.once()
    moved, cache = _moved_out_of_utf8(project)
    scan = ("scan", cache, "--json", "--fail-on", "never", "--no-progress", "--ledger",
            str(project.ledger))
    valid_document(_run(project.env, *scan, cwd=project.root).stdout, "scan")  # as built
    _write(project.root.joinpath(*DETAIL_H), "#pragma once\n#define DETAIL 4\n")
    served = project.once(DG_JIT_CACHE_DIR=cache)
    assert served["event"] == "disk-hit"
    fresh = project.fresh()
    assert served["digest"] != fresh  # a stale hit: the ground truth
    entry_bytes = os.fsencode(served["path"])
    assert entry_bytes.startswith(moved + b"/cache/") and os.path.isdir(entry_bytes)

    scanned = valid_document(_run(project.env, *scan, cwd=project.root).stdout, "scan")
    header = str(project.root.joinpath(*DETAIL_H))
    stale = [f for f in scanned["findings"] if f["code"] == "CA101" and f["subject"] == header]
    assert len(stale) == 1, scanned["findings"]
    finding = stale[0]
    # Readable as valid UTF-8, exact by the rule: the bytes companion gives the real path.
    assert "\ufffd" in finding["entry"]
    assert base64.b64decode(finding["entry_bytes"]) == entry_bytes
    assert os.fsencode(contract.recover(finding, "entry")) == entry_bytes
    assert os.path.exists(os.fsencode(contract.recover(finding, "entry")))
    [root] = scanned["roots"]
    assert os.fsencode(contract.recover(root, "root")) == moved

    records = valid_document(_run(project.env, "report", "--json", "--ledger",
                                  str(project.ledger), cwd=project.root).stdout, "records")
    hits = [r for r in records["records"] if r["event"] == "disk-hit"]
    assert [os.fsencode(contract.recover(r, "entry")) for r in hits] == [entry_bytes]

    ledger = ("--ledger", str(project.ledger))
    plan = valid_document(_run(project.env, "evict", cache, "--dry-run", "--json", "--no-progress",
                               *ledger, cwd=project.root).stdout, "evict")
    [would] = plan["outcomes"]
    assert os.fsencode(contract.recover(would, "entry")) == entry_bytes, would
    assert os.fsencode(contract.recover(would, "root")) == moved, would
    assert [os.fsencode(contract.recover(would, "paths", i))
            for i in range(len(would["paths"]))] == [entry_bytes], would
    assert os.fsencode(contract.recover(plan["roots"][0], "root")) == moved
    tallied = valid_document(_run(project.env, "stats", cache, "--json", "--no-progress",
                                  *ledger, cwd=project.root).stdout, "stats")
    [row] = [t for t in tallied["tallies"] if t["entries"]]
    assert os.fsencode(contract.recover(row, "root")) == moved and row["stale"] == 1, row

    done = _run(project.env, "evict", cache, "--json", "--no-progress", *ledger,
                cwd=project.root)
    evicted = valid_document(done.stdout, "evict")
    assert done.returncode == ExitCode.CLEAN, done.stderr
    assert [(os.fsencode(contract.recover(o, "entry")), o["status"])
            for o in evicted["outcomes"]] == [(entry_bytes, "evicted")]
    assert not os.path.lexists(entry_bytes), f"{entry_bytes!r} is still there"
    after = project.once(DG_JIT_CACHE_DIR=cache)
    assert (after["event"], after["digest"]) == ("compile", fresh), after


def test_an_entry_directory_renamed_to_a_name_that_is_not_utf8_is_named_exactly(
        project: Project):
    project.once()  # an entry of the runtime stays: the root is still DeepJIT's
    built = project.once(SOURCE.replace("void gemm", "void gemm2"))
    entry = os.fsencode(built["path"])
    renamed = entry[:entry.rindex(b"/") + 1] + b"gemm\xff." + entry.rsplit(b".", 1)[1]
    os.rename(entry, renamed)
    scanned = valid_document(_run(project.env, "scan", str(project.cache), "--json",
                                  "--fail-on", "never", "--no-progress", cwd=project.root
                                  ).stdout, "scan")
    # DeepJIT's tags are [A-Za-z0-9_]+: the directory is no entry of the runtime any more, and
    # the scan says what it is, by its exact name.
    named = [f for f in scanned["findings"] if f["code"] == "CA402"
             and os.fsencode(contract.recover(f, "subject")) == renamed]
    assert len(named) == 1, scanned["findings"]
    assert os.path.isdir(os.fsencode(contract.recover(named[0], "subject")))


# ------------------------------------------------------------------------------ the rule


@given(st.binary(min_size=1, max_size=40).filter(lambda b: b"\0" not in b),
       st.lists(st.binary(max_size=12), max_size=4))
def test_the_path_rule_round_trips_any_bytes(path: bytes, paths: list[bytes]):
    text = contract.dumps({"path": os.fsdecode(path), "paths": [os.fsdecode(p) for p in paths],
                           "nested": {"path": os.fsdecode(path)}})
    text.encode("utf-8")  # always valid UTF-8
    back = json.loads(text)
    assert os.fsencode(contract.recover(back, "path")) == path
    assert os.fsencode(contract.recover(back["nested"], "path")) == path
    assert [os.fsencode(contract.recover(back, "paths", i)) for i in range(len(paths))] == paths
    try:
        path.decode("utf-8")
    except UnicodeDecodeError:
        assert "path_bytes" in back
    else:
        assert "path_bytes" not in back and back["path"] == path.decode("utf-8")


def test_the_envelope_is_one_shape_and_refuses_payload_members_of_its_own():
    document = contract.document("scan", "scan", {"findings": []}, generated_ns=1)
    assert document == {"format": "cacheaudit/scan", "version": 1,
                        "tool": {"name": "cacheaudit", "version": document["tool"]["version"]},
                        "command": "scan", "generated": "1970-01-01T00:00:00.000000001Z",
                        "findings": []}
    with pytest.raises(ValueError, match="envelope"):
        contract.document("scan", "scan", {"version": 2})


def test_diff_reads_a_snapshot_from_before_the_envelope_and_refuses_a_newer_version(
        project: Project, tmp_path: Path):
    now = _run(project.env, "snapshot", "--json", "--timeout", "10", cwd=project.root).stdout
    (tmp_path / "now.json").write_bytes(now)
    legacy = {k: v for k, v in json.loads(now).items() if k not in contract.ENVELOPE_KEYS}
    legacy["format"] = 1  # what `snapshot --json` wrote before the envelope
    (tmp_path / "legacy.json").write_text(json.dumps(legacy))
    done = _run(project.env, "diff", str(tmp_path / "legacy.json"), str(tmp_path / "now.json"),
                "--json", cwd=project.root)
    assert done.returncode == 0, done.stderr
    assert all(rows == [] for rows in valid_document(done.stdout,
                                                     "snapshot-diff")["groups"].values())
    newer = dict(json.loads(now), version=contract.VERSIONS["snapshot"] + 1)
    (tmp_path / "newer.json").write_text(json.dumps(newer))
    refused = _run(project.env, "diff", str(tmp_path / "newer.json"), str(tmp_path / "now.json"),
                   cwd=project.root)
    assert refused.returncode == ExitCode.USAGE
    assert b"taken by a newer cacheaudit" in refused.stderr


def test_the_schema_is_package_data_and_a_valid_draft_2020_12_schema():
    """The schema is package data under cacheaudit/ (hatch's wheel takes the package directory
    whole), read through importlib.resources as an installed package would."""
    from importlib import resources

    shipped = resources.files("cacheaudit").joinpath("schema").joinpath(
        contract.SCHEMA_RESOURCE)
    assert json.loads(shipped.read_text("utf-8")) == contract.schema()
    jsonschema.Draft202012Validator.check_schema(contract.schema())
    kinds = {entry["if"]["properties"]["format"]["const"] for entry in contract.schema()["allOf"]}
    assert kinds == {contract.format_name(kind) for kind in contract.VERSIONS}
