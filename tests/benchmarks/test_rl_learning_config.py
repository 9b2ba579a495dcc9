"""benchmarks/rl_learning.py: the flags of a GRPO run reach the run config that trains it.

The thirty-sixth run's effort arm trained with the default effort rate because ``--effort-per-call``
was written into the DAgger config instead of the GRPO one; this checks the GRPO config itself."""

from __future__ import annotations

from pathlib import Path

import torch

from agent.model.checkpoint import save_checkpoint
from agent.model.config import ModelConfig
from agent.model.transformer import MoETransformer
from agent.prompt import COMPACT_PROFILE
from tests.agent.model.test_engine import tiny_tokenizer
from tests.benchmarks.bench_module import load_benchmark


def test_grpo_flags_reach_the_run_config(tmp_path: Path) -> None:
    rl_learning = load_benchmark("rl_learning")
    tok = tiny_tokenizer()
    torch.manual_seed(0)
    save_checkpoint(tmp_path / "sft", MoETransformer(ModelConfig.preset("tiny", vocab_size=tok.vocab_size)), tok,
                    step=1, profile=COMPACT_PROFILE)
    start = {"sft": tmp_path / "sft", "tasks_file": tmp_path / "tasks.jsonl"}
    args = rl_learning.parse_args(["--quick", "--effort-per-call", "0.04", "--length-coef", "0.2", "--kl-coef", "0.05",
                                   "--kl-estimator", "k2", "--temperature", "0.7", "--neg-adv-scale", "0.25",
                                   "--epochs", "2", "--max-draws", "2", "--dynamic-sampling", "success"])
    cfg = rl_learning.grpo_config(3, args, start, tmp_path, "x")
    assert cfg.reward.effort_per_call == 0.04
    assert (cfg.grpo.length_coef, cfg.grpo.kl_coef, cfg.grpo.kl_estimator) == (0.2, 0.05, "k2")
    assert (cfg.grpo.neg_adv_scale, cfg.grpo.epochs, cfg.grpo.max_draws, cfg.grpo.dynamic_sampling) == (
        0.25, 2, 2, "success")
    assert cfg.rollout.temperature == cfg.eval.temperature == 0.7
    assert (cfg.seed, cfg.name, cfg.model.init) == (3, "x-seed3", tmp_path / "sft")
    assert cfg.iterations == rl_learning.QUICK["iterations"]  # --quick's sizes fill what no flag set
    assert rl_learning.grpo_config(3, rl_learning.parse_args(["--quick"]), start, tmp_path, "x").reward == \
        type(cfg.reward)()  # no flag: the reward's defaults
