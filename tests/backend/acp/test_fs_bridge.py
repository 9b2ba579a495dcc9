"""The file bridge on a real workspace copy and a real project directory."""

from __future__ import annotations

import asyncio
import os
from pathlib import Path

import pytest

from backend.acp.fs_bridge import DiskFiles, EditorFiles, EditorWorkspace
from tools.base import ToolError
from tools.edit_file import _edit
from tools.paths import PathError
from tools.workspace import WorkspaceStore


@pytest.fixture
def setup(tmp_path: Path):
    project = tmp_path / "project"
    project.mkdir()
    (project / "calc.py").write_text("def add(a, b):\n    return a - b\n")
    store = WorkspaceStore(tmp_path / "store", progress=False)
    ws = store.from_dir(project)
    yield project, ws
    ws.delete()


def test_reads_bring_the_projects_text_into_the_copy(setup) -> None:
    project, ws = setup
    view = EditorWorkspace(ws, DiskFiles(project))
    (project / "calc.py").write_text("# saved by the user\n")
    assert view.read_bytes("calc.py") == b"# saved by the user\n"
    assert (ws.root / "calc.py").read_text() == "# saved by the user\n"  # commands see it too


def test_an_edit_is_made_on_the_current_text_and_lands_in_both(setup) -> None:
    project, ws = setup
    texts_view = EditorWorkspace(ws, DiskFiles(project))
    (project / "calc.py").write_text("# note\ndef add(a, b):\n    return a - b\n")  # the user's change
    result = _edit(texts_view, "calc.py", "    return a - b\n", "    return a + b\n")
    assert result.ok
    fixed = "# note\ndef add(a, b):\n    return a + b\n"
    assert (project / "calc.py").read_text() == fixed and (ws.root / "calc.py").read_text() == fixed
    assert texts_view.texts.take("calc.py") == ("# note\ndef add(a, b):\n    return a - b\n", fixed)
    assert texts_view.texts.take("calc.py") is None


def test_a_write_over_text_the_model_has_not_seen_is_refused_and_writes_nothing(setup) -> None:
    project, ws = setup
    view = EditorWorkspace(ws, DiskFiles(project))
    view.read_bytes("calc.py")
    (project / "calc.py").write_text("the user's new text\n")
    with pytest.raises(ToolError, match="changed in the editor since you last read it"):
        view.write_bytes("calc.py", b"model's text\n")
    assert (project / "calc.py").read_text() == "the user's new text\n"
    assert (ws.root / "calc.py").read_text() == "def add(a, b):\n    return a - b\n"
    (project / "new.py").write_text("made by the user\n")
    with pytest.raises(ToolError, match="created in the editor"):
        view.write_bytes("new.py", b"x\n")


def test_a_link_out_of_the_project_is_refused(setup, tmp_path: Path) -> None:
    project, _ = setup
    (tmp_path / "secret").write_text("s")
    os.symlink(tmp_path / "secret", project / "link")
    with pytest.raises(PathError, match="outside the project"):
        DiskFiles(project).read_text("link")


def test_binary_files_stay_in_the_copy(setup) -> None:
    project, ws = setup
    view = EditorWorkspace(ws, DiskFiles(project))
    view.write_bytes("blob.bin", b"\x00\x01\x02")
    assert (ws.root / "blob.bin").read_bytes() == b"\x00\x01\x02"
    assert not (project / "blob.bin").exists()


async def test_an_editor_that_refuses_a_write_fails_the_call_and_the_copy_is_unchanged(setup) -> None:
    project, ws = setup

    async def read(path: str) -> str:
        return Path(path).read_text()

    async def write(path: str, text: str) -> None:
        raise RuntimeError("read-only buffer")

    files = EditorFiles(project, read=read, write=write, loop=asyncio.get_running_loop(), timeout_s=2)
    view = EditorWorkspace(ws, files)
    with pytest.raises(ToolError, match="the editor refused to write calc.py: read-only buffer; nothing was written"):
        await asyncio.to_thread(view.write_bytes, "calc.py", b"new\n")
    assert (ws.root / "calc.py").read_text() == "def add(a, b):\n    return a - b\n"
    # on the loop's own thread a request would deadlock: the read falls back to the disk at once
    assert files.read_text("calc.py") == "def add(a, b):\n    return a - b\n"
