"""Workspace.revert (tools/workspace_tree.py) and restore_paths (tools/snapshots.py): one path back to the start."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import pytest

from tests.tools.test_workspace import tree_state
from tools.workspace import Workspace, WorkspaceError


def test_each_kind_of_change_reverts_alone(workspace: Workspace, src_tree: Path) -> None:
    start = tree_state(workspace.root)
    root = workspace.root
    (root / "README.md").write_text("# changed\n")
    (root / "run.sh").chmod(0o644)
    (root / "new" / "deep").mkdir(parents=True)
    (root / "new" / "deep" / "added.txt").write_text("added\n")
    (root / "src" / "main.py").unlink()
    os.remove(root / "main_link.py")
    os.symlink("README.md", root / "main_link.py")
    shutil.rmtree(root / "src" / "pkg")
    (root / "src" / "pkg").write_text("a file where a directory was\n")
    changed = {c.path for c in workspace.changed_paths()}
    assert {"README.md", "run.sh", "new/deep/added.txt", "src/main.py", "main_link.py", "src/pkg"} <= changed

    edit = workspace.revert("README.md")
    assert (root / "README.md").read_text() == "# demo\n\nhello world\n"
    assert "-# changed" in edit.diff and "+# demo" in edit.diff and not edit.created and not edit.deleted
    assert "README.md" not in {c.path for c in workspace.changed_paths()}
    assert (root / "src" / "pkg").is_file()  # nothing else moved

    assert workspace.revert("run.sh").diff.startswith("diff --git")
    assert os.stat(root / "run.sh").st_mode & 0o100
    assert workspace.revert("new/deep/added.txt").deleted and not (root / "new" / "deep" / "added.txt").exists()
    assert workspace.revert("src/main.py").created and (root / "src" / "main.py").read_text().startswith("from pkg")
    workspace.revert("main_link.py")
    assert os.readlink(root / "main_link.py") == "src/main.py"
    workspace.revert("src/pkg")  # the file in the way goes; the files under the directory are separate changes
    for p in [c.path for c in workspace.changed_paths()]:
        workspace.revert(p)
    state = tree_state(root)
    state.pop("new", None), state.pop("new/deep", None)  # directories made for an added file stay, empty
    assert state == start and workspace.changed_paths() == []


def test_an_unchanged_or_unknown_path_is_refused(workspace: Workspace) -> None:
    with pytest.raises(WorkspaceError, match="nothing to revert"):
        workspace.revert("README.md")
    with pytest.raises(WorkspaceError, match="nothing to revert"):
        workspace.revert("../../etc/passwd")


def test_a_parent_replaced_by_a_symlink_is_refused_without_writing_outside(workspace: Workspace,
                                                                            outside: Path) -> None:
    root = workspace.root
    shutil.rmtree(root / "src")
    os.symlink(outside, root / "src")
    with pytest.raises(WorkspaceError, match="cannot revert 'src/main.py'"):
        workspace.revert("src/main.py")
    assert not (outside / "main.py").exists()
