"""`cacheaudit evict` on a real Triton cache (sm_90 compiles on the CPU, see test_triton.py): the
stale key directory goes whole, `__grp__` file and all, the next `triton.compile` misses and
compiles, and its cubin equals a compile into an empty cache."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from test_triton import TARGET, TRITON_DIR, adapter, env, records, source, triton  # noqa: F401

from cacheaudit.exceptions import ExitCode

from support import valid_document

# test_triton skips itself (at its import) where triton or torch is missing: import triton
# through it.


def _cubin(compiled: object) -> bytes:
    return compiled.asm["cubin"]  # type: ignore[attr-defined]


def _key_dirs(cache: Path) -> set[str]:
    return {p.name for p in cache.iterdir() if p.is_dir()}


def test_evict_removes_a_triton_entry_whose_ptxas_was_replaced_in_place(
        adapter, env: Path, monkeypatch: pytest.MonkeyPatch):  # noqa: F811
    cache = env / "cache"
    ptxas = env / "bin" / "ptxas-blackwell"
    ptxas.parent.mkdir()
    shutil.copy(TRITON_DIR / "backends" / "nvidia" / "bin" / "ptxas-blackwell", ptxas)
    monkeypatch.setenv("TRITON_PTXAS_BLACKWELL_PATH", str(ptxas))
    stale = triton.compile(source(128), target=TARGET)
    stale_dirs = _key_dirs(cache)
    monkeypatch.delenv("TRITON_PTXAS_BLACKWELL_PATH")
    triton.compile(source(256), target=TARGET)  # Triton's own ptxas: untouched
    healthy_dirs = _key_dirs(cache) - stale_dirs
    assert len(stale_dirs) == len(healthy_dirs) == 1
    [stale_dir_name], [healthy_dir_name] = stale_dirs, healthy_dirs
    stale_dir = cache / stale_dir_name
    assert any(p.name.startswith("__grp__") for p in stale_dir.iterdir())
    adapter.flush()
    with open(ptxas, "ab") as handle:
        handle.write(b"\0patched")  # same path, same --version text: Triton keeps the key
    monkeypatch.setenv("TRITON_PTXAS_BLACKWELL_PATH", str(ptxas))
    healthy_files = {p.name: p.read_bytes() for p in (cache / healthy_dir_name).iterdir()}

    # The healthy entry was built without the variable now set: CA202 for it, which --select
    # leaves out; the stale one's compiler drifted (CA301).
    dry = subprocess.run([sys.executable, "-m", "cacheaudit", "evict", str(cache), "--dry-run",
                          "--json", "--ledger", str(env / "ledger.db")],
                         capture_output=True, env=dict(os.environ), timeout=300)
    chosen = {Path(o["entry"]).name: o["codes"]
              for o in valid_document(dry.stdout, "evict")["outcomes"]}
    assert "CA301" in chosen[stale_dir_name] and chosen[healthy_dir_name] == ["CA202"], chosen
    done = subprocess.run([sys.executable, "-m", "cacheaudit", "evict", str(cache), "--runtime",
                           "triton", "--select", "CA3", "--ledger", str(env / "ledger.db")],
                          capture_output=True, text=True, env=dict(os.environ), timeout=300)

    assert done.returncode == ExitCode.CLEAN, done.stdout + done.stderr
    shown = " ".join(done.stdout.split())  # the block, as wrapped at the width, unwrapped
    assert f"{stale_dir}: evicted (CA301 " in shown and f"finding CA301 {ptxas}" in shown, \
        done.stdout
    assert not stale_dir.exists(), f"the stale key directory {stale_dir} is still there"
    assert {p.name: p.read_bytes() for p in (cache / healthy_dir_name).iterdir()} == \
        healthy_files, "the healthy entry was touched"
    assert not [n for n in os.listdir(cache) if n.startswith(".cacheaudit")]

    before = len(records(env))
    again = triton.compile(source(128), target=TARGET)
    adapter.flush()
    after = records(env)[before:]
    assert [r.event for r in after] == ["compile"], "the request after the eviction hit"
    assert again.hash == stale.hash and stale_dir.is_dir()
    monkeypatch.setenv("TRITON_CACHE_DIR", str(env / "fresh"))
    fresh = triton.compile(source(128), target=TARGET)
    assert _cubin(again) == _cubin(fresh), "the rebuilt cubin differs from a fresh compile's"
