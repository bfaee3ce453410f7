"""NVRTC's environment: which generic variables it never reads.

NVRTC compiles in-process with the include paths its options give; it reads neither `CPATH` nor
`CPLUS_INCLUDE_PATH` (platform-notes.md §2 "NVRTC ignores CPATH / CPLUS_INCLUDE_PATH"), so for it
they are trivially outside any key and change nothing.
"""

from __future__ import annotations

from cacheaudit.envvars import Reading, Variable, reads

RUNTIME = "nvrtc"

ROWS: tuple[Variable | Reading, ...] = (
    reads("CPATH", ignored_by=(RUNTIME,),
          notes={RUNTIME: "NVRTC ignores CPATH (platform-notes.md §2)"}),
    reads("CPLUS_INCLUDE_PATH", ignored_by=(RUNTIME,),
          notes={RUNTIME: "NVRTC ignores CPLUS_INCLUDE_PATH (platform-notes.md §2)"}),
)
