"""Token-in/token-out: the segments are exactly what the engine consumed and produced."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from agent.events import ListSink, ToolResultEvent
from agent.model.engine import Engine, GenerationRequest
from agent.parser import encode_call as call
from agent.policies.tito import ScriptedCompleter, TokenInTokenOutPolicy
from agent.policy import PolicyError
from agent.prompt import COMPACT_PROFILE, Message, render_prompt
from agent.runtime import SessionParts, build_session, session_tools
from agent.model.config import ModelConfig
from agent.model.transformer import MoETransformer
from tests.agent.model.test_engine import tiny_tokenizer
from tools.workspace import WorkspaceStore


@pytest.fixture(scope="module")
def tok():
    return tiny_tokenizer()


@pytest.fixture
def workspace(tmp_path: Path):
    src = tmp_path / "src"
    src.mkdir()
    (src / "app.py").write_text("def add(a, b):\n    return a - b\n")
    (src / "util.py").write_text("X = 1\n")
    return WorkspaceStore(tmp_path / "store").from_dir(src)


def long_context_model(tok, seed: int = 1) -> MoETransformer:
    """The tiny preset with room for a rendered prompt; role markers masked (as in test_engine.tiny_model)."""
    torch.manual_seed(seed)
    model = MoETransformer(ModelConfig.preset("tiny", vocab_size=tok.vocab_size, max_seq_len=2048)).eval()
    masked = [i for t, i in tok.special_ids.items() if t not in ("<|end|>", "<|eos|>")]

    def no_markers(_module, _inputs, logits):
        logits[..., masked] = float("-inf")
        return logits

    model.lm_head.register_forward_hook(no_markers)
    return model


class RecordingEngine:
    """The real engine, with every request and completion it served kept (the engine's side of the record)."""

    def __init__(self, engine: Engine) -> None:
        self.engine = engine
        self.served: list[tuple[list[int], list[int]]] = []

    async def complete(self, request: GenerationRequest):
        await self.engine.start()
        done = await self.engine.complete(self.engine.fit(request))
        self.served.append((list(request.prompt_ids), list(done.token_ids)))
        return done


def assert_exact(policy: TokenInTokenOutPolicy, served: list[tuple[list[int], list[int]]]) -> None:
    seq = [t for s in policy.segments for t in s.token_ids]
    last_prompt, last_out = served[-1]
    assert seq == last_prompt + last_out  # the trainer's sequence is the engine's, token for token
    for (p0, o0), (p1, _) in zip(served, served[1:], strict=False):
        assert p1[: len(p0) + len(o0)] == p0 + o0  # each request extends the previous one, never re-tokenised
    sampled = [s.token_ids for s in policy.segments if s.sampled]
    assert sampled == [o for _, o in served]
    for s in policy.segments:
        assert len(s.logprobs) == (len(s.token_ids) if s.sampled else 0)


async def test_multi_step_tool_calls_extend_the_token_sequence_exactly(workspace, tok) -> None:
    outputs = [
        "Reading both." + call("read_file", {"path": "app.py"}) + call("read_file", {"path": "util.py"}),
        "Fixing." + call("edit_file", {"path": "app.py", "search": "a - b", "replace": "a + b"}),
        "Done: add now adds.",
    ]
    completer = ScriptedCompleter(outputs, tok)
    policy = TokenInTokenOutPolicy(completer, tok, prompt_profile=COMPACT_PROFILE)
    sink = ListSink()
    session = build_session(SessionParts(workspace), policy=policy, sink=sink)
    outcome = await session.run_turn("fix add")
    assert outcome.reason == "completed" and outcome.steps == 3
    assert all(e.ok for e in sink.of_type(ToolResultEvent))
    served = [(list(r.prompt_ids), c.token_ids) for r, c in zip(completer.requests, completer.completions, strict=True)]
    assert_exact(policy, served)
    # the <|end|> the engine sampled is not appended a second time, nor dropped
    end = tok.end_id
    seq = [t for s in policy.segments for t in s.token_ids]
    text = render_prompt(session.conversation, session.specs, profile=COMPACT_PROFILE).text
    assert seq.count(end) == text.count("<|end|>") and policy.marker_fixups == 0
    # decoding the token sequence gives the rendered conversation, up to the last message's end
    assert tok.decode(seq) == text.removesuffix("\n<|assistant|>\n")


async def test_real_engine_multi_turn_sequence_is_what_the_engine_saw(workspace, tok) -> None:
    torch.manual_seed(0)
    engine = Engine(long_context_model(tok), tok, max_slots=4, max_len=2048)
    rec = RecordingEngine(engine)
    policy = TokenInTokenOutPolicy(rec, tok, prompt_profile=COMPACT_PROFILE, max_tokens=8, seed=11,
                                   return_routes=True)
    session = build_session(SessionParts(workspace), policy=policy)
    try:
        for text in ("hello", "and now?", "thanks"):
            await session.run_turn(text)
    finally:
        await engine.stop()
    assert len(rec.served) == 3
    assert_exact(policy, rec.served)
    assert engine.stats.cached_tokens > 0  # later turns reused the earlier ones
    segs = policy.routed_segments()
    seq = [t for s in segs for t in s.token_ids]
    routes = [r for s in segs for r in (s.routes or [])]
    assert len(routes) == len(seq)
    with torch.no_grad():
        ref = engine.model(torch.tensor([seq]), return_routes=True).routes[0]
    assert torch.equal(torch.tensor(routes[:-1]), ref[:-1])  # the final token was never an input
    assert routes[-1][0][0] == -1


async def test_a_prompt_that_is_not_an_extension_is_a_policy_error(tok) -> None:
    specs = [t.spec for t in session_tools(SessionParts(workspace=None))]  # type: ignore[arg-type]
    policy = TokenInTokenOutPolicy(ScriptedCompleter(["hi", "again"], tok), tok)
    first = render_prompt([Message("user", "a")], specs)
    async for _ in policy.stream(first):
        pass
    rewritten = render_prompt([Message("user", "b"), Message("assistant", "hi")], specs)
    with pytest.raises(PolicyError, match="does not extend the previous prompt"):
        async for _ in policy.stream(rewritten):
            pass


async def test_a_bare_end_marker_is_not_duplicated(tok) -> None:
    class BareEnd(ScriptedCompleter):
        async def complete(self, request):
            done = await super().complete(request)
            done.token_ids[:] = [*tok.encode(done.text), tok.end_id]  # no newline before <|end|>
            done.logprobs[:] = [0.0] * len(done.token_ids)
            return done

    specs = [t.spec for t in session_tools(SessionParts(workspace=None))]  # type: ignore[arg-type]
    policy = TokenInTokenOutPolicy(BareEnd(["one", "two"], tok), tok)
    conv = [Message("user", "a")]
    async for _ in policy.stream(render_prompt(conv, specs)):
        pass
    conv += [Message("assistant", "one"), Message("user", "b")]
    async for _ in policy.stream(render_prompt(conv, specs)):
        pass
    seq = [t for s in policy.segments for t in s.token_ids]
    assert policy.marker_fixups == 1
    assert tok.decode(seq).count("<|end|>") == render_prompt(conv, specs).text.count("<|end|>") + 1  # + the last
    assert "one<|end|>\n<|user|>\nb" in tok.decode(seq)



class StreamingScripted(ScriptedCompleter):
    """The scripted completer, streamed one token per piece (as the engine streams), noting which
    tool calls the session had started when each piece was sent."""

    def __init__(self, outputs: list[str], tokenizer, sink: ListSink) -> None:
        super().__init__(outputs, tokenizer)
        self.sink = sink
        self.started_before_end: list[int] = []

    async def generate(self, request):
        import asyncio

        from agent.model.engine import GeneratedPiece
        from agent.events import ToolCallStarted

        done = await self.complete(request)
        for i, t in enumerate(done.token_ids):
            last = i == len(done.token_ids) - 1
            if last:
                self.started_before_end.append(len(self.sink.of_type(ToolCallStarted)))
            yield GeneratedPiece(self.tokenizer.decode([t]) if not last else "", (t,), (0.0,),
                                 "stop" if last else None)
            await asyncio.sleep(0)


async def test_a_streamed_completion_gives_the_same_sequence_and_starts_calls_early(workspace, tok) -> None:
    outputs = [
        call("read_file", {"path": "app.py"}) + "\nand\n" + call("read_file", {"path": "util.py"}),
        "Fixing." + call("edit_file", {"path": "app.py", "search": "a - b", "replace": "a + b"}),
        "Done.",
    ]
    runs = []
    for streamed in (False, True):
        sink = ListSink()
        completer = StreamingScripted(outputs, tok, sink) if streamed else ScriptedCompleter(outputs, tok)
        policy = TokenInTokenOutPolicy(completer, tok, prompt_profile=COMPACT_PROFILE)
        session = build_session(SessionParts(WorkspaceStore(workspace.root.parent.parent / f"s{streamed}")
                                             .from_dir(workspace.root)), policy=policy, sink=sink)
        outcome = await session.run_turn("fix add")
        assert outcome.reason == "completed" and outcome.steps == 3
        runs.append((policy, completer, sorted((e.step, e.index, e.name, e.ok, e.output)  # finish order varies
                                               for e in sink.of_type(ToolResultEvent))))
    (plain, _, results0), (streamed, completer, results1) = runs
    assert [(s.token_ids, s.sampled, s.logprobs) for s in plain.segments] == \
        [(s.token_ids, s.sampled, s.logprobs) for s in streamed.segments]
    assert results0 == results1
    # both calls of step 1 (and the edit of step 2) had started before their generation ended
    assert completer.started_before_end[:2] == [2, 3]
