"""benchmarks/rl_learning.py --save-start / --start: a start saved once is adopted by a later run
on a task set rebuilt from its recipe, and refused when the rebuilt set or the sizes differ."""

from __future__ import annotations

import argparse
import asyncio
import json
import math
from pathlib import Path
from types import ModuleType

import pytest
import torch

from agent.model.checkpoint import load_checkpoint, save_checkpoint
from agent.model.config import ModelConfig
from agent.model.transformer import MoETransformer
from agent.prompt import COMPACT_PROFILE
from rl.tasks.build import build_task_set
from tests.agent.model.test_engine import tiny_tokenizer
from tests.benchmarks.bench_module import load_benchmark
from tools.sandbox import make_sandbox

pytestmark = pytest.mark.timeout(300)


def _module() -> ModuleType:
    return load_benchmark("rl_learning")


def test_a_saved_start_is_adopted_on_a_rebuilt_task_set(tmp_path: Path) -> None:
    rl_learning = _module()
    args = argparse.Namespace(n_train=4, n_heldout=2, n_validation=2, data_seed=0, preset="tiny", dagger_rounds=0,
                              copy_head=False,
                              sft_shell_share=0.5, sft_narration=2, sft_exit_weight=5.0, sft_narration_bare=False)
    root = tmp_path / "first" / "start0"
    root.mkdir(parents=True)
    summary = asyncio.run(build_task_set(rl_learning.FAMILIES, 4, 2, 0, root / "tasks.jsonl", sandbox=make_sandbox(),
                                         n_validation=2))
    (root / "tasks_summary.json").write_text(json.dumps(summary.to_json()))
    (root / "sft_done.json").write_text(json.dumps({"curve": [{"step": 0}], "seconds": 1.0}))
    tok = tiny_tokenizer()
    torch.manual_seed(0)
    model = MoETransformer(ModelConfig.preset("tiny", vocab_size=tok.vocab_size))
    save_checkpoint(root / "sft", model, tok, step=3, profile=COMPACT_PROFILE)
    (root / "sft" / "optimizer.pt").write_bytes(b"not kept")

    saved = tmp_path / "saved"
    rl_learning.save_start(args, root, root / "sft", saved)
    assert sorted(p.name for p in (saved / "sft").iterdir()) == sorted(rl_learning.START_FILES)
    assert not (saved / "tasks.jsonl").exists()  # rebuilt from the recipe, not stored
    assert json.loads((saved / "start.json").read_text())["sft_shell_share"] == 0.5  # the recipe keeps it
    assert json.loads((saved / "start.json").read_text())["n_validation"] == 2
    assert json.loads((saved / "start.json").read_text())["sft_narration"] == 2
    assert json.loads((saved / "start.json").read_text())["sft_exit_weight"] == 5.0
    assert json.loads((saved / "start.json").read_text())["sft_narration_bare"] is False
    assert json.loads((saved / "start.json").read_text())["copy_successor_keys"] is False  # the checkpoint's
    assert json.loads((saved / "start.json").read_text())["copy_context_only"] is False
    assert json.loads((saved / "start.json").read_text())["pretrain_corpus"] is None  # no pretrained init
    assert json.loads((saved / "start.json").read_text())["pretrain_sources"] == ["stdlib", "site-packages"]
    save_checkpoint(root / "init", model, tok, step=1, extra={"corpus": "b27612bec878a5d9"}, profile=COMPACT_PROFILE)
    rl_learning.save_start(args, root, root / "sft", saved)
    assert json.loads((saved / "start.json").read_text())["pretrain_corpus"] == "b27612bec878a5d9"
    assert not (saved / "pretrain.log").exists()
    (root / "pretrain.log").write_text("step=50 loss=6.38685\n")
    rl_learning.save_start(args, root, root / "sft", saved)
    assert (saved / "pretrain.log").read_text() == "step=50 loss=6.38685\n"  # kept for comparing rebuilt starts

    again = tmp_path / "second" / "start0"
    again.mkdir(parents=True)
    rl_learning.adopt_start(args, saved, again)
    assert (again / "tasks.jsonl").read_bytes() == (root / "tasks.jsonl").read_bytes()  # the build is deterministic
    loaded, _ = load_checkpoint(again / "sft")
    assert all(torch.equal(a, b) for a, b in zip(loaded.state_dict().values(), model.state_dict().values(),
                                                 strict=True))
    assert json.loads((again / "sft_done.json").read_text())["curve"] == [{"step": 0}]
    assert not (again / "dagger_done.json").exists()
    plain = rl_learning.dagger_stage(argparse.Namespace(**{**vars(args), "start": saved}), again, 0, {"sft": again})
    assert plain == {"sft": again}

    # a start that came out of DAgger rounds brings their figures along, and the run reports them
    rounds = {"rounds": [{"round": 1.0, "train_solved": 0.25}], "curve": [], "seconds": 2.0}
    (root / "dagger_done.json").write_text(json.dumps(rounds))
    rl_learning.save_start(args, root, root / "sft", saved)
    dagger_too = tmp_path / "dagger" / "start0"
    dagger_too.mkdir(parents=True)
    rl_learning.adopt_start(args, saved, dagger_too)
    got = rl_learning.dagger_stage(argparse.Namespace(**{**vars(args), "start": saved}), dagger_too, 0,
                                   {"sft": dagger_too / "sft"})
    assert got == {"sft": dagger_too / "sft", "dagger": rounds}  # the adopted weights, not a fresh round

    with pytest.raises(SystemExit, match="not a --save-start directory"):
        rl_learning.adopt_start(args, tmp_path / "first", tmp_path / "third")
    with pytest.raises(SystemExit, match="built with n_train=4, this run has 5"):
        rl_learning.adopt_start(argparse.Namespace(**{**vars(args), "n_train": 5}), saved, tmp_path / "third")
    with pytest.raises(SystemExit, match="built with n_validation=2, this run has 0"):
        rl_learning.adopt_start(argparse.Namespace(**{**vars(args), "n_validation": 0}), saved, tmp_path / "third")
    with pytest.raises(SystemExit, match="built with sft_narration=2, this run has 0"):  # the demos differ
        rl_learning.adopt_start(argparse.Namespace(**{**vars(args), "sft_narration": 0}), saved, tmp_path / "third")
    with pytest.raises(SystemExit, match="built with sft_exit_weight=5.0, this run has 1.0"):
        rl_learning.adopt_start(argparse.Namespace(**{**vars(args), "sft_exit_weight": 1.0}), saved, tmp_path / "third")
    with pytest.raises(SystemExit, match="built with sft_narration_bare=False, this run has True"):
        rl_learning.adopt_start(argparse.Namespace(**{**vars(args), "sft_narration_bare": True}), saved,
                                tmp_path / "third")
    recipe = json.loads((saved / "start.json").read_text())
    (saved / "start.json").write_text(json.dumps(recipe | {"tasks_sha256": "0" * 64}))
    (tmp_path / "fourth").mkdir()
    with pytest.raises(SystemExit, match="differs from the one this start was trained on"):
        rl_learning.adopt_start(args, saved, tmp_path / "fourth")
    assert not (tmp_path / "fourth" / "sft").exists()  # nothing adopted


def test_seed_result_reads_the_heldout_curve_and_its_families(tmp_path: Path, monkeypatch: pytest.MonkeyPatch
                                                               ) -> None:
    """``seed_result`` (also ``--report-only``'s reader): the held-out curve at each evaluation and
    the per-family pass@1 the driver records (``heldout_pass_at_1_<family>``)."""
    rl_learning = _module()
    monkeypatch.setattr(rl_learning, "DOCS", tmp_path / "docs")
    (tmp_path / "docs").mkdir()
    run = tmp_path / "run0"
    run.mkdir()
    recs = [{"iteration": 0, "heldout_pass_at_1": 0.25, "heldout_pass_at_1_fix_bug": 0.5,
             "heldout_pass_at_1_rename": 0.0, "heldout_success_rate": 0.25, "heldout_rollout_sampled_tokens": 300.0,
             "heldout_tokens_per_solved": 40.0, "heldout_tokens_per_solved_fix_bug": 40.0},
            {"iteration": 1, "success_rate": 0.1, "stepped": True},
            {"iteration": 2, "success_rate": 0.2, "stepped": False, "heldout_pass_at_1": 0.5,
             "heldout_pass_at_1_fix_bug": 0.75, "heldout_pass_at_1_rename": 0.25,
             "heldout_solved_by_command_share": 0.5}]
    (run / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in recs))
    (run / "curves.png").write_bytes(b"png")
    res = rl_learning.seed_result(0, run, "t")
    assert [p["pass_at_1"] for p in res["curve"]] == [0.25, 0.5] and res["rl"]["pass_at_1"] == 0.5
    # every rollout's tokens per solved one: 300 / 0.25; undefined where the record lacks the figures
    assert res["sft"]["tokens_spent_per_solved"] == 1200.0 and math.isnan(res["rl"]["tokens_spent_per_solved"])
    assert res["iterations_done"] == 2 and res["iterations_stepped"] == 1
    assert res["heldout_pass_at_1_by_family"] == [{"iteration": 0, "fix_bug": 0.5, "rename": 0.0},
                                                  {"iteration": 2, "fix_bug": 0.75, "rename": 0.25}]
    # tokens per solved task per family only where the family had a solution (none recorded at iteration 2)
    assert res["heldout_tokens_per_solved_by_family"] == [{"iteration": 0, "fix_bug": 40.0}, {"iteration": 2}]
    # a run recorded before the key existed reads as None, not as 0
    assert res["heldout_solved_by_command_share"] == [{"iteration": 0, "share": None},
                                                      {"iteration": 2, "share": 0.5}]
    assert (tmp_path / "docs" / "t_seed0_metrics.jsonl").read_text() == (run / "metrics.jsonl").read_text()


def test_start_only_builds_and_saves_the_start_and_runs_no_grpo(tmp_path: Path) -> None:
    import os
    import subprocess
    import sys

    root = Path(__file__).resolve().parents[2]
    r = subprocess.run([sys.executable, str(root / "benchmarks" / "rl_learning.py"), "--quick", "--n-train", "8",
                        "--n-heldout", "2", "--sft-steps", "4", "--work-dir", str(tmp_path / "w"), "--start-only",
                        "--save-start", str(tmp_path / "start"), "--name", "start_only_test"],
                       cwd=root, capture_output=True, text=True, timeout=280,
                       env={**os.environ, "FLYWHEEL_BENCH_RESULTS": str(tmp_path / "results"),
                            "FLYWHEEL_BENCH_DOCS": str(tmp_path / "docs")})
    assert r.returncode == 0, r.stderr[-3000:]
    assert "saved to" in r.stdout
    assert [p.name for p in (tmp_path / "docs").iterdir()] == ["start_only_test_sft0_curve.png"]
    assert (tmp_path / "start" / "sft" / "model.safetensors").is_file()
    assert json.loads((tmp_path / "start" / "start.json").read_text())["n_train"] == 8
    assert not list((tmp_path / "w").glob("run*"))  # no GRPO seed ran
    assert not (tmp_path / "results").exists()  # and nothing was reported


@pytest.mark.parametrize("extra, message", [([], "keeps nothing"), (["--work-dir", "W", "--report-only"], "not with")])
def test_start_only_refuses_what_would_build_nothing_kept(tmp_path: Path, extra: list[str], message: str) -> None:
    import subprocess
    import sys

    root = Path(__file__).resolve().parents[2]
    r = subprocess.run([sys.executable, str(root / "benchmarks" / "rl_learning.py"), "--quick", "--start-only",
                        *[str(tmp_path / x) if x == "W" else x for x in extra]],
                       cwd=root, capture_output=True, text=True, timeout=120)
    assert r.returncode != 0 and message in r.stderr
    assert not (tmp_path / "W").exists()
