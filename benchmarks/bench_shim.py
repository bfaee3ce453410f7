"""The compiler shim against the bare compiler, in one run: a query, a small TU, the CUTLASS TU.

Budgets (issue 16): a query (`g++ --version`, `nvcc --version`, `g++ -dumpmachine`) at most 1.2x
the floor, the bare compiler plus Python's own start-up (`python -c pass`; the `-S` floor is
reported beside it); `g++ -c` of a TU including `<vector>` at most 1.25x the bare compile; the
CUTLASS reference TU (fixtures/reference_tu.py) with nvcc at most 1.05x. Runs alternate (bare,
shim) after a warm-up, so that load drift hits both; the warm-up also writes the shim's bytecode
(an installed package has it; PYTHONDONTWRITEBYTECODE is dropped for the shim, its cache kept
under the work directory) and makes the ledger and the compiler identity memo.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Callable

from benchmarks._harness import Ratio, interleaved, report
from cacheaudit.shim import install_masquerade
from fixtures import reference_tu

VECTOR_TU = "#include <vector>\nint f() { std::vector<int> v{1, 2, 3}; return int(v.size()); }\n"


def _runner(argv: list[str], env: dict[str, str], cwd: str) -> Callable[[], None]:
    def run() -> None:
        subprocess.run(argv, check=True, env=env, cwd=cwd, stdout=subprocess.DEVNULL,
                       stderr=subprocess.DEVNULL)
    return run


def _queries(masq: str, env: dict[str, str], workdir: str, repeat: int) -> list[Ratio]:
    """Each query through the shim against its floor, run as one baseline interleaved with it:
    the bare query followed by `python -c pass` (and by `python -S -c pass`, for information),
    so that drift in load hits the floor and the shim alike."""
    python = sys.executable
    start_up = {flags: _runner([python, *flags, "-c", "pass"], env, workdir)
                for flags in ((), ("-S",))}
    ratios = []
    for name, args in (("g++", ["--version"]), ("g++", ["-dumpmachine"]),
                       ("g++", ["-E", "-dM", "-x", "c++", os.devnull]),
                       ("nvcc", ["--version"])):
        real = shutil.which(name)
        if real is None:
            continue
        shim = _runner([os.path.join(masq, name), *args], env, workdir)
        bare = _runner([real, *args], env, workdir)
        what = f"{name} {' '.join(args)}".replace(os.devnull, "/dev/null")
        for flags, budget in (((), 1.2), (("-S",), None)):
            floor = start_up[flags]

            def bare_and_start_up(bare: Callable[[], None] = bare,
                                  floor: Callable[[], None] = floor) -> None:
                bare()
                floor()

            ours, baseline = interleaved(shim, bare_and_start_up, repeat=repeat)
            ratios.append(Ratio(f"shim {what} / bare + python {' '.join(flags)} -c pass".replace(
                "  ", " "), ours, baseline, budget=budget))
        ours, baseline = interleaved(shim, bare, repeat=repeat)
        ratios.append(Ratio(f"shim {what} / bare", ours, baseline, budget=None))
    return ratios


def main(repeat: int = 5) -> None:
    workdir = tempfile.mkdtemp(prefix="cacheaudit-bench-")
    try:
        masq = os.path.join(workdir, "masq")
        install_masquerade(masq, names=["nvcc", "gcc", "g++"])
        env = {k: v for k, v in os.environ.items() if k != "PYTHONDONTWRITEBYTECODE"}
        env.update(CACHEAUDIT_LEDGER=os.path.join(workdir, "ledger.db"),
                   PYTHONPYCACHEPREFIX=os.path.join(workdir, "pycache"))
        ratios = _queries(masq, env, workdir, repeat=max(repeat, 20))
        gxx = shutil.which("g++")
        if gxx is not None:
            source = os.path.join(workdir, "vector.cpp")
            with open(source, "w", encoding="utf-8") as handle:
                handle.write(VECTOR_TU)
            shim, bare = interleaved(
                _runner([os.path.join(masq, "g++"), "-c", source, "-o", "shim.o"], env, workdir),
                _runner([gxx, "-c", source, "-o", "bare.o"], env, workdir),
                repeat=max(repeat, 10), warmup=2)
            ratios.append(Ratio("shim g++ -c <vector> TU / bare", shim, bare, budget=1.25))
        include = reference_tu.cutlass_include()
        nvcc = shutil.which("nvcc")
        if include is not None and nvcc is not None:
            source = reference_tu.write_source(workdir)
            flags = [*reference_tu.nvcc_flags(include), "-cubin", source]
            shim, bare = interleaved(
                _runner([os.path.join(masq, "nvcc"), *flags, "-o", "shim.cubin"], env, workdir),
                _runner([nvcc, *flags, "-o", "bare.cubin"], env, workdir),
                # Nine pairs at least: with five, one slow pair on a shared VM moved the median
                # ratio by 0.2 (1.218x in one run, 1.026x in the next).
                repeat=max(repeat, 9))
            ratios.append(Ratio("shim nvcc -cubin CUTLASS TU / bare", shim, bare, budget=1.05))
        report("shim against the bare compiler", ratios,
               {"runs each": f"queries {max(repeat, 20)}, <vector> {max(repeat, 10)}, CUTLASS"
                             f" {max(repeat, 9)} (a fifth in a quick run)",
                "cpus": os.cpu_count(),
                "load average at the end": " ".join(f"{x:.2f}" for x in os.getloadavg())})
    finally:
        shutil.rmtree(workdir, ignore_errors=True)


if __name__ == "__main__":
    main(int(sys.argv[1]) if len(sys.argv) > 1 else 5)
