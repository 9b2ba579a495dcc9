"""A :class:`rl.tasks.spec.Task` as the rollout worker's ``RolloutTask``, with its grader.

Not guaranteed: ``changed`` is ``bool(workspace.diff())`` against the base snapshot, so an
edit undone before the end counts as no change.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass
from typing import TYPE_CHECKING

from rl.types import GradeResult

if TYPE_CHECKING:
    from rl.tasks.spec import Task
    from tools.protocols import Workspace
    from tools.sandbox import Sandbox
    from tools.workspace import WorkspaceStore

__all__ = ["TaskEnv"]


@dataclass(frozen=True, slots=True)
class TaskEnv:
    """A :class:`rl.tasks.spec.Task` as the worker's ``RolloutTask`` (picklable: it crosses Ray)."""

    task: Task

    @property
    def task_id(self) -> str:
        return self.task.id

    @property
    def request(self) -> str:
        return self.task.request

    def start_workspace(self, store: WorkspaceStore) -> Workspace:
        from rl.tasks.workspaces import materialise

        return materialise(self.task, store)

    async def grade(self, workspace: Workspace, sandbox: Sandbox | None) -> tuple[GradeResult, bool]:
        """(grade on a fresh fork with the tests restored, whether the rollout changed anything)."""
        from rl.tasks.grading import grade

        if sandbox is None:
            raise RuntimeError("graders run in the sandbox; this worker has none (WorkerConfig.sandboxed=False)")
        changed = bool(await asyncio.to_thread(workspace.diff))
        return await grade(self.task, workspace, sandbox), changed
