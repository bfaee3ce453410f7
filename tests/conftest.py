"""Shared fixtures: real header trees, a masquerade directory, an isolated ledger."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest

from support import ShimEnv, clean_env, write_reliability_document


@pytest.fixture(autouse=True)
def _children_still_allowed() -> object:
    """A test that runs `children.kill_all` in this process (a terminating signal through a
    real forwarder, say) leaves it refusing every child: every later test of this worker that
    starts one would fail far from the cause. The test that did it fails instead, by name."""
    yield
    children = sys.modules.get("cacheaudit.children")
    state = getattr(children, "_children", None)
    if state is not None and state.stopping:
        state.stopping = False
        pytest.fail("this test ran children.kill_all in the test process: later tests could "
                    "start no child")


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    """docs/reliability.md from every reliability case's figures (`support.reliability_figure`),
    once per session: by the controller, after every xdist worker has left its figures."""
    if hasattr(session.config, "workerinput"):
        return
    write_reliability_document()


@pytest.fixture
def shim_env(tmp_path: Path) -> ShimEnv:
    from cacheaudit.shim import install_masquerade

    masq = tmp_path / "masq"
    install_masquerade(str(masq))
    env = clean_env(tmp_path)
    # The venv's bin first so that `cacheaudit-shim` resolves; then the masquerade directory.
    env["PATH"] = os.pathsep.join([str(masq), os.path.dirname(sys.executable), env["PATH"]])
    return ShimEnv(bin=masq, ledger=tmp_path / "ledger.db", env=env)


@pytest.fixture
def header_tree(tmp_path: Path) -> Path:
    """A TU that reads headers three ways: quoted beside it, from -I, and from CPATH."""
    root = tmp_path / "tree"
    (root / "src").mkdir(parents=True)
    (root / "inc" / "lib").mkdir(parents=True)
    (root / "cpath").mkdir()
    (root / "src" / "local.h").write_text("#pragma once\n#define LOCAL_VALUE 3\n")
    (root / "inc" / "lib" / "api.h").write_text(
        "#pragma once\n#include \"detail.h\"\n#define API_VALUE (DETAIL_VALUE + 1)\n")
    (root / "inc" / "lib" / "detail.h").write_text("#pragma once\n#define DETAIL_VALUE 10\n")
    (root / "cpath" / "envconst.h").write_text("#pragma once\n#define ENV_VALUE 100\n")
    body = ('#include "local.h"\n#include <lib/api.h>\n#include <envconst.h>\n'
            "#ifndef EXTRA\n#define EXTRA 0\n#endif\n")
    (root / "src" / "k.cpp").write_text(
        body + 'extern "C" int value() { return LOCAL_VALUE + API_VALUE + ENV_VALUE + EXTRA; }\n')
    (root / "src" / "k.cu").write_text(
        body + 'extern "C" __global__ void k(int* o) '
        "{ o[0] = LOCAL_VALUE + API_VALUE + ENV_VALUE + EXTRA; }\n")
    (root / "out").mkdir()
    return root
