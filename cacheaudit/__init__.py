"""cacheaudit: a compile-cache identity auditor for GPU kernel JIT runtimes."""

__version__ = "0.1.0.dev0"
