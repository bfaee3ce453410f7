"""torch.compile's Inductor on CPU: FX graph and AOTAutograd entries, and C++ kernels built with
g++ through `subprocess` (torch 2.13.0 `torch/_inductor/cpp_builder.py` `_run_compile_cmd`).

Its compiler setting is `CXX`, declared with `path_in_key_if`: Inductor's C++ kernel key
holds the compiler *string* it was given (`config.cpp.cxx`, from `$CXX` or `g++`, on the hashed
command line of `CppCodeCache.load_async`), so a session must leave a `CXX` the user gave by
path as it is wherever torch's Inductor is importable (a stand-in's path would be keyed); the
in-process adapter records those compiles. A bare `g++` on PATH reaches the shim with the key
unchanged; see docs/runtimes/inductor.md.
"""

from __future__ import annotations

import os

from cacheaudit.roots import unique_paths
from cacheaudit.spec import CompilerSetting, RuntimeSpec

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Mapping

SPEC = RuntimeSpec(
    name="inductor",
    title="torch.compile (Inductor)",
    layout="layout",
    roots="spec",
    policy="policy",
    adapter="adapter",
    adapter_imports="torch._inductor.codecache",
    cache_variables=("TORCHINDUCTOR_CACHE_DIR",),
    compiler_settings=(CompilerSetting("CXX", compiler="g++",
                                       path_in_key_if=("torch", "_inductor/codecache.py")),),
    packages=("torch",),
    # "cpp": the C++ layer (kernels, ISA probes, precompiled headers), whose key holds the
    # command line; the FX graph and AOTAutograd entries take the runtime's own statuses.
    variants=("cpp",),
    environment="environment",
    docs="runtimes/inductor.md",
)


# ------------------------------------------------------------------------------ default roots
# `SPEC.roots`: where the cache lives under an environment, in the standard library alone, so
# that a session knows the roots to watch without loading the reader.

_REPLACED = str.maketrans(dict.fromkeys('\\/:*?"<>|', "_"))
"""The characters torch replaces in the user's name (`re.sub(r'[\\/:*?"<>|]', "_", user)`)."""


def default_cache_dir(env: Mapping[str, str]) -> str:
    """`default_cache_dir()` under `env`: tempfile's directory (TMPDIR, TEMP, TMP, else /tmp)
    and getpass's user (LOGNAME, USER, LNAME, USERNAME, else the password database), with the
    characters torch replaces replaced (cache_dir_utils.py:24)."""
    temp = next((env[name] for name in ("TMPDIR", "TEMP", "TMP")
                 if env.get(name) and os.path.isdir(env[name])), None)
    if temp is None:
        if env is os.environ:
            import tempfile  # only here: tempfile imports random and shutil

            temp = tempfile.gettempdir()
        else:
            temp = "/tmp"
    user = next((env[name] for name in ("LOGNAME", "USER", "LNAME", "USERNAME") if env.get(name)),
                None)
    if user is None:
        try:
            # What getpass.getuser() falls back to, without getpass's imports (termios, ...).
            import pwd

            user = pwd.getpwuid(os.getuid()).pw_name
        except (KeyError, OSError, ImportError):
            user = f"uid_{os.getuid()}"
    return os.path.join(temp, "torchinductor_" + user.translate(_REPLACED))


def default_roots(env: Mapping[str, str]) -> list[str]:
    """cache_dir() (TORCHINDUCTOR_CACHE_DIR, made absolute, else the default), then the
    default directory, which holds the precompiled headers whatever the variable says."""
    default = default_cache_dir(env)
    explicit = env.get("TORCHINDUCTOR_CACHE_DIR")
    roots = [os.path.abspath(explicit)] if explicit else []
    return unique_paths([*roots, default])
