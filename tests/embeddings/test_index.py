"""WorkspaceIndex with the real MiniLM embedder: content-hash reuse, incremental
edits, deletion, filters, persistence, freshness hooks."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import numpy as np
import pytest

from embeddings.embedder import SentenceTransformerEmbedder
from embeddings.index import WorkspaceIndex

os.environ.setdefault("HF_HUB_OFFLINE", "1")


class CountingEmbedder:
    """The real embedder, counting the texts it is asked to embed."""

    def __init__(self, inner: SentenceTransformerEmbedder) -> None:
        self.inner = inner
        self.texts: list[str] = []

    name = property(lambda self: self.inner.name)
    dim = property(lambda self: self.inner.dim)

    def embed(self, texts: list[str]) -> np.ndarray:
        self.texts += texts
        return self.inner.embed(texts)

    def count_tokens(self, text: str) -> int:
        return self.inner.count_tokens(text)


@pytest.fixture(scope="session")
def minilm() -> SentenceTransformerEmbedder:
    return SentenceTransformerEmbedder()  # the model itself is loaded once per process


@pytest.fixture
def embedder(minilm: SentenceTransformerEmbedder) -> CountingEmbedder:
    return CountingEmbedder(minilm)


GEO = '''"""Geometry helpers."""


def circle_area(radius):
    """Area of a circle from its radius."""
    return 3.14159 * radius * radius


def rectangle_perimeter(width, height):
    """Perimeter of a rectangle."""
    return 2 * (width + height)


def triangle_area(base, height):
    """Area of a triangle."""
    return base * height / 2
'''

NET = '''import time


def fetch_with_retry(url, attempts=3):
    """Download a URL, retrying with exponential backoff when the request fails."""
    for i in range(attempts):
        try:
            return http_get(url)
        except IOError:
            time.sleep(2 ** i)
    raise IOError(url)
'''

STRINGS = '''def slugify(title):
    """Turn a title into a lowercase url slug separated by dashes."""
    return "-".join(title.lower().split())
'''


def make_tree(root: Path) -> Path:
    (root / "src" / "shapes").mkdir(parents=True)
    (root / "src" / "shapes" / "geometry.py").write_text(GEO)
    (root / "src" / "net.py").write_text(NET)
    (root / "tools").mkdir()
    (root / "tools" / "text.py").write_text(STRINGS)
    return root


@pytest.fixture
def tree(tmp_path: Path) -> Path:
    return make_tree(tmp_path / "tree")


@pytest.fixture
def data_dir(tmp_path: Path) -> Path:
    return tmp_path / "data"


def paths_of(hits) -> list[str]:
    return [h.chunk.path for h in hits]


def test_unchanged_tree_embeds_nothing_the_second_time(tree, data_dir, embedder) -> None:
    first = WorkspaceIndex(tree, embedder=embedder, data_dir=data_dir)
    s1 = first.refresh()
    assert s1.files == 3 and s1.chunks == len(first) > 3 and s1.embedded == len(embedder.texts) > 0
    embedder.texts.clear()
    assert first.refresh().embedded == 0
    reopened = WorkspaceIndex(tree, embedder=embedder, data_dir=data_dir)  # from the manifest on disk
    s2 = reopened.refresh()
    assert (s2.embedded, s2.reused, len(reopened)) == (0, 0, len(first)) and embedder.texts == []


def test_a_second_workspace_with_the_same_files_reuses_every_embedding(tmp_path, tree, data_dir, embedder) -> None:
    a = WorkspaceIndex(tree, embedder=embedder, data_dir=data_dir)
    a.refresh()
    other = shutil.copytree(tree, tmp_path / "copy")
    embedder.texts.clear()
    b = WorkspaceIndex(other, embedder=embedder, data_dir=data_dir)
    s = b.refresh()
    assert s.embedded == 0 and s.reused == s.chunks == len(a) and embedder.texts == []
    assert b.root_hash == a.root_hash and b.merkle() == a.merkle()


def test_an_edit_reembeds_only_the_changed_chunk_and_search_sees_it(tree, data_dir, embedder) -> None:
    index = WorkspaceIndex(tree, embedder=embedder, data_dir=data_dir)
    index.refresh()
    before = {c.content_hash for c in index.chunks("src/shapes/geometry.py")}
    old_root = index.merkle()
    new = GEO.replace('''def triangle_area(base, height):
    """Area of a triangle."""
    return base * height / 2''', '''def hexagon_area(side):
    """Area of a regular hexagon from its side length."""
    return 2.598076 * side * side''')
    (tree / "src/shapes/geometry.py").write_text(new)
    embedder.texts.clear()
    stats = index.update_file("src/shapes/geometry.py", new.encode())
    after = {c.content_hash for c in index.chunks("src/shapes/geometry.py")}
    changed = after - before
    assert len(changed) >= 1 and stats.embedded == len(changed) == len(embedder.texts)
    assert stats.reused == len(after) - len(changed) and stats.reused >= 2
    assert "hexagon_area" in embedder.texts[0]
    hit = index.search("area of a regular hexagon", k=1)[0]
    assert hit.chunk.path == "src/shapes/geometry.py" and "hexagon_area" in hit.chunk.text
    assert not any("triangle_area" in c.text for c in index.chunks())
    merkle = index.merkle()  # only the edited file's ancestors changed
    assert {d for d in merkle if merkle[d] != old_root[d]} == {"", "src", "src/shapes"}


def test_deleting_a_file_removes_its_chunks(tree, data_dir, embedder) -> None:
    index = WorkspaceIndex(tree, embedder=embedder, data_dir=data_dir)
    index.refresh()
    n, gone = len(index), len(index.chunks("src/net.py"))
    (tree / "src" / "net.py").unlink()
    stats = index.update_file("src/net.py", None)
    assert stats.removed_files == 1 and index.chunks("src/net.py") == [] and len(index) == n - gone
    for mode in ("hybrid", "vector", "bm25"):
        assert "src/net.py" not in paths_of(index.search("retry a download with backoff", k=10, mode=mode))
    (tree / "tools" / "text.py").unlink()
    assert index.refresh().removed_files == 1 and index.files == ["src/shapes/geometry.py"]


def test_empty_index_and_empty_query_return_nothing(tmp_path, data_dir, embedder) -> None:
    empty = tmp_path / "empty"
    empty.mkdir()
    index = WorkspaceIndex(empty, embedder=embedder, data_dir=data_dir)
    assert index.refresh().chunks == 0
    for mode in ("hybrid", "vector", "bm25"):
        assert index.search("anything at all", mode=mode) == []
        assert index.search("", mode=mode) == []
    with pytest.raises(ValueError):
        index.search("x", mode="fuzzy")  # type: ignore[arg-type]


def test_hybrid_finds_by_meaning_and_by_name(tree, data_dir, embedder) -> None:
    index = WorkspaceIndex(tree, embedder=embedder, data_dir=data_dir)
    index.refresh()
    assert index.search("retry a failed download after waiting longer each time", k=1)[0].chunk.symbol == "fetch_with_retry"
    assert index.search("slugify", k=1)[0].chunk.symbol == "slugify"
    assert index.search("zzzqqq unmatched", mode="bm25") == []


def test_path_glob_restricts_results(tree, data_dir, embedder) -> None:
    index = WorkspaceIndex(tree, embedder=embedder, data_dir=data_dir)
    index.refresh()
    for glob in ("tools/*", "tools/", "tools/**/*.py", "text.py"):
        for mode in ("hybrid", "vector", "bm25"):
            hits = index.search("area of a circle slug", k=10, path_glob=glob, mode=mode)
            assert hits and set(paths_of(hits)) == {"tools/text.py"}, (glob, mode)
    assert index.search("area", path_glob="nothing/*") == []
    assert set(paths_of(index.search("area", k=50, path_glob="*.py"))) == set(index.files)


def test_persistence_round_trip(tree, data_dir, embedder) -> None:
    index = WorkspaceIndex(tree, embedder=embedder, data_dir=data_dir)
    index.refresh()
    expected = [(h.chunk, round(h.score, 5)) for h in index.search("perimeter of a rectangle", k=5)]
    embedder.texts.clear()
    loaded = WorkspaceIndex(tree, embedder=embedder, data_dir=data_dir)
    assert loaded.chunks() == index.chunks() and loaded.root_hash == index.root_hash
    assert [(h.chunk, round(h.score, 5)) for h in loaded.search("perimeter of a rectangle", k=5)] == expected
    assert embedder.texts == ["perimeter of a rectangle"]  # only the query was embedded


def test_notified_edits_and_tree_changes_apply_at_the_next_search(tree, data_dir, embedder) -> None:
    index = WorkspaceIndex(tree, embedder=embedder, data_dir=data_dir)
    index.refresh()
    (tree / "tools" / "text.py").write_text(STRINGS + '''

def count_vowels(word):
    """Number of vowels in a word."""
    return sum(ch in "aeiou" for ch in word)
''')
    index.notify_edits(["tools/text.py"])
    assert index.search("how many vowels are in a word", k=1)[0].chunk.symbol == "count_vowels"
    (tree / "src" / "made_by_a_command.py").write_text("def parse_ini_config(path):\n    return {}\n")
    index.notify_edits([], tree_changed=True)  # e.g. after run_command
    assert index.search("parse the ini configuration file", k=1)[0].chunk.path == "src/made_by_a_command.py"


def test_prepare_builds_the_ann_graph_before_the_first_search(tree, data_dir, embedder) -> None:
    idx = WorkspaceIndex(tree, embedder=embedder, data_dir=data_dir, ann_threshold=2)
    idx.refresh(save=False)
    assert idx._vectors is not None and not idx._vectors.uses_ann
    idx.prepare()
    assert idx._vectors.uses_ann
    exact = idx._vectors.search_exact(idx.embed_query("area of a circle"), 3)
    assert [c for c, _ in idx._vectors.search(idx.embed_query("area of a circle"), 3)] == [c for c, _ in exact]


def _ranked(idx: WorkspaceIndex, query: str) -> list[tuple[str, int]]:
    return [(h.chunk.path, h.chunk.start_line) for h in idx.search(query, k=5, mode="vector")]


def test_hnsw_graph_is_saved_and_reattached_without_a_rebuild(tree, data_dir, embedder) -> None:
    idx = WorkspaceIndex(tree, embedder=embedder, data_dir=data_dir, ann_threshold=2)
    idx.refresh()  # builds the graph, then saves it beside the manifest
    assert idx._vectors is not None and idx._vectors.uses_ann
    idx._vectors.rebuild_fraction = 100.0  # keep this graph through the edits (a big index would)
    (tree / "shapes.py").write_text("def hexagon_area(side):\n    return 2.598 * side * side\n")  # a delta row
    (tree / "src" / "net.py").unlink()  # dead graph rows
    idx.notify_edits(["shapes.py", "src/net.py"])
    before = _ranked(idx, "retry a request")
    with_edit = _ranked(idx, "area of a hexagon")
    assert idx._vectors._ann_dead > 0 and len(idx._vectors._ids) > idx._vectors._ann_rows
    idx.save()
    graphs = list(idx.manifest_path.parent.glob("hnsw-*.faiss"))
    assert len(graphs) == 1

    again = WorkspaceIndex(tree, embedder=embedder, data_dir=data_dir, ann_threshold=2)
    assert again._vectors is not None and again._vectors.uses_ann  # attached at load, not built
    assert _ranked(again, "retry a request") == before
    assert _ranked(again, "area of a hexagon") == with_edit
    assert with_edit[0][0] == "shapes.py"


def test_unreadable_graph_falls_back_to_a_rebuild(tree, data_dir, embedder) -> None:
    idx = WorkspaceIndex(tree, embedder=embedder, data_dir=data_dir, ann_threshold=2)
    idx.refresh()
    want = _ranked(idx, "area of a circle")
    (graph,) = idx.manifest_path.parent.glob("hnsw-*.faiss")
    graph.write_bytes(b"not a faiss index")
    again = WorkspaceIndex(tree, embedder=embedder, data_dir=data_dir, ann_threshold=2)
    assert again._vectors is not None and not again._vectors.uses_ann
    assert _ranked(again, "area of a circle") == want


def test_bm25_matches_words_of_the_path(tree, data_dir, embedder) -> None:
    idx = WorkspaceIndex(tree, embedder=embedder, data_dir=data_dir)
    idx.refresh()
    assert all("geometry" not in c.text for c in idx.chunks("src/shapes/geometry.py"))
    hits = idx.search("geometry", k=3, mode="bm25")
    assert hits and all(h.chunk.path == "src/shapes/geometry.py" for h in hits)


SHAPE_TESTS = '''from shapes.geometry import rectangle_perimeter


def test_rect():
    assert rectangle_perimeter(2, 3) == 10


def test_rect_square():
    assert rectangle_perimeter(1, 1) == 4


def test_rect_zero():
    assert rectangle_perimeter(0, 0) == 0
'''


def test_a_failing_test_leads_hybrid_to_the_function_it_calls(tree, data_dir, embedder) -> None:
    (tree / "tests").mkdir()
    (tree / "tests" / "test_shapes.py").write_text(SHAPE_TESTS)
    idx = WorkspaceIndex(tree, embedder=embedder, data_dir=data_dir)
    idx.refresh()
    query = "tests/test_shapes.py test_rect_square\nAssertionError: assert 5 == 4"  # names the test only
    linked = {idx.chunk(cid).symbol: s for cid, s in idx.linked(query).items()}
    assert linked == {"rectangle_perimeter": 1.0}

    def rank(index: WorkspaceIndex) -> int:
        return [h.chunk.symbol for h in index.search(query, k=10)].index("rectangle_perimeter")

    with_links = rank(idx)
    idx.linked = lambda *a, **k: {}  # the same search without the links
    assert with_links < rank(idx)
    del idx.linked
    # a prose question follows no links; a glob that excludes the target drops the link too
    assert idx.linked("where is the perimeter of a rectangle computed") == {}
    assert idx.linked(query, set()) == {}
    # an edit that removes the definition removes the link
    (tree / "src" / "shapes" / "geometry.py").write_text(GEO.replace("rectangle_perimeter", "rect_perim"))
    idx.notify_edits(["src/shapes/geometry.py"])
    idx.search("anything", k=1)
    assert idx.linked(query) == {}
