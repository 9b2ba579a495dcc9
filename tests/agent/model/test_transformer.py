"""The cached forward (prefill + batched decode over slots of different lengths) equals the plain one,
with and without the copy head (``cfg.copy_head``: its keys and token ids live in the cache too)."""

from __future__ import annotations

import pytest
import torch

from agent.model.config import ModelConfig
from agent.model.numerics import KernelsUnavailable
from agent.model.slot_rows import SlotRows
from agent.model.transformer import KVCache, MoETransformer

CFG = ModelConfig.preset("tiny", vocab_size=211, shared_expert=True, router_bias_rate=0.01, max_seq_len=96)


@pytest.fixture(autouse=True)
def _no_grad() -> object:
    with torch.no_grad():  # inference-only tests
        yield


@pytest.fixture(scope="module", params=[False, True], ids=["lm-head", "copy-head"])
def model(request: pytest.FixtureRequest) -> MoETransformer:
    from dataclasses import replace

    torch.manual_seed(0)
    # the copy head with a pointer distance > 1: its cached mask must match the plain one
    m = MoETransformer(replace(CFG, copy_head=request.param, copy_min_distance=3 if request.param else 1)).eval()
    with torch.no_grad():  # a non-trivial router bias: selection must be the same in both paths
        for block in m.blocks:
            block.moe.router_bias.normal_(0, 0.05)
    return m


def test_no_cache_forward_shapes_and_causality(model: MoETransformer) -> None:
    ids = torch.randint(0, model.cfg.vocab_size, (2, 12))
    out = model(ids)
    assert out.logits.shape == (2, 12, model.cfg.vocab_size) and out.logits.dtype == torch.float32
    assert out.expert_counts.shape == (model.cfg.n_layers, model.cfg.n_experts)
    assert int(out.expert_counts.sum()) == model.cfg.n_layers * 2 * 12 * model.cfg.top_k
    changed = ids.clone()
    changed[:, 8:] = (changed[:, 8:] + 1) % model.cfg.vocab_size  # the future must not leak into the past
    torch.testing.assert_close(model(changed).logits[:, :8], out.logits[:, :8], rtol=0, atol=1e-6)


@pytest.mark.parametrize(("slot_ids", "spread"), [
    ([5, 0, 3], 2.0),  # a view of slots 0..5 with spare rows 1, 2, 4
    ([1, 2, 0], 2.0),  # a view of 0..2, rows permuted
    ([3, 4, 5], 2.0),  # a view of 3..5 in order: no spreading
    ([5, 0, 3], 0.0),  # always gathered
], ids=["view-spare-rows", "view-permuted", "view-in-order", "gather"])
def test_cached_prefill_and_decode_equal_no_cache(model: MoETransformer, slot_ids: list[int], spread: float,
                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(model, "slot_view_spread", spread)
    viewed: list[bool] = []  # per cache read: did it share the cache's storage (a view) or copy (a gather)?
    take = SlotRows.take

    def spy(self: SlotRows, per_slot: torch.Tensor) -> torch.Tensor:
        out = take(self, per_slot)
        viewed.append(out.untyped_storage().data_ptr() == per_slot.untyped_storage().data_ptr())
        return out

    monkeypatch.setattr(SlotRows, "take", spy)
    torch.manual_seed(1)
    total = 40
    seqs = torch.randint(0, model.cfg.vocab_size, (3, total))
    with torch.no_grad():
        reference = model(seqs).logits
    cache = KVCache(model.cfg, max_slots=6, max_len=64)
    cache.k.normal_()  # stale keys/values in every slot: a spare row or a masked position must not leak
    cache.v.normal_()
    if cache.copy_keys is not None:
        cache.copy_keys.normal_()
    slots = torch.tensor(slot_ids)
    prompt_lens = [4, 13, 21]  # different cached lengths per slot
    got: list[list[torch.Tensor]] = [[] for _ in slots]
    with torch.no_grad():
        for row, (slot, n) in enumerate(zip(slots.tolist(), prompt_lens, strict=True)):
            out = model(seqs[row:row + 1, :n], cache=cache, slots=torch.tensor([slot]))
            got[row].append(out.logits[0])
        assert cache.lengths[slots].tolist() == prompt_lens
        pos = list(prompt_lens)
        for _ in range(12):  # decode all three together, T=1
            step = torch.tensor([[seqs[r, pos[r]]] for r in range(3)])
            out = model(step, cache=cache, slots=slots)
            for r in range(3):
                got[r].append(out.logits[r])
                pos[r] += 1
        # all three continue by 3 tokens at once (T>1 over spare rows), then one slot by 5
        out = model(torch.stack([seqs[r, pos[r]:pos[r] + 3] for r in range(3)]), cache=cache, slots=slots)
        for r in range(3):
            got[r].append(out.logits[r])
            pos[r] += 3
        out = model(seqs[1:2, pos[1]:pos[1] + 5], cache=cache, slots=slots[1:2])
        got[1].append(out.logits[0])
        pos[1] += 5
    assert cache.lengths[slots].tolist() == pos
    worst = 0.0
    for r in range(3):
        logits = torch.cat([g.reshape(-1, model.cfg.vocab_size) for g in got[r]])
        worst = max(worst, float((logits - reference[r, :pos[r]]).abs().max()))
    assert worst <= 1e-5, worst
    reads_per_forward = 2 * model.cfg.n_layers + (model.copy is not None)  # K and V per layer, the copy keys
    assert len(viewed) == reads_per_forward * (3 + 12 + 2)
    assert all(viewed) if spread > 0 else not any(viewed)


def test_reset_slot_reuses_it(model: MoETransformer) -> None:
    cache = KVCache(model.cfg, max_slots=2, max_len=32)
    a, b = torch.randint(0, model.cfg.vocab_size, (2, 1, 10))
    with torch.no_grad():
        model(a, cache=cache, slots=torch.tensor([1]))
        cache.reset(1)
        out = model(b, cache=cache, slots=torch.tensor([1]))
    torch.testing.assert_close(out.logits, model(b).logits, rtol=0, atol=1e-5)
    assert cache.lengths.tolist() == [0, 10]


def test_cache_overflow_and_bad_slots_raise(model: MoETransformer) -> None:
    cache = KVCache(model.cfg, max_slots=2, max_len=8)
    with pytest.raises(ValueError, match="overflow"):
        model(torch.zeros(1, 9, dtype=torch.long), cache=cache, slots=torch.tensor([0]))
    with pytest.raises(ValueError, match="different slot"):
        model(torch.zeros(2, 1, dtype=torch.long), cache=cache, slots=torch.tensor([1, 1]))
    with pytest.raises(ValueError, match="slots"):
        model(torch.zeros(1, 1, dtype=torch.long), cache=cache)
    for bad in ([-1], [0, 2]):  # a negative id would index from the end; 2 is past max_slots
        with pytest.raises(ValueError, match=r"slots must be in 0\.\.1"):
            model(torch.zeros(len(bad), 1, dtype=torch.long), cache=cache, slots=torch.tensor(bad))
    assert cache.lengths.tolist() == [0, 0]


def test_logprobs_match_logits(model: MoETransformer) -> None:
    ids = torch.randint(0, model.cfg.vocab_size, (2, 9))
    lp = model.logprobs(ids)
    assert lp.shape == (2, 8)
    expect = torch.log_softmax(model(ids).logits[:, :-1], -1).gather(-1, ids[:, 1:, None]).squeeze(-1)
    torch.testing.assert_close(lp, expect)
    assert torch.all(lp <= 0)


def test_bf16_runs_and_is_close_to_fp32(model: MoETransformer) -> None:
    from dataclasses import replace

    bf16 = MoETransformer(replace(model.cfg, precision="bf16")).eval()
    bf16.load_state_dict(model.state_dict())
    ids = torch.randint(0, model.cfg.vocab_size, (2, 16))
    a, b = model(ids).logits, bf16(ids).logits
    assert b.dtype == torch.float32
    assert float((a - b).abs().max()) < 0.1  # bf16 has ~3 significant digits


def test_mxfp8_without_kernels_fails_at_construction(monkeypatch: pytest.MonkeyPatch) -> None:
    import sys
    from dataclasses import replace

    monkeypatch.setitem(sys.modules, "kernels.linear", None)  # as if the kernels were not there
    with pytest.raises(KernelsUnavailable, match="MXFP8 kernels"):
        MoETransformer(replace(CFG, precision="mxfp8"))
