""".gitignore-aware snapshots, diffs and change summaries: ignored trees are never hashed, always usable."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

from tools.gitignore import IgnoreRules
from tools.workspace import Workspace, WorkspaceStore

from .conftest import make_tree
from .test_workspace import _git, tree_state


def rules(files: dict[str, str], keep: set[str] | None = None) -> IgnoreRules:
    def load(path: str) -> list[bytes]:
        return [files[path].encode()] if path in files else []

    return IgnoreRules(load, keep or set())


def shown(r: IgnoreRules, paths: list[str]) -> list[str]:
    """Ask parents first, as a walk does; a hidden directory hides what is beneath it."""
    out, hidden = [], []
    for p in paths:
        if any(p.startswith(h + "/") for h in hidden):
            continue
        is_dir = p.endswith("/")
        p = p.rstrip("/")
        if r.shown(p, is_dir=is_dir):
            out.append(p)
        elif is_dir:
            hidden.append(p)
    return out


def test_git_rules_nested_files_negation_and_directories() -> None:
    r = rules({".gitignore": "*.log\n!keep.log\nbuild/\n/top.txt\n# comment\n",
               "sub/.gitignore": "!again.log\nlocal/\n",
               ".git/info/exclude": "secret.txt\n"})
    paths = ["a.log", "keep.log", "build/", "build/x.o", "top.txt", "sub/", "sub/top.txt", "sub/b.log",
             "sub/again.log", "sub/local/", "sub/local/f", "sub/build", "secret.txt", "ok.py"]
    assert shown(r, paths) == ["keep.log", "sub", "sub/top.txt", "sub/again.log", "sub/build", "ok.py"]


def test_kept_paths_and_git_dirs_are_never_ignored() -> None:
    r = rules({".gitignore": ".*\n!.gitignore\nvendor/\n"}, keep={"vendor/lib/a.py", "vendor", "vendor/lib"})
    paths = [".git/", ".git/config", ".env", ".gitignore", "vendor/", "vendor/lib/", "vendor/lib/a.py",
             "vendor/lib/b.py", "vendor/other/", "vendor/other/c.py"]
    assert shown(r, paths) == [".git", ".git/config", ".gitignore", "vendor", "vendor/lib", "vendor/lib/a.py"]


def venv_tree(root: Path) -> Path:
    """A project with an ignored virtualenv holding a module, a big file and a deep tree."""
    make_tree(root)
    (root / ".gitignore").write_text(".venv/\n*.pyc\n")
    site = root / ".venv" / "lib" / "site-packages"
    site.mkdir(parents=True)
    (site / "fwdemo.py").write_text("ANSWER = 42\n")
    with open(root / ".venv" / "huge.bin", "wb") as f:
        f.truncate(3 << 30)  # over the store's file limit: ignored, so never looked at
    deep = site
    for _ in range(300):  # deeper than snapshots allow: ignored, so never walked
        deep = deep / "d"
    deep.mkdir(parents=True)
    (root / "src" / "cache.pyc").write_bytes(b"\x00pyc")
    return root


@pytest.fixture
def project(tmp_path: Path) -> Path:
    return venv_tree(tmp_path / "project")


def outside_venv(root: Path) -> dict[str, tuple[str, object]]:
    """tree_state of everything but .venv (which holds a 3 GiB sparse file)."""
    out: dict[str, tuple[str, object]] = {}
    for entry in root.iterdir():
        if entry.name == ".venv":
            continue
        if entry.is_dir() and not entry.is_symlink():
            out.update({f"{entry.name}/{k}": v for k, v in tree_state(entry).items()})
            out[entry.name] = ("dir", None)
        elif entry.is_symlink():
            out[entry.name] = ("link", os.readlink(entry))
        else:
            out[entry.name] = ("file", (entry.read_bytes(), bool(entry.stat().st_mode & 0o100)))
    return out


def blob_count(store: WorkspaceStore) -> int:
    return sum(1 for p in store.blobs.root.rglob("*") if p.is_file())


@pytest.mark.parametrize("in_place", [False, True])
def test_ignored_trees_are_not_snapshotted_but_stay_usable(tmp_path: Path, project: Path,
                                                           in_place: bool) -> None:
    store = WorkspaceStore(tmp_path / "store", max_file_bytes=1 << 30, overlay=None)
    ws = store.from_dir(project, in_place=in_place)
    assert not any(p.startswith(".venv") or p.endswith(".pyc") for p in ws.base.manifest)
    assert ".gitignore" in ws.base.manifest and "src/main.py" in ws.base.manifest
    store.blobs.wait()  # an in-place source's blobs are stored in the background
    assert blob_count(store) == len({e.sha256 for e in ws.base.manifest.values() if e.sha256})
    assert ws.read_bytes(".venv/lib/site-packages/fwdemo.py") == b"ANSWER = 42\n"  # still there
    # the model's ignored output is not shown; its real changes are
    ws.write_bytes(".venv/lib/site-packages/new_dep.py", b"x = 1\n")
    ws.write_bytes("src/main.pyc", b"\x00")
    ws.write_bytes("src/main.py", b"print('changed')\n")
    assert [c.path for c in ws.changed_paths()] == ["src/main.py"]
    assert ".venv" not in ws.diff() and "+print('changed')" in ws.diff()
    snap = ws.snapshot()
    assert not any(p.startswith(".venv") for p in snap.manifest)
    # restore leaves ignored files alone (the virtualenv survives, with what was installed)
    ws.restore(ws.base)
    assert ws.read_bytes("src/main.py").startswith(b"from pkg") and ws.exists(".venv/lib/site-packages/new_dep.py")
    assert ws.diff() == ""
    ws.delete()


def test_a_snapshot_of_an_in_place_workspace_brings_its_ignored_files_back(tmp_path: Path,
                                                                          project: Path) -> None:
    store = WorkspaceStore(tmp_path / "store", overlay=None)
    ws = store.from_dir(project, in_place=True)
    assert ws.base.origin == str(project)
    ws.write_bytes("src/extra.py", b"y = 2\n")
    snap = ws.snapshot()
    assert store.load_snapshot(snap.id).origin == str(project)
    clone = store.from_snapshot(snap)
    assert clone.read_bytes(".venv/lib/site-packages/fwdemo.py") == b"ANSWER = 42\n"
    assert clone.read_bytes("src/extra.py") == b"y = 2\n" and clone.diff() == ""
    assert outside_venv(clone.root) == outside_venv(ws.root)
    clone.delete()
    ws.delete()


def test_a_snapshot_without_origin_has_the_same_id_as_before(workspace: Workspace) -> None:
    """Ids of snapshots of copied workspaces are unchanged: the origin is added only when set."""
    snap = workspace.snapshot()
    assert snap.origin is None and b"origin" not in snap.to_json()


def test_tracked_files_of_a_git_source_are_shown_even_when_ignored(tmp_path: Path) -> None:
    repo = tmp_path / "repo"
    repo.mkdir()
    _git(repo, "init", "-q")
    (repo / ".gitignore").write_text("build/\n*.log\n")
    (repo / "build").mkdir()
    (repo / "build" / "tracked.sh").write_text("#!/bin/sh\n")
    (repo / "build" / "untracked.o").write_text("obj\n")
    (repo / "notes.log").write_text("kept\n")
    (repo / "a.py").write_text("a\n")
    _git(repo, "add", "-f", ".gitignore", "a.py", "build/tracked.sh", "notes.log")
    _git(repo, "commit", "-qm", "x")
    ws = WorkspaceStore(tmp_path / "store", overlay=None).from_dir(repo, in_place=True)
    files = {p for p, e in ws.base.manifest.items() if e.kind == "file" and not p.startswith(".git/")}
    assert files == {".gitignore", "a.py", "build/tracked.sh", "notes.log"}
    (ws.root / "build" / "tracked.sh").write_text("#!/bin/sh\necho changed\n")
    (ws.root / "build" / "new.o").write_text("obj\n")
    (ws.root / "other.log").write_text("ignored\n")
    assert [c.path for c in ws.changed_paths()] == ["build/tracked.sh"]
    ws.delete()


def test_from_git_keeps_every_archived_file(tmp_path: Path) -> None:
    repo = tmp_path / "repo"
    repo.mkdir()
    _git(repo, "init", "-q")
    (repo / ".gitignore").write_text("*.gen\n")
    (repo / "forced.gen").write_text("committed anyway\n")
    _git(repo, "add", "-f", ".gitignore", "forced.gen")
    _git(repo, "commit", "-qm", "x")
    store = WorkspaceStore(tmp_path / "store", overlay=None)
    ws = store.from_git(repo, "HEAD")
    assert "forced.gen" in ws.base.manifest
    rebased = store.from_snapshot(ws.snapshot())  # what RL tasks with patches do
    assert rebased.read_bytes("forced.gen") == b"committed anyway\n"
    rebased.delete()
    ws.delete()


def test_changing_gitignore_is_a_change_and_restore_uses_the_snapshots_rules(workspace: Workspace) -> None:
    (workspace.root / "tmp").mkdir()
    (workspace.root / "tmp" / "scratch.txt").write_text("scratch\n")
    workspace.write_bytes(".gitignore", b"tmp/\n")
    assert [c.path for c in workspace.changed_paths()] == [".gitignore"]
    workspace.restore(workspace.base)  # no .gitignore in the base: tmp/ is shown there, so removed
    assert not workspace.exists(".gitignore") and not workspace.exists("tmp")
    assert workspace.diff() == ""


def test_venv_of_an_in_place_workspace_works_in_the_sandbox(tmp_path: Path, project: Path) -> None:
    import asyncio
    import shutil

    from tools.sandbox import SAFE_PATH, BubblewrapSandbox, probe_bwrap

    if probe_bwrap() is not None:
        pytest.skip(f"bubblewrap unusable here ({probe_bwrap()})")
    python = shutil.which("python3", path=SAFE_PATH)
    if python is None:
        pytest.skip("no python3 visible in the sandbox")
    venv = project / ".venv"
    subprocess.run([python, "-m", "venv", "--without-pip", str(venv)], check=True, capture_output=True)
    site = next(venv.glob("lib/python3*/site-packages"))
    (site / "fwdemo.py").write_text("ANSWER = 42\n")
    ws = WorkspaceStore(tmp_path / "store", overlay=None).from_dir(project, in_place=True)
    try:
        assert not any(p.startswith(".venv") for p in ws.base.manifest)
        result = asyncio.run(BubblewrapSandbox().run(
            ".venv/bin/python -c 'import fwdemo, sys; print(fwdemo.ANSWER, sys.prefix)' && "
            "echo made > out.txt", ws.root))
        assert result.exit_code == 0, result.output
        assert "42 /workspace/.venv" in result.output
        assert [c.path for c in ws.changed_paths()] == ["out.txt"]
        assert not (project / "out.txt").exists()
    finally:
        ws.delete()
    assert os.path.exists(site / "fwdemo.py")


def test_in_place_blobs_are_stored_in_the_background_and_reads_wait_for_them(tmp_path: Path,
                                                                             project: Path) -> None:
    store = WorkspaceStore(tmp_path / "store", overlay=None)
    ws = store.from_dir(project, in_place=True)
    sha = ws.base.manifest["src/main.py"].sha256
    assert sha is not None
    assert store.blobs.has(sha)  # waits for the background store if it has not got there yet
    ws.write_bytes("src/main.py", b"changed\n")
    assert "-print(add(1, 2))" in ws.diff()  # the old side comes from the blob
    ws.delete()


def test_a_source_file_changed_before_its_blob_is_stored_is_not_stored(tmp_path: Path) -> None:
    from tools.blobs import BlobStore

    src = tmp_path / "src"
    src.mkdir()
    (src / "a.txt").write_text("new content\n")
    blobs = BlobStore(tmp_path / "blobs")
    stale = "0" * 64  # the hash it had when it was hashed
    gone = "1" * 64
    blobs.put_later(src, [("a.txt", stale, 12), ("removed.txt", gone, 3)]).join()  # no exception either
    assert not blobs.has(stale) and not blobs.has(gone)
