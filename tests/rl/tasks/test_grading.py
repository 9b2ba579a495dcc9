"""Grading: on a fresh fork with the task's tests restored, in the real sandbox, with a timeout."""

from __future__ import annotations

import pytest

from rl.tasks.build import make_task, validate
from rl.tasks.grading import GraderConfig, grade
from rl.tasks.spec import Grader, Task
from rl.tasks.workspaces import apply_patch, materialise
from rl.types import Split
from tools.sandbox import Sandbox
from tools.workspace import WorkspaceStore

pytestmark = pytest.mark.sandbox


def _task() -> Task:
    return make_task("fix_bug", Split.TRAIN, 7, 1)


async def test_starting_state_fails_and_reference_passes(store: WorkspaceStore, sandbox: Sandbox) -> None:
    task = _task()
    ws = materialise(task, store)
    assert not (await grade(task, ws, sandbox)).passed
    apply_patch(ws.root, task.reference_patch)
    res = await grade(task, ws, sandbox)
    assert res.passed and res.error is None, res.output


async def test_editing_the_test_to_pass_does_not_pass(store: WorkspaceStore, sandbox: Sandbox) -> None:
    task = _task()
    ws = materialise(task, store)
    test = next(p for p in task.grader.test_files if p.startswith("tests/test_"))
    ws.write_bytes(test, b"import unittest\n\nclass T(unittest.TestCase):\n    def test_ok(self):\n        pass\n")
    res = await grade(task, ws, sandbox)
    assert not res.passed and res.error is None
    # the rollout's own workspace is untouched by grading
    assert b"test_ok" in ws.read_bytes(test)


async def test_deleting_or_replacing_the_tests_does_not_pass(store: WorkspaceStore, sandbox: Sandbox) -> None:
    task = _task()
    ws = materialise(task, store)
    import shutil

    shutil.rmtree(ws.root / "tests")
    (ws.root / "tests").write_text("not a directory")
    res = await grade(task, ws, sandbox)
    assert not res.passed and res.error is None, res.output


async def test_hanging_grader_times_out(store: WorkspaceStore, sandbox: Sandbox) -> None:
    task = _task().model_copy(update={"grader": Grader(command="sleep 60", test_files=["tests"], timeout_s=1)})
    res = await grade(task, materialise(task, store), sandbox)
    assert not res.passed and res.timed_out
    assert res.error is not None and "timed out after 1s" in res.error
    assert res.duration_s < 30


async def test_missing_interpreter_is_an_infra_error(store: WorkspaceStore, sandbox: Sandbox) -> None:
    task = _task().model_copy(update={"grader": Grader(command="{python} -c pass", test_files=["tests"],
                                                       interpreter="project")})
    cfg = GraderConfig(project_python="/nonexistent/bin/python")
    res = await grade(task, materialise(task, store), sandbox, config=cfg)
    assert not res.passed and res.error is not None and "not runnable (exit 127)" in res.error


async def test_a_crashing_grader_setup_is_an_infra_error(store: WorkspaceStore, sandbox: Sandbox) -> None:
    task = _task()
    ws = materialise(task, store)
    ws.delete()  # the workspace is gone: forking it fails
    res = await grade(task, ws, sandbox)
    assert not res.passed and res.error is not None and "could not run" in res.error


async def test_validation_drops_a_task_whose_grader_passes_at_the_start(store: WorkspaceStore,
                                                                        sandbox: Sandbox) -> None:
    task = _task().model_copy(update={"grader": Grader(command="true", test_files=["tests"])})
    assert await validate(task, store, sandbox) == "grader passes on the starting state (nothing to do)"
    assert await validate(_task(), store, sandbox) is None


async def test_project_interpreter_runs_pytest_in_the_sandbox(store: WorkspaceStore) -> None:
    from rl.tasks.grading import grader_sandbox

    task = _task().model_copy(update={"grader": Grader(
        command="{python} -m pytest -q -p no:cacheprovider tests", test_files=["tests"], interpreter="project")})
    ws = materialise(task, store)
    apply_patch(ws.root, task.reference_patch)
    res = await grade(task, ws, grader_sandbox(project=True))
    assert res.passed and res.error is None, res.output
