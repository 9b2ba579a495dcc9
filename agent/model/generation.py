"""What the generation engine (:mod:`agent.model.engine`) is asked and what it answers.

A :class:`GenerationRequest` (prompt token ids and sampling parameters) is
checked by :func:`check_request` against an engine's limits and answered as a
stream of :class:`GeneratedPiece` (one per sampled token), the last one with
its :class:`FinishInfo`; :class:`Completion` is the whole answer at once.
:class:`EngineError` (and :class:`PromptTooLong`) is a request the engine
cannot serve. These are plain data: importing them does not import torch.

Not guaranteed: :func:`check_request` checks the request's shape against the
limits it is given, not that the engine is running or has room now.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass, field
from typing import Literal

# what a token's reported logprob is: "raw" = the model's (temperature-1); "processed" = log_softmax(logits / T)
# of the distribution it was drawn from (top-p not applied)
LogprobsMode = Literal["raw", "processed"]

FinishReason = Literal["stop", "length"]


class EngineError(Exception):
    """A request the engine cannot serve (bad parameters, prompt too long, engine stopped)."""


class PromptTooLong(EngineError):
    """The prompt leaves no room in the sequence for even one generated token."""


@dataclass(frozen=True, slots=True)
class GenerationRequest:
    prompt_ids: list[int]
    max_tokens: int = 256
    temperature: float = 1.0  # 0 = greedy
    top_p: float = 1.0
    stop: list[str] = field(default_factory=list)  # on decoded text; the stop text is not emitted
    seed: int | None = None  # None: a random seed
    return_routes: bool = False  # report MoE routes on the last piece (needs record_routes)
    routes_from: int = 0  # ... for positions from here on (earlier ones the caller already has)
    # "raw": each token's logprob under the model (temperature 1); "processed": under the tempered
    # distribution it was drawn from (logits / temperature; top-p not applied) — what RL records
    logprobs_mode: LogprobsMode = "raw"


@dataclass(frozen=True, slots=True)
class GeneratedPiece:
    """One sampled token's worth of output. ``text`` may be empty (held back:
    a partial UTF-8 character or a possible stop prefix) and the last piece
    may carry only held-back text; ``finish_reason`` and ``info`` are set on the last piece."""

    text: str
    token_ids: tuple[int, ...] = ()
    logprobs: tuple[float, ...] = ()
    finish_reason: FinishReason | None = None
    info: FinishInfo | None = None


@dataclass(frozen=True, slots=True)
class FinishInfo:
    """What a finished request cost and which weights and experts served it.

    ``routes``: for positions ``routes_from .. prompt_tokens + generated - 2``
    (every token the model consumed from ``routes_from`` on), the expert ids
    per MoE layer, ``[n][n_layers][top_k]``; None unless requested."""

    prompt_tokens: int
    cached_tokens: int  # prompt tokens whose keys/values were reused, not computed
    weights_version: int
    routes: list[list[list[int]]] | None = None


@dataclass(frozen=True, slots=True)
class Completion:
    text: str
    token_ids: list[int]
    logprobs: list[float]
    finish_reason: FinishReason
    prompt_tokens: int
    info: FinishInfo | None = None


@dataclass(slots=True)
class EngineStats:
    prefills: int = 0
    prefill_tokens: int = 0
    decode_steps: int = 0
    decode_tokens: int = 0
    max_batch: int = 0  # most sequences decoded in one forward
    prompt_tokens: int = 0  # prompt tokens admitted (computed + cached)
    cached_tokens: int = 0  # prompt tokens reused from the prefix cache


class EngineState(enum.Enum):
    NEW = "new"
    RUNNING = "running"
    STOPPED = "stopped"


def check_request(r: GenerationRequest, *, max_len: int, vocab_size: int, records_routes: bool) -> None:
    """Raise :class:`EngineError` if an engine holding ``max_len`` tokens per sequence, with a
    ``vocab_size``-token vocabulary (and routes recorded or not), cannot serve ``r``."""
    n = len(r.prompt_ids)
    if n == 0:
        raise EngineError("the prompt is empty: give at least one token")
    if n >= max_len:
        raise PromptTooLong(
            f"the prompt is {n} tokens; this engine holds {max_len} tokens per sequence "
            f"(prompt + output), so prompts must be at most {max_len - 1}"
        )
    if any(not 0 <= t < vocab_size for t in r.prompt_ids):
        raise EngineError(f"prompt token ids must be in [0, {vocab_size})")
    if r.return_routes and not records_routes:
        raise EngineError("return_routes needs an engine built with record_routes=True")
    if not 0 <= r.routes_from <= n:
        raise EngineError(f"routes_from must be in [0, {n}] (the prompt's length)")
    if r.max_tokens < 1:
        raise EngineError("max_tokens must be at least 1")
    if not r.temperature >= 0:
        raise EngineError("temperature must be >= 0")
    if not 0 < r.top_p <= 1:
        raise EngineError("top_p must be in (0, 1]")
    if r.logprobs_mode not in ("raw", "processed"):
        raise EngineError(f"logprobs_mode must be 'raw' or 'processed', not {r.logprobs_mode!r}")
