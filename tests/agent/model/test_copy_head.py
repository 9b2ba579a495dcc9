"""The pointer-sentinel copy head (agent.model.copy_head): a normalised mixture, a near-identity
when added to a trained model, the same function through the KV cache (prefix copies included),
checkpoints that keep it, and what it is for: copying a span whose place in the context varies,
which the same small model without it does not learn in the same steps."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from agent.model.checkpoint import load_checkpoint, save_checkpoint
from agent.model.config import ModelConfig
from agent.model.transformer import KVCache, MoETransformer
from agent.prompt import COMPACT_PROFILE
from tests.agent.model.test_engine import tiny_tokenizer

CFG = ModelConfig.preset("tiny", vocab_size=97, max_seq_len=64, copy_head=True)


def _model(seed: int = 0, cfg: ModelConfig = CFG) -> MoETransformer:
    torch.manual_seed(seed)
    return MoETransformer(cfg).eval()


def test_the_mixture_is_a_normalised_distribution() -> None:
    ids = torch.randint(0, CFG.vocab_size, (3, 40))
    with torch.no_grad():
        logp = _model()(ids).logits
    torch.testing.assert_close(logp.exp().sum(-1), torch.ones(3, 40), rtol=0, atol=1e-5)
    lp = _model().logprobs(ids)
    assert torch.isfinite(lp).all() and (lp <= 0).all()


def test_adding_a_head_keeps_the_weights_and_most_of_the_lm_distribution() -> None:
    from dataclasses import replace

    plain = _model(cfg=replace(CFG, copy_head=False))
    with_head = plain.with_copy_head()
    assert with_head.cfg.copy_head and not plain.cfg.copy_head
    for k, v in plain.state_dict().items():
        assert torch.equal(with_head.state_dict()[k], v)
    ids = torch.randint(0, CFG.vocab_size, (2, CFG.max_seq_len))
    with torch.no_grad():
        lm = torch.log_softmax(plain(ids).logits, -1)
        mixed = with_head.eval()(ids).logits
    # at init the sentinel holds at least half the mass at every position, up to max_seq_len
    assert bool((mixed >= lm + torch.log(torch.tensor(0.5)) - 1e-5).all())
    with pytest.raises(ValueError, match="already has a copy head"):
        with_head.with_copy_head()


def test_prefix_copies_and_decoding_through_the_cache_equal_the_plain_forward() -> None:
    model = _model()
    with torch.no_grad():  # a head that points somewhere: random, not the near-zero init
        for p in model.copy.parameters():  # type: ignore[union-attr]
            p.normal_(0, 0.5)
        seq = torch.randint(0, CFG.vocab_size, (1, 30))
        reference = model(seq).logits[0]
        cache = KVCache(CFG, max_slots=3, max_len=64)
        model(seq[:, :12], cache=cache, slots=torch.tensor([2]))
        cache.keep_prefix(0, 12, source=2)  # what the engine's prefix cache does for a shared prompt
        got = [model(seq[:, 12:20], cache=cache, slots=torch.tensor([0])).logits[0]]
        for i in range(20, 30):
            got.append(model(seq[:, i:i + 1], cache=cache, slots=torch.tensor([0])).logits[0])
    # a logic error (a wrong successor, a missed prefix copy) is O(1); rounding in the sharp head ~1e-5
    torch.testing.assert_close(torch.cat(got), reference[12:], rtol=0, atol=1e-4)


def test_a_checkpoint_keeps_the_head(tmp_path: Path) -> None:
    model, tok = _model(), tiny_tokenizer()
    model = MoETransformer(ModelConfig.preset("tiny", vocab_size=tok.vocab_size, copy_head=True)).eval()
    save_checkpoint(tmp_path / "c", model, tok, step=1, profile=COMPACT_PROFILE)
    loaded, _ = load_checkpoint(tmp_path / "c")
    assert loaded.cfg.copy_head
    ids = torch.randint(0, tok.vocab_size, (1, 16))
    with torch.no_grad():
        torch.testing.assert_close(loaded(ids).logits, model(ids).logits)


def _copy_rows(n: int, g: torch.Generator, span: int = 8) -> torch.Tensor:
    """``pad, noise, SEP, x, noise, SEP, x``: the second ``x`` is predictable only by finding the first
    (the noise lengths vary, so no fixed offset does it)."""
    rows = []
    for _ in range(n):
        a, b = (int(v) for v in torch.randint(0, 16, (2,), generator=g))
        x = torch.randint(2, 64, (span,), generator=g)
        rows.append(torch.cat([torch.zeros(32 - a - b, dtype=torch.long), torch.randint(2, 64, (a,), generator=g),
                               torch.tensor([1]), x, torch.randint(2, 64, (b,), generator=g), torch.tensor([1]), x]))
    return torch.stack(rows)


def _copy_accuracy_after_training(copy_head: bool, steps: int = 200, span: int = 8) -> float:
    torch.manual_seed(0)
    model = MoETransformer(ModelConfig.preset("tiny", vocab_size=64, max_seq_len=64, copy_head=copy_head))
    opt = torch.optim.AdamW(model.parameters(), lr=3e-3)
    g = torch.Generator().manual_seed(0)
    for _ in range(steps):
        ids = _copy_rows(32, g, span)
        out = model(ids)
        lp = torch.log_softmax(out.logits[:, :-1], -1).gather(-1, ids[:, 1:, None]).squeeze(-1)
        loss = -lp[:, -span:].mean() + out.aux_loss
        opt.zero_grad()
        loss.backward()
        opt.step()
    with torch.no_grad():
        ids = _copy_rows(256, g, span)
        pred = model.eval()(ids).logits[:, -span - 1:-1].argmax(-1)
    return float((pred == ids[:, -span:]).float().mean())


@pytest.mark.timeout(300)
def test_the_head_learns_to_copy_a_span_that_the_plain_model_does_not_in_the_same_steps() -> None:
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        with_head, plain = _copy_accuracy_after_training(True), _copy_accuracy_after_training(False)
    finally:
        torch.set_num_threads(threads)
    assert with_head >= 0.8, with_head
    assert plain <= 0.3, plain  # chance is 1/62: the task is not solvable without finding the span
