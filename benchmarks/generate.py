"""Generation engine throughput and time to first token on this machine's CPU.

A randomly initialised MoE (``--preset``, default ``small``: the CPU training
size) behind the real :class:`agent.model.engine.Engine`, driven through its
asyncio API exactly as the local policy and the endpoint drive it. For each
concurrency level C in 1, 8, 32: C requests arrive together (prompt of
``--prompt-tokens`` tokens, ``--max-tokens`` output tokens each, temperature
1, seeded) and the run is repeated for about ``--seconds``. Reported:

* ``tokens_per_s`` — generated tokens / wall time (prefills included);
* ``ttft_ms`` p50/p90 — from ``generate()`` to the first piece. With C
  simultaneous arrivals the prefills run one after another, so the p50 grows
  with C; ``ttft_join_busy_ms`` is a request joining an engine that is already
  decoding 31 others (continuous batching: it waits one decode step, not for
  the batch to drain);
* ``decode_step_ms`` — mean time of one batched decode step;
* ``speedup_32_vs_1`` — must be ≥ 4 (``pass``);
* ``logprob_max_abs_diff_vs_training_forward`` — the engine's logprobs for 8
  sequences decoded together against ``model.logprobs`` (no cache) on the
  same tokens (fp32).

Why batching pays here: at these sizes one decode step is dominated by reading
the weights and by per-op overheads, which a batch of 32 shares; the matmul
work that grows with the batch is small next to them.

Usage: python benchmarks/generate.py [--quick]
"""

from __future__ import annotations

import argparse
import asyncio
import sysconfig
import time
from pathlib import Path

from _common import median, percentile, write_result

import torch

from agent.model.config import ModelConfig
from agent.model.engine import Engine, GenerationRequest
from agent.model.tokenizer import train_tokenizer
from agent.model.transformer import MoETransformer


def build(preset: str, max_slots: int) -> tuple[Engine, ModelConfig, MoETransformer]:
    # the tokenizer only has to decode what the model samples; the standard library is stable text
    stdlib = Path(sysconfig.get_paths()["stdlib"])
    texts = [p.read_text(errors="replace") for p in sorted(stdlib.glob("*.py"))[:150]]
    cfg0 = ModelConfig.preset(preset)
    tok = train_tokenizer(texts, cfg0.vocab_size)
    cfg = ModelConfig.preset(preset, vocab_size=tok.vocab_size)  # every id the model samples decodes
    torch.manual_seed(0)
    model = MoETransformer(cfg).eval()
    return Engine(model, tok, max_slots=max_slots), cfg, model


async def first_piece_and_rest(engine: Engine, req: GenerationRequest) -> tuple[float, int]:
    """(seconds to the first piece, tokens generated)."""
    start = time.perf_counter()
    ttft, n = -1.0, 0
    async for piece in engine.generate(req):
        if ttft < 0:
            ttft = time.perf_counter() - start
        n += len(piece.token_ids)
    return ttft, n


def request(i: int, prompt_tokens: int, max_tokens: int, vocab: int) -> GenerationRequest:
    g = torch.Generator().manual_seed(i)
    ids = torch.randint(10, vocab, (prompt_tokens,), generator=g).tolist()
    return GenerationRequest(ids, max_tokens=max_tokens, temperature=1.0, seed=i)


async def level(engine: Engine, c: int, args: argparse.Namespace, vocab: int) -> dict:
    ttfts: list[float] = []
    tokens, wall, rounds, steps0 = 0, 0.0, 0, engine.stats.decode_steps
    step_time = 0.0
    while wall < args.seconds or rounds == 0:
        reqs = [request(rounds * 1000 + i, args.prompt_tokens, args.max_tokens, vocab) for i in range(c)]
        start = time.perf_counter()
        out = await asyncio.gather(*(first_piece_and_rest(engine, r) for r in reqs))
        wall += time.perf_counter() - start
        ttfts += [t for t, _ in out]
        tokens += sum(n for _, n in out)
        rounds += 1
    steps = engine.stats.decode_steps - steps0
    step_time = wall / max(steps, 1)
    return {
        "concurrency": c, "rounds": rounds, "tokens": tokens, "wall_s": round(wall, 3),
        "tokens_per_s": round(tokens / wall, 1),
        "ttft_ms": {"p50": round(median(ttfts) * 1000, 2), "p90": round(percentile(ttfts, 90) * 1000, 2)},
        "decode_step_ms": round(step_time * 1000, 2),
    }


async def join_busy(engine: Engine, args: argparse.Namespace, vocab: int, n: int) -> list[float]:
    """TTFT of requests that arrive while 31 others are mid-generation."""
    started = 0

    async def background(i: int) -> None:
        nonlocal started
        first = True
        async for _ in engine.generate(request(50_000 + i, args.prompt_tokens, 10_000, vocab)):
            if first:
                started, first = started + 1, False

    tasks = [asyncio.create_task(background(i)) for i in range(31)]
    while started < 31:
        await asyncio.sleep(0.005)
    ttfts = []
    for i in range(n):
        t, _ = await first_piece_and_rest(engine, request(60_000 + i, args.prompt_tokens, 1, vocab))
        ttfts.append(t)
    for task in tasks:
        task.cancel()
    await asyncio.gather(*tasks, return_exceptions=True)
    return ttfts


async def consistency(engine: Engine, model: MoETransformer, args: argparse.Namespace, vocab: int) -> float:
    """Max |engine logprob - training-forward logprob| over 8 sequences decoded together."""
    reqs = [request(80_000 + i, args.prompt_tokens + i, 32, vocab) for i in range(8)]
    done = await asyncio.gather(*(engine.complete(r) for r in reqs))
    worst = 0.0
    with torch.inference_mode():
        for r, c in zip(reqs, done, strict=True):
            ref = model.logprobs(torch.tensor([r.prompt_ids + c.token_ids]))[0, len(r.prompt_ids) - 1 :]
            worst = max(worst, (ref - torch.tensor(c.logprobs)).abs().max().item())
    return worst


async def run(args: argparse.Namespace) -> dict:
    engine, cfg, model = build(args.preset, max_slots=32)
    await engine.start()
    try:
        await level(engine, 1, argparse.Namespace(**{**vars(args), "seconds": 0}), cfg.vocab_size)  # warm-up
        levels = [await level(engine, c, args, cfg.vocab_size) for c in (1, 8, 32)]
        busy = await join_busy(engine, args, cfg.vocab_size, 5 if args.quick else 10)
        worst = await consistency(engine, model, args, cfg.vocab_size)
    finally:
        await engine.stop()
    speedup = levels[2]["tokens_per_s"] / levels[0]["tokens_per_s"]
    return {
        "config": {"preset": args.preset, **{k: getattr(cfg, k) for k in (
            "vocab_size", "d_model", "n_layers", "n_heads", "n_kv_heads", "n_experts", "top_k", "d_ff")}},
        "params": {"total": model.num_params(), "active_per_token": model.num_params(active=True)},
        "torch_threads": torch.get_num_threads(),
        "prompt_tokens": args.prompt_tokens, "max_tokens": args.max_tokens,
        "levels": levels,
        "ttft_p50_ms": levels[0]["ttft_ms"]["p50"],
        "ttft_join_busy_ms": {"p50": round(median(busy) * 1000, 2), "p90": round(percentile(busy, 90) * 1000, 2)},
        "speedup_32_vs_1": round(speedup, 2),
        "logprob_max_abs_diff_vs_training_forward": worst,
        "pass": speedup >= 4 and worst <= 1e-4,
    }


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--preset", default="small")
    p.add_argument("--prompt-tokens", type=int, default=32)
    p.add_argument("--max-tokens", type=int, default=64)
    p.add_argument("--seconds", type=float, default=10.0, help="minimum measured time per concurrency level")
    p.add_argument("--quick", action="store_true", help="short run (about 20 s)")
    args = p.parse_args()
    if args.quick:
        args.seconds = min(args.seconds, 2.0)
    result = asyncio.run(run(args))
    write_result("generate_quick" if args.quick else "generate", result)
    raise SystemExit(0 if result["pass"] else 1)


if __name__ == "__main__":
    main()
