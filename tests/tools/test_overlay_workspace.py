"""Copy-on-write workspaces: in-place sources, fork isolation, renames, layers, remounts, no mounts left behind."""

from __future__ import annotations

import errno
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from tools import delayed_progress, overlay
from tools import workspace_layout
from tools.overlay import mounts_under, upper_dir
from tools.treewalk import remove_path
from tools.workspace import Layering, Workspace, WorkspaceError, WorkspaceStore

from .conftest import make_tree
from .test_workspace import tree_state

ROOT = Path(__file__).resolve().parents[2]




def layer_dirs(store: WorkspaceStore) -> list[str]:
    return sorted(p.name for p in store.layers.root.iterdir() if not p.name.startswith("."))


def test_in_place_workspace_never_writes_its_source(cow_store: WorkspaceStore, src_tree: Path) -> None:
    before = tree_state(src_tree)
    ws = cow_store.from_dir(src_tree, in_place=True)
    assert ws.layering is Layering.OVERLAY and ws.layout.source == str(src_tree)
    assert "copy-on-write over" in ws.layout.describe()
    assert tree_state(ws.root) == before and ws.diff() == ""
    ws.write_bytes("README.md", b"changed\n")
    (ws.root / "src" / "pkg" / "core.py").unlink()
    os.rename(ws.root / "src", ws.root / "lib")  # a lower directory can be renamed (redirect_dir)
    (ws.root / "new.txt").write_text("new\n")
    assert tree_state(src_tree) == before
    assert [(c.path, str(c.kind)) for c in ws.changed_paths()] == [
        ("README.md", "modified"), ("lib/main.py", "added"), ("lib/pkg/__init__.py", "added"),
        ("new.txt", "added"), ("src/main.py", "deleted"), ("src/pkg/__init__.py", "deleted"),
        ("src/pkg/core.py", "deleted")]
    assert upper_dir(ws.root) == ws.root.parent / "upper"
    assert mounts_under(cow_store.root) == [str(ws.root)]
    ws.delete()
    assert mounts_under(cow_store.root) == [] and not ws.root.parent.exists()
    assert tree_state(src_tree) == before


def test_fork_is_isolated_from_later_writes_on_both_sides(cow_store: WorkspaceStore, src_tree: Path) -> None:
    parent = cow_store.from_dir(src_tree, in_place=True)
    parent.write_bytes("README.md", b"before the fork\n")
    os.rename(parent.root / "src", parent.root / "moved")
    child = parent.fork()
    assert child.layering is Layering.OVERLAY and child.base == parent.base
    assert child.read_bytes("README.md") == b"before the fork\n" and child.exists("moved/pkg/core.py")
    # later writes, deletions and renames on either side stay on that side
    parent.write_bytes("README.md", b"parent after\n")
    (parent.root / "moved" / "main.py").unlink()
    os.rename(parent.root / "moved", parent.root / "again")
    child.write_bytes("child.txt", b"child\n")
    (child.root / "data.bin").unlink()
    assert child.read_bytes("README.md") == b"before the fork\n"
    assert child.exists("moved/main.py") and not child.exists("again")
    assert not parent.exists("child.txt") and parent.exists("data.bin")
    grandchild = child.fork()
    child.write_bytes("README.md", b"child after\n")
    assert grandchild.read_bytes("README.md") == b"before the fork\n" and grandchild.exists("child.txt")
    assert len(grandchild.layout.layers) == 2  # the parent's frozen changes, then the child's
    for ws in (grandchild, child, parent):
        ws.delete()
    assert layer_dirs(cow_store) == [] and mounts_under(cow_store.root) == []


def test_fork_of_an_untouched_workspace_shares_its_layers(cow_store: WorkspaceStore, src_tree: Path) -> None:
    base = cow_store.from_dir(src_tree)  # copied into one store layer
    assert base.layering is Layering.OVERLAY and base.layout.source is None and len(base.layout.layers) == 1
    forks = [base.fork() for _ in range(5)]
    assert {f.layout.layers for f in forks} == {base.layout.layers}  # no copy at all
    assert cow_store.layers.users(base.layout.layers[0]) == sorted([base.id, *(f.id for f in forks)])
    for f in forks:
        f.write_bytes("README.md", f.id.encode())
    assert base.read_bytes("README.md") == b"# demo\n\nhello world\n"
    for f in forks:
        f.delete()
    base.delete()
    assert layer_dirs(cow_store) == [] and mounts_under(cow_store.root) == []


def test_a_deep_chain_of_forks_is_flattened(cow_store: WorkspaceStore, src_tree: Path,
                                            monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(workspace_layout, "MAX_LAYERS", 2)
    ws = cow_store.from_dir(src_tree, in_place=True)
    chain = [ws]
    for i in range(4):
        chain[-1].write_bytes(f"step{i}.txt", b"%d\n" % i)
        chain.append(chain[-1].fork())
    last = chain[-1]
    assert len(last.layout.layers) <= 2
    assert all(last.read_bytes(f"step{i}.txt") == b"%d\n" % i for i in range(4))
    assert any("flattened" in w.layout.note for w in chain)
    assert tree_state(last.root) == tree_state(chain[-2].root)
    for w in reversed(chain):
        w.delete()
    assert layer_dirs(cow_store) == [] and mounts_under(cow_store.root) == []


def test_open_mounts_an_unmounted_workspace_again(cow_store: WorkspaceStore, src_tree: Path) -> None:
    ws = cow_store.from_dir(src_tree, in_place=True)
    ws.write_bytes("kept.txt", b"written before the restart\n")
    overlay.unmount(ws.root)  # what process exit does
    assert mounts_under(cow_store.root) == [] and not (ws.root / "README.md").exists()
    again = cow_store.open(ws.id)
    assert again.read_bytes("kept.txt") == b"written before the restart\n" and again.exists("README.md")
    assert again.base == ws.base and [c.path for c in again.changed_paths()] == ["kept.txt"]
    assert cow_store.open(ws.id).root == again.root  # already mounted: used as it is
    again.delete()
    assert mounts_under(cow_store.root) == []


def test_from_snapshot_is_copy_on_write(cow_store: WorkspaceStore, src_tree: Path) -> None:
    ws = cow_store.from_dir(src_tree)
    ws.write_bytes("extra.py", b"x = 1\n")
    snap = ws.snapshot()
    clone = cow_store.from_snapshot(snap)
    assert clone.layering is Layering.OVERLAY and tree_state(clone.root) == tree_state(ws.root)
    assert clone.diff() == "" and clone.fork().layout.layers == clone.layout.layers
    for w in list(cow_store.root.joinpath("ws").iterdir()):
        cow_store.open(w.name).delete()
    assert layer_dirs(cow_store) == [] and mounts_under(cow_store.root) == []


def test_delete_refuses_to_walk_into_a_mount_it_cannot_unmount(cow_store: WorkspaceStore, src_tree: Path,
                                                               monkeypatch: pytest.MonkeyPatch) -> None:
    ws = cow_store.from_dir(src_tree, in_place=True)
    monkeypatch.setattr(workspace_layout, "unmount", lambda _path: None)  # an unmount that silently did nothing
    with pytest.raises(WorkspaceError, match="still mounted"):
        ws.delete()
    assert tree_state(src_tree) == tree_state(ws.root)  # nothing was removed through the mount
    monkeypatch.undo()
    ws.delete()
    assert mounts_under(cow_store.root) == []


def test_remove_tree_removes_directories_that_cannot_be_renamed(tmp_path: Path,
                                                                monkeypatch: pytest.MonkeyPatch) -> None:
    root = make_tree(tmp_path / "t")
    (root / "src" / "pkg" / "deeper" / "deepest").mkdir(parents=True)
    (root / "src" / "pkg" / "deeper" / "deepest" / "f").write_text("x")

    def exdev(*_a: object, **_k: object) -> None:
        raise OSError(errno.EXDEV, "Invalid cross-device link")

    from tools import treewalk

    monkeypatch.setattr(treewalk.os, "rename", exdev)
    remove_path(root)
    assert not root.exists()


def test_copy_fallback_says_so_and_shows_progress(tmp_path: Path, src_tree: Path,
                                                  monkeypatch: pytest.MonkeyPatch,
                                                  capfd: pytest.CaptureFixture[str]) -> None:
    store = WorkspaceStore(tmp_path / "plain", overlay=False)
    ws = store.from_dir(src_tree, in_place=True)
    assert ws.layering in (Layering.COPY, Layering.REFLINK)
    assert "no overlay" in ws.layout.describe() and "overlays turned off" in ws.layout.note
    monkeypatch.setattr(delayed_progress, "PROGRESS_AFTER_S", 0.0)
    big = ws.root / "big.bin"
    big.write_bytes(os.urandom(1 << 20) * 64)  # 64 MiB: the copy takes a moment
    child = ws.fork()
    assert child.read_bytes("README.md") == ws.read_bytes("README.md") and child.layering is ws.layering
    err = capfd.readouterr().err
    assert "forking a workspace" in err
    ws.write_bytes("README.md", b"parent only\n")
    assert child.read_bytes("README.md") != b"parent only\n"
    child.delete()
    ws.delete()


def _run_child(store_root: Path, src: Path, how: str) -> None:
    code = textwrap.dedent(f"""
        import os, signal, sys
        from pathlib import Path
        from tools.workspace import WorkspaceStore
        store = WorkspaceStore(Path({str(store_root)!r}), overlay=True)
        ws = store.from_dir(Path({str(src)!r}), in_place=True)
        ws.write_bytes("x.txt", b"x")
        ws.fork()
        print(ws.root, flush=True)
        if {how!r} == "kill":
            os.kill(os.getpid(), signal.SIGKILL)
        if {how!r} == "os_exit":
            os._exit(3)
    """)
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120,
                          env={**os.environ, "PYTHONPATH": str(ROOT)}, cwd=ROOT)
    assert proc.stdout.strip().startswith(str(store_root)), proc.stderr


@pytest.mark.parametrize("how", ["exit", "os_exit", "kill"])
def test_no_mounts_left_after_the_process_ends(cow_store: WorkspaceStore, src_tree: Path, how: str) -> None:
    store_root = cow_store.root.parent / f"child-{how}"
    _run_child(store_root, src_tree, how)
    deadline = time.monotonic() + 10  # a killed process's reaper needs a moment
    while mounts_under(store_root) and time.monotonic() < deadline:
        time.sleep(0.05)
    with open("/proc/mounts") as f:
        assert str(store_root) not in f.read()
    # and the workspace is still there: a later process mounts it again
    (ws_dir,) = [p for p in (store_root / "ws").iterdir() if (p / "upper" / "x.txt").exists()]
    again = WorkspaceStore(store_root, overlay=None).open(ws_dir.name)
    assert again.read_bytes("x.txt") == b"x"
    again.delete()


def test_sigterm_of_an_open_workspace_leaves_no_mount(cow_store: WorkspaceStore, src_tree: Path) -> None:
    store_root = cow_store.root.parent / "child-term"
    code = textwrap.dedent(f"""
        import time
        from pathlib import Path
        from tools.workspace import WorkspaceStore
        ws = WorkspaceStore(Path({str(store_root)!r}), overlay=True).from_dir(Path({str(src_tree)!r}), in_place=True)
        print(ws.root, flush=True)
        time.sleep(60)
    """)
    with subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True, cwd=ROOT,
                          env={**os.environ, "PYTHONPATH": str(ROOT)}) as proc:
        assert proc.stdout is not None
        assert proc.stdout.readline().strip().startswith(str(store_root))
        assert mounts_under(store_root)
        proc.send_signal(signal.SIGTERM)  # no atexit: Python's default SIGTERM action just ends it
        proc.wait(timeout=30)
    deadline = time.monotonic() + 10
    while mounts_under(store_root) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert mounts_under(store_root) == []


def test_workspace_repr_names_its_layering(workspace: Workspace) -> None:
    assert str(workspace.layering) in repr(workspace)


def test_an_in_place_source_with_a_file_over_the_limit_is_refused(cow_store: WorkspaceStore,
                                                                  src_tree: Path) -> None:
    with open(src_tree / "big", "wb") as f:
        f.truncate(8 << 30)
    with pytest.raises(WorkspaceError, match="'big' is 8.0 GiB"):
        cow_store.from_dir(src_tree, in_place=True)
    assert list((cow_store.root / "ws").iterdir()) == [] and mounts_under(cow_store.root) == []
    (src_tree / ".gitignore").write_text("big\n")  # ignored: never looked at
    ws = cow_store.from_dir(src_tree, in_place=True)
    assert "big" not in ws.base.manifest and (ws.root / "big").stat().st_size == 8 << 30
    ws.delete()


def test_a_source_holding_the_store_is_refused_clearly(tmp_path: Path, src_tree: Path) -> None:
    store = WorkspaceStore(src_tree / ".flywheel")
    for in_place in (True, False):
        with pytest.raises(WorkspaceError, match="lies inside it"):
            store.from_dir(src_tree, in_place=in_place)
    assert list((store.root / "ws").iterdir()) == [] and mounts_under(src_tree) == []


def test_an_unreadable_source_file_is_a_workspace_error(cow_store: WorkspaceStore, src_tree: Path,
                                                        monkeypatch: pytest.MonkeyPatch) -> None:
    from tools import snapshots

    def unreadable(item: object, *_a: object, **_k: object) -> None:
        raise PermissionError(13, "Permission denied", "src/secret.txt")

    monkeypatch.setattr(snapshots, "file_entry", unreadable)
    with pytest.raises(WorkspaceError, match=r"cannot read 'src/secret.txt' \(Permission denied\)"):
        cow_store.from_dir(src_tree, in_place=True)
    assert list((cow_store.root / "ws").iterdir()) == [] and mounts_under(cow_store.root) == []


def test_a_slow_open_shows_progress_and_a_fast_one_prints_nothing(cow_store: WorkspaceStore, src_tree: Path,
                                                                  monkeypatch: pytest.MonkeyPatch,
                                                                  capfd: pytest.CaptureFixture[str]) -> None:
    from tools import snapshots

    fast = cow_store.from_dir(src_tree, in_place=True)
    assert capfd.readouterr().err == ""
    fast.delete()
    monkeypatch.setattr(delayed_progress, "PROGRESS_AFTER_S", 0.0)
    real = snapshots.file_entry

    def slow(*a: object, **k: object) -> object:
        time.sleep(0.1)
        return real(*a, **k)  # type: ignore[arg-type]

    monkeypatch.setattr(snapshots, "file_entry", slow)
    ws = cow_store.from_dir(src_tree, in_place=True)
    assert f"snapshotting {src_tree}" in capfd.readouterr().err
    ws.delete()


def test_unmount_all_unmounts_now_and_keeps_the_workspaces(cow_store: WorkspaceStore, src_tree: Path) -> None:
    ws = cow_store.from_dir(src_tree, in_place=True)
    ws.write_bytes("x.txt", b"x")
    fork = ws.fork()
    assert sorted(cow_store.unmount_all()) == sorted([str(ws.root), str(fork.root)])
    assert mounts_under(cow_store.root) == []
    again = cow_store.open(fork.id)  # mounted again on use, its changes intact
    assert again.read_bytes("x.txt") == b"x"
    again.delete()
    cow_store.open(ws.id).delete()


def test_the_store_of_a_killed_process_is_removed_at_once(cow_store: WorkspaceStore, src_tree: Path) -> None:
    """A killed process's mounts outlive it while a child it forked still holds its reaper's pipe
    (here: a child whose cwd is inside a workspace, so the mount is busy too); ``remove_store``
    unmounts them synchronously instead of failing with EBUSY."""
    from tools.workspace import remove_store

    store_root = cow_store.root.parent / "killed"
    code = textwrap.dedent(f"""
        import os, time
        from pathlib import Path
        from tools.workspace import WorkspaceStore
        store = WorkspaceStore(Path({str(store_root)!r}), overlay=True)
        ws = store.from_dir(Path({str(src_tree)!r}), in_place=True)
        ws.write_bytes("x.txt", b"x")
        fork = ws.fork()
        child = os.fork()
        if child == 0:  # holds the reaper's pipe (forked, not exec'd) and keeps the fork's mount busy
            os.chdir(fork.root)
            time.sleep(120)
            os._exit(0)
        print(child, flush=True)
        time.sleep(120)
    """)
    child = 0
    with subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True, cwd=ROOT,
                          env={**os.environ, "PYTHONPATH": str(ROOT)}) as proc:
        try:
            assert proc.stdout is not None
            child = int(proc.stdout.readline())
            proc.kill()
            proc.wait(timeout=30)
            assert len(mounts_under(store_root)) == 2  # left behind: nothing has unmounted them
            remove_store(store_root)
            assert not store_root.exists() and mounts_under(store_root) == []
            assert not (src_tree / "x.txt").exists()  # the in-place source was never written
        finally:
            proc.kill()
            if child:
                os.kill(child, signal.SIGKILL)
