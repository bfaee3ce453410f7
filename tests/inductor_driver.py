"""A job for the Inductor scenarios: torch's own C++ code cache (`CppCodeCache.load`, the path
every CPU kernel of torch.compile takes) loads one kernel and calls it; prints one JSON line.

Run as `python inductor_driver.py kernel SOURCE_FILE` (the library's key and path, and what its
`scaled(3)` returns), `python inductor_driver.py compile` (a real torch.compile of a small
function on CPU: its result and torch's own cache counters), `python inductor_driver.py op
OPS_FILE` (torch.compile of `ops.function`, the OPS_FILE module defining `torch.library` custom
ops: its value and its input's gradient, and the counters), or `python inductor_driver.py
module MODULE_FILE` (torch.compile of the module's `function` on its `inputs()`: the result and
its dtype, the counters, and the kernel libraries mapped).
"""

from __future__ import annotations

import ctypes
import json
import sys
from typing import Any


def kernel(source_file: str) -> dict[str, object]:
    from torch._inductor.codecache import CppCodeCache

    with open(source_file) as handle:
        source = handle.read()
    # No vector ISA: the probes it would compile first cost seconds and add nothing here.
    library = CppCodeCache.load(source, needs_vec_isa=False)
    library.scaled.restype = ctypes.c_int
    return {"key": library.key, "library": library._name, "value": library.scaled(3)}


def compiled() -> dict[str, object]:
    import torch
    from torch._dynamo.utils import counters

    def function(x: torch.Tensor) -> torch.Tensor:
        return torch.sin(x) * 2 + x.cos()

    result = torch.compile(function)(torch.arange(16, dtype=torch.float32))
    return {"result": [round(float(v), 6) for v in result], "libraries": _libraries(),
            "inductor": dict(counters["inductor"]), "aot_autograd": dict(counters["aot_autograd"])}


def _libraries() -> list[str]:
    """The kernel libraries under TORCHINDUCTOR_CACHE_DIR this process has mapped."""
    import os

    root = os.path.realpath(os.environ.get("TORCHINDUCTOR_CACHE_DIR", "/nonexistent"))
    with open("/proc/self/maps") as maps:
        paths = {line.split()[-1] for line in maps if line.rstrip().endswith(".so")}
    return sorted(os.path.basename(p) for p in paths if p.startswith(root + os.sep))


def _load(module_file: str) -> Any:
    import importlib.util

    spec = importlib.util.spec_from_file_location("scenario_ops", module_file)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def with_module(module_file: str) -> dict[str, object]:
    import torch
    from torch._dynamo.utils import counters

    module = _load(module_file)
    result = torch.compile(module.function)(*module.inputs())
    return {"result": [round(float(v), 6) for v in result.flatten()], "dtype": str(result.dtype),
            "libraries": _libraries(), "inductor": dict(counters["inductor"]),
            "aot_autograd": dict(counters["aot_autograd"])}


def with_ops(ops_file: str) -> dict[str, object]:
    import torch
    from torch._dynamo.utils import counters

    ops = _load(ops_file)
    x = torch.arange(4, dtype=torch.float32, requires_grad=True)
    value = torch.compile(ops.function)(x)
    value.backward()
    assert x.grad is not None
    return {"value": float(value), "grad": [float(g) for g in x.grad],
            "inductor": dict(counters["inductor"]), "aot_autograd": dict(counters["aot_autograd"])}


if __name__ == "__main__":
    mode = sys.argv[1]
    done = (kernel(sys.argv[2]) if mode == "kernel" else with_ops(sys.argv[2]) if mode == "op"
            else with_module(sys.argv[2]) if mode == "module" else compiled())
    print(json.dumps(done))
