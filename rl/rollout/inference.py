"""The inference actor: the policy's :class:`agent.model.engine.Engine` inside a Ray actor.

An async actor: every ``complete`` call from every rollout worker runs on the
actor's one event loop, so the engine batches them all (continuous batching)
and its prefix cache sees every conversation. ``load_weights(state_dict,
version)`` swaps the weights between two forwards; each completion reports the
version that produced it (``Completion.info.weights_version``).

:class:`ActorCompleter` is the :class:`agent.policies.tito.TokenCompleter` a
worker hands the token-in/token-out policy: it forwards a request to the actor
and awaits its completion. Not guaranteed: that a request running while
weights load was produced by one version (the driver loads weights between
iterations); failure of the actor process surfaces as an infrastructure error
in the rollout, not as a retry.
"""

from __future__ import annotations

from dataclasses import asdict
from pathlib import Path
from typing import Any


class InferenceServer:
    """The actor's class (wrap with ``ray.remote``; :func:`start_inference`).

    Built from a checkpoint directory (``agent.model.checkpoint``), so the
    actor serves exactly what ``flywheel policy serve`` would."""

    def __init__(self, checkpoint: str, *, max_slots: int = 32, max_len: int | None = None,
                 prefix_cache: bool = True, threads: int | None = None) -> None:
        import torch

        from agent.model.checkpoint import load_checkpoint, load_profile
        from agent.model.engine import Engine

        if threads:
            torch.set_num_threads(threads)
        model, tokenizer = load_checkpoint(Path(checkpoint))
        self.profile = load_profile(Path(checkpoint))
        self.tokenizer = tokenizer
        self.engine = Engine(model, tokenizer, max_slots=max_slots, max_len=max_len, prefix_cache=prefix_cache)

    async def complete(self, request: Any) -> Any:
        await self.engine.start()
        return await self.engine.complete(self.engine.fit(request))

    async def load_weights(self, state_dict: dict[str, Any], version: int) -> int:
        await self.engine.load_weights(state_dict, version)
        return version

    def weights_version(self) -> int:
        return self.engine.weights_version

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
