"""Grade a rollout: run the task's grader on a fresh fork of the final workspace.

:func:`grade` forks the workspace, restores the task's own test files
(``grader.test_files``) to their starting state from the workspace's base
snapshot (so a rollout cannot pass by editing or deleting the tests), runs
``grader.command`` in the sandbox with the task's timeout, and deletes the
fork. The rollout's workspace is never changed.

Outcomes:

* exit 0 -> ``passed=True``; any other exit code -> ``passed=False`` (the
  code does not satisfy the tests, including a syntax error the rollout made);
* the grader could not run -> ``GradeResult(error=...)``, an infrastructure
  error that the trainer excludes and counts, never a silent fail: the
  sandbox or fork failed, the command was not found (exit 126/127: the
  interpreter is not visible in the sandbox), it was killed by a signal or
  the memory limit;
* it ran past ``grader.timeout_s`` -> ``error`` set *and* ``timed_out=True``
  (see :mod:`rl.reward` for how a timeout is scored).

Interpreters: ``{python}`` in a command is resolved by :class:`GraderConfig`,
so task files never hold a host path. ``system`` is ``/usr/bin/python3`` (the
sandbox always sees it; unittest only); ``project`` is this process's
interpreter (with pytest), which the sandbox sees only when made with
``extra_ro`` = :attr:`GraderConfig.project_ro` (:func:`grader_sandbox`).

Not guaranteed: the base snapshot must be the task's starting state, true for
a workspace made by :func:`rl.tasks.workspaces.materialise` and for any fork
of it; a grader's command can still read the rollout's other files (that is
the point) and its own runtime is bounded only by the sandbox limits.
"""

from __future__ import annotations

import asyncio
import shlex
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

from rl.tasks.spec import Task
from rl.types import GradeResult
from tools.sandbox import Sandbox, SandboxLimits, make_sandbox
from tools.snapshots import EntryKind, ManifestEntry, Snapshot
from tools.workspace import Workspace

__all__ = ["GraderConfig", "grade", "grader_sandbox", "restore_paths"]

OUTPUT_CAP = 8 << 10  # characters of grader output kept (the tail: where failures are reported)


@dataclass(frozen=True, slots=True)
class GraderConfig:
    """Where ``{python}`` points for each ``Grader.interpreter``."""

    system_python: str = "/usr/bin/python3"
    project_python: str = sys.executable
    # the venv and the installation it points to (a venv's python is a link into its base)
    project_ro: tuple[Path, ...] = field(default_factory=lambda: tuple(dict.fromkeys((Path(sys.prefix),
                                                                                   Path(sys.base_prefix)))))
    memory_bytes: int = 1 << 30

    def python(self, interpreter: str) -> str:
        return self.project_python if interpreter == "project" else self.system_python


def grader_sandbox(*, project: bool = False, config: GraderConfig | None = None,
                   allow_unsandboxed: bool = False) -> Sandbox:
    """A sandbox for graders; ``project=True`` makes the project's Python visible (read-only)."""
    cfg = config or GraderConfig()
    return make_sandbox(allow_unsandboxed=allow_unsandboxed, extra_ro=cfg.project_ro if project else ())


def _under(key: str, path: str) -> bool:
    return key == path or key.startswith(path + "/")


def restore_paths(ws: Workspace, paths: Sequence[str]) -> None:
    """Make ``paths`` (files or directories) in ``ws`` exactly what they are in ``ws.base``,
    leaving every other path as it is; a path absent from the base is removed."""
    base = ws.base.manifest
    cur: dict[str, ManifestEntry] = dict(ws.snapshot().manifest)

    def drop(prefix: str) -> None:
        for k in [k for k in cur if _under(k, prefix)]:
            del cur[k]

    for p in paths:
        p = p.rstrip("/")
        drop(p)
        parts = p.split("/")
        for i in range(1, len(parts)):  # ancestors must be directories again (not a file or a link)
            anc = "/".join(parts[:i])
            e = cur.get(anc)
            if e is not None and e.kind is not EntryKind.DIR:
                drop(anc)
            if anc not in cur and anc in base:
                cur[anc] = base[anc]
        cur.update({k: e for k, e in base.items() if _under(k, p)})
    ws.restore(Snapshot.from_manifest(cur))


def _tail(text: str) -> str:
    return text if len(text) <= OUTPUT_CAP else "[... cut ...]\n" + text[-OUTPUT_CAP:]


async def grade(task: Task, workspace: Workspace, sandbox: Sandbox, *,
                config: GraderConfig | None = None) -> GradeResult:
    """Grade ``workspace`` (the rollout's final state) for ``task``; see the module docstring."""
    cfg = config or GraderConfig()
    g = task.grader
    t0 = time.monotonic()
    fork: Workspace | None = None
    try:
        fork = await asyncio.to_thread(workspace.fork)
        await asyncio.to_thread(restore_paths, fork, g.test_files)
        command = g.command.replace("{python}", shlex.quote(cfg.python(g.interpreter)))
        limits = SandboxLimits(timeout_s=g.timeout_s, memory_bytes=cfg.memory_bytes)
        res = await sandbox.run(command, fork.root, limits)
    except Exception as exc:  # noqa: BLE001 - every failure of ours becomes an infra error, never a fail
        return GradeResult(False, "", time.monotonic() - t0,
                           error=f"grader for task {task.id} could not run: {type(exc).__name__}: {exc}"[:2000])
    finally:
        if fork is not None:
            await asyncio.to_thread(fork.delete)
    out, dur = _tail(res.output), time.monotonic() - t0
    if res.timed_out:
        return GradeResult(False, out, dur, timed_out=True,
                           error=f"grader for task {task.id} timed out after {g.timeout_s:g}s (grader.timeout_s)")
    if res.exit_code in (126, 127):
        return GradeResult(False, out, dur, error=(
            f"grader command not runnable (exit {res.exit_code}): is {cfg.python(g.interpreter)!r} visible in "
            f"the sandbox? interpreter={g.interpreter!r}" + (" needs grader_sandbox(project=True)"
                                                             if g.interpreter == "project" else "")))
    if res.exit_code is None or res.oom_killed or res.exit_code > 128:
        why = "the memory limit" if res.oom_killed else f"signal {res.signal or (res.exit_code or 0) - 128}"
        return GradeResult(False, out, dur, error=f"grader for task {task.id} was killed by {why}")
    return GradeResult(res.exit_code == 0, out, dur)
