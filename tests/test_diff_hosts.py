"""`cacheaudit diff --by-host` over a combined ledger: three "hosts", each a real UTS namespace
with its own host name (`unshare --uts`), each recording the same job through the real shim
into its own ledger, then `cacheaudit combine`d. One host builds one kernel with another
compiler: behind nvcc (NVCC_CCBIN naming a directory whose gcc is the g++ driver), or g++
itself resolving to another binary (a PATH directory whose g++ is the gcc driver). The ground
truth of each compiler identity is the real binary behind it, read from disk."""

from __future__ import annotations

import functools
import os
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest

from cacheaudit.exceptions import ExitCode
from cacheaudit.model import content_digest

from diff_support import Job, cacheaudit, diff_json
from support import GXX, NVCC, ShimEnv, needs_gxx, needs_nvcc

HOSTS = ("node-a", "node-b", "node-c")
ODD = "node-b"


@functools.cache
def _uts_namespaces() -> bool:
    try:
        done = subprocess.run(["unshare", "--uts", "--map-root-user", "sh", "-c",
                               "hostname probe-host && hostname"], capture_output=True,
                              timeout=30)
    except (OSError, subprocess.TimeoutExpired):
        return False
    return done.returncode == 0 and done.stdout.strip() == b"probe-host"


needs_hosts = pytest.mark.skipif(not _uts_namespaces(),
                                 reason="no unprivileged UTS namespaces: cannot name hosts")


def as_host(name: str) -> list[str]:
    """The prefix that runs a command on a machine called `name`, as far as
    `socket.gethostname()` can tell."""
    return ["unshare", "--uts", "--map-root-user", "sh", "-c", 'hostname "$0" && exec "$@"',
            name]


def _fleet(shim: ShimEnv, tmp_path: Path, compiler: str, odd_env: dict[str, str]
           ) -> tuple[Job, Path, dict[str, dict[str, str]]]:
    """The job run on each host into the host's own ledger (`tmp_path/hosts/<host>.db`, kept),
    and those ledgers combined into `tmp_path/combined.db`."""
    job = Job(tmp_path / "job", compiler)
    job.setup()
    digests = {}
    ledgers = []
    (tmp_path / "hosts").mkdir()
    for host in HOSTS:
        ledger = tmp_path / "hosts" / f"{host}.db"
        env_for = {"k2": odd_env} if host == ODD else {}
        digests[host] = job.run(shim, f"{host}-job", ledger=ledger, env_for=env_for,
                                prefix=as_host(host))
        ledgers.append(str(ledger))
    combined = tmp_path / "combined.db"
    done = cacheaudit(shim.env, "combine", *ledgers, "--ledger", str(combined), "--keep",
                      cwd=tmp_path)
    assert done.returncode == 0, done.stderr.decode()
    return job, combined, digests


def _odd_kernel(document: dict[str, Any]) -> dict[str, Any]:
    assert document["hosts"] == list(HOSTS)
    assert [k["kernel"] for k in document["kernels"]] == ["k2"], \
        "k1 and k3 are built alike on every host"
    [kernel] = document["kernels"]
    assert [g["hosts"] for g in kernel["groups"]] == [["node-a", "node-c"], [ODD]]
    assert kernel["odd_hosts"] == [ODD]
    assert document["odd_hosts"] == [{"host": ODD, "kernels": 1}]
    [odd] = kernel["odd"]
    assert (odd["a"]["host"], odd["b"]["host"]) == ("node-a", ODD)
    return kernel


def _same_in_place(env: dict[str, str], tmp_path: Path, combined_document: dict[str, Any],
                   *arguments: str) -> None:
    """The hosts' own ledgers, read in place (no combine), give the combined ledger's answer:
    the same hosts, kernels, groups, odd ones out and explanations; only the ledgers differ."""
    status, document = diff_json(env, "--by-host", *arguments, cwd=tmp_path, kind="host-diff")
    assert status == (ExitCode.CLEAN if combined_document["same"] else ExitCode.FINDINGS)
    assert document["ledgers"] == [str(tmp_path / "hosts" / f"{h}.db") for h in HOSTS]
    assert combined_document["ledgers"] == [str(tmp_path / "combined.db")]
    for field in ("same", "hosts", "totals", "odd_hosts", "kernels"):
        assert document[field] == combined_document[field], field


def _real(path: str) -> tuple[str, str]:
    real = os.path.realpath(path)
    return real, content_digest(Path(real).read_bytes())


@needs_hosts
@needs_nvcc
def test_one_host_with_another_host_compiler_behind_nvcc_is_the_odd_one_out(
        shim_env: ShimEnv, tmp_path: Path):
    other = tmp_path / "other-host-compiler"
    other.mkdir()
    (other / "gcc").symlink_to(os.path.realpath("/usr/bin/g++-12") if os.path.exists(
        "/usr/bin/g++-12") else os.path.realpath(str(GXX)))
    _job, combined, _digests = _fleet(shim_env, tmp_path, "nvcc", {"NVCC_CCBIN": str(other)})
    status, document = diff_json(shim_env.env, "--by-host", "--ledger", str(combined),
                                 cwd=tmp_path, kind="host-diff")
    assert status == ExitCode.FINDINGS
    kernel = _odd_kernel(document)
    assert "compiler" in kernel["parts"]
    [odd] = kernel["odd"]
    changes = {c["subject"]: (c["a"], c["b"]) for c in odd["compiler"]}
    # Ground truth: the real binaries behind each host compiler.
    usual_path, usual_digest = _real(str(shutil.which("gcc", path=shim_env.bare_env()["PATH"])))
    other_path, other_digest = _real(str(other / "gcc"))
    assert usual_digest != other_digest
    assert changes["host resolved"] == (usual_path, other_path)
    assert changes["host digest"] == (usual_digest, other_digest)
    assert changes["host path"][1] == str(other / "gcc")
    assert "path" not in changes and "digest" not in changes, "nvcc itself is the same"
    assert {"subject": "NVCC_CCBIN", "a": None, "b": str(other)} in odd["environment"]
    _same_in_place(shim_env.env, tmp_path, document, str(tmp_path / "hosts"))

    table = cacheaudit(shim_env.env, "diff", "--by-host", "--ledger", str(combined),
                       cwd=tmp_path)
    assert table.returncode == ExitCode.FINDINGS
    text = table.stdout.decode()
    assert "odd ones out: node-b (1 kernel)" in text
    assert "k2: " in text and "majority: node-a, node-c" in text and "odd: node-b" in text
    assert usual_digest in text and other_digest in text


@needs_hosts
@needs_gxx
def test_one_host_whose_gxx_is_another_binary_is_named_with_both_identities(
        shim_env: ShimEnv, tmp_path: Path):
    other = tmp_path / "other-bin"
    other.mkdir()
    gcc = os.path.realpath(str(shutil.which("gcc", path=shim_env.bare_env()["PATH"])))
    (other / "g++").symlink_to(gcc)
    rest = shim_env.env["PATH"].split(os.pathsep)[1:]
    path = os.pathsep.join([str(shim_env.bin), str(other), *rest])
    _job, combined, _digests = _fleet(shim_env, tmp_path, "g++", {"PATH": path})
    status, document = diff_json(shim_env.env, "--by-host", str(combined), cwd=tmp_path,
                                 kind="host-diff")
    assert status == ExitCode.FINDINGS
    kernel = _odd_kernel(document)
    assert kernel["parts"][0] == "compiler"
    [odd] = kernel["odd"]
    changes = {c["subject"]: (c["a"], c["b"]) for c in odd["compiler"]}
    usual_path, usual_digest = _real(str(GXX))
    assert changes["resolved"] == (usual_path, gcc)
    assert changes["digest"] == (usual_digest, content_digest(Path(gcc).read_bytes()))
    assert changes["path"][1] == str(other / "g++")
    _same_in_place(shim_env.env, tmp_path, document,
                   *(str(tmp_path / "hosts" / f"{h}.db") for h in HOSTS))
    concise = cacheaudit(shim_env.env, "diff", "--by-host", str(combined), "--format",
                         "concise", cwd=tmp_path).stdout.decode()
    assert concise.splitlines()[0].startswith(f"k2: compiler, environment: odd {ODD}: ")
    assert gcc in concise.splitlines()[0]
    markdown = cacheaudit(shim_env.env, "diff", "--by-host", str(combined), "--format",
                          "markdown", cwd=tmp_path).stdout.decode()
    assert f"| compiler | `resolved` | `{usual_path}` | `{gcc}` |" in markdown
    assert "- majority: node-a, node-c" in markdown and f"- odd: {ODD}" in markdown


@needs_hosts
@needs_gxx
def test_hosts_that_agree_exit_zero_and_list_nothing(shim_env: ShimEnv, tmp_path: Path):
    _job, combined, digests = _fleet(shim_env, tmp_path, "g++", {})
    assert digests["node-a"] == digests["node-b"] == digests["node-c"]
    status, document = diff_json(shim_env.env, "--by-host", "--ledger", str(combined),
                                 cwd=tmp_path, kind="host-diff")
    assert status == ExitCode.CLEAN
    assert document["same"] is True and document["kernels"] == []
    assert document["totals"] == {"hosts": 3, "kernels": 3, "compiles": 9, "differing": 0}
    _same_in_place(shim_env.env, tmp_path, document, str(tmp_path / "hosts"))
    table = cacheaudit(shim_env.env, "diff", "--by-host", str(combined), cwd=tmp_path)
    assert table.returncode == ExitCode.CLEAN
    assert table.stdout.decode().splitlines()[-1] == "no differences between hosts"


def test_by_host_refuses_what_is_not_a_ledger_and_a_missing_ledger(tmp_path: Path):
    env = {k: v for k, v in os.environ.items() if not k.startswith("CACHEAUDIT")}
    env["CACHEAUDIT_LEDGER"] = str(tmp_path / "none.db")
    (tmp_path / "empty").mkdir()
    not_ledger = cacheaudit(env, "diff", "--by-host", "a", "b", cwd=tmp_path)
    missing = cacheaudit(env, "diff", "--by-host", cwd=tmp_path)
    empty = cacheaudit(env, "diff", "--by-host", str(tmp_path / "empty"), cwd=tmp_path)
    for done, expected in ((not_ledger, "a: not a ledger"),
                           (missing, f"no ledger at {tmp_path / 'none.db'}"),
                           (empty, f"{tmp_path / 'empty'}: a directory with no ledger in it")):
        assert done.returncode == ExitCode.USAGE
        assert len(done.stderr.decode().splitlines()) == 1 and expected in done.stderr.decode()


@needs_hosts
@needs_gxx
def test_an_unreadable_host_ledger_is_named_and_never_reads_as_all_clear(
        shim_env: ShimEnv, tmp_path: Path):
    _job, _combined, _digests = _fleet(shim_env, tmp_path, "g++", {})
    damaged = tmp_path / "hosts" / "node-d.db"
    damaged.write_bytes(b"SQLite format 3\x00" + b"\xff" * 4000)
    status, document = diff_json(shim_env.env, "--by-host", str(tmp_path / "hosts"),
                                 cwd=tmp_path, kind="host-diff", exits=(ExitCode.USAGE,))
    # The three readable hosts agree; the fourth went uncompared, so the exit is not 0.
    assert status == ExitCode.USAGE
    assert document["hosts"] == list(HOSTS) and document["same"] is True
    assert [s.split(":")[0] for s in document["skipped"]] == [str(damaged)]
    done = cacheaudit(shim_env.env, "diff", "--by-host", str(tmp_path / "hosts"), cwd=tmp_path)
    assert done.returncode == ExitCode.USAGE
    hosts_dir = tmp_path / "hosts"
    assert done.stdout.decode().splitlines()[:2] == [
        f"ledgers: 3, {hosts_dir / 'node-a.db'} to {hosts_dir / 'node-c.db'}",
        f"not compared: {document['skipped'][0]}"]
    assert done.stderr.decode().splitlines() == [
        line for line in done.stderr.decode().splitlines() if str(damaged) in line]
    alone = cacheaudit(shim_env.env, "diff", "--by-host", str(damaged), cwd=tmp_path)
    assert alone.returncode == ExitCode.USAGE
    assert len(alone.stderr.decode().splitlines()) == 1
    assert f"no ledger could be read: {damaged}" in alone.stderr.decode()


__all__ = ["NVCC"]


def _three_hosts(directory: Path, kernel: str | None) -> None:
    """node-a, node-b and node-c built one kernel (named `kernel`, or unnamed); node-c's
    binary has other bytes."""
    import uuid

    from cacheaudit.ledger import Ledger, RunInfo
    from cacheaudit.model import CompileRecord, FileState

    for host, body in (("node-a", b"x"), ("node-b", b"x"), ("node-c", b"y")):
        record = CompileRecord(
            record_id=uuid.uuid4().hex, event="compile", started_ns=10**18, runtime="cuda.core",
            kernel=kernel, key="K1", exit_code=0, host=host,
            outputs=(FileState("/out/k.cubin", True, 1, 1, 1, 1, content_digest(body)),))
        with Ledger.open(str(directory / f"{host}.db")) as ledger:
            ledger.add_records([record], RunInfo(run_uuid=host, label="shim", host=host))


@pytest.mark.parametrize("kernel", [None, "k"], ids=["unnamed", "named"])
def test_an_odd_binary_is_named_for_an_unnamed_kernel_too(
        tmp_path: Path, kernel: str | None):
    fleet = tmp_path / "fleet"
    fleet.mkdir()
    _three_hosts(fleet, kernel)
    env = {k: v for k, v in os.environ.items() if not k.startswith("CACHEAUDIT")}
    status, document = diff_json(env, "--by-host", str(fleet), cwd=tmp_path, kind="host-diff")
    assert status == ExitCode.FINDINGS
    [found] = document["kernels"]
    assert (found["kernel"], found["odd_hosts"], found["parts"]) == (kernel, ["node-c"],
                                                                      ["binary"])


def test_a_ledger_that_breaks_halfway_adds_nothing_of_its_earlier_runs(tmp_path: Path):
    """node-x's first run (an odd binary of the kernel every host built) reads; its second
    run's records sit on pages overwritten with junk. node-x is named as not compared, and
    neither its host, nor its compile, nor its odd binary is counted."""
    import uuid

    from cacheaudit.ledger import Ledger, RunInfo
    from cacheaudit.model import CompileRecord, FileState

    fleet = tmp_path / "fleet"
    fleet.mkdir()
    _three_hosts(fleet, "k")
    (fleet / "node-c.db").unlink()  # node-a and node-b agree
    broken = fleet / "node-x.db"

    def compile_(kernel: str, body: bytes) -> CompileRecord:
        return CompileRecord(
            record_id=uuid.uuid4().hex, event="compile", started_ns=10**18, runtime="cuda.core",
            kernel=kernel, key="K1", exit_code=0, host="node-x",
            outputs=(FileState("/out/k.cubin", True, 1, 1, 1, 1, content_digest(body)),))

    with Ledger.open(str(broken)) as ledger:
        ledger.add_records([compile_("k", b"odd")], RunInfo(run_uuid="x1", label="shim",
                                                            host="node-x"))
        ledger.add_records([compile_(f"other{n}", b"x") for n in range(3000)],
                           RunInfo(run_uuid="x2", label="shim", host="node-x"))
        ledger.conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")
        size = ledger.conn.execute("PRAGMA page_size").fetchone()[0]
        leaves = [n for (n,) in ledger.conn.execute(
            "SELECT pageno FROM dbstat WHERE name = 'records' AND pagetype = 'leaf'"
            " ORDER BY pageno")]
    with open(broken, "r+b") as handle:  # the later half of the records' leaves: run x2's
        for page in leaves[len(leaves) // 2:]:
            handle.seek((page - 1) * size)
            handle.write(b"\xff" * size)
    env = {k: v for k, v in os.environ.items() if not k.startswith("CACHEAUDIT")}
    _status, document = diff_json(env, "--by-host", str(fleet), cwd=tmp_path, kind="host-diff",
                                  exits=(ExitCode.USAGE,))
    assert [s.split(":")[0] for s in document["skipped"]] == [str(broken)]
    assert document["hosts"] == ["node-a", "node-b"], "node-x's first run is not counted"
    assert document["totals"]["compiles"] == 2 and document["kernels"] == []
