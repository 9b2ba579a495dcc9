"""SFT demonstrations tokenise to exactly the sequence the RL sampler's policy builds.

A demonstration of a generated task is recorded through the real runtime (as
``rl.train.demos.record_task_demos`` records it), tokenised with ``demo_segments``, and its
sampled ids are then replayed through :class:`TokenInTokenOutPolicy` in a session over a fresh
fork of the same start: both sides must hold the same token ids with the same sampled mask.
If the two ever extend the sequence differently, SFT trains on sequences RL never produces.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from pathlib import Path

import pytest

from agent.events import ListSink
from agent.model.engine import Completion, GenerationRequest
from agent.model.tokenizer import Tokenizer, train_tokenizer
from agent.policies.tito import (TokenInTokenOutPolicy, TokenSegment, next_prompt_suffix, output_tail,
                                 scripted_output_ids)
from agent.policy import PolicyError
from agent.prompt import CHAT_TEMPLATE, PromptProfile, profile_named
from agent.runtime import SessionParts, build_session
from agent.session import Limits
from rl.tasks.build import make_task
from rl.tasks.spec import Task
from rl.tasks.workspaces import materialise
from rl.train.demos import STYLES, DemoTask, Demonstration, demo_segments, demo_task_from_patch, record_demo
from rl.types import Segment, Split
from tools.protocols import Workspace
from tools.sandbox import Sandbox, make_sandbox, probe_bwrap
from tools.workspace import WorkspaceStore


@pytest.fixture(scope="module")
def sandbox() -> Sandbox:
    reason = probe_bwrap()
    if reason is not None:
        pytest.skip(f"bubblewrap is not usable here: {reason}")
    return make_sandbox()


@pytest.fixture(scope="module")
def task() -> Task:
    return make_task("fix_bug", Split.TRAIN, 11, 2)


@pytest.fixture
def base(task: Task, tmp_path: Path) -> Iterator[Workspace]:
    ws = materialise(task, WorkspaceStore(tmp_path / "store"))
    try:
        yield ws
    finally:
        ws.delete()


def _demo_task(task: Task) -> DemoTask:
    """The task as ``record_task_demos`` demonstrates it, except the test command's output: unittest
    prints its run time ("Ran 4 tests in 0.000s"), which may differ between the two runs."""
    demo = demo_task_from_patch(task.id, task.request, task.reference_patch, task.grader.agent_command,
                                extra_reads=task.grader.test_files)
    return DemoTask(demo.task_id, demo.request, demo.edits, demo.test_command + " 2>&1 | tail -n 1",
                    demo.extra_reads)


def _tokenizer(task: Task) -> Tokenizer:
    """A BPE with merges over the task's code, so that token boundaries are not all single bytes."""
    from rl.tasks.spec import GeneratedSource

    assert isinstance(task.source, GeneratedSource)
    return train_tokenizer([t * 10 for t in task.source.files.values()] + [task.request * 10], 700)


class ReplayCompleter:
    """A token completer that answers request ``k`` with the ``k``-th given list of ids (logprob 0),
    its text cut at the template's turn stop as the engine cuts it."""

    def __init__(self, outputs: list[list[int]], tokenizer: Tokenizer) -> None:
        self.outputs, self.tokenizer = outputs, tokenizer
        self.requests: list[GenerationRequest] = []

    async def complete(self, request: GenerationRequest) -> Completion:
        ids = self.outputs[len(self.requests)]
        self.requests.append(request)
        text = self.tokenizer.decode(ids)
        stop = next(s for s in CHAT_TEMPLATE.turn_stops if text.endswith(s))
        return Completion(text[: -len(stop)], list(ids), [0.0] * len(ids), "stop", len(request.prompt_ids))


async def _record(demo_task: DemoTask, style: str, base: Workspace, sandbox: Sandbox,
                  profile: PromptProfile) -> Demonstration:
    ws = base.fork()
    try:
        return await record_demo(demo_task, style, ws, sandbox, profile=profile, seed=3,  # type: ignore[arg-type]
                                 fail_blind=style == "blind")
    finally:
        ws.delete()


async def _replay(sampled: list[list[int]], demo_task: DemoTask, base: Workspace, sandbox: Sandbox,
                  profile: PromptProfile, tok: Tokenizer) -> TokenInTokenOutPolicy:
    policy = TokenInTokenOutPolicy(ReplayCompleter(sampled, tok), tok, prompt_profile=profile)
    ws = base.fork()
    try:
        session = build_session(SessionParts(ws, sandbox), policy=policy, sink=ListSink(),
                                limits=Limits(max_steps=len(sampled) + 1))
        outcome = await session.run_turn(demo_task.request)
    finally:
        ws.delete()
    assert outcome.reason == "completed", outcome
    return policy


def _flat(segments: Sequence[Segment | TokenSegment]) -> tuple[list[int], list[bool]]:
    return ([t for s in segments for t in s.token_ids], [s.sampled for s in segments for _ in s.token_ids])


@pytest.mark.sandbox
@pytest.mark.parametrize("style", STYLES)
async def test_a_demonstration_is_the_sequence_the_tito_policy_builds(
        style: str, task: Task, base: Workspace, sandbox: Sandbox) -> None:
    profile, tok, demo_task = profile_named("compact"), _tokenizer(task), _demo_task(task)
    demo = await _record(demo_task, style, base, sandbox, profile)
    assert demo.turn_end == "completed" and len(demo.prompts) >= 3  # multi-step
    segs = demo_segments(demo, tok)
    sampled = [s.token_ids for s in segs if s.sampled]
    assert len(sampled) == len(demo.outputs)

    policy = await _replay(sampled, demo_task, base, sandbox, profile, tok)

    assert policy.model_calls == len(sampled) and policy.marker_fixups == 0
    ids, mask = _flat(segs)
    tito_ids, tito_mask = _flat(policy.segments)
    assert tito_ids == ids and tito_mask == mask
    assert [s.token_ids for s in policy.segments] == [s.token_ids for s in segs]  # the same runs, too
    assert tok.decode(ids) == demo.prompts[-1].text + demo.outputs[-1] + "\n<|end|>"


def test_the_suffix_rule_is_shared_and_refuses_a_rewritten_prompt() -> None:
    prev = "<|user|>\nhi\n<|end|>\n<|assistant|>\n"
    nxt = prev + "ok\n<|end|>\n<|user|>\nmore\n<|end|>\n<|assistant|>\n"
    assert next_prompt_suffix(prev, "ok", "\n<|end|>", nxt).text == "\n<|user|>\nmore\n<|end|>\n<|assistant|>\n"
    bare = next_prompt_suffix(prev, "ok", "<|end|>", nxt)  # the model's own marker stands for the template's
    assert bare.marker_fixup and bare.text.startswith("\n<|user|>")
    assert next_prompt_suffix(prev, "ok", "", nxt).text == "\n<|end|>\n<|user|>\nmore\n<|end|>\n<|assistant|>\n"
    with pytest.raises(PolicyError, match="does not extend the previous prompt"):
        next_prompt_suffix(prev, "OK", "\n<|end|>", nxt)
    with pytest.raises(PolicyError, match="ended with 'x'"):
        next_prompt_suffix(prev, "ok", "x", nxt)


def test_demo_segments_refuses_a_prompt_that_does_not_extend_the_previous_one(task: Task) -> None:
    from agent.prompt import RenderedPrompt

    tok = _tokenizer(task)
    first = "<|user|>\nfix it\n<|end|>\n<|assistant|>\n"
    demo = Demonstration("t", "parallel", ["reading", "done"],
                         [RenderedPrompt(text=first), RenderedPrompt(text=first.replace("fix", "mend") + "x")],
                         "completed")
    with pytest.raises(ValueError, match="t/parallel: prompt 2 does not extend prompt 1"):
        demo_segments(demo, tok)
    ids = scripted_output_ids("reading", tok)
    assert output_tail(tok, ids, "reading") == "\n<|end|>" and ids[-1] == tok.end_id
