"""A policy that runs Flywheel's own model in-process (``local:CHECKPOINT``).

It renders nothing itself: it tokenises ``prompt.text`` — the conversation
flattened with the shared :data:`agent.prompt.CHAT_TEMPLATE` — and streams
from the batching :class:`agent.model.engine.Engine`. Every chunk carries
the sampled token ids and their logprobs (token-in/token-out), so RL never
re-tokenises. Many concurrent ``stream`` calls on one policy (RL rollouts)
are decoded together in one batch.

The engine's loop runs on the event loop of the ``stream`` calls: successive
loops (``asyncio.run`` per batch of rollouts) are fine, two loops at once are
not (:class:`PolicyError`). Logprobs are the model's (temperature-1)
logprobs whatever ``temperature`` is; see :func:`agent.model.sampling.sample`.

``prompt_profile`` is the checkpoint's :class:`agent.prompt.PromptProfile`
(``agent.model.checkpoint.load_profile``); the session factory renders
prompts with it. ``max_tokens`` is clamped to the room the prompt leaves in
the model's context; a prompt that leaves none is a :class:`PolicyError`
(the prompt is never truncated).
"""

from __future__ import annotations

import itertools
from collections.abc import AsyncIterator
from contextlib import aclosing
from pathlib import Path
from typing import Any

from agent.policy import PolicyChunk, PolicyError
from agent.prompt import CHAT_TEMPLATE, DEFAULT_PROFILE, PromptProfile, RenderedPrompt

TURN_STOPS = CHAT_TEMPLATE.turn_stops  # kept as a name for importers; the one definition is the template's


class LocalPolicy:
    name = "local"

    def __init__(
        self, checkpoint_dir: str | Path, *, temperature: float = 1.0, top_p: float = 1.0, max_tokens: int = 2048,
        max_slots: int = 32, device: str = "cpu", seed: int | None = None,
    ):
        from agent.model.checkpoint import load_checkpoint, load_profile

        path = Path(checkpoint_dir)
        if not path.is_dir():
            raise PolicyError(f"local policy: no checkpoint directory at {path}")
        try:
            profile = load_profile(path)
            model, tokenizer = load_checkpoint(path, device=device)
        except (OSError, ValueError) as exc:
            raise PolicyError(f"local policy: cannot load the checkpoint at {path}: {exc}") from exc
        from agent.model.engine import Engine

        self._init(Engine(model, tokenizer, max_slots=max_slots, device=device), temperature, top_p, max_tokens, seed,
                   profile)

    @classmethod
    def from_engine(
        cls, engine: Any, *, temperature: float = 1.0, top_p: float = 1.0, max_tokens: int = 2048,
        seed: int | None = None, prompt_profile: PromptProfile = DEFAULT_PROFILE,
    ) -> LocalPolicy:
        """A policy over an existing engine (shared by several policies, or built in a test)."""
        self = cls.__new__(cls)
        self._init(engine, temperature, top_p, max_tokens, seed, prompt_profile)
        return self

    def _init(self, engine: Any, temperature: float, top_p: float, max_tokens: int, seed: int | None,
              prompt_profile: PromptProfile) -> None:
        self.prompt_profile: PromptProfile = prompt_profile
        self.engine = engine
        self.tokenizer = engine.tokenizer
        self.temperature = temperature
        self.top_p = top_p
        self.max_tokens = max_tokens
        # a fixed seed makes the k-th stream of this policy reproducible
        self._seeds = itertools.count(seed) if seed is not None else None

    async def stream(self, prompt: RenderedPrompt) -> AsyncIterator[PolicyChunk]:
        from agent.model.engine import EngineError, GenerationRequest, PromptTooLong

        if not prompt.text:
            raise PolicyError("local policy: the rendered prompt has no text form")
        request = GenerationRequest(
            prompt_ids=self.tokenizer.encode(prompt.text), max_tokens=self.max_tokens,
            temperature=self.temperature, top_p=self.top_p, stop=list(TURN_STOPS),
            seed=next(self._seeds) if self._seeds is not None else None,
        )
        produced = 0
        try:
            request = self.engine.fit(request)  # max_tokens clamped to the context's room
            await self.engine.start()
            async with aclosing(self.engine.generate(request)) as pieces:
                async for piece in pieces:
                    produced += len(piece.token_ids)
                    yield PolicyChunk(
                        piece.text, token_ids=piece.token_ids, logprobs=piece.logprobs,
                        finish_reason=piece.finish_reason,
                        output_tokens=produced if piece.finish_reason is not None else None,
                    )
        except PromptTooLong as exc:
            raise PolicyError(
                f"local policy: {exc}. The conversation no longer fits this model's context (prompt profile "
                f"{self.prompt_profile.name!r}): start a new session, or use a checkpoint with a longer context"
            ) from None
        except EngineError as exc:
            raise PolicyError(f"local policy: {exc}") from None

    async def aclose(self) -> None:
        await self.engine.stop()
