"""Where rollouts are persisted: a protocol, so rl/ does not import backend/.

``backend/rl_log.py`` implements it over the production session log, so every
rollout's events sit beside users' sessions, tagged RL with run, iteration,
task and sample, and ``flywheel replay`` opens any of them.
"""

from __future__ import annotations

from typing import Any, Protocol

from rl.types import Rollout


class RolloutLog(Protocol):
    def create_session(self, *, session_id: str, run_id: str, iteration: int, task_id: str, sample: int,
                       base_snapshot: str = "", blob_root: str = "") -> None:
        """Open the rollout's session, tagged RL with its run, iteration, task and sample index.

        ``base_snapshot`` (a snapshot manifest as JSON) and ``blob_root`` (the worker's blob
        store) are the rollout's starting workspace, which a log that supports replay keeps."""
        ...

    def append_events(self, session_id: str, events: list[dict[str, Any]]) -> None:
        """Append events (JSON objects of :mod:`agent.events`, in ``seq`` order)."""
        ...

    def finish(self, session_id: str, *, reward: float | None, status: str) -> None:
        """Record the rollout's reward and status on its session."""
        ...


def persist(log: RolloutLog, rollout: Rollout, events: list[dict[str, Any]]) -> None:
    """Write one rollout through ``log`` (the driver calls this per returned rollout)."""
    log.create_session(session_id=rollout.session_id, run_id=rollout.run_id, iteration=rollout.iteration,
                       task_id=rollout.task_id, sample=rollout.sample, base_snapshot=rollout.base_snapshot,
                       blob_root=rollout.blob_root)
    log.append_events(rollout.session_id, events)
    log.finish(rollout.session_id, reward=rollout.reward, status=rollout.status.value)


class MemoryRolloutLog:
    """A :class:`RolloutLog` in memory (the driver's dry runs, tests of the protocol)."""

    def __init__(self) -> None:
        self.sessions: dict[str, dict[str, Any]] = {}

    def create_session(self, *, session_id: str, run_id: str, iteration: int, task_id: str, sample: int,
                       base_snapshot: str = "", blob_root: str = "") -> None:
        self.sessions[session_id] = {"tags": {"rl": True, "run": run_id, "iteration": iteration, "task": task_id,
                                              "sample": sample}, "events": []}

    def append_events(self, session_id: str, events: list[dict[str, Any]]) -> None:
        self.sessions[session_id]["events"] += events

    def finish(self, session_id: str, *, reward: float | None, status: str) -> None:
        self.sessions[session_id]["tags"] |= {"reward": reward, "status": status}
