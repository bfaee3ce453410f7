"""Include graphs: depfile parsing, graphs from real gcc/nvcc depfiles, the concurrent -M pass.

Real compilers and real files throughout; the only stand-in compilers are small scripts used where
a real compiler cannot be made to behave (block until told, flood its output, hang).
"""

from __future__ import annotations

import os
import shutil
import signal
import stat
import subprocess
import sys
import time
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from cacheaudit.digest import StateCache, hash_file
from cacheaudit.graph import (
    STDERR_LIMIT,
    DependencyResult,
    DepfileError,
    DepRule,
    NinjaDepsLogError,
    decode_depfile,
    depfile_inputs,
    depfile_option,
    graph_from_depfile,
    parse_depfile,
    parse_ninja_deps,
    parse_ninja_deps_log,
    start_dependency_pass,
)

from support import GXX, NVCC, needs_gxx, needs_nvcc

# ------------------------------------------------------------------------------------------
# A depfile writer that follows gcc's rules (libcpp/mkdeps.cc, `munge`; checked against gcc 12)
# ------------------------------------------------------------------------------------------


def gcc_escape(name: str) -> str:
    """Quote a name as gcc 12 does: `$` doubled, `#` after one backslash, and a space or tab after
    one backslash plus a doubling of the backslashes right before it. Colons are not escaped."""
    out: list[str] = []
    slashes = 0
    for c in name:
        if c == "\\":
            slashes += 1
            out.append(c)
            continue
        if c == "$":
            out.append("$$")
        elif c in " \t":
            out.append("\\" * slashes + "\\" + c)
        elif c == "#":
            out.append("\\#")
        else:
            out.append(c)
        slashes = 0
    return "".join(out)


def write_depfile(rules: list[DepRule], *, fold_every: int = 0, nvcc_colon: bool = False,
                  crlf: bool = False, blank_lines: bool = False) -> str:
    """Rules as gcc (or, with `nvcc_colon` and `blank_lines`, nvcc) would lay them out."""
    newline = "\r\n" if crlf else "\n"
    lines: list[str] = []
    for rule in rules:
        parts = [gcc_escape(t) for t in rule.targets]
        text = " ".join(parts) + (" :" if nvcc_colon else ":")
        for index, name in enumerate(rule.prerequisites):
            if fold_every and index % fold_every == fold_every - 1:
                text += " \\" + newline + "   "
            text += " " + gcc_escape(name)
        lines.append(text)
        if blank_lines:
            lines.append("")
    return newline.join(lines) + newline


# ------------------------------------------------------------------------------------------
# Parser: hand-written depfiles
# ------------------------------------------------------------------------------------------


def test_basic_rule_with_continuations() -> None:
    text = "build/k.o: src/k.cc include/a.h \\\n  include/b.h \\\n include/c.h\n"
    assert parse_depfile(text) == [
        DepRule(("build/k.o",), ("src/k.cc", "include/a.h", "include/b.h", "include/c.h"))
    ]


def test_crlf_line_ends_and_continuations() -> None:
    text = "foo.o: \\\r\n  bar.h baz.h \\\r\n qux.h\r\nbar.h:\r\n"
    assert parse_depfile(text) == [
        DepRule(("foo.o",), ("bar.h", "baz.h", "qux.h")),
        DepRule(("bar.h",), ()),
    ]


def test_escaped_spaces_and_tabs() -> None:
    text = "a\\ bc\\ def.o:   a\\ b c d\\\te\n"
    assert parse_depfile(text) == [DepRule(("a bc def.o",), ("a b", "c", "d\te"))]


def test_backslashes_before_a_space_follow_gcc_counting() -> None:
    # 2N+1 backslashes + space: N backslashes and a space inside the name;
    # 2N backslashes + space: the 2N backslashes end the name (ninja's reading of gcc).
    text = "t.o: a\\\\\\ b c\\\\ d\n"
    assert parse_depfile(text) == [DepRule(("t.o",), ("a\\ b", "c\\\\", "d"))]


def test_hash_and_dollar_escapes() -> None:
    text = "t.o: \\#x.h a\\\\#b.h $$HOME/c.h d$e.h p$$$$q.h\n"
    assert parse_depfile(text) == [
        DepRule(("t.o",), ("#x.h", "a\\#b.h", "$HOME/c.h", "d$e.h", "p$$q.h"))
    ]


def test_unescaped_hash_is_part_of_a_name() -> None:
    # nvcc writes '#' raw; it is neither a comment (make) nor a separator (ninja) here.
    assert parse_depfile("t.o : we\\ ird#dir/h.h\n") == [DepRule(("t.o",), ("we ird#dir/h.h",))]


def test_backslashes_that_are_not_escapes_stay() -> None:
    text = (
        "Project\\Dir\\Build\\Foo.res : \\\n"
        "  Dir\\Library\\Foo.rc \\\n"
        "  Dir\\Library\\Version\\Bar.h \\\n"
        "  Project\\Thing\\Bar.tlb\\\\\n"
    )
    assert parse_depfile(text) == [
        DepRule(
            ("Project\\Dir\\Build\\Foo.res",),
            ("Dir\\Library\\Foo.rc", "Dir\\Library\\Version\\Bar.h", "Project\\Thing\\Bar.tlb\\\\"),
        )
    ]


def test_several_targets_and_several_rules_with_blank_lines() -> None:
    text = "\n\na.o b.o: x.h y.h\n\n   \nc.o: z.h\n\n"
    assert parse_depfile(text) == [
        DepRule(("a.o", "b.o"), ("x.h", "y.h")),
        DepRule(("c.o",), ("z.h",)),
    ]


def test_phony_rules_of_mp() -> None:
    text = "k.o: k.cc a.h b.h\na.h:\nb.h:\n"
    rules = parse_depfile(text)
    assert rules == [
        DepRule(("k.o",), ("k.cc", "a.h", "b.h")),
        DepRule(("a.h",), ()),
        DepRule(("b.h",), ()),
    ]
    assert depfile_inputs(rules) == ["k.cc", "a.h", "b.h"]


def test_nvcc_layout_space_before_colon_and_blank_lines_between_phony_rules() -> None:
    text = (
        "kern.o : kern.cu \\\n"
        "    /usr/local/cuda-13.0/bin/../targets/x86_64-linux/include/cuda_runtime.h \\\n"
        "    src/local.h\n"
        "\n"
        "/usr/local/cuda-13.0/bin/../targets/x86_64-linux/include/cuda_runtime.h:\n"
        "\n"
        "src/local.h:\n"
        "\n"
    )
    rules = parse_depfile(text)
    assert rules[0] == DepRule(
        ("kern.o",),
        ("kern.cu", "/usr/local/cuda-13.0/bin/../targets/x86_64-linux/include/cuda_runtime.h",
         "src/local.h"),
    )
    assert [r.prerequisites for r in rules[1:]] == [(), ()]
    assert depfile_inputs(rules) == list(rules[0].prerequisites)


def test_colons_inside_names() -> None:
    # gcc 12 leaves ':' unescaped: it ends the targets only when whitespace or the end follows.
    text = "c:dir/t.o: c:dir/x.h d:\nc:dir/x.h:\n"
    assert parse_depfile(text) == [
        DepRule(("c:dir/t.o",), ("c:dir/x.h", "d:")),
        DepRule(("c:dir/x.h",), ()),
    ]
    # '\:' is ':' (one mkdeps.cc revision escaped ':' like '#'), as ninja reads it.
    assert parse_depfile("C\\:/x.o: C\\:/y.h\n") == [DepRule(("C:/x.o",), ("C:/y.h",))]
    # A colon straight before a continuation also ends the targets.
    assert parse_depfile("t.o:\\\n a.h\n") == [DepRule(("t.o",), ("a.h",))]


def test_unicode_names_and_no_trailing_newline() -> None:
    assert parse_depfile("Fußball/ü.o: 字/頭.h en@quot.h~ t+t-x!=1") == [
        DepRule(("Fußball/ü.o",), ("字/頭.h", "en@quot.h~", "t+t-x!=1"))
    ]


def test_empty_and_blank_text_have_no_rules() -> None:
    assert parse_depfile("") == []
    assert parse_depfile("\n \t\n\r\n \\\n\n") == []


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("hello world\n", "line 1: no ':'"),
        ("a.o: b.h\nstray words here\n", "line 2: no ':'"),
        ("a.o: b.h\n\n: c.h\n", "line 3: rule without a target"),
        ("a.o: b\x00.h\n", "NUL"),
        ("#include <stdio.h>\nint main() {}\n", "no ':'"),
    ],
)
def test_text_that_is_not_a_depfile_raises(text: str, message: str) -> None:
    with pytest.raises(DepfileError, match=message):
        parse_depfile(text)
    assert issubclass(DepfileError, ValueError)


def test_depfile_inputs_once_in_first_seen_order() -> None:
    rules = [
        DepRule(("a.o",), ("a.cc", "x.h", "y.h", "x.h")),
        DepRule(("b.o",), ("b.cc", "y.h", "z.h")),
        DepRule(("x.h",), ()),
    ]
    assert depfile_inputs(rules) == ["a.cc", "x.h", "y.h", "b.cc", "z.h"]


def test_decode_depfile_round_trips_undecodable_bytes() -> None:
    raw = b"t.o: caf\xe9.h\n"
    text = decode_depfile(raw)
    (name,) = depfile_inputs(parse_depfile(text))
    assert os.fsencode(name) == b"caf\xe9.h"


def test_depfile_option() -> None:
    assert depfile_option(["-M", "-MF", "out.d", "x.cc"]) == "out.d"
    assert depfile_option(["-M", "-MFout.d"]) == "out.d"
    assert depfile_option(["--dependency-output", "a.d"]) == "a.d"
    assert depfile_option(["--dependency-output=a.d", "-MF", "b.d"]) == "b.d"
    assert depfile_option(["-MF", "rel/x.d"], cwd="/base") == "/base/rel/x.d"
    assert depfile_option(["-MF", "/abs/x.d"], cwd="/base") == "/abs/x.d"
    assert depfile_option(["-M", "x.cc"]) is None
    assert depfile_option(["-MF"]) is None


# ------------------------------------------------------------------------------------------
# Parser: properties
# ------------------------------------------------------------------------------------------

# Left out of generation, because gcc cannot write them unambiguously:
# - empty names, and names with a newline, a carriage return or a NUL (gcc does not escape \n
#   or \r; \r\n reads as a line end; NUL cannot be in a path);
# - names ending in an odd number of backslashes (gcc writes trailing backslashes as they are,
#   so the last one escapes the blank that follows; an even number reads back fine);
# - a backslash right before ':' (one gcc revision wrote '\:' for ':', gcc 12 writes the
#   backslash as it is; we read '\:' as ':', as ninja does);
# - targets ending in ':' (indistinguishable from the rule's own colon).
_SPECIAL = st.sampled_from(
    [" ", "\t", "#", "$", "$$", "\\", "\\\\", ":", "%", "*", "&", ";", "|", "'", '"', "é",
     "字", "\x0b", "\x85", "\u2028", "/", ".."]
)
_ANY = st.characters(blacklist_characters="\n\r\x00", blacklist_categories=("Cs",))
_names = st.lists(st.one_of(_SPECIAL, _ANY, _ANY), min_size=1, max_size=12).map("".join)


def _representable(name: str) -> bool:
    trailing = len(name) - len(name.rstrip("\\"))
    return bool(name) and trailing % 2 == 0 and "\\:" not in name


_prereqs = _names.filter(_representable)
_targets = _prereqs.filter(lambda n: not n.endswith(":"))
_rules = st.builds(
    lambda targets, prereqs: DepRule(tuple(targets), tuple(prereqs)),
    st.lists(_targets, min_size=1, max_size=3),
    st.lists(_prereqs, min_size=0, max_size=6),
)


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.filter_too_much])
@given(
    rules=st.lists(_rules, min_size=1, max_size=4),
    fold_every=st.integers(min_value=0, max_value=3),
    nvcc_colon=st.booleans(),
    crlf=st.booleans(),
    blank_lines=st.booleans(),
)
def test_round_trip_of_gcc_escaping(rules: list[DepRule], fold_every: int, nvcc_colon: bool,
                                    crlf: bool, blank_lines: bool) -> None:
    text = write_depfile(rules, fold_every=fold_every, nvcc_colon=nvcc_colon, crlf=crlf,
                         blank_lines=blank_lines)
    assert parse_depfile(text) == rules
    expected = list(dict.fromkeys(p for r in rules for p in r.prerequisites))
    assert depfile_inputs(parse_depfile(text)) == expected


@settings(max_examples=300, deadline=None)
@given(st.text(alphabet=st.sampled_from(list("ab :\\#$\t\n\r\x00é")) | st.characters()))
def test_arbitrary_text_parses_or_raises_depfile_error(text: str) -> None:
    try:
        rules = parse_depfile(text)
    except DepfileError:
        return
    for rule in rules:
        assert rule.targets
        assert all(rule.targets) and all(rule.prerequisites)


# ------------------------------------------------------------------------------------------
# Parser: what real compilers write for awkward paths
# ------------------------------------------------------------------------------------------


@needs_gxx
def test_real_gcc_depfile_with_space_hash_dollar_and_tab(tmp_path: Path) -> None:
    weird = tmp_path / "we ird#d$ir" / "t\tab"
    weird.mkdir(parents=True)
    (weird / "h h#$.h").write_text("int a;\n")
    src = tmp_path / "m a$in.cc"
    src.write_text('#include "we ird#d$ir/t\tab/h h#$.h"\nint main() { return a; }\n')
    depfile = tmp_path / "out.d"
    subprocess.run([GXX, "-M", "-MP", "-MF", str(depfile), src.name], cwd=tmp_path, check=True)
    rules = parse_depfile(depfile.read_text())
    inputs = depfile_inputs(rules)
    assert "we ird#d$ir/t\tab/h h#$.h" in inputs
    assert rules[0].targets == ("m a$in.o",)
    for name in inputs:
        assert (tmp_path / name).exists(), name
    # -MP: one phony rule per header, none adding inputs.
    assert [r.targets[0] for r in rules[1:]] == inputs[1:]


@pytest.mark.nvcc
@needs_nvcc
def test_real_nvcc_depfile_with_space_hash_and_dollar(tmp_path: Path) -> None:
    # nvcc escapes only spaces: '#', '$' stay raw (read as plain characters). It mangles tabs
    # and backslashes (written raw / as '/'), and cannot compile a source whose name has '$',
    # so those are not tried here.
    weird = tmp_path / "we ird#d$ir"
    weird.mkdir()
    (weird / "h h#$.h").write_text("int a;\n")
    src = tmp_path / "k ern.cu"
    src.write_text('#include "we ird#d$ir/h h#$.h"\n__global__ void k(int* p) { *p = a; }\n')
    depfile = tmp_path / "nv.d"
    subprocess.run([NVCC, "-M", "-MP", "-MF", str(depfile), "-arch=sm_90", src.name],
                   cwd=tmp_path, check=True)
    rules = parse_depfile(depfile.read_text())
    inputs = depfile_inputs(rules)
    assert inputs[0] == "k ern.cu"
    assert "we ird#d$ir/h h#$.h" in inputs
    for name in inputs:
        assert (tmp_path / name).exists(), name


# ------------------------------------------------------------------------------------------
# Graphs from real compilers
# ------------------------------------------------------------------------------------------


def _make_tree(root: Path, suffix: str, body: str) -> dict[str, Path]:
    """A project with headers from -I, from CPATH (through a symlink) and quoted includes."""
    proj = root / "proj"
    (proj / "src" / "sub").mkdir(parents=True)
    (proj / "inc").mkdir()
    (root / "cpath-real").mkdir()
    (root / "cpath").symlink_to(root / "cpath-real")
    (proj / "inc" / "inc_a.h").write_text("#pragma once\n#define A 1\n")
    (root / "cpath-real" / "cpath_c.h").write_text("#pragma once\n#define C 2\n")
    (proj / "src" / "local.h").write_text("#ifndef L_H\n#define L_H\n#define L 3\n#endif\n")
    src = proj / "src" / f"main{suffix}"
    src.write_text(
        "#include <inc_a.h>\n"
        "#include <cpath_c.h>\n"
        '#include "local.h"\n'
        '#include "sub/../local.h"\n' + body
    )
    work = root / "work"  # the caller's temporary directory for the depfile
    work.mkdir()
    return {"proj": proj, "src": src, "cpath": root / "cpath", "work": work}


def _listing(path: Path) -> set[str]:
    return {str(p.relative_to(path)) for p in path.rglob("*")}


def _check_graph(text: str, tree: dict[str, Path], method: str) -> tuple:
    cache = StateCache()
    proj = tree["proj"]
    src_real = os.path.realpath(tree["src"])
    sources, graph = graph_from_depfile(text, str(proj), [src_real], cache, method)
    listed = {os.path.realpath(os.path.join(proj, p))
              for p in depfile_inputs(parse_depfile(text))}
    # Every file the compiler listed is either a source or in the graph, once.
    assert {s.path for s in sources} | set(graph.paths) == listed
    assert len(set(graph.paths)) == len(graph.paths)
    assert [s.path for s in sources] == [src_real]
    assert src_real not in graph.paths
    assert graph.method == method
    by_written = {f.written: f for f in graph.files}
    assert by_written["inc/inc_a.h"].path == str(proj / "inc" / "inc_a.h")
    assert by_written["src/local.h"].path == str(proj / "src" / "local.h")
    # The second spelling of local.h is the same file: only the first written form is kept.
    assert "src/sub/../local.h" not in by_written
    # CPATH through a symlink: written as the compiler saw it, stored under the realpath.
    cpath_written = str(tree["cpath"] / "cpath_c.h")
    assert by_written[cpath_written].path == os.path.realpath(cpath_written)
    assert "cpath-real" in by_written[cpath_written].path
    for f in graph.files:
        assert f.state.exists and f.state.digest == hash_file(f.path)
        assert f.path == os.path.realpath(f.path)
    assert sources[0].digest == hash_file(src_real)
    return sources, graph


@needs_gxx
def test_gcc_graph_with_include_dir_cpath_and_quoted_includes(tmp_path: Path) -> None:
    tree = _make_tree(tmp_path, ".cc", "int main() { return A + C + L; }\n")
    before = _listing(tree["proj"])
    depfile = str(tree["work"] / "deps.d")
    env = dict(os.environ, CPATH=str(tree["cpath"]))
    dep_pass = start_dependency_pass(GXX, ["-M", "-MF", depfile, "-I", "inc", "src/main.cc"],
                                     str(tree["proj"]), env)
    assert dep_pass.depfile == depfile
    result = dep_pass.wait(30)
    assert result.ok, result
    assert result.exit_code == 0 and result.error is None
    _, graph = _check_graph(result.depfile_text or "", tree, "gcc-M")
    assert any(p.startswith("/usr/include/") for p in graph.paths)
    assert _listing(tree["proj"]) == before  # nothing created next to the user's files


@pytest.mark.nvcc
@needs_nvcc
def test_nvcc_graph_normalises_cuda_headers(tmp_path: Path) -> None:
    tree = _make_tree(tmp_path, ".cu", "__global__ void k(int* p) { *p = A + C + L; }\n")
    before = _listing(tree["proj"])
    depfile = str(tree["work"] / "deps.d")
    env = dict(os.environ, CPATH=str(tree["cpath"]))
    # -cubin next to -M: the shim's dependency argv keeps the compile's phase options.
    argv = ["-M", "-MF", depfile, "-cubin", "-arch=sm_90", "-I", "inc", "src/main.cu"]
    result = start_dependency_pass(NVCC, argv, str(tree["proj"]), env).wait(60)
    assert result.ok, result
    _, graph = _check_graph(result.depfile_text or "", tree, "nvcc-M")
    cuda = [f for f in graph.files if "bin/../targets" in f.written]
    assert any(f.written.endswith("/cuda_runtime.h") for f in cuda)
    for f in cuda:
        assert ".." not in f.path.split("/")
        assert f.path == os.path.realpath(f.written)
        assert os.path.samefile(f.path, f.written)
    assert _listing(tree["proj"]) == before


def test_graph_keeps_missing_files_and_dedupes_by_realpath(tmp_path: Path) -> None:
    (tmp_path / "d").mkdir()
    (tmp_path / "d" / "a.h").write_text("a\n")
    (tmp_path / "link").symlink_to(tmp_path / "d")
    (tmp_path / "s1.cu").write_text("1\n")
    (tmp_path / "s2.cu").write_text("2\n")
    text = "k.o: s1.cu link/a.h d/a.h gone.h \\\n s2.cu ./s1.cu\nlink/a.h:\n"
    s1, s2 = (os.path.realpath(tmp_path / n) for n in ("s1.cu", "s2.cu"))
    sources, graph = graph_from_depfile(text, str(tmp_path), [s2, s1], StateCache(), "test")
    assert [s.path for s in sources] == [s2, s1]  # the order of `sources`
    assert [f.written for f in graph.files] == ["link/a.h", "gone.h"]
    assert graph.files[0].path == os.path.realpath(tmp_path / "d" / "a.h")
    gone = graph.files[1].state
    assert not gone.exists and gone.path == str(tmp_path / "gone.h")


def test_graph_digest_is_shared_across_different_sources(tmp_path: Path) -> None:
    (tmp_path / "a.h").write_text("a\n")
    for name in ("k1.cu", "k2.cu"):
        (tmp_path / name).write_text(name)
    cache = StateCache()
    graphs = [
        graph_from_depfile(f"{n[:2]}.o: {n} a.h\n", str(tmp_path),
                           [str(tmp_path / n)], cache, "m")[1]
        for n in ("k1.cu", "k2.cu")
    ]
    assert graphs[0] == graphs[1] and graphs[0].digest == graphs[1].digest


def test_graph_from_bad_text_raises_depfile_error(tmp_path: Path) -> None:
    with pytest.raises(DepfileError):
        graph_from_depfile("not a depfile\n", str(tmp_path), [], StateCache(), "m")


# ------------------------------------------------------------------------------------------
# The dependency pass
# ------------------------------------------------------------------------------------------


def _script(path: Path, body: str) -> str:
    """A stand-in compiler: a Python script run by this interpreter."""
    path.write_text(f"#!{sys.executable}\nimport os, sys, time\n{body}")
    path.chmod(path.stat().st_mode | stat.S_IXUSR)
    return str(path)


def test_pass_runs_concurrently_with_the_caller(tmp_path: Path) -> None:
    # The stand-in writes its depfile only after the caller, having got control back from
    # start_dependency_pass, creates `go`: were the pass run synchronously, this would hang.
    go = tmp_path / "go"
    compiler = _script(tmp_path / "fake-cc", (
        "dep = sys.argv[sys.argv.index('-MF') + 1]\n"
        "deadline = time.time() + 20\n"
        f"while not os.path.exists({str(go)!r}) and time.time() < deadline:\n"
        "    time.sleep(0.01)\n"
        "open(dep, 'w').write('t.o: t.cu a.h\\n')\n"
    ))
    depfile = str(tmp_path / "out" / "t.d")
    (tmp_path / "out").mkdir()
    dep_pass = start_dependency_pass(compiler, ["-M", "-MF", depfile, "t.cu"], str(tmp_path),
                                     dict(os.environ))
    assert dep_pass.running
    go.write_text("")
    result = dep_pass.wait(20)
    assert not result.timed_out
    assert result.ok and parse_depfile(result.depfile_text or "") == [
        DepRule(("t.o",), ("t.cu", "a.h"))
    ]
    assert dep_pass.wait() is result  # waiting again gives the same result
    dep_pass.kill()  # harmless once finished


@needs_gxx
def test_real_gcc_pass_next_to_a_real_compile(tmp_path: Path) -> None:
    tree = _make_tree(tmp_path, ".cc", "int main() { return A + C + L; }\n")
    env = dict(os.environ, CPATH=str(tree["cpath"]))
    depfile = str(tree["work"] / "deps.d")
    proj = str(tree["proj"])
    dep_pass = start_dependency_pass(GXX, ["-M", "-MF", depfile, "-I", "inc", "src/main.cc"],
                                     proj, env)
    compiled = subprocess.run(
        [GXX, "-c", "-I", "inc", "src/main.cc", "-o", str(tree["work"] / "main.o")],
        cwd=proj, env=env, capture_output=True)
    assert compiled.returncode == 0, compiled.stderr
    result = dep_pass.wait(30)
    assert result.ok and result.stderr == ""
    assert "inc/inc_a.h" in depfile_inputs(parse_depfile(result.depfile_text or ""))


@needs_gxx
def test_failing_pass_reports_exit_code_and_stderr(tmp_path: Path) -> None:
    (tmp_path / "bad.cc").write_text('#include "nope.h"\nint main() {}\n')
    depfile = str(tmp_path / "bad.d")
    result = start_dependency_pass(GXX, ["-M", "-MF", depfile, "bad.cc"], str(tmp_path),
                                   dict(os.environ)).wait(30)
    assert isinstance(result, DependencyResult)
    assert result.exit_code not in (0, None)
    assert "nope.h" in result.stderr and "No such file" in result.stderr
    assert result.depfile_text is None and not result.ok
    assert result.error == f"dependency pass exited with status {result.exit_code}"


def test_missing_compiler_gives_a_result_not_an_exception(tmp_path: Path) -> None:
    missing = str(tmp_path / "no-such-nvcc")
    dep_pass = start_dependency_pass(missing, ["-M", "-MF", str(tmp_path / "x.d"), "x.cu"],
                                     str(tmp_path), dict(os.environ))
    assert not dep_pass.running
    result = dep_pass.wait(5)
    assert result.exit_code is None and not result.ok and not result.timed_out
    assert result.error is not None
    assert "cannot start compiler" in result.error and missing in result.error
    assert "No such file" in result.error
    dep_pass.kill()
    # A bare name not on the PATH of the given environment: the same.
    result = start_dependency_pass("no-such-cc-4d1f", ["-M"], str(tmp_path),
                                   {"PATH": str(tmp_path)}).wait(5)
    assert result.exit_code is None and "no-such-cc-4d1f" in (result.error or "")


def test_missing_working_directory_is_named(tmp_path: Path) -> None:
    result = start_dependency_pass(sys.executable, ["-c", "pass"], str(tmp_path / "nowhere"),
                                   dict(os.environ)).wait(5)
    assert result.exit_code is None
    assert "working directory" in (result.error or "")


def _process_gone(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as handle:
            return handle.read().rsplit(")", 1)[1].split()[0] in ("Z", "X")
    except FileNotFoundError:
        return True


def test_timeout_kills_the_pass_and_its_children(tmp_path: Path) -> None:
    pidfile = tmp_path / "child.pid"
    compiler = _script(tmp_path / "hang-cc", (
        "import subprocess\n"
        "child = subprocess.Popen(['sleep', '60'])\n"
        f"open({str(pidfile)!r}, 'w').write(str(child.pid))\n"
        "child.wait()\n"
    ))
    dep_pass = start_dependency_pass(compiler, ["-M", "-MF", str(tmp_path / "x.d")],
                                     str(tmp_path), dict(os.environ))
    deadline = time.monotonic() + 20
    while not pidfile.exists() or not pidfile.read_text():
        assert time.monotonic() < deadline
        time.sleep(0.01)
    started = time.monotonic()
    result = dep_pass.wait(0.3)
    assert time.monotonic() - started < 10
    assert result.timed_out and result.exit_code is None
    assert result.signal == signal.SIGKILL and "timed out" in (result.error or "")
    child = int(pidfile.read_text())
    while not _process_gone(child):
        assert time.monotonic() < deadline, "the pass's child survived kill()"
        time.sleep(0.01)


def test_kill_stops_a_running_pass(tmp_path: Path) -> None:
    with start_dependency_pass(sys.executable, ["-c", "import time; time.sleep(60)"],
                               str(tmp_path), dict(os.environ)) as dep_pass:
        assert dep_pass.running
    result = dep_pass.wait()
    assert result.signal == signal.SIGKILL and not result.ok


def test_big_output_neither_blocks_nor_floods(tmp_path: Path) -> None:
    compiler = _script(tmp_path / "loud-cc", (
        "sys.stdout.write('o' * 3_000_000); sys.stdout.flush()\n"
        "sys.stderr.write('FIRST ' + 'e' * 3_000_000 + ' LAST'); sys.stderr.flush()\n"
        "open(sys.argv[sys.argv.index('-MF') + 1], 'w').write('t.o: t.cu\\n')\n"
    ))
    result = start_dependency_pass(compiler, ["-MF", "t.d"], str(tmp_path),
                                   dict(os.environ)).wait(30)
    assert result.ok
    assert len(result.stderr) < STDERR_LIMIT + 100
    assert result.stderr.startswith("FIRST") and result.stderr.endswith(" LAST")
    assert "bytes left out" in result.stderr


def test_depfile_on_stdout_when_argv_names_none(tmp_path: Path) -> None:
    compiler = _script(tmp_path / "stdout-cc", "print('t.o: t.cu a.h')\n")
    dep_pass = start_dependency_pass(compiler, ["-M", "t.cu"], str(tmp_path), dict(os.environ))
    assert dep_pass.depfile is None
    result = dep_pass.wait(30)
    assert result.ok and depfile_inputs(parse_depfile(result.depfile_text or "")) == [
        "t.cu", "a.h"
    ]


def test_a_depfile_left_from_before_is_not_taken_for_this_run(tmp_path: Path) -> None:
    depfile = tmp_path / "old.d"
    depfile.write_text("old.o: old.h\n")
    true = shutil.which("true") or "/bin/true"
    result = start_dependency_pass(true, ["-M", "-MF", str(depfile)], str(tmp_path),
                                   dict(os.environ)).wait(10)
    assert result.exit_code == 0 and result.depfile_text is None and not result.ok
    assert "not rewritten" in (result.error or "")
    assert depfile.read_text() == "old.o: old.h\n"  # nothing removed that we did not create
    (tmp_path / "new.d").unlink(missing_ok=True)
    result = start_dependency_pass(true, ["-MF", "new.d"], str(tmp_path), dict(os.environ)).wait()
    assert "not written" in (result.error or "")


def test_ninja_deps_from_a_real_ninja_build(tmp_path):
    ninja = shutil.which("ninja", path=os.pathsep.join([os.path.dirname(sys.executable),
                                                        os.environ.get("PATH", "")]))
    if ninja is None or GXX is None:
        pytest.skip("ninja or g++ is not available")
    (tmp_path / "inc").mkdir()
    (tmp_path / "inc" / "a.h").write_text("#define A 1\n")
    (tmp_path / "sys").mkdir()
    (tmp_path / "sys" / "s.h").write_text("#define S 2\n")
    (tmp_path / "x.cpp").write_text('#include "a.h"\n#include <s.h>\nint x = A + S;\n')
    (tmp_path / "build.ninja").write_text(
        "rule cxx\n  command = g++ -MMD -MF $out.d -Iinc -isystem sys -c $in -o $out\n"
        "  depfile = $out.d\n  deps = gcc\nbuild x.o: cxx x.cpp\n")
    subprocess.run([ninja], cwd=tmp_path, check=True, capture_output=True)
    text = subprocess.run([ninja, "-t", "deps"], cwd=tmp_path, check=True, capture_output=True,
                          text=True).stdout
    [deps] = parse_ninja_deps(text)
    # -MMD leaves the -isystem header out: what torch's builds miss.
    assert deps.target == "x.o" and deps.inputs == ("x.cpp", "inc/a.h") and deps.valid
    assert deps.mtime_ns and deps.mtime_ns > 10**18
    with pytest.raises(DepfileError):
        parse_ninja_deps("this is not ninja output\n")


def test_deps_log_parser_keeps_the_latest_record_and_stops_at_a_torn_tail():
    def node(path: bytes, index: int) -> bytes:
        padded = path + b"\0" * (-len(path) % 4)
        body = padded + ((~index) & 0xFFFFFFFF).to_bytes(4, sys.byteorder)
        return len(body).to_bytes(4, sys.byteorder) + body

    def deps(out: int, mtime: int, ids: list[int]) -> bytes:
        words = [out, mtime & 0xFFFFFFFF, mtime >> 32, *ids]
        body = b"".join(w.to_bytes(4, sys.byteorder) for w in words)
        return (len(body) | 0x80000000).to_bytes(4, sys.byteorder) + body

    log = (b"# ninjadeps\n" + (4).to_bytes(4, sys.byteorder) + node(b"k.o", 0)
           + node(b"/s/k.cpp", 1) + node(b"/i/a.h", 2) + deps(0, 5 << 32, [1, 2])
           + deps(0, 7, [1]) + b"\x10\x00\x00")
    [entry] = parse_ninja_deps_log(log).values()
    assert (entry.target, entry.mtime_ns, entry.inputs) == ("k.o", 7, ("/s/k.cpp",))
    with pytest.raises(NinjaDepsLogError):
        parse_ninja_deps_log(b"# ninjadeps\n" + (3).to_bytes(4, sys.byteorder))


def test_a_raw_newline_continues_a_name_only_where_the_compile_names_it() -> None:
    # What g++ 12 writes for `g++ -M 'ker<LF>nel.cc'`: the newline raw in target and source.
    text = "ker\nnel.o: ker\nnel.cc /usr/include/stdc-predef.h inc/a.h\n"
    assert parse_depfile(text, ["/work/src/ker\nnel.cc"]) == [
        DepRule(("ker\nnel.o",), ("ker\nnel.cc", "/usr/include/stdc-predef.h", "inc/a.h"))]
    with pytest.raises(DepfileError, match="line 1: no ':'"):
        parse_depfile(text)
    # A newline in a directory of the source, and a known name that does not match this text.
    assert parse_depfile("t.o: di\nr/k.cc a.h\n", ["di\nr/k.cc"]) == [
        DepRule(("t.o",), ("di\nr/k.cc", "a.h"))]
    with pytest.raises(DepfileError, match="line 2: no ':'"):
        parse_depfile("t.o: b.h\nstray words\n", ["di\nr/k.cc"])
    # A header whose name is the first line of the source's name, last in the rule: the text
    # after the line end does not go on as the source's name does, so the rule ends there.
    assert parse_depfile("ker\nnel.o: ker\nnel.cc inc/ker\ninc/ker:\n", ["ker\nnel.cc"]) == [
        DepRule(("ker\nnel.o",), ("ker\nnel.cc", "inc/ker")), DepRule(("inc/ker",), ())]
