"""Workspace costs: open and fork at 1k, 10k and 100k files, copy-on-write against a full copy.

Each generated tree is shaped like a project with a virtualenv: 5% of its
files are source (2 KiB each, shown in snapshots and diffs), the rest live in
a ``.venv/`` that ``.gitignore`` hides, sized so the tree holds 30 KiB a file
(3 GB at 100k files). Per scale, with the store and the tree in the system
temp dir (the same file system):

* ``open``: ``WorkspaceStore.from_dir(tree, in_place=True)`` in a fresh
  store: an overlay over the tree plus the starting snapshot of what is shown
  (hashed; the workspace is usable from then on), and the time until the
  shown files' blobs are stored (in the background); median of ``--opens`` runs;
* ``fork``: forks of the untouched workspace (p50/p90/max of ``--forks``), a
  fork after 10 files changed (the parent's changes are frozen into a layer),
  and deleting a fork;
* ``full copy``: ``cp -a`` of the tree (what every open and every fork cost
  before copy-on-write), and an open in a store without overlays
  (``overlay=False``: the copy plus the same snapshot); at 1k and 10k files,
  also an in-place open of the same tree without its ``.gitignore`` (every
  file hashed and stored).

The full run also repeats the older measurements on an installed package
(networkx: create, fork, snapshot, restore, diff), and checks the targets:
open under 1 s and fork under 50 ms at 100k files. Times are wall clock in
milliseconds, with a warm page cache. ``--quick`` (smoke run: 1k and 5k small
files, no package) writes ``workspace_fork_quick.json`` and never the
committed result.

Usage: python benchmarks/workspace_fork.py [--quick] [--scales 1000,10000,100000] [--forks N] [--dir DIR]
"""

from __future__ import annotations

import argparse
import importlib.util
import os
import shutil
import subprocess
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from _common import median, percentile, write_result

from tools.overlay import mounts_under, overlay_unavailable
from tools.workspace import Workspace, WorkspaceStore

SOURCE_SHARE = 0.05
SOURCE_FILE_BYTES = 2048
FILES_PER_DIR = 100
_BLOCK = os.urandom(1 << 20)


def timed(fn: Callable[[], Any]) -> tuple[float, Any]:
    start = time.perf_counter()
    out = fn()
    return (time.perf_counter() - start) * 1000, out


def _write(path: Path, size: int, seed: int) -> None:
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    try:
        off = (seed * 4099) % len(_BLOCK)
        left = size
        while left:
            chunk = _BLOCK[off:off + min(left, len(_BLOCK) - off)]
            os.write(fd, chunk)
            left -= len(chunk)
            off = 0
    finally:
        os.close(fd)


def make_project(root: Path, files: int, bytes_per_file: int) -> dict[str, int]:
    """A tree of ``files`` files: source files, a ``.gitignore`` and an ignored ``.venv``."""
    n_src = max(1, int(files * SOURCE_SHARE))
    n_venv = files - n_src - 1
    venv_file = max(1, (files * bytes_per_file - n_src * SOURCE_FILE_BYTES) // max(1, n_venv))
    (root / ".gitignore").write_text(".venv/\n__pycache__/\n")
    for i in range(n_src):
        d = root / "src" / f"pkg{i // FILES_PER_DIR:04d}"
        if i % FILES_PER_DIR == 0:
            d.mkdir(parents=True)
        _write(d / f"mod{i % FILES_PER_DIR:03d}.py", SOURCE_FILE_BYTES, i)
    site = root / ".venv" / "lib" / "python3.11" / "site-packages"
    for i in range(n_venv):
        d = site / f"dep{i // FILES_PER_DIR:05d}"
        if i % FILES_PER_DIR == 0:
            d.mkdir(parents=True)
        _write(d / f"m{i % FILES_PER_DIR:03d}.py", venv_file, i)
    total = n_src * SOURCE_FILE_BYTES + n_venv * venv_file
    return {"files": files, "source_files": n_src, "venv_files": n_venv, "bytes": total}


def _fs(path: Path) -> str:
    return subprocess.run(["stat", "-f", "-c", "%T", str(path)], capture_output=True, text=True).stdout.strip()


def _edit(ws: Workspace, n: int) -> None:
    for p in sorted(ws.root.glob("src/pkg0000/*.py"))[:n]:
        p.write_bytes(p.read_bytes() + b"# edited\n")


def measure_scale(tmp: Path, files: int, bytes_per_file: int, *, opens: int, forks: int,
                  unignored: bool) -> dict[str, Any]:
    tree = tmp / f"tree-{files}"
    tree.mkdir()
    gen_ms, shape = timed(lambda: make_project(tree, files, bytes_per_file))
    out: dict[str, Any] = {"tree": shape, "generate_ms": round(gen_ms)}

    open_ms: list[float] = []
    stored_ms: list[float] = []
    for i in range(opens):
        store = WorkspaceStore(tmp / f"store-{files}-{i}", overlay=None)
        start = time.perf_counter()
        ws = store.from_dir(tree, in_place=True)
        open_ms.append((time.perf_counter() - start) * 1000)
        store.blobs.wait()  # the shown files' blobs, stored in the background
        stored_ms.append((time.perf_counter() - start) * 1000)
        if i < opens - 1:
            ws.delete()
    out["layering"] = str(ws.layering)
    out["open_ms"] = {"p50": round(median(open_ms), 1), "runs": [round(x, 1) for x in open_ms]}
    out["open_until_blobs_stored_ms_p50"] = round(median(stored_ms), 1)
    out["shown_files"] = sum(1 for e in ws.base.manifest.values() if e.kind == "file")

    fork_ms, delete_ms = [], []
    for _ in range(forks):
        t, child = timed(ws.fork)
        fork_ms.append(t)
        delete_ms.append(timed(child.delete)[0])
    out["fork_ms"] = {"p50": round(median(fork_ms), 2), "p90": round(percentile(fork_ms, 90), 2),
                      "max": round(max(fork_ms), 2)}
    out["delete_fork_ms_p50"] = round(median(delete_ms), 2)
    _edit(ws, 10)
    t, changed_child = timed(ws.fork)
    out["fork_after_10_edits_ms"] = round(t, 2)
    out["changed_paths_after_10_edits_ms"] = round(timed(ws.changed_paths)[0], 1)
    changed_child.delete()
    ws.delete()

    t, _ = timed(lambda: subprocess.run(["cp", "-a", "--reflink=auto", "-T", str(tree), str(tmp / "cp")],
                                        check=True))
    out["full_copy_cp_ms"] = round(t)
    shutil.rmtree(tmp / "cp")
    plain = WorkspaceStore(tmp / f"plain-{files}", overlay=False, progress=False)
    t, pws = timed(lambda: plain.from_dir(tree))
    out["copy_store_open_ms"] = round(t)
    out["copy_store_fork_ms"] = round(timed(pws.fork)[0])
    if unignored:  # the same tree with nothing ignored: every file hashed and stored
        os.rename(tree / ".gitignore", tmp / "gitignore.aside")
        store = WorkspaceStore(tmp / f"store-all-{files}", overlay=None)
        start = time.perf_counter()
        aws = store.from_dir(tree, in_place=True)
        out["open_nothing_ignored_ms"] = round((time.perf_counter() - start) * 1000)
        store.blobs.wait()
        out["open_nothing_ignored_until_blobs_stored_ms"] = round((time.perf_counter() - start) * 1000)
        aws.delete()
        os.rename(tmp / "gitignore.aside", tree / ".gitignore")
    return out


def measure_package(src: Path, parent: Path, repeat: int) -> dict[str, object]:
    """The older measurements: create, fork, snapshot, restore, diff on an installed package."""
    store = WorkspaceStore(parent / "pkg-store")
    create_ms, base_ws = timed(lambda: store.from_dir(src))
    fork_ms, delete_ms = [], []
    for _ in range(repeat):
        t, child = timed(base_ws.fork)
        fork_ms.append(t)
        delete_ms.append(timed(child.delete)[0])
    snap_ms = [timed(base_ws.snapshot)[0] for _ in range(5)]
    work = base_ws.fork()
    restore_ms, diff_ms = [], []
    for _ in range(5):
        py = sorted(p for p in work.root.rglob("*.py") if p.is_file())
        for p in py[:10]:
            p.write_bytes(p.read_bytes() + b"\n# edited\n")
        for i in range(10):
            (work.root / f"added_{i}.py").write_text(f"x = {i}\n")
        for p in py[10:20]:
            p.unlink()
        diff_ms.append(timed(work.diff)[0])
        restore_ms.append(timed(lambda: work.restore(base_ws.base))[0])
    assert work.snapshot().id == base_ws.base.id
    from_snap_ms, clone = timed(lambda: store.from_snapshot(base_ws.base))
    for ws in (clone, work, base_ws):
        ws.delete()
    files = sum(1 for p in src.rglob("*") if p.is_file() and not p.is_symlink())
    return {
        "source": str(src), "files": files, "layering": str(base_ws.layering),
        "create_from_dir_ms": round(create_ms, 1),
        "fork_ms": {"p50": round(median(fork_ms), 1), "p90": round(percentile(fork_ms, 90), 1)},
        "delete_ms_p50": round(median(delete_ms), 1),
        "snapshot_unchanged_ms_p50": round(median(snap_ms), 1),
        "diff_after_30_changes_ms_p50": round(median(diff_ms), 1),
        "restore_30_changes_ms_p50": round(median(restore_ms), 1),
        "from_snapshot_ms": round(from_snap_ms, 1),
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--quick", action="store_true", help="smoke run: 1k and 5k small files, no package tree")
    ap.add_argument("--scales", default=None, help="comma-separated file counts (default 1000,10000,100000)")
    ap.add_argument("--bytes-per-file", type=int, default=None, help="average file size (default 30 KiB)")
    ap.add_argument("--opens", type=int, default=None, help="opens per scale (default 3)")
    ap.add_argument("--forks", type=int, default=None, help="forks per scale (default 20)")
    ap.add_argument("--dir", type=Path, default=None, help="where trees and stores go (default: the temp dir)")
    args = ap.parse_args()
    quick = args.quick
    scales = [int(x) for x in (args.scales or ("1000,5000" if quick else "1000,10000,100000")).split(",")]
    bpf = args.bytes_per_file or (2048 if quick else 30 * 1024)
    opens, forks = args.opens or (1 if quick else 3), args.forks or (5 if quick else 20)
    out: dict[str, Any] = {"quick": quick, "source_share": SOURCE_SHARE, "bytes_per_file": bpf}
    with tempfile.TemporaryDirectory(dir=args.dir, prefix="fw-bench-") as tmp_s:
        tmp = Path(tmp_s)
        out["fs"] = _fs(tmp)
        out["overlay"] = overlay_unavailable(tmp) or "available"
        out["scales"] = {}
        for n in scales:
            out["scales"][str(n)] = measure_scale(tmp, n, bpf, opens=opens, forks=forks, unignored=n <= 10_000)
            print(f"{n} files: {out['scales'][str(n)]}", flush=True)
            for p in tmp.iterdir():  # the next scale starts on a clean disk
                if p.is_dir() and not mounts_under(p):
                    shutil.rmtree(p, ignore_errors=True)
        if not quick:
            spec = importlib.util.find_spec("networkx")
            if spec is not None and spec.origin is not None:
                out["package"] = measure_package(Path(spec.origin).parent, tmp, 10)
        assert not mounts_under(tmp), f"mounts left behind: {mounts_under(tmp)}"
    big = out["scales"].get("100000")
    if big is not None:
        out["targets"] = {"open_under_1s_at_100k": big["open_ms"]["p50"] < 1000,
                          "fork_under_50ms_at_100k": big["fork_ms"]["p50"] < 50}
    write_result("workspace_fork_quick" if quick else "workspace_fork", out)


if __name__ == "__main__":
    main()
