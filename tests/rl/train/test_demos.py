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
from rl.train.demos import (STYLES, DemoTask, Demonstration, demo_segments, demo_task_from_patch, record_demo,
                            shell_edit_for)
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


@pytest.mark.parametrize("family", ["fix_bug", "implement_stub"])
def test_a_fix_or_a_stub_has_no_one_command_form(family: str) -> None:
    assert shell_edit_for(make_task(family, Split.TRAIN, 3, 2)) is None


@pytest.mark.sandbox
@pytest.mark.parametrize("split", [Split.TRAIN, Split.HELDOUT])
@pytest.mark.parametrize("family", ["rename", "find_change"])
async def test_a_one_command_form_passes_its_grader(family: str, split: Split, sandbox: Sandbox,
                                                    tmp_path: Path) -> None:
    """``shell_edit_for`` is the reference solution as one command: run in the sandbox on the task's
    start, the task's own grader passes, at every difficulty."""
    from rl.tasks.grading import grade, grader_sandbox
    from tools.sandbox import SandboxLimits

    store = WorkspaceStore(tmp_path / "store")
    for seed, difficulty in [(1, 1), (2, 2), (3, 3), (4, 3)]:
        task = make_task(family, split, seed, difficulty)
        command = shell_edit_for(task)
        if family == "rename":
            assert command == f"sed -i 's/{task.metadata['old']}/{task.metadata['new']}/g' " + \
                task.request.split(" package")[0].rsplit(" ", 1)[-1] + "/*.py"
        else:
            name, value = task.metadata["constant"], task.request.rsplit(" ", 1)[-1].rstrip(".")
            assert command == f"grep -rl '^{name} = ' . | xargs sed -i 's/^{name} = .*/{name} = {value}/'"
        ws = materialise(task, store)
        try:
            assert not (await grade(task, ws, grader_sandbox())).passed  # fails at the start
            res = await sandbox.run(command, ws.root, SandboxLimits(timeout_s=30))
            assert res.exit_code == 0, res.output
            assert (await grade(task, ws, grader_sandbox())).passed, (task.id, command)
        finally:
            ws.delete()


@pytest.mark.sandbox
def test_the_shell_style_renames_with_one_command_and_passes(sandbox: Sandbox, tmp_path: Path) -> None:
    """``record_task_demos(shell_share=1)``: every rename and find-and-change demonstration is the shell
    style (a grep half the time, the one command, the tests), whose tests pass; a fix keeps its drawn style."""
    from rl.train.demos import record_task_demos

    tasks = ([make_task("rename", Split.TRAIN, s, 1 + s % 3) for s in range(3)]
             + [make_task("find_change", Split.TRAIN, s, 1 + s % 3) for s in range(2)]
             + [make_task("fix_bug", Split.TRAIN, 1, 1)])
    tok = _tokenizer(tasks[0])
    out = record_task_demos(tasks, tok, profile=profile_named("compact"), sandbox=sandbox,
                            store=WorkspaceStore(tmp_path / "store"), max_len=100_000, shell_share=1.0)
    assert out.styles.get("shell") == 5 and sum(out.styles.values()) == 6
    for ex, task in zip(out.examples[:5], tasks, strict=False):
        text = tok.decode([t for s in ex for t in s.token_ids]).split("<|user|>", 1)[1]
        assert "sed -i" in text and "edit_file" not in text
        verdict = text.rsplit("<|assistant|>", 1)[0][-200:]  # the tests' result, before the answer
        assert "OK" in verdict and "FAILED" not in verdict, (task.id, verdict)
    baseline = record_task_demos(tasks, tok, profile=profile_named("compact"), sandbox=sandbox,
                                 store=WorkspaceStore(tmp_path / "store2"), max_len=100_000)
    assert "shell" not in baseline.styles and sum(baseline.styles.values()) == 6
    again = record_task_demos(tasks, tok, profile=profile_named("compact"), sandbox=sandbox,
                              store=WorkspaceStore(tmp_path / "store3"), max_len=100_000, shell_share=1.0)
    # recording is reproducible (unittest's run time, which varies with load, is fixed in demonstrations:
    # without that this failed 4 times in 5) and the digest sees the styles
    assert again.digest() == out.digest() != baseline.digest()
