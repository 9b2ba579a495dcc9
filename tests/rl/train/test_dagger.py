"""DAgger relabelling: the scripted solver's next output in the states a model actually reached,
on the exact token prefix the engine consumed there."""

from __future__ import annotations

import random
from pathlib import Path

import pytest

from agent.model.tokenizer import Tokenizer, train_tokenizer
from agent.parser import encode_call
from agent.policies.tito import ScriptedCompleter, scripted_output_ids
from agent.prompt import profile_named
from agent.session import Limits
from rl.rollout.taskenv import TaskEnv
from rl.rollout.worker import RolloutJob, RolloutRunner, WorkerConfig
from rl.tasks.build import make_task
from rl.tasks.spec import GeneratedSource, Task
from rl.train.dagger import ExpertState, RelabelStats, expert_next, observe, read_only_command, relabel, solution_files
from rl.train.demos import DemoTask, Edit
from rl.types import Rollout, RolloutStatus, Split
from tools.sandbox import probe_bwrap

SRC = "def f(x):\n    return x * 61\n"
TASK = DemoTask("t", "fix f", (Edit("m.py", "    return x * 61\n", "    return x * 60\n"),), "python -m unittest")


def _kind(text: str | None) -> str:
    assert text is not None
    for name in ("read_file", "edit_file", "run_command"):
        if f"<tool_call name=\"{name}\">" in text:
            return name
    return "answer"


def test_the_expert_reads_then_edits_then_tests_then_answers() -> None:
    solution = solution_files(TASK, {"m.py": SRC})
    assert solution == {"m.py": "def f(x):\n    return x * 60\n"}
    rng = random.Random(0)
    state = ExpertState(files={"m.py": SRC})
    assert _kind(expert_next(TASK, solution, state, rng)) == "read_file"
    state.read.add("m.py")
    assert expert_next(TASK, solution, state, rng) == encode_call(
        "edit_file", {"path": "m.py", "search": "    return x * 61\n", "replace": "    return x * 60\n"})
    state.tested = True  # tests run before the fix do not count: the file still differs
    assert _kind(expert_next(TASK, solution, state, rng)) == "edit_file"
    state.files["m.py"], state.tested = solution["m.py"], False
    assert expert_next(TASK, solution, state, rng) == encode_call("run_command", {"command": "python -m unittest"})
    state.tested = True
    assert _kind(expert_next(TASK, solution, state, rng)) == "answer"


def test_the_expert_repairs_a_wrong_edit_from_the_file_as_the_model_left_it() -> None:
    solution = solution_files(TASK, {"m.py": SRC})
    state = ExpertState(files={"m.py": "def f(x):\n    return x * 62\n"}, read={"m.py"})
    assert expert_next(TASK, solution, state, random.Random(0)) == encode_call(
        "edit_file", {"path": "m.py", "search": "    return x * 62\n", "replace": "    return x * 60\n"})
    state.files["m.py"] = ""  # emptied: no edit_file can repair it
    assert expert_next(TASK, solution, state, random.Random(0)) is None


def _task_and_demo(family: str, seed: int, tmp_path: Path) -> tuple[Task, DemoTask, dict[str, str]]:
    reason = probe_bwrap()
    if reason is not None:
        pytest.skip(f"bubblewrap is not usable here: {reason}")
    task = make_task(family, Split.TRAIN, seed, 1)
    assert isinstance(task.source, GeneratedSource)
    from rl.train.dagger import demo_tasks
    from tools.workspace import WorkspaceStore

    demo, start = demo_tasks([task], WorkspaceStore(tmp_path / "demos"))[task.id]
    return task, demo, start


async def _scripted_rollout(task: Task, outputs: list[str], tmp_path: Path) -> tuple[Rollout, Tokenizer,
                                                                                  ScriptedCompleter]:
    """One rollout of ``task`` through the production runner with a model that sends ``outputs``."""
    assert isinstance(task.source, GeneratedSource)
    tok = train_tokenizer([t * 10 for t in task.source.files.values()] + [task.request * 10], 600)
    completer = ScriptedCompleter(outputs, tok)
    runner = RolloutRunner(WorkerConfig(store_root=str(tmp_path / "store"), limits=Limits(max_steps=8)),
                           completer, tok, profile_named("compact"))
    try:
        rollout = await runner.run_one(RolloutJob(TaskEnv(task), "r", 0, 0, seed=1))
    finally:
        runner.close()
    assert rollout.status is RolloutStatus.FINISHED, rollout.detail
    return rollout, tok, completer


@pytest.mark.sandbox
async def test_a_real_rollout_is_relabelled_call_by_call_on_the_consumed_prefix(tmp_path: Path) -> None:
    task, demo, start = _task_and_demo("fix_bug", 11, tmp_path)
    [edit] = demo.edits
    wrong = Edit(edit.path, edit.search.replace(" ", "  ", 1), edit.replace)

    def call(name: str, **args: str) -> str:
        return encode_call(name, args)

    # a model that reads a wrong path, then the right one, sends a broken edit, then the right
    # edit, runs the tests and answers
    outputs = [call("read_file", path="nope/x.py"), call("read_file", path="./" + edit.path),
               call("edit_file", path=edit.path, search=wrong.search, replace=wrong.replace),
               call("edit_file", path=edit.path, search=edit.search, replace=edit.replace),
               call("run_command", command=demo.test_command), "All done."]
    rollout, tok, completer = await _scripted_rollout(task, outputs, tmp_path)

    stats = RelabelStats()
    examples = relabel(rollout, demo, start, tok, max_len=100_000, rng=random.Random(0), stats=stats)
    assert stats.examples == len(examples) == len(outputs) and stats.unaligned == 0
    labels = [tok.decode(ex[1].token_ids) for ex in examples]
    assert [_kind(t) for t in labels] == ["read_file", "read_file", "edit_file", "edit_file", "run_command", "answer"]
    right_edit = outputs[3] + "\n<|end|>"
    assert labels[2] == labels[3] == right_edit  # the failed edit changed nothing: the same repair
    # the prefix is exactly what the engine consumed at that call; loss only on the label
    for ex, request in zip(examples, completer.requests, strict=True):
        assert ex[0].token_ids == list(request.prompt_ids) and not ex[0].sampled and ex[1].sampled
        assert ex[1].token_ids[-1] == tok.end_id
    assert examples[3][1].token_ids == scripted_output_ids(outputs[3], tok)
    assert stats.agreed == 2  # the right edit and the test command are what the solver would send


SHELL_TASK = DemoTask("t", "set LIMIT to 60", (Edit("m.py", "LIMIT = 61\n", "LIMIT = 60\n"),), "python -m unittest",
                      shell_edit="grep -rl '^LIMIT = ' . | xargs sed -i 's/^LIMIT = .*/LIMIT = 60/'")


def _started(name: str, **args: str) -> dict[str, object]:
    return {"name": name, "args": args, "valid": True}


def test_the_shell_expert_sends_the_one_command_then_tests() -> None:
    solution = solution_files(SHELL_TASK, {"m.py": "LIMIT = 61\n"})
    state = ExpertState(files={"m.py": "LIMIT = 61\n"}, shell=True)
    assert expert_next(SHELL_TASK, solution, state, random.Random(0)) == encode_call(
        "run_command", {"command": SHELL_TASK.shell_edit})
    observe(state, SHELL_TASK, solution, _started("run_command", command=SHELL_TASK.shell_edit or ""), {"ok": True})
    assert state.files == solution and state.changed and not state.unknown
    assert expert_next(SHELL_TASK, solution, state, random.Random(0)) == encode_call(
        "run_command", {"command": "python -m unittest"})
    # the edit-style expert of the same task reads first; so does the shell expert once a file changed
    plain = ExpertState(files={"m.py": "LIMIT = 61\n"})
    assert _kind(expert_next(SHELL_TASK, solution, plain, random.Random(0))) == "read_file"
    edited = ExpertState(files={"m.py": "LIMIT = 62\n"}, shell=True, changed=True)
    assert _kind(expert_next(SHELL_TASK, solution, edited, random.Random(0))) == "read_file"


def test_a_command_the_expert_cannot_replay_ends_its_labels() -> None:
    solution = solution_files(SHELL_TASK, {"m.py": "LIMIT = 61\n"})
    state = ExpertState(files={"m.py": "LIMIT = 61\n"})
    observe(state, SHELL_TASK, solution, _started("run_command", command="grep -rn LIMIT . | head -5"), {"ok": True})
    assert not state.unknown  # read-only: still labelled
    observe(state, SHELL_TASK, solution, _started("run_command", command="sed -i 's/LIMIT/LIM/' m.py"), {"ok": True})
    assert state.unknown and expert_next(SHELL_TASK, solution, state, random.Random(0)) is None
    # the one command, failed part way, is not replayed either
    failed = ExpertState(files={"m.py": "LIMIT = 61\n"})
    observe(failed, SHELL_TASK, solution, _started("run_command", command=SHELL_TASK.shell_edit or ""), {"ok": False})
    assert failed.unknown and failed.files == {"m.py": "LIMIT = 61\n"}


@pytest.mark.parametrize(("command", "read_only"), [
    ("grep -rn name .", True), ("grep -rl x . | sort | head -3", True), ("ls pkg && cat pkg/a.py", True),
    ("sed -i 's/a/b/' x.py", False), ("grep -rl x . | xargs sed -i 's/x/y/'", False), ("cat a > b", False),
    ("find . -name '*.py' -delete", False), ("echo $(rm -rf x)", False), ("python -c 'print(1)'", False), ("", False),
])
def test_read_only_command(command: str, read_only: bool) -> None:
    assert read_only_command(command) is read_only


@pytest.mark.sandbox
async def test_a_real_rename_rollout_is_relabelled_with_the_one_command(tmp_path: Path) -> None:
    task, demo, start = _task_and_demo("rename", 5, tmp_path)
    assert demo.shell_edit is not None and demo.shell_edit.startswith("sed -i ")
    old = task.metadata["old"]
    # a model that greps for the name, runs the one command with the name cut short, then answers
    outputs = [encode_call("grep", {"pattern": old}),
               encode_call("run_command", {"command": demo.shell_edit.replace(old, old[:-1], 1)}),
               encode_call("run_command", {"command": demo.test_command}), "Done."]
    rollout, tok, _ = await _scripted_rollout(task, outputs, tmp_path)

    stats = RelabelStats()
    examples = relabel(rollout, demo, start, tok, max_len=100_000, rng=random.Random(0), stats=stats, shell_share=1.0)
    labels = [tok.decode(ex[1].token_ids) for ex in examples]
    # both calls before the wrong command are labelled with the one command; after it the expert
    # cannot know the files, so the test run and the answer get no label
    assert labels == [outputs[1].replace(old[:-1], old, 1) + "\n<|end|>"] * 2
    assert labels[0] == encode_call("run_command", {"command": demo.shell_edit}) + "\n<|end|>"
    assert stats.unknown_state == 2 and stats.examples == 2
    # with no shell share the same states are labelled by reading the files
    plain = relabel(rollout, demo, start, tok, max_len=100_000, rng=random.Random(0), shell_share=0.0)
    assert _kind(tok.decode(plain[0][1].token_ids)) == "read_file"
