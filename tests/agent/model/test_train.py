"""A tiny training run lowers the loss, writes metrics and a loadable checkpoint, and is deterministic."""

from __future__ import annotations

import io
import json
import math
from pathlib import Path

import pytest
import torch

from agent.model.checkpoint import load_checkpoint
from agent.model.corpus import Corpus
from agent.model.tokenizer import Tokenizer
from agent.model.train import TokenBatches, TrainConfig, lr_at, train


def test_tiny_run_lowers_loss(small_corpus: Corpus, tokenizer: Tokenizer, tmp_path: Path) -> None:
    tc = TrainConfig(preset="tiny", steps=30, seq_len=64, batch=8, seed=0, lr=6e-3, out=tmp_path, log_every=10)
    result = train(tc, corpus=small_corpus, tokenizer=tokenizer, log=io.StringIO())
    losses = [loss for _, loss in result.losses]
    assert sum(losses[-5:]) / 5 < sum(losses[:5]) / 5 - 0.5  # nats
    assert result.val_loss is not None and result.val_loss < math.log(tokenizer.vocab_size) - 0.5
    records = [json.loads(line) for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in records] == list(range(1, 31))
    assert {"loss", "aux_loss", "balance", "lr", "tokens_per_s"} <= set(records[0])
    assert records[-1]["val_loss"] is not None and result.val_loss is not None
    model, _ = load_checkpoint(tmp_path)
    batch = next(iter(TokenBatches(small_corpus, "val", tokenizer, 2, 32, shuffle=False)))
    with torch.no_grad():
        torch.testing.assert_close(model(batch).logits, result.model.eval()(batch).logits, rtol=0, atol=0)


def test_deterministic_with_seed(small_corpus: Corpus, tokenizer: Tokenizer, tmp_path: Path) -> None:
    runs = []
    for name in ("a", "b"):
        tc = TrainConfig(steps=3, seq_len=32, batch=4, seed=5, out=tmp_path / name)
        runs.append(train(tc, corpus=small_corpus, tokenizer=tokenizer, log=io.StringIO(), save=False))
    assert runs[0].losses == runs[1].losses


def test_batches_are_bounded_and_seeded(small_corpus: Corpus, tokenizer: Tokenizer) -> None:
    a = iter(TokenBatches(small_corpus, "train", tokenizer, 4, 16, seed=1, pool=32))
    b = iter(TokenBatches(small_corpus, "train", tokenizer, 4, 16, seed=1, pool=32))
    for _ in range(5):
        x, y = next(a), next(b)
        assert x.shape == (4, 17) and torch.equal(x, y)
        assert int(x.max()) < tokenizer.vocab_size


def test_lr_schedule() -> None:
    tc = TrainConfig(steps=100, lr=1.0, warmup=10, min_lr_frac=0.1)
    assert lr_at(0, tc) == 0.1 and lr_at(9, tc) == 1.0
    assert lr_at(99, tc) < 0.11 and all(lr_at(s, tc) >= lr_at(s + 1, tc) for s in range(10, 99))


def test_a_copy_head_run_saves_the_tokenizers_twins_and_the_pointer_distance(small_corpus: Corpus, tokenizer: Tokenizer,
                                                                             tmp_path: Path) -> None:
    """``flywheel model train --copy-head --copy-min-distance 3 --copy-successor-keys
    --copy-context-only``: the checkpoint carries all four."""
    from agent.model.copy_head import twin_ids

    tc = TrainConfig(steps=2, seq_len=32, batch=2, seed=0, out=tmp_path,
                     model_overrides={"copy_head": True, "copy_min_distance": 3, "copy_successor_keys": True,
                                      "copy_context_only": True})
    train(tc, corpus=small_corpus, tokenizer=tokenizer, log=io.StringIO())
    model, tok = load_checkpoint(tmp_path)
    assert model.cfg.copy_head and model.cfg.copy_min_distance == 3 and model.cfg.copy_successor_keys
    assert model.cfg.copy_context_only
    assert model.copy is not None and torch.equal(model.copy.twin, twin_ids(tok))
    assert int((model.copy.twin != torch.arange(tok.vocab_size)).sum()) > 0


def test_unknown_corpus_sources_are_refused_before_anything_is_written(tmp_path: Path) -> None:
    out = tmp_path / "model"
    with pytest.raises(ValueError, match="corpus sources pypi: choose from stdlib, site-packages"):
        train(TrainConfig(preset="tiny", steps=1, out=out, corpus_sources=("stdlib", "pypi")), log=io.StringIO())
    assert not out.exists()
