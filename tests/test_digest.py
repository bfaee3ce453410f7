"""File states on real files: the stat memo, and ccache's "too new" rule."""

from __future__ import annotations

import os

import xxhash

from cacheaudit.digest import StateCache, changed_files, normalise_path, read_state

OLD_NS = 946_684_800_000_000_000  # 2000-01-01: well outside any timestamp window


def _backdate(path) -> None:
    os.utime(path, ns=(OLD_NS, OLD_NS))


def test_state_holds_stat_fields_and_xxh3_128(tmp_path):
    header = tmp_path / "a.h"
    header.write_bytes(b"#define A 1\n")
    state = read_state(str(header))
    st = os.stat(header)
    assert state.exists and state.size == 12
    assert (state.mtime_ns, state.ctime_ns, state.inode) == (
        st.st_mtime_ns, st.st_ctime_ns, st.st_ino)
    assert state.digest == xxhash.xxh3_128_hexdigest(b"#define A 1\n")


def test_a_just_written_file_is_not_settled_and_an_old_one_is(tmp_path):
    header = tmp_path / "a.h"
    header.write_text("x")
    assert not read_state(str(header)).settled
    _backdate(header)
    # ctime cannot be backdated; what counts is the newer of mtime and ctime.
    assert not read_state(str(header)).settled
    assert read_state(str(header), window_ns=0).settled


def test_unchanged_settled_file_is_not_read_again(tmp_path):
    header = tmp_path / "a.h"
    header.write_text("#define A 1\n")
    cache = StateCache(window_ns=0)
    first = cache.capture(str(header))
    assert cache.reads == 1
    assert cache.capture(str(header)) is first
    assert cache.reads == 1


def test_same_size_rewrite_inside_the_timestamp_window_is_not_mistaken_for_unchanged(tmp_path):
    header = tmp_path / "a.h"
    header.write_text("#define A 1\n")
    cache = StateCache()  # the real 2 s window: this capture is "too new"
    first = cache.capture(str(header))
    assert not first.settled
    # Rewrite in place, same size, and force every timestamp the editor can set back: only the
    # content differs. A memo that trusted the stat would call this unchanged.
    with open(header, "r+") as handle:
        handle.write("#define A 2\n")
    os.utime(header, ns=(first.mtime_ns, first.mtime_ns))
    second = cache.capture(str(header))
    assert second.size == first.size and second.inode == first.inode
    assert second.digest != first.digest


def test_verify_trusts_stat_only_for_settled_records(tmp_path):
    header = tmp_path / "a.h"
    header.write_text("#define A 1\n")
    settled = StateCache(window_ns=0).capture(str(header))
    assert StateCache().verify(settled) is settled
    unsettled = StateCache().capture(str(header))
    cache = StateCache()
    again = cache.verify(unsettled)
    assert cache.reads == 1 and again.same_content(unsettled)


def test_verify_sees_an_edit_that_kept_size_and_mtime(tmp_path):
    header = tmp_path / "a.h"
    header.write_text("#define A 1\n")
    recorded = StateCache(window_ns=0).capture(str(header))
    with open(header, "r+") as handle:
        handle.write("#define A 2\n")
    os.utime(header, ns=(recorded.mtime_ns, recorded.mtime_ns))  # ctime still moves
    current = StateCache(window_ns=0).verify(recorded)
    assert not current.same_content(recorded)


def test_missing_and_non_regular_files(tmp_path):
    missing = read_state(str(tmp_path / "nope.h"))
    assert not missing.exists and missing.digest is None
    directory = read_state(str(tmp_path))
    assert directory.exists and directory.digest is None and directory.error
    assert not directory.settled


def test_normalise_path_resolves_dotdot_and_symlinks(tmp_path):
    real = tmp_path / "targets" / "include"
    real.mkdir(parents=True)
    (real / "cuda.h").write_text("")
    (tmp_path / "bin").mkdir()
    os.symlink(real, tmp_path / "inc")
    written = str(tmp_path / "bin" / ".." / "inc" / "cuda.h")
    assert normalise_path(written) == str(real / "cuda.h")
    assert normalise_path("include/cuda.h", str(tmp_path / "targets")) == str(real / "cuda.h")


def test_changed_files_names_edits_and_deletions_only(tmp_path):
    files = []
    for name in ("a.h", "b.h", "c.h"):
        (tmp_path / name).write_text(f"// {name}\n")
        files.append(str(tmp_path / name))
    recorded = [StateCache(window_ns=0).capture(p) for p in files]
    assert changed_files(recorded) == []
    (tmp_path / "b.h").write_text("// b.h edited\n")
    (tmp_path / "c.h").unlink()
    changes = changed_files(recorded)
    assert [(old.path, new.exists) for old, new in changes] == [(files[1], True), (files[2], False)]
    # touched but equal content is not a change
    os.utime(files[0], ns=(OLD_NS, OLD_NS))
    assert [old.path for old, _ in changed_files(recorded)] == files[1:]
