"""Token-in/token-out: a policy whose conversation is kept as token ids, never re-tokenised.

BPE is not compositional: the ids of ``prompt + sampled text`` tokenised whole
need not be the ids the engine consumed and sampled, so a policy that
re-tokenised the rendered prompt at every model call would show the model a
sequence it never sampled, and a trainer that re-tokenised would train on one.
:class:`TokenInTokenOutPolicy` instead keeps the full token sequence the engine
has consumed and produced so far and, at each model call:

1. checks that the new rendered text extends the previous prompt text plus
   the text the model produced (``render_prompt`` is append-only for a fixed
   profile and tool set) — else :class:`PolicyError`, never a silent
   re-tokenisation;
2. tokenises only the new suffix (the tool results or the next user message,
   with their template markers) and sends ``held tokens + suffix ids`` to the
   engine, whose prefix cache then computes only the suffix.

Both steps are :func:`next_prompt_suffix`, the one implementation of the rule:
the SFT demonstrations (``rl.train.demos``) use it too, with
:func:`scripted_output_ids` for the sampled ids, so SFT trains on the token
sequences this policy builds. RL rollouts run one such policy per rollout;
serving (``local:CHECKPOINT``, :class:`agent.policies.local.LocalPolicy`) keeps
a table of them, one per live conversation, so a served model is fed exactly
the sequences RL trains it on.

End-of-message markers: the engine's sampled ids include the token that
ended the message (see :mod:`agent.model.engine`); their text beyond the
message (the *tail*, normally ``"\\n<|end|>"``) is what the rendered prompt
puts after the message, so the suffix starts after it — no marker is
duplicated or dropped. A message the model ended with a bare marker
(``<|end|>`` without the newline, or another role marker) keeps the model's
own token; the template's ``"\\n<|end|>"`` is then not appended again
(``marker_fixups`` counts these: the one case where the token sequence and
the rendered text differ, by that newline). A message cut by the token limit
has no tail; the template's end marker is appended as consumed tokens.

:attr:`segments` is the rollout's token sequence as :class:`rl.types.Segment`-shaped
records (consumed vs sampled, logprobs, MoE routes when requested): their
concatenation is exactly the last request's prompt plus its output.

The generator behind the policy is a :class:`TokenCompleter` — the engine
itself (:class:`agent.model.engine.Engine`) or the RL inference actor. A
completer that also has ``generate`` (:class:`StreamingCompleter`: the engine,
the actor's :class:`rl.rollout.inference.ActorCompleter`) is streamed, so a
step's tool calls start the moment each is parsed, as they do when serving;
one with only ``complete`` arrives as one chunk. Both give the same segments
for the same sampled ids (tested). Not guaranteed: use across two
conversations (one policy per session); how finely a stream is split into
chunks (the actor coalesces pieces).
"""

from __future__ import annotations

import itertools
from collections.abc import AsyncIterator, Iterator, Sequence
from contextlib import aclosing
from dataclasses import dataclass, field
from typing import Any, Protocol

from agent.model.generation import LogprobsMode
from agent.policy import PolicyChunk, PolicyError
from agent.prompt import CHAT_TEMPLATE, DEFAULT_PROFILE, PromptProfile, RenderedPrompt


class TokenCompleter(Protocol):
    """Runs one generation request (``agent.model.engine.GenerationRequest``) to its end."""

    async def complete(self, request: Any) -> Any: ...  # -> agent.model.engine.Completion


class StreamingCompleter(TokenCompleter, Protocol):
    """A completer that can also stream a request's pieces (``agent.model.engine.GeneratedPiece``;
    the last one carries ``finish_reason`` and ``info``). Closing the iterator early frees the request."""

    def generate(self, request: Any) -> AsyncIterator[Any]: ...


@dataclass(slots=True)
class TokenSegment:
    """One run of the sequence; the same fields as ``rl.types.Segment`` (agent/ cannot import rl/)."""

    token_ids: list[int]
    sampled: bool
    logprobs: list[float] = field(default_factory=list)
    routes: list[list[list[int]]] | None = None


_MESSAGE_END = "\n" + CHAT_TEMPLATE.end.rstrip("\n")  # what the template puts after an assistant message


@dataclass(frozen=True, slots=True)
class PromptSuffix:
    """What a rendered prompt adds to the token sequence after a model call (:func:`next_prompt_suffix`)."""

    text: str  # to tokenise on its own and append (may be empty)
    marker_fixup: bool  # the model's own end marker stood in for the template's ``"\n<|end|>"``


def next_prompt_suffix(prev_prompt: str, output: str, tail: str, next_prompt: str, *,
                       markers: Sequence[str] | None = None) -> PromptSuffix:
    """The one rule for extending a token sequence with the next rendered prompt.

    ``prev_prompt`` is the previous model call's rendered prompt, ``output`` the message the
    model produced for it (its streamed text), ``tail`` the text its sampled ids decode to
    beyond ``output`` (:func:`output_tail`: normally ``"\\n<|end|>"``, empty for a message cut
    by the token limit). ``next_prompt`` must start with ``prev_prompt + output``; then:

    * if it continues with ``tail``, the suffix is what follows ``tail`` (the sampled end
      marker is the template's: neither duplicated nor dropped);
    * else if ``tail`` ends with one of ``markers`` (default: the tokenizer's special tokens)
      and it continues with the template's ``"\\n<|end|>"``, the suffix is what follows that,
      with ``marker_fixup`` set (the model's own marker stands for the template's);
    * else :class:`PolicyError`, saying where the texts part — never a silent re-tokenisation.

    Used by :class:`TokenInTokenOutPolicy` at every model call and by the SFT demonstrations
    (``rl.train.demos.demo_segments``), so that SFT trains on the sequences the RL sampler
    builds. Not guaranteed: that the suffix tokenises at a token boundary; the template puts a
    special token (where the tokenizer always splits) at every boundary this rule produces.
    """
    if markers is None:
        from agent.model.tokenizer import SPECIAL_TOKENS

        markers = SPECIAL_TOKENS
    held = prev_prompt + output
    if not next_prompt.startswith(held):
        at = next((i for i, (a, b) in enumerate(zip(next_prompt, held)) if a != b), min(len(next_prompt), len(held)))
        raise PolicyError(
            f"token-in/token-out: the rendered prompt does not extend the previous prompt and the model's "
            f"output (first difference at character {at}: expected {held[at:at + 40]!r}, got "
            f"{next_prompt[at:at + 40]!r}); the prompt rendering must be append-only (same profile and tools). "
            "Start a new policy for a new conversation"
        )
    cont = next_prompt[len(held) :]
    if cont.startswith(tail):
        return PromptSuffix(cont[len(tail) :], marker_fixup=False)
    if any(tail.endswith(m) for m in markers) and cont.startswith(_MESSAGE_END):
        return PromptSuffix(cont[len(_MESSAGE_END) :], marker_fixup=True)
    raise PolicyError(
        f"token-in/token-out: the model's message ended with {tail!r}, which the rendered "
        f"prompt does not continue with (it continues {cont[:40]!r}); cannot extend the token "
        "sequence without re-tokenising"
    )


def output_tail(tokenizer: Any, token_ids: Sequence[int], text: str) -> str:
    """The text ``token_ids`` decode to beyond the message ``text`` (its end marker, normally
    ``"\\n<|end|>"``). Raises :class:`PolicyError` if they do not decode to ``text`` first."""
    decoded = tokenizer.decode(token_ids)
    if not decoded.startswith(text):
        raise PolicyError(
            f"token-in/token-out policy: the sampled ids decode to {decoded[:60]!r}, which does not start "
            f"with the streamed text {text[:60]!r}"
        )
    return decoded[len(text) :]


def scripted_output_ids(text: str, tokenizer: Any) -> list[int]:
    """The ids a scripted model "samples" for the message ``text``: ``text + "\\n"`` encoded, then
    ``<|end|>`` — what a model that ended the message with the template's marker produced.
    Shared by :class:`ScriptedCompleter` and the SFT demonstrations. Not guaranteed: that a real
    model tokenises its own messages this way (BPE has several encodings of one text)."""
    return [*tokenizer.encode(text + "\n"), tokenizer.end_id]


class EngineCompleter:
    """A :class:`StreamingCompleter` over an in-process :class:`agent.model.engine.Engine`: each
    request's ``max_tokens`` clamped to the room its prompt leaves (``Engine.fit``; a prompt with
    none is ``PromptTooLong``), the engine started on the caller's event loop if it is not running."""

    def __init__(self, engine: Any) -> None:
        self.engine = engine

    async def complete(self, request: Any) -> Any:
        request = self.engine.fit(request)
        await self.engine.start()
        return await self.engine.complete(request)

    async def generate(self, request: Any) -> AsyncIterator[Any]:
        request = self.engine.fit(request)
        await self.engine.start()
        async with aclosing(self.engine.generate(request)) as pieces:
            async for piece in pieces:
                yield piece


class TokenInTokenOutPolicy:
    """One conversation as token ids (see the module docstring).

    ``seed``: the first request's seed, then one more per request (None: random). ``seeds``
    instead draws them from an iterator shared with other policies (``LocalPolicy`` shares one
    across its conversations, so its k-th stream is reproducible). ``label`` starts every error
    message (``"local policy"`` when serving).
    """

    name = "tito"

    def __init__(
        self, completer: TokenCompleter, tokenizer: Any, *, prompt_profile: PromptProfile = DEFAULT_PROFILE,
        max_tokens: int = 512, temperature: float = 1.0, top_p: float = 1.0, seed: int | None = None,
        return_routes: bool = False, special_tokens: tuple[str, ...] | None = None,
        seeds: Iterator[int] | None = None, label: str = "token-in/token-out policy",
        logprobs_mode: LogprobsMode = "raw",
    ) -> None:
        from agent.model.tokenizer import SPECIAL_TOKENS

        self.completer = completer
        self.tokenizer = tokenizer
        self.prompt_profile = prompt_profile
        self.max_tokens, self.temperature, self.top_p = max_tokens, temperature, top_p
        self.return_routes = return_routes
        self.logprobs_mode = logprobs_mode  # GenerationRequest.logprobs_mode ("processed": RL at T != 1)
        self.label = label
        self._seeds = seeds if seeds is not None else itertools.count(seed) if seed is not None else None
        self._specials = special_tokens or SPECIAL_TOKENS
        self.segments: list[TokenSegment] = []
        self.held: list[int] = []  # every token the engine consumed or produced, in order
        self._prompt_text = ""  # the last rendered prompt
        self._output_text = ""  # the model's message in answer to it (its streamed text)
        self._tail = ""  # the text of the sampled ids beyond the message (its end marker)
        self._routes: list[list[list[int]]] = []  # per consumed position, when return_routes
        self.model_calls = 0
        self.marker_fixups = 0
        self.weights_versions: list[int] = []

    # -- the suffix --------------------------------------------------------------

    def extends(self, text: str) -> int | None:
        """How many characters of the rendered prompt ``text`` this conversation already holds
        (its last prompt and the model's message), if :meth:`stream` would accept ``text`` as
        its next prompt (:func:`next_prompt_suffix`); None if it would not. 0 before the first
        call (any prompt starts a conversation)."""
        if not self.held:
            return 0
        try:
            next_prompt_suffix(self._prompt_text, self._output_text, self._tail, text, markers=self._specials)
        except PolicyError:
            return None
        return len(self._prompt_text) + len(self._output_text)

    def _new_ids(self, text: str) -> list[int]:
        if not self.held:
            return list(self.tokenizer.encode(text))
        suffix = next_prompt_suffix(self._prompt_text, self._output_text, self._tail, text, markers=self._specials)
        self.marker_fixups += suffix.marker_fixup
        return list(self.tokenizer.encode(suffix.text)) if suffix.text else []

    # -- Policy ------------------------------------------------------------------

    async def stream(self, prompt: RenderedPrompt) -> AsyncIterator[PolicyChunk]:
        from agent.model.engine import EngineError, GenerationRequest, PromptTooLong

        if not prompt.text:
            raise PolicyError(f"{self.label}: the rendered prompt has no text form")
        new = self._new_ids(prompt.text)
        ids = self.held + new
        request = GenerationRequest(
            prompt_ids=ids, max_tokens=self.max_tokens, temperature=self.temperature, top_p=self.top_p,
            stop=list(CHAT_TEMPLATE.turn_stops), seed=next(self._seeds) if self._seeds is not None else None,
            return_routes=self.return_routes, routes_from=len(self._routes) if self.return_routes else 0,
            logprobs_mode=self.logprobs_mode,
        )
        generate = getattr(self.completer, "generate", None)
        text: list[str] = []
        out_ids: list[int] = []
        lps: list[float] = []
        last: Any = None  # what the last chunk carries: the finishing piece, or the whole completion
        try:
            if generate is None:
                last = await self.completer.complete(request)
                text, out_ids, lps = [last.text], list(last.token_ids), list(last.logprobs)
            else:
                async with aclosing(generate(request)) as pieces:
                    async for piece in pieces:
                        text.append(piece.text)
                        out_ids += piece.token_ids
                        lps += piece.logprobs
                        if piece.finish_reason is not None:
                            last = piece
                            break
                        if piece.text or piece.token_ids:
                            yield PolicyChunk(piece.text, token_ids=tuple(piece.token_ids),
                                              logprobs=tuple(piece.logprobs))
                if last is None:
                    raise EngineError("the stream ended without a finished piece")
        except PromptTooLong as exc:
            raise PolicyError(
                f"{self.label}: {exc}. The conversation no longer fits this model's context (prompt profile "
                f"{self.prompt_profile.name!r}): start a new session, or use a checkpoint with a longer context"
            ) from None
        except EngineError as exc:
            raise PolicyError(f"{self.label}: {exc}") from None
        except GeneratorExit:
            # the session stopped reading mid-stream (e.g. too many calls in one step): the message
            # is what it read, so the sequence is too — minus sampled ids whose text it never saw
            self._record(prompt.text, ids, new, "".join(text), out_ids, lps, None, partial=True)
            raise
        # the bookkeeping comes before the last chunk, so a consumer that stops at it still leaves the
        # policy ready for the next request
        self._record(prompt.text, ids, new, "".join(text), out_ids, lps, getattr(last, "info", None))
        yield PolicyChunk(last.text, token_ids=tuple(last.token_ids), logprobs=tuple(last.logprobs),
                          output_tokens=len(out_ids), finish_reason=last.finish_reason)

    def _record(self, prompt_text: str, ids: list[int], new: list[int], full: str, out_ids: list[int],
                lps: list[float], info: Any, *, partial: bool = False) -> None:
        """Append one model call (its prompt's new ids and its sampled ids) to the sequence."""
        if partial:
            while out_ids and self.tokenizer.decode(out_ids) != full \
                    and self.tokenizer.decode(out_ids[:-1]).startswith(full):
                out_ids, lps = out_ids[:-1], lps[:-1]
        tail = output_tail(self.tokenizer, out_ids, full)
        if new or not self.segments:
            self.segments.append(TokenSegment(new if self.held else ids, sampled=False))
        self.segments.append(TokenSegment(out_ids, sampled=True, logprobs=lps))
        self.held = ids + out_ids
        self._prompt_text, self._output_text, self._tail = prompt_text, full, tail
        self.model_calls += 1
        if info is not None:
            self.weights_versions.append(info.weights_version)
            if self.return_routes and info.routes is not None:
                self._routes += info.routes

    def routed_segments(self) -> list[TokenSegment]:
        """:attr:`segments` with their MoE routes filled in (``return_routes=True``):
        per token ``[n_layers][top_k]`` expert ids; the final token, never an
        input, gets ``-1`` entries (route it freely when replaying)."""
        if not self.return_routes:
            return list(self.segments)
        out, pos = [], 0
        blank = [[-1] * len(self._routes[0][0])] * len(self._routes[0]) if self._routes else []
        for seg in self.segments:
            n = len(seg.token_ids)
            routes = [self._routes[i] if i < len(self._routes) else blank for i in range(pos, pos + n)]
            out.append(TokenSegment(seg.token_ids, seg.sampled, seg.logprobs, routes))
            pos += n
        return out

    async def aclose(self) -> None:
        return None


class ScriptedCompleter:
    """A :class:`TokenCompleter` that returns recorded model outputs, one per request,
    as the token ids the tokenizer gives them plus the ``<|end|>`` token (logprob 0).

    The token counterpart of :class:`agent.policies.scripted.ScriptedPolicy`:
    it drives the real session loop, parser and tools through the
    token-in/token-out path without a trained model (tests, demonstrations).
    ``requests`` records every request it served.
    """

    def __init__(self, outputs: list[str], tokenizer: Any) -> None:
        self.outputs = list(outputs)
        self.tokenizer = tokenizer
        self.requests: list[Any] = []
        self.completions: list[Any] = []

    async def complete(self, request: Any) -> Any:
        from agent.model.engine import Completion, EngineError

        if len(self.requests) >= len(self.outputs):
            raise EngineError(f"the script has no output left (it had {len(self.outputs)})")
        text = self.outputs[len(self.requests)]
        self.requests.append(request)
        ids = scripted_output_ids(text, self.tokenizer)
        done = Completion(text, ids, [0.0] * len(ids), "stop", len(request.prompt_ids))
        self.completions.append(done)
        return done
