"""Copy drills: every span is exactly a path the drill asked for; training runs and is measured."""

from __future__ import annotations

import random

import torch

from agent.model.config import ModelConfig
from agent.model.copy_drills import copy_accuracy, drill, train_on_drills, window
from agent.model.transformer import MoETransformer
from agent.parser import StreamParser
from tests.agent.model.test_engine import tiny_tokenizer


def test_a_drill_is_a_request_and_a_well_formed_call_on_its_path() -> None:
    pre, path, post = drill(random.Random(3))
    assert path in pre.split("<|assistant|>")[0]  # named in the request
    body = (pre + path + post).split("<|assistant|>\n", 1)[1].removesuffix("<|end|>\n")
    calls = [e for e in [*StreamParser().feed(body)] if type(e).__name__ == "ParsedCall"]
    assert len(calls) == 1 and calls[0].name == "read_file" and calls[0].params == (("path", path),)


def test_window_spans_are_the_paths_ids() -> None:
    tok = tiny_tokenizer()
    rng = random.Random(0)
    ids, spans = window(rng, tok, 256)
    assert len(ids) <= 256 and len(spans) >= 2
    text = tok.decode(ids)
    for s, e in spans:
        piece = tok.decode(ids[s:e])
        assert f'<param name="path">{piece}</param>' in text


def test_training_on_drills_returns_a_measured_curve() -> None:
    tok = tiny_tokenizer()
    torch.manual_seed(0)
    model = MoETransformer(ModelConfig.preset("tiny", vocab_size=tok.vocab_size, max_seq_len=512))
    before = [p.detach().clone() for p in model.parameters()]
    curve = train_on_drills(model, tok, steps=3, batch=2, seq_len=128, eval_every=2, eval_windows=2)
    assert [c["step"] for c in curve] == [0, 2, 3]
    assert all(0.0 <= c["copy_accuracy"] <= 1.0 for c in curve)
    assert any(not torch.equal(a, b) for a, b in zip(before, model.parameters(), strict=True))
    assert copy_accuracy(model, [window(random.Random(1), tok, 128)]) <= 1.0
