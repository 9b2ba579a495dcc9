"""A workspace over a host directory in place: the source's later edits show through but are not the session's."""

from __future__ import annotations

import os
from pathlib import Path

from backend.apply_back import ChangeSet, apply_changes
from tools.overlay_writes import WrittenMarks, written_marks
from tools.workspace import Workspace, WorkspaceStore


def changes(ws: Workspace) -> list[tuple[str, str]]:
    return [(c.path, str(c.kind)) for c in ws.changed_paths()]


def test_covers_a_path_and_what_lies_under_it() -> None:
    marks = WrittenMarks({"a/b", "c"})
    assert marks.covers("a/b") and marks.covers("a/b/x/y") and marks.covers("c/d")
    assert not marks.covers("a") and not marks.covers("a/bc") and not marks.covers("cc") and not marks.covers("x")


def test_the_users_edit_shows_through_but_is_not_the_sessions(cow_store: WorkspaceStore, src_tree: Path) -> None:
    ws = cow_store.from_dir(src_tree, in_place=True)
    ws.write_bytes("README.md", b"the session's\n")
    (src_tree / "src" / "main.py").write_text("print('the user edited this')\n")  # in their editor
    (src_tree / "data.bin").unlink()
    assert ws.read_bytes("src/main.py") == b"print('the user edited this')\n"  # the workspace sees it
    assert not ws.exists("data.bin")
    assert changes(ws) == [("README.md", "modified")]
    assert "the user edited" not in ws.diff() and "+the session's" in ws.diff()
    change_set = ChangeSet.from_workspace(ws)
    assert [c.path for c in change_set.changes] == ["README.md"]
    apply_changes(change_set, src_tree)  # the session's edit lands; the user's stay as they are
    assert (src_tree / "README.md").read_bytes() == b"the session's\n"
    assert (src_tree / "src" / "main.py").read_text() == "print('the user edited this')\n"
    ws.delete()


def test_deletes_renames_and_replaced_dirs_are_the_sessions(cow_store: WorkspaceStore, src_tree: Path) -> None:
    ws = cow_store.from_dir(src_tree, in_place=True)
    (ws.root / "run.sh").unlink()  # a whiteout
    os.rename(ws.root / "src", ws.root / "lib")  # a redirected directory, and a whiteout for src
    (ws.root / "empty").rmdir()
    (ws.root / "empty").mkdir()  # (an empty directory: not a change, but opaque)
    (ws.root / "empty" / "new.txt").write_text("new\n")
    (src_tree / "README.md").write_text("edited by the user\n")
    assert changes(ws) == [
        ("empty/new.txt", "added"), ("lib/main.py", "added"), ("lib/pkg/__init__.py", "added"),
        ("lib/pkg/core.py", "added"), ("run.sh", "deleted"), ("src/main.py", "deleted"),
        ("src/pkg/__init__.py", "deleted"), ("src/pkg/core.py", "deleted")]
    marks = written_marks([ws.root.parent / "upper"])
    assert {"run.sh", "src", "lib", "empty"} <= marks.prefixes and not marks.covers("README.md")
    ws.delete()


def test_a_fork_counts_its_parents_frozen_changes(cow_store: WorkspaceStore, src_tree: Path) -> None:
    ws = cow_store.from_dir(src_tree, in_place=True)
    ws.write_bytes("README.md", b"parent\n")
    child = ws.fork()
    assert child.layout.layers and child.layout.source == str(src_tree)
    child.write_bytes("src/main.py", b"child\n")
    (src_tree / "data.bin").write_bytes(b"user")
    assert changes(child) == [("README.md", "modified"), ("src/main.py", "modified")]
    assert changes(ws) == [("README.md", "modified")]
    child.delete()
    ws.delete()


def test_a_copied_workspace_lists_every_difference(tmp_path: Path, src_tree: Path) -> None:
    """Without a source mounted in place there is nothing to show through: no filter."""
    ws = WorkspaceStore(tmp_path / "plain").from_dir(src_tree)
    (ws.root / "data.bin").write_bytes(b"changed")
    (src_tree / "README.md").write_text("edited by the user\n")  # not seen by a copy
    assert changes(ws) == [("data.bin", "modified")]
    ws.delete()
