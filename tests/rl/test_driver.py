"""The RL driver: scoring, pass@k, `flywheel rl eval --policy openai` end to end against a
real loopback OpenAI-compatible server, and the bad inputs `rl train` must name."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import pytest
import torch

from agent.model.checkpoint import save_checkpoint
from agent.model.config import ModelConfig
from agent.model.transformer import MoETransformer
from agent.parser import encode_call
from agent.prompt import COMPACT_PROFILE
from backend.cli import main
from rl.rollout.driver import pass_at_k, score, summarise
from rl.tasks.build import build_task_set
from rl.tasks.spec import load_tasks
from rl.train.demos import demo_task_from_patch
from rl.types import GradeResult, Rollout, RolloutStatus, Split
from tests.agent.model.test_engine import tiny_tokenizer
from tests.openai_server import ScriptedChatServer
from tools.sandbox import make_sandbox


@pytest.fixture(scope="module")
def tasks(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("tasks") / "tasks.jsonl"
    asyncio.run(build_task_set(["fix_bug"], 1, 1, 0, out, sandbox=make_sandbox()))
    return out


def _rollout(grade: GradeResult | None, status: RolloutStatus = RolloutStatus.FINISHED,
             events: list[dict[str, object]] | None = None) -> Rollout:
    return Rollout("r", 0, "t", 0, status, grade=grade, events=events or [], metrics={"changed": 1.0})


def test_an_infra_error_grade_is_excluded_and_counted_never_a_zero() -> None:
    r = _rollout(GradeResult(False, "", 0.1, error="grader could not run: sandbox gone"))
    score(r)
    assert r.status is RolloutStatus.INFRA_ERROR and r.reward is None and r.metrics["ungraded"] == 1.0
    assert "sandbox gone" in r.detail
    ungraded = _rollout(None)
    score(ungraded)
    assert ungraded.status is RolloutStatus.INFRA_ERROR and ungraded.reward is None


def test_a_grader_timeout_is_scored_as_a_failure() -> None:
    r = _rollout(GradeResult(False, "", 30.0, error="timed out", timed_out=True))
    score(r)
    assert r.status is RolloutStatus.FINISHED and r.reward is not None and r.reward <= 0.0


def test_score_uses_the_runs_effort_rate() -> None:
    calls = [{"type": "assistant_message", "step": i, "text": "x"} for i in (1, 2, 3)]
    default, steeper = (_rollout(GradeResult(True, "", 0.1), events=calls) for _ in range(2))
    score(default)
    score(steeper, effort_per_call=0.05)
    assert default.reward_terms["effort"] == pytest.approx(-0.02)
    assert steeper.reward_terms["effort"] == pytest.approx(-0.1) and steeper.reward == pytest.approx(0.9)


def test_sample_tasks_is_seeded_and_keeps_file_order() -> None:
    from rl.rollout.driver import sample_tasks

    items = list(range(50))
    a = sample_tasks(items, 10, seed=3)  # type: ignore[arg-type]
    assert a == sample_tasks(items, 10, seed=3) and a == sorted(a) and len(set(a)) == 10
    assert a != sample_tasks(items, 10, seed=4)  # type: ignore[arg-type]
    assert sample_tasks(items, 80, seed=3) == items  # type: ignore[arg-type]


def test_pass_at_k_estimator() -> None:
    assert pass_at_k(4, 0, 1) == 0.0 and pass_at_k(4, 4, 2) == 1.0
    assert pass_at_k(4, 1, 1) == pytest.approx(0.25)
    assert pass_at_k(4, 1, 4) == 1.0 and pass_at_k(4, 2, 2) == pytest.approx(1 - (2 * 1) / (4 * 3))
    with pytest.raises(ValueError, match="at least 5 samples"):
        pass_at_k(4, 1, 5)
    rs = [Rollout("r", 0, "a", g, RolloutStatus.FINISHED, reward=1.0 if g == 0 else 0.0,
                  reward_terms={"success": 1.0 if g == 0 else 0.0}) for g in range(2)]
    rs.append(Rollout("r", 0, "a", 2, RolloutStatus.INFRA_ERROR))
    res = summarise(rs, 2, "heldout")
    assert res.pass_at_1 == pytest.approx(0.5) and res.pass_at_k == 1.0
    assert res.infra_errors == 1 and res.tasks_short == 0
    assert res.per_family == {}  # no family map given


def test_summarise_per_family() -> None:
    def r(task: str, g: int, ok: bool) -> Rollout:
        return Rollout("r", 0, task, g, RolloutStatus.FINISHED, reward=float(ok), reward_terms={"success": float(ok)})

    rs = [r("a", 0, True), r("a", 1, False), r("b", 0, False), r("b", 1, False), r("c", 0, True), r("c", 1, True),
          r("d", 0, True), r("d", 1, False)]
    res = summarise(rs, 2, "heldout", {"a": "fix_bug", "b": "fix_bug", "c": "rename"})
    assert res.per_family["fix_bug"] == {"tasks": 2.0, "pass@1": 0.25, "pass@2": 0.5}
    assert res.per_family["rename"] == {"tasks": 1.0, "pass@1": 1.0, "pass@2": 1.0}
    assert res.per_family["unknown"]["tasks"] == 1.0  # "d" has no family: counted, not dropped
    # the families partition the tasks: their task-weighted mean is the overall pass@1
    total = sum(v["tasks"] * v["pass@1"] for v in res.per_family.values()) / res.tasks
    assert total == pytest.approx(res.pass_at_1)


def test_summarise_tokens_per_solved_per_family() -> None:
    from rl.types import GradeResult, Segment

    def r(task: str, g: int, ok: bool, sampled: int) -> Rollout:
        return Rollout("r", 0, task, g, RolloutStatus.FINISHED, reward=float(ok), reward_terms={"success": float(ok)},
                       segments=[Segment([1, 2, 3], False), Segment(list(range(sampled)), True, [0.0] * sampled)],
                       grade=GradeResult(ok, "", 0.1))

    rs = [r("a", 0, True, 10), r("a", 1, False, 50), r("b", 0, True, 30), r("c", 0, False, 7), r("c", 1, False, 9)]
    res = summarise(rs, 2, "heldout", {"a": "fix_bug", "b": "fix_bug", "c": "rename"})
    assert res.per_family["fix_bug"]["tokens_per_solved"] == 20.0  # (10 + 30) / 2: failures and prompts not counted
    assert "tokens_per_solved" not in res.per_family["rename"]  # nothing solved: absent, not 0
    assert res.behaviour["tokens_per_solved"] == 20.0  # the same definition as the overall figure


def test_eval_an_openai_compatible_model_through_the_runtime(tasks: Path, capsys: pytest.CaptureFixture[str],
                                                             monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("FLYWHEEL_DATA_DIR", str(tmp_path / "data"))  # the CLI's session log: not the user's
    task = next(t for t in load_tasks(tasks) if t.split is Split.HELDOUT)
    demo = demo_task_from_patch(task.id, task.request, task.reference_patch, task.grader.command)
    fix = "\n".join(encode_call("edit_file", {"path": e.path, "search": e.search, "replace": e.replace})
                    for e in demo.edits)
    server = ScriptedChatServer([fix, "Fixed."])
    with server.running():
        rc = main(["rl", "eval", "--policy", "openai", "--base-url", server.base_url, "--model", "m",
                   "--tasks", str(tasks), "--split", "heldout", "-k", "1"])
    out = capsys.readouterr()
    assert rc == 0, out.err
    res = json.loads(out.out.strip().splitlines()[-1])
    assert res["tasks"] == 1 and res["pass_at_1"] == 1.0 and res["infra_errors"] == 0, res
    assert res["per_family"] == {task.family: {"tasks": 1.0, "pass@1": 1.0}}  # k=1; the docs' claim
    # the model saw the production prompt: the runtime's system prompt and the task's request
    msgs = server.requests[0]["body"]["messages"]
    assert msgs[0]["role"] == "system" and task.request in msgs[-1]["content"]
    # a model that edits nothing scores no pass
    server = ScriptedChatServer(["I think it is fine."])
    with server.running():
        rc = main(["rl", "eval", "--policy", "openai", "--base-url", server.base_url, "--model", "m",
                   "--tasks", str(tasks), "--split", "heldout", "-k", "1"])
    res = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert rc == 0 and res["pass_at_1"] == 0.0


def _config(tmp_path: Path, **over: object) -> Path:
    cfg = {"name": "t", "out_dir": str(tmp_path / "run"), "iterations": 1} | over
    p = tmp_path / "run.json"
    p.write_text(json.dumps(cfg))
    return p


def test_train_names_what_is_missing_or_wrong(tmp_path: Path, tasks: Path, capsys: pytest.CaptureFixture[str],
                                              monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("FLYWHEEL_DATA_DIR", str(tmp_path / "data"))
    assert main(["rl", "train", "--config", str(_config(tmp_path, gruop_size=4))]) == 2
    assert "unknown key 'gruop_size'" in capsys.readouterr().err
    assert main(["rl", "train", "--config", str(_config(tmp_path))]) == 2
    assert "no task set: set `tasks:`" in capsys.readouterr().err
    assert main(["rl", "train", "--config", str(_config(tmp_path, tasks=str(tasks)))]) == 2
    assert "model.init: a checkpoint to start from is required" in capsys.readouterr().err
    tok = tiny_tokenizer()
    torch.manual_seed(0)
    ckpt = save_checkpoint(tmp_path / "tiny", MoETransformer(ModelConfig.preset("tiny", vocab_size=tok.vocab_size)),
                           tok, step=0, profile=COMPACT_PROFILE)
    cfg = _config(tmp_path, tasks=str(tasks), model={"preset": "small", "init": str(ckpt)})
    assert main(["rl", "train", "--config", str(cfg)]) == 2
    err = capsys.readouterr().err
    assert "another architecture" in err and "d_model: run 256, checkpoint 64" in err
    cfg = _config(tmp_path, tasks=str(tasks), model={"preset": "tiny", "init": str(ckpt), "prompt_profile": "default"})
    assert main(["rl", "train", "--config", str(cfg)]) == 2
    assert "served with 'compact'" in capsys.readouterr().err
    assert not (tmp_path / "run" / "checkpoints").exists()  # nothing half-written,
    assert not (tmp_path / "data").exists()  # and no session log opened for a run that never started


def test_eval_refuses_incomplete_arguments(tasks: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["rl", "eval", "--tasks", str(tasks)]) == 2
    assert "give a CHECKPOINT directory" in capsys.readouterr().err
    assert main(["rl", "eval", "--policy", "openai", "--tasks", str(tasks)]) == 2
    assert "needs --base-url and --model" in capsys.readouterr().err
    assert main(["rl", "eval", "ckpt", "--tasks", str(tasks), "--max-tasks", "0"]) == 2
    assert "--max-tasks must be >= 1, got 0" in capsys.readouterr().err


def test_a_grader_that_cannot_run_excludes_the_rollout_and_counts_it(ray_session, tasks: Path,
                                                                    tmp_path: Path) -> None:
    """Through the real Ray source: a grader whose command does not exist (exit 127) is an
    infrastructure error — INFRA_ERROR, no reward, counted as ungraded, left out of GRPO."""
    from agent.session import Limits
    from rl.config import GRPOConfig
    from rl.rollout.driver import RaySource
    from rl.rollout.log import MemoryRolloutLog
    from rl.train.grpo import select_rollouts
    from rl.train.loop import _source_counts

    task = next(t for t in load_tasks(tasks) if t.split is Split.TRAIN)
    broken = task.model_copy(update={"grader": task.grader.model_copy(update={"command": "/nonexistent/grader"})})
    tok = tiny_tokenizer()
    torch.manual_seed(0)
    ckpt = save_checkpoint(tmp_path / "ckpt", MoETransformer(ModelConfig.preset("tiny", vocab_size=tok.vocab_size,
                                                                               max_seq_len=2048)),
                           tok, step=0, profile=COMPACT_PROFILE)
    log = MemoryRolloutLog()
    source = RaySource(ckpt, [broken], run_id="broken", store_root=tmp_path / "store", log=log,
                       limits=Limits(max_steps=1, max_wall_s=60), max_tokens=8)
    try:
        rollouts = source.collect([broken.id], iteration=0, group_size=2)
    finally:
        source.close()
    assert [r.status for r in rollouts] == [RolloutStatus.INFRA_ERROR] * 2
    assert all(r.reward is None and "not scored" in r.detail and "exit 127" in r.detail for r in rollouts)
    assert _source_counts(source) == {"ungraded": 2.0}
    assert {s["tags"]["status"] for s in log.sessions.values()} == {"infra_error"}
    sel = select_rollouts(rollouts, GRPOConfig(group_size=2))
    assert sel.n_infra_excluded == 2 and not sel.rows


def test_eval_takes_its_limits_from_a_run_config(tasks: Path, capsys: pytest.CaptureFixture[str],
                                                 monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("FLYWHEEL_DATA_DIR", str(tmp_path / "data"))
    look = encode_call("grep", {"pattern": "def"})  # a tool call: the turn goes on until a limit ends it
    server = ScriptedChatServer([look, look, "Done."])
    cfg = _config(tmp_path, limits={"max_model_calls": 1, "max_output_tokens": 64, "max_wall_s": 30})
    with server.running():
        rc = main(["rl", "eval", "--policy", "openai", "--base-url", server.base_url, "--model", "m",
                   "--tasks", str(tasks), "--split", "heldout", "-k", "1", "--config", str(cfg)])
    out = capsys.readouterr()
    assert rc == 0, out.err
    assert len(server.requests) == 1  # the config's one model call, not the default eight
    res = json.loads(out.out.strip().splitlines()[-1])
    # and the rollout records that the call limit ended it
    assert res["behaviour"]["rollout_limit_max_steps"] == 1.0 and res["behaviour"]["rollout_limit_timeout"] == 0.0
    assert main(["rl", "eval", "--policy", "openai", "--base-url", "http://127.0.0.1:9", "--model", "m",
                 "--tasks", str(tasks), "--config", str(_config(tmp_path, limits={"max_calls": 1}))]) == 2
    assert "unknown key 'limits.max_calls'" in capsys.readouterr().err


def test_project_graded_tasks_show_the_project_python_to_the_agent(tasks: Path) -> None:
    from rl.rollout.driver import agent_sandbox_paths
    from rl.tasks.grading import GraderConfig

    ts = load_tasks(tasks)
    assert agent_sandbox_paths(ts) == ()
    assert agent_sandbox_paths(ts, ["/opt/x"]) == ("/opt/x",)
    project = ts[0].model_copy(update={"grader": ts[0].grader.model_copy(update={"interpreter": "project"})})
    got = agent_sandbox_paths([project, *ts], ["/opt/x"])
    assert got[0] == "/opt/x" and set(got[1:]) == {str(p) for p in GraderConfig().project_ro}
