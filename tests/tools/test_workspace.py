"""Workspace: fork independence, exact snapshot/restore, from_git, diffs."""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest

from tools.diffs import ChangeEntry, ChangeKind, unified_diff
from tools.snapshots import SnapshotError
from tools.workspace import Workspace, WorkspaceError, WorkspaceStore


def tree_state(root: Path) -> dict[str, tuple[str, object]]:
    """Everything observable that a snapshot promises to keep."""
    out: dict[str, tuple[str, object]] = {}
    for dirpath, dirnames, filenames in os.walk(root):
        for name in dirnames + filenames:
            p = Path(dirpath, name)
            rel = str(p.relative_to(root))
            if p.is_symlink():
                out[rel] = ("link", os.readlink(p))
            elif p.is_dir():
                out[rel] = ("dir", None)
            else:
                out[rel] = ("file", (p.read_bytes(), bool(p.stat().st_mode & 0o100)))
    return out


def test_from_dir_copies_exactly(workspace: Workspace, src_tree: Path) -> None:
    assert tree_state(workspace.root) == tree_state(src_tree)
    assert workspace.root == Path(os.path.realpath(workspace.root))
    assert (workspace.root / "main_link.py").is_symlink()
    assert workspace.diff() == "" and workspace.changed_paths() == []


def test_from_dir_refuses_missing_source(store: WorkspaceStore, tmp_path: Path) -> None:
    with pytest.raises(WorkspaceError, match="not a directory"):
        store.from_dir(tmp_path / "nope")


def test_fork_is_independent(workspace: Workspace) -> None:
    workspace.write_bytes("README.md", b"changed before fork\n")
    child = workspace.fork()
    assert child.id != workspace.id and child.root != workspace.root
    assert child.read_bytes("README.md") == b"changed before fork\n"
    child.write_bytes("README.md", b"child\n")
    child.write_bytes("new.txt", b"only in child\n")
    (workspace.root / "src" / "main.py").unlink()
    assert workspace.read_bytes("README.md") == b"changed before fork\n"
    assert not workspace.exists("new.txt")
    assert child.exists("src/main.py")
    assert child.base == workspace.base
    child.delete()
    assert not child.root.exists() and workspace.root.exists()


def test_snapshot_restore_is_exact(workspace: Workspace) -> None:
    root = workspace.root
    (root / "empty" / "nested_empty").mkdir()
    os.symlink("../README.md", root / "src" / "readme_link")
    os.symlink("does/not/exist", root / "dangling")
    snap = workspace.snapshot()
    want = tree_state(root)

    # every kind of damage: modified, deleted, added, mode flips, kind swaps, empty dirs gone
    (root / "README.md").write_text("modified\n")
    (root / "src" / "pkg" / "core.py").unlink()
    (root / "added.txt").write_text("new\n")
    (root / "added_dir" / "deep").mkdir(parents=True)
    os.chmod(root / "run.sh", 0o644)
    os.chmod(root / "src" / "main.py", 0o755)
    os.rmdir(root / "empty" / "nested_empty")
    (root / "dangling").unlink()
    (root / "dangling").mkdir()  # a symlink became a directory
    os.unlink(root / "src" / "readme_link")
    (root / "src" / "readme_link").write_text("was a link\n")
    os.symlink("/etc", root / "added_dir" / "etc_link")
    os.replace(root / "empty", root / "empty_moved")

    workspace.restore(snap)
    assert tree_state(root) == want
    assert workspace.snapshot().id == snap.id


def test_restore_never_follows_links_while_deleting(workspace: Workspace, outside: Path) -> None:
    snap = workspace.snapshot()
    os.symlink(outside, workspace.root / "out_link")
    (workspace.root / "extra").mkdir()
    os.symlink(outside, workspace.root / "extra" / "inner_link")
    os.symlink(outside / "canary.txt", workspace.root / "extra" / "file_link")
    workspace.restore(snap)
    assert sorted(os.listdir(outside)) == ["canary.txt"]
    assert not os.path.lexists(workspace.root / "out_link")
    assert not os.path.lexists(workspace.root / "extra")


def test_restore_replaces_directory_link_without_touching_target(
    workspace: Workspace, outside: Path
) -> None:
    snap = workspace.snapshot()
    shutil.rmtree(workspace.root / "src")
    os.symlink(outside, workspace.root / "src")  # snapshot has src/ as a real directory
    workspace.restore(snap)
    assert (outside / "canary.txt").exists() and sorted(os.listdir(outside)) == ["canary.txt"]
    assert not (workspace.root / "src").is_symlink()
    assert workspace.read_bytes("src/main.py").startswith(b"from pkg")


def test_snapshot_ids_are_content_addressed_and_blobs_deduplicated(
    workspace: Workspace, store: WorkspaceStore
) -> None:
    a = workspace.snapshot()
    b = workspace.fork().snapshot()
    assert a == b and a.id == workspace.base.id
    blobs = [p for p in (store.root / "blobs").rglob("*") if p.is_file()]
    assert len(blobs) == len({e.sha256 for e in a.manifest.values() if e.sha256})
    assert store.load_snapshot(a.id).manifest == a.manifest


def test_load_snapshot_errors(store: WorkspaceStore, workspace: Workspace) -> None:
    with pytest.raises(SnapshotError, match="not a snapshot id"):
        store.load_snapshot("../../etc/passwd")
    with pytest.raises(SnapshotError, match="no snapshot"):
        store.load_snapshot("0" * 64)
    snap = workspace.snapshot()
    path = store.root / "snapshots" / f"{snap.id}.json"
    path.write_bytes(path.read_bytes().replace(b"README", b"READYOU"))
    with pytest.raises(SnapshotError, match="corrupt"):
        store.load_snapshot(snap.id)


def test_from_snapshot_and_open(workspace: Workspace, store: WorkspaceStore) -> None:
    workspace.write_bytes("src/extra.py", b"x = 1\n")
    snap = workspace.snapshot()
    clone = store.from_snapshot(store.load_snapshot(snap.id))
    assert tree_state(clone.root) == tree_state(workspace.root)
    assert clone.base == snap and clone.diff() == ""
    again = store.open(clone.id)
    assert again.root == clone.root and again.base == snap
    with pytest.raises(WorkspaceError, match="no workspace"):
        store.open("../" + clone.id)


def test_context_manager_deletes(store: WorkspaceStore, src_tree: Path) -> None:
    with store.from_dir(src_tree) as ws:
        root = ws.root
        assert root.exists()
    assert not root.exists()
    ws.delete()  # idempotent


def _git(repo: Path, *args: str) -> str:
    env = {**os.environ, "GIT_AUTHOR_NAME": "t", "GIT_AUTHOR_EMAIL": "t@e", "GIT_COMMITTER_NAME": "t",
           "GIT_COMMITTER_EMAIL": "t@e", "GIT_CONFIG_GLOBAL": "/dev/null"}
    return subprocess.run(["git", "-C", str(repo), *args], check=True, capture_output=True,
                          text=True, env=env).stdout.strip()


@pytest.fixture
def repo(tmp_path: Path) -> tuple[Path, str, str]:
    repo = tmp_path / "repo"
    repo.mkdir()
    _git(repo, "init", "-q")
    (repo / "a.txt").write_text("one\n")
    (repo / "tool.sh").write_text("#!/bin/sh\n")
    (repo / "tool.sh").chmod(0o755)
    os.symlink("a.txt", repo / "link")
    _git(repo, "add", "-A")
    _git(repo, "commit", "-qm", "first")
    first = _git(repo, "rev-parse", "HEAD")
    (repo / "a.txt").write_text("two\n")
    (repo / "b.txt").write_text("added\n")
    _git(repo, "add", "-A")
    _git(repo, "commit", "-qm", "second")
    return repo, first, _git(repo, "rev-parse", "HEAD")


def test_from_git_checks_out_the_commit(store: WorkspaceStore, repo: tuple[Path, str, str]) -> None:
    path, first, second = repo
    ws1 = store.from_git(path, first)
    assert ws1.read_bytes("a.txt") == b"one\n" and not ws1.exists("b.txt")
    assert os.readlink(ws1.root / "link") == "a.txt"
    assert os.stat(ws1.root / "tool.sh").st_mode & 0o100
    assert not (ws1.root / ".git").exists()
    ws2 = store.from_git(path, second[:10])
    assert ws2.read_bytes("a.txt") == b"two\n" and ws2.read_bytes("b.txt") == b"added\n"


def test_from_git_errors(store: WorkspaceStore, repo: tuple[Path, str, str], tmp_path: Path) -> None:
    path, _, _ = repo
    with pytest.raises(WorkspaceError, match="unknown commit 'deadbeef'"):
        store.from_git(path, "deadbeef")
    with pytest.raises(WorkspaceError, match="invalid commit"):
        store.from_git(path, "--output=/tmp/x")
    (tmp_path / "plain").mkdir()
    with pytest.raises(WorkspaceError, match="not a git repository"):
        store.from_git(tmp_path / "plain", "HEAD")
    assert list((store.root / "ws").iterdir()) == []


def test_diff_add_modify_delete_binary(workspace: Workspace) -> None:
    workspace.write_bytes("README.md", b"# demo\n\nhello there\n")
    workspace.write_bytes("new/file.txt", b"fresh\n")
    (workspace.root / "src" / "pkg" / "core.py").unlink()
    workspace.write_bytes("data.bin", b"\x00\x01changed")
    os.chmod(workspace.root / "run.sh", 0o644)
    diff = workspace.diff()
    assert (
        "diff --git a/README.md b/README.md\n--- a/README.md\n+++ b/README.md\n"
        "@@ -1,3 +1,3 @@\n # demo\n \n-hello world\n+hello there\n"
    ) in diff
    assert "diff --git a/new/file.txt b/new/file.txt\nnew file mode 100644\n--- /dev/null\n" in diff
    assert "+++ b/new/file.txt\n@@ -0,0 +1 @@\n+fresh\n" in diff
    assert "deleted file mode 100644\n--- a/src/pkg/core.py\n+++ /dev/null\n" in diff
    assert "-def add(a, b):\n" in diff
    assert "Binary files a/data.bin and b/data.bin differ\n" in diff
    assert "diff --git a/run.sh b/run.sh\nold mode 100755\nnew mode 100644\n" in diff
    assert workspace.changed_paths() == [
        ChangeEntry("README.md", ChangeKind.MODIFIED),
        ChangeEntry("data.bin", ChangeKind.MODIFIED),
        ChangeEntry("new/file.txt", ChangeKind.ADDED),
        ChangeEntry("run.sh", ChangeKind.MODIFIED),
        ChangeEntry("src/pkg/core.py", ChangeKind.DELETED),
    ]


def test_diff_against_explicit_base_and_git_dir_shown(workspace: Workspace) -> None:
    workspace.write_bytes("a.txt", b"1\n")
    mid = workspace.snapshot()
    workspace.write_bytes("b.txt", b"2\n")
    (workspace.root / ".git" / "hooks").mkdir(parents=True)
    (workspace.root / ".git" / "hooks" / "pre-commit").write_text("#!/bin/sh\ntouch /tmp/x\n")
    assert [c.path for c in workspace.changed_paths(mid)] == [".git/hooks/pre-commit", "b.txt"]
    assert [c.path for c in workspace.changed_paths()] == [".git/hooks/pre-commit", "a.txt", "b.txt"]
    assert "+++ b/.git/hooks/pre-commit\n" in workspace.diff()


def test_diff_symlink_retarget(workspace: Workspace) -> None:
    os.unlink(workspace.root / "main_link.py")
    os.symlink("README.md", workspace.root / "main_link.py")
    diff = workspace.diff()
    assert "--- a/main_link.py\n+++ b/main_link.py\n@@ -1 +1 @@\n-src/main.py\n" in diff
    assert "\\ No newline at end of file\n+README.md\n\\ No newline at end of file\n" in diff


def test_unified_diff_helper() -> None:
    assert unified_diff("x", b"same", b"same") == ""
    d = unified_diff("x", b"a\nb", b"a\nc\n")
    assert d.endswith("-b\n\\ No newline at end of file\n+c\n")
    assert unified_diff("x", None, b"\x00") == (
        "diff --git a/x b/x\nnew file mode 100644\nBinary files /dev/null and b/x differ\n"
    )
    crlf = unified_diff("w", b"a\r\nb\r\n", b"a\r\nc\r\n")
    assert "-b\r\n+c\r\n" in crlf


def test_write_bytes_returns_file_edit(workspace: Workspace) -> None:
    edit = workspace.write_bytes("src/main.py", b"print(1)\n")
    assert edit.path == "src/main.py" and not edit.created
    assert edit.diff.startswith("diff --git a/src/main.py b/src/main.py\n")
    created = workspace.write_bytes("brand/new.py", b"x\n")
    assert created.created and "new file mode 100644" in created.diff
    assert workspace.is_dir("brand") and not workspace.is_dir("brand/new.py")
    assert [e.name for e in workspace.listdir("brand")] == ["new.py"]
    assert workspace.resolve("./brand//new.py") == "brand/new.py"
    assert workspace.resolve("not/there") == "not/there"


def test_attach_works_on_the_directory_itself_and_delete_leaves_it(store: WorkspaceStore, src_tree: Path,
                                                                   outside: Path) -> None:
    before = tree_state(src_tree)
    ws = store.attach(src_tree)
    assert ws.root == src_tree.resolve() and ws.layering.value == "attached"
    assert "itself (no copy" in ws.layout.describe()
    ws.write_bytes("added.txt", b"x\n")
    assert (src_tree / "added.txt").read_bytes() == b"x\n"  # in place
    with pytest.raises(Exception, match="outside|escapes"):
        ws.read_bytes(f"../{outside.name}/canary.txt")
    fork = ws.fork()
    assert fork.root != ws.root and (fork.root / "added.txt").exists()
    fork.delete()
    ws.delete()
    assert tree_state(src_tree) == {**before, "added.txt": ("file", (b"x\n", False))}
    with pytest.raises(WorkspaceError, match="not a directory"):
        store.attach(src_tree / "nope")
    with pytest.raises(WorkspaceError, match="lies inside it"):
        store.attach(store.root.parent)
