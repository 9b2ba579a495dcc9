"""RL rollout throughput on Ray: one iteration's time split, rollouts/s with 1 vs 2
rollout workers, prefill tokens computed with and without the prefix cache, the KV cache
read as a view or by gather (``model.slot_view_spread``; a repeated view arm is the control
for both speed and sampled tokens), peak memory.

The policy is the tiny preset with random weights, saved as a real checkpoint
(compact prompt profile), or ``--init CHECKPOINT`` (an SFT start, which writes real tool
calls, so the tools' share is measured too); it is served by the inference actor.
Rollouts are real sessions (production tools, bwrap sandbox) on small generated
workspaces, or on the first ``--tasks`` train-split tasks of ``--tasks-file`` (a
``flywheel rl tasks build`` file). Grading is
not part of this figure (rl/tasks grades; its time is reported by the trainer's
metrics), so ``grading_s`` is absent.

    .venv/bin/python benchmarks/rl_throughput.py [--tasks 4] [--group 4] [--init SFT_CKPT --tasks-file TASKS]
"""

from __future__ import annotations

import argparse
import asyncio
import resource
import tempfile
import time
from pathlib import Path

import _common  # noqa: F401  (repo on sys.path)
from _common import write_result


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--tasks", type=int, default=4)
    ap.add_argument("--group", type=int, default=4, help="G: rollouts per task")
    ap.add_argument("--max-steps", type=int, default=3)
    ap.add_argument("--max-tokens", type=int, default=32)
    ap.add_argument("--init", type=Path, help="serve this checkpoint (default: a random tiny model)")
    ap.add_argument("--tasks-file", type=Path, help="roll out these tasks' train split (default: toy workspaces)")
    ap.add_argument("--temperature", type=float, default=1.0, help="rollout sampling temperature")
    ap.add_argument("--name", default="rl_throughput", help="result name")
    args = ap.parse_args()

    import ray
    import torch

    from agent.model.checkpoint import save_checkpoint
    from agent.model.config import ModelConfig
    from agent.model.corpus import build_corpus
    from agent.model.tokenizer import train_tokenizer
    from agent.model.transformer import MoETransformer
    from agent.prompt import COMPACT_PROFILE
    from agent.session import Limits
    from rl.rollout.inference import start_inference
    from rl.rollout.worker import DirTask, RolloutJob, WorkerConfig, run_rollouts, start_workers

    ray.init(num_cpus=2, include_dashboard=False, object_store_memory=200 * 1024 * 1024, log_to_driver=False)
    tmp = Path(tempfile.mkdtemp(prefix="rl-throughput-"))
    if args.init is not None:
        ckpt = args.init
    else:
        corpus = build_corpus(max_bytes=1 << 20, n_transcripts=24, val_fraction=0.05, prompt_profile="compact")
        tok = train_tokenizer(corpus.texts("train"), 1024)
        torch.manual_seed(0)
        model = MoETransformer(ModelConfig.preset("tiny", vocab_size=tok.vocab_size, max_seq_len=2048))
        ckpt = save_checkpoint(tmp / "ckpt", model, tok, step=0, profile=COMPACT_PROFILE)
    tasks = []
    if args.tasks_file is not None:
        from rl.tasks.spec import GeneratedSource, load_tasks
        from rl.types import Split

        for t in [t for t in load_tasks(args.tasks_file) if t.split is Split.TRAIN][: args.tasks]:
            if not isinstance(t.source, GeneratedSource):
                raise SystemExit(f"{t.id}: only generated tasks are supported here")
            for rel, text in t.source.files.items():
                (tmp / t.id / rel).parent.mkdir(parents=True, exist_ok=True)
                (tmp / t.id / rel).write_text(text)
            tasks.append(DirTask(t.id, t.request, str(tmp / t.id)))
    for i in range(args.tasks - len(tasks) if args.tasks_file is None else 0):
        src = tmp / f"task{i}"
        src.mkdir()
        (src / f"mod{i}.py").write_text(f"def f{i}(x):\n    return x - {i}\n")
        (src / f"test_mod{i}.py").write_text(f"from mod{i} import f{i}\nassert f{i}(1) == {1 + i}\n")
        tasks.append(DirTask(f"t{i}", f"make test_mod{i}.py pass", str(src)))
    jobs = [RolloutJob(t, "bench", 0, g, seed=100 * i + g) for i, t in enumerate(tasks) for g in range(args.group)]
    limits = Limits(max_steps=args.max_steps, max_wall_s=300)

    def iteration(n_workers: int, prefix_cache: bool, slot_view_spread: float | None = None, tag: str = "") -> dict:
        inference = start_inference(ckpt, max_slots=32, num_cpus=1, threads=1, prefix_cache=prefix_cache,
                                    slot_view_spread=slot_view_spread)
        config = WorkerConfig(store_root=str(tmp / f"store-{n_workers}-{prefix_cache}-{slot_view_spread}{tag}"),
                              limits=limits, max_tokens=args.max_tokens, temperature=args.temperature)
        workers = start_workers(n_workers, config, inference, num_cpus=0.5)
        ray.get(inference.weights_version.remote())
        ray.get([w.peak_rss_mb.remote() for w in workers])  # actors up before the clock starts
        t0 = time.perf_counter()
        rollouts = asyncio.run(run_rollouts(workers, jobs))
        wall = time.perf_counter() - t0
        stats = ray.get(inference.stats.remote())
        peak = {"inference_mb": ray.get(inference.peak_rss_mb.remote()),
                "worker_mb_max": max(ray.get([w.peak_rss_mb.remote() for w in workers]))}
        for a in (*workers, inference):
            ray.kill(a)
        n = len(rollouts)
        return {
            "workers": n_workers, "prefix_cache": prefix_cache, "slot_view_spread": slot_view_spread, "rollouts": n, "wall_s": round(wall, 3),
            "rollouts_per_s": round(n / wall, 3),
            "statuses": {s: sum(r.status.value == s for r in rollouts) for s in sorted({r.status.value for r in rollouts})},
            "time_split_s": {  # summed over rollouts (they overlap in time)
                "generation": round(sum(r.metrics["generation_s"] for r in rollouts), 3),
                "tools": round(sum(r.metrics["tools_s"] for r in rollouts), 3),
                "rollout_wall": round(sum(r.metrics["wall_s"] for r in rollouts), 3),
            },
            "model_calls": sum(r.metrics["model_calls"] for r in rollouts),
            "sampled_tokens": sum(r.metrics["sampled_tokens"] for r in rollouts),
            "sampled_tokens_per_s": round(sum(r.metrics["sampled_tokens"] for r in rollouts) / wall, 1),
            "prompt_tokens": stats["prompt_tokens"], "prefill_tokens_computed": stats["prefill_tokens"],
            "prefill_tokens_cached": stats["cached_tokens"], "peak_memory": peak,
            "_samples": {(r.task_id, r.sample): [t for seg in r.segments if seg.sampled for t in seg.token_ids]
                         for r in rollouts},
        }

    # the KV-cache read: view (the model's default), gather, view again. The arms run one after
    # another (each starts its own actors), so the repeat is the control: how far two identical
    # arms differ in speed, and whether they sample the same tokens (same jobs and seeds; a batch's
    # makeup can move a logit in the last float bit, which can change a sample)
    runs = [iteration(1, True), iteration(2, True), iteration(2, True, slot_view_spread=0.0),
            iteration(2, True, tag="-repeat"), iteration(2, False)]
    ray.shutdown()
    one, two, gather, again, nocache = runs

    def same(a: dict, b: dict) -> float:
        keys = a["_samples"].keys() | b["_samples"].keys()
        return sum(a["_samples"].get(k) == b["_samples"].get(k) for k in keys) / max(len(keys), 1)

    same_gather, same_repeat = same(two, gather), same(two, again)
    for r in runs:
        del r["_samples"]
    write_result(args.name, {
        "config": {"tasks": len(tasks), "group": args.group, "max_steps": args.max_steps,
                   "max_tokens": args.max_tokens, "temperature": args.temperature, "model": str(args.init) if args.init else "tiny (random init)",
                   "tasks_file": str(args.tasks_file) if args.tasks_file else None, "ray_cpus": 2},
        "runs": runs,
        "rollouts_per_s": {"1_worker": one["rollouts_per_s"], "2_workers": two["rollouts_per_s"]},
        # 2 workers, prefix cache on, the same jobs and seeds; sampled tokens per second of wall time
        # (tools and sandboxes included, as a rollout's time is)
        "kv_read": {"view_sampled_tokens_per_s": two["sampled_tokens_per_s"],
                    "gather_sampled_tokens_per_s": gather["sampled_tokens_per_s"],
                    "view_repeat_sampled_tokens_per_s": again["sampled_tokens_per_s"],
                    "view_over_gather": round(two["sampled_tokens_per_s"] / max(gather["sampled_tokens_per_s"], 1e-9), 3),
                    "view_repeat_over_gather": round(again["sampled_tokens_per_s"]
                                                     / max(gather["sampled_tokens_per_s"], 1e-9), 3),
                    "same_samples_view_gather": round(same_gather, 3),
                    "same_samples_view_view": round(same_repeat, 3)},
        "prefill_tokens": {"with_cache": two["prefill_tokens_computed"], "without_cache": nocache["prefill_tokens_computed"]},
        "driver_peak_rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
    })


if __name__ == "__main__":
    main()
