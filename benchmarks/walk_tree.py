"""Walking a 100k-file tree: time, files kept, and memory (issue 5: "handles a 100k-file tree
without hanging (progress bar, bounded memory)").

Builds a synthetic tree in a temporary directory: ``--files`` small source files
(default 100,000) in 100 packages x 10 modules, plus what a real checkout has and
the walk must skip: a ``node_modules/`` and a ``.venv/`` (vendored), build
output ignored by a nested ``.gitignore``, ``*.log`` files ignored by the root
one, binaries, and a re-included ``!keep.log``. Then times
``embeddings.walk.iter_files`` over it, with Python heap growth measured by
``tracemalloc`` (peak while walking, so it includes the walk's own state, not
the list the benchmark keeps) and process RSS.

Only the walk and the stat scan (what ``WorkspaceIndex.refresh`` does before
embedding anything) are timed: embedding 100k files would take hours on this
CPU, and ``benchmarks/index_build.py`` measures that part.

    python benchmarks/walk_tree.py [--files 100000]
"""

from __future__ import annotations

import argparse
import os
import shutil
import sys
import tempfile
import time
import tracemalloc
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from benchmarks._common import write_result  # noqa: E402
from embeddings.walk import iter_files  # noqa: E402


def rss() -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    return 0


def build(root: Path, n_files: int) -> dict[str, int]:
    per_dir = max(1, n_files // 1000)
    made = {"source": 0, "skipped_on_purpose": 0}
    root.mkdir(parents=True)
    (root / ".gitignore").write_text("*.log\n!keep.log\n")  # text files the walk keeps, like sources
    made["source"] += 2  # this one and service/.gitignore
    for p in range(100):
        for m in range(10):
            d = root / f"pkg{p:02d}" / f"mod{m}"
            d.mkdir(parents=True)
            for f in range(per_dir):
                (d / f"f{f:03d}.py").write_text(f"def f_{p}_{m}_{f}(x):\n    return x + {f}\n")
                made["source"] += 1
        (root / f"pkg{p:02d}" / "run.log").write_text("ignored\n")
        made["skipped_on_purpose"] += 1
    (root / "pkg00" / "keep.log").write_text("re-included\n")
    made["source"] += 1
    for vendored in ("node_modules/lib", ".venv/lib"):
        d = root / vendored
        d.mkdir(parents=True)
        for f in range(500):
            (d / f"v{f}.js").write_text("module.exports = 1;\n")
            made["skipped_on_purpose"] += 1
    b = root / "service" / "build"
    b.mkdir(parents=True)
    (root / "service" / ".gitignore").write_text("build/\n")
    for f in range(500):
        (b / f"out{f}.py").write_text("x = 1\n")
        made["skipped_on_purpose"] += 1
    for f in range(200):
        (root / "service" / f"blob{f}.bin").write_bytes(b"\x00\x01" * 64)
        made["skipped_on_purpose"] += 1
    return made


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--files", type=int, default=100_000)
    args = ap.parse_args(argv)
    tmp = Path(tempfile.mkdtemp(prefix="walk-tree-"))
    try:
        t0 = time.perf_counter()
        made = build(tmp / "tree", args.files)
        build_s = time.perf_counter() - t0
        rss0 = rss()
        tracemalloc.start()
        t0 = time.perf_counter()
        kept = 0
        for rel in iter_files(tmp / "tree"):
            kept += 1
            os.stat(tmp / "tree" / rel, follow_symlinks=False)  # refresh's change detection
        walk_s = time.perf_counter() - t0
        _, peak = tracemalloc.get_traced_memory()
        tracemalloc.stop()
        result = {
            "tree": {**made, "build_s": round(build_s, 1)},
            "walk": {"files_kept": kept, "expected_kept": made["source"], "correct": kept == made["source"],
                     "seconds": round(walk_s, 2), "files_per_s": round(kept / walk_s),
                     "python_heap_peak_mb": round(peak / 2**20, 2),
                     "rss_growth_mb": round((rss() - rss0) / 2**20, 1)},
        }
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    write_result("walk_tree", result)
    return 0 if result["walk"]["correct"] else 1


if __name__ == "__main__":
    raise SystemExit(main())
