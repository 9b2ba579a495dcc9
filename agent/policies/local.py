"""A policy that runs Flywheel's own model in-process (``local:CHECKPOINT``).

It serves by the token-in/token-out rule RL samples with
(:class:`agent.policies.tito.TokenInTokenOutPolicy`), so a served model is fed,
token for token, the sequences an RL rollout of the same conversation would
feed it — never ``prompt.text`` re-tokenised whole (BPE is not
compositional: the ids the model sampled need not be the ids their text
tokenises to).

``Policy.stream`` carries no conversation id, and one policy serves many
conversations at once (several chat sessions, or a batch of rollouts,
decoded together in one engine batch). So the policy keeps a table of live
conversations, each a :class:`TokenInTokenOutPolicy` over the shared engine
(its token ids and the text they render to). A prompt extends the conversation
whose text is the longest prefix of it by :func:`agent.policies.tito.next_prompt_suffix`
(only the new suffix is tokenised); a prompt that extends none — the first
call of a session, an edited or resumed conversation — starts a fresh one,
tokenised whole, exactly as the first call of a rollout is. A conversation
is out of the table while a call on it streams (two concurrent prompts never
share one), and back at its end. The table holds at most ``max_conversations``
idle conversations (default :data:`MAX_CONVERSATIONS`), least recently used
evicted first; an evicted conversation's next prompt starts fresh.
``conversations_started`` and ``conversations_evicted`` count both.

Not guaranteed: that a conversation resumed after an eviction, a restart or
an edit is fed the ids it was fed before (it is re-tokenised from its text
once, then extended token-in/token-out again); which of two live
conversations that render to the same text a prompt extends (their sampled
ids may differ).

The engine's loop runs on the event loop of the ``stream`` calls: successive
loops (``asyncio.run`` per batch of rollouts) are fine, two loops at once are
not (:class:`PolicyError`). Logprobs are the model's (temperature-1)
logprobs whatever ``temperature`` is; see :func:`agent.model.sampling.sample`.

``prompt_profile`` is the checkpoint's :class:`agent.prompt.PromptProfile`
(``agent.model.checkpoint.load_profile``); the session factory renders
prompts with it. ``max_tokens`` is clamped to the room the prompt leaves in
the model's context; a prompt that leaves none is a :class:`PolicyError`
(the prompt is never truncated). A fixed ``seed`` makes the k-th stream of
the policy reproducible, whichever conversation it extends.
"""

from __future__ import annotations

import itertools
from collections.abc import AsyncIterator
from contextlib import aclosing
from pathlib import Path
from typing import Any

from agent.policies.tito import EngineCompleter, TokenInTokenOutPolicy
from agent.policy import PolicyChunk, PolicyError
from agent.prompt import DEFAULT_PROFILE, PromptProfile, RenderedPrompt

MAX_CONVERSATIONS = 64  # idle conversations kept; a few MB of token ids at most


class LocalPolicy:
    name = "local"

    def __init__(
        self, checkpoint_dir: str | Path, *, temperature: float = 1.0, top_p: float = 1.0, max_tokens: int = 2048,
        max_slots: int = 32, device: str = "cpu", seed: int | None = None,
        max_conversations: int = MAX_CONVERSATIONS,
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
                   profile, max_conversations)

    @classmethod
    def from_engine(
        cls, engine: Any, *, temperature: float = 1.0, top_p: float = 1.0, max_tokens: int = 2048,
        seed: int | None = None, prompt_profile: PromptProfile = DEFAULT_PROFILE,
        max_conversations: int = MAX_CONVERSATIONS,
    ) -> LocalPolicy:
        """A policy over an existing engine (shared by several policies, or built in a test)."""
        self = cls.__new__(cls)
        self._init(engine, temperature, top_p, max_tokens, seed, prompt_profile, max_conversations)
        return self

    def _init(self, engine: Any, temperature: float, top_p: float, max_tokens: int, seed: int | None,
              prompt_profile: PromptProfile, max_conversations: int) -> None:
        if max_conversations < 1:
            raise PolicyError(f"local policy: max_conversations must be at least 1, not {max_conversations}")
        self.prompt_profile: PromptProfile = prompt_profile
        self.engine = engine
        self.tokenizer = engine.tokenizer
        self.temperature = temperature
        self.top_p = top_p
        self.max_tokens = max_tokens
        self.max_conversations = max_conversations
        self.conversations_started = 0
        self.conversations_evicted = 0
        self._completer = EngineCompleter(engine)
        # one seed sequence for every conversation: the k-th stream of this policy is reproducible
        self._seeds = itertools.count(seed) if seed is not None else None
        self._idle: list[TokenInTokenOutPolicy] = []  # least recently used first

    def _checkout(self, text: str) -> TokenInTokenOutPolicy:
        """The idle conversation ``text`` extends furthest (the most recent of equals), taken
        out of the table; else a fresh one."""
        best, held = None, -1
        for i, conv in enumerate(self._idle):
            n = conv.extends(text)
            if n is not None and n >= held:
                best, held = i, n
        if best is not None:
            return self._idle.pop(best)
        self.conversations_started += 1
        return TokenInTokenOutPolicy(
            self._completer, self.tokenizer, prompt_profile=self.prompt_profile, max_tokens=self.max_tokens,
            temperature=self.temperature, top_p=self.top_p, seeds=self._seeds, label="local policy",
        )

    def _checkin(self, conv: TokenInTokenOutPolicy) -> None:
        if not conv.held:  # its first call failed: nothing to extend
            return
        self._idle.append(conv)
        while len(self._idle) > self.max_conversations:
            self._idle.pop(0)
            self.conversations_evicted += 1

    async def stream(self, prompt: RenderedPrompt) -> AsyncIterator[PolicyChunk]:
        if not prompt.text:
            raise PolicyError("local policy: the rendered prompt has no text form")
        conv = self._checkout(prompt.text)
        try:
            async with aclosing(conv.stream(prompt)) as chunks:
                async for chunk in chunks:
                    yield chunk
        finally:
            self._checkin(conv)

    async def aclose(self) -> None:
        await self.engine.stop()
