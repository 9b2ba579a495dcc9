"""benchmarks/rl_demo_tokens.py: the demonstrations' sampled tokens per family and style, and how
many times fewer a policy would spend by always taking each task's shortest demonstrated form."""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
from pathlib import Path
from types import ModuleType

import pytest

from rl.tasks.build import build_task_set
from tests.agent.model.test_engine import tiny_tokenizer
from tests.benchmarks.bench_module import load_benchmark
from tools.sandbox import make_sandbox

ROOT = Path(__file__).resolve().parents[2]
pytestmark = pytest.mark.timeout(300)


def _module() -> ModuleType:
    return load_benchmark("rl_demo_tokens")


def test_the_mix_weighs_styles_like_the_sft_draw_and_blind_is_not_an_informed_floor() -> None:
    rows = [{"task": "a", "family": "rename", "style": s, "tokens": n, "model_calls": 3}
            for s, n in (("parallel", 300), ("sequential", 500), ("blind", 100), ("search", 300), ("shell", 80))]
    rows += [{"task": "b", "family": "fix_bug", "style": s, "tokens": n, "model_calls": 3}
             for s, n in (("parallel", 200), ("sequential", 240), ("blind", 120), ("search", 240))]
    out = _module().summarise(rows, shell_share=0.5)
    # a: plain styles' mean 300, half the draws the shell form (80) -> 190; its shortest is the shell form
    assert out["rename"]["mix_tokens"] == 190 and out["rename"]["shortest_tokens"] == 80
    assert out["rename"]["ratio_mix_to_shortest_informed"] == pytest.approx(190 / 80)
    # b has no shell form: the mix is the four styles' mean (200); blind (120) is the shortest, but not informed
    assert out["fix_bug"]["mix_tokens"] == 200 and out["fix_bug"]["shortest_tokens"] == 120
    assert out["fix_bug"]["shortest_informed_tokens"] == 200
    assert out["fix_bug"]["shortest_style_counts"]["blind"] == 1
    assert out["all"]["tasks"] == 2 and out["all"]["mix_tokens"] == 195
    assert out["all"]["styles"]["shell"] == {"tokens": 80, "model_calls": 3, "n": 1}


def test_with_narration_the_mix_is_narrated_and_the_floor_is_plain() -> None:
    rows = [{"task": "a", "family": "fix_bug", "style": s, "narration": n, "tokens": t, "model_calls": 3}
            for s, n, t in (("parallel", 0, 200), ("parallel", 3, 320), ("search", 0, 240), ("search", 3, 400),
                            ("blind", 0, 120), ("blind", 3, 180))]
    out = _module().summarise(rows, shell_share=0.5)["fix_bug"]
    assert out["mix_tokens"] == pytest.approx((320 + 400 + 180) / 3)  # what a narrating start imitates
    assert out["shortest_tokens"] == 120 and out["shortest_informed_tokens"] == 200  # narration dropped
    assert out["styles"]["parallel+narration"]["tokens"] == 320 and out["styles"]["parallel"]["tokens"] == 200


@pytest.mark.benchmark_smoke
def test_it_records_every_style_of_real_tasks(tmp_path: Path) -> None:
    tasks = tmp_path / "tasks.jsonl"
    asyncio.run(build_task_set(["fix_bug", "rename"], 4, 0, 0, tasks, sandbox=make_sandbox()))
    tiny_tokenizer().save(tmp_path / "tok")
    proc = subprocess.run(
        [sys.executable, str(ROOT / "benchmarks" / "rl_demo_tokens.py"), "--tasks", str(tasks), "--tokenizer",
         str(tmp_path / "tok"), "--per-family", "1", "--name", "rl_demo_tokens_smoke"],
        cwd=ROOT, capture_output=True, text=True, timeout=280,
        env={**os.environ, "FLYWHEEL_BENCH_RESULTS": str(tmp_path / "results")})
    assert proc.returncode == 0, proc.stderr[-3000:]
    result = json.loads(proc.stdout.strip().splitlines()[-1])
    assert result == json.loads((tmp_path / "results" / "rl_demo_tokens_smoke.json").read_text())
    s = result["summary"]
    assert set(s) == {"fix_bug", "rename", "all"} and s["all"]["tasks"] == 2
    assert set(s["rename"]["styles"]) == {"parallel", "sequential", "search", "blind", "shell"}
    assert "shell" not in s["fix_bug"]["styles"]  # a fix has no one-command form
    assert s["rename"]["styles"]["shell"]["tokens"] < s["rename"]["styles"]["sequential"]["tokens"]
    assert result["turn_ends"] == {"completed": 9}  # every demonstration ran to the end of its turn
