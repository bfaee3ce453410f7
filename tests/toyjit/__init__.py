"""ToyJIT: a small runtime that lives in tests/, to prove that a runtime is one package and one
registry line (`CACHEAUDIT_RUNTIMES=toyjit`), with nothing else in cacheaudit changed.

It caches a C++ object under a key that hashes the source and `TOYJIT_FLAGS` and nothing the
source includes, the classic JIT-cache blind spot; `runtime.compile` is the runtime itself.
"""
