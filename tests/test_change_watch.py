"""`opens.ChangeWatch`: the moment stays while nothing under the covered files moved, and is new
after every kind of change an adapter must not miss (real files, real inotify)."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest

from cacheaudit.opens import ChangeWatch

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="inotify")


@pytest.fixture
def tree(tmp_path: Path) -> tuple[Path, ChangeWatch]:
    header = tmp_path / "include" / "sub" / "a.h"
    header.parent.mkdir(parents=True)
    header.write_text("#define A 1\n")
    (tmp_path / "other.txt").write_text("x")
    watch = ChangeWatch()
    assert watch.cover([str(header)]), watch.problem
    yield header, watch
    watch.close()


def _stamp(path: Path) -> None:
    stamp = path.stat().st_mtime_ns
    os.utime(path, ns=(stamp - 3600 * 10**9, stamp - 3600 * 10**9))


CHANGES = {
    "rewritten in place": lambda h: h.write_text("#define A 2\n"),
    "mtime put back": _stamp,
    "renamed over": lambda h: (h.with_name("new.h").write_text("#define A 3\n"),
                               os.replace(h.with_name("new.h"), h)),
    "deleted": lambda h: h.unlink(),
    "its directory renamed": lambda h: os.rename(h.parent, h.parent.with_name("moved")),
    "a sibling created": lambda h: h.with_name("b.h").write_text(""),
}


@pytest.mark.parametrize("change", sorted(CHANGES))
def test_every_change_under_a_covered_file_is_a_new_moment(tree: tuple[Path, ChangeWatch],
                                                           change: str) -> None:
    header, watch = tree
    quiet = watch.moment()
    assert watch.moment() == quiet  # nothing happened: the same moment
    header.stat()
    header.read_text()  # reads and stats are not changes
    assert watch.moment() == quiet, change
    CHANGES[change](header)
    changed = watch.moment()
    assert changed != quiet, f"{change} of {header} was not seen"
    assert watch.moment() == changed  # and quiet again after it


def test_the_watch_covers_every_ancestor_and_nothing_beside(tmp_path: Path) -> None:
    """A symlink retargeted in an ancestor directory is seen there; a file changed in a
    directory no covered path lies under is not a change."""
    real = tmp_path / "toolkit-a" / "include"
    real.mkdir(parents=True)
    (real / "a.h").write_text("")
    (tmp_path / "cuda").symlink_to(tmp_path / "toolkit-a")
    (tmp_path / "elsewhere").mkdir()
    watch = ChangeWatch()
    try:
        assert watch.cover([str(tmp_path / "cuda" / "include" / "a.h")]), watch.problem
        quiet = watch.moment()
        (tmp_path / "elsewhere" / "x").write_text("")
        assert watch.moment() == quiet
        (tmp_path / "cuda.new").symlink_to(tmp_path / "elsewhere")
        os.replace(tmp_path / "cuda.new", tmp_path / "cuda")
        assert watch.moment() != quiet, "the symlink retargeted in the covered path's ancestor"
    finally:
        watch.close()


def test_a_watch_it_cannot_keep_is_never_quiet(tmp_path: Path) -> None:
    """Fails closed: over its directory limit, a watch says so and every moment is new."""
    (tmp_path / "a").mkdir()
    watch = ChangeWatch(limit=1)
    assert not watch.cover([str(tmp_path / "a" / "x.h")])
    assert watch.problem is not None and "more than 1" in watch.problem
    assert watch.moment() != watch.moment()


def test_a_forked_child_does_not_read_its_parents_queue(tree: tuple[Path, ChangeWatch]) -> None:
    """The child inherits the descriptor, but reading it would take the parent's events: the
    child's moments are always new, and the parent still sees a change the child made."""
    header, watch = tree
    quiet = watch.moment()
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child
        try:
            header.write_text("#define A 9\n")
            first, second = watch.moment(), watch.moment()
            os.write(write, b"1" if first != second else b"0")
        finally:
            os._exit(0)
    os.waitpid(pid, 0)
    assert os.read(read, 1) == b"1"
    os.close(read)
    os.close(write)
    assert watch.moment() != quiet, "the child's change, after the child's moments"
