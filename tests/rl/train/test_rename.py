"""Name-swap augmentation (:mod:`rl.train.rename`): a renamed demonstration is the demonstration
the runtime records for the renamed task, and a renaming that would touch the scaffold is refused."""

from __future__ import annotations

import random
from pathlib import Path

import pytest

from rl.tasks.build import make_task
from rl.tasks.families import generate, patch_between
from rl.tasks.spec import GeneratedSource, Task
from rl.tasks.vocab import HELDOUT_WORDS
from rl.tasks.workspaces import materialise
from rl.train.demos import DemoTask, demo_task_from_patch, record_demo, shell_edit_for
from rl.train.rename import apply_renaming, rename_demo, renamed_words, renaming_for
from rl.types import Split
from tools.sandbox import Sandbox, make_sandbox, probe_bwrap
from tools.workspace import WorkspaceStore

FAMILIES = ("fix_bug", "rename", "find_change", "implement_stub")


def test_apply_renaming_replaces_whole_names_in_every_case_form() -> None:
    m = {"bison": "qxz", "comet": "wolo"}
    text = "def bison_comet(x):  # BISON_COMET, TestBison, bisons, xbison, comet/bison.py, Bisonx"
    assert apply_renaming(text, m) == ("def qxz_wolo(x):  # QXZ_WOLO, TestQxz, bisons, xbison, wolo/qxz.py, Bisonx")


def test_a_fresh_name_never_holds_a_held_out_or_validation_word(monkeypatch: pytest.MonkeyPatch) -> None:
    import rl.train.rename as rename

    drawn = iter(["zotterq", "iriszz", "qoblin"])  # 'otter' is a validation word, 'iris' a held-out one
    monkeypatch.setattr(rename, "_random_word", lambda rng: next(drawn))
    assert rename._fresh(random.Random(0), set(), pool_share=0.0) == "qoblin"


@pytest.mark.parametrize("family", FAMILIES)
def test_a_renaming_is_checked_against_the_regenerated_task(family: str) -> None:
    kept = 0
    for seed in range(12):
        task = make_task(family, Split.TRAIN, seed, 1 + seed % 3)
        mapping = renaming_for(task, random.Random(seed))
        if mapping is None:
            continue
        kept += 1
        assert set(mapping) == set(task.metadata["words"])
        assert not any(h in new for new in mapping.values() for h in HELDOUT_WORDS)
        draft = generate(family, Split.TRAIN, task.seed, task.difficulty, words=renamed_words(mapping))
        assert draft.request == apply_renaming(task.request, mapping) != task.request
        assert isinstance(task.source, GeneratedSource)
        assert sorted(draft.files) == sorted(apply_renaming(p, mapping) for p in task.source.files)
    assert kept >= 6, f"only {kept} of 12 {family} tasks could be renamed"


def test_a_renaming_that_would_touch_the_scaffold_or_the_system_prompt_is_refused() -> None:
    task = make_task("implement_stub", Split.TRAIN, 3, 1)
    word = task.metadata["words"][0]
    assert renaming_for(task, random.Random(0)) is not None
    assert renaming_for(task, random.Random(0), system_text=f"You may call {word}.") is None
    held = make_task("implement_stub", Split.HELDOUT, 3, 1)
    assert renaming_for(held, random.Random(0)) is None  # held-out tasks are never augmented
    old = task.model_copy(update={"metadata": {}})
    assert renaming_for(old, random.Random(0)) is None  # a task file built before names were recorded


@pytest.fixture(scope="module")
def sandbox() -> Sandbox:
    reason = probe_bwrap()
    if reason is not None:
        pytest.skip(f"bubblewrap is not usable here: {reason}")
    return make_sandbox()


def _renamed_task(task: Task, mapping: dict[str, str]) -> Task:
    d = generate(task.family, task.split, task.seed, task.difficulty, words=renamed_words(mapping))
    return task.model_copy(update={"request": d.request, "source": GeneratedSource(files=d.files),
                                   "metadata": task.metadata | d.metadata,
                                   "reference_patch": patch_between(d.files, d.solution),
                                   "grader": task.grader.model_copy(update={"test_files": d.test_files})})


async def _demo(task: Task, style: str, sandbox: Sandbox, root: Path):  # type: ignore[no-untyped-def]
    from agent.prompt import profile_named

    demo = demo_task_from_patch(task.id, task.request, task.reference_patch, task.grader.agent_command,
                                extra_reads=[p for p in task.grader.test_files if p != "tests/__init__.py"])
    # unittest prints its run time; keep only its verdict so that two runs compare equal
    demo = DemoTask(demo.task_id, demo.request, demo.edits, demo.test_command + " 2>&1 | tail -n 1",
                    demo.extra_reads, shell_edit=shell_edit_for(task))
    base = materialise(task, WorkspaceStore(root))
    ws = base.fork()
    try:
        return await record_demo(demo, style, ws, sandbox, profile=profile_named("compact"), seed=5)  # type: ignore[arg-type]
    finally:
        ws.delete()
        base.delete()


@pytest.mark.sandbox
@pytest.mark.parametrize("family", FAMILIES)
@pytest.mark.parametrize("style", ["parallel", "sequential"])
async def test_a_renamed_demonstration_is_what_the_runtime_records_for_the_renamed_task(
        family: str, style: str, sandbox: Sandbox, tmp_path: Path) -> None:
    task = next(t for seed in range(20) if renaming_for(t := make_task(family, Split.TRAIN, seed, 2),
                                                         random.Random(seed)) is not None)
    mapping = renaming_for(task, random.Random(task.seed))
    assert mapping is not None
    original = await _demo(task, style, sandbox, tmp_path / "a")
    real = await _demo(_renamed_task(task, mapping), style, sandbox, tmp_path / "b")
    renamed = rename_demo(original, mapping)
    assert renamed.outputs == real.outputs
    assert [p.text for p in renamed.prompts] == [p.text for p in real.prompts]
    assert renamed.prompts[0].text != original.prompts[0].text


@pytest.mark.sandbox
async def test_a_renamed_shell_demonstration_renames_the_command_too(sandbox: Sandbox, tmp_path: Path) -> None:
    """The ``sed`` command of a rename task's shell-style demonstration is renamed with the rest: the
    renamed transcript is what the runtime records for the renamed task, and it passes there too."""
    task = next(t for seed in range(20) if renaming_for(t := make_task("rename", Split.TRAIN, seed, 2),
                                                         random.Random(seed)) is not None)
    mapping = renaming_for(task, random.Random(task.seed))
    assert mapping is not None
    original = await _demo(task, "shell", sandbox, tmp_path / "a")
    real = await _demo(_renamed_task(task, mapping), "shell", sandbox, tmp_path / "b")
    renamed = rename_demo(original, mapping)
    assert any("sed -i" in o for o in renamed.outputs)
    assert renamed.outputs == real.outputs
    assert [p.text for p in renamed.prompts] == [p.text for p in real.prompts]
    assert task.metadata["old"] not in "".join(renamed.outputs)
    verdict = real.prompts[-1].text[-200:]  # the last tool result: the tests' verdict line
    assert "OK" in verdict and "FAILED" not in verdict, verdict
