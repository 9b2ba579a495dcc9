"""The local policy serves by the token-in/token-out rule RL samples with, one conversation per session.

Every test runs the real engine over a seeded tiny random model; :class:`RecordingEngine` keeps
the token ids each request sent the engine and the ids it sampled.
"""

from __future__ import annotations

import asyncio

import pytest

from agent.calls import render_results
from agent.model.engine import Engine
from agent.policies.local import LocalPolicy
from agent.policies.tito import EngineCompleter, TokenInTokenOutPolicy, next_prompt_suffix, output_tail
from agent.policy import Policy, PolicyError
from agent.prompt import COMPACT_PROFILE, Message, render_prompt
from agent.runtime import SessionParts, session_tools
from tests.agent.model.test_engine import tiny_tokenizer
from tests.agent.policies.test_tito import long_context_model
from tools.base import ToolResult

SPECS = [t.spec for t in session_tools(SessionParts(workspace=None))]  # type: ignore[arg-type]
Served = list[tuple[list[int], list[int]]]  # per request: its prompt ids, its sampled ids


@pytest.fixture(scope="module")
def tok():
    return tiny_tokenizer()


class RecordingEngine(Engine):
    """The real engine; ``served`` holds every request's prompt ids and the ids sampled for it."""

    def __init__(self, tok, seed: int = 1) -> None:
        super().__init__(long_context_model(tok, seed), tok, max_slots=4, max_len=2048)
        self.served: Served = []

    async def generate(self, request):
        out: list[int] = []
        self.served.append((list(request.prompt_ids), out))
        async for piece in super().generate(request):
            out += piece.token_ids
            yield piece


def local(engine: Engine, **kw) -> LocalPolicy:
    return LocalPolicy.from_engine(engine, max_tokens=8, seed=11, prompt_profile=COMPACT_PROFILE, **kw)


class Chat:
    """A session's side of a conversation: its messages, and per model call the rendered prompt
    and the model's message."""

    def __init__(self, user: str, specs=()) -> None:
        self.conv, self.specs = [Message("user", user)], list(specs)
        self.prompts: list[str] = []
        self.outputs: list[str] = []

    def prompt(self) -> str:
        return render_prompt(self.conv, self.specs, profile=COMPACT_PROFILE).text

    async def call(self, policy: Policy, then: Message | None = None) -> None:
        """One model call; its message is appended to the conversation, then ``then``."""
        self.prompts.append(self.prompt())
        prompt = render_prompt(self.conv, self.specs, profile=COMPACT_PROFILE)
        text = "".join([c.text async for c in policy.stream(prompt)])
        self.outputs.append(text)
        self.conv.append(Message("assistant", text))
        if then is not None:
            self.conv.append(then)


def tool_result(k: int) -> Message:
    output = f"    return a - b  # line {k}\n" if k % 2 else "def add(a, b):\n"
    return Message("tool", render_results([("read_file", 0, ToolResult(ok=True, output=output))]))


def assert_extends(tok, served: Served, chat: Chat, calls: list[int] | None = None) -> None:
    """Each of ``chat``'s requests (``served``; its model calls ``calls``, default all) is the previous
    one, its sampled ids, and the new prompt's suffix tokenised on its own: never re-tokenised."""
    calls = list(range(len(served))) if calls is None else calls
    for (j, (p0, o0)), (k, (p1, _)) in zip(zip(calls, served), zip(calls[1:], served[1:]), strict=False):
        held = chat.prompts[j] + chat.outputs[j]
        assert chat.prompts[k].startswith(held)  # (the rule checks the tail's marker too)
        tail = output_tail(tok, o0, chat.outputs[j])
        suffix = next_prompt_suffix(chat.prompts[j], chat.outputs[j], tail, chat.prompts[k]).text
        assert p1 == p0 + o0 + tok.encode(suffix)


async def test_serving_sends_the_engine_the_ids_an_rl_rollout_sends(tok) -> None:
    """The decisive test: same model, same seeds, a conversation with tool results between model
    calls -> served and RL send the engine the same requests, token for token."""
    runs: list[tuple[Served, Chat]] = []
    for make in (local, lambda e: TokenInTokenOutPolicy(EngineCompleter(e), tok, max_tokens=8, seed=11,
                                                        prompt_profile=COMPACT_PROFILE)):
        engine, chat = RecordingEngine(tok), Chat("fix add in app.py", SPECS)
        policy = make(engine)
        try:
            for k in range(4):
                await chat.call(policy, then=tool_result(k))
        finally:
            await engine.stop()
        runs.append((engine.served, chat))
        if isinstance(policy, LocalPolicy):
            assert policy.conversations_started == 1 and policy.conversations_evicted == 0
    (served, chat), (rl_served, rl_chat) = runs
    assert len(served) == len(rl_served) == 4 and all(chat.outputs)
    differ = [k for k, (ours, rl) in enumerate(zip(served, rl_served)) if ours[0] != rl[0]]
    assert not differ, f"model calls {differ} sent the engine other prompt ids than the RL rollout did"
    assert served == rl_served and chat.prompts == rl_chat.prompts
    assert_extends(tok, served, chat)
    # a case the old rule (tokenise the rendered text whole at every call) gets wrong: the model
    # sampled ids its text does not tokenise to, so re-tokenising would feed it other ids
    assert served[0][0] == tok.encode(chat.prompts[0])
    assert [p for p, _ in served[1:]] != [tok.encode(t) for t in chat.prompts[1:]]


async def test_interleaved_conversations_stay_separate_and_share_batches(tok) -> None:
    engine = RecordingEngine(tok)
    policy = local(engine)
    chats = [Chat("first task"), Chat("second task")]
    try:
        for step in range(3):
            await asyncio.gather(*(c.call(policy, then=tool_result(step)) for c in chats))  # decoded together
    finally:
        await engine.stop()
    assert policy.conversations_started == 2 and engine.stats.max_batch >= 2
    for chat in chats:
        mine = [s for s in engine.served if tok.decode(s[0]).startswith(chat.prompts[0])]
        assert len(mine) == 3
        assert_extends(tok, mine, chat)


async def test_an_edited_or_unrelated_prompt_starts_fresh(tok) -> None:
    engine = RecordingEngine(tok)
    policy = local(engine)
    chat, edited, other = Chat("hello"), Chat("hello, edited"), Chat("something else")
    try:
        await chat.call(policy, then=tool_result(0))
        await edited.call(policy)  # shares a prefix with chat, extends nothing: tokenised whole
        await other.call(policy)
        await chat.call(policy)  # the first conversation still extends
    finally:
        await engine.stop()
    assert policy.conversations_started == 3
    assert [p for p, _ in engine.served[:3]] == [tok.encode(c.prompts[0]) for c in (chat, edited, other)]
    assert_extends(tok, [engine.served[0], engine.served[3]], chat)


async def test_the_least_recently_used_conversation_is_evicted_and_the_bound_is_checked(tok) -> None:
    engine = RecordingEngine(tok)
    policy = local(engine, max_conversations=2)
    a, b, c = Chat("a"), Chat("b"), Chat("c")
    try:
        await a.call(policy, then=tool_result(0))
        await b.call(policy, then=tool_result(0))
        await a.call(policy, then=tool_result(1))  # a is now the most recent: b goes when c comes
        await c.call(policy, then=tool_result(0))
        assert policy.conversations_evicted == 1 and policy.conversations_started == 3
        await b.call(policy)  # evicted: starts fresh, tokenised whole (and a goes)
        assert engine.served[-1][0] == tok.encode(b.prompts[1]) and policy.conversations_started == 4
        await c.call(policy)  # c was kept
        assert policy.conversations_started == 4 and policy.conversations_evicted == 2
        assert_extends(tok, [engine.served[3], engine.served[5]], c)
    finally:
        await engine.stop()
    with pytest.raises(PolicyError, match="max_conversations must be at least 1"):
        local(engine, max_conversations=0)
