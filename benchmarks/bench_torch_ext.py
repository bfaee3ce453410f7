"""The torch-ext adapter on a `load` with no work to do, against torch alone, in one run.

Budget (DESIGN.md, "a disk hit seen by an adapter"): at most 5% over the runtime's own hit path.
torch's hit path in a new process is the process itself: import torch, `load()` (the versioner
wants a build, torch rewrites build.ninja, checks the compiler's version, runs ninja, which says
"no work to do", and loads the library). Each sample is one new Python process, alternating
bare and with the adapter armed (`runtimes.activate(["torch_ext"])` before torch is imported, as
the start-up hook does), so that load drift hits both sides alike.

Importing torch varies by a few hundred milliseconds from one process to the next on a busy
machine, more than the adapter costs, so each child also times its own segments: arming the
adapter, `load()`, and storing the record (the ledger connection the recorder keeps is closed
inside the measurement, as it would be at exit). The difference of those segments, ours minus
bare, is the adapter's cost measured directly; it is reported beside the wall-clock ratio, as a
share of the bare process.

The extension includes no torch header (a plain `extern "C"` function, `is_python_module=False`),
as in tests/test_torch_ext.py: the hit path does not depend on what the library contains.
Bytecode caches are on (in a private tree), as for an installed package.
"""

from __future__ import annotations

import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time

from benchmarks._harness import Ratio, interleaved, report

CHILD = r"""
import json, sys, time
start = time.perf_counter()
spec = json.loads(sys.argv[1])
if spec["adapter"]:
    from cacheaudit import adapter, runtimes
    runtimes.activate(["torch_ext"])
armed = time.perf_counter()
from torch.utils import cpp_extension
imported = time.perf_counter()
cpp_extension.load(**spec["args"])
loaded = time.perf_counter()
if spec["adapter"]:
    from cacheaudit.recorder import _HELD
    _HELD.close()
stored = time.perf_counter()
print(json.dumps({"arm": armed - start, "torch": imported - armed, "load": loaded - imported,
                  "store": stored - loaded, "process": stored - start}))
"""


def _child(spec: dict[str, object], env: dict[str, str], cwd: str) -> dict[str, float]:
    done = subprocess.run([sys.executable, "-c", CHILD, json.dumps(spec)], env=env, cwd=cwd,
                          capture_output=True, text=True, timeout=600)
    if done.returncode != 0 or "cacheaudit:" in done.stderr:
        sys.exit(f"benchmark child failed ({done.returncode}): {done.stderr[-2000:]}")
    return json.loads(done.stdout.splitlines()[-1])  # type: ignore[no-any-return]


def main(repeat: int = 31) -> None:
    if shutil.which("g++") is None:
        sys.exit("needs g++")
    workdir = tempfile.mkdtemp(prefix="cacheaudit-bench-torch-")
    try:
        src = os.path.join(workdir, "src")
        inc = os.path.join(workdir, "inc")
        os.makedirs(src)
        os.makedirs(inc)
        with open(os.path.join(src, "k.cpp"), "w") as handle:
            handle.write('#include "myconst.h"\nextern "C" int value() { return MY_CONST; }\n')
        with open(os.path.join(inc, "myconst.h"), "w") as handle:
            handle.write("#define MY_CONST 1\n")
        # Bytecode caches on, in a private tree: an installed package has its .pyc files, and
        # without them (PYTHONDONTWRITEBYTECODE, as on these machines) every child would compile
        # cacheaudit's sources again. Both sides share the tree, torch's modules included.
        env = {k: v for k, v in os.environ.items()
               if not k.startswith(("CACHEAUDIT", "TORCH_EXTENSIONS"))
               and k != "PYTHONDONTWRITEBYTECODE"}
        env.update(PYTHONPYCACHEPREFIX=os.path.join(workdir, "pycache"),
                   TORCH_EXTENSIONS_DIR=os.path.join(workdir, "ext"),
                   CACHEAUDIT_LEDGER=os.path.join(workdir, "ledger.db"),
                   PATH=os.pathsep.join([os.path.dirname(sys.executable), env.get("PATH", "")]))
        args = {"name": "bench", "sources": [os.path.join(src, "k.cpp")],
                "extra_include_paths": [inc], "is_python_module": False}
        # Build once, create the ledger and fill the bytecode caches outside the measurement.
        _child({"adapter": True, "args": args}, env, workdir)
        _child({"adapter": False, "args": args}, env, workdir)

        samples: dict[bool, list[dict[str, float]]] = {True: [], False: []}

        def side(adapter: bool) -> None:
            samples[adapter].append(_child({"adapter": adapter, "args": args}, env, workdir))

        wall_ours, wall_bare = interleaved(lambda: side(True), lambda: side(False),
                                           repeat=repeat)

        def median(adapter: bool, part: str) -> float:
            return statistics.median(s[part] for s in samples[adapter][1:])  # no warm-up

        own = {adapter: [s["arm"] + s["load"] + s["store"] for s in samples[adapter][1:]]
               for adapter in (True, False)}
        added = statistics.median(own[True]) - statistics.median(own[False])
        ratios = [
            Ratio("new process + load(), ninja no work: adapter / torch alone", wall_ours,
                  wall_bare, budget=1.05),
            Ratio("the same, the adapter's segments timed in the child", wall_bare + added,
                  wall_bare, budget=1.05),
            Ratio("load() itself (no budget: a new process's first load)", median(True, "load"),
                  median(False, "load"), budget=None),
        ]
        report("torch-ext adapter on a load with no work", ratios, {
            "runs each": repeat, "cpus": os.cpu_count(),
            "adapter's cost per process, timed in the child (ms)": round(added * 1e3, 1),
            "  arming the adapter (ms)": round(median(True, "arm") * 1e3, 1),
            "  load(): ours / bare (ms)": f"{median(True, 'load') * 1e3:.1f} / "
                                          f"{median(False, 'load') * 1e3:.1f}",
            "  storing the record at exit (ms)": round(median(True, "store") * 1e3, 1),
            "importing torch, bare (ms, median)": round(median(False, "torch") * 1e3),
            "load average at the end": round(os.getloadavg()[0], 2),
            "measured": time.strftime("%Y-%m-%d %H:%M:%S")})
    finally:
        shutil.rmtree(workdir, ignore_errors=True)


if __name__ == "__main__":
    main(int(sys.argv[1]) if len(sys.argv) > 1 else 31)
