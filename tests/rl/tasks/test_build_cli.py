"""`flywheel rl tasks build`: validated tasks written atomically, with a summary."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from backend.cli import main
from rl.tasks.spec import load_tasks
from rl.types import Split


@pytest.mark.sandbox
def test_build_writes_validated_tasks(tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                      sandbox: object) -> None:
    out = tmp_path / "tasks.jsonl"
    rc = main(["rl", "tasks", "build", "--families", "fix_bug,implement_stub", "--n-train", "3",
               "--n-heldout", "2", "--seed", "5", "--out", str(out)])
    assert rc == 0
    tasks = load_tasks(out)
    assert [t.split for t in tasks].count(Split.HELDOUT) == 2 and len(tasks) == 5
    summary = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert summary["written"] == {"train": 3, "heldout": 2} and summary["dropped"] == 0
    assert sorted(p.name for p in tmp_path.iterdir()) == ["tasks.jsonl"]


@pytest.mark.sandbox
def test_build_writes_a_validation_split_when_asked(tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                                    sandbox: object) -> None:
    out = tmp_path / "tasks.jsonl"
    rc = main(["rl", "tasks", "build", "--families", "rename,find_change", "--n-train", "2",
               "--n-heldout", "1", "--n-validation", "2", "--seed", "5", "--out", str(out)])
    assert rc == 0
    printed = capsys.readouterr().out
    assert "train 2, heldout 1, validation 2" in printed
    valid = [t for t in load_tasks(out) if t.split is Split.VALIDATION]
    assert [t.family for t in valid] == ["rename", "find_change"]
    assert all(t.id.startswith(f"{t.family}-validation-") for t in valid)
    assert json.loads(printed.strip().splitlines()[-1])["written"] == {"train": 2, "heldout": 1, "validation": 2}


def test_a_negative_count_is_a_clear_error(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    rc = main(["rl", "tasks", "build", "--n-validation", "-1", "--out", str(tmp_path / "t.jsonl")])
    assert rc == 2 and "--n-validation must be >= 0" in capsys.readouterr().err
    assert not (tmp_path / "t.jsonl").exists()


def test_unknown_family_is_a_clear_error(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    rc = main(["rl", "tasks", "build", "--families", "fix_bug,bogus", "--out", str(tmp_path / "t.jsonl")])
    assert rc == 2
    assert "unknown task families ['bogus']; known: fix_bug" in capsys.readouterr().err
    assert not (tmp_path / "t.jsonl").exists()
