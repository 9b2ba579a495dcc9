"""Workspace costs on a real tree: create, fork, snapshot, restore, diff.

The source is an installed package directory (default: networkx from this
venv, ~19 MB with its __pycache__), copied into a fresh store in a temporary
directory on the same file system as the system temp dir. Times are wall
clock, in milliseconds; ``fork`` is measured over ``--repeat`` forks (p50/p90).
Each measurement is run twice: with the store in the system temp dir (a disk
file system here) and in /dev/shm (tmpfs), since ``cp -a`` on a disk file
system without reflinks can be throttled by dirty-page writeback.

Usage: python benchmarks/workspace_fork.py [--src DIR] [--repeat N]
"""

from __future__ import annotations

import argparse
import importlib.util
import os
import subprocess
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

from _common import median, percentile, write_result

from tools.workspace import Workspace, WorkspaceStore


def default_source() -> Path:
    spec = importlib.util.find_spec("networkx")
    if spec is None or spec.origin is None:
        raise SystemExit("networkx is not installed; pass --src DIR")
    return Path(spec.origin).parent


def timed(fn: Callable[[], object]) -> tuple[float, object]:
    start = time.perf_counter()
    out = fn()
    return (time.perf_counter() - start) * 1000, out


def tree_size(root: Path) -> tuple[int, int]:
    files = size = 0
    for dirpath, _dirs, names in os.walk(root):
        for n in names:
            p = os.path.join(dirpath, n)
            if os.path.isfile(p) and not os.path.islink(p):
                files += 1
                size += os.path.getsize(p)
    return files, size


def damage(ws: Workspace, n: int) -> None:
    """Modify n files, add n, delete n (the shape of a typical agent session)."""
    py = sorted(p for p in ws.root.rglob("*.py") if p.is_file())
    for p in py[:n]:
        p.write_bytes(p.read_bytes() + b"\n# edited\n")
    for i in range(n):
        (ws.root / f"added_{i}.py").write_text(f"x = {i}\n")
    for p in py[n : 2 * n]:
        p.unlink()


def measure(src: Path, parent: str | None, repeat: int) -> dict[str, object]:
    """All timings with the store in a fresh temporary directory under ``parent``."""
    with tempfile.TemporaryDirectory(dir=parent) as tmp:
        fs = subprocess.run(["stat", "-f", "-c", "%T", tmp], capture_output=True, text=True).stdout.strip()
        store = WorkspaceStore(Path(tmp) / "store")
        create_ms, base_ws = timed(lambda: store.from_dir(src))
        assert isinstance(base_ws, Workspace)

        fork_ms, delete_ms = [], []
        for _ in range(repeat):
            t, child = timed(base_ws.fork)
            fork_ms.append(t)
            assert isinstance(child, Workspace)
            delete_ms.append(timed(child.delete)[0])

        snap_ms = [timed(base_ws.snapshot)[0] for _ in range(5)]  # blobs already stored

        work = base_ws.fork()
        restore_ms, diff_ms, snap_changed_ms = [], [], []
        for _ in range(5):
            damage(work, 10)
            diff_ms.append(timed(work.diff)[0])
            snap_changed_ms.append(timed(work.snapshot)[0])
            restore_ms.append(timed(lambda: work.restore(base_ws.base))[0])
        assert work.snapshot().id == base_ws.base.id

        from_snap_ms, clone = timed(lambda: store.from_snapshot(base_ws.base))
        assert isinstance(clone, Workspace)
    return {
        "fs": fs,
        "create_from_dir_ms": round(create_ms, 1),
        "fork_ms": {"p50": round(median(fork_ms), 1), "p90": round(percentile(fork_ms, 90), 1),
                    "min": round(min(fork_ms), 1)},
        "delete_ms_p50": round(median(delete_ms), 1),
        "snapshot_unchanged_ms_p50": round(median(snap_ms), 1),
        "snapshot_after_30_changes_ms_p50": round(median(snap_changed_ms), 1),
        "diff_after_30_changes_ms_p50": round(median(diff_ms), 1),
        "restore_30_changes_ms_p50": round(median(restore_ms), 1),
        "from_snapshot_ms": round(from_snap_ms, 1),
    }


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--src", type=Path, default=None)
    ap.add_argument("--repeat", type=int, default=10)
    args = ap.parse_args()
    src = args.src or default_source()
    files, size = tree_size(src)
    stores = {"tmpdir": measure(src, None, args.repeat)}
    if os.path.isdir("/dev/shm") and os.access("/dev/shm", os.W_OK):
        stores["dev_shm"] = measure(src, "/dev/shm", args.repeat)
    write_result("workspace_fork", {
        "source": str(src),
        "tree": {"files": files, "bytes": size},
        "repeat": args.repeat,
        "stores": stores,
    })


if __name__ == "__main__":
    main()
