"""Inductor's in-process blind spots, served for real and named three ways: by `cacheaudit run`
of the process that was served, by `pytest --cacheaudit` of a test that was served, and by a
later `cacheaudit scan`.

Each blind spot is a scenario module whose `function` torch.compile compiles on CPU (the real
torch 2.13.0, `TORCHINDUCTOR_COMPILE_THREADS=1`, so kernels compile in the process): a custom
op's `mutates_args`, its fake implementation, its autograd formula, a custom pass's option
outside its `uuid()`, and the control, a custom op whose implementation changed (dispatched at
run time: the hit is right). Importing torch and Dynamo costs a process ~7 s of CPU, more than
any compile here, so one module-scoped cache holds every scenario: one process under
`cacheaudit run` compiles every module, every module is edited, and then one process is served
under `cacheaudit run`, one pytest session is served under the plugin, and one process compiles
into an empty cache, the ground truth. The checks below only read what those four did.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("torch")

TESTS = Path(__file__).parent
DRIVER = TESTS / "inductor_driver.py"

pytestmark = [pytest.mark.slow,
              pytest.mark.skipif(shutil.which("g++") is None,
                                 reason="Inductor compiles CPU kernels with g++")]

SCALED = '''import torch


@torch.library.custom_op("ca::scaled", mutates_args=())
def scaled(x: torch.Tensor) -> torch.Tensor:
    return x * FACTOR


@scaled.register_fake
def _(x):
    return torch.empty_like(x)


def function(x):
    return scaled(x) + 1


def inputs():
    return (torch.arange(4, dtype=torch.float32),)
'''

BUMP = '''import torch


@torch.library.custom_op("ca::bump", mutates_args=MUTATES)
def bump(x: torch.Tensor) -> torch.Tensor:
    BODY


@bump.register_fake
def _(x):
    return torch.empty_like(x)


def function(x):
    y = x.clone()
    bump(y)
    return y


def inputs():
    return (torch.arange(4, dtype=torch.float32),)
'''

TYPED = '''import torch


@torch.library.custom_op("ca::typed", mutates_args=())
def typed(x: torch.Tensor) -> torch.Tensor:
    return IMPLEMENTATION


@typed.register_fake
def _(x):
    return FAKE


def function(x):
    return typed(x) + 1


def inputs():
    return (torch.arange(4, dtype=torch.float32),)
'''

FORMULA = '''import torch


@torch.library.custom_op("ca::twice", mutates_args=())
def twice(x: torch.Tensor) -> torch.Tensor:
    return x.repeat(2)


@twice.register_fake
def _(x):
    return x.new_empty(x.shape[0] * 2)


def _setup(ctx, inputs, output):
    ctx.n = inputs[0].shape[0]


def _backward(ctx, grad):
    return grad.new_full((ctx.n,), BACKWARD)


twice.register_autograd(_backward, setup_context=_setup)


def function(x):
    return twice(x).sum()


def inputs():
    return (torch.arange(4, dtype=torch.float32, requires_grad=True),)
'''

OFFSET = '''import torch
from torch._inductor import config
from torch._inductor.custom_graph_pass import CustomGraphPass


class Offset(CustomGraphPass):
    """Rewrites every `tensor + number` to `tensor + self.offset`."""

    def __init__(self, offset):
        self.offset = offset

    def __call__(self, graph):
        for node in graph.nodes:
            if node.target is torch.ops.aten.add.Tensor and isinstance(node.args[1], (int, float)):
                node.args = (node.args[0], self.offset)

    def uuid(self):
        return "offset-pass-1"  # the pass's version; its option is not in it


config.post_grad_custom_post_pass = Offset(OFFSET)


def function(x):
    return x * 2 + 1


def inputs():
    return (torch.arange(4, dtype=torch.float32),)
'''

# (module, text before, text after), compiled in this order in every process. The control comes
# first: the adapter snapshots every custom op of the process at each FX record, and a module
# compiled after another sees that one's op too.
MODULES = (
    ("scaled", SCALED.replace("FACTOR", "1"), SCALED.replace("FACTOR", "2")),
    ("bump", BUMP.replace("MUTATES", "()").replace("BODY", "return x + 1"),
     BUMP.replace("MUTATES", '("x",)').replace("BODY", "x.add_(1)\n    return x + 0")),
    ("typed", TYPED.replace("IMPLEMENTATION", "x * 2").replace("FAKE", "torch.empty_like(x)"),
     TYPED.replace("IMPLEMENTATION", "(x * 2).double()").replace(
         "FAKE", "torch.empty_like(x, dtype=torch.float64)")),
    ("formula", FORMULA.replace("BACKWARD", "2.0"), FORMULA.replace("BACKWARD", "3.0")),
    ("offset", OFFSET.replace("OFFSET", "10"), OFFSET.replace("OFFSET", "20")),
)
SUBJECTS = {"bump": "ca::bump", "typed": "ca::typed", "formula": "ca::twice",
            "offset": "Offset.offset"}
"""What cacheaudit must name for each blind spot: the op, or the pass's option."""


def _env(tmp: Path, cache: Path) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("TORCHINDUCTOR_", "CACHEAUDIT_")) and k != "CPATH"}
    env.update({"TORCHINDUCTOR_CACHE_DIR": str(cache), "XDG_CACHE_HOME": str(tmp / "xdg"),
                "CACHEAUDIT_LEDGER": str(tmp / "ledger.db"), "TMPDIR": str(tmp / "tmp"),
                "TORCHINDUCTOR_COMPILE_THREADS": "1",
                # Scalar kernels, no precompiled header: no ISA probe and no header compile,
                # seconds each on an empty cache (both in the FX key, the same everywhere here).
                "TORCHINDUCTOR_VEC_ISA_OK": "0",
                "TORCHINDUCTOR_CPP_CACHE_PRECOMPILE_HEADERS": "0",
                "PYTHONPATH": os.pathsep.join(
                    p for p in (str(TESTS.parent), os.environ.get("PYTHONPATH", "")) if p)})
    (tmp / "tmp").mkdir(exist_ok=True)
    return env


def _modules(env: dict[str, str], files: list[Path], *, report: Path | None = None
             ) -> dict[str, dict[str, Any]]:
    """The driver's `modules` mode on `files`, in a process of its own (under `cacheaudit run`
    when `report` is given): each module's answer by its name."""
    job = [sys.executable, str(DRIVER), "modules", *map(str, files)]
    argv = ([sys.executable, "-m", "cacheaudit", "run", "--report-json", str(report), "--", *job]
            if report else job)
    done = subprocess.run(argv, capture_output=True, text=True, env=env, timeout=900)
    # Under `cacheaudit run` an error finding fails the run (1); the job's answer is its line.
    assert done.returncode in ((0, 1) if report else (0,)), done.stderr[-3000:]
    answer = json.loads(next(line for line in done.stdout.splitlines() if line.startswith("{")))
    return {name.removesuffix(".py"): value for name, value in answer.items()}


@dataclass
class Served:
    built: dict[str, dict[str, Any]]
    served: dict[str, dict[str, Any]]
    fresh: dict[str, dict[str, Any]]
    run: dict[str, Any]
    """`cacheaudit run --report-json` of the served process."""
    plugin: subprocess.CompletedProcess[str]
    scan: dict[str, Any]
    scan_status: int
    entries: dict[str, set[str]]
    """Each module's FX graph entries, from the adapter's save records of the first process."""
    aot_saves: list[Any]
    """The adapter's AOTAutograd save records (`compile`, layer aotautograd), of every process."""
    aot_files: set[str]
    """The AOTAutograd entry files in the cache after every process."""
    fx_hits: dict[str, int]
    """The adapter's FX disk-hit records of each entry, over every process."""
    backward_graphs: set[str]
    """The FX entries served as the backward half of an AOTAutograd graph (`is_backward`)."""
    env: dict[str, str]
    """The environment every process got (its ledger is `CACHEAUDIT_LEDGER`)."""


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory) -> Served:
    tmp = tmp_path_factory.mktemp("inductor-served")
    cache = tmp / "cache"
    env = _env(tmp, cache)
    files = [tmp / f"{name}.py" for name, _, _ in MODULES]
    for path, (_, before, _) in zip(files, MODULES, strict=True):
        path.write_text(before)
    built = _modules(env, files, report=tmp / "built.json")
    for path, (_, _, after) in zip(files, MODULES, strict=True):
        path.write_text(after)

    run = tmp / "served.json"
    served = _modules(env, files, report=run)
    suite = tmp / "suite"
    suite.mkdir()
    tests = "".join(f"def test_{name}():\n    compile_module({str(path)!r})\n\n\n"
                    for (name, _, _), path in zip(MODULES, files, strict=True))
    (suite / "test_served.py").write_text(
        f"import sys\nsys.path.insert(0, {str(TESTS)!r})\n"
        f"from inductor_driver import compile_module\n\n\n{tests}")
    plugin = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider",
                             "--cacheaudit", "--cacheaudit-fail-on=error", "test_served.py"],
                            capture_output=True, text=True, env=env, cwd=suite, timeout=900)
    (tmp / "plugin.out").write_text(plugin.stdout)
    fresh = _modules(dict(env, TORCHINDUCTOR_CACHE_DIR=str(tmp / "empty")), files)
    scanned = subprocess.run([sys.executable, "-m", "cacheaudit", "scan", "--json",
                              "--fail-on", "error", str(cache)],
                             capture_output=True, text=True, env=env, timeout=600)
    assert scanned.returncode in (0, 1), scanned.stderr[-3000:]

    from cacheaudit.ledger import Ledger

    with Ledger.open(env["CACHEAUDIT_LEDGER"], create=False) as ledger:
        adapter = [r for r in ledger.records() if r.observer == "adapter:inductor"]
    adapter_saves = [r for r in adapter if r.event == "compile"]
    fx_hits: dict[str, int] = {}
    for record in adapter:
        if record.event == "disk-hit" and record.extra.get("layer") == "fxgraph":
            fx_hits[str(record.entry)] = fx_hits.get(str(record.entry), 0) + 1
    saves = sorted((r for r in adapter_saves if r.extra.get("layer") == "fxgraph"),
                   key=lambda r: r.started_ns)
    # The first process saved each module's graphs in turn (torch's miss counter says how many).
    entries: dict[str, set[str]] = {}
    for name, _, _ in MODULES:
        count = built[name]["inductor"].get("fxgraph_cache_miss", 0)
        entries[name] = {str(r.entry) for r in saves[:count]}
        saves = saves[count:]
    assert not saves, saves
    return Served(built=built, served=served, fresh=fresh, run=json.loads(run.read_text()),
                  plugin=plugin, scan=json.loads(scanned.stdout), scan_status=scanned.returncode,
                  entries=entries,
                  aot_saves=[r for r in adapter_saves if r.extra.get("layer") == "aotautograd"],
                  aot_files={str(p) for p in (cache / "aotautograd").glob("*/*") if p.is_file()},
                  fx_hits=fx_hits,
                  backward_graphs={str(r.entry) for r in adapter if r.event == "disk-hit"
                                   and r.extra.get("is_backward") is True}, env=env)


def _errors(findings: list[dict[str, Any]]) -> set[tuple[str, str, str]]:
    return {(f["code"], f["subject"], str(f["entry"])) for f in findings
            if f["severity"] == "error"}


def test_every_module_was_served_from_the_cache_and_stale_where_expected(served: Served) -> None:
    """Ground truth: the served process hit the FX graph and AOTAutograd caches for every module
    (torch's counters) and got the old results, where an empty cache gives the new ones; the
    control's hit gives what an empty cache gives."""
    for name, _, _ in MODULES:
        assert served.built[name]["inductor"].get("fxgraph_cache_miss", 0) >= 1, name
        assert served.fresh[name]["inductor"].get("fxgraph_cache_miss", 0) >= 1, name
        assert served.served[name]["inductor"].get("fxgraph_cache_hit", 0) >= 1, name
        assert served.served[name]["aot_autograd"].get("autograd_cache_hit", 0) >= 1, name
    built, hit, fresh = served.built, served.served, served.fresh
    # The control: the implementation is called through the dispatcher, so the hit is right.
    assert (built["scaled"]["result"], hit["scaled"]["result"], fresh["scaled"]["result"]) == (
        [1.0, 2.0, 3.0, 4.0], [1.0, 3.0, 5.0, 7.0], [1.0, 3.0, 5.0, 7.0])
    # mutates_args: the graph traced when the op was pure dropped the call; y comes back unbumped.
    assert built["bump"]["result"] == hit["bump"]["result"] == [0.0, 1.0, 2.0, 3.0]
    assert fresh["bump"]["result"] == [1.0, 2.0, 3.0, 4.0]
    # The fake implementation: the old kernel (float32 in) reads the float64 buffer.
    assert built["typed"]["result"] == fresh["typed"]["result"] == [1.0, 3.0, 5.0, 7.0]
    assert (built["typed"]["dtype"], fresh["typed"]["dtype"]) == ("torch.float32",
                                                                  "torch.float64")
    assert hit["typed"]["result"] != fresh["typed"]["result"], hit["typed"]
    assert hit["typed"]["libraries"] == built["typed"]["libraries"] != fresh["typed"]["libraries"]
    # The autograd formula: the old backward's gradient.
    assert (hit["formula"]["grad"], fresh["formula"]["grad"]) == ([2.0] * 4, [3.0] * 4)
    # The pass's option: the graph the old option rewrote.
    assert built["offset"]["result"] == hit["offset"]["result"] == [10.0, 12.0, 14.0, 16.0]
    assert fresh["offset"]["result"] == [20.0, 22.0, 24.0, 26.0]
    assert hit["offset"]["libraries"] == built["offset"]["libraries"]


def _names_each_blind_spot_on_its_entry(errors: set[tuple[str, str, str]],
                                        served: Served) -> None:
    """Each scenario's subject named CA101 on its own module's FX graph entry, and nothing
    else on it: each module's graph calls its own op alone, so another module's changed op
    (every op of the process is in the snapshot) is not its business; the control's entries
    free of errors."""
    for name, subject in SUBJECTS.items():
        named = {entry for code, who, entry in errors if (code, who) == ("CA101", subject)}
        assert named & served.entries[name], (name, subject, sorted(errors))
        on_its_entries = {(code, who) for code, who, entry in errors
                          if entry in served.entries[name]}
        assert on_its_entries == {("CA101", subject)}, (name, sorted(errors))
    assert not {e for _, _, e in errors} & served.entries["scaled"], sorted(errors)
    assert {e for _, _, e in errors} <= set().union(*served.entries.values()), sorted(errors)
    # The autograd formula is the backward graph's alone: the forward half served is right
    # (its result is the fresh compile's; the gradient is not) and carries no error.
    assert served.served["formula"]["result"] == served.fresh["formula"]["result"]
    formula = served.entries["formula"]
    assert {e for code, who, e in errors if who == "ca::twice"} == (
        formula & served.backward_graphs), (sorted(errors), formula, served.backward_graphs)


def test_cacheaudit_run_of_the_served_process_names_each_changed_input(served: Served) -> None:
    """`cacheaudit run` of the served process: the op (its mutates_args, its fake
    implementation, its autograd formula) and the pass's option, each on the FX hit that served
    the stale graph, from the adapter's snapshots at the compile and at the hit."""
    findings = served.run["findings"]
    _names_each_blind_spot_on_its_entry(_errors(findings), served)
    words = {"bump": "schema and mutates_args changed", "typed": "fake implementation",
             "formula": "autograd formula", "offset": "post_grad_custom_post_pass"}
    for name, subject in SUBJECTS.items():
        messages = [f["message"] for f in findings if f["subject"] == subject]
        assert messages and all(words[name] in m for m in messages), (subject, messages)
        # What to do names the entry served (the finding is the hit record's).
        for finding in (f for f in findings if f["subject"] == subject):
            assert f"evict the entry ({finding['entry']})" in finding["hint"], finding
    assert not [f for f in findings if f["subject"] == "ca::scaled"]


def test_pytest_plugin_of_a_served_session_names_each_changed_input(served: Served) -> None:
    """`pytest --cacheaudit` of a session whose tests compile the same modules fails on the
    stale hits and names each op and option; the control's op is not named."""
    output = served.plugin.stdout
    assert served.plugin.returncode == 1, output[-3000:] + served.plugin.stderr[-3000:]
    assert "5 passed" in output, output[-3000:]
    blocks = _finding_blocks(output)
    for subject in SUBJECTS.values():
        assert any(subject in words for head, words in blocks if head.endswith("CA101 error")
                   ), (subject, output[-3000:])
    assert not [head for head, _ in blocks if head.endswith("error")
                and head.rsplit(": ", 1)[0] in served.entries["scaled"]], output[-3000:]
    assert "ca::scaled" not in output, output[-3000:]
    # What to do names the entry: the session's own hit record's finding, which it keeps.
    assert "evict the entry (the entry)" not in " ".join(output.split()), output[-3000:]


def _finding_blocks(output: str) -> list[tuple[str, set[str]]]:
    """The plugin's finding blocks, each as (`LOCATION: CODE severity`, the words of the block,
    its wrapped lines joined), from each headline `LOCATION: CODE severity message`."""
    blocks: list[tuple[str, list[str]]] = []
    for line in output.splitlines():
        head = line.split(" ", 3)
        if len(head) >= 3 and head[0].endswith(":") and head[1].startswith("CA") and head[
                2] in ("error", "warning", "info"):
            blocks.append((" ".join(head[:3]), [line]))
        elif blocks and line.startswith(" "):
            blocks[-1][1].append(line)
    return [(head, set(" ".join(lines).replace("'s ", " ").replace(": ", " ").split()))
            for head, lines in blocks]


def test_a_later_scan_names_each_changed_input(served: Served) -> None:
    """A later `cacheaudit scan` of the cache: the hits the adapter recorded carry what changed
    (the op, the option), and the scan reports it on each served FX entry as the run did
    (`Policy.record_findings` of the entry's recorded hits); the control's entry raises no
    error."""
    assert served.scan_status == 1
    _names_each_blind_spot_on_its_entry(_errors(served.scan["findings"]), served)


def test_every_aotautograd_entry_has_its_save_recorded_and_scan_ties_it(served: Served) -> None:
    """The AOTAutograd saves (`AOTAutogradCache._write_to_local_cache`): one `compile` record
    per entry the first process wrote (torch's `autograd_cache_saved` counter says how many;
    the later processes were hits and saved none), each naming its entry file under
    `aotautograd/<key>/` and its key; the later scan ties every AOTAutograd entry to its save
    (no CA501 on any) and raises no error on the control's."""
    saved = sum(served.built[name]["aot_autograd"].get("autograd_cache_saved", 0)
                for name, _, _ in MODULES)
    assert saved >= 1, served.built
    assert len(served.aot_saves) == saved == len(served.aot_files), (
        [r.entry for r in served.aot_saves], sorted(served.aot_files))
    assert {str(r.entry) for r in served.aot_saves} == served.aot_files
    assert all(os.path.basename(os.path.dirname(str(r.entry))) == r.key
               for r in served.aot_saves), [(r.key, r.entry) for r in served.aot_saves]
    unrecorded = {str(f["entry"]) for f in served.scan["findings"] if f["code"] == "CA501"}
    assert not unrecorded & served.aot_files, sorted(unrecorded)


def test_an_entry_served_twice_is_one_finding_per_op(served: Served) -> None:
    """Each stale FX entry was served twice (by the `cacheaudit run` process and by the pytest
    session: two adapter disk-hit records of it), yet it is one finding per op: once in the
    session's report (which also scans the entry, with the earlier run's hit on it) and once on
    the later scan, whose `counts` `--fail-on` judges."""
    named = {entry for _, _, entry in _errors(served.scan["findings"])}
    twice = {name: {e for e in served.entries[name] & named if served.fx_hits.get(e, 0) >= 2}
             for name in SUBJECTS}
    assert all(twice.values()), (served.fx_hits, served.entries)
    blocks = _finding_blocks(served.plugin.stdout)
    for name, subject in SUBJECTS.items():
        for entry in twice[name]:
            same = [f for f in served.scan["findings"]
                    if (f["code"], f["subject"], f["entry"]) == ("CA101", subject, entry)]
            assert len(same) == 1, (subject, entry, same)
            shown = [head for head, words in blocks
                     if head == f"{entry}: CA101 error" and subject in words]
            assert len(shown) == 1, (subject, entry, served.plugin.stdout[-3000:])
    assert served.scan["counts"].get("CA101") == len(_errors(served.scan["findings"]))


def test_explain_of_a_served_entry_says_when_it_was_last_hit(served: Served) -> None:
    """`cacheaudit explain` of an FX entry: Inductor leaves no hit marker, so the last hit is
    the latest of the adapter's disk-hit records of it (the pytest session's, after the
    `cacheaudit run` process's), not "-"."""
    from cacheaudit.ledger import Ledger

    entry = sorted(e for e in served.entries["formula"] if served.fx_hits.get(e, 0) >= 2)[0]
    with Ledger.open(served.env["CACHEAUDIT_LEDGER"], create=False) as ledger:
        latest = max(r.started_ns for r in ledger.records()
                     if r.entry == entry and r.event == "disk-hit")
    done = subprocess.run([sys.executable, "-m", "cacheaudit", "explain", entry], env=served.env,
                          capture_output=True, text=True, timeout=300)
    assert done.returncode in (0, 1), done.stderr
    [line] = [x for x in done.stdout.splitlines() if x.strip().startswith("last hit")]
    from cacheaudit.findings import ns_text

    assert ns_text(latest) in line and "recorded in the ledger" in line, line
