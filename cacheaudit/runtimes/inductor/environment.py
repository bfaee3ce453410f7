"""Inductor's environment: its own `TORCHINDUCTOR_*` names, `ATEN_CPU_CAPABILITY`, and what its
two keys hold of the variables g++ reads.

Sources (torch 2.13.0): the FX graph key is `FxGraphHashDetails` (`_inductor/codecache.py`
:1220), which holds the Inductor config (`config.save_config_portable`, :1504) and no
environment variable as such; the C++ kernel key is `code_hash(source, extra=optimized_code +
command line)` (`CppCodeCache.load_async`, codecache.py:3752-3765), the command line being
`CppBuilder.get_command_line()` (cpp_builder.py:2418) with the compiler's name as given.
Whatever g++ reads from the environment is in neither key. What the two keys hold differs for
`ATEN_CPU_CAPABILITY` (the ISA is on the kernel's command line, not in the FX key): the C++
layer's entries are classed by the variant `inductor:cpp`, which the policy names for them
(`InductorPolicy.environment_variant`); every other row holds for both layers. `TMPDIR`
places the default root (`$TMPDIR/torchinductor_<user>`, runtime/cache_dir_utils.py:24); no
row, since no runtime defines it and it changes no binary.
"""

from __future__ import annotations

from cacheaudit.envvars import Reading, Variable, reads, shells_out, variable

RUNTIME = "inductor"
CPP_LAYER = f"{RUNTIME}:cpp"
"""The variant for the C++ layer's entries (kernels, ISA probes, precompiled headers), whose key
holds the command line (`policy.InductorPolicy.environment_variant`); the FX graph and
AOTAutograd entries are classed by the runtime's own statuses."""

_CODECACHE = "torch 2.13.0 _inductor/codecache.py"

ROWS: tuple[Variable | Reading, ...] = (
    *shells_out(RUNTIME),
    reads("CXX", in_key=(RUNTIME,),
          notes={RUNTIME: "config.cpp.cxx reads it at import (_inductor/config.py:1690); the "
                          "name or path as written is on the hashed command line, the binary "
                          "behind it is not"},
          source="torch 2.13.0 _inductor/cpp_builder.py get_cpp_compiler (:372)"),
    # --- Inductor's own ---------------------------------------------------------------------
    variable("TORCHINDUCTOR_CACHE_DIR", "cache-location",
             "root of Inductor's fxgraph/, aotautograd/ and <xx>/<key> kernel files",
             not_in_key=(RUNTIME,),
             notes={RUNTIME: "precompiled headers stay under default_cache_dir() whatever it "
                             "says (codecache.py:3542)"},
             source="torch 2.13.0 _inductor/runtime/cache_dir_utils.py cache_dir (:14)"),
    variable("ATEN_CPU_CAPABILITY", "compiler-flags",
             "caps the vector ISA Inductor generates code for (default, avx2, avx512)",
             not_in_key=(RUNTIME,), in_key=(CPP_LAYER,),
             notes={RUNTIME: "read by pick_vec_isa at run time (cpu_vec_isa.py:661); the FX "
                             "graph and AOTAutograd keys do not hold it, so an FX hit serves "
                             "code generated for the other ISA",
                    CPP_LAYER: "the chosen ISA's -m flags and -DCPU_CAPABILITY_* are on the "
                               "hashed command line (CppCodeCache.load_async, codecache.py"
                               ":3752-3765; probes: VecISA.check_build, cpu_vec_isa.py:164): "
                               "a kernel built for another ISA has another key"},
             source="torch 2.13.0 _inductor/cpu_vec_isa.py pick_vec_isa"),
    variable("TORCHINDUCTOR_CPP_CACHE_PRECOMPILE_HEADERS", "cache-control",
             "=0 stops precompiling cpp_prefix.h into precompiled_headers/",
             in_key=(RUNTIME,),
             notes={RUNTIME: "an Inductor config value, in the FX graph key"},
             source="torch 2.13.0 _inductor/config.py:212"),
    variable("TORCHINDUCTOR_FX_GRAPH_CACHE", "cache-control",
             "forces the FX graph cache on (1) or off (0)",
             not_in_key=(RUNTIME,), source="torch 2.13.0 _inductor/config.py:112"),
    variable("TORCHINDUCTOR_AUTOGRAD_CACHE", "cache-control",
             "forces the AOTAutograd cache on (1) or off (0)",
             not_in_key=(RUNTIME,), source="torch 2.13.0 _functorch/config.py:73"),
)
