"""Rollouts on Ray: one inference actor, two rollout workers, a real (tiny, random) checkpoint."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest
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


def test_the_actor_streams_coalesced_pieces_that_join_to_the_completion(ray_session, tmp_path: Path) -> None:
    from agent.model.engine import GenerationRequest
    from rl.rollout.inference import ActorCompleter

    ray = ray_session
    tok = tiny_tokenizer()
    torch.manual_seed(0)
    model = MoETransformer(ModelConfig.preset("tiny", vocab_size=tok.vocab_size, max_seq_len=1024))
    ckpt = save_checkpoint(tmp_path / "ckpt", model, tok, step=0, profile=COMPACT_PROFILE)
    inference = start_inference(ckpt, max_slots=4, num_cpus=0.5, threads=1)
    completer = ActorCompleter(inference)
    request = GenerationRequest(prompt_ids=tok.encode("hello there"), max_tokens=48, seed=5)

    async def both():
        pieces = [p async for p in completer.generate(request)]
        return pieces, await completer.complete(request)

    pieces, done = asyncio.run(both())
    assert pieces[-1].finish_reason == done.finish_reason and all(p.finish_reason is None for p in pieces[:-1])
    assert [t for p in pieces for t in p.token_ids] == done.token_ids  # same seed: the same sample
    assert "".join(p.text for p in pieces) == done.text
    # (the second request reuses the first's cached prompt: the same tokens, logprobs equal to float noise)
    assert [x for p in pieces for x in p.logprobs] == pytest.approx(done.logprobs, abs=1e-4)
    assert 1 < len(pieces) <= len(done.token_ids)  # streamed, and never more pieces than tokens

    async def closed_early():  # closing the stream early frees the request on the actor
        async for _ in completer.generate(GenerationRequest(prompt_ids=tok.encode("hi"), max_tokens=400, seed=1)):
            break
        await asyncio.sleep(0.5)
        return await completer.complete(request)

    assert asyncio.run(closed_early()).token_ids == done.token_ids
    ray.kill(inference)


def test_the_actor_samples_the_same_tokens_reading_its_cache_by_gather_or_as_a_view(ray_session,
                                                                                    tmp_path: Path) -> None:
    """Concurrent requests share decode steps; the cache read (``slot_view_spread``) must not change a sample."""
    from agent.model.engine import GenerationRequest
    from rl.rollout.inference import ActorCompleter

    ray = ray_session
    tok = tiny_tokenizer()
    torch.manual_seed(0)
    model = MoETransformer(ModelConfig.preset("tiny", vocab_size=tok.vocab_size, max_seq_len=1024))
    ckpt = save_checkpoint(tmp_path / "ckpt", model, tok, step=0, profile=COMPACT_PROFILE)
    # different lengths, so rows finish out of order and the busy slots scatter (the engine's own
    # test, tests/agent/model/test_engine.py, checks that such steps read a view with spare rows)
    requests = [GenerationRequest(prompt_ids=tok.encode(f"request {i} " * (1 + i)), max_tokens=n, seed=i)
                for i, n in enumerate([4, 24, 6, 24, 9, 24])]

    def sample(spread: float) -> list[list[int]]:
        inference = start_inference(ckpt, max_slots=8, num_cpus=0.5, threads=1, slot_view_spread=spread)
        assert ray.get(inference.settings.remote())["slot_view_spread"] == spread  # the override reached the model
        completer = ActorCompleter(inference)

        async def all_at_once():
            return await asyncio.gather(*(completer.complete(r) for r in requests))

        done = asyncio.run(all_at_once())
        ray.kill(inference)
        return [list(d.token_ids) for d in done]

    view, gather = sample(2.0), sample(0.0)
    assert view == gather
    assert all(len(t) > 0 for t in view) and len({tuple(t) for t in view}) > 1
