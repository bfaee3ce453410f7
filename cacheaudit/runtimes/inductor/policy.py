"""What Inductor's keys cover (torch 2.13.0), entry kind by entry kind.

- C++ kernels (`<xx>/<key>.main.cpp` and `.main.so`, and the `.cpp`/`.so` ISA probes): the key
  is `code_hash(source.strip(), extra=f"{optimized_code} {command line}")`
  (`_inductor/codecache.py` `CppCodeCache.load_async`, :3752-3765; probes: `cpu_vec_isa.py`
  `VecISA.check_build`, :180, with the ISA's flags as the extra). The command line
  (`cpp_builder.py` `CppBuilder.get_command_line`, :2418) holds the compiler's *name* as
  `config.cpp.cxx` gave it (`g++`), `-march=native` as text, the ISA's `-m` flags and
  `-DCPU_CAPABILITY_*`, and `-I<torch>/include` as a path. So the tracked set is the source
  alone: every header the compiler read (torch/include, the system's, one `CPATH` supplies),
  the binary `g++` resolves to on PATH, and what `-march=native` means on this CPU are outside
  the key. Once `<key>.main.so` exists it is loaded without a compile (`_worker_compile_cpp`,
  :3873), in every later process.
- Precompiled headers (`precompiled_headers/<key>.h.gch`): the key holds the command line,
  the sha512 of the *preprocessed* header and `<compiler> -v` (`_precompile_header`, :3594),
  so every header the preprocessor read is tracked by content; the compiler's binary is not.
- FX graph and AOTAutograd entries (pickles): keyed by `FxGraphHashDetails` (:1220: the graph,
  input metadata, `torch_key()` over torch's Python sources, :934, the Inductor config minus
  ignored prefixes, determinism settings, custom passes' `uuid()`) and AOTAutograd's key. No
  compile command builds them, so the shim never sees one; the in-process adapter records
  their saves and hits (adapter.py; docs/runtimes/inductor.md).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from cacheaudit.findings import make_finding
from cacheaudit.model import CacheEntry, CompileRecord, Finding
from cacheaudit.policy import KeyCheck, KeyComponent, Policy, TrackedSet

RUNTIME = "inductor"
CPP_KINDS = frozenset({"kernel", "cpp", "precompiled_header"})
"""The reader's entry kinds of the C++ layer, keyed by the command line (layout.py)."""

KERNEL_HOW = ("CppCodeCache.load_async: code_hash of the source text and the command line as "
              "text (the compiler's name, -march=native, -I<torch>/include as a path); no "
              "header, no compiler binary (torch 2.13.0 _inductor/codecache.py:3752)")
HEADER_HOW = ("_precompile_header: the sha512 of the preprocessed header, the command line and "
              "`<compiler> -v` (torch 2.13.0 _inductor/codecache.py:3594)")
PICKLED_PROBLEM = ("an Inductor {kind} entry is a pickle built inside the Python process (no "
                   "compiler command builds it) and cacheaudit never unpickles a cache file; "
                   "its save is recorded only by the in-process adapter (under `cacheaudit "
                   "run` or the pytest plugin), which was not armed when it was written")
KERNEL_PROBLEM = ("Inductor writes no compile command into its cache (the command is computed "
                  "in the process); record the compile under `cacheaudit run` or the pytest "
                  "plugin, whose shim on PATH sees the g++ Inductor runs")


_OP_FIELD_WORDS = {"schema": "schema", "mutates_args": "mutates_args",
                   "fake": "fake implementation (register_fake)",
                   "backward": "autograd formula (register_autograd backward)",
                   "setup_context": "autograd setup_context"}


class InductorPolicy(Policy):
    runtime = RUNTIME

    caches_header_digests = False
    """Inductor never hashes a header for its kernel key, so a live process is no evidence of
    a stale digest (CA106 is never inferred from one)."""

    def tracked(self, entry: CacheEntry, record: CompileRecord | None) -> TrackedSet:
        kind = entry.meta.get("kind")
        if kind == "precompiled_header":
            graph = set(record.graph.paths) if record is not None and record.graph else set()
            source = {entry.source.path} if entry.source is not None else set()
            return TrackedSet(frozenset(graph | source), how=HEADER_HOW)
        paths = {entry.source.path} if entry.source is not None else set()
        paths.update(path for path in entry.files if path.endswith(".optimized.cpp"))
        return TrackedSet(frozenset(paths), how=KERNEL_HOW)

    def environment_variant(self, entry: CacheEntry) -> str | None:
        """"cpp" for the C++ layer's entries (kernels, ISA probes, precompiled headers), whose
        key holds the command line and with it the vector ISA's flags, so that
        `ATEN_CPU_CAPABILITY` is in their key (environment.py, `CPP_LAYER`); None for the FX
        graph and AOTAutograd entries, whose keys do not hold it: an FX hit under another
        value serves the other ISA's graph (CA202 on the FX entry, none on the kernels)."""
        return "cpp" if entry.meta.get("kind") in CPP_KINDS else None

    def check_key(self, entry: CacheEntry, record: CompileRecord | None = None,
                  env: Mapping[str, str] | None = None) -> KeyCheck:
        source = entry.source.path if entry.source is not None else entry.path
        return KeyCheck(None, (KeyComponent("source text (hashed)", source),),
                        note="the hashable command line (CppBuilder for name 'o', source 'i') "
                             "is computed in the process and not stored; not recomputed")

    looks_up_compiler_by_name = True
    """Inductor runs the compiler by the name `config.cpp.cxx` holds (`$CXX`, else `g++`;
    cpp_builder.py `get_cpp_compiler`, :372, and `cpp_compiler_search`, :83, which returns the
    name as given), which `subprocess` looks up on PATH in every process, and keys only that
    name: the audit judges what that name resolves to now. A compiler recorded as invoked by a
    path (a `CXX` given by full path, which is keyed) is judged at that path. The name is
    resolved through the spec's compiler setting, `CXX`, then PATH."""

    def record_findings(self, record: CompileRecord,
                        history: Sequence[CompileRecord]) -> list[Finding]:
        """CA101 for each custom op whose traced-in state (schema, mutates_args, fake
        implementation, backward, setup_context) differs between the compile that wrote an FX
        graph entry and the process it was served to (the adapter compares the two snapshots
        when it writes the hit: `adapter.custom_op_changes`): the FX key hashes the graph's
        call targets by name, so the served graph was traced with the old op."""
        if record.runtime != RUNTIME or record.event == "compile":
            return []
        findings = self._custom_pass_findings(record)
        # One finding per op, naming every field that changed (findings are one per code and
        # subject: a finding per field would keep only the first).
        by_op: dict[str, list[Mapping[str, object]]] = {}
        for change in record.extra.get("custom_ops_changed") or ():
            by_op.setdefault(str(change.get("op")), []).append(change)
        for op, changes in by_op.items():
            fields = [str(change.get("field")) for change in changes]
            words = " and ".join(_OP_FIELD_WORDS.get(field, field) for field in fields)
            several = len(changes) > 1

            def shown(side: str, changes: list[Mapping[str, object]] = changes,
                      several: bool = several) -> str:
                return "; ".join(f"{c.get('field')}: {c.get(side)}" if several else
                                 str(c.get(side)) for c in changes)

            findings.append(make_finding(
                "CA101", subject=op, record=record,
                message=f"custom op {op}'s {words} changed since this FX graph entry was "
                        f"compiled, and Inductor's FX graph key does not cover "
                        f"{'them' if several else 'it'}: the graph served was traced with the "
                        f"old one",
                recorded=shown("recorded"), current=shown("current"),
                how="the adapter's torch.library snapshot at the entry's compile (ledger record "
                    f"{record.extra.get('built_record', '?')}) against the one at this hit"))
        return findings

    @staticmethod
    def _custom_pass_findings(record: CompileRecord) -> list[Finding]:
        """CA101 for each custom pass whose state outside its `uuid()` (its code, an instance
        attribute, a module-level value its `__call__` names) differs between the compile that
        wrote an FX graph entry and the process it was served to (`adapter.custom_pass_changes`):
        the FX key holds the uuid() alone, so the graph served was transformed by the old pass.
        The subject is what the user changed: `Class.attribute`, `module.NAME`, or the class."""
        findings = []
        for change in record.extra.get("custom_passes_changed") or ():
            slot, kind = str(change.get("pass")), str(change.get("class"))
            field = str(change.get("field"))
            what, _, name = field.partition(" ")
            subject = (f"{kind.rsplit('.', 1)[-1]}.{name}" if what == "attribute" else
                       f"{kind.rsplit('.', 1)[0]}.{name}" if what == "global" else kind)
            described = {"attribute": f"its attribute {name}", "global": f"the module value {name} "
                         "its __call__ reads", "code": "its code"}.get(what, "the pass itself")
            findings.append(make_finding(
                "CA101", subject=subject, record=record,
                message=f"custom pass {slot} ({kind}): {described} changed since this FX graph "
                        f"entry was compiled, and its uuid(), the only part of it in Inductor's "
                        f"FX graph key, did not: the graph served was transformed by the old pass",
                recorded=str(change.get("recorded")), current=str(change.get("current")),
                how="the adapter's custom-pass snapshot at the entry's compile (ledger record "
                    f"{record.extra.get('built_record', '?')}) against the one at this hit"))
        return findings

    def reconstruction_problem(self, entry: CacheEntry) -> str | None:
        kind = str(entry.meta.get("kind", ""))
        if kind in ("fxgraph", "aotautograd"):
            return PICKLED_PROBLEM.format(kind=kind)
        return KERNEL_PROBLEM

    def key_remedy(self, entry: CacheEntry | None) -> str | None:
        return ("give each toolchain its own TORCHINDUCTOR_CACHE_DIR (Inductor offers no way "
                "to add {input} to its C++ kernel key)")


POLICIES = {RUNTIME: InductorPolicy()}
