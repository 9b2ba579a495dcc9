"""Rollouts on Ray: one inference actor, two rollout workers, a real (tiny, random) checkpoint."""

from __future__ import annotations

import asyncio
from pathlib import Path

import torch

from agent.model.checkpoint import save_checkpoint
from agent.model.config import ModelConfig
from agent.model.transformer import MoETransformer
from agent.prompt import COMPACT_PROFILE
from agent.session import Limits
from rl.rollout.inference import start_inference
from rl.rollout.worker import DirTask, RolloutJob, WorkerConfig, run_rollouts, start_workers
from rl.types import RolloutStatus
from tests.agent.model.test_engine import tiny_tokenizer


def test_two_workers_share_one_inference_actor(ray_session, tmp_path: Path) -> None:
    ray = ray_session
    tok = tiny_tokenizer()
    torch.manual_seed(0)
    model = MoETransformer(ModelConfig.preset("tiny", vocab_size=tok.vocab_size, max_seq_len=1024))
    ckpt = save_checkpoint(tmp_path / "ckpt", model, tok, step=0, profile=COMPACT_PROFILE)
    src = tmp_path / "task"
    src.mkdir()
    (src / "app.py").write_text("def add(a, b):\n    return a - b\n")
    tasks = [DirTask(f"t{i}", f"fix add ({i})", str(src)) for i in range(2)]
    inference = start_inference(ckpt, max_slots=8, num_cpus=0.5, threads=1)
    config = WorkerConfig(store_root=str(tmp_path / "store"), limits=Limits(max_steps=2, max_wall_s=60),
                          max_tokens=12)
    workers = start_workers(2, config, inference, num_cpus=0.5)
    jobs = [RolloutJob(t, "run", 0, g, seed=10 * i + g) for i, t in enumerate(tasks) for g in range(2)]
    rollouts = asyncio.run(run_rollouts(workers, jobs))
    stats = ray.get(inference.stats.remote())
    assert [(r.task_id, r.sample) for r in rollouts] == [(j.task.task_id, j.sample) for j in jobs]
    for r in rollouts:
        assert r.status in (RolloutStatus.FINISHED, RolloutStatus.LIMIT), r.detail
        assert r.segments and not r.segments[0].sampled and r.segments[1].sampled
        assert all(len(s.logprobs) == len(s.token_ids) for s in r.segments if s.sampled)
        assert r.segments[1].routes is not None and len(r.segments[1].routes) == len(r.segments[1].token_ids)
        assert r.events and r.events[0]["session_id"] == r.session_id
    # G samples of a task share their prompt: computed once per task prompt, then reused
    assert stats["cached_tokens"] > 0
    ray.get(inference.load_weights.remote(model.state_dict(), 3))
    assert ray.get(inference.weights_version.remote()) == 3
    for actor in (*workers, inference):
        ray.kill(actor)
