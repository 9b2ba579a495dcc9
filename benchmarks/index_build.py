"""Index build throughput on this machine: chunks/s for a real tree of >= 20k chunks, and peak memory.

The tree: packages (sub-directories) of this Python's standard library, largest first, then its
top-level modules, largest first (the packages alone hold ~12.6k chunks), copied into a
temporary directory until they hold at least ``--min-chunks`` chunks (``test/``, ``site-packages/``
and ``encodings/`` are left out: tests are not what users index, and the codec tables are near-
duplicate data that content-hash dedup would make look cheap). Or give ``--root DIR``.

Measured, in one process:
* ``chunk``: walking + tree-sitter chunking alone (``embeddings.walk`` + ``embeddings.chunking``);
* ``build``: ``WorkspaceIndex(root).refresh()`` from an empty cache: walk, chunk, embed (the bundled
  MiniLM on CPU), BM25, save — chunks/s = chunks / wall seconds;
* memory: peak RSS of the process (``VmHWM``), and RSS before the build (the model loaded).

    python benchmarks/index_build.py [--min-chunks 20000] [--root DIR] [--quick]
"""

from __future__ import annotations

import argparse
import os
import shutil
import sys
import sysconfig
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from benchmarks._common import write_result  # noqa: E402

SKIP = {"test", "site-packages", "encodings", "__pycache__", "lib2to3/tests", "idlelib/idle_test"}


def _status(field: str) -> int:
    """A /proc/self/status memory field, in bytes (0 where /proc is missing)."""
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith(field + ":"):
                return int(line.split()[1]) * 1024
    except OSError:
        pass
    return 0


def count_chunks(root: Path) -> tuple[int, int, float]:
    from embeddings.chunking import chunk_file
    from embeddings.walk import iter_files

    t0 = time.perf_counter()
    files = chunks = 0
    for rel in iter_files(root):
        try:
            data = (root / rel).read_bytes()
        except OSError:
            continue
        files += 1
        chunks += len(chunk_file(rel, data))
    return files, chunks, time.perf_counter() - t0


def stdlib_tree(dest: Path, min_chunks: int) -> tuple[list[str], int]:
    """Copy stdlib packages, largest (by chunks) first, then the top-level modules (as one
    ``modules/`` folder, largest first), until >= min_chunks."""
    std = Path(sysconfig.get_paths()["stdlib"])
    picked, total = [], 0
    sizes = []
    for d in sorted(std.iterdir()):
        if d.is_dir() and d.name not in SKIP and (d / "__init__.py").exists():
            sizes.append((count_chunks(d)[1], d.name))
    for n, name in sorted(sizes, reverse=True):
        if total >= min_chunks:
            return picked, total
        shutil.copytree(std / name, dest / name,
                        ignore=shutil.ignore_patterns("__pycache__", "test", "tests", "idle_test", "*.pyc"))
        picked.append(name)
        total += count_chunks(dest / name)[1]  # what was copied (test dirs left out), not n
    modules = sorted(std.glob("*.py"), key=lambda p: p.stat().st_size, reverse=True)
    (dest / "modules").mkdir(exist_ok=True)
    for mod in modules:
        if total >= min_chunks:
            break
        shutil.copy2(mod, dest / "modules" / mod.name)
        picked.append(mod.name)
        total += len(_chunks_of(dest / "modules" / mod.name))
    return picked, total


def _chunks_of(path: Path) -> list:
    from embeddings.chunking import chunk_file

    return chunk_file(path.name, path.read_bytes())


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--root", type=Path, help="index this tree instead of the stdlib selection")
    ap.add_argument("--min-chunks", type=int, default=None, help="stdlib selection size (default 20000; quick 300)")
    ap.add_argument("--model", default=None, help="embedder model (default: bundled MiniLM)")
    ap.add_argument("--quick", action="store_true", help="a ~300-chunk tree (smoke test, < 60 s)")
    args = ap.parse_args(argv)
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    min_chunks = args.min_chunks or (300 if args.quick else 20_000)

    from embeddings.embedder import DEFAULT_MODEL, SentenceTransformerEmbedder
    from embeddings.index import WorkspaceIndex

    with tempfile.TemporaryDirectory(prefix="index-build-") as tmp:
        if args.root:
            root, picked = args.root.resolve(), None
        else:
            root = Path(tmp) / "tree"
            root.mkdir()
            if args.quick:  # small packages, for the smoke test
                std = Path(sysconfig.get_paths()["stdlib"])
                picked = []
                for name in ("json", "wsgiref", "html", "http", "urllib", "email", "logging"):
                    shutil.copytree(std / name, root / name, ignore=shutil.ignore_patterns("__pycache__", "test*"))
                    picked.append(name)
                    if count_chunks(root)[1] >= min_chunks:
                        break
            else:
                picked, _ = stdlib_tree(root, int(min_chunks * 1.1))  # the index splits ~6% fewer chunks
        files, n_chunks, chunk_s = count_chunks(root)
        embedder = SentenceTransformerEmbedder(args.model or DEFAULT_MODEL)
        _ = embedder.dim  # load the model before the clock starts
        rss_before = _status("VmRSS")
        index = WorkspaceIndex(root, embedder=embedder, data_dir=Path(tmp) / "index")
        t0 = time.perf_counter()
        stats = index.refresh(progress=not args.quick, save=True)  # full: a tqdm bar on stderr
        build_s = time.perf_counter() - t0
        # a second refresh: nothing changed, so nothing is re-chunked or embedded
        t1 = time.perf_counter()
        again = index.refresh(progress=False, save=False)
        refresh_s = time.perf_counter() - t1
        result = {
            "quick": args.quick,
            "tree": {"root": "stdlib packages, then top-level modules, copied to a temp dir" if picked is not None
                     else str(root),
                     "python_stdlib_packages": picked, "files": files, "chunks": n_chunks},
            "model": embedder.name, "cpus": os.cpu_count(),
            "chunking_only": {"seconds": round(chunk_s, 2), "chunks_per_s": round(n_chunks / chunk_s, 1)},
            "build": {"seconds": round(build_s, 1), "chunks": stats.chunks, "embedded": stats.embedded,
                      "reused": stats.reused, "chunks_per_s": round(stats.chunks / build_s, 1)},
            "unchanged_refresh": {"seconds": round(refresh_s, 2), "embedded": again.embedded},
            "memory": {"peak_rss_mb": round(_status("VmHWM") / 2**20, 1),
                       "rss_before_build_mb": round(rss_before / 2**20, 1),
                       "rss_after_build_mb": round(_status("VmRSS") / 2**20, 1)},
            "note": "wall-clock on a shared 2-core VM: other processes running at the same time slow it down",
        }
        index.close()
    write_result("index_build_quick" if args.quick else "index_build", result)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
