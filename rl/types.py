"""The data the RL module's parts hand each other: tasks, grades, rollouts.

Kept in one small module so tasks (``rl/tasks``), rollouts (``rl/rollout``)
and training (``rl/train``) agree on one shape. Plain dataclasses and enums,
picklable (they cross Ray's object store) and JSON-friendly (``to_json``).

Not guaranteed: these types do not validate their own consistency (that
``loss_mask`` and ``token_ids`` have one length, say); the producers check
and the trainer asserts.
"""

from __future__ import annotations

import enum
from dataclasses import asdict, dataclass, field
from typing import Any


class Split(enum.StrEnum):
    """Which part of a task set a task belongs to. ``TRAIN``: SFT demonstrations and GRPO's
    groups. ``VALIDATION``: never trained on, with a vocabulary of its own, for choices made
    before a run (which start, which temperature) that must not read the held-out split.
    ``HELDOUT``: only measured."""

    TRAIN = "train"
    HELDOUT = "heldout"
    VALIDATION = "validation"


#: Task ``i`` of a split gets the seed ``S * 1_000_000 + SPLIT_SEED_OFFSET[split] + i``: seeds
#: never repeat across splits while a split holds fewer than 250,000 tasks.
SPLIT_SEED_OFFSET: dict[Split, int] = {Split.TRAIN: 0, Split.HELDOUT: 500_000, Split.VALIDATION: 750_000}


class RolloutStatus(enum.StrEnum):
    """How a rollout ended. Only ``FINISHED`` and ``LIMIT`` rollouts are graded and
    trained on; ``POLICY_ERROR`` is scored (the model failed); ``INFRA_ERROR``
    (sandbox, workspace, grader crash) is excluded from the loss and counted."""

    FINISHED = "finished"  # the model ended its turn
    LIMIT = "limit"  # model calls, tokens or wall time ran out
    POLICY_ERROR = "policy_error"  # the policy raised (context full, engine error)
    INFRA_ERROR = "infra_error"  # our side failed; never a silent zero


@dataclass(frozen=True, slots=True)
class GradeResult:
    passed: bool
    output: str  # what the grader printed (capped), for the log and for debugging
    duration_s: float
    error: str | None = None  # set when the grader itself could not run (an infra error)
    # the grader ran past its timeout (``error`` says so too); on a validated task, whose grader
    # finishes on the start and on the reference, a hang is most likely the rollout's code
    timed_out: bool = False


@dataclass(slots=True)
class Segment:
    """One contiguous run of tokens of a rollout's token sequence.

    ``sampled`` segments are what the policy produced (loss is taken on them);
    the others are what the engine consumed without sampling (the prompt,
    tool results, template markers). ``logprobs`` is aligned with
    ``token_ids`` for sampled segments and empty otherwise. ``routes`` (MoE
    routing replay) is ``[n_tokens][n_moe_layers][top_k]`` expert ids the
    sampler used, or None when not recorded.
    """

    token_ids: list[int]
    sampled: bool
    logprobs: list[float] = field(default_factory=list)
    routes: list[list[list[int]]] | None = None


@dataclass(slots=True)
class Rollout:
    """One sample of one task: the exact token sequence the engine saw and
    produced (token-in/token-out, never re-tokenised), its outcome and its
    behaviour metrics."""

    run_id: str
    iteration: int
    task_id: str
    sample: int
    status: RolloutStatus
    segments: list[Segment] = field(default_factory=list)
    weights_version: int = 0
    reward: float | None = None
    reward_terms: dict[str, float] = field(default_factory=dict)
    grade: GradeResult | None = None
    session_id: str = ""  # the rollout's session in the session log
    metrics: dict[str, float] = field(default_factory=dict)  # model_calls, tool_calls, parallel_steps, ...
    detail: str = ""  # why it ended, for limit / error statuses
    events: list[dict[str, Any]] = field(default_factory=list)  # the session's events as JSON (rl.rollout)
    # the rollout's starting workspace, so replay can restore it: its base snapshot's manifest
    # (tools.snapshots canonical JSON; "" when no workspace was forked) and the worker's blob
    # store directory holding that snapshot's file bytes (backend/rl_log.py copies them)
    base_snapshot: str = ""
    blob_root: str = ""

    @property
    def token_ids(self) -> list[int]:
        return [t for s in self.segments for t in s.token_ids]

    @property
    def loss_mask(self) -> list[int]:
        return [int(s.sampled) for s in self.segments for _ in s.token_ids]

    @property
    def sampler_logprobs(self) -> list[float]:
        """Aligned with :attr:`token_ids`; 0.0 where the mask is 0."""
        out: list[float] = []
        for s in self.segments:
            out += s.logprobs if s.sampled else [0.0] * len(s.token_ids)
        return out

    def to_json(self) -> dict[str, Any]:
        d = asdict(self)
        d["status"] = self.status.value
        return d
