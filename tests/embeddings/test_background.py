"""embeddings/background.py: builds off the caller's thread, shares embeddings, reports progress and failure."""

from __future__ import annotations

import os
import threading
from pathlib import Path

import pytest

from embeddings.background import IndexNotReady, IndexPool
from embeddings.embedder import SentenceTransformerEmbedder

os.environ.setdefault("HF_HUB_OFFLINE", "1")

CODE = 'def celsius_to_fahrenheit(c):\n    """Convert Celsius to Fahrenheit."""\n    return c * 9 / 5 + 32\n'


@pytest.fixture(scope="module")
def minilm() -> SentenceTransformerEmbedder:
    return SentenceTransformerEmbedder()


@pytest.fixture
def pool(tmp_path: Path, minilm: SentenceTransformerEmbedder):
    p = IndexPool(tmp_path / "index", embedder=minilm, wait_s=60)
    yield p
    p.close()


def tree(root: Path, files: int = 3) -> Path:
    root.mkdir(parents=True)
    for i in range(files):
        (root / f"m{i}.py").write_text(CODE.replace("celsius_to_fahrenheit", f"convert_{i}"))
    return root


def test_not_ready_while_queued_then_searchable(pool: IndexPool, tmp_path: Path) -> None:
    gate = threading.Event()
    pool.submit(gate.wait)  # occupy the single worker
    index = pool.get(tree(tmp_path / "a"))
    assert pool.get(tmp_path / "a" / ".") is index and index.state == "idle"
    pool.wait_s = 0.0
    with pytest.raises(IndexNotReady, match="still being built"):
        index.search("temperature conversion")
    assert index.state == "building"
    gate.set()
    index.start().result(timeout=120)
    assert index.state == "ready" and index.progress == (3, 3)
    hits = index.search("convert a temperature", k=2)
    assert len(hits) == 2 and hits[0].chunk.symbol.startswith("convert_")


def test_same_content_in_another_workspace_is_not_embedded_again(pool: IndexPool, tmp_path: Path) -> None:
    a, b = pool.get(tree(tmp_path / "a")), pool.get(tree(tmp_path / "b"))
    a.start().result(timeout=120)
    b.start().result(timeout=120)
    assert a._index is not None and b._index is not None
    assert a._index.totals.embedded == 3 and b._index.totals.embedded == 0 and b._index.totals.reused == 3


def test_edits_before_the_build_finishes_are_seen(pool: IndexPool, tmp_path: Path) -> None:
    root = tree(tmp_path / "a", files=1)
    index = pool.get(root)
    gate = threading.Event()
    pool.submit(gate.wait)
    index.start()
    index.notify_edits(["m0.py"])  # held until the index exists
    gate.set()
    index.start().result(timeout=120)
    (root / "m0.py").write_text("def parse_config_file(path):\n    return open(path).read()\n")
    index.notify_edits(["m0.py"])
    (hit,) = index.search("read the configuration", k=1)
    assert hit.chunk.symbol == "parse_config_file"


def test_failed_build_is_reported(tmp_path: Path) -> None:
    broken = IndexPool(tmp_path / "index", embedder=SentenceTransformerEmbedder(str(tmp_path / "no-such-model")))
    try:
        index = broken.get(tree(tmp_path / "a", files=1))
        with pytest.raises(IndexNotReady, match="could not be built"):
            index.search("anything")
        assert index.state == "failed" and index.error
    finally:
        broken.close()


def test_release_forgets_the_index(pool: IndexPool, tmp_path: Path) -> None:
    root = tree(tmp_path / "a", files=1)
    first = pool.get(root)
    pool.release(root)
    assert len(pool) == 0 and pool.get(root) is not first


def test_keeps_the_most_recently_used(tmp_path: Path, minilm: SentenceTransformerEmbedder) -> None:
    small = IndexPool(tmp_path / "index", embedder=minilm, max_indexes=2)
    try:
        roots = [tree(tmp_path / n, files=1) for n in "abc"]
        a, _ = small.get(roots[0]), small.get(roots[1])
        small.get(roots[0])  # a is now the most recent
        small.get(roots[2])
        assert len(small) == 2 and small.get(roots[0]) is a
    finally:
        small.close()


def test_close_stops_a_running_build_between_batches(tmp_path: Path, minilm: SentenceTransformerEmbedder) -> None:
    pool = IndexPool(tmp_path / "index", embedder=minilm)
    index = pool.get(tree(tmp_path / "big", files=200))  # 13 batches of 16 files
    started = threading.Event()
    original = index._on_progress

    def progress(done: int, total: int) -> None:
        started.set()
        original(done, total)

    index._on_progress = progress  # type: ignore[method-assign]
    future = index.start()
    assert started.wait(60)
    pool.close()
    future.result(timeout=60)
    assert index.state == "failed" and index.error == "the server is shutting down"
    assert index.progress[0] < 200
