"""Workspace limits: sparse multi-GB files, 2,000-level trees, corrupt blobs (bounded in memory, disk and time)."""

from __future__ import annotations

import hashlib
import os
import resource
import tempfile
import tracemalloc
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from tools.blobs import SnapshotError
from tools.diffs import MAX_DIFF_FILE_BYTES
from tools.snapshots import FileTooLargeError, TreeTooDeepError
from tools.treewalk import remove_path
from tools.workspace import Workspace, WorkspaceError, WorkspaceStore

from .conftest import make_tree

BIG = 8 << 30  # apparent size only: made with truncate, no data blocks
PEAK_LIMIT = 16 << 20


def sparse(path: Path, size: int, data_at: tuple[int, ...] = ()) -> Path:
    with open(path, "wb") as f:
        f.truncate(size)
        for off in data_at:
            f.seek(off)
            f.write(b"DATA-%d\n" % off)
    return path


def disk_bytes(root: Path) -> int:
    """Allocated bytes (st_blocks) of every file under root."""
    total = 0
    for dirpath, _dirs, files in os.walk(root):
        for name in files:
            total += os.lstat(os.path.join(dirpath, name)).st_blocks * 512
    return total


def peak(fn: Callable[[], Any]) -> tuple[int, Any]:
    """``fn()`` and its peak Python heap, run with the address space capped at +1 GiB, so a
    regression that reads a multi-GB file fails with MemoryError instead of exhausting the machine."""
    with open("/proc/self/status") as f:
        vm = next(int(line.split()[1]) * 1024 for line in f if line.startswith("VmSize:"))
    soft, hard = resource.getrlimit(resource.RLIMIT_AS)
    resource.setrlimit(resource.RLIMIT_AS, (vm + (1 << 30), hard))
    tracemalloc.start()
    try:
        out = fn()
        return tracemalloc.get_traced_memory()[1], out
    finally:
        tracemalloc.stop()
        resource.setrlimit(resource.RLIMIT_AS, (soft, hard))


def deep_tree(root: Path, levels: int) -> Path:
    """``levels`` nested one-letter directories under root (walked by fd: no path grows past a few bytes)."""
    fd = os.open(root, os.O_RDONLY | os.O_DIRECTORY)
    try:
        for _ in range(levels):
            os.mkdir("d", dir_fd=fd)
            nxt = os.open("d", os.O_RDONLY | os.O_DIRECTORY, dir_fd=fd)
            os.close(fd)
            fd = nxt
        os.close(os.open("leaf.txt", os.O_WRONLY | os.O_CREAT, 0o644, dir_fd=fd))
    finally:
        os.close(fd)
    return root


@pytest.fixture
def fast_tmp(tmp_path: Path) -> Iterator[Path]:
    """A scratch dir on tmpfs where there is one (thousands of mkdir/rmdir are slow on a loaded ext4),
    removed at teardown with remove_path (pytest's own cleanup would hit RecursionError on deep trees)."""
    base = Path("/dev/shm") if os.access("/dev/shm", os.W_OK) else tmp_path
    d = Path(tempfile.mkdtemp(dir=base, prefix="fw-deep-"))
    yield d
    remove_path(d)


@pytest.fixture
def big_ws(workspace: Workspace) -> Iterator[Workspace]:
    """A workspace in which the model has run ``truncate -s 8G big``."""
    sparse(workspace.root / "big", BIG)
    yield workspace


# ---------------------------------------------------------------- sparse files above the limit


def test_creating_a_workspace_with_an_8g_file_is_refused_in_bounded_memory(store: WorkspaceStore,
                                                                          src_tree: Path) -> None:
    sparse(src_tree / "big", BIG)
    used, exc = peak(lambda: pytest.raises(WorkspaceError, store.from_dir, src_tree))
    assert used < PEAK_LIMIT
    assert "'big' is 8.0 GiB" in str(exc.value) and "up to 1.0 GiB" in str(exc.value)
    assert disk_bytes(store.root) < 1 << 20  # no blob, and the half-made workspace is gone
    assert list((store.root / "ws").iterdir()) == []


def test_diff_of_an_8g_file_is_a_note_in_bounded_memory(big_ws: Workspace) -> None:
    used, diff = peak(big_ws.diff)
    assert used < PEAK_LIMIT
    assert "diff --git a/big b/big\nnew file mode 100644\n" in diff
    assert f"Large file a/big and b/big differ (none -> {BIG} bytes); not shown" in diff
    assert [c.path for c in big_ws.changed_paths()] == ["big"]


def test_snapshot_of_an_8g_file_is_refused_and_writes_no_blob(big_ws: Workspace) -> None:
    before = disk_bytes(big_ws.store.root / "blobs")
    used, exc = peak(lambda: pytest.raises(FileTooLargeError, big_ws.snapshot))
    assert used < PEAK_LIMIT and "'big'" in str(exc.value)
    assert disk_bytes(big_ws.store.root / "blobs") == before


def test_restore_removes_an_8g_file(big_ws: Workspace) -> None:
    used, _ = peak(lambda: big_ws.restore(big_ws.base))
    assert used < PEAK_LIMIT
    assert not (big_ws.root / "big").exists() and big_ws.diff() == ""


def test_write_file_over_an_8g_file_does_not_read_it(big_ws: Workspace) -> None:
    used, edit = peak(lambda: big_ws.write_bytes("big", b"small now\n"))
    assert used < PEAK_LIMIT
    assert f"Large file a/big and b/big differ ({BIG} bytes -> 10 bytes)" in edit.diff
    assert big_ws.read_bytes("big") == b"small now\n"


def test_fork_and_delete_keep_holes(big_ws: Workspace) -> None:
    child = big_ws.fork()
    assert (child.root / "big").stat().st_size == BIG and disk_bytes(child.root) < 1 << 20
    child.delete()
    assert not child.root.exists()


# ---------------------------------------------------------------- sparse files under the limit


def test_sparse_file_under_the_limit_is_stored_sparse_and_restored_exactly(
        tmp_path: Path, src_tree: Path) -> None:
    size = 48 << 20
    sparse(src_tree / "holes.img", size, data_at=(0, 5 << 20, size - 100))
    want = hashlib.sha256((src_tree / "holes.img").read_bytes()).hexdigest()
    store = WorkspaceStore(tmp_path / "s")
    used, ws = peak(lambda: store.from_dir(src_tree))
    assert used < PEAK_LIMIT  # streamed: holes are hashed from a zero buffer, never read
    assert ws.base.manifest["holes.img"].sha256 == want
    assert disk_bytes(store.root / "blobs") < 2 << 20
    (ws.root / "holes.img").write_bytes(b"clobbered")
    ws.restore(ws.base)
    restored = ws.root / "holes.img"
    assert restored.stat().st_size == size and restored.stat().st_blocks * 512 < 2 << 20
    assert hashlib.sha256(restored.read_bytes()).hexdigest() == want
    clone = store.from_snapshot(ws.base)
    assert hashlib.sha256((clone.root / "holes.img").read_bytes()).hexdigest() == want


def test_store_limit_is_configurable(tmp_path: Path, src_tree: Path) -> None:
    (src_tree / "two_mib.bin").write_bytes(b"x" * (2 << 20))
    with pytest.raises(WorkspaceError, match=r"'two_mib.bin' is 2.0 MiB .* up to 1.0 MiB"):
        WorkspaceStore(tmp_path / "s", max_file_bytes=1 << 20).from_dir(src_tree)


def test_diff_of_a_file_just_over_the_diff_limit_is_a_note(workspace: Workspace) -> None:
    (workspace.root / "README.md").write_bytes(b"y\n" * (MAX_DIFF_FILE_BYTES // 2 + 1))
    diff = workspace.diff()
    assert "Large file a/README.md and b/README.md differ" in diff and len(diff) < 1000


# ---------------------------------------------------------------- 2,000-level trees


def test_creating_from_a_2000_level_tree_is_refused_clearly(fast_tmp: Path) -> None:
    store = WorkspaceStore(fast_tmp / "store")
    src = deep_tree(make_tree(fast_tmp / "src"), 2000)
    with pytest.raises(WorkspaceError, match="deeper than 256 directory levels"):
        store.from_dir(src)
    assert list((store.root / "ws").iterdir()) == []  # the copy (any depth) was removed


def test_2000_level_tree_made_in_a_workspace(fast_tmp: Path) -> None:
    workspace = WorkspaceStore(fast_tmp / "store").from_dir(make_tree(fast_tmp / "src"))
    deep_tree(workspace.root, 2000)
    diff = workspace.diff()
    assert "# not shown: " in diff and "deeper than 256 directory levels" in diff
    paths = [c.path for c in workspace.changed_paths()]
    assert paths == ["d/" * 256 + "d"]  # the first entry past the limit stands for the rest
    with pytest.raises(TreeTooDeepError, match="deeper than 256"):
        workspace.snapshot()
    workspace.restore(workspace.base)
    assert not (workspace.root / "d").exists() and workspace.diff() == ""
    deep_tree(workspace.root, 2000)
    workspace.delete()
    assert not workspace.root.parent.exists()


# ---------------------------------------------------------------- blobs checked on restore


def _corrupt_blob(ws: Workspace, path: str) -> str:
    sha = ws.base.manifest[path].sha256
    assert sha is not None
    blob = ws.store.blobs.path(sha)
    os.chmod(blob, 0o644)
    blob.write_bytes(b"tampered\n" + blob.read_bytes()[9:])
    return sha


def test_restore_refuses_a_corrupt_blob_and_leaves_the_tree_untouched(workspace: Workspace) -> None:
    sha = _corrupt_blob(workspace, "src/pkg/core.py")
    (workspace.root / "src" / "pkg" / "core.py").write_text("edited\n")
    (workspace.root / "extra.txt").write_text("extra\n")
    with pytest.raises(SnapshotError) as exc:
        workspace.restore(workspace.base)
    msg = str(exc.value)
    assert sha in msg and "'src/pkg/core.py'" in msg and "corrupt" in msg and "not changed" in msg
    assert (workspace.root / "extra.txt").exists()  # nothing was removed either
    assert (workspace.root / "src" / "pkg" / "core.py").read_text() == "edited\n"


def test_restore_refuses_a_missing_blob(workspace: Workspace) -> None:
    sha = workspace.base.manifest["README.md"].sha256
    assert sha is not None
    os.unlink(workspace.store.blobs.path(sha))
    (workspace.root / "README.md").unlink()
    with pytest.raises(SnapshotError, match=f"blob {sha} .*'README.md'.* missing"):
        workspace.restore(workspace.base)


def test_diff_refuses_a_corrupt_blob(workspace: Workspace) -> None:
    _corrupt_blob(workspace, "README.md")
    (workspace.root / "README.md").write_text("changed\n")
    with pytest.raises(SnapshotError, match="'README.md'.* corrupt"):
        workspace.diff()
