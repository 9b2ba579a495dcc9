"""Shared fixtures: a small source tree, a store, a workspace, a tool context."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pytest

from tools import paths
from tools.base import ToolContext
from tools.overlay import overlay_unavailable
from tools.workspace import Workspace, WorkspaceStore

CANARY = "CANARY-7f3a-do-not-leak"


def make_tree(root: Path) -> Path:
    """A small project: nested files, an empty dir, an executable, an in-tree symlink."""
    (root / "src" / "pkg").mkdir(parents=True)
    (root / "empty").mkdir()
    (root / "README.md").write_text("# demo\n\nhello world\n")
    (root / "src" / "pkg" / "__init__.py").write_text("")
    (root / "src" / "pkg" / "core.py").write_text(
        "def add(a, b):\n    return a + b\n\n\ndef sub(a, b):\n    return a - b\n"
    )
    (root / "src" / "main.py").write_text("from pkg.core import add\n\nprint(add(1, 2))\n")
    run = root / "run.sh"
    run.write_text("#!/bin/sh\necho run\n")
    run.chmod(0o755)
    (root / "data.bin").write_bytes(b"\x00\x01\x02binary\xff")
    os.symlink("src/main.py", root / "main_link.py")
    return root


@pytest.fixture
def outside(tmp_path: Path) -> Path:
    """A directory outside every workspace, holding a canary file."""
    d = tmp_path / "outside"
    d.mkdir()
    (d / "canary.txt").write_text(CANARY + "\n")
    return d


@pytest.fixture
def store(tmp_path: Path) -> WorkspaceStore:
    return WorkspaceStore(tmp_path / "store")


@pytest.fixture
def src_tree(tmp_path: Path) -> Path:
    return make_tree(tmp_path / "src_tree")


@pytest.fixture
def workspace(store: WorkspaceStore, src_tree: Path) -> Iterator[Workspace]:
    ws = store.from_dir(src_tree)
    yield ws
    ws.delete()


@pytest.fixture
def ctx(workspace: Workspace) -> ToolContext:
    return ToolContext(workspace=workspace)


@pytest.fixture(params=["openat2", "walk"])
def resolver(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> str:
    """Run a test under both resolvers: the kernel's openat2 and the manual fallback walk."""
    if request.param == "openat2":
        if not paths.openat2_available():
            pytest.skip("openat2 is not available on this kernel")
        monkeypatch.setattr(paths, "_openat2_state", True)
    else:
        monkeypatch.setattr(paths, "_openat2_state", False)
    return str(request.param)


@pytest.fixture
def cow_store(tmp_path: Path) -> WorkspaceStore:
    """A store that mounts copy-on-write overlays (the test is skipped where they do not work)."""
    reason = overlay_unavailable(tmp_path)
    if reason is not None:
        pytest.skip(f"overlays do not work here ({reason}): copy-on-write is not tested")
    return WorkspaceStore(tmp_path / "store", overlay=True)
