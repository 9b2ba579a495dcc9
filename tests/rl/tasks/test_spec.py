"""Task files: round trip, and errors that name the line and the field."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from rl.tasks.build import make_task
from rl.tasks.spec import Task, TaskFileError, load_tasks, write_tasks
from rl.types import Split


def _task(seed: int = 1) -> Task:
    return make_task("fix_bug", Split.TRAIN, seed, 1)


def _write_lines(path: Path, objs: list[dict]) -> None:
    path.write_text("".join(json.dumps(o) + "\n" for o in objs))


def test_round_trip(tmp_path: Path) -> None:
    tasks = [_task(1), make_task("rename", Split.HELDOUT, 2, 2)]
    out = tmp_path / "tasks.jsonl"
    assert write_tasks(out, tasks) == 2
    assert load_tasks(out) == tasks


def test_missing_field_names_line_and_field(tmp_path: Path) -> None:
    good = _task(1).model_dump(mode="json")
    bad = _task(2).model_dump(mode="json")
    del bad["grader"]["command"]
    f = tmp_path / "tasks.jsonl"
    _write_lines(f, [good, good | {"id": "other"}, bad])
    with pytest.raises(TaskFileError, match=r"^tasks\.jsonl:3: grader\.command: Field required"):
        load_tasks(f)


@pytest.mark.parametrize(("change", "message"), [
    (lambda d: d["source"].update(kind="git", repo="/r", commit="main", files=None), r"tasks\.jsonl:1: source"),
    (lambda d: d.update(split="dev"), r"tasks\.jsonl:1: split: Input should be 'train', 'heldout' or 'validation'"),
    (lambda d: d.update(surprise=1), r"tasks\.jsonl:1: surprise: Extra inputs are not permitted"),
    (lambda d: d["grader"].update(test_files=["../escape.py"]), r"grader\.test_files: .*not a normalised relative path"),
    (lambda d: d["grader"].update(timeout_s=0), r"grader\.timeout_s"),
])
def test_invalid_field_is_named(tmp_path: Path, change, message: str) -> None:  # noqa: ANN001
    d = _task().model_dump(mode="json")
    change(d)
    f = tmp_path / "tasks.jsonl"
    _write_lines(f, [d])
    with pytest.raises(TaskFileError, match=message):
        load_tasks(f)


def test_bad_json_and_duplicate_ids(tmp_path: Path) -> None:
    f = tmp_path / "t.jsonl"
    f.write_text(_task().model_dump_json() + "\n{not json\n")
    with pytest.raises(TaskFileError, match=r"^t\.jsonl:2: not valid JSON"):
        load_tasks(f)
    f.write_text(_task().model_dump_json() + "\n\n" + _task().model_dump_json() + "\n")
    with pytest.raises(TaskFileError, match=r"^t\.jsonl:3: id: duplicate task id .* \(first on line 1\)"):
        load_tasks(f)


def test_interrupted_write_leaves_nothing(tmp_path: Path) -> None:
    out = tmp_path / "tasks.jsonl"
    out.write_text("old\n")

    def tasks():  # noqa: ANN202
        yield _task(1)
        raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        write_tasks(out, tasks())
    assert out.read_text() == "old\n"
    assert [p.name for p in tmp_path.iterdir()] == ["tasks.jsonl"]
