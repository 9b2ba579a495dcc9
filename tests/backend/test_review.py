"""backend.review: the end-of-session choice, driven with scripted answers."""

from __future__ import annotations

import io
from collections.abc import Iterator
from pathlib import Path

import pytest

from backend.apply_back import ChangeSet
from backend.review import finish
from tools.workspace import WorkspaceStore


@pytest.fixture
def setup(tmp_path: Path) -> tuple[Path, ChangeSet]:
    src = tmp_path / "proj"
    src.mkdir()
    (src / "a.txt").write_text("old\n")
    ws = WorkspaceStore(tmp_path / "store").from_dir(src)
    (ws.root / "a.txt").write_text("new\n")
    return src, ChangeSet.from_workspace(ws)


def answers(*items: str | None) -> tuple[Iterator[str | None], list[str]]:
    prompts: list[str] = []
    it = iter(items)

    def ask(prompt: str) -> str | None:
        prompts.append(prompt)
        return next(it)
    return ask, prompts  # type: ignore[return-value]


def test_answer_apply(setup: tuple[Path, ChangeSet]) -> None:
    src, changes = setup
    ask, prompts = answers("a")
    out = io.StringIO()
    outcome = finish(changes, src, choice="ask", say=out, ask=ask)
    assert outcome.status == 0 and outcome.applied is not None
    assert (src / "a.txt").read_text() == "new\n" and "applied to" in out.getvalue()
    assert prompts and str(src) in prompts[0]


def test_default_and_end_of_input_discard(setup: tuple[Path, ChangeSet]) -> None:
    src, changes = setup
    for answer in ("", None):
        ask, _ = answers(answer)
        out = io.StringIO()
        assert finish(changes, src, choice="ask", say=out, ask=ask).status == 0
        assert "discarded" in out.getvalue() and (src / "a.txt").read_text() == "old\n"


def test_conflict_then_export_without_overwriting(setup: tuple[Path, ChangeSet], tmp_path: Path) -> None:
    src, changes = setup
    (src / "a.txt").write_text("the user's\n")
    taken = tmp_path / "taken.patch"
    taken.write_text("keep me")
    ask, prompts = answers("x", "a", "e", str(taken), "e", str(tmp_path / "new.patch"))
    out = io.StringIO()
    outcome = finish(changes, src, choice="ask", say=out, ask=ask)
    text = out.getvalue()
    assert "answer a, e or d" in text and "edited there since the session started" in text
    assert f"{taken} exists" in text and taken.read_text() == "keep me"
    assert outcome.status == 0 and outcome.patch_file == tmp_path / "new.patch"
    assert "+new" in (tmp_path / "new.patch").read_text() and (src / "a.txt").read_text() == "the user's\n"
    assert len(prompts) == 6


def test_not_interactive_only_says_how(setup: tuple[Path, ChangeSet]) -> None:
    src, changes = setup
    out = io.StringIO()
    assert finish(changes, src, choice="ask", say=out, retry_hint="use --apply").status == 0
    assert "not applied" in out.getvalue() and "use --apply" in out.getvalue()
    assert (src / "a.txt").read_text() == "old\n"


def test_names_are_shown_inert(tmp_path: Path) -> None:
    src = tmp_path / "proj"
    src.mkdir()
    ws = WorkspaceStore(tmp_path / "store").from_dir(src)
    (ws.root / "evil\x1b]0;x\x07.txt").write_text("x")
    (src / "evil\x1b]0;x\x07.txt").write_text("made meanwhile")  # a conflict: its message names the file
    changes = ChangeSet.from_workspace(ws)
    out = io.StringIO()
    assert finish(changes, src, choice="apply", say=out).status == 1
    assert "\x1b" not in out.getvalue() and "evil^[]0;x^G.txt" in out.getvalue()
