"""Vector and BM25 components without a model: ANN recall, add/remove, tokenising."""

from __future__ import annotations

import numpy as np

from embeddings.bm25 import BM25Index, tokenize
from embeddings.merkle import dir_hashes
from embeddings.vectors import VectorIndex, recall_at_k


def clustered(n: int, dim: int, seed: int, clusters: int = 50) -> np.ndarray:
    """Unit vectors around random centres, like real embeddings (uniform random
    vectors in high dimension have no near neighbours worth finding)."""
    rng = np.random.default_rng(seed)
    centres = rng.standard_normal((clusters, dim)).astype(np.float32)
    v = centres[rng.integers(0, clusters, n)] + 0.6 * rng.standard_normal((n, dim)).astype(np.float32)
    return (v / np.linalg.norm(v, axis=1, keepdims=True)).astype(np.float32)


def test_hnsw_recall_at_10_against_exact_search() -> None:
    vecs = clustered(6000, 64, seed=0)
    index = VectorIndex(64, ann_threshold=1000)
    index.add(range(6000), vecs)
    queries = clustered(100, 64, seed=1)
    approx = [[i for i, _ in index.search(q, 10)] for q in queries]
    assert index.uses_ann
    exact = [[i for i, _ in index.search_exact(q, 10)] for q in queries]
    assert recall_at_k(approx, exact, 10) >= 0.95


def test_small_index_is_exact_and_scores_are_cosines() -> None:
    vecs = clustered(200, 32, seed=2)
    index = VectorIndex(32, ann_threshold=1000)
    index.add(range(100, 300), vecs)
    hits = index.search(vecs[5], 3)
    assert not index.uses_ann and hits[0][0] == 105 and abs(hits[0][1] - 1.0) < 1e-5
    assert [s for _, s in hits] == sorted((s for _, s in hits), reverse=True)


def test_removed_rows_never_come_back_and_added_rows_are_found_with_ann() -> None:
    vecs = clustered(3000, 32, seed=3)
    index = VectorIndex(32, ann_threshold=1000, rebuild_fraction=0.5)
    index.add(range(3000), vecs)
    index.build()
    index.remove(range(0, 3000, 2))
    index.add([10_001], vecs[1:2] * -1.0)  # in the delta, not in the graph
    for q in vecs[:20]:
        assert all(i % 2 == 1 for i, _ in index.search(q, 10))
    assert index.search(-vecs[1], 1)[0][0] == 10_001
    assert len(index) == 1501
    only = np.array([7, 9, 10_001])
    assert {i for i, _ in index.search(vecs[8], 10, allowed=only)} == {7, 9, 10_001}


def test_tokenizer_splits_identifiers_but_keeps_them_whole() -> None:
    toks = tokenize("def parse_HTTPRequest(self, maxRetries=3): return getValue()")
    for t in ("parse_httprequest", "parse", "http", "request", "maxretries", "max", "retries", "getvalue", "value"):
        assert t in toks
    assert "the" not in tokenize("the parser")


def test_bm25_ranks_and_forgets() -> None:
    b = BM25Index()
    b.add(1, "def load_config(path): read the yaml config file")
    b.add(2, "def save_image(img): write png bytes")
    b.add(3, "class ConfigError(Exception): bad config")
    assert [i for i, _ in b.search("config", 5)][:2] in ([1, 3], [3, 1])
    b.remove(1)
    assert [i for i, _ in b.search("yaml", 5)] == []
    assert b.search("", 5) == [] and BM25Index().search("x", 5) == []


def test_merkle_changes_only_ancestors() -> None:
    files = {"a/b/c.py": "1", "a/d.py": "2", "e.py": "3"}
    before = dir_hashes(files)
    after = dir_hashes({**files, "a/d.py": "9"})
    assert set(before) == {"", "a", "a/b"}
    assert {d for d in before if before[d] != after[d]} == {"", "a"}


def test_bm25_delta_scores_equal_a_fresh_build() -> None:
    texts = ["def load_config(path): read the yaml config", "def save_image(img): png bytes",
             "class ConfigError(Exception): bad config file", "http client request retry config"]
    built = BM25Index(min_rebuild=0, rebuild_fraction=0.0)
    delta = BM25Index(min_rebuild=10**9)
    for i, t in enumerate(texts * 5):
        built.add(i, t)
        delta.add(i, t)
    delta.add(100, "unrelated words")
    delta.remove(100)
    got_built = dict(built.search("yaml config file", 20))
    delta._build()  # the first build, then changes go to the delta
    delta.remove(0)
    delta.add(0, texts[0])
    got_delta = dict(delta.search("yaml config file", 20))
    assert delta._delta == {0}
    assert got_built.keys() == got_delta.keys()
    assert all(abs(got_built[i] - got_delta[i]) < 1e-4 for i in got_built)
