"""Minimal edits: the changed lines plus only the context that makes ``search`` unique, and,
applied by the real ``edit_file`` to generated tasks, exactly the reference patch's result."""

from __future__ import annotations

import random
from pathlib import Path

import pytest

from agent.parser import encode_call
from rl.tasks.build import make_task
from rl.tasks.families import FAMILIES
from rl.tasks.workspaces import materialise
from rl.train.demos import DemoTask, Edit, demo_task_from_patch, grep_pattern, scripted_outputs, tighten
from rl.train.tight_edits import tighten_edit
from rl.types import Split
from tools.edit_file import _edit
from tools.workspace import WorkspaceStore

FILE = "def a(x):\n    return x + 1\n\n\ndef b(x):\n    return x * 61\n\n\ndef c(x):\n    return x + 1\n"


def test_context_is_dropped_when_the_changed_line_is_unique() -> None:
    hunk = Edit("m.py", "\n\ndef b(x):\n    return x * 61\n\n\n", "\n\ndef b(x):\n    return x * 60\n\n\n")
    assert tighten_edit(FILE, hunk) == [Edit("m.py", "    return x * 61\n", "    return x * 60\n")]


def test_context_grows_only_until_the_search_is_unique() -> None:
    # "    return x + 1\n" occurs twice: one line of context (the def before it) disambiguates
    hunk = Edit("m.py", "\n\ndef c(x):\n    return x + 1\n", "\n\ndef c(x):\n    return x + 2\n")
    assert tighten_edit(FILE, hunk) == [Edit("m.py", "def c(x):\n    return x + 1\n", "def c(x):\n    return x + 2\n")]


def test_a_pure_insertion_keeps_one_line_of_context() -> None:
    hunk = Edit("m.py", "def b(x):\n    return x * 61\n", "def b(x):\n    y = x\n    return x * 61\n")
    [tight] = tighten_edit(FILE, hunk)
    assert tight.search in ("def b(x):\n", "    return x * 61\n")
    assert FILE.replace(tight.search, tight.replace, 1) == FILE.replace(hunk.search, hunk.replace, 1)


def test_a_search_that_does_not_match_once_is_left_alone() -> None:
    twice = Edit("m.py", "    return x + 1\n", "    return x + 3\n")
    assert tighten_edit(FILE, twice) == [twice]
    missing = Edit("m.py", "nope\n", "yes\n")
    assert tighten_edit(FILE, missing) == [missing]


def test_a_hunk_is_split_into_its_runs_of_changed_lines() -> None:
    src = "import a\n\n\ndef f(v):\n    return a.g(v)\n"
    hunk = Edit("m.py", src, src.replace("a", "b").replace("def f(v)", "def f(v)"))
    assert tighten_edit(src, hunk) == [Edit("m.py", "import a\n", "import b\n"),
                                       Edit("m.py", "    return a.g(v)\n", "    return b.g(v)\n")]


def test_later_edits_of_a_file_are_measured_after_the_earlier_ones() -> None:
    # after the first edit, "    return x + 1\n" is unique (only c's is left): no context needed
    task = DemoTask("t", "r", (Edit("m.py", "def a(x):\n    return x + 1\n", "def a(x):\n    return x + 5\n"),
                               Edit("m.py", "def c(x):\n    return x + 1\n", "def c(x):\n    return x + 7\n")), "t")
    tight = tighten(task, lambda _p: FILE)
    assert [e.search for e in tight.edits] == ["def a(x):\n    return x + 1\n", "    return x + 1\n"]


def test_the_grep_pattern_is_a_name_not_a_keyword() -> None:
    assert grep_pattern(Edit("m.py", "def bison_comet(x):\n    return x * 61\n", "")) == "bison_comet"
    assert grep_pattern(Edit("m.py", "    return len(x)\n", "")) == "m.py"


def test_the_search_style_greps_for_the_name_in_the_full_hunk() -> None:
    src = FILE.replace("def b(", "def bison_comet(")
    hunk = Edit("m.py", "\n\ndef bison_comet(x):\n    return x * 61\n", "\n\ndef bison_comet(x):\n    return x * 60\n")
    task = tighten(DemoTask("t", "r", (hunk,), "t"), lambda _p: src)
    assert task.edits[0].search == "    return x * 61\n"
    assert task.grep_hint == "bison_comet"
    first = scripted_outputs(task, "search", rng=random.Random(0))[0]
    assert first == encode_call("grep", {"pattern": "bison_comet"})


@pytest.mark.parametrize("family", sorted(FAMILIES))
@pytest.mark.parametrize("seed", [1, 2, 3])
def test_tight_edits_make_the_reference_change(family: str, seed: int, tmp_path: Path) -> None:
    task = make_task(family, Split.TRAIN, seed, 2)
    full = demo_task_from_patch(task.id, task.request, task.reference_patch, task.grader.agent_command)
    store = WorkspaceStore(tmp_path / "store")
    base = materialise(task, store)
    try:
        tight = tighten(full, lambda p: base.read_bytes(p).decode())
        results = []
        for demo in (full, tight):
            ws = base.fork()
            try:
                for e in demo.edits:
                    assert _edit(ws, e.path, e.search, e.replace).ok
                results.append({p: ws.read_bytes(p) for p in full.paths})
            finally:
                ws.delete()
    finally:
        base.delete()
    assert results[0] == results[1]
    shorter = sum(len(e.search) for e in tight.edits) < sum(len(e.search) for e in full.edits)
    # a one-line file (find_change's constant) has no context to drop; a function's bug fix does
    assert shorter or family == "find_change"
    assert sum(len(e.search) for e in tight.edits) <= sum(len(e.search) for e in full.edits)
