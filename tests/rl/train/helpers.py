"""Rollouts built by hand on a tiny real model (no tokenizer needed: ids are small ints)."""

from __future__ import annotations

import torch

from agent.model.config import ModelConfig
from agent.model.transformer import MoETransformer
from rl.types import Rollout, RolloutStatus, Segment

VOCAB = 64


def tiny_model(seed: int = 0, **overrides: object) -> MoETransformer:
    torch.manual_seed(seed)
    kw: dict[str, object] = {"vocab_size": VOCAB, "max_seq_len": 64} | overrides
    return MoETransformer(ModelConfig.preset("tiny", **kw)).eval()  # type: ignore[arg-type]


def rollout(model: MoETransformer | None, prompt: list[int], sampled: list[list[int]], *, task: str = "t",
            sample: int = 0, reward: float | None = 0.0, status: RolloutStatus = RolloutStatus.FINISHED,
            between: list[int] | None = None, temperature: float = 1.0) -> Rollout:
    """A rollout: ``prompt``, then each of ``sampled`` (policy segments) separated by ``between``
    (a tool result). Sampler logprobs are the model's own at ``temperature`` (log_softmax of
    logits / temperature, so Δ is ~0 for a trainer at that temperature), or 0.0 without a model."""
    segments = [Segment(list(prompt), sampled=False)]
    for i, s in enumerate(sampled):
        if i:
            segments.append(Segment(list(between or [5, 6]), sampled=False))
        segments.append(Segment(list(s), sampled=True, logprobs=[0.0] * len(s)))
    r = Rollout(run_id="r", iteration=0, task_id=task, sample=sample, status=status, segments=segments,
                reward=reward)
    if model is not None:
        ids = torch.tensor([r.token_ids])
        with torch.no_grad():
            logp = torch.log_softmax(model(ids).logits[:, :-1] / temperature, dim=-1)
        lp = logp.gather(-1, ids[:, 1:, None]).squeeze(-1)[0].tolist()
        pos = 0
        for seg in r.segments:
            if seg.sampled:
                seg.logprobs = lp[pos - 1: pos - 1 + len(seg.token_ids)]
            pos += len(seg.token_ids)
    return r


def with_routes(model: MoETransformer, rs: list[Rollout]) -> list[Rollout]:
    """``rs`` with each segment's routes recorded as the sampler would (the model's own, per token)."""
    for r in rs:
        with torch.no_grad():
            routes = model(torch.tensor([r.token_ids]), return_routes=True).routes[0].tolist()
        pos = 0
        for seg in r.segments:
            seg.routes = routes[pos: pos + len(seg.token_ids)]
            pos += len(seg.token_ids)
    return rs
