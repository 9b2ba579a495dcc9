"""The inference actor: the policy's :class:`agent.model.engine.Engine` inside a Ray actor.

An async actor: every ``complete`` or ``generate`` call from every rollout
worker runs on the actor's one event loop, so the engine batches them all (continuous batching)
and its prefix cache sees every conversation. ``load_weights(state_dict,
version)`` swaps the weights between two forwards; each completion reports the
version that produced it (``Completion.info.weights_version``).

:class:`ActorCompleter` is the :class:`agent.policies.tito.StreamingCompleter` a
worker hands the token-in/token-out policy: it forwards a request to the actor
and streams its pieces back (a Ray streaming generator), so a rollout's tool
calls start the moment each is parsed, as when serving. To keep Ray's per-object
cost off every token, the actor coalesces the pieces that arrive within
``STREAM_INTERVAL_S`` into one (texts, ids and logprobs concatenated in order).
Not guaranteed: that a request running while
weights load was produced by one version (the driver loads weights between
iterations); failure of the actor process surfaces as an infrastructure error
in the rollout, not as a retry.
"""

from __future__ import annotations

import time
from collections.abc import AsyncIterator
from dataclasses import asdict
from pathlib import Path
from typing import Any

STREAM_INTERVAL_S = 0.02  # the actor sends at most one coalesced piece per request per interval


def coalesce(pieces: list[Any]) -> Any:
    """One ``GeneratedPiece`` holding ``pieces`` in order (the last one's finish reason and info)."""
    from agent.model.engine import GeneratedPiece

    if len(pieces) == 1:
        return pieces[0]
    return GeneratedPiece("".join(p.text for p in pieces), tuple(t for p in pieces for t in p.token_ids),
                          tuple(x for p in pieces for x in p.logprobs), pieces[-1].finish_reason, pieces[-1].info)


class InferenceServer:
    """The actor's class (wrap with ``ray.remote``; :func:`start_inference`).

    Built from a checkpoint directory (``agent.model.checkpoint``), so the
    actor serves exactly what ``flywheel policy serve`` would. ``slot_view_spread``
    overrides the model's (``MoETransformer.slot_view_spread``; 0 reads the KV cache
    by gather), for benchmarks that compare the two reads."""

    def __init__(self, checkpoint: str, *, max_slots: int = 32, max_len: int | None = None,
                 prefix_cache: bool = True, threads: int | None = None,
                 slot_view_spread: float | None = None) -> None:
        import torch

        from agent.model.checkpoint import load_checkpoint, load_profile
        from agent.model.engine import Engine

        if threads:
            torch.set_num_threads(threads)
        model, tokenizer = load_checkpoint(Path(checkpoint))
        if slot_view_spread is not None:  # 0 reads the KV cache by gather, as before the view existed
            model.slot_view_spread = slot_view_spread
        self.profile = load_profile(Path(checkpoint))
        self.tokenizer = tokenizer
        self.engine = Engine(model, tokenizer, max_slots=max_slots, max_len=max_len, prefix_cache=prefix_cache)

    async def complete(self, request: Any) -> Any:
        await self.engine.start()
        return await self.engine.complete(self.engine.fit(request))

    async def generate(self, request: Any) -> AsyncIterator[Any]:
        """The request's pieces, coalesced per ``STREAM_INTERVAL_S``; the last one finishes it."""
        from contextlib import aclosing

        await self.engine.start()
        held: list[Any] = []
        sent = time.monotonic()
        async with aclosing(self.engine.generate(self.engine.fit(request))) as pieces:
            async for piece in pieces:
                held.append(piece)
                now = time.monotonic()
                if piece.finish_reason is not None or now - sent >= STREAM_INTERVAL_S:
                    yield coalesce(held)
                    held, sent = [], now

    async def load_weights(self, state_dict: dict[str, Any], version: int) -> int:
        await self.engine.load_weights(state_dict, version)
        return version

    def weights_version(self) -> int:
        return self.engine.weights_version

    def settings(self) -> dict[str, Any]:
        """What this actor serves with: slots, prefix cache, and how the model reads its KV cache."""
        return {"max_slots": self.engine.max_slots, "prefix_cache": self.engine.prefix_cache,
                "slot_view_spread": self.engine.model.slot_view_spread}

    def stats(self) -> dict[str, int]:
        return asdict(self.engine.stats)

    def reset_stats(self) -> None:
        from agent.model.engine import EngineStats

        self.engine.stats = EngineStats()

    def peak_rss_mb(self) -> float:
        """This actor process's peak resident memory (Linux ``ru_maxrss``)."""
        import resource

        return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024

    def tokenizer_and_profile(self) -> tuple[Any, Any]:
        return self.tokenizer, self.profile

    async def stop(self) -> None:
        await self.engine.stop()


def start_inference(checkpoint: str | Path, *, num_cpus: float = 1, **kwargs: Any) -> Any:
    """Start the inference actor on the connected Ray cluster; returns its handle."""
    import ray

    actor = ray.remote(num_cpus=num_cpus, max_concurrency=1000)(InferenceServer)
    return actor.remote(str(checkpoint), **kwargs)


class ActorCompleter:
    """A token completer over an inference actor handle (see the module docstring)."""

    def __init__(self, actor: Any) -> None:
        self.actor = actor

    async def complete(self, request: Any) -> Any:
        return await self.actor.complete.remote(request)

    async def generate(self, request: Any) -> AsyncIterator[Any]:
        """Stream the actor's (coalesced) pieces; closing early cancels the request on the actor."""
        import ray

        refs = self.actor.generate.remote(request)
        try:
            async for ref in refs:
                piece = await ref
                yield piece
                if piece.finish_reason is not None:
                    return
        finally:
            if not refs.is_finished():
                ray.cancel(refs)
