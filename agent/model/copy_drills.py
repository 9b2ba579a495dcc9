"""Copy drills: next-token training that teaches a small model to copy a name from its context.

A drill is one user message naming a path made of random letters (nothing to memorise)
answered by a ``read_file`` call on exactly that path, in the chat template the policy is
trained and served with; several drills are packed into each training window. Measured by
:func:`copy_accuracy`: the share of fresh paths whose every token is the model's argmax
(teacher-forced; chance is 0).

Why (docs/rl/runs.md): the CPU-scale policy's SFT start wrote invented paths instead of
the ones in its request, so no task ever succeeded. ``benchmarks/copy_probe.py`` showed a
random init learns no copying from drills in 1,500 steps while the code-pretrained init
does; ``benchmarks/rl_learning.py --copy-drill-steps`` puts drills between pretraining and
SFT. Not guaranteed: that copying in drills transfers to longer task conversations with
several candidate names (the RL experiment measures that).
"""

from __future__ import annotations

import random
import string
from collections.abc import Callable
from typing import Any

__all__ = ["copy_accuracy", "drill", "train_on_drills", "window"]

REQUESTS = ("Please read {p}.", "Open {p} and show it to me.", "What is in {p}?", "Show me the file {p}.")


def _name(rng: random.Random) -> str:
    return "".join(rng.choice(string.ascii_lowercase) for _ in range(rng.randint(3, 7)))


def drill(rng: random.Random) -> tuple[str, str, str]:
    """(prefix, path, suffix) of one drill: the path is what the model must copy."""
    from agent.parser import encode_call

    path = "/".join(_name(rng) for _ in range(rng.randint(1, 2))) + rng.choice((".py", ".md", ".txt"))
    call = encode_call("read_file", {"path": path})
    before, after = call.split(path, 1)
    return (f"<|user|>\n{rng.choice(REQUESTS).format(p=path)}<|end|>\n<|assistant|>\n{before}", path,
            f"{after}<|end|>\n")


def window(rng: random.Random, tok: Any, max_len: int) -> tuple[list[int], list[tuple[int, int]]]:
    """Drills packed into one window of at most ``max_len`` ids; the (start, end) of each path's ids."""
    ids: list[int] = []
    spans: list[tuple[int, int]] = []
    while True:
        pre, path, post = drill(rng)
        a, b, c = tok.encode(pre), tok.encode(path), tok.encode(post)
        if len(ids) + len(a) + len(b) + len(c) > max_len:
            if not spans:
                raise ValueError(f"max_len {max_len} holds no drill")
            return ids, spans
        ids += a
        spans.append((len(ids), len(ids) + len(b)))
        ids += b + c


def copy_accuracy(model: Any, windows: list[tuple[list[int], list[tuple[int, int]]]]) -> float:
    """The share of drill paths the model reproduces exactly (teacher-forced argmax)."""
    import torch

    hit = n = 0
    with torch.no_grad():
        for ids, spans in windows:
            pred = model(torch.tensor([ids])).logits[0].argmax(-1)
            for s, e in spans:
                n += 1
                hit += bool(torch.equal(pred[s - 1: e - 1], torch.tensor(ids[s:e])))
    return hit / max(n, 1)


def train_on_drills(model: Any, tok: Any, *, steps: int, seed: int = 0, batch: int = 8, seq_len: int = 256,
                    lr: float = 2e-3, eval_every: int = 100, eval_windows: int = 16,
                    progress: Callable[[dict[str, Any]], None] | None = None) -> list[dict[str, Any]]:
    """Train ``model`` in place on ``steps`` batches of drills (AdamW, clipped); returns the curve
    of held-out copy accuracy every ``eval_every`` steps (and at 0 and the end)."""
    import time

    import torch

    rng, eval_rng = random.Random(seed), random.Random(10_000 + seed)
    held = [window(eval_rng, tok, seq_len) for _ in range(eval_windows)]
    opt = torch.optim.AdamW(model.parameters(), lr=lr, weight_decay=0.0)
    curve: list[dict[str, Any]] = []
    t0 = time.perf_counter()
    for step in range(steps + 1):
        if step % eval_every == 0 or step == steps:
            model.eval()
            curve.append({"step": step, "copy_accuracy": copy_accuracy(model, held),
                          "seconds": round(time.perf_counter() - t0, 1)})
            if progress is not None:
                progress(curve[-1])
            model.train()
        if step == steps:
            break
        rows = [window(rng, tok, seq_len)[0] for _ in range(batch)]
        x = torch.full((len(rows), max(len(r) for r in rows)), tok.pad_id)
        for i, r in enumerate(rows):
            x[i, : len(r)] = torch.tensor(r)
        out = model(x)
        target = x[:, 1:]
        mask = (target != tok.pad_id).float()
        logp = torch.log_softmax(out.logits[:, :-1], -1).gather(-1, target[..., None]).squeeze(-1)
        loss = -(logp * mask).sum() / mask.sum() + out.aux_loss
        opt.zero_grad()
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
    model.eval()
    return curve
