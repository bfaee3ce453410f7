"""cuda.core's environment: it compiles C++ through NVRTC (which ignores the include-path
variables) and keeps its program cache under the user cache root.
"""

from __future__ import annotations

from cacheaudit.envvars import Reading, Variable, reads

RUNTIME = "cuda-core"

ROWS: tuple[Variable | Reading, ...] = (
    reads("CPATH", ignored_by=(RUNTIME,),
          notes={RUNTIME: "cuda.core compiles C++ through NVRTC, which ignores CPATH"}),
    reads("CPLUS_INCLUDE_PATH", ignored_by=(RUNTIME,)),
    # jit-runtimes.md §7: the program cache lives in $XDG_CACHE_HOME/cuda-python.
    reads("XDG_CACHE_HOME", not_in_key=(RUNTIME,),
          description=" and cuda.core's program cache"),
)
