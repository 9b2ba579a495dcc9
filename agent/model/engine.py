"""The generation engine: continuous batching over a KV cache.

    engine = Engine(model, tokenizer, max_slots=32)
    await engine.start()
    async for piece in engine.generate(GenerationRequest(prompt_ids=ids, max_tokens=64)):
        print(piece.text, end="")
    await engine.stop()

One asyncio task runs the loop; every model forward runs on one worker
thread, so the event loop stays responsive while the model computes. Each
iteration of the loop:

1. drops sequences whose consumer went away (the stream was closed);
2. admits waiting requests while a cache slot is free: each gets a prefill
   forward (``T`` = prompt length) and its first token; requests admitted
   together whose prompts have equal length share one prefill forward (RL
   samples several answers to one prompt at once);
3. decodes one token for *every* active sequence in ONE batched forward
   (``T`` = 1, one row per slot, each row at its own position).

So a request that arrives while others are mid-generation joins at the next
step (continuous batching). Pieces are streamed per sampled token: the token
id, its logprob, and whatever text became safe to show (see
:class:`agent.model.sampling.TextStream`).

What a sequence's ``token_ids``/``logprobs`` contain: every token sampled,
including the one that ended it (a special token, or the token that
completed a stop sequence) — RL needs the logprob of stopping too. Its text
contains neither special tokens nor stop text; a stop sequence may end with an
end marker (``"\n<|end|>"``), which cuts the text where that stop begins.

Special tokens (``<|eos|>``, ``<|pad|>`` and every chat-template marker,
``<|end|>``, ``<|user|>``, ``<|assistant|>``, ...) end a sequence: the model
cannot write a role marker into its own message. They are *not* masked from
sampling — the sampled distribution stays the model's own, so the logprobs
RL trains on are exact — and a sampled marker other than ``<|end|>`` simply
ends the turn (finish reason ``stop``). The markers' text is also a stop
sequence of every request, so a model that spells ``<|user|>`` out of
ordinary tokens is cut there too.

Context: a sequence holds at most ``max_len`` tokens, prompt and output
together. :meth:`Engine.fit` clamps a request's ``max_tokens`` to the room
its prompt leaves; a prompt with no room at all is :class:`PromptTooLong`
(never truncated).

Logprobs are those of the model's distribution (unscaled logits), equal to
``model.logprobs(prompt + generated)`` for the same tokens; see
:func:`agent.model.sampling.sample` for what that means when sampling at a
temperature other than 1 or with top-p.

Prefix cache (``prefix_cache=True``, the default; :mod:`agent.model.prefix_cache`):
a slot keeps its keys/values after its sequence ends, and a request whose
prompt starts with tokens some slot holds computes only the rest — a
conversation's next turn reuses its previous turn, G samples of one prompt
share one prefill. ``stats.prefill_tokens`` counts the prompt tokens actually
computed, ``stats.cached_tokens`` those reused. The cached and uncached paths
give the same logprobs up to rounding (tests hold them within 1e-5 in fp32).

Routing (``record_routes=True``, the default): the engine keeps, per cached
position, the MoE experts that token was routed to in each layer. A request
with ``return_routes=True`` gets them on its last piece (:class:`FinishInfo`)
for positions ``routes_from`` up to the last token the model consumed — every
prompt token and every sampled token but the last, which was never an input.

Weights: :meth:`Engine.load_weights` swaps the model's weights between two
forwards and bumps ``weights_version``; each request reports the version it
was admitted under. A request running across an update decodes its remaining
tokens with the new weights (not guaranteed to be one version; RL updates
weights between iterations, when none is running). Cached prefixes from older
weights are never reused.

Not done here (on purpose): chunked prefill (a long prompt's prefill delays
the other sequences' next token by its duration) and speculative decoding.
"""

from __future__ import annotations

import asyncio
import logging
import secrets
from collections import deque
from collections.abc import AsyncIterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import replace
from typing import Any

import torch

from agent.model.generation import (
    Completion, EngineError, EngineState, EngineStats, FinishInfo, FinishReason, GeneratedPiece, GenerationRequest,
    PromptTooLong, check_request,
)
from agent.model.model_runner import ModelRunner
from agent.model.prefix_cache import Placement, SlotTable
from agent.model.sampling import TextStream
from agent.model.tokenizer import SPECIAL_TOKENS

__all__ = [
    "END_TOKENS", "Completion", "Engine", "EngineError", "EngineState", "EngineStats", "FinishInfo", "FinishReason",
    "GeneratedPiece", "GenerationRequest", "PromptTooLong",
]

log = logging.getLogger(__name__)

END_TOKENS = SPECIAL_TOKENS  # every special token ends a sequence (see the module docstring)


class _Sequence:
    """Engine-side state of one request."""

    def __init__(self, request: GenerationRequest, text: TextStream, queue: asyncio.Queue[Any]):
        self.request = request
        self.text = text
        self.queue = queue
        self.generator = torch.Generator().manual_seed(
            request.seed if request.seed is not None else secrets.randbits(63)
        )
        self.slot = -1
        self.placement: Placement | None = None
        self.weights_version = 0
        self.generated: list[int] = []
        self.last_token = -1  # sampled, not yet fed to the model
        self.cancelled = False
        self.done = False


class Engine:
    def __init__(
        self, model: torch.nn.Module, tokenizer: Any, *, max_slots: int = 32, max_len: int | None = None,
        device: str | torch.device = "cpu", prefix_cache: bool = True, record_routes: bool = True,
    ):
        self.tokenizer = tokenizer
        self.max_slots = max_slots
        self.max_len = max_len or model.cfg.max_seq_len
        # the model, its KV cache and the recorded routes: the forward runs on the worker thread
        self.runner = ModelRunner(model, max_slots=max_slots, max_len=self.max_len, device=device,
                                  record_routes=record_routes)
        self.model, self.cfg, self.device, self.cache = (self.runner.model, self.runner.cfg, self.runner.device,
                                                         self.runner.cache)
        # equal-length prompts are prefilled together up to this many tokens per forward
        # (the forward materialises [B, T, vocab] logits, so this bounds its memory)
        self.max_prefill_tokens = max(4096, self.max_len)
        self._end_text = {i: t for t, i in ((t, _token_id(tokenizer, t)) for t in END_TOKENS) if i is not None}
        self.end_ids = frozenset(self._end_text)
        # a marker spelled out of ordinary tokens decodes to the same text: stop there too
        self._marker_stops = tuple(t for t in END_TOKENS if t not in ("<|pad|>", "<|eos|>"))
        self.stats = EngineStats()
        self.state = EngineState.NEW
        self.prefix_cache = prefix_cache
        self.slots = SlotTable(max_slots, enabled=prefix_cache)
        self.weights_version = 0
        self._waiting: deque[_Sequence] = deque()
        self._active: list[_Sequence] = []
        self._wake = asyncio.Event()
        self._task: asyncio.Task[None] | None = None
        self._worker: ThreadPoolExecutor | None = None

    # -- lifecycle ---------------------------------------------------------------

    async def start(self) -> None:
        """Start the loop on the running event loop (a no-op when already running).

        If the event loop the engine ran on is gone (``asyncio.run`` returned and
        cancelled its tasks), the engine starts afresh on this one; requests of
        the old loop are dropped.
        """
        if self.state is EngineState.RUNNING:
            assert self._task is not None
            if not self._task.done():
                if self._task.get_loop() is not asyncio.get_running_loop():
                    raise EngineError("the engine is running on another event loop")
                return
            self._active.clear()
            self._waiting.clear()
            self.slots = SlotTable(self.max_slots, enabled=self.prefix_cache)
            if self._worker is not None:
                self._worker.shutdown(wait=False)
        self._wake = asyncio.Event()
        self._worker = ThreadPoolExecutor(max_workers=1, thread_name_prefix="flywheel-engine")
        self._task = asyncio.create_task(self._loop(), name="flywheel-engine")
        self.state = EngineState.RUNNING

    async def stop(self) -> None:
        """Stop the loop; requests still running or waiting fail with :class:`EngineError`. Idempotent."""
        self.state = EngineState.STOPPED if self.state is not EngineState.NEW else EngineState.NEW
        if self._task is not None:
            self._task.cancel()
            try:
                await self._task
            except asyncio.CancelledError:
                pass
            self._task = None
        for seq in [*self._active, *self._waiting]:
            self._fail(seq, EngineError("the engine stopped"))
        self._active.clear()
        self._waiting.clear()
        self.slots = SlotTable(self.max_slots, enabled=self.prefix_cache)
        if self._worker is not None:
            # a cancelled step's forward may still be running on the worker: let it finish off the loop
            await asyncio.get_running_loop().run_in_executor(None, self._worker.shutdown)
            self._worker = None

    async def load_weights(self, state_dict: dict[str, torch.Tensor], version: int) -> None:
        """Load ``state_dict`` into the model between two forwards (on the model's
        thread) and make ``version`` current; cached prefixes are dropped.
        Raises :class:`EngineError` if the state dict does not fit the model
        (nothing is loaded then: ``load_state_dict`` checks keys before copying,
        and shapes are checked here first)."""
        problem = self.runner.weights_problem(state_dict)
        if problem is not None:
            raise EngineError(problem)
        if self._worker is not None and self.state is EngineState.RUNNING:
            await asyncio.get_running_loop().run_in_executor(self._worker, self.runner.load, state_dict)
        else:
            self.runner.load(state_dict)
        self.weights_version = version
        self.slots.invalidate()

    # -- requests ----------------------------------------------------------------

    async def generate(self, request: GenerationRequest) -> AsyncIterator[GeneratedPiece]:
        """Stream the pieces of one generation. Closing the iterator early frees its slot."""
        self.check(request)
        if self.state is not EngineState.RUNNING:
            raise EngineError(f"the engine is {self.state.value}: await engine.start() first")
        assert self._task is not None
        if self._task.get_loop() is not asyncio.get_running_loop():
            raise EngineError("the engine is running on another event loop")
        queue: asyncio.Queue[Any] = asyncio.Queue()
        seq = _Sequence(request, TextStream(self.tokenizer.decode, [*request.stop, *self._marker_stops]), queue)
        self._waiting.append(seq)
        self._wake.set()
        try:
            while True:
                item = await queue.get()
                if isinstance(item, BaseException):
                    raise item
                yield item
                if item.finish_reason is not None:
                    return
        finally:
            if not seq.done:
                seq.cancelled = True
                self._wake.set()

    async def complete(self, request: GenerationRequest) -> Completion:
        """Run one request to the end and return everything it produced."""
        text: list[str] = []
        ids: list[int] = []
        lps: list[float] = []
        finish: FinishReason = "length"
        info: FinishInfo | None = None
        async for piece in self.generate(request):
            text.append(piece.text)
            ids += piece.token_ids
            lps += piece.logprobs
            finish = piece.finish_reason or finish
            info = piece.info or info
        return Completion("".join(text), ids, lps, finish, len(request.prompt_ids), info)

    @property
    def free_slots(self) -> int:
        """Cache slots no sequence is using (their cached prefixes stay reusable)."""
        return self.slots.n_free

    def room(self, prompt_tokens: int) -> int:
        """How many tokens a prompt of ``prompt_tokens`` leaves for generation (may be <= 0)."""
        return self.max_len - prompt_tokens

    def fit(self, r: GenerationRequest) -> GenerationRequest:
        """``r`` checked (:meth:`check`), its ``max_tokens`` clamped to :meth:`room`.

        Without the clamp a request would still stop at the context's end
        (finish reason ``length``); clamping says so up front, so callers can
        report the limit they actually got."""
        self.check(r)
        room = self.room(len(r.prompt_ids))
        return r if r.max_tokens <= room else replace(r, max_tokens=room)

    def check(self, r: GenerationRequest) -> None:
        """Raise :class:`EngineError` if the engine cannot serve ``r`` (also done by :meth:`generate`)."""
        check_request(r, max_len=self.max_len, vocab_size=self.cfg.vocab_size,
                      records_routes=self.runner.records_routes)

    # -- the loop ----------------------------------------------------------------

    async def _loop(self) -> None:
        try:
            await self._serve()
        except Exception as exc:  # a bug in the loop must not leave callers waiting forever
            log.exception("the generation engine's loop failed")
            self.state = EngineState.STOPPED
            for seq in [*self._active, *self._waiting]:
                self._fail(seq, EngineError(f"the engine failed: {type(exc).__name__}: {exc}"))
            self._active.clear()
            self._waiting.clear()

    async def _serve(self) -> None:
        loop = asyncio.get_running_loop()
        while True:
            self._active = [s for s in self._active if not self._retire_if_cancelled(s)]
            admitted: list[_Sequence] = []
            while self._waiting and len(admitted) < self.slots.n_free:
                seq = self._waiting.popleft()
                if not seq.cancelled:
                    admitted.append(seq)
            while admitted:  # rounds: a prompt whose prefix a sibling is computing waits for it
                placed, deferred = [], []
                for seq in admitted:
                    placement = self.slots.acquire(seq.request.prompt_ids)
                    if placement is None:
                        deferred.append(seq)
                        continue
                    seq.slot, seq.placement, seq.weights_version = placement.slot, placement, self.weights_version
                    self._active.append(seq)
                    placed.append(seq)
                for group in self._prefill_groups(placed):
                    await self._run_step(loop, group, prefill=True)
                self.slots.end_round()
                admitted = deferred
            if not self._active:
                if not self._waiting:
                    self._wake.clear()
                    await self._wake.wait()
                continue
            await self._run_step(loop, list(self._active), prefill=False)

    def _prefill_groups(self, seqs: list[_Sequence]) -> list[list[_Sequence]]:
        """Prompts of equal length share one prefill forward (rows of one call share T),
        up to :attr:`max_prefill_tokens` tokens per forward; in arrival order."""
        groups: dict[int, list[list[_Sequence]]] = {}
        order: list[list[_Sequence]] = []
        for seq in seqs:
            assert seq.placement is not None
            n = len(seq.request.prompt_ids) - seq.placement.keep  # the tokens this prefill computes
            chunks = groups.setdefault(n, [])
            if not chunks or (len(chunks[-1]) + 1) * n > self.max_prefill_tokens:
                chunks.append([])
                order.append(chunks[-1])
            chunks[-1].append(seq)
        return order

    async def _run_step(self, loop: asyncio.AbstractEventLoop, seqs: list[_Sequence], *, prefill: bool) -> None:
        placements = [s.placement for s in seqs] if prefill else None
        tokens = [s.request.prompt_ids[s.placement.keep :] if prefill else [s.last_token] for s in seqs]  # type: ignore[union-attr]
        params = [(s.request.temperature, s.request.top_p, s.generator, s.request.logprobs_mode == "processed")
                  for s in seqs]
        slots = [s.slot for s in seqs]
        try:
            ids, lps = await loop.run_in_executor(self._worker, self.runner.forward, tokens, slots, params,
                                                  placements)
        except asyncio.CancelledError:
            raise
        except Exception as exc:  # a model error fails these requests, not the engine
            for s in seqs:
                self.slots.forget(s.slot)
                self._fail(s, EngineError(f"the model failed: {type(exc).__name__}: {exc}"))
            self._active = [s for s in self._active if s not in seqs]
            return
        for s, fed in zip(seqs, tokens, strict=True):
            self.slots.fed(s.slot, fed)
        if prefill:
            self.stats.prefills += 1
            self.stats.prefill_tokens += sum(map(len, tokens))
            self.stats.prompt_tokens += sum(len(s.request.prompt_ids) for s in seqs)
            self.stats.cached_tokens += sum(s.placement.keep for s in seqs)  # type: ignore[union-attr]
        else:
            self.stats.decode_steps += 1
            self.stats.decode_tokens += len(seqs)
            self.stats.max_batch = max(self.stats.max_batch, len(seqs))
        finished = [s for s, t, lp in zip(seqs, ids, lps, strict=True) if self._accept(s, t, lp)]
        if finished:
            self._active = [s for s in self._active if s not in finished]

    def _accept(self, seq: _Sequence, token: int, logprob: float) -> bool:
        """Record a sampled token, stream its piece; True when the sequence is over."""
        if seq.cancelled:
            self._release(seq)
            return True
        seq.generated.append(token)
        seq.last_token = token
        finish: FinishReason | None = None
        if token in self.end_ids:
            text, finish = seq.text.end(self._end_text[token]), "stop"
        else:
            text, stopped = seq.text.push(token)
            if stopped:
                finish = "stop"
            elif len(seq.generated) >= seq.request.max_tokens or (
                len(seq.request.prompt_ids) + len(seq.generated) >= self.max_len
            ):
                text, finish = text + seq.text.flush(), "length"
        info = self._finish_info(seq) if finish is not None else None
        seq.queue.put_nowait(GeneratedPiece(text, (token,), (logprob,), finish, info))
        if finish is not None:
            seq.done = True
            self._release(seq)
            return True
        return False

    def _finish_info(self, seq: _Sequence) -> FinishInfo:
        r = seq.request
        routes = None
        if r.return_routes and self.runner.records_routes:
            consumed = len(r.prompt_ids) + len(seq.generated) - 1  # the last sampled token was never an input
            routes = self.runner.routes_of(seq.slot, r.routes_from, consumed)
        keep = seq.placement.keep if seq.placement is not None else 0
        return FinishInfo(len(r.prompt_ids), keep, seq.weights_version, routes)

    def _retire_if_cancelled(self, seq: _Sequence) -> bool:
        if seq.cancelled:
            self._release(seq)
            return True
        return False

    def _release(self, seq: _Sequence) -> None:
        if seq.slot >= 0:
            self.slots.release(seq.slot)
            seq.slot = -1

    def _fail(self, seq: _Sequence, exc: Exception) -> None:
        seq.done = True
        self._release(seq)
        seq.queue.put_nowait(exc)


def _token_id(tokenizer: Any, token: str) -> int | None:
    """The id of a special token, or None if the tokenizer has no such single token."""
    try:
        return int(tokenizer.token_id(token))
    except KeyError:
        return None
