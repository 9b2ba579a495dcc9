"""The ``Policy`` protocol: given a rendered conversation, stream text.

Policies are the only thing that differs between a developer's session, an RL
rollout and a replay; everything downstream of the stream is shared.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Protocol, runtime_checkable

from agent.prompt import RenderedPrompt


class PolicyError(Exception):
    """The policy could not produce output (server down, script exhausted...).

    The message is written for the operator; the session reports it as an
    ``error`` event and ends the turn.
    """


@dataclass(frozen=True, slots=True)
class PolicyChunk:
    """A piece of the model's output.

    Local policies fill ``token_ids`` and ``logprobs`` (one per token, aligned)
    so RL never re-tokenises. Remote policies may report ``output_tokens`` on
    their last chunk (server-side usage); otherwise the session estimates.
    """

    text: str
    token_ids: tuple[int, ...] = ()
    logprobs: tuple[float, ...] = ()
    output_tokens: int | None = None
    finish_reason: str | None = None


@runtime_checkable
class Policy(Protocol):
    name: str

    def stream(self, prompt: RenderedPrompt) -> AsyncIterator[PolicyChunk]:
        """Stream one model response to ``prompt``. Raises :class:`PolicyError`."""
        ...

    async def aclose(self) -> None: ...
