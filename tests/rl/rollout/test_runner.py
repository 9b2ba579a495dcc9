"""Rollouts as production sessions (no Ray): statuses, segments, and serve/rollout identity."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from agent.events import ListSink, ToolResultEvent
from agent.parser import encode_call as call
from agent.policies.scripted import ScriptedPolicy
from agent.policies.tito import ScriptedCompleter
from agent.prompt import COMPACT_PROFILE
from agent.runtime import SessionParts, build_session
from agent.session import Limits
from rl.rollout.log import MemoryRolloutLog, persist
from rl.rollout.worker import DirTask, RolloutJob, RolloutRunner, WorkerConfig
from rl.types import RolloutStatus
from tests.agent.model.test_engine import tiny_tokenizer
from tools.sandbox import make_sandbox
from tools.workspace import WorkspaceStore

OUTPUTS = [
    "Look first." + call("read_file", {"path": "app.py"}) + call("run_command", {"command": "ls"}),
    "Fix." + call("edit_file", {"path": "app.py", "search": "a - b", "replace": "a + b"}),
    "Done.",
]


@pytest.fixture(scope="module")
def tok():
    return tiny_tokenizer()


@pytest.fixture
def task(tmp_path: Path) -> DirTask:
    src = tmp_path / "task"
    src.mkdir()
    (src / "app.py").write_text("def add(a, b):\n    return a - b\n")
    return DirTask("t1", "fix add in app.py", str(src))


def runner(tmp_path: Path, outputs: list[str], tok, limits: Limits | None = None) -> tuple[RolloutRunner, ScriptedCompleter]:
    completer = ScriptedCompleter(outputs, tok)
    config = WorkerConfig(store_root=str(tmp_path / "store"), limits=limits, return_routes=False)
    return RolloutRunner(config, completer, tok, COMPACT_PROFILE), completer


async def test_a_finished_rollout_has_its_events_segments_and_metrics(tmp_path, task, tok) -> None:
    r, completer = runner(tmp_path, OUTPUTS, tok)
    [rollout] = await r.run([RolloutJob(task, "run1", 0, 0)])
    assert rollout.status is RolloutStatus.FINISHED, rollout.detail
    served = completer.requests[-1].prompt_ids + completer.completions[-1].token_ids
    assert rollout.token_ids == served
    assert sum(rollout.loss_mask) == sum(len(c.token_ids) for c in completer.completions)
    assert rollout.metrics["model_calls"] == 3 and rollout.metrics["tool_calls"] == 3
    assert rollout.metrics["parallel_steps"] == 1
    assert {k: v for k, v in rollout.metrics.items() if k.startswith("limit_")} == {
        "limit_max_steps": 0.0, "limit_max_tokens": 0.0, "limit_timeout": 0.0}
    assert {e["session_id"] for e in rollout.events} == {rollout.session_id}
    assert (Path(task.source_dir) / "app.py").read_text().endswith("a - b\n")  # the rollout worked on a fork
    log = MemoryRolloutLog()
    persist(log, rollout, rollout.events)
    tags = log.sessions[rollout.session_id]["tags"]
    assert tags == {"rl": True, "run": "run1", "iteration": 0, "task": "t1", "sample": 0, "reward": None,
                    "status": "finished"}


async def test_limit_policy_error_and_infra_error_are_told_apart(tmp_path, task, tok) -> None:
    r, _ = runner(tmp_path, OUTPUTS, tok, limits=Limits(max_steps=1))
    [limit] = await r.run([RolloutJob(task, "run", 0, 0)])
    assert limit.status is RolloutStatus.LIMIT and "max_steps" in limit.detail
    assert limit.metrics["limit_max_steps"] == 1.0 and limit.metrics["limit_timeout"] == 0.0

    r, _ = runner(tmp_path, OUTPUTS[:1], tok)  # the model fails at its second call
    [policy] = await r.run([RolloutJob(task, "run", 0, 1)])
    assert policy.status is RolloutStatus.POLICY_ERROR and "no output left" in policy.detail

    class Broken(DirTask):
        def start_workspace(self, store):
            raise OSError("disk gone")

    r, _ = runner(tmp_path, OUTPUTS, tok)
    [infra] = await r.run([RolloutJob(Broken("t2", "x", "/nonexistent"), "run", 0, 2)])
    assert infra.status is RolloutStatus.INFRA_ERROR and "disk gone" in infra.detail


async def test_a_rollout_cut_by_the_clock_is_counted_as_a_timeout_not_a_step_limit(tmp_path, task, tok) -> None:
    class Slow(ScriptedCompleter):  # an engine shared by many rollouts: each generation waits its turn
        async def complete(self, request):
            await asyncio.sleep(0.3)
            return await super().complete(request)

    config = WorkerConfig(store_root=str(tmp_path / "store"), limits=Limits(max_wall_s=0.5), return_routes=False)
    r = RolloutRunner(config, Slow(OUTPUTS, tok), tok, COMPACT_PROFILE)
    [rollout] = await r.run([RolloutJob(task, "run", 0, 0)])
    assert rollout.status is RolloutStatus.LIMIT, rollout.detail
    assert rollout.metrics["limit_timeout"] == 1.0 and rollout.metrics["limit_max_steps"] == 0.0
    assert rollout.metrics["model_calls"] < len(OUTPUTS)


async def test_rollout_and_server_session_get_byte_identical_prompts_and_tool_results(tmp_path, task, tok) -> None:
    r, completer = runner(tmp_path, OUTPUTS, tok)
    [rollout] = await r.run([RolloutJob(task, "run", 0, 0)])
    # a server-style session: same parts (a fork of the same start, the production sandbox), same model output
    ws = WorkspaceStore(tmp_path / "server").from_dir(task.source_dir)
    scripted = ScriptedPolicy(OUTPUTS)
    sink = ListSink()
    session = build_session(SessionParts(ws, make_sandbox()), policy=scripted, profile=COMPACT_PROFILE, sink=sink)
    await session.run_turn(task.request)
    served_prompts = [tok.decode(req.prompt_ids) for req in completer.requests]
    assert served_prompts == [p.text for p in scripted.prompts]  # token for token the same text
    rollout_results = [(e["call_id"], e["ok"], e["output"]) for e in rollout.events if e["type"] == "tool_result"]
    server_results = [(e.call_id, e.ok, e.output) for e in sink.of_type(ToolResultEvent)]
    assert rollout_results == server_results and len(server_results) == 3


async def test_a_rollout_at_temperature_half_records_what_a_trainer_at_half_computes(tmp_path, task, tok) -> None:
    """A real engine, rollouts sampled at T = 0.5: the recorded behaviour logprobs are the tempered
    policy's (the worker asks for ``logprobs_mode="processed"``), so GRPO at 0.5 sees no
    sampler/trainer gap and GRPO at 1 would."""
    from agent.model.engine import Engine
    from rl.config import GRPOConfig
    from rl.train.grpo import GRPOTrainer
    from tests.agent.model.test_engine import tiny_model

    every = tuple(tok.special_ids)  # no -inf logits: the prompt's own markers get finite logprobs
    model = tiny_model(tok, ends=every, max_seq_len=1024)  # the compact prompt is ~430 tokens
    engine = Engine(model, tok, max_slots=4)
    await engine.start()
    try:
        config = WorkerConfig(store_root=str(tmp_path / "store"), limits=Limits(max_steps=2), return_routes=False,
                              max_tokens=24, temperature=0.5)
        r = RolloutRunner(config, engine, tok, COMPACT_PROFILE)
        rollouts = await r.run([RolloutJob(task, "run", 0, i, seed=100 + i) for i in range(2)])
    finally:
        await engine.stop()
    assert all(sum(x.loss_mask) > 0 for x in rollouts), [x.detail for x in rollouts]
    for i, x in enumerate(rollouts):
        x.reward = float(i == 0)
    gaps = {t: GRPOTrainer(tiny_model(tok, ends=every, max_seq_len=1024), GRPOConfig(norm_tokens=16), pad_id=tok.pad_id, lr=1e-3,
                           temperature=t).step(rollouts) for t in (0.5, 1.0)}
    assert gaps[0.5]["stepped"] == 1 and gaps[0.5]["policy_tokens"] > 0, sorted(gaps[0.5].items())
    assert gaps[0.5]["logprob_diff_max"] < 1e-4 and gaps[1.0]["logprob_diff_max"] > 1e-2, gaps


async def test_close_deletes_the_cached_bases_and_unmounts(tmp_path, task, tok) -> None:
    from tools.overlay import mounts_under, overlay_unavailable

    if (reason := overlay_unavailable(tmp_path)) is not None:
        pytest.skip(f"overlays do not work here ({reason})")
    r, _ = runner(tmp_path, OUTPUTS, tok)
    r.store = WorkspaceStore(tmp_path / "cow-store", overlay=True)  # as a runner whose store mounts
    [rollout] = await r.run([RolloutJob(task, "run", 0, 0)])
    assert rollout.status is RolloutStatus.FINISHED, rollout.detail
    assert len(mounts_under(r.store.root)) == 1  # the task's cached base (the rollout's fork is deleted)
    r.close()
    assert mounts_under(r.store.root) == [] and list((r.store.root / "ws").iterdir()) == []
