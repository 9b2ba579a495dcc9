"""One config file per RL run (``flywheel rl train --config FILE``).

A run is described by a single file — YAML (``.yaml``/``.yml``), TOML
(``.toml``) or JSON (``.json``) — validated into :class:`RunConfig`. Every
section refuses unknown keys (``extra="forbid"``) and the error names the key
and where it is, so a typo (``gruop_size``) fails before anything runs.

The same file with a bigger ``model.preset`` and more ``rollout.workers`` is
what a GPU cluster runs; nothing else in it is CPU-specific except the
defaults' sizes.

Not guaranteed: that the file's values make a *good* run (a learning rate that
diverges is valid); that the tasks file exists when the config is loaded (it
is opened when the run starts and its errors name it then).
"""

from __future__ import annotations

import json
import tomllib
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from rl.reward import EFFORT_CAP, EFFORT_PER_CALL

__all__ = ["ConfigError", "EvalConfig", "GRPOConfig", "KLEstimator", "LengthScope", "LimitsConfig", "ModelSection",
           "RolloutConfig", "RunConfig", "SFTConfig", "load_run_config"]

# grpo.length_scope: whose lengths rank a solved rollout (rl.train.grpo "Length term")
LengthScope = Literal["group", "solved"]
# grpo.kl_estimator: the KL term's per-token estimator (rl.train.grpo "No KL term")
KLEstimator = Literal["k3", "k2"]


class ConfigError(ValueError):
    """A run config that cannot be used; the message names the file and the offending key."""


class _Section(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class ModelSection(_Section):
    preset: str = "tiny"  # agent.model.config.ModelConfig.preset
    init: Path | None = None  # a checkpoint to start from (the SFT output); None: random init (tests)
    precision: Literal["fp32", "bf16", "mxfp8"] = "fp32"  # trainer numerics (ModelConfig.precision)
    prompt_profile: str | None = None  # None: the init checkpoint's profile, else the preset's default
    copy_head: bool = False  # the preset with agent.model.copy_head (the init checkpoint must have it too)
    copy_min_distance: int = Field(1, ge=1)  # ModelConfig.copy_min_distance (the checkpoint's must match)
    copy_successor_keys: bool = False  # ModelConfig.copy_successor_keys (the checkpoint's must match)
    copy_context_only: bool = False  # ModelConfig.copy_context_only (the checkpoint's must match)

    @model_validator(mode="after")
    def _check(self) -> ModelSection:
        if self.copy_successor_keys and not self.copy_head:
            raise ValueError("model.copy_successor_keys needs model.copy_head: true")
        if self.copy_context_only and not self.copy_head:
            raise ValueError("model.copy_context_only needs model.copy_head: true")
        return self


class GRPOConfig(_Section):
    """The GRPO objective; each field's meaning is in :mod:`rl.train.grpo`."""

    group_size: int = Field(8, ge=2)  # G rollouts per task (a baseline needs at least 2)
    eps_low: float = Field(0.2, ge=0.0, lt=1.0)  # PPO clip below: ratio >= 1 - eps_low
    eps_high: float = Field(0.28, ge=0.0)  # clip-high (DAPO): ratio <= 1 + eps_high
    tis_clip: float = Field(2.0, gt=0.0)  # truncated importance sampling cap on pi_old / pi_sampler
    std_normalise: bool = False  # divide advantages by the group's reward std (GRPO); off = Dr. GRPO
    # multiply negative advantages by this (1 = the papers; 0 = train on better-than-baseline rollouts
    # only, as rejection-sampling fine-tuning does); see rl.train.grpo "Negative advantages"
    neg_adv_scale: float = Field(1.0, ge=0.0, le=1.0)
    # leave the tokens of model calls that made a malformed tool call out of positive-advantage rows
    # (off = the papers: every token gets its rollout's advantage); see rl.train.grpo
    no_reinforce_malformed: bool = False
    # > 0: the tokens of such a call get advantage min(A, -this) in every trained row (per-call credit)
    malformed_call_adv: float = Field(0.0, ge=0.0, le=1.0)
    # Kimi k1.5's group-relative length reward, times this (0: off); see rl.train.grpo "Length term".
    # At most 0.2, so a solved rollout still scores above every failure of its group
    length_coef: float = Field(0.0, ge=0.0, le=0.2)
    # whose lengths set a solved rollout's length term: "group" (Kimi: every rollout of the group) or
    # "solved" (the group's solved rollouts only; failures keep Kimi's term); see rl.train.grpo "Length term"
    length_scope: LengthScope = "group"
    kl_coef: float = Field(0.0, ge=0.0)  # k3 KL to the initial policy; 0 = no reference model (default)
    # the KL term's per-token estimator: "k3" (GRPO, DeepSeekMath) or "k2" (0.5 * log-ratio^2, verl's "mse"),
    # whose gradient grows linearly, not exponentially, in how far a token has fallen; see rl.train.grpo
    kl_estimator: KLEstimator = "k3"
    aux_loss_coef: float = Field(0.01, ge=0.0)  # MoE load-balancing term (replaces the checkpoint's coefficient)
    norm_tokens: int = Field(1024, ge=1)  # Dr. GRPO's constant: loss = sum over tokens / (rows * norm_tokens)
    compact_filtering: bool = False  # DeepSWE: drop rollouts that hit a limit from the loss
    routing_replay: bool = False  # train with the experts the sampler used (needs recorded routes)
    minibatches: int = Field(1, ge=1)  # optimizer steps per iteration (later ones are off-policy: PPO clip)
    # passes over the iteration's rollouts, each split into `minibatches` optimizer steps (verl's
    # ppo_epochs, PPO's K epochs): more steps from the same samples; see rl.train.grpo "Epochs"
    epochs: int = Field(1, ge=1)
    # linear learning-rate warmup over the first N optimizer steps (0: none, verl's and TRL's default).
    # Adam's first steps move every weight by ~lr whatever its gradient; see rl.train.grpo "Warmup"
    lr_warmup_steps: int = Field(0, ge=0)
    micro_batch: int = Field(4, ge=1)  # rows per forward (gradient accumulation; bounds memory)
    # within each minibatch, micro-batches take rows of similar length (less padding computed);
    # which rows share an optimizer step is unchanged. See rl.train.grpo "Micro-batches"
    sort_micro_batches: bool = True
    # DAPO's dynamic sampling (rl.train.loop): "success" draws more tasks until `tasks_per_iteration`
    # groups hold both a solved and an unsolved rollout (at most `max_draws` draws of
    # `tasks_per_iteration` tasks) and trains on those groups only; "off": one draw, every group whose
    # rewards differ (the shaping terms alone included)
    dynamic_sampling: Literal["off", "success"] = "off"
    max_draws: int = Field(4, ge=1)
    # frontier replay (rl.train.replay): up to this many of each draw's tasks are tasks whose last
    # group was success-varied, drawn again; 0 = every task fresh from the order (the papers' default)
    replay_tasks: int = Field(0, ge=0)
    replay_limit: int = Field(2, ge=1)  # replays in a row before a task must come fresh again


class LimitsConfig(_Section):
    max_model_calls: int = Field(8, ge=1)
    max_output_tokens: int = Field(2048, ge=1)
    # the clock includes waiting for the shared engine: with many rollouts batched on a small
    # machine it can bind before the policy's own budget does, which makes the limit (and its
    # penalty) a function of load. The rollout metrics' `limit_timeout` share shows when it does;
    # size it well above the call budget's time for experiments (benchmarks/rl_learning.py: 900 s)
    max_wall_s: float = Field(120.0, gt=0.0)

    def to_limits(self) -> Any:
        """These limits as the runtime's ``agent.session.Limits`` (what a rollout's session enforces)."""
        from agent.session import Limits

        return Limits(max_steps=self.max_model_calls, max_output_tokens=self.max_output_tokens,
                      max_wall_s=self.max_wall_s)


class RewardConfig(_Section):
    """The reward's tunable shaping (rl.reward; its other terms are constants, documented there)."""

    # per model call beyond the first, taken from a success's reward (at most rl.reward.EFFORT_CAP in all);
    # 0.01 (the default) makes a 2-call and a 4-call solution differ by 0.02, 0.04 by 0.08
    effort_per_call: float = Field(EFFORT_PER_CALL, ge=0.0, le=EFFORT_CAP)


class RolloutConfig(_Section):
    workers: int = Field(1, ge=1)
    address: str | None = None  # a Ray cluster to join; None: ray.init() locally
    # the training rollouts' sampling temperature; the trainer optimises softmax(logits / temperature)
    # (rl.train.grpo.GRPOTrainer); > 0: greedy rollouts give a group nothing to compare
    temperature: float = Field(1.0, gt=0.0)
    max_tokens_per_call: int = Field(256, ge=1)
    # paths the AGENT's sandbox shows read-only (e.g. a Python with pytest for real-code tasks);
    # tasks graded with `interpreter: project` add the project's Python automatically
    sandbox_extra_ro: list[Path] = Field(default_factory=list)


class EvalConfig(_Section):
    """Held-out evaluation DURING training (``every`` > 0): pass@1/pass@k of the current weights
    on the task set's held-out split, through the same workers, written into the iteration's
    metrics record as ``heldout_*`` (iteration 0 = the starting checkpoint). Measured only:
    nothing in the run reads it back (never tune on the held-out split)."""

    every: int = Field(0, ge=0)  # iterations between evaluations; 0 = never
    k: int = Field(4, ge=1)  # samples per task (pass@k; pass@1 is estimated from all k)
    max_tasks: int | None = Field(None, ge=1)  # the first N held-out tasks (None: all)
    temperature: float = Field(1.0, ge=0.0)


class SFTConfig(_Section):
    lr: float = Field(1e-3, gt=0.0)
    batch: int = Field(4, ge=1)
    max_epochs: int = Field(20, ge=1)
    eval_every: int = Field(10, ge=1)  # steps between held-out evaluations
    patience: int = Field(3, ge=1)  # evaluations without improvement before stopping
    heldout_fraction: float = Field(0.2, gt=0.0, lt=1.0)  # of the train-split TASKS (split before recording)
    demos_per_task: int = Field(1, ge=1)  # demonstrations recorded per task, each in a randomly drawn style
    # stop after this many optimizer steps (None: epochs and patience; 0: none, only the DAgger rounds)
    max_steps: int | None = Field(None, ge=0)
    # renamed copies of each TRAINING demonstration (rl.train.rename; the held-out ones are never renamed)
    renamings: int = Field(0, ge=0, le=64)
    # "minimal": each edit_file's search is the changed lines plus only the context that makes it
    # unique (rl.train.tight_edits); "hunk": the reference patch's hunks as they are (3 context lines)
    edit_context: Literal["minimal", "hunk"] = "minimal"
    # how much more a copy token (rl.train.copy_tokens: a name or code line copied from the context)
    # weighs in the SFT loss than a format token; 1: a plain per-token mean
    copy_weight: float = Field(1.0, ge=1.0, le=100.0)
    # how much more an EXIT (rl.train.copy_tokens.exit_flags: the token right after a copied span, where
    # copying must stop) weighs; 1: a plain per-token mean (benchmarks/copy_exit_probe.py measures exits)
    exit_weight: float = Field(1.0, ge=1.0, le=100.0)
    # the share of demonstrations of a task whose change is one shell command (a rename: sed over its
    # package; rl.train.demos.shell_edit_for) recorded in the "shell" style instead of the drawn one
    shell_share: float = Field(0.0, ge=0.0, le=1.0)
    # at most this many sentences of narration before each demonstrated model call (0..N drawn per call;
    # rl.train.demos.scripted_outputs): the wasted tokens real traces carry, for RL to learn to drop
    narration: int = Field(0, ge=0, le=4)
    # False: the narration names the task's identifier bare instead of in backticks (rl.train.demos._narrate;
    # the twenty-ninth run: copying a quoted name in prose teaches the copy to run on into the backtick)
    narration_quotes: bool = True
    # DAgger rounds after SFT (rl.train.dagger): free-running rollouts of the SFT tasks (limits and
    # max_tokens_per_call from this config), each model call relabelled with the scripted solver's
    # next output, then SFT again on demonstrations + relabelled calls
    dagger_rounds: int = Field(0, ge=0, le=20)
    dagger_samples: int = Field(1, ge=1, le=16)  # rollouts per task per round
    dagger_tasks: int | None = Field(None, ge=1)  # SFT-train tasks per round, drawn afresh (None: all)
    dagger_heldout_tasks: int | None = Field(None, ge=1)  # SFT-held-out tasks per round (None: all)
    dagger_max_steps: int | None = Field(None, ge=1)  # SFT steps per round (None: epochs and patience)

    @model_validator(mode="after")
    def _check(self) -> SFTConfig:
        if self.max_steps == 0 and not self.dagger_rounds:
            raise ValueError("max_steps: 0 (no SFT on demonstrations) needs dagger_rounds >= 1: nothing would train")
        return self


class RunConfig(_Section):
    name: str = "run"
    seed: int = 0
    out_dir: Path = Path("runs/rl")
    tasks: Path | None = None  # the task set (JSONL written by `flywheel rl tasks build`)
    iterations: int = Field(10, ge=1)
    tasks_per_iteration: int = Field(4, ge=1)
    lr: float = Field(1e-4, gt=0.0)
    weight_decay: float = Field(0.0, ge=0.0)
    grad_clip: float = Field(1.0, gt=0.0)
    checkpoint_every: int = Field(1, ge=1)
    model: ModelSection = ModelSection()
    grpo: GRPOConfig = GRPOConfig()
    limits: LimitsConfig = LimitsConfig()
    reward: RewardConfig = RewardConfig()
    rollout: RolloutConfig = RolloutConfig()
    sft: SFTConfig = SFTConfig()
    eval: EvalConfig = EvalConfig()

    @model_validator(mode="after")
    def _check(self) -> RunConfig:
        from agent.model.config import ModelConfig

        try:
            ModelConfig.preset(self.model.preset)
        except ValueError as exc:
            raise ValueError(f"model.preset: {exc}") from None
        if self.grpo.replay_tasks >= self.tasks_per_iteration:
            raise ValueError(f"grpo.replay_tasks: {self.grpo.replay_tasks} must be below tasks_per_iteration "
                             f"({self.tasks_per_iteration}), so every draw takes some fresh tasks")
        return self


def _parse(path: Path) -> dict[str, Any]:
    text = path.read_text(encoding="utf-8")
    suffix = path.suffix.lower()
    try:
        if suffix in (".yaml", ".yml"):
            import yaml

            data = yaml.safe_load(text)
        elif suffix == ".toml":
            data = tomllib.loads(text)
        elif suffix == ".json":
            data = json.loads(text)
        else:
            raise ConfigError(f"{path}: unknown config format {suffix!r}; use .yaml, .yml, .toml or .json")
    except ConfigError:
        raise
    except Exception as exc:  # yaml.YAMLError, tomllib.TOMLDecodeError, json.JSONDecodeError
        raise ConfigError(f"{path}: not valid {suffix.lstrip('.')}: {exc}") from None
    if data is None:
        data = {}
    if not isinstance(data, dict):
        raise ConfigError(f"{path}: the top level must be a mapping of keys to values, not {type(data).__name__}")
    return data


def validate_run_config(data: dict[str, Any], *, source: str = "config") -> RunConfig:
    """``data`` as a :class:`RunConfig`; :class:`ConfigError` naming every bad key and why."""
    try:
        return RunConfig.model_validate(data)
    except ValidationError as exc:
        problems = []
        for err in exc.errors():
            where = ".".join(str(p) for p in err["loc"]) or "(top level)"
            if err["type"] == "extra_forbidden":
                problems.append(f"unknown key {where!r}")
            else:
                problems.append(f"{where}: {err['msg']}")
        raise ConfigError(f"{source}: " + "; ".join(problems)) from None


def load_run_config(path: str | Path) -> RunConfig:
    """Read and validate a run config file. Relative paths inside it stay relative to the
    working directory (not to the file), as the CLI's own path options are."""
    p = Path(path)
    if not p.is_file():
        raise ConfigError(f"no config file at {p}")
    return validate_run_config(_parse(p), source=str(p))
