"""The training loop and exact resume, driven by a small IN-PROCESS rollout source (a test
stand-in for rl.rollout's Ray workers: it samples token sequences from a copy of the
trainer's weights with the global torch RNG, so a resume that lost the RNG state differs)."""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pytest
import torch

from agent.model.checkpoint import CheckpointError, load_checkpoint, load_meta, save_checkpoint
from agent.model.tokenizer import Tokenizer, train_tokenizer
from agent.prompt import profile_named
from rl.config import RunConfig
from rl.train.checkpoints import latest_checkpoint
from rl.train.loop import next_tasks, run_loop
from rl.types import GradeResult, Rollout, RolloutStatus, Segment
from tests.rl.train.helpers import tiny_model


@pytest.fixture(scope="module")
def tok() -> Tokenizer:
    return train_tokenizer(["def f(x):\n    return x + 1\n" * 20, "class A:\n    pass\n" * 20], 300)


class ToySource:
    """Reward = share of even token ids among 4 sampled ones; one rollout per task id is an infra error."""

    def __init__(self, vocab: int) -> None:
        self.model = tiny_model(seed=1, vocab_size=vocab)
        self.version = -1
        self.last_timings = {"generation": 0.0}

    def publish(self, state_dict: dict[str, Any], version: int) -> None:
        self.model.load_state_dict(state_dict)
        self.version = version

    def collect(self, task_ids: Sequence[str], *, iteration: int, group_size: int) -> list[Rollout]:
        out = []
        for t_i, task in enumerate(task_ids):
            for s in range(group_size):
                ids = [1, 7 + t_i]
                lps: list[float] = []
                with torch.no_grad():
                    for _ in range(4):
                        logp = torch.log_softmax(self.model(torch.tensor([ids])).logits[0, -1], -1)
                        nxt = int(torch.multinomial(logp.exp(), 1))
                        ids.append(nxt)
                        lps.append(float(logp[nxt]))
                reward = sum(i % 2 == 0 for i in ids[2:]) / 4
                status = RolloutStatus.INFRA_ERROR if s == group_size - 1 and t_i == 0 else RolloutStatus.FINISHED
                out.append(Rollout(run_id="toy", iteration=iteration, task_id=task, sample=s, status=status,
                                   segments=[Segment(ids[:2], False), Segment(ids[2:], True, lps)],
                                   weights_version=self.version, reward=reward,
                                   grade=GradeResult(reward > 0.5, "", 0.0), metrics={"model_calls": 1.0}))
        return out


def _cfg(out: Path, iterations: int = 2, temperature: float = 1.0) -> RunConfig:
    return RunConfig.model_validate({"out_dir": str(out), "iterations": iterations, "tasks_per_iteration": 2,
                                     "lr": 1e-2, "seed": 3, "grpo": {"group_size": 4, "norm_tokens": 4},
                                     "rollout": {"temperature": temperature}})


def _run(out: Path, tok: Tokenizer, *, stop_after: int | None = None, scramble: bool = False,
         temperature: float = 1.0) -> Any:
    model = tiny_model(seed=1, vocab_size=tok.vocab_size)  # the same init every time (a fresh process)
    if scramble:  # what a fresh process's RNG would be: not the run's
        torch.manual_seed(12345)
    return model, run_loop(_cfg(out, temperature=temperature), model=model, tokenizer=tok, profile=profile_named("compact"),
                           task_ids=[f"task{i}" for i in range(3)], source=ToySource(tok.vocab_size),
                           stop_after=stop_after)


def test_killed_and_resumed_run_gives_identical_weights(tmp_path: Path, tok: Tokenizer) -> None:
    straight, res = _run(tmp_path / "a", tok)
    assert res.iterations_done == 2 and res.weights_version == 2
    recs = [json.loads(line) for line in (tmp_path / "a" / "metrics.jsonl").read_text().splitlines()]
    assert [r["iteration"] for r in recs] == [1, 2] and all(r["n_infra_excluded"] == 1 for r in recs)
    assert (tmp_path / "a" / "curves.png").is_file()

    _, first = _run(tmp_path / "b", tok, stop_after=1)  # then the process is killed
    assert first.iterations_done == 1
    resumed, res_b = _run(tmp_path / "b", tok, scramble=True)
    assert res_b.iterations_done == 2 and res_b.weights_version == 2
    a, b = straight.state_dict(), resumed.state_dict()
    assert all(torch.equal(a[k], b[k]) for k in a), "resumed weights differ from the uninterrupted run's"
    # the trained checkpoint is a serving checkpoint: loads with the one loader, profile included
    served, _ = load_checkpoint(latest_checkpoint(tmp_path / "b"))
    assert all(torch.equal(served.state_dict()[k], b[k]) for k in b)
    extra = load_meta(latest_checkpoint(tmp_path / "b"))["extra"]
    assert extra["rl"] is True and extra["weights_version"] == 2 and extra["train_temperature"] == 1.0


def test_a_checkpoint_records_the_temperature_it_was_trained_at(tmp_path: Path, tok: Tokenizer) -> None:
    _run(tmp_path, tok, stop_after=1, temperature=0.7)
    assert load_meta(latest_checkpoint(tmp_path))["extra"]["train_temperature"] == 0.7


def test_resume_refuses_a_checkpoint_of_another_architecture(tmp_path: Path, tok: Tokenizer) -> None:
    _run(tmp_path, tok, stop_after=1)
    other = tiny_model(vocab_size=tok.vocab_size, n_layers=1)
    save_checkpoint(latest_checkpoint(tmp_path), other, tok, step=1, profile=profile_named("compact"))
    with pytest.raises(CheckpointError, match=r"another architecture .*n_layers: run 2, checkpoint 1"):
        _run(tmp_path, tok)


def test_task_order_is_epoch_shuffled_and_wraps() -> None:
    ids = ["a", "b", "c"]
    picked, order, pos, epoch = next_tasks(ids, 2, seed=0, order=[], pos=0, epoch=0)
    assert sorted(order) == ids and picked == order[:2] and pos == 2 and epoch == 0
    picked2, order2, pos2, epoch2 = next_tasks(ids, 2, seed=0, order=order, pos=pos, epoch=epoch)
    assert picked2[0] == order[2] and epoch2 == 1 and pos2 == 1 and sorted(order2) == ids


def test_heldout_evaluation_runs_at_the_start_every_n_iterations_and_at_the_end(tmp_path: Path,
                                                                               tok: Tokenizer) -> None:
    seen: list[tuple[int, int]] = []  # (iteration asked, weights version the source held)
    source = ToySource(tok.vocab_size)

    def evaluate(iteration: int) -> dict[str, float]:
        seen.append((iteration, source.version))
        return {"heldout_pass_at_1": iteration / 10}

    cfg = RunConfig.model_validate({"out_dir": str(tmp_path), "iterations": 3, "tasks_per_iteration": 2, "lr": 1e-2,
                                    "seed": 3, "grpo": {"group_size": 4, "norm_tokens": 4}, "eval": {"every": 2}})
    run_loop(cfg, model=tiny_model(seed=1, vocab_size=tok.vocab_size), tokenizer=tok,
             profile=profile_named("compact"), task_ids=["a", "b", "c"], source=source, evaluate=evaluate)
    # iteration 0 before any update, then every 2nd, then the last; always on the published weights
    assert [it for it, _ in seen] == [0, 2, 3]
    assert [v for _, v in seen] == [0, 2, 3]
    recs = [json.loads(line) for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    assert [r["iteration"] for r in recs] == [0, 1, 2, 3]
    assert [r.get("heldout_pass_at_1") for r in recs] == [0.0, None, 0.2, 0.3]
    assert "loss" not in recs[0] and "loss" in recs[1]

    # a resumed run does not evaluate the start again
    seen.clear()
    cfg4 = cfg.model_copy(update={"iterations": 4})
    run_loop(cfg4, model=tiny_model(seed=1, vocab_size=tok.vocab_size), tokenizer=tok,
             profile=profile_named("compact"), task_ids=["a", "b", "c"], source=source, evaluate=evaluate)
    assert [it for it, _ in seen] == [4]


class OutcomeSource(ToySource):
    """``easy*`` tasks are always solved, ``hard*`` never, ``mixed*`` in half the samples; every
    rollout samples 4 tokens from the published weights (so an update changes them). Records each
    ``collect`` call's tasks and seed offset."""

    def __init__(self, vocab: int) -> None:
        super().__init__(vocab)
        self.calls: list[tuple[list[str], int]] = []

    def collect(self, task_ids: Sequence[str], *, iteration: int, group_size: int,
                seed_offset: int = 0) -> list[Rollout]:
        self.calls.append((list(task_ids), seed_offset))
        out = super().collect(task_ids, iteration=iteration, group_size=group_size)
        for r in out:
            r.status = RolloutStatus.FINISHED
            solved = r.task_id.startswith("easy") or (r.task_id.startswith("mixed") and r.sample % 2 == 0)
            # the shaping terms differ inside EVERY group (sample 1 "hit a limit"): without dynamic
            # sampling all groups have reward variance
            r.reward = float(solved) - (0.1 if r.sample == 1 else 0.0)
            r.reward_terms = {"success": float(solved)}
            r.grade = GradeResult(solved, "", 0.0)
        return out


def test_dynamic_sampling_draws_until_success_varies_and_trains_only_on_those_groups(tmp_path: Path,
                                                                                     tok: Tokenizer) -> None:
    from rl.train.loop import success_varied_groups

    source = OutcomeSource(tok.vocab_size)
    cfg = RunConfig.model_validate({"out_dir": str(tmp_path), "iterations": 1, "tasks_per_iteration": 2,
                                    "lr": 1e-2, "seed": 0, "grpo": {"group_size": 4, "norm_tokens": 4,
                                                                    "dynamic_sampling": "success", "max_draws": 3}})
    ids = ["easy0", "easy1", "hard0", "hard1", "mixed0"]
    run_loop(cfg, model=tiny_model(seed=1, vocab_size=tok.vocab_size), tokenizer=tok,
             profile=profile_named("compact"), task_ids=ids, source=source)
    drawn = [t for tasks, _ in source.calls for t in tasks]
    # only one task can ever vary in success, so the loop draws its cap of 3 x 2 tasks (one epoch and a wrap)
    assert len(source.calls) == 3 and [off for _, off in source.calls] == [0, 1000, 2000]
    assert "mixed0" in drawn and len(drawn) == 6
    rec = json.loads((tmp_path / "metrics.jsonl").read_text().splitlines()[-1])
    assert rec["draws"] == 3 and rec["rollouts"] == 24 and rec["tasks"] == 6
    assert rec["groups_success_varied"] >= 1
    assert rec["n_rollouts"] == 4 * drawn.count("mixed0")  # the update saw the mixed group only
    assert rec["stepped"] == 1.0
    assert success_varied_groups([]) == []


def test_dynamic_sampling_stops_drawing_once_enough_groups_vary(tmp_path: Path, tok: Tokenizer) -> None:
    source = OutcomeSource(tok.vocab_size)
    cfg = RunConfig.model_validate({"out_dir": str(tmp_path), "iterations": 2, "tasks_per_iteration": 1,
                                    "lr": 1e-2, "seed": 0, "grpo": {"group_size": 4, "norm_tokens": 4,
                                                                    "dynamic_sampling": "success", "max_draws": 5}})
    run_loop(cfg, model=tiny_model(seed=1, vocab_size=tok.vocab_size), tokenizer=tok,
             profile=profile_named("compact"), task_ids=["hard0", "mixed0"], source=source)
    recs = [json.loads(line) for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    for rec in recs:  # each iteration draws until it has mixed0, never past it
        assert rec["groups_success_varied"] == 1 and rec["n_rollouts"] == 4 and rec["stepped"] == 1.0
    assert [t for tasks, _ in source.calls for t in tasks].count("hard0") == sum(r["draws"] for r in recs) - 2


def test_without_dynamic_sampling_shaping_only_groups_are_trained_on(tmp_path: Path, tok: Tokenizer) -> None:
    source = OutcomeSource(tok.vocab_size)
    cfg = RunConfig.model_validate({"out_dir": str(tmp_path), "iterations": 1, "tasks_per_iteration": 2,
                                    "lr": 1e-2, "seed": 0, "grpo": {"group_size": 4, "norm_tokens": 4}})
    run_loop(cfg, model=tiny_model(seed=1, vocab_size=tok.vocab_size), tokenizer=tok,
             profile=profile_named("compact"), task_ids=["hard0", "hard1"], source=source)
    rec = json.loads((tmp_path / "metrics.jsonl").read_text().splitlines()[-1])
    assert len(source.calls) == 1 and rec["n_rollouts"] == 8 and "draws" not in rec
    assert rec["n_groups_zero_std"] == 0 and rec["stepped"] == 1.0  # no success anywhere, yet an update


def _replay_run(out: Path, tok: Tokenizer, *, stop_after: int | None = None,
                scramble: bool = False) -> tuple[Any, OutcomeSource]:
    source = OutcomeSource(tok.vocab_size)
    cfg = RunConfig.model_validate({"out_dir": str(out), "iterations": 6, "tasks_per_iteration": 2,
                                    "lr": 1e-2, "seed": 0, "grpo": {"group_size": 4, "norm_tokens": 4,
                                                                    "replay_tasks": 1, "replay_limit": 2}})
    model = tiny_model(seed=1, vocab_size=tok.vocab_size)
    if scramble:
        torch.manual_seed(12345)
    ids = ["mixed0", "mixed1", *(f"hard{i}" for i in range(6))]
    run_loop(cfg, model=model, tokenizer=tok, profile=profile_named("compact"), task_ids=ids, source=source,
             stop_after=stop_after)
    return model, source


def test_frontier_replay_draws_varied_tasks_again_up_to_the_limit(tmp_path: Path, tok: Tokenizer) -> None:
    _, source = _replay_run(tmp_path, tok)
    draws = [tasks for tasks, _ in source.calls]
    recs = [json.loads(line) for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    assert len(draws) == 6 and all(len(d) == 2 and len(set(d)) == 2 for d in draws)
    for i in range(1, 6):
        before = [t for t in draws[i - 1] if t.startswith("mixed")]
        streak = 1  # how many iterations in a row before[0] has been drawn, ending at i - 1
        while before and i - 1 - streak >= 0 and before[0] in draws[i - 1 - streak]:
            streak += 1
        if before and streak <= 2:  # drawn fresh, or replayed fewer than 2 times: it comes back first
            assert draws[i][0] in before, (i, draws)
            assert recs[i]["replayed_tasks"] == 1 and recs[i]["replayed_varied"] == 1
        # nothing is drawn more than 1 + replay_limit iterations in a row
        for t in draws[i]:
            assert sum(t in draws[j] for j in range(max(0, i - 3), i + 1)) <= 3
    assert sum(r["replayed_tasks"] for r in recs) >= 2  # the mixed tasks come first in the order often enough


def test_a_resumed_run_replays_what_the_uninterrupted_one_would(tmp_path: Path, tok: Tokenizer) -> None:
    straight, a = _replay_run(tmp_path / "a", tok)
    _replay_run(tmp_path / "b", tok, stop_after=3)  # killed after iteration 3, buffer non-empty
    resumed, b = _replay_run(tmp_path / "b", tok, scramble=True)
    assert [t for t, _ in a.calls[3:]] == [t for t, _ in b.calls]
    sa, sb = straight.state_dict(), resumed.state_dict()
    assert all(torch.equal(sa[k], sb[k]) for k in sa)


def test_replay_must_leave_room_for_fresh_tasks() -> None:
    with pytest.raises(Exception, match="replay_tasks: 2 must be below tasks_per_iteration"):
        RunConfig.model_validate({"tasks_per_iteration": 2, "grpo": {"replay_tasks": 2}})


def test_next_tasks_passes_over_excluded_ids_without_repeating_any() -> None:
    ids = ["a", "b", "c", "d"]
    picked, order, pos, _ = next_tasks(ids, 3, seed=0, order=[], pos=0, epoch=0, exclude={"a"})
    assert len(picked) == 3 and picked == [t for t in order[:pos] if t != "a"]  # "a" still used its place
    few, *_ = next_tasks(ids, 4, seed=0, order=order, pos=pos, epoch=0, exclude={"a", "b", "c"})
    assert few == ["d"]  # fewer than asked rather than "d" twice
