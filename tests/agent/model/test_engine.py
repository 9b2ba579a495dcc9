"""The generation engine: sampling, streamed text, continuous batching, logprob consistency.

Every engine test drives the real tiny MoE model (random init) with a
tokenizer trained in milliseconds on this repo's own source.
"""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

import pytest
import torch

from agent.model.config import ModelConfig
from agent.model.engine import Engine, EngineError, GeneratedPiece, GenerationRequest
from agent.model.sampling import TextStream, sample
from agent.model.tokenizer import Tokenizer, train_tokenizer
from agent.model.transformer import MoETransformer

REPO = Path(__file__).resolve().parents[3]


def tiny_tokenizer() -> Tokenizer:
    texts = [p.read_text() for p in sorted((REPO / "agent").glob("*.py"))]
    return train_tokenizer(texts, 1024)


def tiny_model(tokenizer: Tokenizer, seed: int = 0, ends: tuple[str, ...] = ("<|end|>", "<|eos|>"),
               max_seq_len: int = 256) -> MoETransformer:
    """A random model that never writes a role marker or ``<|pad|>`` (their logits are -inf).

    Every special token ends a sequence; a random model would hit one of them early and cut
    tests of other behaviours short. ``ends`` (``<|end|>`` and ``<|eos|>``) stay sampleable;
    ``ends=()`` gives a model that always runs to ``max_tokens`` (the tokenizer is trained on
    this repo's source, so where a random model first samples an end moves with every edit)."""
    torch.manual_seed(seed)
    model = MoETransformer(ModelConfig.preset("tiny", vocab_size=tokenizer.vocab_size, max_seq_len=max_seq_len)).eval()
    masked = [i for t, i in tokenizer.special_ids.items() if t not in ends]

    def no_markers(_module: torch.nn.Module, _inputs: object, logits: torch.Tensor) -> torch.Tensor:
        logits[..., masked] = float("-inf")
        return logits

    model.lm_head.register_forward_hook(no_markers)
    return model


@pytest.fixture(scope="module")
def tok() -> Tokenizer:
    return tiny_tokenizer()


@pytest.fixture(scope="module")
def model(tok: Tokenizer) -> MoETransformer:
    return tiny_model(tok)


@pytest.fixture
async def engine(model: MoETransformer, tok: Tokenizer):
    e = Engine(model, tok, max_slots=8)
    await e.start()
    yield e
    await e.stop()


async def collect(engine: Engine, req: GenerationRequest) -> list[GeneratedPiece]:
    return [p async for p in engine.generate(req)]


def joined(pieces: list[GeneratedPiece]) -> tuple[str, list[int], list[float]]:
    return ("".join(p.text for p in pieces), [t for p in pieces for t in p.token_ids],
            [lp for p in pieces for lp in p.logprobs])


def reference_logprobs(model: MoETransformer, prompt: list[int], generated: list[int]) -> torch.Tensor:
    """The training forward's logprobs of ``generated`` (no cache, whole sequence)."""
    return model.logprobs(torch.tensor([prompt + generated]))[0, len(prompt) - 1 :]


# -- sampling ---------------------------------------------------------------------


def test_greedy_is_argmax_and_logprob_is_unscaled() -> None:
    logits = torch.randn(3, 50)
    tokens, lps = sample(logits, torch.zeros(3), torch.ones(3), torch.rand(3))
    assert tokens.tolist() == logits.argmax(-1).tolist()
    assert torch.allclose(lps, torch.log_softmax(logits, -1).gather(1, tokens[:, None]).squeeze(1))


def test_top_p_never_leaves_the_nucleus() -> None:
    probs = torch.tensor([0.5, 0.3, 0.15, 0.05])
    logits = probs.log().repeat(2000, 1)
    tokens, _ = sample(logits, torch.ones(2000), torch.full((2000,), 0.7), torch.rand(2000))
    assert set(tokens.tolist()) == {0, 1}  # 0.5 < 0.7, so the nucleus is {0, 1}
    tokens, _ = sample(logits, torch.ones(2000), torch.full((2000,), 0.45), torch.rand(2000))
    assert set(tokens.tolist()) == {0}


def test_sampling_follows_the_tempered_distribution() -> None:
    probs = torch.tensor([0.6, 0.3, 0.1])
    n = 20000
    tokens, _ = sample(probs.log().repeat(n, 1), torch.full((n,), 0.5), torch.ones(n), torch.rand(n))
    want = torch.softmax(probs.log() / 0.5, -1)
    got = torch.bincount(tokens, minlength=3).float() / n
    assert torch.allclose(got, want, atol=0.02)


def test_processed_rows_report_the_tempered_distribution() -> None:
    logits = torch.randn(4, 50)
    temps = torch.tensor([0.5, 1.0, 0.0, 2.0])
    tokens, lps = sample(logits, temps, torch.ones(4), torch.rand(4), torch.ones(4, dtype=torch.bool))
    want = torch.stack([torch.log_softmax(logits[i] / t, -1)[tokens[i]] for i, t in enumerate([0.5, 1.0, 1.0, 2.0])])
    assert torch.allclose(lps, want, atol=1e-6)
    raw = torch.log_softmax(logits, -1).gather(1, tokens[:, None]).squeeze(1)
    assert not torch.allclose(lps[0], raw[0])  # T = 0.5 sharpens: the sampled token's logprob differs


# -- streamed text ------------------------------------------------------------------


def byte_decode(ids: list[int]) -> str:
    return bytes(ids).decode("utf-8", "replace")


def stream(text_bytes: bytes, stops: list[str]) -> tuple[list[str], bool, str]:
    ts = TextStream(byte_decode, stops)
    out, stopped = [], False
    for b in text_bytes:
        piece, stopped = ts.push(b)
        out.append(piece)
        if stopped:
            break
    return out, stopped, "" if stopped else ts.flush()


def test_split_utf8_characters_are_held_until_complete() -> None:
    text = "héllo 🎉 ✓"
    pieces, stopped, rest = stream(text.encode(), [])
    assert "".join(pieces) + rest == text and not stopped
    assert all("\ufffd" not in p for p in pieces)


def test_stop_spanning_tokens_is_never_emitted() -> None:
    pieces, stopped, _ = stream(b"abc<|en<|end|>tail", ["<|end|>"])
    assert stopped and "".join(pieces) == "abc<|en"
    # a prefix of the stop is held back while it might complete, then released
    assert pieces[3:6] == ["", "", ""]


def test_unfinished_stop_prefix_is_flushed_at_the_end() -> None:
    pieces, stopped, rest = stream(b"x</st", ["</stop>"])
    assert not stopped and "".join(pieces) == "x" and rest == "</st"


def test_a_stop_can_end_with_the_end_marker() -> None:
    ts = TextStream(byte_decode, ["\n<|end|>"])
    assert ts.push(ord("x")) == ("x", False) and ts.push(ord("\n")) == ("", False)  # the newline is held
    assert ts.end("<|end|>") == ""  # ... and dropped: it began the stop "\n<|end|>"
    ts = TextStream(byte_decode, ["\n<|end|>"])
    ts.push(ord("x"))
    ts.push(ord("\n"))
    assert ts.push(ord("y")) == ("\ny", False)  # not followed by the end marker: released
    assert ts.end("<|end|>") == ""
    assert TextStream(byte_decode, []).end("<|end|>") == ""


def test_earliest_of_several_stops_wins() -> None:
    pieces, stopped, _ = stream(b"one TWO three", ["three", "TWO"])
    assert stopped and "".join(pieces) == "one "


# -- the engine ----------------------------------------------------------------------


async def test_concurrent_sequences_report_training_logprobs(engine: Engine, model, tok) -> None:
    """Sequences of different lengths, arriving at different times, decoded in shared
    batches, in two waves (the second reuses the first's cache slots, one-token
    prompts included): every reported logprob equals the no-cache training forward's."""
    waves = [["def f(x):", "import os\n" * 3, "x", "class A:\n    pass\n", "é ü 🎉"], ["#", "y", "for i in range(3):"]]

    async def one(i: int, ids: list[int]) -> tuple[list[int], list[GeneratedPiece]]:
        await asyncio.sleep(0.005 * i)
        return ids, await collect(engine, GenerationRequest(ids, max_tokens=30, seed=i))

    results = []
    for texts in waves:
        results += await asyncio.gather(*(one(i, tok.encode(t)) for i, t in enumerate(texts)))
    worst = 0.0
    for prompt, pieces in results:
        text, ids, lps = joined(pieces)
        assert len(ids) == len(lps) == len(pieces)
        worst = max(worst, (reference_logprobs(model, prompt, ids) - torch.tensor(lps)).abs().max().item())
        body = ids[:-1] if ids[-1] in engine.end_ids else ids
        assert text == tok.decode(body)  # the streamed pieces add up to the decoded tokens
    print(f"max |engine - training| logprob difference: {worst:.2e}")
    assert worst <= 1e-5
    assert engine.stats.max_batch >= 3  # they really were decoded together


async def test_processed_logprobs_are_the_tempered_forwards_and_raw_the_models(engine: Engine, model, tok) -> None:
    """``logprobs_mode="processed"`` at temperature 0.5 reports ``log_softmax(logits / 0.5)``
    of the training forward (what an RL trainer at T = 0.5 computes); "raw" the model's own."""
    prompt = tok.encode("def f(x):")
    for mode in ("processed", "raw"):
        done = await engine.complete(GenerationRequest(prompt, max_tokens=12, temperature=0.5, seed=3,
                                                       logprobs_mode=mode))  # type: ignore[arg-type]
        ids = torch.tensor([prompt + done.token_ids])
        logits = model(ids).logits[0, len(prompt) - 1 : -1] / (0.5 if mode == "processed" else 1.0)
        ref = torch.log_softmax(logits, -1).gather(1, torch.tensor(done.token_ids)[:, None]).squeeze(1)
        assert torch.allclose(torch.tensor(done.logprobs), ref, atol=1e-5, rtol=0), mode
    with pytest.raises(EngineError, match="logprobs_mode"):
        await engine.complete(GenerationRequest(prompt, max_tokens=2, logprobs_mode="tempered"))  # type: ignore[arg-type]


async def test_equal_length_prompts_share_one_prefill(model, tok) -> None:
    engine = Engine(model, tok, max_slots=4)
    await engine.start()
    prompts = [[10 + i, 20 + i, 30 + i] for i in range(4)]
    try:
        done = await asyncio.gather(*(engine.complete(GenerationRequest(p, max_tokens=6, seed=i))
                                      for i, p in enumerate(prompts)))
    finally:
        await engine.stop()
    assert engine.stats.prefills == 1 and engine.stats.prefill_tokens == 12
    for p, c in zip(prompts, done, strict=True):
        assert (reference_logprobs(model, p, c.token_ids) - torch.tensor(c.logprobs)).abs().max().item() <= 1e-5


async def test_request_joins_while_others_are_mid_generation(tok) -> None:
    engine = Engine(tiny_model(tok, ends=()), tok, max_slots=8)  # A must not end before B joins
    await engine.start()
    a_pieces: list[GeneratedPiece] = []
    b_first_at = -1

    async def a() -> None:
        async for p in engine.generate(GenerationRequest(tok.encode("first"), max_tokens=60, temperature=0)):
            a_pieces.append(p)

    async def b() -> None:
        nonlocal b_first_at
        while len(a_pieces) < 10:
            await asyncio.sleep(0)
        async for _ in engine.generate(GenerationRequest(tok.encode("second one"), max_tokens=5, temperature=0)):
            if b_first_at < 0:
                b_first_at = len(a_pieces)

    try:
        await asyncio.gather(a(), b())
    finally:
        await engine.stop()
    assert len(a_pieces) == 60 and 10 <= b_first_at < 60  # B streamed while A was still generating
    assert engine.stats.max_batch == 2


async def test_batching_does_not_change_greedy_output(engine: Engine, tok) -> None:
    reqs = [GenerationRequest(tok.encode(t), max_tokens=20, temperature=0) for t in ["a = 1", "while True:", "#"]]
    alone = [await engine.complete(r) for r in reqs]
    together = await asyncio.gather(*(engine.complete(r) for r in reqs))
    assert [c.token_ids for c in together] == [c.token_ids for c in alone]


async def test_same_seed_same_sample_whatever_the_batch(engine: Engine, tok) -> None:
    req = GenerationRequest(tok.encode("def"), max_tokens=20, temperature=1.0, seed=1234)
    alone = await engine.complete(req)
    other = GenerationRequest(tok.encode("noise"), max_tokens=20, seed=99)
    together, _ = await asyncio.gather(engine.complete(req), engine.complete(other))
    assert together.token_ids == alone.token_ids
    different = await engine.complete(GenerationRequest(tok.encode("def"), max_tokens=20, seed=4321))
    assert different.token_ids != alone.token_ids


async def test_rows_that_finish_out_of_order_read_the_cache_as_a_view_with_spare_rows(tok, monkeypatch) -> None:
    """Requests of different lengths leave busy slots scattered; the view over their range (spare
    rows dropped) samples the same tokens as gathering them."""
    from agent.model import slot_rows

    layouts = []
    real = slot_rows.SlotRows.of.__func__

    def spy(cls, slots, *, max_spread=2.0):
        rows = real(cls, slots, max_spread=max_spread)
        layouts.append((rows.span is not None, rows.index is not None))
        return rows

    monkeypatch.setattr(slot_rows.SlotRows, "of", classmethod(spy))
    reqs = [GenerationRequest(tok.encode(f"x{i} = {i}"), max_tokens=n, seed=i)
            for i, n in enumerate([3, 20, 5, 20, 8, 20])]
    out = {}
    for spread in (2.0, 0.0):
        model = tiny_model(tok, ends=())  # every request runs to its max_tokens
        model.slot_view_spread = spread
        engine = Engine(model, tok, max_slots=8)
        await engine.start()
        try:
            out[spread] = [c.token_ids for c in await asyncio.gather(*(engine.complete(r) for r in reqs))]
        finally:
            await engine.stop()
        if spread:
            assert (True, True) in layouts  # a view with spare rows was read (slots 1, 3, 5 busy)
            layouts.clear()
    assert all(span is False for span, _ in layouts)  # spread 0: every read gathered
    assert out[2.0] == out[0.0] and [len(t) for t in out[2.0]] == [3, 20, 5, 20, 8, 20]


async def test_stop_sequence_spanning_tokens_ends_the_sequence(engine: Engine, tok) -> None:
    prompt = tok.encode("def main():")
    full = await engine.complete(GenerationRequest(prompt, max_tokens=40, temperature=0))
    # a stop that starts inside one token and ends inside a later one
    cut = len(tok.decode(full.token_ids[:5])) - 1
    stop = full.text[cut : cut + 4]
    assert len(stop) == 4
    got = await engine.complete(GenerationRequest(prompt, max_tokens=40, temperature=0, stop=[stop]))
    assert got.finish_reason == "stop"
    assert got.text == full.text[: full.text.index(stop)] and stop not in got.text
    assert got.token_ids == full.token_ids[: len(got.token_ids)] and len(got.token_ids) < 40


@pytest.mark.parametrize("end", ["<|end|>", "<|eos|>"])
async def test_end_tokens_finish_with_stop_and_are_reported(model, tok, end: str) -> None:
    end_id = tok.token_id(end)
    handle = _forcing(model, {4: end_id})  # the end token at the 4th forward
    engine = Engine(model, tok, max_slots=2)
    await engine.start()
    try:
        pieces = await collect(engine, GenerationRequest(tok.encode("hi"), max_tokens=50, seed=232))
    finally:
        handle.remove()
        await engine.stop()
    text, ids, lps = joined(pieces)
    assert pieces[-1].finish_reason == "stop" and ids[-1] == end_id and len(ids) == 4
    assert end not in text and text == tok.decode(ids[:-1])
    assert lps[-1] > -1e-3  # the forced end token had almost all the mass


async def test_max_tokens_and_context_end_with_length(model, tok) -> None:
    engine = Engine(model, tok, max_slots=2, max_len=32)
    await engine.start()
    try:
        got = await engine.complete(GenerationRequest(tok.encode("x"), max_tokens=7, seed=246))
        assert got.finish_reason == "length" and len(got.token_ids) == 7
        prompt = list(range(20, 50))  # 30 of 32 positions
        got = await engine.complete(GenerationRequest(prompt, max_tokens=100, seed=249))
        assert got.finish_reason == "length" and len(got.token_ids) == 2  # prompt + output fills max_len
        with pytest.raises(EngineError, match=r"prompt is 32 tokens.*at most 31"):
            await engine.complete(GenerationRequest(list(range(20, 52)), max_tokens=1))
        with pytest.raises(EngineError, match="empty"):
            await engine.complete(GenerationRequest([], max_tokens=1))
        with pytest.raises(EngineError, match="top_p"):
            await engine.complete(GenerationRequest([5], top_p=0))
    finally:
        await engine.stop()


async def test_closing_a_stream_frees_its_slot(engine: Engine, tok) -> None:
    gen = engine.generate(GenerationRequest(tok.encode("abandon"), max_tokens=200, seed=262))
    async for _ in gen:
        break
    await gen.aclose()
    done = await engine.complete(GenerationRequest(tok.encode("next"), max_tokens=3, seed=266))
    assert done.finish_reason == "length"
    for _ in range(50):
        if engine.free_slots == engine.max_slots:
            break
        await asyncio.sleep(0.01)
    assert engine.free_slots == engine.max_slots


async def test_more_requests_than_slots_wait_their_turn(model, tok) -> None:
    engine = Engine(model, tok, max_slots=2)
    await engine.start()
    try:
        reqs = [GenerationRequest([7 + i], max_tokens=5, seed=279) for i in range(5)]
        done = await asyncio.gather(*(engine.complete(r) for r in reqs))
    finally:
        await engine.stop()
    assert [len(c.token_ids) for c in done] == [5] * 5 and engine.stats.max_batch == 2


async def test_event_loop_stays_responsive_during_forwards(model, tok) -> None:
    handle = model.register_forward_pre_hook(lambda *_: time.sleep(0.05))
    engine = Engine(model, tok, max_slots=2)
    await engine.start()
    ticks = 0

    async def ticker() -> None:
        nonlocal ticks
        while True:
            await asyncio.sleep(0.005)
            ticks += 1

    task = asyncio.create_task(ticker())
    try:
        await engine.complete(GenerationRequest([5, 6], max_tokens=6, seed=299))  # >= 0.3 s inside the model
    finally:
        task.cancel()
        handle.remove()
        await engine.stop()
    assert ticks >= 20


async def test_model_failure_fails_the_request_not_the_engine(model, tok) -> None:
    def boom(*_: object) -> None:
        raise RuntimeError("kaboom")

    engine = Engine(model, tok, max_slots=2)
    await engine.start()
    try:
        handle = model.register_forward_pre_hook(boom)
        with pytest.raises(EngineError, match="kaboom"):
            await engine.complete(GenerationRequest([5], max_tokens=3, seed=316))
        handle.remove()
        assert (await engine.complete(GenerationRequest([5], max_tokens=3, seed=318))).finish_reason == "length"
    finally:
        await engine.stop()


async def test_stop_fails_running_requests_and_refuses_new_ones(model, tok) -> None:
    engine = Engine(model, tok, max_slots=2)
    await engine.start()
    gen = engine.generate(GenerationRequest([5], max_tokens=10_000, seed=326))
    await gen.__anext__()
    await engine.stop()
    with pytest.raises(EngineError, match="stopped"):
        async for _ in gen:
            pass
    with pytest.raises(EngineError, match="engine.start"):
        await engine.complete(GenerationRequest([5], max_tokens=1))


async def test_a_failing_loop_fails_its_requests_instead_of_hanging(model, tok) -> None:
    class BrokenDecode:
        def __getattr__(self, name: str):
            return getattr(tok, name)

        def decode(self, ids, **kw) -> str:
            raise RuntimeError("decoder bug")

    engine = Engine(model, BrokenDecode(), max_slots=2)
    await engine.start()
    try:
        with pytest.raises(EngineError, match="decoder bug"):
            await asyncio.wait_for(engine.complete(GenerationRequest([5], max_tokens=3, seed=0)), 10)
        with pytest.raises(EngineError, match="stopped"):
            await engine.complete(GenerationRequest([5], max_tokens=3))
    finally:
        await engine.stop()


def _forcing(model: MoETransformer, forced: dict[int, int]):
    """Hook: at forward ``k`` (1 = prefill) add a huge logit to token ``forced[k]``."""
    calls = 0

    def force(_module, _inputs, logits: torch.Tensor) -> torch.Tensor:
        nonlocal calls
        calls += 1
        if calls in forced:
            logits[..., forced[calls]] += 1e4
        return logits

    return model.lm_head.register_forward_hook(force)


@pytest.mark.parametrize("marker", ["<|user|>", "<|assistant|>", "<|tool|>", "<|system|>", "<|pad|>"])
async def test_a_sampled_role_marker_ends_the_sequence_and_never_shows(tok, marker: str) -> None:
    torch.manual_seed(0)  # unmasked: this model may write any special token
    model = MoETransformer(ModelConfig.preset("tiny", vocab_size=tok.vocab_size, max_seq_len=64)).eval()
    marker_id = tok.token_id(marker)
    handle = _forcing(model, {3: marker_id})
    engine = Engine(model, tok, max_slots=1)
    await engine.start()
    try:
        pieces = await collect(engine, GenerationRequest(tok.encode("hi"), max_tokens=20, seed=1))
    finally:
        handle.remove()
        await engine.stop()
    text, ids, lps = joined(pieces)
    assert pieces[-1].finish_reason == "stop" and ids[-1] == marker_id and len(ids) == len(lps) == 3
    assert "<|" not in text and text == tok.decode(ids[:-1])


async def test_a_marker_spelled_from_ordinary_tokens_is_cut(tok) -> None:
    torch.manual_seed(0)
    model = MoETransformer(ModelConfig.preset("tiny", vocab_size=tok.vocab_size, max_seq_len=64)).eval()
    spelled = tok.encode("<|") + tok.encode("user") + tok.encode("|>")
    assert tok.token_id("<|user|>") not in spelled and tok.decode(spelled) == "<|user|>"
    handle = _forcing(model, {2 + i: t for i, t in enumerate(spelled)})
    engine = Engine(model, tok, max_slots=1)
    await engine.start()
    try:
        pieces = await collect(engine, GenerationRequest(tok.encode("hi"), max_tokens=20, seed=1))
    finally:
        handle.remove()
        await engine.stop()
    text, ids, _ = joined(pieces)
    assert pieces[-1].finish_reason == "stop" and ids[-len(spelled):] == spelled
    assert "<|" not in text and "user|>" not in text


def test_fit_clamps_max_tokens_to_the_room_the_prompt_leaves(model, tok) -> None:
    engine = Engine(model, tok, max_slots=1, max_len=32)
    fitted = engine.fit(GenerationRequest(list(range(20, 50)), max_tokens=4096))
    assert fitted.max_tokens == 2 and engine.room(30) == 2
    assert engine.fit(GenerationRequest([20], max_tokens=5)).max_tokens == 5
    with pytest.raises(EngineError, match=r"prompt is 32 tokens"):
        engine.fit(GenerationRequest(list(range(20, 52)), max_tokens=1))


# -- prefix cache, routes, weights -----------------------------------------------------


async def _conversation(engine: Engine, tok: Tokenizer, turns: int = 3) -> tuple[list[int], list[float], list[int]]:
    """A multi-turn exchange: each turn's prompt is the previous prompt + its sample + a new suffix."""
    ids = tok.encode("<|system|>\nhelp\n<|end|>\n<|user|>\nfix the bug\n<|end|>\n<|assistant|>\n")
    all_lps: list[float] = []
    sampled: list[int] = []
    for turn in range(turns):
        done = await engine.complete(GenerationRequest(ids, max_tokens=6, seed=100 + turn))
        all_lps += done.logprobs
        sampled += done.token_ids
        ids = ids + done.token_ids + tok.encode(f"\n<|tool|>\nresult {turn}\n<|end|>\n<|assistant|>\n")
    return ids, all_lps, sampled


async def test_prefix_cache_gives_the_same_logprobs_and_computes_less(model, tok) -> None:
    runs = {}
    for cached in (True, False):
        e = Engine(model, tok, max_slots=4, prefix_cache=cached)
        await e.start()
        try:
            runs[cached] = (await _conversation(e, tok), e.stats)
        finally:
            await e.stop()
    (ids_c, lps_c, sampled_c), stats_c = runs[True]
    (ids_u, lps_u, sampled_u), stats_u = runs[False]
    assert sampled_c == sampled_u and ids_c == ids_u
    assert torch.allclose(torch.tensor(lps_c), torch.tensor(lps_u), atol=1e-5, rtol=0)
    assert stats_u.cached_tokens == 0 and stats_c.cached_tokens > 0
    assert stats_c.prefill_tokens + stats_c.cached_tokens == stats_u.prefill_tokens == stats_c.prompt_tokens
    # turns 2 and 3 recompute only the new suffix plus the last sampled token
    assert stats_c.prefill_tokens < stats_u.prefill_tokens / 2


async def test_identical_prompts_admitted_together_are_prefilled_once(model, tok) -> None:
    e = Engine(model, tok, max_slots=8)
    await e.start()
    try:
        prompt = tok.encode("def add(a, b):\n    return a + b\n" * 4)
        outs = await asyncio.gather(*(e.complete(GenerationRequest(prompt, max_tokens=4, seed=s)) for s in range(4)))
    finally:
        await e.stop()
    assert e.stats.prefill_tokens == len(prompt) + 3  # one full prefill; the 3 others recompute 1 token each
    assert e.stats.cached_tokens == 3 * (len(prompt) - 1)
    for out in outs:  # copied keys/values give the training forward's logprobs
        ref = reference_logprobs(model, prompt, out.token_ids)
        assert torch.allclose(torch.tensor(out.logprobs), ref, atol=1e-5, rtol=0)


async def test_routes_cover_every_consumed_token_and_match_the_forward(model, tok) -> None:
    e = Engine(model, tok, max_slots=2)
    await e.start()
    try:
        prompt = tok.encode("class Foo:\n    pass\n")
        first = await e.complete(GenerationRequest(prompt, max_tokens=5, seed=1, return_routes=True))
        ext = prompt + first.token_ids + tok.encode("\nmore")
        second = await e.complete(GenerationRequest(ext, max_tokens=3, seed=2, return_routes=True,
                                                    routes_from=len(prompt)))
    finally:
        await e.stop()
    assert first.info is not None and second.info is not None
    assert second.info.cached_tokens == len(prompt) + len(first.token_ids) - 1
    routes = first.info.routes
    assert routes is not None and len(routes) == len(prompt) + len(first.token_ids) - 1
    full = ext + second.token_ids[:-1]
    with torch.no_grad():
        ref = model(torch.tensor([full]), return_routes=True).routes[0]
    assert torch.equal(torch.tensor(routes), ref[: len(routes)])
    # the second request's routes start at routes_from and include the cached turn's tokens
    assert torch.equal(torch.tensor(second.info.routes), ref[len(prompt) :])


async def test_load_weights_bumps_the_version_and_drops_cached_prefixes(model, tok) -> None:
    import copy

    other = copy.deepcopy(model)
    torch.manual_seed(5)
    for p in other.parameters():
        p.data.add_(torch.randn_like(p) * 0.05)
    e = Engine(copy.deepcopy(model), tok, max_slots=2)
    await e.start()
    try:
        prompt = tok.encode("import os\n")
        before = await e.complete(GenerationRequest(prompt, max_tokens=3, seed=3))
        await e.load_weights(other.state_dict(), version=7)
        after = await e.complete(GenerationRequest(prompt, max_tokens=3, seed=3))
        with pytest.raises(EngineError, match="do not fit"):
            await e.load_weights({"embed.weight": torch.zeros(1, 1)}, version=8)
    finally:
        await e.stop()
    assert before.info is not None and before.info.weights_version == 0
    assert after.info is not None and after.info.weights_version == 7 and after.info.cached_tokens == 0
    ref = reference_logprobs(other, prompt, after.token_ids)
    assert torch.allclose(torch.tensor(after.logprobs), ref, atol=1e-5, rtol=0)
    assert e.weights_version == 7
