"""A smoke run of benchmarks/rl_pass_at_k.py: a random tiny checkpoint on two built held-out tasks,
k=2 samples and one greedy rollout each, through the production evaluation (Ray workers, the
sandbox, the graders). A random model solves nothing; what is checked is the result's shape and
that every rollout was scored (the figures themselves come from a trained start)."""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from agent.model.checkpoint import save_checkpoint
from agent.model.config import ModelConfig
from agent.model.transformer import MoETransformer
from agent.prompt import COMPACT_PROFILE
from rl.tasks.build import build_task_set
from tests.agent.model.test_engine import tiny_tokenizer
from tools.sandbox import make_sandbox

ROOT = Path(__file__).resolve().parents[2]
pytestmark = [pytest.mark.benchmark_smoke, pytest.mark.timeout(300)]


def test_pass_at_k_reports_the_curve_groups_and_greedy(tmp_path: Path) -> None:
    tasks = tmp_path / "tasks.jsonl"
    asyncio.run(build_task_set(["fix_bug", "find_change"], 0, 2, 0, tasks, sandbox=make_sandbox()))
    tok = tiny_tokenizer()
    torch.manual_seed(0)
    model = MoETransformer(ModelConfig.preset("tiny", vocab_size=tok.vocab_size, max_seq_len=2048))
    save_checkpoint(tmp_path / "ckpt", model, tok, step=0, profile=COMPACT_PROFILE)
    proc = subprocess.run(
        [sys.executable, str(ROOT / "benchmarks" / "rl_pass_at_k.py"), "--checkpoint", str(tmp_path / "ckpt"),
         "--tasks", str(tasks), "-k", "2", "--greedy", "--max-model-calls", "2", "--max-tokens", "16",
         "--malformed-examples", "2", "--max-wall-s", "200", "--name", "rl_pass_at_k_smoke"],
        cwd=ROOT, capture_output=True, text=True, timeout=280,
        env={**os.environ, "FLYWHEEL_BENCH_RESULTS": str(tmp_path / "results")})
    assert proc.returncode == 0, proc.stderr[-3000:] + proc.stdout[-2000:]
    result = json.loads(proc.stdout.strip().splitlines()[-1])
    assert result == json.loads((tmp_path / "results" / "rl_pass_at_k_smoke.json").read_text())
    assert result["tasks"] == 2 and result["k"] == 2 and result["infra_errors"] == 0
    assert result["limits"] == {"max_model_calls": 2, "max_tokens_per_call": 16, "max_wall_s": 200.0}
    assert set(result["curve"]) == {"pass@1", "pass@2"}
    assert all(0.0 <= v <= 1.0 for v in result["curve"].values())
    assert result["curve"]["pass@2"] >= result["curve"]["pass@1"]
    assert sum(g["tasks"] for g in result["by_family"].values()) == 2
    assert 0.0 <= result["greedy_pass_rate"] <= 1.0
    assert result["behaviour"]["rollouts"] == 4 and result["greedy_behaviour"]["rollouts"] == 2
    # every rejected call of the sampled rollouts is tallied by kind
    assert result["malformed_total"] == round(result["behaviour"]["rollout_malformed_calls"] * 4)
    assert sum(result["malformed_reasons"].values()) <= result["malformed_total"]
    assert sum(result["malformed_by_finish"].values()) == result["malformed_total"]
    assert len(result["malformed_examples"]) == min(2, result["malformed_total"])


def test_pass_curve_uses_the_unbiased_estimator() -> None:
    sys.path.insert(0, str(ROOT / "benchmarks"))
    from rl_pass_at_k import pass_curve

    per_task = {"a": {"n": 4.0, "correct": 1.0}, "b": {"n": 4.0, "correct": 0.0}}
    curve = pass_curve(per_task, 4)
    assert list(curve) == ["pass@1", "pass@2", "pass@4"]
    assert curve["pass@1"] == pytest.approx(0.125) and curve["pass@2"] == pytest.approx(0.25)
    assert curve["pass@4"] == pytest.approx(0.5)
    assert list(pass_curve(per_task, 3)) == ["pass@1", "pass@2", "pass@3"]
