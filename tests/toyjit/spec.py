"""ToyJIT's spec: the registry reads this, and nothing in cacheaudit names ToyJIT."""

from cacheaudit.spec import CompilerSetting, RuntimeSpec

SPEC = RuntimeSpec(
    name="toyjit",
    title="ToyJIT",
    layout="layout",
    policy="policy",
    environment="environment",
    cache_variables=("TOYJIT_CACHE_DIR",),
    compiler_settings=(CompilerSetting("TOYJIT_CXX", "g++"),),
    packages=("toyjit",),
    docs="",
)
