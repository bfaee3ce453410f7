"""The runtime is the unit: a runtime added from outside cacheaudit (tests/toyjit: one package, one
registry line, `CACHEAUDIT_RUNTIMES=toyjit`) is picked up by the scan, explain, the audit, the
environment registry and the snapshot, with nothing else in cacheaudit changed.

Ground truth comes from the toy runtime itself and a fresh compile into an empty cache: after an
edit of a header its key does not cover, the runtime hits the old object, a fresh compile gives
another, and the scan names that header.
"""

from __future__ import annotations

import json
import os
import pickle
import subprocess
import sys
import time
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from cacheaudit import runtimes
from cacheaudit.digest import hash_file
from cacheaudit.plain import NamedTuple as PlainNamedTuple

TESTS = Path(__file__).parent
SOURCE = '#include "tile.h"\nint scaled(int x) { return x * TILE; }\n'


def _env(tmp_path: Path, cache: Path) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("DG_", "EP_", "DJ_"))}
    env.update({"CACHEAUDIT_RUNTIMES": "toyjit", "TOYJIT_CACHE_DIR": str(cache),
                "HOME": str(tmp_path / "home"), "XDG_CACHE_HOME": str(tmp_path / "xdg"),
                # Inductor's default root is $TMPDIR/torchinductor_<user>: not this machine's
                "TMPDIR": str(tmp_path),
                "CACHEAUDIT_LEDGER": str(tmp_path / "ledger.db"),
                "PYTHONPATH": os.pathsep.join([str(TESTS), env.get("PYTHONPATH", "")])})
    return env


def _cacheaudit(env: dict[str, str], *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "cacheaudit", *args], capture_output=True,
                          text=True, env=env, timeout=300)


def _toy(env: dict[str, str], include: Path) -> tuple[str, str]:
    from toyjit import runtime

    return runtime.compile("scaled", SOURCE, str(include), env)


@pytest.fixture()
def toy(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    monkeypatch.setenv("CACHEAUDIT_RUNTIMES", "toyjit")
    monkeypatch.syspath_prepend(str(TESTS))
    runtimes.reset()
    include = tmp_path / "include"
    include.mkdir()
    (include / "tile.h").write_text("#define TILE 4\n")
    cache = tmp_path / "cache"
    (tmp_path / "home").mkdir()
    yield _env(tmp_path, cache), include, cache
    monkeypatch.delenv("CACHEAUDIT_RUNTIMES")
    runtimes.reset()


def test_the_registry_reads_a_runtime_package_from_outside(toy) -> None:
    assert "toyjit" in runtimes.names()
    assert runtimes.spec("toyjit").title == "ToyJIT"
    assert runtimes.layout_for("toyjit").runtime == "toyjit"
    assert runtimes.policy_for("toyjit").runtime == "toyjit"


def test_a_stale_hit_of_the_toy_runtime_is_named_by_scan_and_explain(toy, tmp_path: Path) -> None:
    env, include, cache = toy
    entry, event = _toy(env, include)
    assert event == "compile"
    built = hash_file(os.path.join(entry, "kernel.o"))

    clean = _cacheaudit(env, "scan", "--json")
    assert clean.returncode == 0, clean.stderr
    report = json.loads(clean.stdout)
    assert report["roots"] == [{"layout": "toyjit", "root": str(cache)}]
    assert report["entries"] == 1
    assert not [f for f in report["findings"] if f["severity"] == "error"], report["findings"]

    time.sleep(0.05)
    (include / "tile.h").write_text("#define TILE 8\n")
    again, event = _toy(env, include)
    assert (again, event) == (entry, "hit")
    fresh, event = _toy(dict(env, TOYJIT_CACHE_DIR=str(tmp_path / "empty")), include)
    assert event == "compile"
    assert hash_file(os.path.join(fresh, "kernel.o")) != built  # ground truth: it is stale

    stale = _cacheaudit(env, "scan", "--json", "--fail-on", "error")
    assert stale.returncode == 1, stale.stderr
    found = json.loads(stale.stdout)["findings"]
    assert [(f["code"], f["subject"]) for f in found if f["code"] == "CA101"] == [
        ("CA101", str(include / "tile.h"))]
    assert all(f["runtime"] == "toyjit" for f in found if f["entry"])

    explained = _cacheaudit(env, "explain", entry)
    assert explained.returncode == 0, explained.stderr
    assert "toyjit" in explained.stdout and "tile.h" in explained.stdout


def test_the_environment_registry_and_the_snapshot_know_the_toy_runtime(toy) -> None:
    from cacheaudit import envvars

    env, include, cache = toy
    registry = envvars.registry()
    assert registry.classify("TOYJIT_FLAGS", "toyjit") == envvars.KeyStatus.IN_KEY
    assert registry.classify("CPATH", "toyjit") == envvars.KeyStatus.NOT_IN_KEY
    kept = registry.compile_environment({"TOYJIT_FLAGS": "-O2", "TOYJIT_SECRET_TOKEN": "x",
                                         "HOME": "/h"})
    assert kept == {"TOYJIT_FLAGS": "-O2"}
    assert registry.selects_compiler("TOYJIT_CXX")

    _toy(env, include)
    shot = _cacheaudit(env, "snapshot", "--json")
    assert shot.returncode == 0, shot.stderr
    data = json.loads(shot.stdout)
    assert str(cache) in json.dumps(data["caches"])
    assert "TOYJIT_CACHE_DIR" in data["environment"]["variables"]


def test_an_implicit_input_of_the_toy_runtime_is_reported(toy) -> None:
    env, include, _cache = toy
    _toy(env, include)
    scanned = _cacheaudit(dict(env, CPATH=str(include)), "scan", "--json")
    assert scanned.returncode == 0, scanned.stderr
    found = json.loads(scanned.stdout)["findings"]
    assert ("CA201", "CPATH") in [(f["code"], f["subject"]) for f in found]


def test_every_spec_agrees_with_the_modules_it_names() -> None:
    """The runtime id is written in the spec, the policy, the layout and the adapter: a mismatch
    would quietly make every entry CA501 "no policy" or arm an adapter for the wrong module."""
    docs = TESTS.parent / "docs"
    for declared in runtimes.specs():
        if declared.policy is not None:
            assert runtimes.policy_for(declared.name).runtime == declared.name, declared.name
        if declared.adapter is not None:
            name = declared.package.rsplit(".", 1)[-1]
            hooked = runtimes.adapter(name)
            assert (hooked.runtime, hooked.module) == (declared.name, declared.adapter_imports)
        if declared.docs:
            assert (docs / declared.docs).is_file(), declared.docs
    owned = {layout.runtime for layout in runtimes.layouts()}
    assert owned <= set(runtimes.names())


ROOT_ENVIRONMENTS = (
    {},
    {"HOME": "/home/u", "XDG_CACHE_HOME": "", "TMPDIR": "/nonexistent-tmp", "USER": "u:v"},
    {"HOME": "/home/u", "XDG_CACHE_HOME": "/xdg", "DG_JIT_CACHE_DIR": "", "DG_CACHE_DIR": "/dg",
     "EP_JIT_CACHE_DIR": "/ep", "MY_JIT_CACHE_DIR": "/my:/my2", "DJ_JIT_CACHE_DIR": "/dj:",
     "TRITON_CACHE_DIR": "", "TORCH_EXTENSIONS_DIR": "/ext", "CUPY_CACHE_DIR": "/cupy",
     "FLASHINFER_WORKSPACE_BASE": "/fi", "TORCHINDUCTOR_CACHE_DIR": "rel/ind", "LOGNAME": "l"},
    {"TRITON_HOME": "/th", "TRITON_CACHE_DIR": "/tc", "TORCH_EXTENSIONS_DIR": ""},
)


def test_the_specs_roots_modules_give_every_layouts_default_roots(toy) -> None:
    """A session reads the default roots from the specs' `roots` modules, without a reader
    (`runtimes.default_roots`): they must be exactly what the layouts' `default_roots` give,
    under environments that set each runtime's variables, none, or empty ones. ToyJIT declares
    no `roots` module: its layout is asked."""
    built_in = [s for s in runtimes.specs() if s.layout and s.package.startswith("cacheaudit.")]
    assert built_in and all(s.roots for s in built_in), [s.name for s in built_in if not s.roots]
    for env in ROOT_ENVIRONMENTS:
        env = {**env, "TOYJIT_CACHE_DIR": "/toy"}
        from_layouts = [root for layout in runtimes.layouts()
                        for root in layout.default_roots(env)]
        assert runtimes.default_roots(env) == from_layouts, env
        assert "/toy" in from_layouts


def test_a_runtime_package_that_cannot_be_read_is_left_out_and_said_once(tmp_path: Path) -> None:
    env = dict(os.environ, CACHEAUDIT_RUNTIMES="no_such_runtime:no_such_runtime",
               CACHEAUDIT_LEDGER=str(tmp_path / "ledger.db"))
    done = _cacheaudit(env, "snapshot", "--json")
    assert done.returncode == 0, done.stderr
    said = [line for line in done.stderr.splitlines() if "no_such_runtime" in line]
    assert len(said) == 1 and "left out" in said[0], done.stderr
    assert json.loads(done.stdout)["caches"] is not None


def test_a_runtime_whose_environment_contradicts_the_others_is_left_out_alone(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from cacheaudit import envvars

    package = tmp_path / "badenv_rt"
    package.mkdir()
    (package / "__init__.py").write_text("")
    (package / "spec.py").write_text(
        "from cacheaudit.spec import RuntimeSpec\n"
        "SPEC = RuntimeSpec(name='badenv', title='BadEnv', environment='environment')\n")
    (package / "environment.py").write_text(
        "from cacheaudit.envvars import variable\n"
        "ROWS = (variable('BADENV_DIR', 'cache-location', 'x', not_in_key=('deepjit',)),)\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.setenv("CACHEAUDIT_RUNTIMES", "badenv_rt")
    runtimes.reset()
    try:
        assert "deepjit" in (envvars.problem("badenv") or "")
        assert envvars.problem("deepjit") is None
        assert envvars.classify("CPATH", "deepjit") == envvars.KeyStatus.NOT_IN_KEY
        assert "BADENV_DIR" not in envvars.compile_environment({"BADENV_DIR": "/x"})
    finally:
        monkeypatch.delenv("CACHEAUDIT_RUNTIMES")
        runtimes.reset()


def test_cacheaudit_run_records_the_toy_runtime_through_its_compiler_setting(
        toy, tmp_path: Path) -> None:
    """A recording session points every spec's compiler setting at the shim: ToyJIT, told to run
    g++ by full path (TOYJIT_CXX), is recorded all the same, and a later scan ties its entry to
    that compile."""
    import shutil

    env, include, _cache = toy
    env = dict(env, TOYJIT_CXX=shutil.which("g++") or "g++")
    job = tmp_path / "job.py"
    job.write_text("import os, sys\n"
                   f"sys.path.insert(0, {str(TESTS)!r})\n"
                   "from toyjit import runtime\n"
                   f"print(runtime.compile('scaled', {SOURCE!r}, {str(include)!r}, "
                   "dict(os.environ))[1])\n")
    report = tmp_path / "report.json"
    ran = _cacheaudit(env, "run", "--report-json", str(report), "--", sys.executable, str(job))
    assert ran.returncode == 0, ran.stderr
    assert "compile" in ran.stdout
    assert json.loads(report.read_text())["events"].get("compile") == 1

    scanned = _cacheaudit(env, "scan", "--json")
    assert scanned.returncode == 0, scanned.stderr
    assert json.loads(scanned.stdout)["matched"] == 1


class _PickledSetting(PlainNamedTuple):  # type: ignore[misc, valid-type]
    """A plain named tuple at module level, as the specs' classes are: pickled by name."""

    name: str
    compiler: str = "nvcc"


_PICKLED = _PickledSetting("CXX")


def test_the_plain_named_tuple_builds_what_typing_builds() -> None:
    """`cacheaudit.plain.NamedTuple` (the specs' classes, without `typing`) against
    `typing.NamedTuple` for the same class body: fields, defaults, methods, `_replace`, repr."""
    import typing

    def body(base: type) -> type:
        class Setting(base):  # type: ignore[misc, valid-type]
            """A setting."""

            name: str
            compiler: str = "nvcc"
            unless_set: tuple[str, ...] = ()

            def shown(self) -> str:
                return f"{self.name}={self.compiler}"

        return Setting

    plain, typed = body(PlainNamedTuple), body(typing.NamedTuple)
    for cls in (plain, typed):
        value = cls("CXX", unless_set=("CC",))
        assert (value.shown(), value._replace(compiler="g++").compiler) == ("CXX=nvcc", "g++")
    assert plain._fields == typed._fields and plain._field_defaults == typed._field_defaults
    assert repr(plain("CXX")) == repr(typed("CXX")) and plain("CXX") == typed("CXX")
    assert plain.__doc__ == "A setting." and plain.__module__ == __name__
    with pytest.raises(AttributeError):
        plain("CXX").extra = 1  # type: ignore[attr-defined]
    with pytest.raises(TypeError, match="without a default"):
        class Wrong(PlainNamedTuple):  # type: ignore[misc, valid-type]
            first: int = 0
            second: int
    # Built without `collections`: the rest of namedtuple's behaviour, side by side.
    for cls in (plain, typed):
        value = cls("CXX", "g++", ("CC",))
        assert value._asdict() == {"name": "CXX", "compiler": "g++", "unless_set": ("CC",)}
        assert cls._make(["CC", "cc", ()]) == cls("CC", "cc")
        assert cls.__match_args__ == ("name", "compiler", "unless_set")
        assert hash(value) == hash(("CXX", "g++", ("CC",))) and value[1] == value.compiler
        for wrong in (lambda c=cls: c(), lambda c=cls: c("a", "b", (), "d"),
                      lambda c=cls: c("a", name="b"), lambda c=cls: c("a", other=1),
                      lambda c=cls: c._make(["a"])):
            with pytest.raises(TypeError):
                wrong()
        with pytest.raises(ValueError):
            value._replace(other=1)
    assert pickle.loads(pickle.dumps(_PICKLED)) == _PICKLED
    assert type(pickle.loads(pickle.dumps(_PICKLED))) is _PickledSetting


def test_the_plain_memo_is_functools_cache() -> None:
    """`cacheaudit.plain.memoized` (the specs' and layouts' memo, without `functools`): one call
    per distinct argument, by position or keyword, until `cache_clear()`."""
    from cacheaudit.plain import memoized

    calls: list[tuple[object, ...]] = []

    @memoized
    def twice(value: int, extra: int = 0) -> int:
        """Doubles."""
        calls.append((value, extra))
        return 2 * value + extra

    assert [twice(1), twice(1), twice(2), twice(1, extra=1), twice(1, extra=1)] == [2, 2, 4, 3, 3]
    assert calls == [(1, 0), (2, 0), (1, 1)]
    assert (twice.__name__, twice.__doc__) == ("twice", "Doubles.")
    twice.cache_clear()
    assert twice(1) == 2 and calls[-1] == (1, 0) and len(calls) == 4


@given(data=st.binary(max_size=300), seed=st.sampled_from([0, 1, 2**32 - 1, 2**63, 2**64 - 1]))
def test_the_plain_xxh64_gives_xxhash_digits(data: bytes, seed: int) -> None:
    """`cacheaudit.plain.xxh64_hexdigest` names the shared masquerade directory and the
    stand-in links without importing `xxhash`: its digits must be xxhash's, or every session
    of an upgraded installation would use a new directory (and ninja rebuild every extension
    whose command names the old one)."""
    import xxhash

    from cacheaudit.plain import xxh64_hexdigest

    assert xxh64_hexdigest(data, seed) == xxhash.xxh64_hexdigest(data, seed), (len(data), seed)


def test_the_plain_xxh64_covers_every_tail_length() -> None:
    """Every length to 100 (the 32-byte stripes, then 8-byte lanes, a 4-byte word and single
    bytes: each path of the algorithm), on bytes that are not all alike."""
    import xxhash

    from cacheaudit.plain import xxh64_hexdigest

    data = bytes((index * 131 + 7) % 256 for index in range(100))
    wrong = [size for size in range(101)
             if xxh64_hexdigest(data[:size]) != xxhash.xxh64_hexdigest(data[:size])]
    assert wrong == []


@pytest.mark.parametrize("pattern", [
    "[A-Za-z0-9_]+_JIT_NVCC_COMPILER", "A|B_X", "AB?C", "AB*", "(AB)+C", "a{2}bc", "x\\dAB",
    "\\u0041B", "(?i)ab", "ab$", "^ab", "a.b", "ABC", "(a|b)c", "a[b]c"])
def test_a_pattern_setting_matches_as_re_fullmatch_does(pattern: str) -> None:
    """`CompilerSetting.matches` skips `re` where the name does not end with the pattern's
    literal tail (`spec.literal_tail`): it must answer what `re.fullmatch` answers."""
    import itertools
    import re

    from cacheaudit.spec import CompilerSetting

    setting = CompilerSetting("<pattern>", pattern=pattern)
    compiled = re.compile(pattern)
    alphabet = ["a", "b", "c", "A", "B", "C", "X", "_", "0", "d", "_JIT_NVCC_COMPILER"]
    for size in range(4):
        for parts in itertools.product(alphabet, repeat=size):
            name = "".join(parts)
            assert setting.matches(name) == (compiled.fullmatch(name) is not None), (pattern, name)
