"""Cache-layout readers on real trees built the way the runtimes build them.

Each entry is written into `<root>/tmp/<uuid>/` and renamed whole into `cache/`, as DeepJIT and
DeepGEMM >= 7f2a703 publish; DeepJIT's `.committed` is written last before the rename and its
mtime set with os.utime, as a later disk hit would.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import pytest
import xxhash

from cacheaudit.digest import NotARegularFile, StateCache, read_file
from cacheaudit.layout import TMP_DIR_REASON, TMP_FILE_REASON, read_head
from cacheaudit.model import CacheEntry, CacheLeftover
from cacheaudit.runtimes import layout_for as reader_for
from cacheaudit.runtimes import layouts as all_readers
from cacheaudit.runtimes.deepgemm.layout import LAYOUT as DEEPGEMM
from cacheaudit.runtimes.deepgemm.layout import parse_head
from cacheaudit.runtimes.deepjit.layout import LAYOUT as DEEPJIT

from support import deadline

D1 = "0123456789abcdef0123456789abcdef"
D2 = "fedcba9876543210fedcba9876543210"
H12 = "0123456789ab"
INC = "a" * 32
COMMITTED_NS = 1_700_000_000_123_456_789
NVCC_VERSION = ("nvcc: NVIDIA (R) Cuda compiler driver\n"
                "Copyright (c) 2005-2025 NVIDIA Corporation\n"
                "Cuda compilation tools, release 12.9, V12.9.86\n")
SOURCE = b'#include <deep_gemm/impls/gemm.cuh>\nextern "C" __global__ void k() {}\n'
CUBIN = b"\x7fELF" + bytes(range(60))

_uuid_counter = iter(range(1, 1_000_000))


def _uuid() -> str:
    n = next(_uuid_counter)
    return f"4242-{n:08x}-00c0ffee-{n * 7:08x}"


def _meta(build_dir: str) -> dict[str, Any]:
    return {
        "command": f"/usr/local/cuda/bin/nvcc {build_dir}/kernel.cu --cubin --output-file "
                   f"{build_dir}/kernel.cubin -O3 --include-path /pkg/deep_gemm/include",
        "config": {"python_library_root": "/pkg/deep_gemm", "extra_signature": "cutlass-4.2",
                   "include_dirs": ["/pkg/deep_gemm/include"], "include_prefixes": ["deep_gemm/"]},
        "compiler_info": {"path": "/usr/local/cuda/bin/nvcc", "version": NVCC_VERSION},
        "compiler_options": {"arch": "sm_90a", "cpp_standard": 20},
    }


def _publish(root: Path, entry_name: str, files: dict[str, bytes | None]) -> Path:
    """Build in tmp/<uuid>/ then rename the whole directory into cache/ (no partial state)."""
    build = root / "tmp" / _uuid()
    build.mkdir(parents=True)
    for name, data in files.items():
        if data is not None:
            (build / name).write_bytes(data)
    (root / "cache").mkdir(exist_ok=True)
    final = root / "cache" / entry_name
    os.rename(build, final)
    return final


def deepjit_entry(root: Path, tag: str = "gemm_fp8", digest: str = D1, *,
                  binary: tuple[str, bytes] | None = ("kernel.cubin", CUBIN),
                  source: bytes | None = SOURCE, meta: Any = "default",
                  committed: bool = True, extra: dict[str, bytes] | None = None) -> Path:
    """An entry as DeepJIT writes it: kernel.cu, the binary, dumps, meta.json, then .committed."""
    build_dir = str(root / "tmp" / "BUILD")
    files: dict[str, bytes | None] = {"kernel.cu": source}
    if binary is not None:
        files[binary[0]] = binary[1]
    files.update(extra or {})
    if meta == "default":
        files["meta.json"] = json.dumps(_meta(build_dir)).encode()
    elif isinstance(meta, bytes):
        files["meta.json"] = meta
    elif meta is not None:
        files["meta.json"] = json.dumps(meta).encode()
    if committed:
        files[".committed"] = b""
    path = _publish(root, f"{tag}.{digest}", files)
    if committed:
        os.utime(path / ".committed", ns=(COMMITTED_NS, COMMITTED_NS))
    return path


def deepgemm_entry(root: Path, name: str = "sm90_fp8_gemm_1d2d", digest: str = D1, *,
                   source: bytes | None = None, include_hash: str | None = INC,
                   binary: tuple[str, bytes] | None = ("kernel.cubin", CUBIN),
                   extra: dict[str, bytes] | None = None) -> Path:
    """An entry as DeepGEMM writes it: kernel.cu (with its include-hash line), kernel.cubin."""
    if source is None:
        source = SOURCE
        if include_hash is not None:
            source = f"// Includes' hash value: {include_hash}\n".encode() + source
    files: dict[str, bytes | None] = {"kernel.cu": source}
    if binary is not None:
        files[binary[0]] = binary[1]
    files.update(extra or {})
    return _publish(root, f"kernel.{name}.{digest}", files)


def read_all(reader: Any, root: Path) -> list[CacheEntry | CacheLeftover]:
    return list(reader.read(str(root), StateCache()))


def entries(items: list[CacheEntry | CacheLeftover]) -> list[CacheEntry]:
    return [i for i in items if isinstance(i, CacheEntry)]


def leftovers(items: list[CacheEntry | CacheLeftover]) -> list[CacheLeftover]:
    return [i for i in items if isinstance(i, CacheLeftover)]


def only_entry(reader: Any, root: Path) -> CacheEntry:
    found = entries(read_all(reader, root))
    assert len(found) == 1, found
    return found[0]


def xxh(data: bytes) -> str:
    return xxhash.xxh3_128_hexdigest(data)


# --------------------------------------------------------------------------------------------
# DeepJIT
# --------------------------------------------------------------------------------------------

def test_healthy_deepjit_entry_has_every_field(tmp_path):
    path = deepjit_entry(tmp_path, extra={"kernel.ptx": b".version 8.8\n"})
    items = read_all(DEEPJIT, tmp_path)
    assert leftovers(items) == []
    entry = only_entry(DEEPJIT, tmp_path)
    assert entry.runtime == "deepjit" and entry.layout == "deepjit"
    assert entry.root == str(tmp_path) and entry.path == str(path)
    assert (entry.kernel, entry.key) == ("gemm_fp8", D1)
    assert entry.binary is not None and entry.source is not None
    assert entry.binary.path == str(path / "kernel.cubin")
    assert entry.binary.digest == xxh(CUBIN) and entry.binary.size == len(CUBIN)
    assert entry.source.path == str(path / "kernel.cu")
    assert entry.source.digest == xxh(SOURCE)
    assert entry.binary.mtime_ns == os.stat(path / "kernel.cubin").st_mtime_ns
    assert entry.built_ns == entry.binary.mtime_ns
    assert entry.committed_ns == COMMITTED_NS
    assert entry.meta == _meta(str(tmp_path / "tmp" / "BUILD"))
    assert entry.meta["compiler_info"]["version"] == NVCC_VERSION
    assert entry.files == (".committed", "kernel.cu", "kernel.cubin", "kernel.ptx", "meta.json")
    assert entry.include_hash is None
    assert entry.problems == ()


def test_a_disk_hit_moves_committed_ns(tmp_path):
    path = deepjit_entry(tmp_path)
    assert only_entry(DEEPJIT, tmp_path).committed_ns == COMMITTED_NS
    later = COMMITTED_NS + 3_600_000_000_000
    os.utime(path / ".committed", ns=(later, later))  # what try_update_mtime does on a hit
    assert only_entry(DEEPJIT, tmp_path).committed_ns == later


def test_reference_runtime_gxx_mode_binary_is_kernel_so(tmp_path):
    deepjit_entry(tmp_path, binary=("kernel.so", b"\x7fELF shared object"))
    entry = only_entry(DEEPJIT, tmp_path)
    assert entry.binary is not None and entry.binary.path.endswith("/kernel.so")
    assert entry.binary.digest == xxh(b"\x7fELF shared object")
    assert entry.problems == ()


def test_rocm_backend_files(tmp_path):
    deepjit_entry(tmp_path, binary=("kernel.hsaco", b"hsaco"), source=None,
                  extra={"kernel.hip": b"__global__ void k() {}\n", "compiler.log": b""})
    entry = only_entry(DEEPJIT, tmp_path)
    assert entry.binary is not None and entry.binary.path.endswith("/kernel.hsaco")
    assert entry.source is not None and entry.source.path.endswith("/kernel.hip")
    assert entry.problems == ()


def _one_problem(entry: CacheEntry, *needles: str) -> str:
    assert len(entry.problems) == 1, entry.problems
    problem = entry.problems[0]
    for needle in needles:
        assert needle in problem, problem
    return problem


def test_uncommitted_entry_is_yielded_as_partial(tmp_path):
    deepjit_entry(tmp_path, committed=False)
    entry = only_entry(DEEPJIT, tmp_path)
    assert entry.committed_ns is None
    assert entry.binary is not None and entry.binary.digest == xxh(CUBIN)
    _one_problem(entry, ".committed", "miss", "failed to publish disk cache entry")


def test_empty_uncommitted_directory(tmp_path):
    (tmp_path / "cache" / f"gemm.{D1}").mkdir(parents=True)
    entry = only_entry(DEEPJIT, tmp_path)
    assert entry.files == ()
    assert any("empty directory" in p and ".committed" in p for p in entry.problems)
    assert any("kernel.cubin is missing" in p for p in entry.problems)


def test_missing_binary(tmp_path):
    deepjit_entry(tmp_path, binary=None)
    entry = only_entry(DEEPJIT, tmp_path)
    assert entry.binary is not None and not entry.binary.exists
    assert entry.built_ns is None
    _one_problem(entry, "kernel.cubin is missing", "hit")


def test_empty_binary(tmp_path):
    deepjit_entry(tmp_path, binary=("kernel.cubin", b""))
    entry = only_entry(DEEPJIT, tmp_path)
    _one_problem(entry, "kernel.cubin is empty")


def test_missing_source(tmp_path):
    deepjit_entry(tmp_path, source=None)
    entry = only_entry(DEEPJIT, tmp_path)
    assert entry.source is not None and not entry.source.exists
    _one_problem(entry, "kernel.cu is missing")


def test_missing_meta(tmp_path):
    deepjit_entry(tmp_path, meta=None)
    entry = only_entry(DEEPJIT, tmp_path)
    assert entry.meta == {}
    _one_problem(entry, "meta.json is missing")


@pytest.mark.parametrize("raw", [b'{"command": "nvcc', b"\xff\xfe garbage", b""])
def test_unparseable_meta(tmp_path, raw):
    deepjit_entry(tmp_path, meta=raw)
    entry = only_entry(DEEPJIT, tmp_path)
    assert entry.meta == {}
    _one_problem(entry, "meta.json is not valid JSON")


def test_meta_that_is_not_an_object(tmp_path):
    deepjit_entry(tmp_path, meta=["command"])
    _one_problem(only_entry(DEEPJIT, tmp_path), "meta.json holds a JSON list")


def test_meta_lacking_expected_keys_names_them(tmp_path):
    meta = _meta("/b")
    del meta["compiler_options"]
    del meta["compiler_info"]["version"]
    del meta["config"]["extra_signature"]
    deepjit_entry(tmp_path, meta=meta)
    entry = only_entry(DEEPJIT, tmp_path)
    assert entry.meta == meta  # what was parsed is still handed over
    _one_problem(entry, "meta.json lacks", "compiler_options", "compiler_info.version",
                 "config.extra_signature")


def test_several_problems_are_all_reported(tmp_path):
    deepjit_entry(tmp_path, committed=False, binary=None, source=None, meta=None)
    problems = only_entry(DEEPJIT, tmp_path).problems
    assert len(problems) == 4
    for needle in (".committed", "kernel.cubin", "kernel.cu is", "meta.json"):
        assert any(needle in p for p in problems), needle


def test_deepjit_leftovers(tmp_path):
    deepjit_entry(tmp_path)
    crashed = tmp_path / "tmp" / "4242-deadbeef-00000000-11111111"
    crashed.mkdir(parents=True)
    (crashed / "kernel.cu").write_bytes(SOURCE)
    stale_ns = 1_600_000_000_000_000_000
    os.utime(crashed, ns=(stale_ns, stale_ns))
    (tmp_path / "tmp" / "stray.tmp").write_bytes(b"x")
    (tmp_path / "cache" / "not-an-entry").mkdir()
    (tmp_path / "cache" / f"gemm.{D1[:31]}").mkdir()        # digest one digit short
    (tmp_path / "cache" / f"gemm.{D1.upper()}").mkdir()     # DeepJIT writes lowercase only
    (tmp_path / "cache" / "README").write_text("hello")
    os.symlink(tmp_path / "nowhere", tmp_path / "cache" / f"dangling.{D2}")

    items = read_all(DEEPJIT, tmp_path)
    assert len(entries(items)) == 1
    by_path = {Path(x.path).relative_to(tmp_path).as_posix(): x for x in leftovers(items)}
    assert set(by_path) == {
        "tmp/4242-deadbeef-00000000-11111111", "tmp/stray.tmp", "cache/not-an-entry",
        f"cache/gemm.{D1[:31]}", f"cache/gemm.{D1.upper()}", "cache/README",
        f"cache/dangling.{D2}"}
    tmp_dir = by_path["tmp/4242-deadbeef-00000000-11111111"]
    assert tmp_dir.reason == TMP_DIR_REASON and tmp_dir.mtime_ns == stale_ns
    assert (tmp_dir.runtime, tmp_dir.layout, tmp_dir.root) == ("deepjit", "deepjit", str(tmp_path))
    assert by_path["tmp/stray.tmp"].reason == TMP_FILE_REASON
    assert "<tag>.<32 hex digest>" in by_path["cache/not-an-entry"].reason
    assert "directly in cache/" in by_path["cache/README"].reason
    assert "dangling symlink" in by_path[f"cache/dangling.{D2}"].reason
    for leftover in by_path.values():
        assert leftover.mtime_ns > 0


def test_symlinked_entry_inside_the_cache_is_read_silently(tmp_path):
    real = deepjit_entry(tmp_path, digest=D1)
    os.symlink(real, tmp_path / "cache" / f"alias.{D2}")
    found = entries(read_all(DEEPJIT, tmp_path))
    assert [e.kernel for e in found] == ["alias", "gemm_fp8"]
    assert found[0].binary is not None and found[0].binary.digest == xxh(CUBIN)
    assert all(e.problems == () for e in found)


def test_symlinks_out_of_the_cache_are_followed_and_said(tmp_path):
    root = tmp_path / "root"
    elsewhere = deepjit_entry(tmp_path / "other")
    (root / "cache").mkdir(parents=True)
    os.symlink(elsewhere, root / "cache" / f"linked.{D1}")
    entry = only_entry(DEEPJIT, root)
    assert entry.binary is not None and entry.binary.digest == xxh(CUBIN)
    _one_problem(entry, "symlink", str(elsewhere.resolve()), "outside the cache")

    shared = tmp_path / "shared.cubin"
    shared.write_bytes(CUBIN)
    path = deepjit_entry(root, tag="own", digest=D2, binary=None)
    os.symlink(shared, path / "kernel.cubin")
    own = next(e for e in entries(read_all(DEEPJIT, root)) if e.kernel == "own")
    assert own.binary is not None and own.binary.digest == xxh(CUBIN)
    _one_problem(own, "kernel.cubin is a symlink", str(shared.resolve()))


def test_deepjit_entries_are_sorted_by_path(tmp_path):
    for tag, digest in (("zeta", D1), ("alpha", D2), ("mid", D1), ("alpha", D1)):
        deepjit_entry(tmp_path, tag=tag, digest=digest)
    (tmp_path / "tmp" / "0-00000000-00000000-00000000").mkdir()
    items = read_all(DEEPJIT, tmp_path)
    paths = [i.path for i in items]
    assert paths == sorted(paths)
    assert [(e.kernel, e.key) for e in entries(items)] == [
        ("alpha", D1), ("alpha", D2), ("mid", D1), ("zeta", D1)]


def test_missing_root_or_cache_yields_nothing(tmp_path):
    assert read_all(DEEPJIT, tmp_path / "absent") == []
    assert read_all(DEEPGEMM, tmp_path / "absent") == []
    (tmp_path / "tmp").mkdir()
    assert read_all(DEEPJIT, tmp_path) == []


# --------------------------------------------------------------------------------------------
# DeepGEMM / DeepEP
# --------------------------------------------------------------------------------------------

def test_healthy_deepgemm_entry_has_every_field(tmp_path):
    path = deepgemm_entry(tmp_path, extra={"kernel.sass": b"SASS"})
    source = f"// Includes' hash value: {INC}\n".encode() + SOURCE
    assert leftovers(read_all(DEEPGEMM, tmp_path)) == []
    entry = only_entry(DEEPGEMM, tmp_path)
    assert entry.runtime == "deepgemm" and entry.layout == "deepgemm"
    assert entry.root == str(tmp_path) and entry.path == str(path)
    assert (entry.kernel, entry.key) == ("sm90_fp8_gemm_1d2d", D1)
    assert entry.binary is not None and entry.source is not None
    assert entry.binary.path == str(path / "kernel.cubin")
    assert entry.binary.digest == xxh(CUBIN)
    assert entry.source.digest == xxh(source)
    assert entry.include_hash == INC
    assert entry.committed_ns is None and entry.meta == {}
    assert entry.files == ("kernel.cu", "kernel.cubin", "kernel.sass")
    assert entry.problems == ()


def test_entry_from_before_7f2a703_has_no_include_hash(tmp_path):
    deepgemm_entry(tmp_path, include_hash=None)
    entry = only_entry(DEEPGEMM, tmp_path)
    assert entry.include_hash is None and entry.problems == ()


def test_include_hash_line_parsing():
    assert parse_head(f"// Includes' hash value: {INC}\r\n#include <x>\n".encode())[0] == INC
    assert parse_head(f"// Includes' hash value: {INC}".encode())[0] == INC
    assert parse_head(b"#include <deep_gemm/a.cuh>\n") == (None, None, False)
    include_hash, problem, _ = parse_head(b"// Includes' hash value: nothex\n")
    assert include_hash is None and problem is not None and "'nothex'" in problem
    # Not on the first line: not DeepGEMM's line.
    assert parse_head(f"\n// Includes' hash value: {INC}\n".encode())[0] is None


def test_malformed_include_hash_is_a_problem(tmp_path):
    deepgemm_entry(tmp_path, include_hash="12345")
    entry = only_entry(DEEPGEMM, tmp_path)
    assert entry.include_hash is None
    _one_problem(entry, "include-hash line", "'12345'")


def test_deepep_entries_are_told_apart_by_their_tracked_includes(tmp_path):
    source = (f"// Includes' hash value: {INC}\n#include <nccl.h>\n"
              "#include <deep_ep/impls/dispatch.cuh>\n").encode()
    deepgemm_entry(tmp_path, name="dispatch", source=source)
    entry = only_entry(DEEPGEMM, tmp_path)
    assert entry.runtime == "deepep" and entry.layout == "deepgemm"
    assert entry.include_hash == INC and entry.problems == ()


def test_python_jit_entry_with_a_12_hex_hash(tmp_path):
    deepgemm_entry(tmp_path, name="gemm_fp8_fp8_bf16_nt", digest=H12, include_hash=None)
    entry = only_entry(DEEPGEMM, tmp_path)
    assert (entry.kernel, entry.key) == ("gemm_fp8_fp8_bf16_nt", H12)
    assert entry.problems == ()


def test_early_python_jit_entry_with_kernel_so_and_args(tmp_path):
    deepgemm_entry(tmp_path, name="gemm", digest=H12, include_hash=None,
                   binary=("kernel.so", b"\x7fELF so"), extra={"kernel.args": b"('lhs', ...)"})
    entry = only_entry(DEEPGEMM, tmp_path)
    assert entry.binary is not None and entry.binary.path.endswith("/kernel.so")
    assert entry.binary.digest == xxh(b"\x7fELF so")
    assert entry.files == ("kernel.args", "kernel.cu", "kernel.so")
    assert entry.problems == ()


@pytest.mark.parametrize("missing", ["kernel.cubin", "kernel.cu"])
def test_cpp_jit_entry_missing_a_file_quotes_the_corrupted_directory_assert(tmp_path, missing):
    if missing == "kernel.cubin":
        deepgemm_entry(tmp_path, binary=None)
    else:
        deepgemm_entry(tmp_path, source=None)
        os.remove(tmp_path / "cache" / f"kernel.sm90_fp8_gemm_1d2d.{D1}" / "kernel.cu")
    entry = only_entry(DEEPGEMM, tmp_path)
    _one_problem(entry, f"{missing} is missing", "Corrupted JIT cache directory",
                 "check_validity")


def test_python_jit_entry_missing_its_binary_is_rebuilt_in_place(tmp_path):
    deepgemm_entry(tmp_path, digest=H12, include_hash=None, binary=None)
    _one_problem(only_entry(DEEPGEMM, tmp_path), "kernel.cubin is missing", "is_path_valid",
                 "in place")


def test_empty_deepgemm_binary(tmp_path):
    deepgemm_entry(tmp_path, binary=("kernel.cubin", b""))
    _one_problem(only_entry(DEEPGEMM, tmp_path), "kernel.cubin is empty")


def test_deepgemm_leftovers(tmp_path):
    deepgemm_entry(tmp_path)
    (tmp_path / "tmp" / "77-0badf00d-00000000-00000001").mkdir()
    (tmp_path / "tmp" / "77-0badf00d-00000000-00000002").write_bytes(b"cubin half")  # < 7f2a703
    (tmp_path / "tmp" / f"nvcc.tmp.9b2f7c1e-1111-4222-8333-444455556666.{H12}.cubin").write_bytes(
        b"")
    (tmp_path / "cache" / "kernel.only_two_parts").mkdir()
    (tmp_path / "cache" / "stray.cubin").write_bytes(b"x")
    by_name = {os.path.basename(x.path): x for x in leftovers(read_all(DEEPGEMM, tmp_path))}
    assert by_name["77-0badf00d-00000000-00000001"].reason == TMP_DIR_REASON
    assert by_name["77-0badf00d-00000000-00000002"].reason == TMP_FILE_REASON
    python_tmp = [v for k, v in by_name.items() if k.startswith("nvcc.tmp.")]
    assert len(python_tmp) == 1 and "Python JIT" in python_tmp[0].reason
    assert "kernel.<name>.<hash>" in by_name["kernel.only_two_parts"].reason
    assert "directly in cache/" in by_name["stray.cubin"].reason
    assert len(by_name) == 5
    assert all(x.runtime == "deepgemm" and x.layout == "deepgemm" for x in by_name.values())


def test_deepgemm_entries_are_sorted_by_path(tmp_path):
    for name, digest in (("b", D1), ("a", D2), ("a", D1), ("c", H12)):
        deepgemm_entry(tmp_path, name=name, digest=digest)
    found = entries(read_all(DEEPGEMM, tmp_path))
    assert [(e.kernel, e.key) for e in found] == [("a", D1), ("a", D2), ("b", D1), ("c", H12)]


# --------------------------------------------------------------------------------------------
# Roots
# --------------------------------------------------------------------------------------------

def test_deepjit_default_roots_per_prefix_with_dj_fallback():
    env = {"HOME": "/home/u", "DG_JIT_CACHE_DIR": "/fast/dg", "DJ_JIT_CACHE_DIR": "/shared/dj"}
    # DG has its own; EP falls back to DJ_; DJ itself is DJ_.
    assert DEEPJIT.default_roots(env) == ["/fast/dg", "/shared/dj"]


def test_deepjit_default_roots_colon_lists_keep_order_and_dedupe():
    env = {"HOME": "/home/u", "DG_JIT_CACHE_DIR": "/w/dg:/ro/one:/ro/two/",
           "EP_JIT_CACHE_DIR": "/ro/one:/w/ep"}
    assert DEEPJIT.default_roots(env) == [
        "/w/dg", "/ro/one", "/ro/two", "/w/ep", "/home/u/.dj"]


def test_deepjit_default_roots_home_default_and_no_home():
    assert DEEPJIT.default_roots({"HOME": "/home/u"}) == ["/home/u/.dj"]
    assert DEEPJIT.default_roots({}) == []
    assert DEEPJIT.default_roots({"DJ_JIT_CACHE_DIR": "/dj"}) == ["/dj"]


def test_deepjit_default_roots_empty_prefixed_value_does_not_fall_back():
    # DeepJIT's Env takes a set-but-empty <P>_ value (and then panics on the empty path).
    env = {"HOME": "/home/u", "DG_JIT_CACHE_DIR": "", "DJ_JIT_CACHE_DIR": "/dj"}
    assert DEEPJIT.default_roots(env) == ["/dj"]
    assert DEEPJIT.default_roots({"HOME": "/h", "DG_JIT_CACHE_DIR": "/a::/b"})[:2] == ["/a", "/b"]


def test_deepgemm_default_roots():
    home = {"HOME": "/home/u"}
    assert DEEPGEMM.default_roots(home) == ["/home/u/.deep_gemm", "/home/u/.deep_ep"]
    assert DEEPGEMM.default_roots({**home, "DG_JIT_CACHE_DIR": "/c/dg", "EP_JIT_CACHE_DIR": "/c/ep"}
                                  ) == ["/c/dg", "/c/ep"]
    # An empty value counts as unset, as in the C++ JIT.
    assert DEEPGEMM.default_roots({**home, "DG_JIT_CACHE_DIR": ""})[0] == "/home/u/.deep_gemm"
    # DJ_ is DeepJIT's: DeepGEMM <= 2.6 never reads it.
    assert DEEPGEMM.default_roots({**home, "DJ_JIT_CACHE_DIR": "/dj"})[0] == "/home/u/.deep_gemm"
    assert DEEPGEMM.default_roots({}) == []


def test_deepgemm_default_roots_legacy_dg_cache_dir():
    env = {"HOME": "/home/u", "DG_CACHE_DIR": "/old/dg"}
    # The pre-rename Python JIT wrote to /old/dg; a newer DeepGEMM ignores it and writes home.
    assert DEEPGEMM.default_roots(env) == ["/old/dg", "/home/u/.deep_gemm", "/home/u/.deep_ep"]
    assert DEEPGEMM.default_roots({**env, "DG_JIT_CACHE_DIR": "/new"})[0] == "/new"


def test_is_root_tells_the_layouts_apart(tmp_path):
    dj, dg, mixed, fresh, py, empty = (tmp_path / n for n in
                                       ("dj", "dg", "mixed", "fresh", "py", "empty"))
    deepjit_entry(dj)
    deepgemm_entry(dg)
    deepjit_entry(mixed)
    deepgemm_entry(mixed)
    (fresh / "cache").mkdir(parents=True)
    (fresh / "tmp" / "99-00000000-11111111-22222222").mkdir(parents=True)
    (py / "cache").mkdir(parents=True)
    (py / "tmp").mkdir()
    (py / "tmp" / f"file.tmp.9b2f7c1e-1111-4222-8333-444455556666.{H12}").write_bytes(b"")
    (empty / "cache").mkdir(parents=True)

    assert DEEPJIT.is_root(str(dj)) and not DEEPGEMM.is_root(str(dj))
    assert DEEPGEMM.is_root(str(dg)) and not DEEPJIT.is_root(str(dg))
    # One DG_JIT_CACHE_DIR read by DeepGEMM 2.6 and then 2.8 holds both layouts.
    assert DEEPJIT.is_root(str(mixed)) and DEEPGEMM.is_root(str(mixed))
    # Build directories only: both runtimes make them alike, so both readers claim the root.
    assert DEEPJIT.is_root(str(fresh)) and DEEPGEMM.is_root(str(fresh))
    assert DEEPGEMM.is_root(str(py)) and not DEEPJIT.is_root(str(py))
    for path in (empty, tmp_path / "absent", dj / "cache"):
        assert not DEEPJIT.is_root(str(path)) and not DEEPGEMM.is_root(str(path))


def test_a_mixed_root_gives_each_reader_its_own_entries_and_no_false_leftovers(tmp_path):
    deepjit_entry(tmp_path, tag="fp8_gemm")
    deepgemm_entry(tmp_path, name="fp8_gemm")
    dj = read_all(DEEPJIT, tmp_path)
    dg = read_all(DEEPGEMM, tmp_path)
    assert [e.layout for e in dj] == ["deepjit"] and [e.layout for e in dg] == ["deepgemm"]


def test_registry_finds_both_readers():
    assert reader_for("deepjit") is DEEPJIT and reader_for("deepgemm") is DEEPGEMM
    assert [r.layout for r in all_readers()][:2] == ["deepjit", "deepgemm"]


# --------------------------------------------------------------------------------------------
# Scale and read-only
# --------------------------------------------------------------------------------------------

def test_a_2000_entry_tree_reads_without_error(tmp_path):
    n = 2000
    meta = json.dumps(_meta("/b")).encode()
    cache_dir = tmp_path / "cache"
    cache_dir.mkdir()
    for i in range(n):
        entry = cache_dir / f"k{i % 7}.{i:032x}"
        entry.mkdir()
        (entry / "kernel.cu").write_bytes(SOURCE + str(i).encode())
        (entry / "kernel.cubin").write_bytes(CUBIN + str(i).encode())
        (entry / "meta.json").write_bytes(meta)
        (entry / ".committed").write_bytes(b"")
    cache = StateCache()
    found = entries(list(DEEPJIT.read(str(tmp_path), cache)))
    assert len(found) == n
    assert all(e.problems == () for e in found)
    assert [e.path for e in found] == sorted(e.path for e in found)
    assert len({e.binary.digest for e in found if e.binary is not None}) == n


def _snapshot(root: Path) -> dict[str, tuple[int, int]]:
    out = {}
    for dirpath, dirnames, filenames in os.walk(root):
        for name in dirnames + filenames + ["."]:
            path = os.path.join(dirpath, name)
            st = os.lstat(path)
            out[path] = (st.st_mtime_ns, st.st_size)
    return out


def test_readers_never_modify_the_tree(tmp_path):
    deepjit_entry(tmp_path, tag="a", digest=D1)
    deepjit_entry(tmp_path, tag="b", digest=D2, committed=False, meta=b"{bad")
    deepgemm_entry(tmp_path, name="c", digest=D1)
    deepgemm_entry(tmp_path, name="d", digest=H12, binary=None)
    (tmp_path / "tmp" / "1-00000000-00000000-00000000").mkdir()
    (tmp_path / "cache" / "odd").mkdir()
    committed = tmp_path / "cache" / f"a.{D1}" / ".committed"
    before = _snapshot(tmp_path)
    assert str(committed) in before and before[str(committed)][0] == COMMITTED_NS
    for reader in all_readers():
        reader.is_root(str(tmp_path))
        reader.default_roots({"HOME": str(tmp_path)})
        list(reader.read(str(tmp_path), StateCache()))
    assert _snapshot(tmp_path) == before


# ============================================================================================
# Review fixes: mistyped meta.json fields, FIFOs and devices in a cache, shared helpers
# ============================================================================================



def _fifo_instead(path: Path) -> Path:
    """Replace a file by a FIFO of the same name (nobody ever writes to it)."""
    path.unlink(missing_ok=True)
    os.mkfifo(path)
    return path


def test_mistyped_meta_fields_are_corrupt_not_silently_used(tmp_path):
    meta = _meta(str(tmp_path / "tmp" / "BUILD"))
    meta["config"]["include_dirs"] = [1]
    meta["config"]["include_prefixes"] = "deep_gemm/"
    meta["compiler_info"]["version"] = 12.9
    meta["compiler_options"] = ["-O3"]
    deepjit_entry(tmp_path, meta=meta)
    problem = _one_problem(only_entry(DEEPJIT, tmp_path), "meta.json lacks")
    for named in ("config.include_dirs (a JSON list, not a list of strings)",
                  "config.include_prefixes (a JSON str, not a list of strings)",
                  "compiler_info.version (a JSON float, not a string)",
                  "compiler_options (a JSON list, not an object)"):
        assert named in problem


def test_read_file_refuses_fifos_and_devices_without_blocking(tmp_path):
    fifo = _fifo_instead(tmp_path / "pipe")
    with deadline(), pytest.raises(NotARegularFile):
        read_file(str(fifo))
    with deadline(), pytest.raises(NotARegularFile):
        read_file("/dev/zero")  # a read that would never end
    assert read_head(str(fifo)) is None
    data = b"line one\r\nline two\r\n\x00\xff"
    (tmp_path / "crlf.h").write_bytes(data)
    assert read_file(str(tmp_path / "crlf.h")) == data  # byte for byte, CRs kept
    assert read_file(str(tmp_path / "crlf.h"), 4) == data[:4]
    assert read_file(str(tmp_path / "crlf.h"), 0) == b""


def test_fifo_meta_json_is_evidence_not_a_hang(tmp_path):
    entry_dir = deepjit_entry(tmp_path)
    _fifo_instead(entry_dir / "meta.json")
    with deadline():
        entry = only_entry(DEEPJIT, tmp_path)
    _one_problem(entry, "meta.json cannot be read", "not a regular file")


def test_fifo_source_is_evidence_not_a_hang(tmp_path):
    _fifo_instead(deepjit_entry(tmp_path) / "kernel.cu")
    _fifo_instead(deepgemm_entry(tmp_path / "dg") / "kernel.cu")
    with deadline():
        jit = only_entry(DEEPJIT, tmp_path)
        gemm = only_entry(DEEPGEMM, tmp_path / "dg")
    _one_problem(jit, "kernel.cu cannot be read", "not a regular file")
    assert any("kernel.cu cannot be read" in p and "not a regular file" in p
               for p in gemm.problems), gemm.problems


def test_fifo_triton_metadata_and_group_are_evidence_not_a_hang(tmp_path):
    from cacheaudit.runtimes.triton.policy import base32_name

    key = "ab" * 32
    directory = tmp_path / base32_name(key)
    directory.mkdir()
    (directory / "k.cubin").write_bytes(CUBIN)
    os.mkfifo(directory / "k.json")
    os.mkfifo(directory / "__grp__k.json")
    with deadline():
        entry = only_entry(reader_for("triton"), tmp_path)
    assert [p for p in entry.problems if "not a regular file" in p] == [
        "k.json cannot be read: NotARegularFile: not a regular file",
        "__grp__k.json cannot be read: NotARegularFile: not a regular file"]


def test_fifo_cupy_entry_is_evidence_not_a_hang(tmp_path):
    digest = "0123456789abcdef0123456789abcdef01234567"
    os.mkfifo(tmp_path / f"{digest}.cubin")
    (tmp_path / f"{digest}.cubin.cu").write_bytes(b"extern \"C\" __global__ void k() {}\n")
    with deadline():
        entry = only_entry(reader_for("cupy"), tmp_path)
    assert any("cannot be read" in p and "not a regular file" in p for p in entry.problems)



def test_deepjit_command_forms_give_the_same_argv():
    # DeepJIT up to e5bdee2 joins the words with spaces; since 24eb539 each word is quoted.
    from cacheaudit.runtimes.deepjit.policy import command_flags, command_words

    argv = ["/usr/local/cuda/bin/nvcc", "/r/tmp/1-a/kernel.cu", "--cubin", "--output-file",
            "/r/tmp/1-a/kernel.cubin", "-O3", "--include-path", "/it's here"]
    joined = " ".join([*argv[:-2], "--include-path", "/inc"])
    quoted = " ".join("'" + w.replace("'", "'\\''") + "'" for w in argv)
    assert command_words(joined)[0] == [*argv[:-1], "/inc"]
    assert command_words(quoted)[0] == argv
    assert command_words("HIP_PLATFORM=amd " + quoted)[0] == argv  # the ROCm backend's prefix
    assert command_flags(quoted, ["/it's here"]) == ["-O3"]
    words, why = command_words("'/usr/bin/nvcc' 'kernel.cu")
    assert words is None and "unbalanced" in why


def test_deepjit_s_rocm_entries_are_judged_by_the_rocm_backend_s_key(tmp_path: Path) -> None:
    """DeepJIT's two backends key different variables: the CUDA backend's key leaves CPATH out
    (its README: "not discovered automatically"), the ROCm backend's `CompilerInfo::get_hash`
    (backend/rocm/backend.hpp) hashes CPATH, CPLUS_INCLUDE_PATH and C_INCLUDE_PATH. A CPATH
    that differs from the build's is CA202 on the CUDA entry, whose hit it does not stop, and
    nothing on the ROCm entry (`kernel.hsaco`, meta.json's backend), where it makes a miss."""
    from cacheaudit.audit.checks.environment import environment_findings
    from cacheaudit.audit.context import AuditContext
    from cacheaudit.model import CompileRecord
    from cacheaudit.runtimes import policy_for

    cuda = deepjit_entry(tmp_path, "gemm_cuda", D1)
    meta = dict(_meta(str(tmp_path / "tmp" / "BUILD")), backend="ROCm")
    rocm = deepjit_entry(tmp_path, "gemm_rocm", D2, binary=("kernel.hsaco", CUBIN), source=None,
                         meta=meta, extra={"kernel.hip": SOURCE})
    entries = {e.path: e for e in DEEPJIT.read(str(tmp_path), StateCache())
               if isinstance(e, CacheEntry)}
    assert set(entries) == {str(cuda), str(rocm)}
    assert entries[str(rocm)].binary.path == str(rocm / "kernel.hsaco")
    policy = policy_for("deepjit")
    flagged = {}
    for path, entry in entries.items():
        record = CompileRecord(record_id="r", event="compile", started_ns=1, duration_ns=0,
                               runtime="deepjit", entry=path,
                               env={"CPATH": str(tmp_path / "include")})
        flagged[os.path.basename(path)] = {
            f.subject for f in environment_findings(AuditContext(env={}), entry, record, policy)
            if f.code == "CA202"}
    assert flagged == {f"gemm_cuda.{D1}": {"CPATH"}, f"gemm_rocm.{D2}": set()}, flagged
