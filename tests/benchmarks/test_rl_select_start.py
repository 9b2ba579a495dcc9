"""benchmarks/rl_select_start.py: candidates must be starts of the given task set; the ranking is
by pass@1, ties by the malformed-call rate; and an end-to-end run over two tiny starts at two
temperatures writes a ranking of the four pairs, evaluated on VALIDATION-split tasks (a task set
without them is a clear error)."""

from __future__ import annotations

import asyncio
import hashlib
import json
import os
import subprocess
import sys
from pathlib import Path
from types import ModuleType

import pytest
import torch

from agent.model.checkpoint import save_checkpoint
from agent.model.config import ModelConfig
from agent.model.transformer import MoETransformer
from agent.prompt import COMPACT_PROFILE
from rl.tasks.build import build_task_set
from tests.agent.model.test_engine import tiny_tokenizer
from tests.benchmarks.bench_module import load_benchmark
from tools.sandbox import make_sandbox

ROOT = Path(__file__).resolve().parents[2]
BENCH = ROOT / "benchmarks"


def _module() -> ModuleType:
    return load_benchmark("rl_select_start")


def _start(dest: Path, tasks: Path, seed: int) -> Path:
    """A --save-start directory holding a random tiny model trained on nothing."""
    tok = tiny_tokenizer()
    torch.manual_seed(seed)
    save_checkpoint(dest / "sft", MoETransformer(ModelConfig.preset("tiny", vocab_size=tok.vocab_size)), tok,
                    step=0, profile=COMPACT_PROFILE)
    (dest / "start.json").write_text(json.dumps({"tasks_sha256": hashlib.sha256(tasks.read_bytes()).hexdigest(),
                                                 "pretrain_corpus": None}))
    (dest / "sft_done.json").write_text(json.dumps({"curve": [{"step": 0, "heldout_loss": 5.0 + seed}],
                                                    "seconds": 1.0}))
    return dest


@pytest.fixture(scope="module")
def task_file(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("select") / "tasks.jsonl"
    asyncio.run(build_task_set(["fix_bug", "find_change"], 4, 2, 0, path, sandbox=make_sandbox(), n_validation=2))
    return path


def test_candidates_must_be_starts_of_the_task_set(tmp_path: Path, task_file: Path) -> None:
    sel = _module()
    a = _start(tmp_path / "a", task_file, 0)
    assert set(sel.check_candidates([a], task_file)) == {a}
    with pytest.raises(sel.CandidateError, match="not a --save-start directory"):
        sel.check_candidates([a, tmp_path / "missing"], task_file)
    other = tmp_path / "other.jsonl"
    other.write_text(task_file.read_text() + "\n")
    with pytest.raises(sel.CandidateError, match="another task set"):
        sel.check_candidates([a], other)
    with pytest.raises(sel.CandidateError, match="twice"):
        sel.check_candidates([a, a], task_file)


def test_ranked_by_pass_at_1_then_fewer_malformed_calls() -> None:
    sel = _module()
    scores = [{"candidate": "a", "pass_at_1": 0.10, "malformed_call_rate": 0.2},
              {"candidate": "b", "pass_at_1": 0.20, "malformed_call_rate": 0.5},
              {"candidate": "c", "pass_at_1": 0.10, "malformed_call_rate": 0.1},
              {"candidate": "d", "pass_at_1": 0.10, "malformed_call_rate": float("nan")}]
    assert [s["candidate"] for s in sel.rank(scores)] == ["b", "c", "a", "d"]
    assert sel.standard_error(0.5, 100) == pytest.approx(0.05)


@pytest.mark.timeout(600)
def test_two_tiny_starts_at_two_temperatures_are_evaluated_on_validation_tasks_and_ranked(tmp_path: Path,
                                                                                         task_file: Path) -> None:
    a, b = _start(tmp_path / "a", task_file, 0), _start(tmp_path / "b", task_file, 1)
    env = {**os.environ, "FLYWHEEL_BENCH_RESULTS": str(tmp_path / "results")}
    r = subprocess.run([sys.executable, str(BENCH / "rl_select_start.py"), str(a), str(b), "--tasks", str(task_file),
                        "--max-tasks", "2", "-k", "1", "--max-tokens", "16", "--max-model-calls", "1",
                        "--temperature", "1.0", "0.5",
                        "--name", "select_test"], cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stderr[-3000:]
    out = json.loads(r.stdout.strip().splitlines()[-1])
    assert json.loads((tmp_path / "results" / "select_test.json").read_text())["ranking"] == out["ranking"]
    assert out["split"] == "validation" and out["tasks"] == 2 and out["k"] == 1
    assert sorted((s["candidate"], s["temperature"]) for s in out["ranking"]) == sorted(
        (str(c), t) for c in (a, b) for t in (1.0, 0.5))
    assert (out["best"], out["best_temperature"]) == (out["ranking"][0]["candidate"], out["ranking"][0]["temperature"])
    for s in out["ranking"]:
        assert 0.0 <= s["pass_at_1"] <= 1.0 and s["infra_errors"] == 0
        assert set(s["per_family"]) <= {"fix_bug", "find_change"}
    assert {s["sft_best_heldout_loss"] for s in out["ranking"]} == {5.0, 6.0}


def test_a_task_set_without_validation_tasks_is_refused(tmp_path: Path) -> None:
    tasks = tmp_path / "tasks.jsonl"
    asyncio.run(build_task_set(["fix_bug"], 2, 1, 0, tasks, sandbox=make_sandbox()))
    a, b = _start(tmp_path / "a", tasks, 0), _start(tmp_path / "b", tasks, 1)
    r = subprocess.run([sys.executable, str(BENCH / "rl_select_start.py"), str(a), str(b), "--tasks", str(tasks)],
                       cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert r.returncode != 0 and "has no validation tasks" in r.stderr and "--n-validation" in r.stderr


def test_fewer_than_two_candidates_is_refused(tmp_path: Path, task_file: Path) -> None:
    r = subprocess.run([sys.executable, str(BENCH / "rl_select_start.py"), str(tmp_path), "--tasks", str(task_file)],
                       cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert r.returncode != 0 and "at least two candidates" in r.stderr


@pytest.mark.parametrize("temps", [["1.0", "1.0"], ["1.0", "0"]])
def test_repeated_or_greedy_temperatures_are_refused(tmp_path: Path, task_file: Path, temps: list[str]) -> None:
    r = subprocess.run([sys.executable, str(BENCH / "rl_select_start.py"), str(tmp_path), str(tmp_path / "b"),
                        "--tasks", str(task_file), "--temperature", *temps],
                       cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert r.returncode != 0 and "distinct and > 0" in r.stderr
