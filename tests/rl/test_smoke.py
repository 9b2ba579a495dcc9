"""The CI smoke RL run, end to end: tasks built by ``rl.tasks.build``, an SFT warm start,
then 2 GRPO iterations through ``flywheel rl train``'s driver on Ray (one inference actor,
one rollout worker, real bwrap sandbox, real graders), in well under 2 minutes on 2 cores.

Why an SFT warm start and not a fake reward: a random tiny model writes no tool call, so
its G samples would all score 0 and every group would be skipped (zero variance) — no
update, nothing tested. A few SFT steps on the scripted demonstrations (rl.train.demos)
make it emit tool-call-shaped text, some of it well-formed and some malformed, so the
real reward (malformed-call and limit shaping, rarely a success) differs inside a group
and GRPO takes a real step. The test asserts that at least one iteration stepped; it
does not assume any task is solved.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import math
from pathlib import Path

import pytest
import torch

from agent.model.checkpoint import load_checkpoint, save_checkpoint
from agent.model.config import ModelConfig
from agent.model.copy_head import twin_ids
from agent.model.transformer import MoETransformer
from agent.prompt import COMPACT_PROFILE
from rl.config import validate_run_config
from rl.rollout.driver import train
from rl.rollout.log import MemoryRolloutLog
from rl.tasks.build import build_task_set
from rl.tasks.spec import load_tasks
from rl.train.checkpoints import latest_checkpoint
from rl.train.cli import _cmd_sft
from rl.types import Rollout, RolloutStatus, Split
from tests.agent.model.test_engine import tiny_tokenizer
from tools.sandbox import make_sandbox

FAMILIES = ["fix_bug", "rename", "find_change", "implement_stub"]


@pytest.fixture(scope="module")
def sft_checkpoint(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    """(task set, SFT checkpoint): 4 train + 2 held-out tasks; a tiny model after a few SFT steps."""
    root = tmp_path_factory.mktemp("smoke")
    tasks = root / "tasks.jsonl"
    summary = asyncio.run(build_task_set(FAMILIES, 4, 2, 0, tasks, sandbox=make_sandbox()))
    assert summary.written["train"] == 4, summary.to_json()
    tok = tiny_tokenizer()
    torch.manual_seed(0)
    model = MoETransformer(ModelConfig.preset("tiny", vocab_size=tok.vocab_size, max_seq_len=2048))
    save_checkpoint(root / "init", model, tok, step=0, profile=COMPACT_PROFILE)
    (root / "sft.json").write_text(json.dumps({"sft": {"lr": 3e-3, "batch": 3, "max_epochs": 8, "eval_every": 4,
                                                        "patience": 3, "heldout_fraction": 0.25}}))
    rc = _cmd_sft(argparse.Namespace(tasks=tasks, init=root / "init", out=root / "sft", config=root / "sft.json",
                                     seed=0))
    assert rc == 0
    assert (root / "sft" / "sft_curve.png").stat().st_size > 10_000  # its loss curve drawn, not a blank figure
    return tasks, root / "sft"


def test_smoke_rl_run_records_rollouts_and_updates_weights(ray_session, sft_checkpoint: tuple[Path, Path],
                                                           tmp_path: Path) -> None:
    tasks, sft = sft_checkpoint
    cfg = validate_run_config({
        "name": "smoke", "seed": 0, "out_dir": str(tmp_path / "run"), "tasks": str(tasks), "iterations": 2,
        "tasks_per_iteration": 2, "lr": 3e-3, "model": {"preset": "tiny", "init": str(sft)},
        "grpo": {"group_size": 4, "norm_tokens": 64, "micro_batch": 4},
        "limits": {"max_model_calls": 3, "max_output_tokens": 192, "max_wall_s": 60},
        "rollout": {"workers": 1, "max_tokens_per_call": 64},
    })
    log = MemoryRolloutLog()
    seen: list[Rollout] = []
    res = train(cfg, log=log, on_rollout=seen.append)

    # rollouts recorded: 2 iterations x 2 tasks x G=4, every one in the log with its events and tags
    assert len(seen) == 16 and len(log.sessions) == 16
    for r in seen:
        tags = log.sessions[r.session_id]["tags"]
        assert tags["run"] == "smoke" and tags["status"] == r.status.value and tags["reward"] == r.reward
        assert log.sessions[r.session_id]["events"], r.session_id
    # rewards computed for every scored rollout (infra errors excluded, never a silent zero)
    scored = [r for r in seen if r.status is not RolloutStatus.INFRA_ERROR]
    assert len(scored) >= 12, [(r.status, r.detail) for r in seen]
    assert all(r.reward is not None and r.grade is not None and "blind_edit_rate" in r.metrics for r in scored)
    # a real update: some group had reward variance, the loss is finite, the version moved on
    recs = res.records
    assert len(recs) == 2 and res.iterations_done == 2
    stepped = [r for r in recs if r.get("stepped")]
    assert stepped, [(r.get("n_groups_zero_std"), r.get("n_groups")) for r in recs]
    assert all(math.isfinite(r["loss"]) for r in stepped)
    assert res.weights_version == len(stepped)
    # each rollout records the version that sampled it: iteration 1 -> 0, iteration 2 -> 1 if iteration 1 stepped
    assert {r.weights_version for r in seen if r.iteration == 0} == {0}
    assert {r.weights_version for r in seen if r.iteration == 1} == {int(bool(recs[0].get("stepped")))}
    # the weights changed: the run's last checkpoint differs from the SFT start
    start, _ = load_checkpoint(sft)
    end, _ = load_checkpoint(latest_checkpoint(tmp_path / "run"))
    diffs = [float((a - b).abs().max()) for a, b in zip(start.state_dict().values(), end.state_dict().values(),
                                                        strict=True)]
    assert max(diffs) > 0
    assert (tmp_path / "run" / "metrics.jsonl").read_text().count("\n") == 2
    assert (tmp_path / "run" / "curves.png").stat().st_size > 0


def test_smoke_eval_of_a_checkpoint_on_the_heldout_split(ray_session, sft_checkpoint: tuple[Path, Path],
                                                         capsys: pytest.CaptureFixture[str],
                                                         monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    from backend.cli import main

    monkeypatch.setenv("FLYWHEEL_DATA_DIR", str(tmp_path / "data"))  # the CLI's session log: not the user's

    tasks, sft = sft_checkpoint
    rc = main(["rl", "eval", str(sft), "--tasks", str(tasks), "--split", "heldout", "-k", "2",
               "--max-tokens", "48"])
    out = capsys.readouterr()
    assert rc == 0, out.err
    res = json.loads(out.out.strip().splitlines()[-1])
    assert res["split"] == "heldout" and res["tasks"] == 2 and res["k"] == 2
    assert 0.0 <= res["pass_at_1"] <= res["pass_at_k"] <= 1.0
    assert res["behaviour"]["rollouts"] == 4.0
    assert set(res["per_task"]) == {t.id for t in load_tasks(tasks) if t.split.value == "heldout"}
    assert (tmp_path / "data" / "flywheel.db").exists()  # persisted to the session log the CLI opened


def test_smoke_flywheel_rl_train_cli_records_the_run_in_the_session_log(
        ray_session, sft_checkpoint: tuple[Path, Path], capsys: pytest.CaptureFixture[str],
        monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """`flywheel rl train --config FILE`: rollouts, the run and its iteration land in the session log."""
    import sqlite3

    from backend.cli import main

    tasks, sft = sft_checkpoint
    monkeypatch.setenv("FLYWHEEL_DATA_DIR", str(tmp_path / "data"))
    cfg = tmp_path / "run.json"
    cfg.write_text(json.dumps({
        "name": "smoke-cli", "out_dir": str(tmp_path / "run"), "tasks": str(tasks), "iterations": 1,
        "tasks_per_iteration": 2, "model": {"preset": "tiny", "init": str(sft)}, "grpo": {"group_size": 2},
        "limits": {"max_model_calls": 2, "max_output_tokens": 96, "max_wall_s": 60},
        "rollout": {"max_tokens_per_call": 48}, "eval": {"every": 1, "k": 1, "max_tasks": 1}}))
    rc = main(["rl", "train", "--config", str(cfg)])
    out = capsys.readouterr()
    assert rc == 0, out.err
    summary = json.loads(out.out.strip().splitlines()[-1])
    assert summary["iterations_done"] == 1 and summary["run"] == "smoke-cli"
    db = sqlite3.connect(tmp_path / "data" / "flywheel.db")
    try:
        rows = db.execute("SELECT rl_run, rl_status FROM sessions WHERE kind = 'rl'").fetchall()
        runs = [r[0] for r in rows]
        # 1 iteration x 2 tasks x G=2 training rollouts; 1 held-out task x k=1 at the start and after iteration 1
        assert runs.count("smoke-cli") == 4 and runs.count("smoke-cli/heldout") == 2 and len(rows) == 6
        assert all(r[1] for r in rows)
        assert db.execute("SELECT status FROM rl_runs WHERE id = 'smoke-cli'").fetchall() == [("finished",)]
        assert db.execute("SELECT iteration FROM rl_iterations WHERE run_id = 'smoke-cli' ORDER BY iteration"
                          ).fetchall() == [(0,), (1,)]
        recs = [json.loads(x) for x in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
        assert [r["iteration"] for r in recs] == [0, 1]
        assert all(0.0 <= r["heldout_pass_at_1"] <= 1.0 and r["heldout_tasks"] == 1 for r in recs)
        # the one held-out task's family carries the same pass@1 (rl.rollout.driver.heldout_metrics)
        family = next(t.family for t in load_tasks(tasks) if t.split is Split.HELDOUT)
        assert all(r[f"heldout_pass_at_1_{family}"] == r["heldout_pass_at_1"] for r in recs)
        # training success per family: the two trained tasks' families, partitioning the iteration's rollouts
        trained = {t.family for t in load_tasks(tasks) if t.split is Split.TRAIN}
        per_family = {k: v for k, v in recs[1].items() if k.startswith("success_rate_")}
        assert per_family and {k.removeprefix("success_rate_") for k in per_family} <= trained
        assert min(per_family.values()) <= recs[1]["success_rate"] <= max(per_family.values())
    finally:
        db.close()


def test_smoke_dagger_round_relabels_the_models_own_calls(ray_session, sft_checkpoint: tuple[Path, Path],
                                                          tmp_path: Path) -> None:
    """``flywheel rl sft`` with one DAgger round (rl.train.dagger) from the smoke SFT checkpoint:
    free-running rollouts on Ray, every model call relabelled, SFT on demos + relabels."""
    tasks, sft = sft_checkpoint
    (tmp_path / "dagger.json").write_text(json.dumps({
        "sft": {"lr": 3e-3, "batch": 3, "max_epochs": 2, "eval_every": 4, "patience": 2, "heldout_fraction": 0.25,
                "dagger_rounds": 1, "dagger_max_steps": 4},
        "limits": {"max_model_calls": 3, "max_output_tokens": 192, "max_wall_s": 60},
        "rollout": {"max_tokens_per_call": 48}}))
    out = tmp_path / "dagger"
    rc = _cmd_sft(argparse.Namespace(tasks=tasks, init=sft, out=out, config=tmp_path / "dagger.json", seed=0))
    assert rc == 0
    [round1] = [json.loads(x) for x in (out / "dagger.jsonl").read_text().splitlines()]
    # 4 train-split tasks: 3 for SFT training, 1 for its early stopping; one rollout each
    assert round1["train_rollouts"] == 3 and round1["heldout_rollouts"] == 1, round1
    assert round1["train_examples"] >= 3 and round1["heldout_examples"] >= 1, round1  # >= 1 call per rollout
    assert round1["train_unaligned"] == 0 and 0.0 <= round1["train_solved"] <= 1.0
    curve = [json.loads(x) for x in (out / "sft_curve.jsonl").read_text().splitlines()]
    assert any(p.get("round") == 1 for p in curve)
    assert not (tmp_path / "dagger.dagger").exists()  # the rounds' checkpoints and workspaces are removed
    load_checkpoint(out)  # the result is a loadable checkpoint


def test_smoke_copy_head_policy_through_sft_and_grpo(ray_session, sft_checkpoint: tuple[Path, Path],
                                                     tmp_path: Path) -> None:
    """``model.copy_head: true`` (with ``copy_successor_keys`` and ``copy_context_only``): ``flywheel rl sft`` adds the head to a
    checkpoint without one, and the GRPO driver samples from it on Ray (the engine's cache holds the
    head's keys) and trains it; a run whose config leaves the head or its options out is refused,
    naming the field."""
    from rl.train.checkpoints import CheckpointError

    tasks, _ = sft_checkpoint
    root = tmp_path
    tok = tiny_tokenizer()
    torch.manual_seed(0)
    init = MoETransformer(ModelConfig.preset("tiny", vocab_size=tok.vocab_size, max_seq_len=2048))
    save_checkpoint(root / "init", init, tok, step=0, profile=COMPACT_PROFILE)
    head = {"preset": "tiny", "copy_head": True, "copy_min_distance": 4, "copy_successor_keys": True,
            "copy_context_only": True}
    (root / "sft.json").write_text(json.dumps({"model": head,
                                               "sft": {"lr": 3e-3, "batch": 3, "max_steps": 4, "eval_every": 2,
                                                       "patience": 2, "heldout_fraction": 0.25}}))
    rc = _cmd_sft(argparse.Namespace(tasks=tasks, init=root / "init", out=root / "sft", config=root / "sft.json",
                                     seed=0))
    assert rc == 0
    sft, _ = load_checkpoint(root / "sft")
    assert sft.cfg.copy_head and any(k.startswith("copy.") for k in sft.state_dict())
    assert sft.cfg.copy_min_distance == 4 and sft.cfg.copy_successor_keys and sft.cfg.copy_context_only
    assert sft.copy is not None and sft.copy.successor_keys is not None and "copy.successor_keys" in sft.state_dict()
    assert sft.copy is not None and torch.equal(sft.copy.twin, twin_ids(tok))  # the tokenizer's twins, saved
    run = {"name": "smoke-copy", "seed": 0, "out_dir": str(root / "run"), "tasks": str(tasks), "iterations": 1,
           "tasks_per_iteration": 2, "lr": 3e-3, "model": head | {"init": str(root / "sft")},
           "grpo": {"group_size": 4, "norm_tokens": 64, "micro_batch": 4},
           "limits": {"max_model_calls": 2, "max_output_tokens": 128, "max_wall_s": 60},
           "rollout": {"workers": 1, "max_tokens_per_call": 64}}
    seen: list[Rollout] = []
    res = train(validate_run_config(run), log=MemoryRolloutLog(), on_rollout=seen.append)
    assert len(seen) == 8 and res.iterations_done == 1
    assert sum(r.status is not RolloutStatus.INFRA_ERROR for r in seen) >= 6, [(r.status, r.detail) for r in seen]
    assert all(s.logprobs and all(lp <= 0 for lp in s.logprobs) for r in seen for s in r.segments if s.sampled)
    with pytest.raises(CheckpointError, match="copy_head: run False, checkpoint True"):
        train(validate_run_config(run | {"name": "no-head", "out_dir": str(root / "run2"),
                                         "model": {"preset": "tiny", "init": str(root / "sft")}}))
    with pytest.raises(CheckpointError, match="copy_min_distance: run 1, checkpoint 4"):
        train(validate_run_config(run | {"name": "near", "out_dir": str(root / "run3"),
                                         "model": {"preset": "tiny", "init": str(root / "sft"), "copy_head": True}}))
    with pytest.raises(CheckpointError, match="copy_successor_keys: run False, checkpoint True"):
        train(validate_run_config(run | {"name": "keyless", "out_dir": str(root / "run4"),
                                         "model": head | {"init": str(root / "sft"), "copy_successor_keys": False}}))
    with pytest.raises(CheckpointError, match="copy_context_only: run False, checkpoint True"):
        train(validate_run_config(run | {"name": "self-copy", "out_dir": str(root / "run5"),
                                         "model": head | {"init": str(root / "sft"), "copy_context_only": False}}))
