"""Procedural families: deterministic, valid in the real sandbox, held-out vocabulary disjoint."""

from __future__ import annotations

import ast
from pathlib import PurePosixPath

import pytest

from rl.tasks.build import make_task, plan, validate
from rl.tasks.families import FAMILIES, generate
from rl.tasks.spec import GeneratedSource, Task
from rl.tasks.vocab import SCAFFOLD
from rl.types import Split
from tools.sandbox import Sandbox
from tools.workspace import WorkspaceStore


def _names(task: Task) -> set[str]:
    """Every identifier, file and directory name a task's files contain."""
    assert isinstance(task.source, GeneratedSource)
    out: set[str] = set()
    for path, text in task.source.files.items():
        p = PurePosixPath(path)
        out |= {p.stem, *p.parent.parts}
        for node in ast.walk(ast.parse(text)):
            if isinstance(node, ast.Name):
                out.add(node.id)
            elif isinstance(node, (ast.FunctionDef, ast.ClassDef)):
                out.add(node.name)
            elif isinstance(node, ast.arg):
                out.add(node.arg)
            elif isinstance(node, ast.Attribute):
                out.add(node.attr)
            elif isinstance(node, ast.alias):
                out |= set(node.name.split("."))
            elif isinstance(node, ast.ImportFrom) and node.module:
                out |= set(node.module.split("."))
            elif isinstance(node, ast.Constant) and isinstance(node.value, str) and node.value.isidentifier():
                out.add(node.value)
    return out


def _words(names: set[str]) -> set[str]:
    return {w for n in names - SCAFFOLD for w in n.lower().removeprefix("test_").split("_") if w}


def test_held_out_names_never_appear_in_train() -> None:
    jobs = plan(list(FAMILIES), 40, 40, seed=3)
    train = set().union(*(_names(make_task(*j)) for j in jobs if j[1] is Split.TRAIN))
    held = set().union(*(_names(make_task(*j)) for j in jobs if j[1] is Split.HELDOUT))
    assert (held & train) - SCAFFOLD == set()
    assert _words(held) & _words(train) <= {"test", "0", "1", "2", "3", "4", "5", "6"}


def test_validation_names_appear_in_neither_other_split() -> None:
    jobs = plan(list(FAMILIES), 40, 40, seed=3, n_validation=40)
    by_split = {sp: set().union(*(_names(make_task(*j)) for j in jobs if j[1] is sp)) for sp in Split}
    valid = by_split[Split.VALIDATION]
    assert len(valid) > 40
    for other in (Split.TRAIN, Split.HELDOUT):
        assert (valid & by_split[other]) - SCAFFOLD == set()
        assert _words(valid) & _words(by_split[other]) <= {"test", "0", "1", "2", "3", "4", "5", "6"}


def test_adding_a_validation_split_leaves_the_other_tasks_as_they_were() -> None:
    without = plan(list(FAMILIES), 8, 4, seed=2)
    with_valid = plan(list(FAMILIES), 8, 4, seed=2, n_validation=6)
    assert with_valid[: len(without)] == without
    assert [j[1] for j in with_valid[len(without):]] == [Split.VALIDATION] * 6
    seeds = {sp: {s for _, x, s, _ in with_valid if x is sp} for sp in Split}
    assert not seeds[Split.VALIDATION] & (seeds[Split.TRAIN] | seeds[Split.HELDOUT])
    with pytest.raises(ValueError, match="at most 250,000"):
        plan(list(FAMILIES), 1, 1, seed=0, n_validation=250_001)


def test_no_invented_name_is_a_stdlib_module() -> None:
    # a task's module named `enum` or `json` would shadow what the grader's unittest imports
    import sys

    from rl.tasks.vocab import HELDOUT_WORDS, TRAIN_WORDS, VALIDATION_WORDS

    assert not set(TRAIN_WORDS + HELDOUT_WORDS + VALIDATION_WORDS) & sys.stdlib_module_names
    jobs = plan(list(FAMILIES), 40, 8, seed=5)
    paths = {part.removesuffix(".py") for j in jobs for p in make_task(*j).source.files for part in p.split("/")}
    assert not paths & sys.stdlib_module_names - {"tests"}


def test_seeds_differ_across_splits_and_tasks_are_deterministic() -> None:
    jobs = plan(list(FAMILIES), 8, 8, seed=0)
    assert not {s for _, sp, s, _ in jobs if sp is Split.TRAIN} & {s for _, sp, s, _ in jobs if sp is Split.HELDOUT}
    assert make_task(*jobs[0]) == make_task(*jobs[0])
    assert make_task(*jobs[0]) != make_task(*jobs[1])


def test_files_are_short() -> None:
    for job in plan(list(FAMILIES), 12, 0, seed=1):
        d = generate(job[0], job[1], job[2], job[3])
        assert max(t.count("\n") for t in d.files.values()) <= 40, job


@pytest.mark.sandbox
@pytest.mark.parametrize("family", sorted(FAMILIES))
@pytest.mark.parametrize("difficulty", [1, 3])
async def test_every_family_validates(family: str, difficulty: int, store: WorkspaceStore,
                                      sandbox: Sandbox) -> None:
    for split in Split:
        task = make_task(family, split, 11, difficulty)
        assert await validate(task, store, sandbox) is None, task.id


def test_unknown_family_and_difficulty_are_refused() -> None:
    with pytest.raises(ValueError, match="unknown task family 'nope'; known: fix_bug"):
        generate("nope", Split.TRAIN, 0, 1)
    with pytest.raises(ValueError, match="difficulty must be 1..3"):
        generate("rename", Split.TRAIN, 0, 9)
