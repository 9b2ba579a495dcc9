"""Copy tokens: sampled tokens that repeat a trigram of the context (not of the system prompt,
not tool-call syntax), and the SFT loss that weighs them."""

from __future__ import annotations

import pytest
import torch

from rl.train.copy_tokens import copy_flags, exit_flags, format_token_ids, user_marker_id
from rl.train.sft import sft_loss
from rl.types import Segment
from tests.agent.model.test_engine import tiny_tokenizer
from tests.rl.train.helpers import tiny_model

U = 9  # the <|user|> id in these hand-made examples


def _example() -> list[Segment]:
    system = [1, 2, 3, 4]
    request = [20, 21, 22, 23, 2, 3, 4]  # ends with a trigram the system prompt has
    return [Segment(system + [U] + request, sampled=False),
            Segment([30, 20, 21, 22, 23, 31, 2, 3, 4], sampled=True, logprobs=[0.0] * 9),
            Segment([40, 41, 42], sampled=False),
            Segment([40, 41, 42, 30, 20, 21], sampled=True, logprobs=[0.0] * 6)]


FIRST = 12  # the first sampled token's position
SECOND = FIRST + 9 + 3


def test_a_copy_is_a_sampled_token_ending_a_context_trigram() -> None:
    flags = copy_flags(_example(), U)
    flat = [t for s in _example() for t in s.token_ids]
    assert len(flags) == len(flat)
    flagged = [(i, flat[i]) for i, f in enumerate(flags) if f]
    # 22 and 23 end trigrams of the request (20 and 21 start the span: their trigrams straddle it);
    # the final "2 3 4" is also in the system prompt: syntax the model sees there, not a copy.
    # The second output copies "42" from the tool result and "21" from the model's own first output.
    assert flagged == [(FIRST + 3, 22), (FIRST + 4, 23), (SECOND + 2, 42), (SECOND + 5, 21)]
    assert not any(flags[:FIRST])  # consumed tokens are never copies


def test_format_tokens_are_never_copies() -> None:
    flags = copy_flags(_example(), U, frozenset({22, 42}))
    flat = [t for s in _example() for t in s.token_ids]
    assert [flat[i] for i, f in enumerate(flags) if f] == [23, 21]
    tok = tiny_tokenizer()
    fmt = format_token_ids(tok)
    assert tok.end_id in fmt and set(tok.encode("\n")) <= fmt
    assert set(tok.encode('<param name="path">')) <= fmt
    assert isinstance(user_marker_id(tok), int)


def test_the_loss_weighs_copy_tokens_and_counts_them() -> None:
    model = tiny_model()
    ex = _example()
    stats: dict[str, float] = {}
    with torch.no_grad():
        plain = float(sft_loss(model, [ex], 0))
        same = float(sft_loss(model, [ex], 0, user_id=U, copy_weight=1.0))
        weighted = float(sft_loss(model, [ex], 0, user_id=U, copy_weight=5.0, copy_stats=stats))
    assert same == pytest.approx(plain)
    assert stats["copy_tokens"] == 4 and 0 <= stats["copy_correct"] <= 4
    # by hand: the weighted mean of the sampled tokens' losses, copy tokens x5
    ids = torch.tensor([[t for s in ex for t in s.token_ids]])
    with torch.no_grad():
        out = model(ids)
        nll = -torch.log_softmax(out.logits[0, :-1], -1).gather(-1, ids[0, 1:, None])[:, 0]
    mask = torch.tensor([s.sampled for s in ex for _ in s.token_ids][1:], dtype=torch.float32)
    copies = torch.tensor(copy_flags(ex, U)[1:], dtype=torch.float32)
    w = mask + 4.0 * copies
    assert weighted == pytest.approx(float((nll * w).sum() / w.sum() + out.aux_loss), rel=1e-5)
    assert stats["copy_nll"] == pytest.approx(float((nll * copies).sum()), rel=1e-5)


def test_an_exit_is_the_sampled_non_copy_right_after_a_copy() -> None:
    ex = _example()
    flags = copy_flags(ex, U)
    exits = exit_flags(ex, flags)
    flat = [t for s in ex for t in s.token_ids]
    # "31" ends the first output's copied "22 23"; "30" follows the copied "42"; the copy "21" is last
    assert [(i, flat[i]) for i, e in enumerate(exits) if e] == [(FIRST + 5, 31), (SECOND + 3, 30)]
    with pytest.raises(ValueError, match="flags for an example"):
        exit_flags(ex, flags[:-1])


def test_the_loss_weighs_exits_and_counts_them() -> None:
    model = tiny_model()
    ex = _example()
    stats: dict[str, float] = {}
    with torch.no_grad():
        weighted = float(sft_loss(model, [ex], 0, user_id=U, copy_weight=5.0, exit_weight=3.0, copy_stats=stats))
    assert stats["exit_tokens"] == 2 and stats["copy_tokens"] == 4
    ids = torch.tensor([[t for s in ex for t in s.token_ids]])
    with torch.no_grad():
        out = model(ids)
        nll = -torch.log_softmax(out.logits[0, :-1], -1).gather(-1, ids[0, 1:, None])[:, 0]
    mask = torch.tensor([s.sampled for s in ex for _ in s.token_ids][1:], dtype=torch.float32)
    flags = copy_flags(ex, U)
    copies = torch.tensor(flags[1:], dtype=torch.float32)
    exits = torch.tensor(exit_flags(ex, flags)[1:], dtype=torch.float32)
    w = mask + 4.0 * copies + 2.0 * exits
    assert weighted == pytest.approx(float((nll * w).sum() / w.sum() + out.aux_loss), rel=1e-5)
    assert stats["exit_nll"] == pytest.approx(float((nll * exits).sum()), rel=1e-5)
