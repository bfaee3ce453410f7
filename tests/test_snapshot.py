"""`cacheaudit snapshot` and `cacheaudit diff`, in the environments a bug reporter really has:
no GPU, no nvcc, a compiler that hangs, secrets everywhere."""

from __future__ import annotations

import json
import os
import re
import socket
import stat
import subprocess
import sys
import time
from pathlib import Path

import pytest

SECRET_VALUES = [
    "ghp_" + "A1b2C3d4E5f6G7h8I9j0K1l2M3n4O5p6Q7r8",
    "github_pat_11ABCDEFG0123456789_abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMN",
    "glpat-AbCdEfGhIjKlMnOpQrSt",
    "xoxb-1234567890-0987654321-AbCdEfGhIjKlMnOpQrStUvWx",
    "sk-proj-" + "Zx9" * 20,
    "AKIAIOSFODNN7EXAMPLE",
    "hf_" + "abcdefghijklmnopqrstuvwxyzABCDEFGH",
    "eyJhbGciOiJIUzI1NiJ9.eyJzdWIiOiIxMjM0NTY3ODkwIn0.dozjgNryP4J3jVmNHl0w5N_XgL0n3I9PlFUP0THsR8U",
    "hunter2-correct-horse-battery",
]


def _secret_env(base: dict[str, str]) -> tuple[dict[str, str], list[str]]:
    """50 secret-looking variables: tokens, keys, passwords, URLs with credentials, some of them
    in variables cacheaudit does read (the registry)."""
    env = dict(base)
    secrets: list[str] = []
    names = ["GITHUB_TOKEN", "GH_TOKEN", "HF_TOKEN", "OPENAI_API_KEY", "AWS_SECRET_ACCESS_KEY",
             "AWS_ACCESS_KEY_ID", "SLACK_BOT_TOKEN", "DATABASE_PASSWORD", "NPM_TOKEN",
             "WANDB_API_KEY"]
    for index in range(44):
        value = f"{SECRET_VALUES[index % len(SECRET_VALUES)]}{index:02d}"
        env[f"{names[index % len(names)]}_{index}"] = value
        secrets.append(value)
    urls = [f"redis://:pa55w0rd{n}secret@cache.internal:6379/0" for n in range(5)]
    urls += [f"https://user{n}:t0psecretpassw0rd{n}@example.com/repo.git" for n in range(3)]
    env["DATABASE_URL"] = urls[0]
    env["TRITON_REMOTE_CACHE_BACKEND"] = urls[1]  # a registry variable
    env["PIP_INDEX_URL"] = urls[5]
    env["CPATH"] = f"/opt/include:/home/u/{SECRET_VALUES[0]}:/usr/include"  # a registry variable
    env["NVCC_APPEND_FLAGS"] = f"-DAPI_KEY={SECRET_VALUES[4]} -O3"  # a registry variable
    env["MY_PASSWORD"] = "hunter2-correct-horse-battery-staple"
    env["DG_JIT_CACHE_DIR"] = urls[6]
    secrets += [urls[0], urls[1], urls[5], SECRET_VALUES[0], SECRET_VALUES[4],
                "pa55w0rd1secret", "t0psecretpassw0rd0", "t0psecretpassw0rd1",
                "hunter2-correct-horse-battery-staple"]
    return env, secrets


def _base_env(tmp_path: Path) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("CACHEAUDIT", "DG_", "EP_", "DJ_", "NVCC_", "TRITON_"))
           and k not in ("CPATH",)}
    env.update(HOME=str(tmp_path / "home"), CACHEAUDIT_LEDGER=str(tmp_path / "ledger.db"))
    (tmp_path / "home").mkdir(exist_ok=True)
    return env


def snapshot(env: dict[str, str], *args: str, timeout: int = 120) -> tuple[str, float]:
    started = time.monotonic()
    done = subprocess.run([sys.executable, "-m", "cacheaudit", "snapshot", *args],
                          capture_output=True, text=True, env=env, timeout=timeout)
    assert done.returncode == 0, done.stderr
    return done.stdout, time.monotonic() - started


def _script(path: Path, body: str) -> Path:
    path.write_text("#!/bin/sh\n" + body)
    path.chmod(path.stat().st_mode | stat.S_IXUSR)
    return path


def test_no_gpu_says_so_and_completes(tmp_path: Path):
    env = _base_env(tmp_path)
    env["PATH"] = os.pathsep.join(p for p in env["PATH"].split(os.pathsep)
                                  if not os.path.exists(os.path.join(p, "nvidia-smi")))
    data = json.loads(snapshot(env, "--json")[0])
    assert data["gpu"]["status"].startswith("could not collect")
    assert data["gpu"]["gpus"] == []
    assert {"system", "packages", "compilers", "environment", "caches", "ledger"} <= set(data)


def test_without_nvcc_on_path(tmp_path: Path):
    env = _base_env(tmp_path)
    env.pop("CUDA_HOME", None)
    env.pop("CUDA_PATH", None)
    env["PATH"] = os.pathsep.join(p for p in env["PATH"].split(os.pathsep)
                                  if not os.path.exists(os.path.join(p, "nvcc")))
    markdown, _ = snapshot(env)
    data = json.loads(snapshot(env, "--json")[0])
    [nvcc] = [c for c in data["compilers"] if c["name"] == "nvcc"]
    assert nvcc["status"] == "could not collect: not found"
    assert "| nvcc | - | - | - | - | - | could not collect: not found |" in markdown


def test_a_hanging_compiler_and_gpu_tool_do_not_hang_the_snapshot(tmp_path: Path):
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    _script(bin_dir / "nvcc", "sleep 60\n")
    _script(bin_dir / "nvidia-smi", "sleep 60\n")
    env = _base_env(tmp_path)
    env["PATH"] = os.pathsep.join([str(bin_dir), env["PATH"]])
    out, took = snapshot(env, "--json", "--timeout", "1")
    assert took < 45
    data = json.loads(out)
    [nvcc] = [c for c in data["compilers"] if c["name"] == "nvcc"]
    assert "did not finish within 1 s" in nvcc["status"]
    assert "did not answer within 1 s" in data["gpu"]["status"]


def test_fifty_secrets_never_appear_in_either_format(tmp_path: Path):
    env, secrets = _secret_env(_base_env(tmp_path))
    assert sum(1 for k in env if k not in os.environ) >= 50
    for args in ((), ("--json",), ("--anonymize",), ("--json", "--anonymize")):
        text, _ = snapshot(env, *args)
        leaked = [s for s in secrets if s in text]
        assert leaked == [], (args, leaked)
    # The registry variables are still there, with only their secret parts redacted.
    data = json.loads(snapshot(env, "--json")[0])
    variables = data["environment"]["variables"]
    assert variables["CPATH"].startswith("/opt/include:") and "<redacted>" in variables["CPATH"]
    assert "cache.internal" in variables["TRITON_REMOTE_CACHE_BACKEND"]
    assert "GITHUB_TOKEN_0" not in json.dumps(data)


def test_anonymize_replaces_home_user_host_and_gpu_uuids(tmp_path: Path):
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    uuid = "GPU-12345678-9abc-def0-1234-56789abcdef0"
    _script(bin_dir / "nvidia-smi", f"echo 'NVIDIA H200, 580.65.06, {uuid}'\n")
    env = _base_env(tmp_path)
    env["PATH"] = os.pathsep.join([str(bin_dir), env["PATH"]])
    env["DG_JIT_CACHE_DIR"] = str(tmp_path / "home" / "jit")
    plain = json.loads(snapshot(env, "--json")[0])
    assert plain["gpu"]["gpus"] == [{"name": "NVIDIA H200", "driver": "580.65.06",
                                     "uuid": uuid}]
    text, _ = snapshot(env, "--json", "--anonymize")
    hidden = json.loads(text)
    assert uuid not in text and hidden["gpu"]["gpus"][0]["uuid"] == "GPU-<uuid>"
    assert str(tmp_path / "home") not in text
    assert hidden["environment"]["variables"]["DG_JIT_CACHE_DIR"] == "~/jit"
    hostname = socket.gethostname()
    if len(hostname) > 3:
        assert hostname not in text


def test_anonymize_as_root_replaces_whole_names_in_values_only(tmp_path: Path):
    env = _base_env(tmp_path)
    # getpass reads LOGNAME first: the user is `root`, as in a container, and `root` is also a
    # key of every cache entry in the snapshot.
    env.update(LOGNAME="root", USER="root")
    (tmp_path / "home" / "jit").mkdir()
    env["DG_JIT_CACHE_DIR"] = str(tmp_path / "home" / "jit")
    env["CPATH"] = "/opt/rootfs/include:/srv/root/include"
    markdown, _ = snapshot(env, "--anonymize", "--timeout", "10")
    assert "## cacheaudit snapshot" in markdown and "~/jit" in markdown
    hidden = json.loads(snapshot(env, "--json", "--anonymize", "--timeout", "10")[0])
    assert [c for c in hidden["caches"] if c["root"] == "~/jit"]
    assert all("<user>" not in c for c in hidden["caches"])
    assert hidden["environment"]["variables"]["CPATH"] == "/opt/rootfs/include:/srv/<user>/include"


def test_diff_shows_exactly_what_changed(tmp_path: Path):
    env = _base_env(tmp_path)
    for name in ("a", "b"):
        (tmp_path / name / "cache" / f"k.{'0' * 32}").mkdir(parents=True)
    env["DG_JIT_CACHE_DIR"] = str(tmp_path / "a")
    before = tmp_path / "before.json"
    before.write_text(snapshot(env, "--json")[0])
    env["DG_JIT_CACHE_DIR"] = str(tmp_path / "b")
    env["NVCC_APPEND_FLAGS"] = "-DSCALE=2"
    after = tmp_path / "after.json"
    after.write_text(snapshot(env, "--json")[0])
    done = subprocess.run([sys.executable, "-m", "cacheaudit", "diff", str(before), str(after),
                           "--json"], capture_output=True, text=True, env=env, check=True)
    groups = json.loads(done.stdout)["groups"]
    changed = {(group, row["item"], row["field"]) for group, rows in groups.items()
               for row in rows}
    assert changed == {
        ("environment", "DG_JIT_CACHE_DIR", ""),
        ("environment", "NVCC_APPEND_FLAGS", ""),
        ("environment", "jit DG_JIT_CACHE_DIR", "value"),
        ("caches", str(tmp_path / "a"), ""),
        ("caches", str(tmp_path / "b"), ""),
    }
    table = subprocess.run([sys.executable, "-m", "cacheaudit", "diff", str(before),
                            str(before)], capture_output=True, text=True, env=env, check=True)
    assert table.stdout.strip() == "no differences"
    bad = subprocess.run([sys.executable, "-m", "cacheaudit", "diff", str(before),
                          str(tmp_path / "home")], capture_output=True, text=True, env=env)
    assert bad.returncode == 2
    assert f"{tmp_path / 'home'}: a directory, not a ledger file, a snapshot" in bad.stderr


def test_markdown_renders_on_github(tmp_path: Path):
    env = _base_env(tmp_path)
    markdown, _ = snapshot(env)
    lines = markdown.splitlines()
    assert lines[0] == "## cacheaudit snapshot"
    # Collapsible sections: balanced, each summary followed by a blank line (without it GitHub
    # shows the Markdown inside as raw text), each closing tag on a line of its own.
    assert markdown.count("<details>") == markdown.count("</details>") >= 6
    for index, line in enumerate(lines):
        if line.startswith("<summary>"):
            assert line.endswith("</summary>") and lines[index + 1] == ""
            assert lines[index - 1] == "<details>"
    # Tables: a header row, then a separator with as many cells, and rows of that width.
    for index, line in enumerate(lines):
        if re.fullmatch(r"\|(---\|)+", line):
            width = line.count("---")
            assert lines[index - 1].startswith("| ") and lines[index - 1].count(" | ") == width - 1
            row = index + 1
            while row < len(lines) and lines[row].startswith("| "):
                cells = re.split(r"(?<!\\)\|", lines[row])[1:-1]
                assert len(cells) == width, lines[row]
                row += 1
    for summary in ("Compilers", "Packages", "Compile-affecting environment", "Cache roots",
                    "Latest findings", "Recent kernels"):
        assert f"<summary>{summary} (" in markdown


@pytest.mark.parametrize("part", ["compilers", "caches"])
def test_one_failing_probe_is_a_line_not_a_failure(tmp_path: Path, part: str):
    env = _base_env(tmp_path)
    if part == "compilers":
        env["PATH"] = str(tmp_path / "nowhere")
    else:
        broken = tmp_path / "broken"
        broken.mkdir()
        os.symlink(broken / "cache", broken / "cache")  # a loop: every stat of it fails
        env["DG_JIT_CACHE_DIR"] = str(broken)
    data = json.loads(snapshot(env, "--json")[0])
    assert data["system"]["cacheaudit"]


def test_the_nvcc_reported_is_the_most_specific_setting_set(tmp_path) -> None:
    """DG_JIT_NVCC_COMPILER falls back to DJ_JIT_NVCC_COMPILER: with both set, DeepGEMM runs the
    first, and the snapshot reports it (as before the settings came from the specs)."""
    from cacheaudit import snapshot

    for name in ("dj", "dg"):
        (tmp_path / name).mkdir()
        fake = tmp_path / name / "nvcc"
        fake.write_text(f"#!/bin/sh\necho 'nvcc: {name}'\n")
        fake.chmod(0o755)
    env = {"PATH": "/usr/bin:/bin", "DJ_JIT_NVCC_COMPILER": str(tmp_path / "dj" / "nvcc"),
           "DG_JIT_NVCC_COMPILER": str(tmp_path / "dg" / "nvcc")}
    [nvcc] = [c for c in snapshot._compilers(env, timeout=5) if c["name"] == "nvcc"]
    assert nvcc["path"] == env["DG_JIT_NVCC_COMPILER"]
