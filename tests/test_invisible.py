"""Recording is invisible: the same job, run plain (`python job.py`) and recorded (`cacheaudit run
-- python job.py`), each into an empty cache and then once more hitting it, builds the same
entries (the runtime's keys) and serves byte-identical binaries, per runtime.

Ground truth is the plain run: real compilers, real caches, real subprocesses, nothing mocked.
Each case also checks that the recorded run was recorded (a compile in the ledger by the
observer that should see it), so that "invisible" never passes because nothing looked.
The second part reproduces a session swapping the toolkit (two nvcc wrappers, one on PATH, one
as CUDA_HOME) and checks it no longer does.
"""

from __future__ import annotations

import hashlib
import importlib.util
import json
import os
import shutil
import subprocess
import sys
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from support import NVCC, needs_nvcc

ROOT = Path(__file__).resolve().parent.parent
REPLICA = ROOT / "fixtures" / "deepgemm_python"
FLASHINFER_REPLICA = ROOT / "fixtures" / "flashinfer_replica"


def _sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def _nvrtc_problem() -> str | None:
    try:
        from cuda.bindings import nvrtc

        nvrtc.nvrtcVersion()
    except Exception as exc:  # noqa: BLE001 - any failure is a reason to skip
        return f"libnvrtc cannot be loaded (pip install nvidia-cuda-nvrtc): {exc}"
    return None


def _module_problem(name: str, why: str) -> str | None:
    try:
        found = importlib.util.find_spec(name)
    except (ImportError, ValueError):
        found = None
    return None if found is not None else f"{name} is not installed: {why}"


# ------------------------------------------------------------------------------ the jobs

_PRELUDE = """\
import hashlib, json, os, sys
root = sys.argv[1]
def sha(data): return hashlib.sha256(data).hexdigest()
def done(served): print(json.dumps(served, sort_keys=True))
"""

_LIBRARY = """\
lib = os.path.join(sys.argv[2], "lib")
os.makedirs(os.path.join(lib, "include", "deep_gemm"), exist_ok=True)
with open(os.path.join(lib, "include", "deep_gemm", "impl.cuh"), "w") as handle:
    handle.write("#pragma once\\n#define IMPL_VALUE 7\\n")
CODE = ("#include <deep_gemm/impl.cuh>\\n"
        "extern \\"C\\" __global__ void k(int* out) { out[0] = IMPL_VALUE; }\\n")
"""

DEEPJIT_JOB = _PRELUDE + _LIBRARY + """\
from fixtures.minijit import Config, Runtime
os.environ["DG_JIT_CACHE_DIR"] = root
runtime = Runtime(Config(lib, "DG", include_dirs=[os.path.join(lib, "include")],
                         include_prefixes=["deep_gemm/"]), backend="nvcc")
kernel = runtime.compile("gemm", CODE)
done({os.path.basename(kernel.path): sha(open(kernel.binary, "rb").read())})
"""

DEEPGEMM_JOB = _PRELUDE + _LIBRARY + """\
from fixtures.minijit import DeepGemmRuntime
os.environ["DG_JIT_CACHE_DIR"] = root
kernel = DeepGemmRuntime(lib, backend="nvcc").build("gemm", CODE)
done({os.path.basename(kernel.path): sha(open(kernel.binary, "rb").read())})
"""

DEEPGEMM_PYTHON_JOB = _PRELUDE + """\
os.environ["DG_JIT_CACHE_DIR"] = os.environ["DG_CACHE_DIR"] = root
import deep_gemm
first = deep_gemm.fill(3)
again = deep_gemm.fill(3)      # a memory hit
assert again is first
done({os.path.basename(first.path): sha(first.load())})
"""

TORCH_JOB = _PRELUDE + """\
source = os.path.join(sys.argv[2], "plain.cpp")
with open(source, "w") as handle:
    handle.write('extern "C" int answer() { return 42; }\\n')
os.environ["TORCH_EXTENSIONS_DIR"] = root
from torch.utils.cpp_extension import load
library = load(name="plain", sources=[source], is_python_module=False)
done({os.path.basename(os.path.dirname(library)): sha(open(library, "rb").read())})
"""

INDUCTOR_JOB = _PRELUDE + """\
os.environ["TORCHINDUCTOR_CACHE_DIR"] = root
from torch._inductor.codecache import CppCodeCache
library = CppCodeCache.load('extern "C" int answer() { return 42; }\\n', needs_vec_isa=False)
done({os.path.basename(library._name): sha(open(library._name, "rb").read())})
"""

TRITON_JOB = _PRELUDE + """\
os.environ["TRITON_CACHE_DIR"] = root
import triton
import triton.language as tl
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource

@triton.jit
def add_kernel(x_ptr, y_ptr, out_ptr, n, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    tl.store(out_ptr + offs, tl.load(x_ptr + offs, mask=mask) + tl.load(y_ptr + offs, mask=mask),
             mask=mask)

signature = {"x_ptr": "*fp32", "y_ptr": "*fp32", "out_ptr": "*fp32", "n": "i32",
             "BLOCK": "constexpr"}
kernel = triton.compile(ASTSource(fn=add_kernel, signature=signature,
                                  constexprs={"BLOCK": 1024}),
                        target=GPUTarget("cuda", 90, 32))
done({kernel.hash: sha(kernel.asm["cubin"])})
"""

NVRTC_JOB = _PRELUDE + """\
from cuda.bindings import nvrtc
header = os.path.join(sys.argv[2], "value.h")
with open(header, "w") as handle:
    handle.write("#define VALUE 5\\n")
source = b'#include "value.h"\\nextern "C" __global__ void k(int* o) { o[0] = VALUE; }\\n'
err, program = nvrtc.nvrtcCreateProgram(source, os.path.join(sys.argv[2], "k.cu").encode(),
                                        0, [], [])
options = [b"--gpu-architecture=sm_90"]
(result,) = nvrtc.nvrtcCompileProgram(program, len(options), options)
assert int(result) == 0, result
_, size = nvrtc.nvrtcGetCUBINSize(program)
cubin = bytearray(size)
nvrtc.nvrtcGetCUBIN(program, cubin)
nvrtc.nvrtcDestroyProgram(program)
done({"k.cu": sha(bytes(cubin))})
"""

CUDA_CORE_JOB = _PRELUDE + """\
from cuda.core import Program, ProgramOptions
from cuda.core.utils import FileStreamProgramCache, make_program_cache_key
source = 'extern "C" __global__ void k(int* o) { o[0] = 11; }'
options = ProgramOptions(arch="sm_90", name="kernel.cu")
cache = FileStreamProgramCache(root)
code = bytes(Program(source, "c++", options=options).compile("cubin", cache=cache).code)
key = make_program_cache_key(code=source, code_type="c++", options=options, target_type="cubin")
done({key.hex() if isinstance(key, bytes) else str(key): sha(code)})
"""

CUPY_JOB = _PRELUDE + """\
os.environ["CUPY_CACHE_DIR"] = root
import cupy
kernel = cupy.RawKernel('extern "C" __global__ void k(int* o) { o[0] = 13; }', "k")
kernel.compile()
done({name: sha(open(os.path.join(root, name), "rb").read()) for name in os.listdir(root)})
"""


# FlashInfer's JIT through its own entry point (`build_and_load`), the replica package standing
# in for flashinfer-python 0.7.4 (fixtures/flashinfer_replica): under `cacheaudit run` the
# adapter puts the shim on build.ninja's nvcc_launcher line; the entry is cached_ops/<name>/.
FLASHINFER_JOB = _PRELUDE + """\
os.environ["FLASHINFER_WORKSPACE_BASE"] = root
os.environ["FLASHINFER_CUDA_ARCH_LIST"] = "9.0"
suffix = os.environ.get("JOB_SUFFIX", ".cpp")
source = os.path.join(sys.argv[2], "plain" + suffix)
if not os.path.exists(source):  # a rewrite would be a newer mtime: ninja would rebuild
    with open(source, "w") as handle:
        handle.write('extern "C" int value() { return 42; }\\n')
from flashinfer.jit import core
spec = core.gen_jit_spec("fi_plain", [source])
assert spec.build_and_load().value() == 42
done({"fi_plain": sha(open(spec.jit_library_path, "rb").read())})
"""
_FLASHINFER_PATH = os.pathsep.join([str(ROOT), str(REPLICA), str(FLASHINFER_REPLICA)])
_CUDA_HOME = next((home for home in (os.environ.get("CUDA_HOME"), "/usr/local/cuda",
                                     NVCC and os.path.dirname(os.path.dirname(NVCC)))
                   if home and os.path.exists(os.path.join(home, "lib64", "libcudart.so"))), "")
_FLASHINFER_BINARIES = ".cache/flashinfer/*/*/cached_ops/*/*.so"


def _parent(path: Path) -> str:
    return path.parent.name


def _name(path: Path) -> str:
    return path.name


@dataclass(frozen=True)
class Case:
    """One runtime's job, where its cache lives and what an entry's binary is."""

    id: str
    job: str
    binaries: str
    """Glob, under the cache root, of the entries' binaries ("" for a runtime without one)."""
    observer: str
    """Prefix of the observer whose compile records prove the recorded run was recorded."""
    entry_of: Callable[[Path], str] = _parent
    env: dict[str, str] = field(default_factory=dict)
    problem: str | None = None
    slow: bool = False
    reproducible: bool = True
    """Whether two fresh compiles give the same bytes. nvcc's host shared objects do not (they
    embed the names of nvcc's temporary files): there the keys are compared, and each mode's
    second run must serve its first run's binary."""
    recorded_event: str = "compile"
    """The event of the records that prove the recorded run was recorded: "disk-hit" where the
    session leaves the compiler alone and an adapter sees the hit (Inductor's CXX by path)."""


CASES = [
    Case("deepjit", DEEPJIT_JOB, "cache/*/kernel.cubin", "shim:",
         problem=None if NVCC else "nvcc is not on PATH"),
    Case("deepgemm-2.x", DEEPGEMM_JOB, "cache/*/kernel.cubin", "shim:",
         problem=None if NVCC else "nvcc is not on PATH"),
    Case("deepgemm-python-8dfa329", DEEPGEMM_PYTHON_JOB, "cache/*/kernel.cubin",
         "adapter:deepgemm", env={"DG_REPLICA_RELEASE": "8dfa329"},
         problem=None if NVCC else "nvcc is not on PATH"),
    # A job that puts deep_gemm on sys.path itself: the session cannot see it is installed and
    # fills the setting in; the adapter gives the runtime back the setting it would have had.
    Case("deepgemm-python-own-sys-path",
         DEEPGEMM_PYTHON_JOB.replace("import deep_gemm\n",
                                     f"sys.path.insert(0, {str(REPLICA)!r})\nimport deep_gemm\n"),
         "cache/*/kernel.cubin", "adapter:deepgemm", env={"PYTHONPATH": str(ROOT)},
         problem=None if NVCC else "nvcc is not on PATH"),
    # The first release keys the same path, through a setting the session never set; its nvcc
    # links a host shared object (slower), through the masquerade gcc/g++ on PATH.
    Case("deepgemm-python-a6d97a1", DEEPGEMM_PYTHON_JOB, "cache/*/kernel.so",
         "adapter:deepgemm", env={"DG_REPLICA_RELEASE": "a6d97a1"},
         problem=None if NVCC else "nvcc is not on PATH", slow=True, reproducible=False),
    Case("torch-ext", TORCH_JOB, "*/*.so", "adapter:torch_ext",
         problem=_module_problem("torch", "torch-ext check skipped")
         or (None if shutil.which("g++") else "g++ is not installed"), slow=True),
    Case("flashinfer-cpp", FLASHINFER_JOB, _FLASHINFER_BINARIES, "adapter:flashinfer",
         env={"PYTHONPATH": _FLASHINFER_PATH},
         problem=None if shutil.which("g++") and shutil.which("ninja") else
         "g++ or ninja is not installed"),
    # nvcc's objects are not byte-reproducible: the keys are compared. The shim launched as
    # FLASHINFER_NVCC_LAUNCHER must record nvcc and change nothing served.
    Case("flashinfer-cu", FLASHINFER_JOB, _FLASHINFER_BINARIES, "shim:",
         env={"PYTHONPATH": _FLASHINFER_PATH, "JOB_SUFFIX": ".cu", "CUDA_HOME": _CUDA_HOME,
              "LD_LIBRARY_PATH": os.path.join(_CUDA_HOME, "lib64")},
         problem=None if NVCC and shutil.which("ninja") and os.path.exists(
             os.path.join(_CUDA_HOME, "lib64", "libcudart.so")) else
         "nvcc, ninja or libcudart is missing", slow=True, reproducible=False),
    # Inductor's C++ kernel key holds the compiler's name as given: a bare g++ reaches the
    # shim through PATH; a CXX given by path is left alone (its text is keyed), and the
    # adapter sees the second run's disk hit.
    # Slow: tests/test_inductor.py's CPATH scenario compares plain and recorded keys by default.
    Case("inductor", INDUCTOR_JOB, "*/*.main.so", "shim:", entry_of=_name,
         problem=_module_problem("torch", "Inductor check skipped")
         or (None if shutil.which("g++") else "g++ is not installed"), slow=True),
    Case("inductor-cxx-by-path", INDUCTOR_JOB, "*/*.main.so", "adapter:inductor",
         entry_of=_name, env={"CXX": shutil.which("g++") or "g++"}, recorded_event="disk-hit",
         problem=_module_problem("torch", "Inductor check skipped")
         or (None if shutil.which("g++") else "g++ is not installed"), slow=True),
    Case("triton", TRITON_JOB, "*/*.cubin", "adapter:triton",
         problem=_module_problem("triton", "Triton check skipped")),
    Case("nvrtc", NVRTC_JOB, "", "adapter:nvrtc", problem=_nvrtc_problem()),
    Case("cuda-core", CUDA_CORE_JOB, "entries/*/*", "adapter:cuda_core", entry_of=_name,
         problem=_nvrtc_problem() or _module_problem("cuda.core.utils",
                                                     "cuda.core >= 1.2 checks skipped")),
    Case("cupy", CUPY_JOB, "*.cubin", "adapter:cupy", entry_of=_name,
         problem=_module_problem("cupy", "CuPy checks skipped")),
]


def _env(tmp_path: Path, extra: dict[str, str]) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("CACHEAUDIT", "DG_", "DJ_", "EP_", "PYTEST_", "NVCC_", "TRITON_",
                                "TORCH_", "CUPY_"))
           and k not in ("CPATH", "CXX", "CC", "CUDA_HOME", "CUDA_PATH", "PYTHONPATH")}
    home = tmp_path / "home"
    home.mkdir(exist_ok=True)
    env.update(HOME=str(home), XDG_CACHE_HOME=str(tmp_path / "xdg"),
               PYTHONPATH=os.pathsep.join([str(ROOT), str(REPLICA)]))
    env.update(extra)
    return env


@dataclass
class Observed:
    served: list[dict[str, str]]
    """What each of the two runs was served: entry -> sha256 of the binary it loaded."""
    disk: dict[str, str]
    """The cache after both: entry -> sha256 of its binary."""
    records: list = field(default_factory=list)


def run_job(case: Case, job: Path, env: dict[str, str], root: Path, work: Path, *,
            ledger: Path | None) -> dict[str, str]:
    argv = [sys.executable, str(job), str(root), str(work)]
    if ledger is not None:
        argv = [sys.executable, "-m", "cacheaudit", "run", "--ledger", str(ledger), "--", *argv]
    done = subprocess.run(argv, env=env, cwd=work, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, f"{case.id}: {done.stdout}\n{done.stderr}"
    answer = [line for line in done.stdout.splitlines() if line.startswith("{")]
    assert answer, f"{case.id}: the job printed no result: {done.stdout}\n{done.stderr}"
    return json.loads(answer[-1])


def observe(case: Case, tmp_path: Path, *, recorded: bool) -> Observed:
    """The job twice into one empty cache root, with or without recording; the same paths both
    ways (DeepGEMM keys its `-I` path, torch its build directory)."""
    root = tmp_path / "cache"
    work = tmp_path / "work"  # the library, headers and sources: the same paths both ways too
    for fresh in (root, work):
        shutil.rmtree(fresh, ignore_errors=True)
    work.mkdir()
    job = tmp_path / "job.py"
    job.write_text(case.job)
    env = _env(tmp_path, case.env)
    ledger = tmp_path / "ledger.db" if recorded else None
    served = [run_job(case, job, env, root, work, ledger=ledger) for _ in range(2)]
    disk = ({case.entry_of(p): _sha(p.read_bytes()) for p in root.glob(case.binaries)}
            if case.binaries else {})
    records = []
    if ledger is not None:
        from cacheaudit.ledger import Ledger, ingest_spool

        with Ledger.open(str(ledger)) as opened:
            ingest_spool(opened)
            records = opened.records()
    return Observed(served=served, disk=disk, records=records)


@pytest.mark.parametrize("case", [
    pytest.param(c, id=c.id, marks=[*([pytest.mark.slow] if c.slow else []),
                                    *([pytest.mark.skip(reason=c.problem)] if c.problem else [])])
    for c in CASES])
def test_recording_changes_no_key_and_no_served_binary(case: Case, tmp_path: Path):
    plain = observe(case, tmp_path, recorded=False)
    recorded = observe(case, tmp_path, recorded=True)

    # Ground truth first: the plain job built something and its second run hit it.
    assert plain.served[0], f"{case.id}: the plain job served nothing"
    assert plain.served[1] == plain.served[0], f"{case.id}: the second plain run did not hit"
    if case.binaries:
        assert set(plain.served[0]) <= set(plain.disk) or case.id == "triton" \
            or case.id == "cuda-core", (case.id, plain.served, plain.disk)
    # The recorded run was recorded, by the observer that should see this runtime's compiles.
    observers = sorted({r.observer for r in recorded.records if r.event == case.recorded_event})
    assert any(o.startswith(case.observer) for o in observers), (case.id, observers)

    if not case.reproducible:
        assert recorded.served[1] == recorded.served[0], f"{case.id}: the recorded rerun missed"
        assert [set(s) for s in recorded.served] == [set(s) for s in plain.served], (
            f"{case.id}: recording changed the keys: plain {plain.served}, "
            f"recorded {recorded.served}")
        assert set(recorded.disk) == set(plain.disk), (case.id, plain.disk, recorded.disk)
        return
    for run, (was, now) in enumerate(zip(plain.served, recorded.served, strict=True)):
        assert now == was, (f"{case.id}, run {run + 1}: recording changed the keys or the "
                            f"served binaries: plain {was}, recorded {now}")
    assert recorded.disk == plain.disk, (f"{case.id}: the cache differs: plain {plain.disk}, "
                                         f"recorded {recorded.disk}")


# ------------------------------------------------------------------------------ two toolkits

_TOOLKIT = """#!/bin/sh
echo "{name} $*" >> "{log}"
if [ "$1" = "--version" ]; then
    "{real}" --version
    echo "wrapper of toolkit {name}"
    exit 0
fi
exec "{real}" "$@"
"""


def _toolkit(base: Path, name: str, log: Path) -> Path:
    """A CUDA home whose bin/nvcc is a wrapper that says which toolkit ran, and whose
    `--version` differs (DeepJIT hashes all of it: the key tells the toolkits apart too)."""
    assert NVCC is not None
    nvcc = base / name / "bin" / "nvcc"
    nvcc.parent.mkdir(parents=True)
    nvcc.write_text(_TOOLKIT.format(name=name, log=log, real=os.path.realpath(NVCC)))
    nvcc.chmod(0o755)
    return nvcc.parent.parent


TOOLKIT_JOB = DEEPJIT_JOB.replace(
    'from fixtures.minijit import',
    'if os.environ.get("JOB_CUDA_HOME"):\n'
    '    os.environ["CUDA_HOME"] = os.environ["JOB_CUDA_HOME"]\n'
    'from fixtures.minijit import')


@needs_nvcc
@pytest.mark.parametrize("where", ["outside", "in-job"])
def test_a_session_runs_the_toolkit_the_runtime_would(tmp_path: Path, where: str):
    """Toolkit A is the CUDA home (set before the run, or by the job itself before it builds its
    runtime), toolkit B is first on PATH. DeepJIT takes `$CUDA_HOME/bin/nvcc`: so must the
    shim that the session's DJ_JIT_NVCC_COMPILER hands over to."""
    log = tmp_path / "toolkits.log"
    home_a = _toolkit(tmp_path / "toolkits", "A", log)
    home_b = _toolkit(tmp_path / "toolkits", "B", log)
    extra = {"PATH": os.pathsep.join([str(home_b / "bin"), os.environ.get("PATH", "")])}
    extra["CUDA_HOME" if where == "outside" else "JOB_CUDA_HOME"] = str(home_a)
    case = Case("deepjit-toolkits", TOOLKIT_JOB, "cache/*/kernel.cubin", "shim:", env=extra)

    plain = observe(case, tmp_path, recorded=False)
    ran_plain = {line.split()[0] for line in log.read_text().splitlines()}
    log.unlink()
    recorded = observe(case, tmp_path, recorded=True)
    ran_recorded = {line.split()[0] for line in log.read_text().splitlines()}

    assert ran_plain == {"A"}, ran_plain
    assert ran_recorded == {"A"}, f"the session ran toolkit {sorted(ran_recorded)}, not A"
    assert recorded.served == plain.served
    assert recorded.disk == plain.disk
    observers = {r.observer for r in recorded.records if r.event == "compile"}
    assert any(o.startswith("shim:") for o in observers), observers


def test_the_python_jit_s_setting_is_left_alone_only_where_it_is_installed(tmp_path: Path):
    """Found from the job's PYTHONPATH without importing it: the Python JIT present, the
    setting stays as the user had it (unset, or the user's own nvcc); absent, it is filled."""
    from cacheaudit.session import prepare

    env = {"PATH": os.environ.get("PATH", ""), "XDG_CACHE_HOME": str(tmp_path / "xdg"),
           "HOME": str(tmp_path)}
    with_replica = prepare({**env, "PYTHONPATH": str(REPLICA)}, ledger=str(tmp_path / "l.db"),
                           label="t")
    assert "DG_JIT_NVCC_COMPILER" not in with_replica.env
    assert "deep_gemm" not in sys.modules  # decided without importing it
    chosen = {**env, "PYTHONPATH": str(REPLICA), "DG_JIT_NVCC_COMPILER": "/opt/nvcc"}
    assert prepare(chosen, ledger=str(tmp_path / "l.db"),
                   label="t").env["DG_JIT_NVCC_COMPILER"] == "/opt/nvcc"
    if NVCC is not None:
        without = prepare(env, ledger=str(tmp_path / "l.db"), label="t")
        assert os.path.dirname(without.env["DG_JIT_NVCC_COMPILER"]) == without.shims


def test_a_filled_setting_follows_the_lookup_of_the_compile_s_environment(tmp_path: Path):
    """The shim works the filled-in setting's toolkit out when it runs, from its own
    environment: CUDA_HOME first, then PATH."""
    from cacheaudit.session import prepare

    def fake(home: Path, says: str) -> Path:
        nvcc = home / "bin" / "nvcc"
        nvcc.parent.mkdir(parents=True)
        nvcc.write_text(f"#!/bin/sh\necho {says}\n")
        nvcc.chmod(0o755)
        return home

    first, later = fake(tmp_path / "first", "first"), fake(tmp_path / "later", "later")
    env = {"PATH": os.pathsep.join([str(first / "bin"), os.environ.get("PATH", "")]),
           "XDG_CACHE_HOME": str(tmp_path / "xdg"), "HOME": str(tmp_path),
           "PYTHONPATH": str(ROOT)}
    session = prepare(env, ledger=str(tmp_path / "l.db"), label="t")
    stand_in = session.env["DJ_JIT_NVCC_COMPILER"]

    def says(**changes: str) -> str:
        done = subprocess.run([stand_in, "--version"], capture_output=True, text=True,
                              env={**session.env, **changes}, timeout=60)
        assert done.returncode == 0, done.stderr
        return done.stdout.strip()

    assert says() == "first"                       # the pinned CUDA home: PATH's toolkit
    assert says(CUDA_HOME=str(later)) == "later"   # a job that sets CUDA_HOME itself
