"""A smoke run of benchmarks/copy_weight.py: two SFT continuations of a tiny checkpoint on a few
built tasks, side by side; the result has both curves with the copy-token figures (the numbers
themselves come from the full run on a trained start)."""

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


def test_copy_weight_runs_both_weights_and_reports_copy_figures(tmp_path: Path) -> None:
    tasks = tmp_path / "tasks.jsonl"
    asyncio.run(build_task_set(["fix_bug", "rename", "find_change", "implement_stub"], 8, 0, 0, tasks,
                               sandbox=make_sandbox()))
    tok = tiny_tokenizer()
    torch.manual_seed(0)
    model = MoETransformer(ModelConfig.preset("tiny", vocab_size=tok.vocab_size, max_seq_len=2048))
    save_checkpoint(tmp_path / "init", model, tok, step=0, profile=COMPACT_PROFILE)
    proc = subprocess.run(
        [sys.executable, str(ROOT / "benchmarks" / "copy_weight.py"), "--tasks", str(tasks), "--init",
         str(tmp_path / "init"), "--steps", "4", "--eval-every", "2", "--renamings", "0", "--weight", "3",
         "--work-dir", str(tmp_path / "work"), "--name", "copy_weight_smoke", "--plot-dir", str(tmp_path / "plots")],
        cwd=ROOT, capture_output=True, text=True, timeout=280,
        env={**os.environ, "FLYWHEEL_BENCH_RESULTS": str(tmp_path / "results")})
    assert proc.returncode == 0, proc.stderr[-3000:] + proc.stdout[-2000:]
    result = json.loads(proc.stdout.strip().splitlines()[-1])
    assert result == json.loads((tmp_path / "results" / "copy_weight_smoke.json").read_text())
    assert (tmp_path / "plots" / "copy_weight_smoke.png").stat().st_size > 0
    assert set(result["curves"]) == {"copy_weight 1", "copy_weight 3"}
    for curve in result["curves"].values():
        assert [p["step"] for p in curve][-1] == 4
        last = curve[-1]
        assert 0.0 <= last["heldout_copy_acc"] <= 1.0 and last["heldout_copy_loss"] > 0
    # the same start and the same held-out demonstrations: both runs begin from the same figures
    first = [c[0]["heldout_copy_loss"] for c in result["curves"].values()]
    assert first[0] == pytest.approx(first[1], rel=1e-5)
