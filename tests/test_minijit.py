"""minijit, the reference runtimes: real compiles, real cache directories, no mocks.

Every behaviour cacheaudit relies on is checked here against the recipe of the C++ runtimes, with
the keys and digests recomputed independently in the test (the hash vectors come from compiling
the FNV1a of DeepJIT's `utils/hash.hpp` and DeepGEMM's `get_hex_digest` with g++). Most checks run
in g++ mode, which needs no CUDA; the nvcc checks skip, saying so, where nvcc is missing.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import threading
import time
from pathlib import Path
from typing import Any

import pytest

from fixtures.minijit import (
    CompilerOptions,
    Config,
    DeepGEMMError,
    DeepGemmRuntime,
    DeepJITError,
    FNV1a,
    Runtime,
    SimulatedCrash,
    deepgemm_hex_digest,
    deepjit_hex_digest,
)
from fixtures.minijit._hash import DG_SEED_0, DG_SEED_1, split_mix
from fixtures.minijit.deepjit import DiskCacheEntry, Env, Parser

GXX = shutil.which("g++")
NVCC = shutil.which("nvcc")


def _nvcc_release() -> tuple[int, int] | None:
    if NVCC is None:
        return None
    out = subprocess.run([NVCC, "--version"], capture_output=True, text=True, check=False).stdout
    match = re.search(r"release (\d+)\.(\d+)", out)
    return (int(match.group(1)), int(match.group(2))) if match else None


NVCC_RELEASE = _nvcc_release()
needs_gxx = pytest.mark.skipif(GXX is None, reason="g++ is not on PATH: g++-mode checks skipped")
needs_nvcc = pytest.mark.skipif(
    NVCC_RELEASE is None or NVCC_RELEASE < (12, 3),
    reason="nvcc >= 12.3 is not on PATH: DeepGEMM nvcc-mode checks skipped")
needs_nvcc_129 = pytest.mark.skipif(
    NVCC_RELEASE is None or NVCC_RELEASE < (12, 9),
    reason="nvcc >= 12.9 (DeepJIT's minimum) is not on PATH: DeepJIT nvcc-mode checks skipped")

PREFIX = "TST"
COMMON_H = "#pragma once\n#define COMMON_VALUE 10\n"
GEMM_H = "#pragma once\n#include <deep_gemm/common.cuh>\n#define GEMM_VALUE (COMMON_VALUE + 1)\n"
PARAMS_H = "#pragma once\n#define THIRD_VALUE 100\n"
SOURCE = """\
#include <deep_gemm/gemm.cuh>
#include <third/params.h>
#ifndef EXTRA_VALUE
#define EXTRA_VALUE 0
#endif
#ifdef __CUDACC__
extern "C" __global__ void mj_kernel(int* o) { o[0] = GEMM_VALUE + THIRD_VALUE + EXTRA_VALUE; }
#else
extern "C" int mj_kernel() { return GEMM_VALUE + THIRD_VALUE + EXTRA_VALUE; }
#endif
"""
DEFAULT_FLAGS = [
    "--gpu-architecture=sm_90a", "-O3", "--compiler-options=-O3",
    "--ptxas-options=--register-usage-level=10", "-std=c++20", "--compiler-options=-fPIC",
    "--compiler-options=-fconcepts", "--expt-relaxed-constexpr", "--expt-extended-lambda",
]
UUID_DIR = r"\d+-[0-9a-f]{8}-[0-9a-f]{8}-[0-9a-f]{8}"


@pytest.fixture(autouse=True)
def clean_environment(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """Nothing from the caller's environment reaches the runtimes or their compilers."""
    for name in list(os.environ):
        if (name.startswith(("DJ_", f"{PREFIX}_", "OTHER_", "DG_", "NVCC_"))
                or name in ("CPATH", "C_INCLUDE_PATH", "CPLUS_INCLUDE_PATH", "JIT_CACHE_DIR")):
            monkeypatch.delenv(name)
    monkeypatch.setenv("HOME", str(tmp_path / "home"))


class Project:
    """A library with tracked headers (include/deep_gemm/) and untracked ones (third/)."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.include = root / "include"
        self.third = root / "third"
        (self.include / "deep_gemm").mkdir(parents=True)
        (self.third / "third").mkdir(parents=True)
        self.gemm_h = self.include / "deep_gemm" / "gemm.cuh"
        self.common_h = self.include / "deep_gemm" / "common.cuh"
        self.params_h = self.third / "third" / "params.h"
        self.gemm_h.write_text(GEMM_H)
        self.common_h.write_text(COMMON_H)
        self.params_h.write_text(PARAMS_H)

    def config(self, extra_signature: str = "sig") -> Config:
        return Config(self.root, PREFIX, extra_signature, [self.include, self.third],
                      ["deep_gemm/"])

    def runtime(self, monkeypatch: pytest.MonkeyPatch, cache: Path | str, *,
                backend: str = "gxx", extra_signature: str = "sig") -> Runtime:
        monkeypatch.setenv(f"{PREFIX}_JIT_CACHE_DIR", str(cache))
        return Runtime(self.config(extra_signature), backend=backend)  # type: ignore[arg-type]


@pytest.fixture
def project(tmp_path: Path) -> Project:
    return Project(tmp_path / "lib")


def recorder(runtime: Runtime | DeepGemmRuntime) -> list[dict[str, Any]]:
    events: list[dict[str, Any]] = []
    runtime.listeners.append(events.append)
    return events


def shell_version(compiler: str) -> str:
    return subprocess.run(f"{compiler} --version 2>&1", shell=True, stdout=subprocess.PIPE,
                          check=True).stdout.decode()


def expected_key(version: str, flags: list[str], source: str = SOURCE,
                 extra_signature: str = "sig", common: str = COMMON_H, gemm: str = GEMM_H) -> str:
    """DeepJIT's key, recomputed from the recipe of runtime.hpp and parser.hpp."""
    common_digest = FNV1a().update(common).get_hex_digest()
    gemm_digest = FNV1a().update(gemm).update(common_digest).get_hex_digest()
    source_digest = FNV1a().update(source).update(gemm_digest).get_hex_digest()
    return (FNV1a().update(extra_signature).update(deepjit_hex_digest(version))
            .update(" ".join(flags)).update("").update(source_digest).get_hex_digest())


def backdate(path: str, seconds: int = 1000) -> int:
    old = time.time_ns() - seconds * 1_000_000_000
    os.utime(path, ns=(old, old))
    return old


# --------------------------------------------------------------------------------------------
# Digests
# --------------------------------------------------------------------------------------------


def test_deepjit_digest_vectors() -> None:
    # From the C++ FNV1a of utils/hash.hpp compiled with g++ (printf instead of std::format).
    assert deepjit_hex_digest("") == "601991819c51b6b40cce57df1139bba4"
    assert deepjit_hex_digest("a") == "071877703434148cbfd5816193c030f4"
    assert deepjit_hex_digest("__global__ void k() {}\n") == "fa371317dc4ff4de53f418df16278fa6"
    assert FNV1a().get_hex_digest() == "ddd805b8cbc69b1eab0665cdad96ab45"
    # The length prefix makes chained updates unambiguous.
    assert FNV1a().update("ab").update("c").get_hex_digest() == "ade4f2da7faaca1b6b7735b33fffa69f"
    assert FNV1a().update("a").update("bc").get_hex_digest() == "fc1aedb4107b5fa7d1d5dcbfaaa19390"


def test_deepgemm_digest_vectors_differ_from_deepjit() -> None:
    # By hand: FNV-1a of no bytes is its seed, so the empty digest is splitmix of the two seeds.
    assert deepgemm_hex_digest("") == f"{split_mix(DG_SEED_0):016x}{split_mix(DG_SEED_1):016x}"
    assert deepgemm_hex_digest("") == "ddd805b8cbc69b1ee220a8397b1dcdaf"
    assert deepgemm_hex_digest("a") == "40eeb2539253514ed582412f6e474b8f"
    assert deepgemm_hex_digest("__global__ void k() {}\n") == "2e74ff93f19254fa3effbd4641c6b313"
    for data in ("", "a", SOURCE):
        assert deepgemm_hex_digest(data) != deepjit_hex_digest(data)


# --------------------------------------------------------------------------------------------
# DeepJIT: parser and environment (no compiles)
# --------------------------------------------------------------------------------------------


@pytest.mark.parametrize(("line", "tracked"), [
    ("#include <deep_gemm/a.cuh>", "deep_gemm/a.cuh"),
    ("  #  include\t<deep_gemm/a.cuh> // trailing", "deep_gemm/a.cuh"),
    ("#include<deep_gemm/a.cuh>", "deep_gemm/a.cuh"),
    ("// #include <deep_gemm/in_comment.cuh>", None),  # a comment line does not start with '#'
    ("#include <cute/tensor.hpp>", None),
    ("#include DEEP_GEMM_HEADER", None),
    ("#include_next <deep_gemm/a.cuh>", None),
    ("#include <deep_gemm/unterminated", None),
    ("#pragma once", None),
])
def test_parser_lines(line: str, tracked: str | None) -> None:
    parser = Parser([], ["deep_gemm/"])
    assert parser.parse_include(line.encode()) == tracked


@pytest.mark.parametrize("line", [
    '#include "local.h"', '#include "deep_gemm/a.cuh"', "#include < deep_gemm/a.cuh>",
    "#include <deep_gemm/a.cuh >", '#include <deep_gemm/a.cuh">', "#include <>",
])
def test_parser_rejects_non_standard_includes(line: str) -> None:
    with pytest.raises(DeepJITError, match="non-standard include"):
        Parser([], ["deep_gemm/"]).parse_include(line.encode())


def test_parser_scans_dead_code_and_block_comments(project: Project) -> None:
    parser = Parser([str(project.include)], ["deep_gemm/"])
    with pytest.raises(DeepJITError, match="non-standard include"):
        parser.parse_into_hash('#if 0\n#include "never.h"\n#endif\n')
    tracked: dict[str, tuple[str, str]] = {}
    parser.parse_into_hash("/*\n#include <deep_gemm/gemm.cuh>\n*/\n", tracked)
    assert set(tracked) == {"deep_gemm/gemm.cuh", "deep_gemm/common.cuh"}
    assert tracked["deep_gemm/common.cuh"][0] == str(project.common_h)


def test_parser_resolution_order_missing_and_circular(tmp_path: Path) -> None:
    first, second = tmp_path / "first", tmp_path / "second"
    for root, value in ((first, 1), (second, 2)):
        (root / "p").mkdir(parents=True)
        (root / "p" / "x.h").write_text(f"#define X {value}\n")
    tracked: dict[str, tuple[str, str]] = {}
    Parser([str(first), str(second)], ["p/"]).parse_into_hash("#include <p/x.h>\n", tracked)
    assert tracked["p/x.h"][0] == str(first / "p" / "x.h")
    with pytest.raises(DeepJITError, match="failed to open"):
        Parser([str(first)], ["p/"]).parse_into_hash("#include <p/missing.h>\n")
    (first / "p" / "a.h").write_text("#include <p/b.h>\n")
    (first / "p" / "b.h").write_text("#include <p/a.h>\n")
    with pytest.raises(DeepJITError, match="circular include may occur: p/"):
        Parser([str(first)], ["p/"]).parse_into_hash("#include <p/a.h>\n")


def test_env_prefix_precedence_dj_fallback_and_strict_values(
        monkeypatch: pytest.MonkeyPatch) -> None:
    env = Env(PREFIX)
    assert env.get_int("JIT_CPP_STANDARD", 20) == 20
    monkeypatch.setenv("DJ_JIT_CPP_STANDARD", "17")
    assert env.get_int("JIT_CPP_STANDARD", 20) == 17
    assert env.source("JIT_CPP_STANDARD") == "DJ_JIT_CPP_STANDARD"
    monkeypatch.setenv(f"{PREFIX}_JIT_CPP_STANDARD", "23")
    assert env.get_int("JIT_CPP_STANDARD", 20) == 23
    monkeypatch.setenv("JIT_DEBUG", "1")  # unprefixed names are never read
    assert env.get_bool("JIT_DEBUG", False) is False
    for raw, value in (("Yes", True), ("TRUE", True), ("no", False), ("2", True), ("-1", True),
                       ("0", False)):
        monkeypatch.setenv("DJ_JIT_DEBUG", raw)
        assert env.get_bool("JIT_DEBUG", False) is value
    monkeypatch.setenv(f"{PREFIX}_JIT_DEBUG", "maybe")  # wins over a valid DJ_ value, then panics
    with pytest.raises(DeepJITError, match=f"invalid value for {PREFIX}_JIT_DEBUG: maybe"):
        env.get_bool("JIT_DEBUG", False)
    for bad in ("", " 1", "+1", "1.0", "on"):
        monkeypatch.setenv(f"{PREFIX}_JIT_DEBUG", bad)
        with pytest.raises(DeepJITError, match="invalid value"):
            env.get_bool("JIT_DEBUG", False)
    with pytest.raises(DeepJITError, match="reserved"):
        Env("DJ")


def test_config_validation_and_normalisation(tmp_path: Path) -> None:
    config = Config(f"{tmp_path}/./lib/", "OTHER", include_dirs=[f"{tmp_path}/a/../inc"])
    assert config.python_library_root == f"{tmp_path}/lib/"
    assert config.include_dirs == [f"{tmp_path}/inc"]
    assert list(config.to_json()) == [
        "python_library_root", "extra_signature", "include_dirs", "include_prefixes"]
    with pytest.raises(DeepJITError, match="must be absolute"):
        Config("relative", "OTHER")
    with pytest.raises(DeepJITError, match="must be absolute"):
        Config(tmp_path, "OTHER", include_dirs=["inc"])
    with pytest.raises(DeepJITError, match="reserved"):
        Config(tmp_path, "DJ")


@needs_gxx
def test_cache_roots_from_environment(project: Project, monkeypatch: pytest.MonkeyPatch,
                                      tmp_path: Path) -> None:
    config = project.config()
    monkeypatch.setenv("JIT_CACHE_DIR", str(tmp_path / "ignored"))
    assert Runtime(config, backend="gxx").disk_cache.paths == [str(tmp_path / "home" / ".dj")]
    monkeypatch.setenv("DJ_JIT_CACHE_DIR", f"{tmp_path}/a:{tmp_path}/b")
    assert Runtime(config, backend="gxx").disk_cache.paths == [f"{tmp_path}/a", f"{tmp_path}/b"]
    monkeypatch.setenv(f"{PREFIX}_JIT_CACHE_DIR", f"{tmp_path}/c")
    assert Runtime(config, backend="gxx").disk_cache.paths == [f"{tmp_path}/c"]
    monkeypatch.setenv(f"{PREFIX}_JIT_CACHE_DIR", f"{tmp_path}/c::{tmp_path}/d")
    with pytest.raises(DeepJITError, match="empty path"):
        Runtime(config, backend="gxx")


def test_commit_accepts_a_committed_winner_only(tmp_path: Path) -> None:
    def staged(name: str) -> str:
        path = tmp_path / "tmp" / name
        path.mkdir(parents=True)
        (path / "kernel.so").write_bytes(b"ours")
        return str(path)

    winner = tmp_path / "cache" / "k.abc"
    winner.mkdir(parents=True)
    (winner / ".committed").write_bytes(b"")
    entry = DiskCacheEntry(False, staged("one"), str(winner))
    assert entry.commit() == str(winner)
    assert not (tmp_path / "tmp" / "one").exists()
    assert not (winner / "kernel.so").exists()

    (winner / ".committed").unlink()
    (winner / "partial").write_bytes(b"")
    entry = DiskCacheEntry(False, staged("two"), str(winner))
    with pytest.raises(OSError, match="failed to publish"):
        entry.commit()
    entry.cleanup()
    assert not (tmp_path / "tmp" / "two").exists()


# --------------------------------------------------------------------------------------------
# DeepJIT: compiles (g++ mode)
# --------------------------------------------------------------------------------------------


@needs_gxx
def test_key_layout_and_meta_json_follow_the_recipe(project: Project,
                                                    monkeypatch: pytest.MonkeyPatch,
                                                    tmp_path: Path) -> None:
    cache = tmp_path / "cache"
    rt = project.runtime(monkeypatch, cache)
    events = recorder(rt)
    kernel = rt.compile("gemm_kernel", SOURCE)

    gxx = os.path.abspath(GXX or "")
    version = shell_version(gxx)
    key = expected_key(version, DEFAULT_FLAGS)
    assert (kernel.key, kernel.event) == (key, "compile")
    assert kernel.path == f"{cache}/cache/gemm_kernel.{key}"
    assert kernel.binary == f"{kernel.path}/kernel.so"
    assert sorted(os.listdir(kernel.path)) == [".committed", "kernel.cu", "kernel.so",
                                              "meta.json"]
    assert Path(kernel.path, "kernel.cu").read_text() == SOURCE
    assert os.listdir(cache / "tmp") == []

    raw = Path(kernel.path, "meta.json").read_text()
    tmp_dir = re.search(rf"{re.escape(str(cache))}/tmp/{UUID_DIR}", raw)
    assert tmp_dir is not None
    command = " ".join([
        gxx, "-x", "c++", f"{tmp_dir.group(0)}/kernel.cu", "-shared", "-fPIC", "-o",
        f"{tmp_dir.group(0)}/kernel.so", "-O3", "-std=c++20",
        "-I", str(project.include), "-I", str(project.third)])
    meta = {
        "command": command,
        "config": {"python_library_root": str(project.root), "extra_signature": "sig",
                   "include_dirs": [str(project.include), str(project.third)],
                   "include_prefixes": ["deep_gemm/"]},
        "compiler_info": {"path": gxx, "version": version},
        "compiler_options": {
            "optimize_level": "3", "use_fast_math": False, "ptxas_verbose": False,
            "ptxas_register_usage_level": 10, "check_no_spills": False,
            "check_no_local_memory": False, "with_line_info": False, "dump_ptx": False,
            "dump_sass": False, "arch": "90a", "nvcc_flags": DEFAULT_FLAGS[4:],
            "extra_nvcc_flags": [], "post_hook": None},
    }
    assert raw == json.dumps(meta, ensure_ascii=False, separators=(",", ":"))

    [event] = events
    assert event["event"] == "compile" and event["key"] == key and event["error"] is None
    assert event["tracked"] == {
        "deep_gemm/gemm.cuh": (str(project.gemm_h), FNV1a().update(GEMM_H).update(
            FNV1a().update(COMMON_H).get_hex_digest()).get_hex_digest()),
        "deep_gemm/common.cuh": (str(project.common_h), FNV1a().update(COMMON_H).get_hex_digest()),
    }

    # Options enter the key through the flag list; the name does not enter it at all.
    flagged = rt.compile("gemm_kernel", SOURCE, ["-DEXTRA_VALUE=1"])
    assert flagged.key == expected_key(version, [*DEFAULT_FLAGS, "-DEXTRA_VALUE=1"])
    other = project.runtime(monkeypatch, cache).compile("renamed", SOURCE)
    assert (other.key, other.event) == (key, "compile")
    assert other.path == f"{cache}/cache/renamed.{key}"


@needs_gxx
def test_disk_hit_touches_committed_and_memory_hit_does_not(
        project: Project, monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    first = project.runtime(monkeypatch, tmp_path / "cache").compile("k", SOURCE)
    marker = os.path.join(first.path, ".committed")
    old = backdate(marker)
    binary = Path(first.binary).read_bytes()

    rt = project.runtime(monkeypatch, tmp_path / "cache")
    events = recorder(rt)
    hit = rt.compile("k", SOURCE)
    assert (hit.event, hit.key, hit.path) == ("disk-hit", first.key, first.path)
    assert os.stat(marker).st_mtime_ns > old
    assert Path(hit.binary).read_bytes() == binary

    old = backdate(marker)
    again = rt.compile("k", SOURCE)
    assert again.event == "memory-hit"
    assert os.stat(marker).st_mtime_ns == old
    # Keyed by the digest only: another name with the same source gets the first entry back.
    renamed = rt.compile("other", SOURCE)
    assert (renamed.event, renamed.name, renamed.path) == ("memory-hit", "k", first.path)
    assert [e["event"] for e in events] == ["disk-hit", "memory-hit", "memory-hit"]
    assert events[2]["name"] == "other"
    # compile_without_load skips the in-memory cache: a disk hit, with its mtime signal.
    assert rt.compile_without_load("k", SOURCE).event == "disk-hit"
    assert os.stat(marker).st_mtime_ns > old


@needs_gxx
def test_untracked_header_edit_is_a_stale_hit(project: Project, monkeypatch: pytest.MonkeyPatch,
                                             tmp_path: Path) -> None:
    built = project.runtime(monkeypatch, tmp_path / "a").compile("k", SOURCE)
    stale_bytes = Path(built.binary).read_bytes()
    project.params_h.write_text("#pragma once\n#define THIRD_VALUE 200\n")

    hit = project.runtime(monkeypatch, tmp_path / "a").compile("k", SOURCE)
    assert (hit.event, hit.key) == ("disk-hit", built.key)
    assert Path(hit.binary).read_bytes() == stale_bytes

    fresh = project.runtime(monkeypatch, tmp_path / "b").compile("k", SOURCE)
    assert (fresh.event, fresh.key) == ("compile", built.key)
    assert Path(fresh.binary).read_bytes() != stale_bytes


@needs_gxx
def test_tracked_header_digest_is_cached_per_runtime_object(
        project: Project, monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    rt = project.runtime(monkeypatch, tmp_path / "cache")
    events = recorder(rt)
    first = rt.compile("k", SOURCE)
    old_common = FNV1a().update(COMMON_H).get_hex_digest()
    project.common_h.write_text("#pragma once\n#define COMMON_VALUE 20\n")

    # The same object never re-reads the header: same key, and a new source that includes it
    # is keyed with the old digest while the compiler reads the new file.
    assert rt.compile("k", SOURCE).key == first.key
    variant = SOURCE + "// variant\n"
    built = rt.compile("k", variant)
    assert built.event == "compile"
    assert events[-1]["tracked"]["deep_gemm/common.cuh"][1] == old_common
    assert built.key == expected_key(rt.backend.compiler_info.version, DEFAULT_FLAGS,
                                     source=variant)

    renewed = project.runtime(monkeypatch, tmp_path / "cache").compile("k", SOURCE)
    assert renewed.event == "compile" and renewed.key != first.key
    assert renewed.key == expected_key(rt.backend.compiler_info.version, DEFAULT_FLAGS,
                                       common="#pragma once\n#define COMMON_VALUE 20\n")


@needs_gxx
def test_quoted_include_raises_and_listeners_see_it(project: Project,
                                                   monkeypatch: pytest.MonkeyPatch,
                                                   tmp_path: Path) -> None:
    rt = project.runtime(monkeypatch, tmp_path / "cache")
    events = recorder(rt)
    with pytest.raises(DeepJITError, match=r'non-standard include: "local\.h"'):
        rt.compile("k", '#include "local.h"\n' + SOURCE)
    [event] = events
    assert event["event"] == "error" and event["key"] is None
    assert 'non-standard include: "local.h"' in event["error"]
    assert not (tmp_path / "cache").exists()
    with pytest.raises(DeepJITError, match="cache tag must contain only"):
        rt.compile("bad-name", SOURCE)
    assert events[-1]["event"] == "error" and events[-1]["key"] is not None


@needs_gxx
def test_cpath_changes_the_binary_not_the_key(project: Project, monkeypatch: pytest.MonkeyPatch,
                                             tmp_path: Path) -> None:
    source = "#include <envconst.h>\n" + SOURCE.replace("EXTRA_VALUE;", "ENV_VALUE;")
    for value in (1, 2):
        (tmp_path / f"cpath{value}").mkdir()
        (tmp_path / f"cpath{value}" / "envconst.h").write_text(f"#define ENV_VALUE {value}\n")
    monkeypatch.setenv("CPATH", str(tmp_path / "cpath1"))
    one = project.runtime(monkeypatch, tmp_path / "a").compile("k", source)
    monkeypatch.setenv("CPATH", str(tmp_path / "cpath2"))
    two = project.runtime(monkeypatch, tmp_path / "b").compile("k", source)
    assert (one.event, two.event) == ("compile", "compile")
    assert one.key == two.key
    assert Path(one.binary).read_bytes() != Path(two.binary).read_bytes()
    stale = project.runtime(monkeypatch, tmp_path / "a").compile("k", source)
    assert stale.event == "disk-hit" and stale.path == one.path


@needs_gxx
def test_environment_changes_after_construction_are_ignored(
        project: Project, monkeypatch: pytest.MonkeyPatch, tmp_path: Path,
        capsys: pytest.CaptureFixture[str]) -> None:
    rt = project.runtime(monkeypatch, tmp_path / "a")
    monkeypatch.setenv(f"{PREFIX}_JIT_CACHE_DIR", str(tmp_path / "b"))
    monkeypatch.setenv(f"{PREFIX}_JIT_CPP_STANDARD", "17")
    monkeypatch.setenv(f"{PREFIX}_JIT_WITH_LINEINFO", "1")
    monkeypatch.setenv(f"{PREFIX}_JIT_PRINT_COMPILER_COMMAND", "yes")  # re-read: printing only
    kernel = rt.compile("k", SOURCE)
    version = rt.backend.compiler_info.version
    assert kernel.key == expected_key(version, DEFAULT_FLAGS)
    assert kernel.path.startswith(f"{tmp_path}/a/cache/")
    assert f"Running command: cd {tmp_path}/a/tmp/" in capsys.readouterr().out

    later = Runtime(project.config(), backend="gxx").compile("k", SOURCE)
    flags = [*DEFAULT_FLAGS[:4], "--generate-line-info", "-std=c++17",
             *DEFAULT_FLAGS[5:]]
    assert later.key == expected_key(version, flags)
    assert later.path.startswith(f"{tmp_path}/b/cache/")


@needs_gxx
def test_colon_separated_roots_hit_in_a_later_root(project: Project,
                                                  monkeypatch: pytest.MonkeyPatch,
                                                  tmp_path: Path) -> None:
    seeded = project.runtime(monkeypatch, tmp_path / "shared").compile("k", SOURCE)
    marker = os.path.join(seeded.path, ".committed")
    old = backdate(marker)
    rt = project.runtime(monkeypatch, f"{tmp_path}/local:{tmp_path}/shared")
    hit = rt.compile("k", SOURCE)
    assert (hit.event, hit.path) == ("disk-hit", seeded.path)
    assert os.stat(marker).st_mtime_ns > old
    assert not (tmp_path / "local").exists()
    miss = rt.compile("k", SOURCE, ["-DEXTRA_VALUE=3"])
    assert miss.event == "compile" and miss.path.startswith(f"{tmp_path}/local/cache/k.")


@needs_gxx
def test_failed_compile_cleans_up_and_a_crash_leaves_tmp(project: Project,
                                                        monkeypatch: pytest.MonkeyPatch,
                                                        tmp_path: Path) -> None:
    cache = tmp_path / "cache"
    rt = project.runtime(monkeypatch, cache)
    events = recorder(rt)
    with pytest.raises(DeepJITError, match="command failed with exit code 1") as failure:
        rt.compile("k", SOURCE + "this is not C++;\n")
    assert "error:" in failure.value.reason
    assert os.listdir(cache / "tmp") == [] and not (cache / "cache").exists()
    assert events[-1]["event"] == "error" and events[-1]["key"]

    rt.crash_before_commit = True
    with pytest.raises(SimulatedCrash):
        rt.compile("k", SOURCE)
    [leftover] = os.listdir(cache / "tmp")
    assert re.fullmatch(UUID_DIR, leftover)
    assert sorted(os.listdir(cache / "tmp" / leftover)) == ["kernel.cu", "kernel.so", "meta.json"]
    assert not (cache / "cache").exists()

    rt.crash_before_commit = False
    assert rt.compile("k", SOURCE).event == "compile"
    assert os.listdir(cache / "tmp") == [leftover]


@needs_gxx
def test_masquerade_compiler_version_text_is_keyed_not_its_path(
        project: Project, monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    log = tmp_path / "argv.log"

    def wrapper(directory: str, banner: str) -> Path:
        path = tmp_path / directory / "g++"
        path.parent.mkdir()
        path.write_text(f'#!/bin/sh\necho "$@" >> {log}\n'
                        f'if [ "$1" = --version ]; then echo "{banner}"; exit 0; fi\n'
                        f'exec {GXX} "$@"\n')
        path.chmod(0o755)
        return path

    one, two, other = wrapper("one", "g++ 1.0"), wrapper("two", "g++ 1.0"), wrapper("x", "g++ 2")
    keys = []
    for compiler in (one, two, other):
        monkeypatch.setenv(f"{PREFIX}_JIT_NVCC_COMPILER", str(compiler))
        rt = project.runtime(monkeypatch, tmp_path / "cache", backend="auto")
        assert rt.backend.kind == "gxx" and rt.backend.compiler == str(compiler)
        keys.append(rt.compile("k", SOURCE).key)
    assert keys[0] == keys[1] != keys[2]
    assert keys[0] == expected_key("g++ 1.0\n", DEFAULT_FLAGS)
    calls = log.read_text().splitlines()
    assert calls[0] == "--version" and calls[1].startswith("-x c++ ")


@needs_gxx
def test_single_flight_and_listener_errors_never_break_a_compile(
        project: Project, monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    rt = project.runtime(monkeypatch, tmp_path / "cache")

    def broken(_: dict[str, Any]) -> None:
        raise ValueError("listener bug")

    rt.listeners.append(broken)
    results: list[str] = []
    threads = [threading.Thread(target=lambda: results.append(rt.compile("k", SOURCE).event))
               for _ in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert sorted(results) == ["compile", "memory-hit", "memory-hit", "memory-hit"]
    assert len(rt.listener_errors) == 4
    assert len(os.listdir(tmp_path / "cache" / "cache")) == 1


def test_compiler_options_override_semantics() -> None:
    env = Env(PREFIX)
    defaults = CompilerOptions.default_options(env, "90a")
    merged = defaults.override_with(CompilerOptions(fast_math=False, optimize_level="2",
                                                    extra_nvcc_flags=["-DX"]))
    assert merged.get_flags()[:4] == ["--gpu-architecture=sm_90a", "-O2",
                                      "--compiler-options=-O2",
                                      "--ptxas-options=--register-usage-level=10"]
    assert merged.get_flags()[-1] == "-DX" and defaults.extra_nvcc_flags == []
    assert list(merged.to_json())[-3:] == ["nvcc_flags", "extra_nvcc_flags", "post_hook"]


# --------------------------------------------------------------------------------------------
# DeepJIT: nvcc mode
# --------------------------------------------------------------------------------------------


@pytest.mark.nvcc
@needs_nvcc_129
def test_nvcc_entry_command_and_append_flags(project: Project, monkeypatch: pytest.MonkeyPatch,
                                            tmp_path: Path) -> None:
    rt = project.runtime(monkeypatch, tmp_path / "a", backend="nvcc")
    kernel = rt.compile("k", SOURCE)
    nvcc = rt.backend.compiler
    assert rt.backend.compiler_info.version == shell_version(nvcc)
    flags = [*DEFAULT_FLAGS]
    assert kernel.key == expected_key(rt.backend.compiler_info.version, flags)
    assert sorted(os.listdir(kernel.path)) == [".committed", "kernel.cu", "kernel.cubin",
                                              "meta.json"]
    meta = json.loads(Path(kernel.path, "meta.json").read_text())
    tmp_dir = re.fullmatch(rf"{re.escape(nvcc)} ({re.escape(str(tmp_path))}/a/tmp/{UUID_DIR})"
                           r"/kernel\.cu .*", meta["command"])
    assert tmp_dir is not None
    assert meta["command"] == " ".join([
        nvcc, f"{tmp_dir.group(1)}/kernel.cu", "--cubin", "--output-file",
        f"{tmp_dir.group(1)}/kernel.cubin", *flags, "--include-path", str(project.include),
        "--include-path", str(project.third)])

    monkeypatch.setenv("NVCC_APPEND_FLAGS", "-DEXTRA_VALUE=5")
    appended = project.runtime(monkeypatch, tmp_path / "b", backend="nvcc").compile("k", SOURCE)
    assert (appended.event, appended.key) == ("compile", kernel.key)
    assert Path(appended.binary).read_bytes() != Path(kernel.binary).read_bytes()
    hit = project.runtime(monkeypatch, tmp_path / "a", backend="nvcc").compile("k", SOURCE)
    assert (hit.event, hit.path) == ("disk-hit", kernel.path)


# --------------------------------------------------------------------------------------------
# DeepGEMM 2.6.1
# --------------------------------------------------------------------------------------------

DG_COMMON = "#pragma once\n#define DG_COMMON 3\n"
DG_IMPL = "#pragma once\n#include <deep_gemm/common.cuh>\n#define DG_IMPL (DG_COMMON * 2)\n"
DG_TILE = "#pragma once\n#define TILE_VALUE 5\n"


def dg_code(n: int) -> str:
    return (f"#include <deep_gemm/impl.cuh>\n#include <cute/tile.hpp>\n"
            f"#ifdef __CUDACC__\n"
            f'extern "C" __global__ void dg_kernel(int* o) '
            f"{{ o[0] = DG_IMPL + TILE_VALUE + {n}; }}\n"
            f"#else\n"
            f'extern "C" int dg_kernel() {{ return DG_IMPL + TILE_VALUE + {n}; }}\n'
            f"#endif\n")


def dg_include_hash(impl: str = DG_IMPL, common: str = DG_COMMON) -> str:
    """The 2.6.1 include hash of `dg_code`, recomputed from include_parser.hpp."""
    common_digest = deepgemm_hex_digest("#" + deepgemm_hex_digest(common))
    impl_digest = deepgemm_hex_digest(f"{common_digest}$#" + deepgemm_hex_digest(impl))
    return deepgemm_hex_digest(f"{impl_digest}$")


@pytest.fixture
def dg_library(tmp_path: Path) -> Path:
    root = tmp_path / "deep_gemm"
    (root / "include" / "deep_gemm").mkdir(parents=True)
    (root / "include" / "cute").mkdir(parents=True)
    (root / "include" / "deep_gemm" / "common.cuh").write_text(DG_COMMON)
    (root / "include" / "deep_gemm" / "impl.cuh").write_text(DG_IMPL)
    (root / "include" / "cute" / "tile.hpp").write_text(DG_TILE)
    return root


def gxx_signature() -> str:
    first_line = shell_version(GXX or "").split("\n", 1)[0]
    match = re.search(r"(\d+)\.(\d+)", first_line)
    assert match is not None
    return f"GXX{match.group(1)}.{match.group(2)}"


@needs_gxx
def test_deepgemm_layout_key_and_events(dg_library: Path, monkeypatch: pytest.MonkeyPatch,
                                        tmp_path: Path) -> None:
    monkeypatch.setenv("DG_JIT_CACHE_DIR", str(tmp_path / "dg"))
    rt = DeepGemmRuntime(dg_library, backend="gxx")
    events = recorder(rt)
    kernel = rt.build("sm90_gemm", dg_code(1))

    include_hash = dg_include_hash()
    code = f"// Includes' hash value: {include_hash}\n{dg_code(1)}"
    flags = f"-std=c++20 -I{dg_library}/include -fPIC -O3 -fconcepts " \
            "-Wno-deprecated-declarations -Wno-abi"
    key = deepgemm_hex_digest(f"sm90_gemm$${gxx_signature()}$${flags}$${code}")
    assert (kernel.key, kernel.event) == (key, "compile")
    assert kernel.path == f"{tmp_path}/dg/cache/kernel.sm90_gemm.{key}"
    assert sorted(os.listdir(kernel.path)) == ["kernel.cu", "kernel.so"]
    assert Path(kernel.path, "kernel.cu").read_text() == code
    assert os.listdir(tmp_path / "dg" / "tmp") == []
    assert events[0]["include_hash"] == include_hash
    assert set(events[0]["tracked"]) == {"deep_gemm/impl.cuh", "deep_gemm/common.cuh"}

    assert rt.build("sm90_gemm", dg_code(1)).event == "memory-hit"
    fresh = DeepGemmRuntime(dg_library, backend="gxx")
    assert fresh.build("sm90_gemm", dg_code(1)).event == "disk-hit"
    # The untracked cute header never enters the key.
    (dg_library / "include" / "cute" / "tile.hpp").write_text("#define TILE_VALUE 6\n")
    assert DeepGemmRuntime(dg_library, backend="gxx").build("sm90_gemm", dg_code(1)).key == key


@needs_gxx
def test_deepgemm_include_hash_is_static_per_kernel_class(
        dg_library: Path, monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("DG_JIT_CACHE_DIR", str(tmp_path / "dg"))
    rt = DeepGemmRuntime(dg_library, backend="gxx")
    old = dg_include_hash()
    rt.build("gemm", dg_code(1))
    new_impl = DG_IMPL.replace("* 2", "* 4")
    (dg_library / "include" / "deep_gemm" / "impl.cuh").write_text(new_impl)

    def first_line(path: str) -> str:
        return Path(path, "kernel.cu").read_text().split("\n", 1)[0]

    # Same class, new shape: the class's static hash is reused.
    assert first_line(rt.build("gemm", dg_code(2)).path).endswith(old)
    # A new class in the same process: the per-path header cache still holds the old digest.
    assert first_line(rt.build("other", dg_code(2), kernel_class="Other").path).endswith(old)
    # A new process sees the edit.
    rebuilt = DeepGemmRuntime(dg_library, backend="gxx").build("gemm", dg_code(1))
    assert first_line(rebuilt.path).endswith(dg_include_hash(impl=new_impl))


@needs_gxx
def test_deepgemm_include_path_and_env_snapshot_at_first_build(
        dg_library: Path, monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    moved = tmp_path / "elsewhere" / "deep_gemm"
    shutil.copytree(dg_library, moved)
    monkeypatch.setenv("DG_JIT_CACHE_DIR", str(tmp_path / "one"))
    rt = DeepGemmRuntime(dg_library, backend="gxx")
    monkeypatch.setenv("DG_JIT_CACHE_DIR", str(tmp_path / "two"))  # before the first build: used
    kernel = rt.build("gemm", dg_code(1))
    assert kernel.path.startswith(f"{tmp_path}/two/cache/")
    monkeypatch.setenv("DG_JIT_CACHE_DIR", str(tmp_path / "three"))  # after it: ignored
    monkeypatch.setenv("DG_JIT_CPP_STANDARD", "17")
    assert rt.build("gemm", dg_code(2)).path.startswith(f"{tmp_path}/two/cache/")
    monkeypatch.setenv("DG_JIT_CACHE_DIR", str(tmp_path / "two"))
    monkeypatch.delenv("DG_JIT_CPP_STANDARD")
    relocated = DeepGemmRuntime(moved, backend="gxx").build("gemm", dg_code(1))
    assert relocated.event == "compile" and relocated.key != kernel.key  # -I<include> is keyed


@needs_gxx
def test_deepgemm_non_standard_includes(dg_library: Path, monkeypatch: pytest.MonkeyPatch,
                                        tmp_path: Path) -> None:
    monkeypatch.setenv("DG_JIT_CACHE_DIR", str(tmp_path / "dg"))
    rt = DeepGemmRuntime(dg_library, backend="gxx")
    events = recorder(rt)
    for bad in ('#include "x.h"\n', "#include<deep_gemm/impl.cuh>\n", "#  include <cute/x>\n",
                "/* #include < deep_gemm/impl.cuh> */\n"):
        with pytest.raises(DeepGEMMError, match="Non-standard include"):
            rt.build("gemm", bad + dg_code(1), kernel_class=bad)
    assert [e["event"] for e in events] == ["error"] * 4
    # The regex sees includes inside comments: this one is tracked.
    _, tracked = rt.include_parser.tracked("// #include <deep_gemm/common.cuh>\n")
    assert set(tracked) == {"deep_gemm/common.cuh"}


@needs_gxx
def test_deepgemm_corrupted_entry_and_failed_compile(dg_library: Path,
                                                     monkeypatch: pytest.MonkeyPatch,
                                                     tmp_path: Path) -> None:
    monkeypatch.setenv("DG_JIT_CACHE_DIR", str(tmp_path / "dg"))
    kernel = DeepGemmRuntime(dg_library, backend="gxx").build("gemm", dg_code(1))
    os.remove(kernel.binary)
    with pytest.raises(DeepGEMMError, match="Corrupted JIT cache directory"):
        DeepGemmRuntime(dg_library, backend="gxx").build("gemm", dg_code(1))

    with pytest.raises(DeepGEMMError, match="NVCC compilation failed"):
        DeepGemmRuntime(dg_library, backend="gxx").build("gemm", dg_code(1) + "not C++;\n")
    [leftover] = os.listdir(tmp_path / "dg" / "tmp")
    assert re.fullmatch(UUID_DIR, leftover)
    assert os.listdir(tmp_path / "dg" / "tmp" / leftover) == ["kernel.cu"]


@pytest.mark.nvcc
@needs_nvcc
def test_deepgemm_nvcc_mode(dg_library: Path, monkeypatch: pytest.MonkeyPatch, tmp_path: Path,
                            capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.setenv("DG_JIT_CACHE_DIR", str(tmp_path / "dg"))
    monkeypatch.setenv("DG_JIT_PRINT_COMPILER_COMMAND", "1")
    rt = DeepGemmRuntime(dg_library, backend="nvcc")
    kernel = rt.build("gemm", dg_code(1))
    compiler = rt.get_compiler()
    release = re.search(r"release (\d+\.\d+)", shell_version(compiler.compiler_path))
    assert release is not None and compiler.signature == f"NVCC{release.group(1)}"
    flags = ("-std=c++20 --diag-suppress=39,161,174,177,186,940 "
             f"--ptxas-options=--register-usage-level=10 -I{dg_library}/include "
             "--gpu-architecture=sm_90a --compiler-options=-fPIC,-O3,-fconcepts,"
             "-Wno-deprecated-declarations,-Wno-abi -O3 --expt-relaxed-constexpr "
             "--expt-extended-lambda")
    assert compiler.flags == flags
    code = f"// Includes' hash value: {dg_include_hash()}\n{dg_code(1)}"
    assert kernel.key == deepgemm_hex_digest(f"gemm$${compiler.signature}$${flags}$${code}")
    assert sorted(os.listdir(kernel.path)) == ["kernel.cu", "kernel.cubin"]
    printed = capsys.readouterr().out
    command = re.search(rf"Running NVCC command: cd {re.escape(str(tmp_path))}/dg/tmp && "
                        rf"{re.escape(compiler.compiler_path)} (\S+)/kernel\.cu -cubin -o "
                        rf"(\S+)/kernel\.cubin {re.escape(flags)}\n", printed)
    assert command is not None and command.group(1) == command.group(2)
    assert re.fullmatch(rf"{re.escape(str(tmp_path))}/dg/tmp/{UUID_DIR}", command.group(1))
