"""`cacheaudit diff A B` over runs and ledgers: real compiles through the real shim (nvcc where
it is on PATH, g++ otherwise), the ground truth each binary's digest read from disk right after
its compile, and every verdict naming its subject (the kernel, the variable, the header)."""

from __future__ import annotations

import sqlite3
from pathlib import Path

import pytest

from cacheaudit.exceptions import ExitCode
from cacheaudit.model import content_digest

from diff_support import Job, by_kernel, cacheaudit, diff_json
from support import ShimEnv, needs_gxx, needs_nvcc, valid_document


@needs_nvcc
def test_append_flags_on_one_kernel_is_named_as_the_first_difference(
        shim_env: ShimEnv, tmp_path: Path):
    job = Job(tmp_path / "job", "nvcc")
    job.setup()
    good = job.run(shim_env, "job-good")
    bad = job.run(shim_env, "job-bad", env_for={"k2": {"NVCC_APPEND_FLAGS": "-DX=1"}})
    # Ground truth: the flag changed k2's binary on disk, and only k2's.
    assert good["k2"] != bad["k2"]
    assert (good["k1"], good["k3"]) == (bad["k1"], bad["k3"])

    status, document = diff_json(shim_env.env, "job-good", "job-bad", "--ledger",
                                 str(shim_env.ledger), cwd=tmp_path)
    assert status == ExitCode.FINDINGS
    first = document["first_differing"]
    assert first["kernel"] == "k2", f"first differing kernel: {first['kernel']}"
    assert first["environment"] == [{"subject": "NVCC_APPEND_FLAGS", "a": None, "b": "-DX=1"}]
    assert first["options"] == [{"change": "added", "token": "-DX=1",
                                 "origin": "env:NVCC_APPEND_FLAGS"}]
    assert first["binary"] == [{"subject": "binary", "a": good["k2"], "b": bad["k2"]}]
    assert (first["a"]["binaries"], first["b"]["binaries"]) == ([good["k2"]], [bad["k2"]])
    assert first["compiler"] == first["inputs"] == []
    assert list(by_kernel(document)) == ["k2"], "k1 and k3 must be identical"
    assert document["totals"] == {"uses_a": 3, "uses_b": 3, "matched": 3, "identical": 2,
                                  "differing": 1, "only_a": 0, "only_b": 0}

    table = cacheaudit(shim_env.env, "diff", "job-good", "job-bad", "--ledger",
                       str(shim_env.ledger), cwd=tmp_path)
    assert table.returncode == ExitCode.FINDINGS, table.stderr
    text = table.stdout.decode()
    assert "first kernel whose binary or inputs differ: k2" in text
    assert "NVCC_APPEND_FLAGS  (unset)" in text and "-DX=1" in text
    assert good["k2"] in text and bad["k2"] in text
    assert "k1" not in text and "k3" not in text
    concise = cacheaudit(shim_env.env, "diff", "job-good", "job-bad", "--format", "concise",
                         "--ledger", str(shim_env.ledger), cwd=tmp_path).stdout.decode()
    assert concise.splitlines()[0].startswith(
        "k2: options, environment, binary: NVCC_APPEND_FLAGS: (unset) -> -DX=1")
    markdown = cacheaudit(shim_env.env, "diff", "job-good", "job-bad", "--format", "markdown",
                          "--ledger", str(shim_env.ledger), cwd=tmp_path).stdout.decode()
    assert "| environment | `NVCC_APPEND_FLAGS` | `(unset)` | `-DX=1` |" in markdown
    assert f"| binary | `digest` | `{good['k2']}` | `{bad['k2']}` |" in markdown


@needs_gxx
def test_identical_runs_in_two_ledgers_exit_zero_and_list_nothing(
        shim_env: ShimEnv, tmp_path: Path):
    job = Job(tmp_path / "job", "g++")
    job.setup()
    first, second = tmp_path / "first.db", tmp_path / "second.db"
    assert job.run(shim_env, "job-1", ledger=first) == job.run(shim_env, "job-2",
                                                                ledger=second)
    status, document = diff_json(shim_env.env, str(first), str(second), cwd=tmp_path)
    assert status == ExitCode.CLEAN
    assert document["same"] is True and document["first_differing"] is None
    assert document["kernels"] == document["only"] == []
    assert document["totals"]["identical"] == 3
    table = cacheaudit(shim_env.env, "diff", str(first), str(second), cwd=tmp_path)
    assert table.returncode == ExitCode.CLEAN
    assert table.stdout.decode().splitlines()[-1] == "no differences"


@needs_gxx
def test_changed_header_added_kernel_and_the_order_of_use(shim_env: ShimEnv, tmp_path: Path):
    """B changes k3's own header, then k2's options (argv, not the environment), and adds k4:
    the first difference in the order of use is k2, k3's header is named with both digests,
    k4 is on B's side only."""
    job = Job(tmp_path / "job", "g++")
    job.setup()
    header = job.root / "inc" / "own_k3.h"
    before_header = content_digest(header.read_bytes())
    good = job.run(shim_env, "job-1")
    job.add_kernel("k3", own_value=5)
    job.add_kernel("k4")
    after_header = content_digest(header.read_bytes())
    argv = job.argv
    job.argv = lambda name: argv(name) + (["-DX=2"] if name == "k2" else [])  # type: ignore[method-assign]
    bad = job.run(shim_env, "job-2", kernels=("k1", "k2", "k3", "k4"))
    assert good["k2"] != bad["k2"] and good["k3"] != bad["k3"] and good["k1"] == bad["k1"]

    status, document = diff_json(shim_env.env, "job-1", "job-2", cwd=tmp_path)
    assert status == ExitCode.FINDINGS
    assert document["first_differing"]["kernel"] == "k2"
    kernels = by_kernel(document)
    assert list(kernels) == ["k2", "k3"]
    assert kernels["k2"]["options"] == [{"change": "added", "token": "-DX=2", "origin": "argv"}]
    assert kernels["k2"]["environment"] == []
    assert kernels["k3"]["inputs"] == [{"change": "changed", "path": str(header),
                                        "a": before_header, "b": after_header}]
    assert kernels["k3"]["binary"] == [{"subject": "binary", "a": good["k3"], "b": bad["k3"]}]
    assert [(o["side"], o["kernel"], o["binaries"]) for o in document["only"]] == [
        ("b", "k4", [bad["k4"]])]


@needs_gxx
def test_a_kernel_whose_key_changed_is_matched_by_name(shim_env: ShimEnv, tmp_path: Path):
    """Records that carry keys (as a runtime's adapter writes them): the same kernel under two
    keys is matched by runtime and kernel, and the key is named as what differs."""
    job = Job(tmp_path / "job", "g++")
    job.setup()
    job.run(shim_env, "job-1", kernels=("k1",))
    job.run(shim_env, "job-2", kernels=("k1",))
    conn = sqlite3.connect(shim_env.ledger)
    with conn:
        for run, key in (("job-1", "key-aaaa"), ("job-2", "key-bbbb")):
            conn.execute("UPDATE records SET runtime = 'toyjit', key = ? WHERE run_id ="
                         " (SELECT id FROM runs WHERE run_uuid = ?)", (key, run))
    conn.close()
    status, document = diff_json(shim_env.env, "job-1", "job-2", cwd=tmp_path)
    assert status == ExitCode.FINDINGS
    [kernel] = document["kernels"]
    assert (kernel["kernel"], kernel["matched_by"]) == ("k1", "kernel")
    assert kernel["key"] == [{"subject": "key", "a": "key-aaaa", "b": "key-bbbb"}]
    assert document["only"] == []


@needs_gxx
@pytest.mark.parametrize(("given", "expected"), [
    (("job-1", "no-such-run"), "no run 'no-such-run' in "),
    (("job-1", "$TMP/snapshot.json"), "diff compares a snapshot with a snapshot, not with job-1"),
    (("job-1", "$TMP/missing.db"), "missing.db: no such ledger file"),
    (("job-", "job-1"), "run id 'job-' is ambiguous in "),
])
def test_bad_arguments_are_one_line_and_exit_2(shim_env: ShimEnv, tmp_path: Path,
                                               given: tuple[str, str], expected: str):
    job = Job(tmp_path / "job", "g++")
    job.setup()
    job.run(shim_env, "job-1", kernels=("k1",))
    job.run(shim_env, "job-2", kernels=("k1",))
    snapshot = cacheaudit(shim_env.env, "snapshot", "--json", "--timeout", "10", cwd=tmp_path)
    (tmp_path / "snapshot.json").write_bytes(valid_document(snapshot.stdout, "snapshot") and
                                             snapshot.stdout)
    args = [a.replace("$TMP", str(tmp_path)) for a in given]
    done = cacheaudit(shim_env.env, "diff", *args, cwd=tmp_path)
    assert done.returncode == ExitCode.USAGE, done.stderr
    assert len(done.stderr.decode().splitlines()) == 1 and expected in done.stderr.decode()
    assert done.stdout == b""
