"""Frontier replay: draw again the tasks whose last group held both a solved and an unsolved rollout.

With a start that solves a few percent of tasks, most freshly drawn groups are all failures and
carry no success signal (``rl.train.loop``'s dynamic sampling throws them away). A task whose group
*was* success-varied sits at the policy's frontier — solvable, not yet reliably — and is the most
likely to be varied again. :class:`FrontierReplay` keeps those task ids (newest first) and hands
up to ``grpo.replay_tasks`` of them to each draw of the next iteration, in place of fresh tasks.

Where it comes from, and how it departs: Kimi k1.5 (2025, §2.3.4 "prioritized sampling") samples
each problem with weight ``1 - success rate`` tracked over training; online difficulty filtering
(Bae et al. 2025) keeps problems of intermediate pass rate. Both track every problem's rate; this
keeps only the last verdict of the tasks drawn recently — a task leaves the buffer when its newest
group was not varied, or after ``grpo.replay_limit`` replays in a row, so no task is trained on
every iteration (a bound on how far the run can fit a handful of tasks; the held-out split, other
seeds and other vocabulary, is what says whether it generalises).

Not guaranteed: that a replayed task is varied again (its group is sampled afresh, with the
iteration's own sampling seeds), or that a draw gets ``replay_tasks`` replays (the buffer may hold
fewer). The buffer is part of the run's checkpoint (``RunState.extra["replay"]``), so a resumed
run replays what the uninterrupted one would.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

__all__ = ["FrontierReplay"]


@dataclass
class FrontierReplay:
    """Task ids whose newest group was success-varied, newest first, with how many times in a row
    each has been replayed (see the module docstring)."""

    limit: int = 2  # replays in a row before a task must be drawn fresh again
    capacity: int = 256  # oldest entries dropped beyond this
    entries: list[tuple[str, int]] = field(default_factory=list)  # (task id, replays so far)

    def take(self, n: int, *, exclude: Iterable[str] = ()) -> list[str]:
        """Up to ``n`` task ids, newest first, skipping ``exclude``; each taken id leaves the buffer
        (:meth:`update` puts it back if its new group is varied again)."""
        skip = set(exclude)
        taken: list[str] = []
        kept: list[tuple[str, int]] = []
        for task_id, times in self.entries:
            if len(taken) < n and task_id not in skip:
                taken.append(task_id)
                self._pending[task_id] = times + 1
            else:
                kept.append((task_id, times))
        self.entries = kept
        return taken

    def update(self, drawn: Sequence[str], varied: Iterable[str]) -> None:
        """After an iteration: every varied task of ``drawn`` goes to the front (unless it has been
        replayed ``limit`` times in a row); every other drawn task leaves the buffer."""
        varied_set = set(varied)
        drawn_set = set(drawn)
        fresh: list[tuple[str, int]] = []
        for task_id in dict.fromkeys(drawn):  # each id once, in draw order
            times = self._pending.get(task_id, 0)
            if task_id in varied_set and times < self.limit:
                fresh.append((task_id, times))
        self.entries = fresh + [(t, n) for t, n in self.entries if t not in drawn_set]
        del self.entries[self.capacity:]
        self._pending.clear()

    def to_state(self) -> list[list[Any]]:
        """JSON-serialisable entries (for ``RunState.extra``)."""
        return [[t, n] for t, n in self.entries]

    @classmethod
    def from_state(cls, state: Sequence[Sequence[Any]] | None, *, limit: int) -> FrontierReplay:
        buf = cls(limit=limit)
        buf.entries = [(str(t), int(n)) for t, n in (state or [])]
        return buf

    def __post_init__(self) -> None:
        self._pending: dict[str, int] = {}
