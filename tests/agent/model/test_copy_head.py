"""The pointer-sentinel copy head (agent.model.copy_head): a normalised mixture, a near-identity
when added to a trained model, the same function through the KV cache (prefix copies included),
checkpoints that keep it, and what it is for: copying a span whose place in the context varies,
which the same small model without it does not learn in the same steps."""

from __future__ import annotations

import contextlib
import math
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch

from agent.model.checkpoint import load_checkpoint, save_checkpoint
from agent.model.config import ModelConfig
from agent.model.copy_head import twin_ids
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


def test_the_lm_side_is_the_mixture_minus_the_pointer_and_absent_without_a_head() -> None:
    from dataclasses import replace

    ids = torch.randint(0, CFG.vocab_size, (2, 40))
    with torch.no_grad():
        out = _model()(ids)
        plain = _model(cfg=replace(CFG, copy_head=False))(ids)
    assert out.lm_side is not None and plain.lm_side is None
    # p = g·p_lm + p_copy: the LM side is never above the mixture, and where nothing may be pointed
    # at (the first min_distance positions) it is the whole of it
    assert bool((out.lm_side <= out.logits + 1e-5).all())
    torch.testing.assert_close(out.lm_side[:, 0], out.logits[:, 0])
    # the LM side sums to the gate g: at init at least half the mass (the sentinel's bias), and the
    # pointer holds the rest, which is real once there is something to point at
    gate = torch.logsumexp(out.lm_side, dim=-1)
    assert bool((gate >= math.log(0.5) - 1e-5).all()) and bool((gate <= 1e-5).all())
    assert float(gate[:, 10:].max()) < -1e-3


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


@pytest.mark.parametrize("min_distance", [1, 5])
def test_prefix_copies_and_decoding_through_the_cache_equal_the_plain_forward(min_distance: int) -> None:
    from dataclasses import replace

    model = _model(cfg=replace(CFG, copy_min_distance=min_distance))
    with torch.no_grad():  # a head that points somewhere: random, not the near-zero init
        for p in model.copy.parameters():  # type: ignore[union-attr]
            p.normal_(0, 0.5)
        model.copy.set_twins(torch.randperm(CFG.vocab_size, generator=torch.Generator().manual_seed(1)))  # type: ignore[union-attr]
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


def test_twin_ids_strip_one_leading_space_or_punctuation_character() -> None:
    tok = tiny_tokenizer()
    twin = twin_ids(tok)
    assert twin.shape == (tok.vocab_size,)
    pairs = [(tok.decode([i]), tok.decode([int(twin[i])])) for i in range(tok.vocab_size) if int(twin[i]) != i]
    assert len(pairs) > 50  # a code tokenizer merges many " name", "_name", ".name"
    for spaced, bare in pairs:
        assert spaced[1:] == bare and not spaced[0].isalnum(), (spaced, bare)
    for i in tok.special_ids.values():
        assert int(twin[i]) == i
    (spaced,) = tok.encode(" self")  # one token, and so is "self"
    assert tok.decode([int(twin[spaced])]) == "self"


def test_the_pointer_never_points_closer_than_the_minimum_distance() -> None:
    from dataclasses import replace

    model = _model(cfg=replace(CFG, copy_min_distance=4))
    with torch.no_grad():
        model.copy.sentinel_bias.fill_(-40.0)  # type: ignore[union-attr]  # all mass on the pointer
        ids = torch.arange(2, 42)[None]  # distinct tokens: a successor names its position
        p = model(ids).logits[0].exp()
    for t in range(8, 40):
        recent = ids[0, t - 2:t + 1]  # the successors of j = t-3 .. t-1 (x_{t-2} .. x_t)
        older = ids[0, 1:t - 2]  # the successors of j <= t - 4
        assert float(p[t, recent].sum()) < 1e-6, t
        assert float(p[t, older].sum()) > 0.99, t


def test_a_checkpoint_keeps_the_head(tmp_path: Path) -> None:
    tok = tiny_tokenizer()
    model = MoETransformer(ModelConfig.preset("tiny", vocab_size=tok.vocab_size, copy_head=True)).eval()
    model.copy.set_twins(twin_ids(tok))  # type: ignore[union-attr]
    save_checkpoint(tmp_path / "c", model, tok, step=1, profile=COMPACT_PROFILE)
    loaded, _ = load_checkpoint(tmp_path / "c")
    assert loaded.cfg.copy_head
    assert torch.equal(loaded.copy.twin, twin_ids(tok))  # type: ignore[union-attr]
    ids = torch.randint(0, tok.vocab_size, (1, 16))
    with torch.no_grad():
        torch.testing.assert_close(loaded(ids).logits, model(ids).logits)


def _copy_rows(n: int, g: torch.Generator, span: int = 8, spaced_first: bool = False) -> torch.Tensor:
    """``pad, noise, SEP, x, noise, SEP, x``: the second ``x`` is predictable only by finding the first
    (the noise lengths vary, so no fixed offset does it). ``spaced_first``: the first ``x``'s
    tokens are the "spaced" forms ``x + 32`` of ids 2..31 (:data:`_TOY_TWINS`), the copy the bare ones —
    what a name in a request and the same name after ``<param name="path">`` look like to BPE."""
    rows = []
    hi = 32 if spaced_first else 64
    for _ in range(n):
        a, b = (int(v) for v in torch.randint(0, 16, (2,), generator=g))
        x = torch.randint(2, hi, (span,), generator=g)
        first = x + 32 if spaced_first else x
        rows.append(torch.cat([torch.zeros(32 - a - b, dtype=torch.long), torch.randint(2, 64, (a,), generator=g),
                               torch.tensor([1]), first, torch.randint(2, 64, (b,), generator=g), torch.tensor([1]),
                               x]))
    return torch.stack(rows)


@contextlib.contextmanager
def _one_thread() -> Iterator[None]:
    """The toy trainings below on one thread: deterministic, and their thresholds were read that way."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(threads)


_TOY_TWINS = torch.cat([torch.arange(34), torch.arange(2, 32)])  # id 32+k (k >= 2) is " k"; twin(32+k) = k


def _copy_accuracy_after_training(copy_head: bool, steps: int = 200, span: int = 8, spaced_first: bool = False,
                                  twins: bool = False) -> float:
    torch.manual_seed(0)
    model = MoETransformer(ModelConfig.preset("tiny", vocab_size=64, max_seq_len=64, copy_head=copy_head))
    if twins:
        model.copy.set_twins(_TOY_TWINS)  # type: ignore[union-attr]
    opt = torch.optim.AdamW(model.parameters(), lr=3e-3)
    g = torch.Generator().manual_seed(0)
    for _ in range(steps):
        ids = _copy_rows(32, g, span, spaced_first)
        out = model(ids)
        lp = torch.log_softmax(out.logits[:, :-1], -1).gather(-1, ids[:, 1:, None]).squeeze(-1)
        loss = -lp[:, -span:].mean() + out.aux_loss
        opt.zero_grad()
        loss.backward()
        opt.step()
    with torch.no_grad():
        ids = _copy_rows(256, g, span, spaced_first)
        pred = model.eval()(ids).logits[:, -span - 1:-1].argmax(-1)
    return float((pred == ids[:, -span:]).float().mean())


@pytest.mark.timeout(300)
def test_the_head_learns_to_copy_a_span_that_the_plain_model_does_not_in_the_same_steps() -> None:
    with _one_thread():
        with_head, plain = _copy_accuracy_after_training(True), _copy_accuracy_after_training(False)
    assert with_head >= 0.8, with_head
    assert plain <= 0.3, plain  # chance is 1/62: the task is not solvable without finding the span


@pytest.mark.timeout(300)
def test_twin_entries_copy_a_span_whose_source_is_in_the_spaced_form() -> None:
    with _one_thread():
        # 400 steps: the plain copy needs ~200 (the test above); the spaced one must also learn the
        # twin entries' keys and the same-token bonus (0.69 at 200 steps, 0.92 at 400, when written)
        with_twins = _copy_accuracy_after_training(True, steps=400, spaced_first=True, twins=True)
        without = _copy_accuracy_after_training(True, steps=400, spaced_first=True, twins=False)
    assert with_twins >= 0.8, with_twins
    assert without <= 0.3, without  # the pointer can only emit the spaced ids the source holds


SUCCESSOR_CFG = ModelConfig.preset("tiny", vocab_size=97, max_seq_len=128, copy_head=True, copy_successor_keys=True)


def test_successor_keys_need_a_copy_head_and_start_as_the_head_without_them() -> None:
    from dataclasses import replace

    with pytest.raises(ValueError, match="needs copy_head"):
        replace(SUCCESSOR_CFG, copy_head=False)
    plain = _model(cfg=replace(CFG, copy_head=False))
    ids = torch.randint(0, CFG.vocab_size, (2, 48))
    torch.manual_seed(3)
    without = plain.with_copy_head(min_distance=2).eval()
    torch.manual_seed(3)
    with_keys = plain.with_copy_head(min_distance=2, successor_keys=True).eval()
    assert with_keys.cfg.copy_successor_keys and with_keys.copy.successor_keys is not None  # type: ignore[union-attr]
    assert without.copy.successor_keys is None  # type: ignore[union-attr]
    with torch.no_grad():  # zero at init: the same scores, so a start that gains them loses nothing
        torch.testing.assert_close(with_keys(ids).logits, without(ids).logits, rtol=0, atol=0)


@pytest.mark.parametrize("min_distance", [1, 5])
def test_successor_keys_through_the_cache_equal_the_plain_forward(min_distance: int) -> None:
    from dataclasses import replace

    cfg = replace(SUCCESSOR_CFG, copy_min_distance=min_distance)
    model = _model(cfg=cfg)
    with torch.no_grad():
        for p in model.copy.parameters():  # type: ignore[union-attr]
            p.normal_(0, 0.5)
        model.copy.set_twins(torch.randperm(CFG.vocab_size, generator=torch.Generator().manual_seed(1)))  # type: ignore[union-attr]
        # 90 tokens: the plain forward (90 queries > d_model 64) scores entries through the key table,
        # the cached steps (8 and 1 queries) through the per-token scores; they must agree
        seq = torch.randint(0, CFG.vocab_size, (2, 90))
        reference = model(seq).logits
        plain_keys = model.copy.successor_keys.clone()  # type: ignore[union-attr]
        model.copy.successor_keys.zero_()  # type: ignore[union-attr]
        assert float((model(seq).logits - reference).abs().max()) > 0.1  # the keys matter here
        model.copy.successor_keys.copy_(plain_keys)  # type: ignore[union-attr]
        cache = KVCache(cfg, max_slots=3, max_len=128)
        model(seq[:, :12], cache=cache, slots=torch.tensor([2, 1]))
        cache.keep_prefix(0, 12, source=2)
        got = [model(seq[:, 12:20], cache=cache, slots=torch.tensor([0, 1])).logits]
        for i in range(20, 90):
            got.append(model(seq[:, i:i + 1], cache=cache, slots=torch.tensor([0, 1])).logits)
    torch.testing.assert_close(torch.cat(got, dim=1), reference[:, 12:], rtol=0, atol=1e-4)


_END, _DELIM = 3, 2


def _exit_rows(n: int, g: torch.Generator) -> tuple[torch.Tensor, torch.Tensor]:
    """``pad, noise, SEP, x, DELIM, noise, SEP, x, END, filler`` with ``len(x)`` in 3..8 and the whole at
    a random offset (so no position gives END away): after copying ``x`` the model must write END
    where the source continues with DELIM, and only the token after the source span says where it
    ends. Returns the rows and each row's END position."""
    rows, ends = [], []
    for _ in range(n):
        a, b = (int(v) for v in torch.randint(0, 8, (2,), generator=g))
        span = int(torch.randint(3, 9, (1,), generator=g))
        x = torch.randint(4, 64, (span,), generator=g)
        seq = torch.cat([torch.randint(4, 64, (a,), generator=g), torch.tensor([1]), x, torch.tensor([_DELIM]),
                         torch.randint(4, 64, (b,), generator=g), torch.tensor([1]), x, torch.tensor([_END])])
        left = int(torch.randint(0, 48 - len(seq) + 1, (1,), generator=g))
        filler = torch.randint(4, 64, (48 - len(seq) - left,), generator=g)
        rows.append(torch.cat([torch.zeros(left, dtype=torch.long), seq, filler]))
        ends.append(left + len(seq) - 1)
    return torch.stack(rows), torch.tensor(ends)


def _exit_accuracy_after_training(successor_keys: bool, steps: int = 150) -> float:
    torch.manual_seed(0)
    model = MoETransformer(ModelConfig.preset("tiny", vocab_size=64, max_seq_len=64, copy_head=True,
                                              copy_successor_keys=successor_keys))
    opt = torch.optim.AdamW(model.parameters(), lr=3e-3)
    g = torch.Generator().manual_seed(0)
    for _ in range(steps):
        ids, ends = _exit_rows(32, g)
        spans = (ids == 1).nonzero()[:, 1].view(-1, 2)  # the two SEPs: the copy runs from the second one
        out = model(ids)
        lp = torch.log_softmax(out.logits[:, :-1], -1).gather(-1, ids[:, 1:, None]).squeeze(-1)
        at = torch.arange(47)[None, :]  # lp[:, i] predicts token i + 1
        target = (at >= spans[:, 1:]) & (at < ends[:, None])  # the copy and END
        loss = -(lp * target).sum() / target.sum() + out.aux_loss
        opt.zero_grad()
        loss.backward()
        opt.step()
    with torch.no_grad():
        ids, ends = _exit_rows(256, g)
        pred = model.eval()(ids).logits[torch.arange(256), ends - 1].argmax(-1)
    return float((pred == _END).float().mean())


@pytest.mark.timeout(300)
def test_successor_keys_learn_where_a_copy_stops_sooner_than_the_head_without_them() -> None:
    with _one_thread():
        with_keys, without = _exit_accuracy_after_training(True), _exit_accuracy_after_training(False)
    # when written: 0.96 vs 0.27 at 150 steps; the head without them gets there later (0.87 at 300
    # steps: the transformer can find the delimiter by attention, slowly), both 0.40 at 75
    assert with_keys >= 0.8, with_keys
    assert without <= with_keys - 0.3, (with_keys, without)


_USER, _ASSISTANT, _TOOL, _ENDM = 3, 4, 5, 6  # the tokenizer's role and end marker ids


def _chat_ids() -> torch.Tensor:
    """Two model outputs, each after an ``<|assistant|>`` marker, with a tool result between them:
    distinct ordinary tokens (ids >= 7), so a successor names its position."""
    ordinary = iter(range(7, 97))
    seq = [_USER, *(next(ordinary) for _ in range(10)), _ENDM, _ASSISTANT, *(next(ordinary) for _ in range(14)),
           _ENDM, _TOOL, *(next(ordinary) for _ in range(8)), _ENDM, _ASSISTANT, *(next(ordinary) for _ in range(12))]
    return torch.tensor([seq])


def test_context_end_bounds_a_model_output_at_its_marker() -> None:
    from agent.model.copy_head import context_end

    ids = _chat_ids()
    end = context_end(ids)[0]
    first, second = 12, 38  # the two <|assistant|> markers
    assert int(ids[0, first]) == _ASSISTANT and int(ids[0, second]) == _ASSISTANT
    n = ids.shape[1]
    assert end[:first].eq(n).all() and end[first:27].eq(first).all()  # the first output, to its <|end|>
    assert end[27:second].eq(n).all() and end[second:].eq(second).all()  # the tool message; the second output


def test_a_context_only_pointer_never_copies_the_output_it_is_writing() -> None:
    from dataclasses import replace

    with pytest.raises(ValueError, match="copy_context_only needs copy_head"):
        ModelConfig.preset("tiny", vocab_size=97, copy_context_only=True)
    model = _model(cfg=replace(CFG, copy_min_distance=2, copy_context_only=True))
    plain = _model(cfg=replace(CFG, copy_min_distance=2))
    with torch.no_grad():
        for m in (model, plain):
            m.copy.sentinel_bias.fill_(-40.0)  # type: ignore[union-attr]  # all mass on the pointer
        ids = _chat_ids()
        p, q = model(ids).logits[0].exp(), plain(ids).logits[0].exp()
    second = 38
    for t in range(second + 3, ids.shape[1]):
        inside = ids[0, second + 1:t]  # successors of entries j = second .. t - 2, inside the output
        before = ids[0, 1:second + 1].unique()  # successors of entries j < second: the context
        assert float(p[t, inside].sum()) < 1e-6 and float(p[t, before].sum()) > 0.99, t
        assert float(q[t, inside].sum()) > 1e-3, t  # without the option the pointer does reach them
    # outside a model output (the tool message) the two heads are the same function
    torch.testing.assert_close(p[27:second + 1], q[27:second + 1], rtol=0, atol=1e-6)


def test_context_only_through_the_cache_equals_the_plain_forward() -> None:
    from dataclasses import replace

    cfg = replace(SUCCESSOR_CFG, copy_min_distance=2, copy_context_only=True)
    model = _model(cfg=cfg)
    with torch.no_grad():
        for p in model.copy.parameters():  # type: ignore[union-attr]
            p.normal_(0, 0.5)
        seq = torch.cat([_chat_ids(), torch.randint(7, 97, (1, 3))], dim=1).expand(2, -1).clone()
        seq[1, 5:] = seq[1, 5:].roll(3)  # a second row whose markers sit elsewhere
        reference = model(seq).logits
        cache = KVCache(cfg, max_slots=3, max_len=128)
        model(seq[:, :14], cache=cache, slots=torch.tensor([2, 1]))  # the prompt ends inside an output
        cache.keep_prefix(0, 14, source=2)
        got = [model(seq[:, 14:20], cache=cache, slots=torch.tensor([0, 1])).logits]
        for i in range(20, seq.shape[1]):
            got.append(model(seq[:, i:i + 1], cache=cache, slots=torch.tensor([0, 1])).logits)
    torch.testing.assert_close(torch.cat(got, dim=1), reference[:, 14:], rtol=0, atol=1e-4)
