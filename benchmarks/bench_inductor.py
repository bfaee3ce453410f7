"""The Inductor adapter on a torch.compile warm start, against torch alone, in one run.

Budget (issue 15): at most 5% over the runtime's own warm start. A warm start is a new process
that imports torch and calls a `torch.compile`d function whose FX graph, AOTAutograd entry and
C++ kernel are all in `TORCHINDUCTOR_CACHE_DIR` already (one cold process fills it first). Each
sample is one new Python process, alternating bare and with the adapter armed
(`runtimes.activate(["inductor"])` before torch is imported, as the start-up hook does), so that
load drift hits both sides alike; `interleaved` takes the medians.

With the adapter the process also snapshots the custom ops at each FX lookup and writes its
records at exit (`flush`, inside the measurement, as the ledger connection it keeps is closed).
Each child times its own segments too (arming, the compiled call, the write): the difference of
the call segments, ours minus bare, is the adapter's cost measured directly, reported beside the
wall-clock ratio. The CPU time of each child (with the processes it waited for, from
`RUSAGE_CHILDREN`) gives a second ratio, pair by pair, which the load of other jobs on shared
cores does not move as it moves the wall clock.
"""

from __future__ import annotations

import json
import os
import resource
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
adapter = sys.argv[1] == "1"
if adapter:
    from cacheaudit import runtimes
    runtimes.activate(["inductor"])
armed = time.perf_counter()
import torch
imported = time.perf_counter()

def function(x):
    return torch.sin(x) * 2 + x.cos()

torch.compile(function)(torch.arange(16, dtype=torch.float32))
called = time.perf_counter()
if adapter:
    from cacheaudit.runtimes.inductor.adapter import ADAPTER
    from cacheaudit.recorder import _HELD
    ADAPTER.flush()
    _HELD.close()
stored = time.perf_counter()
from torch._dynamo.utils import counters
print(json.dumps({"arm": armed - start, "torch": imported - armed, "call": called - imported,
                  "store": stored - called, "process": stored - start,
                  "fx_hits": counters["inductor"].get("fxgraph_cache_hit", 0)}))
"""


def _children_cpu_s() -> float:
    used = resource.getrusage(resource.RUSAGE_CHILDREN)
    return used.ru_utime + used.ru_stime


def _child(adapter: bool, env: dict[str, str], samples: list[dict[str, float]]) -> None:
    before = _children_cpu_s()
    done = subprocess.run([sys.executable, "-c", CHILD, "1" if adapter else "0"], env=env,
                          capture_output=True, text=True, timeout=900)
    cpu = _children_cpu_s() - before
    if done.returncode != 0 or "cacheaudit:" in done.stderr:
        sys.exit(f"benchmark child failed ({done.returncode}): {done.stderr[-2000:]}")
    # The CPU time of the child and of every process it waited for (compile workers): the
    # figure a loaded machine does not blur, where the wall clock counts the other jobs' time.
    samples.append(dict(json.loads(done.stdout.splitlines()[-1]), cpu=cpu))


def main(repeat: int = 11) -> None:
    try:
        import torch  # noqa: F401
    except ImportError:
        sys.exit("needs torch")
    if shutil.which("g++") is None:
        sys.exit("needs g++")
    workdir = tempfile.mkdtemp(prefix="cacheaudit-bench-inductor-")
    try:
        tmp = os.path.join(workdir, "tmp")
        os.makedirs(tmp)
        env = {k: v for k, v in os.environ.items()
               if not k.startswith(("TORCHINDUCTOR_", "CACHEAUDIT"))}
        env.update({"TORCHINDUCTOR_CACHE_DIR": os.path.join(workdir, "cache"), "TMPDIR": tmp,
                    "CACHEAUDIT_LEDGER": os.path.join(workdir, "ledger.db"),
                    "XDG_CACHE_HOME": os.path.join(workdir, "xdg")})
        cold: list[dict[str, float]] = []
        _child(False, env, cold)  # fills the cache: every later process is a warm start
        ours: list[dict[str, float]] = []
        bare: list[dict[str, float]] = []
        ours_s, bare_s = interleaved(lambda: _child(True, env, ours),
                                     lambda: _child(False, env, bare), repeat=repeat)
        if not all(s["fx_hits"] for s in ours + bare):
            sys.exit("a warm start missed the FX graph cache: the comparison is void")
        direct = (statistics.median(s["arm"] + s["call"] + s["store"] for s in ours)
                  - statistics.median(s["arm"] + s["call"] + s["store"] for s in bare))
        report("Inductor adapter on a torch.compile warm start", [
            Ratio("warm start, adapter armed / torch alone (one process each)", ours_s, bare_s,
                  1.05),
            Ratio.from_pairs("warm start CPU time (the process and its children), adapter "
                             "armed / torch alone", [s["cpu"] for s in ours],
                             [s["cpu"] for s in bare], 1.05)], {
            "samples per side": repeat,
            "cold start (s)": round(cold[0]["process"], 3),
            "adapter's own cost, ours minus bare (arm + call + write, ms)":
                round(direct * 1e3, 2),
            "share of a bare warm start": f"{direct / bare_s:.2%}",
            "measured": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())})
    finally:
        shutil.rmtree(workdir, ignore_errors=True)


if __name__ == "__main__":
    main()
