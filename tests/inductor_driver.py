"""A job for the Inductor scenarios: torch's own C++ code cache (`CppCodeCache.load`, the path
every CPU kernel of torch.compile takes) loads one kernel and calls it; prints one JSON line.

Run as `python inductor_driver.py kernel SOURCE_FILE` (the library's key and path, and what its
`scaled(3)` returns), `python inductor_driver.py compile` (a real torch.compile of a small
function on CPU: its result and torch's own cache counters), `python inductor_driver.py
module MODULE_FILE` (torch.compile of the module's `function` on its `inputs()`: the result and
its dtype, the counters, and the kernel libraries mapped), or `python inductor_driver.py
modules MODULE_FILE...` (each module in turn, `compile_module`: one JSON object by file name).
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
    import os

    name = "scenario_" + os.path.splitext(os.path.basename(module_file))[0]
    spec = importlib.util.spec_from_file_location(name, module_file)
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


def compile_module(module_file: str) -> dict[str, object]:
    """torch.compile of one scenario module's `function` on its `inputs()`, in this process: the
    result, its dtype, the gradient of the first input when the result needs one (`backward`
    run on its sum), the kernel libraries mapped since, and torch's counters for this compile
    alone. The custom passes the module installs in Inductor's config are taken out after, so
    that the next module in the process compiles without them."""
    import torch
    from torch._dynamo.utils import counters
    from torch._inductor import config

    slots = [name for name in dir(config) if name.endswith("_custom_pass")
             or name.endswith("_custom_pre_pass") or name.endswith("_custom_post_pass")]
    saved = {name: getattr(config, name) for name in slots}
    before = {group: dict(counters[group]) for group in ("inductor", "aot_autograd")}
    mapped = set(_libraries())
    try:
        module = _load(module_file)
        arguments = module.inputs()
        result = torch.compile(module.function)(*arguments)
        grad = None
        if result.requires_grad:
            result.sum().backward()
            grad = [round(float(g), 6) for g in arguments[0].grad]
    finally:
        for name, value in saved.items():
            setattr(config, name, value)
    delta = {group: {name: count - before[group].get(name, 0)
                     for name, count in counters[group].items()
                     if count != before[group].get(name, 0)}
             for group in ("inductor", "aot_autograd")}
    return {"result": [round(float(v), 6) for v in result.detach().flatten()],
            "dtype": str(result.dtype), "grad": grad,
            "libraries": sorted(set(_libraries()) - mapped), **delta}


if __name__ == "__main__":
    if sys.argv[1] == "modules":  # several scenario modules compiled one after another
        import os

        print(json.dumps({os.path.basename(path): compile_module(path) for path in sys.argv[2:]}))
        sys.exit(0)
    mode = sys.argv[1]
    done = (kernel(sys.argv[2]) if mode == "kernel" else with_module(sys.argv[2])
            if mode == "module" else compiled())
    print(json.dumps(done))
