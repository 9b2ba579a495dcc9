"""benchmarks/copy_exit_probe.py: where a copied span ends, what its source continues with, and where the
exit is, on hand-made demonstrations."""

from __future__ import annotations

import sys
from pathlib import Path

import torch

from agent.model.config import ModelConfig
from agent.model.transformer import MoETransformer
from agent.parser import encode_call
from rl.train.copy_tokens import format_token_ids, user_marker_id
from rl.types import Segment
from tests.agent.model.test_engine import tiny_tokenizer

ROOT = Path(__file__).resolve().parents[2]


def _probe():  # type: ignore[no-untyped-def]
    sys.path.insert(0, str(ROOT / "benchmarks"))
    import copy_exit_probe

    return copy_exit_probe


def test_an_exit_knows_what_its_source_continued_with() -> None:
    probe = _probe()
    # context "5 6 7 8 9", then the policy copies "6 7 8" and writes 4: the source continued with 9
    ids = [5, 6, 7, 8, 9, 1, 6, 7, 8, 4]
    sampled = [False] * 6 + [True] * 4
    copies = [False] * 8 + [True, False]  # only "8" ends a trigram of the context
    assert probe.exit_positions(ids, sampled, copies) == [(9, 9)]
    # the same exit with no earlier occurrence of the span: no continuation to compare
    assert probe.exit_positions([1, 2, 3, 6, 7, 8, 4], [False] * 3 + [True] * 4,
                                [False] * 5 + [True, False]) == [(6, None)]


def test_exits_are_grouped_by_the_parameter_they_end() -> None:
    probe = _probe()
    tok = tiny_tokenizer()
    torch.manual_seed(0)
    model = MoETransformer(ModelConfig.preset("tiny", vocab_size=tok.vocab_size, max_seq_len=512)).eval()
    system = tok.encode("system") + tok.encode("<|user|>")
    request = tok.encode("Rename `alpha_beta_gamma` to `delta` please.")
    out = "Searching for `alpha_beta_gamma` first.\n" + encode_call("grep", {"pattern": "alpha_beta_gamma"})
    segs = [Segment(system + request, sampled=False), Segment(tok.encode(out), sampled=True)]
    probs = probe.exit_probs(model, tok, [segs], user_marker_id(tok), format_token_ids(tok))
    assert "grep/pattern" in probs and "prose" in probs  # the name ends once in prose, once in the pattern
    for pairs in probs.values():
        for p_exit, p_cont in pairs:
            assert 0.0 <= p_exit <= 1.0 and (p_cont is None or 0.0 <= p_cont <= 1.0)
    summary = probe.summarise(probs)
    assert summary["all"]["n"] == sum(len(v) for v in probs.values())
