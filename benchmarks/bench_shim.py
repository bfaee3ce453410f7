"""The compiler shim against the bare nvcc on the CUTLASS reference TU, in one run.

Budget (DESIGN.md): at most 10% wall-clock over the bare compiler. Runs alternate (bare, shim)
so that load drift hits both. The first shim compile, which creates the ledger and stores the
873-file graph, is a warm-up and not counted; later compiles reuse the stored graph.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile

from benchmarks._harness import Ratio, interleaved, report
from cacheaudit.shim import install_masquerade
from fixtures import reference_tu


def main(repeat: int = 5) -> None:
    include = reference_tu.cutlass_include()
    nvcc = shutil.which("nvcc")
    if include is None or nvcc is None:
        sys.exit("needs the nvidia-cutlass wheel and nvcc on PATH")
    workdir = tempfile.mkdtemp(prefix="cacheaudit-bench-")
    try:
        source = reference_tu.write_source(workdir)
        masq = os.path.join(workdir, "masq")
        install_masquerade(masq, names=["nvcc", "gcc", "g++"])
        env = dict(os.environ, CACHEAUDIT_LEDGER=os.path.join(workdir, "ledger.db"))
        flags = [*reference_tu.nvcc_flags(include), "-cubin", source]

        def bare() -> None:
            subprocess.run([nvcc, *flags, "-o", os.path.join(workdir, "bare.cubin")],
                           check=True, env=env, cwd=workdir)

        def shim() -> None:
            subprocess.run([os.path.join(masq, "nvcc"), *flags, "-o",
                            os.path.join(workdir, "shim.cubin")], check=True, env=env, cwd=workdir)

        ours, baseline = interleaved(shim, bare, repeat=repeat)
        report("shim on the reference TU", [Ratio("shim nvcc -cubin / bare nvcc -cubin", ours,
                                                   baseline, budget=1.10)],
               {"runs each": repeat, "cpus": os.cpu_count()})
    finally:
        shutil.rmtree(workdir, ignore_errors=True)


if __name__ == "__main__":
    main(int(sys.argv[1]) if len(sys.argv) > 1 else 5)
