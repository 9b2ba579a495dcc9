"""rl.behaviour on hand-built event lists."""

from __future__ import annotations

from pathlib import Path

import pytest

from agent.events import AssistantMessage, Event, FileEditEvent, ListSink, ToolCallStarted, ToolResultEvent
from agent.parser import encode_call as call
from agent.policies.scripted import ScriptedPolicy
from agent.session import Limits, Session
from rl.behaviour import MALFORMED_KINDS, behaviour, malformed_examples, malformed_finishes, malformed_reasons
from tools.registry import default_tools
from tools.workspace import WorkspaceStore


def _call(step: int, i: int, name: str | None, args: dict, output: str = "", ok: bool = True,
          valid: bool = True, data: dict | None = None) -> list[Event]:
    cid = f"s{step}c{i}"
    return [ToolCallStarted(step=step, index=i, call_id=cid, name=name, args=args, valid=valid),
            ToolResultEvent(step=step, index=i, call_id=cid, name=name, ok=ok, output=output, data=data or {})]


def test_metrics_of_a_mixed_rollout() -> None:
    events: list[Event] = [
        AssistantMessage(step=1, text="", output_tokens=10),
        *_call(1, 0, "grep", {"pattern": "x"}, "2 matches in 2 files\npkg/a.py:3: x = 1\npkg/b.py-4- y\n"),
        *_call(1, 1, "glob", {"pattern": "*.py"}, "1 files match '*.py'\nsrc/c.py\n"),
        AssistantMessage(step=2, text="", output_tokens=7),
        *_call(2, 0, "edit_file", {"path": "./pkg/a.py"}),  # seen in grep: not blind
        AssistantMessage(step=3, text="", output_tokens=5),
        *_call(3, 0, "edit_file", {"path": "pkg/d.py"}),  # never seen: blind
        *_call(3, 1, None, {}, ok=False, valid=False),  # malformed
        *_call(3, 2, "write_file", {"path": "new.py"}),  # creates a file: never blind
        FileEditEvent(call_id="s3c2", path="new.py", diff="", created=True),
        AssistantMessage(step=4, text="", output_tokens=3),
        *_call(4, 0, "semantic_search", {"query": "q"}, "...", data={"hits": [{"path": "e.py"}]}),
        *_call(4, 1, "read_file", {"path": "f.py"}),
        AssistantMessage(step=5, text="", output_tokens=2),
        *_call(5, 0, "edit_file", {"path": "e.py"}),
        *_call(5, 1, "edit_file", {"path": "f.py"}),
        *_call(5, 2, "edit_file", {"path": "src/c.py"}, ok=False),  # failed edits are not edits
    ]
    b = behaviour(events)
    assert (b.model_calls, b.tool_calls, b.malformed_calls, b.tokens) == (5, 11, 1, 27)
    assert b.parallel_by_step == [True, False, True, True, True]
    assert (b.edits, b.blind_edits) == (4, 1)
    assert b.file_writes == 5  # the four edits and the creation; the failed edit is not one
    m = b.metrics()
    assert m["tool_calls_per_model_call"] == 11 / 5 and m["parallel_share"] == 4 / 5
    assert m["blind_edit_rate"] == 0.25


def test_read_after_edit_does_not_unblind_it_and_empty_is_zero() -> None:
    events: list[Event] = [
        AssistantMessage(step=1, text=""),
        *_call(1, 0, "edit_file", {"path": "a.py"}),
        *_call(1, 1, "read_file", {"path": "a.py"}),
        AssistantMessage(step=2, text=""),
        *_call(2, 0, "edit_file", {"path": "a.py"}),
    ]
    b = behaviour(events)
    assert (b.edits, b.blind_edits) == (2, 1)
    assert behaviour([]).metrics()["blind_edit_rate"] == 0.0


def test_a_malformed_call_does_not_make_a_model_call_parallel() -> None:
    events: list[Event] = [
        AssistantMessage(step=1, text=""),
        *_call(1, 0, "read_file", {"path": "a.py"}),
        *_call(1, 1, None, {}, ok=False, valid=False),
        AssistantMessage(step=2, text=""),
        *_call(2, 0, "read_file", {"path": "a.py"}),
        *_call(2, 1, "read_file", {"path": "b.py"}),
    ]
    assert behaviour(events).parallel_by_step == [False, True]


def test_malformed_reasons_are_counted_by_kind() -> None:
    events: list[Event] = [
        AssistantMessage(step=1, text=""),
        *_call(1, 0, "reed_file", {}, "unknown tool 'reed_file'; available tools: read_file, grep",
               ok=False, valid=False),
        *_call(1, 1, "raed", {}, "unknown tool 'raed'; available tools: read_file, grep", ok=False, valid=False),
        *_call(1, 2, "read_file", {"path": "a.py"}, "1 | x = 1"),  # a valid call: not counted
        AssistantMessage(step=2, text=""),
        *_call(2, 0, None, {}, "malformed tool call: unclosed <path> at line 3\nexpected form: ...",
               ok=False, valid=False),
    ]
    assert malformed_reasons(events) == {"unknown tool '…'; available tools: read_file, grep": 2,
                                         "malformed tool call: unclosed <path> at line N": 1}
    assert malformed_reasons([]) == {}


async def test_rejected_calls_of_a_real_session_are_sorted_into_kinds(tmp_path: Path) -> None:
    """The kinds rely on the runtime's wording: this runs the real parser, validator and session."""
    src = tmp_path / "src"
    src.mkdir()
    (src / "app.py").write_text("x = 1\n")
    ws = WorkspaceStore(tmp_path / "store").from_dir(src)
    sink = ListSink()
    outputs = [
        call("reed_file", {"path": "app.py"}) + call("read_file", {"paht": "app.py"}),  # unknown tool, schema
        "<tool_call name=\"read_file\"><path>app.py</oops></tool_call>",  # a syntax error
        call("read_file", {"path": "app.py"}) + "<tool_call name=\"grep\"><pattern>x",  # ends inside a call
        "Done.",
    ]
    try:
        session = Session(workspace=ws, policy=ScriptedPolicy(outputs), tools=default_tools(), sink=sink,
                          limits=Limits())
        await session.run_turn("look")
    finally:
        ws.delete()
    m = behaviour(sink.events).metrics()
    assert m["malformed_calls"] == 4
    assert {k: m[f"malformed_{k}"] for k in MALFORMED_KINDS} == {
        "unclosed": 1, "syntax": 1, "unknown_tool": 1, "invalid_args": 1, "overflow": 0, "other": 0}
    assert sum(malformed_reasons(sink.events).values()) == 4
    first, second = malformed_examples(sink.events, 2, task="t")
    assert (first["kind"], second["kind"]) == ("unknown_tool", "invalid_args")
    assert "reed_file" in first["output"] and first["output"] == second["output"]  # the model output of step 1
    assert first["message"].startswith("unknown tool 'reed_file'") and first["task"] == "t"
    assert len(malformed_examples(sink.events, 10)) == 4 and malformed_examples(sink.events, 0) == []
    assert first["output_tokens"] > 0 and first["finish"] == "unknown"  # a scripted policy does not say
    assert malformed_finishes(sink.events) == {"unknown_tool:unknown": 1, "invalid_args:unknown": 1,
                                               "syntax:unknown": 1, "unclosed:unknown": 1}


def test_malformed_finishes_tell_a_truncated_call_from_one_the_model_stopped() -> None:
    unclosed = "malformed tool call: unclosed <tool_call name='grep'>: the response ended before </tool_call>"
    events: list[Event] = [
        AssistantMessage(step=1, text="<tool_call name=\"grep\"><pattern>x", output_tokens=192, finish_reason="length"),
        *_call(1, 0, None, {}, unclosed, ok=False, valid=False),
        AssistantMessage(step=2, text="<tool_call name=\"grep\">", output_tokens=9, finish_reason="stop"),
        *_call(2, 0, None, {}, unclosed, ok=False, valid=False),
        *_call(2, 1, "grep", {}, "invalid call to grep: missing pattern", ok=False, valid=False),
    ]
    assert malformed_finishes(events) == {"unclosed:length": 1, "unclosed:stop": 1, "invalid_args:stop": 1}
    first, second, _ = malformed_examples(events, 3)
    assert (first["finish"], first["output_tokens"], second["finish"]) == ("length", 192, "stop")
    assert malformed_finishes([]) == {}
    m = behaviour(events).metrics()
    assert (m["malformed_unclosed"], m["malformed_truncated"], m["malformed_calls"]) == (2.0, 1.0, 3.0)


@pytest.mark.sandbox
@pytest.mark.parametrize(("how", "writes"), [("command", 0), ("edit_file", 1)])
async def test_a_change_made_by_a_command_is_not_a_file_write(how: str, writes: int, tmp_path: Path) -> None:
    """A real session changes ``app.py`` either with one ``sed -i`` through ``run_command`` (in the
    bubblewrap sandbox) or with ``edit_file``: both change the file; only the second is a file write."""
    from agent.runtime import SessionParts, build_session
    from tools.sandbox import make_sandbox, probe_bwrap

    if (reason := probe_bwrap()) is not None:
        pytest.skip(f"bubblewrap is not usable here: {reason}")
    src = tmp_path / "src"
    src.mkdir()
    (src / "app.py").write_text("x = 1\n")
    ws = WorkspaceStore(tmp_path / "store").from_dir(src)
    change = (call("run_command", {"command": "sed -i 's/x = 1/x = 2/' app.py"}) if how == "command"
              else call("edit_file", {"path": "app.py", "search": "x = 1", "replace": "x = 2"}))
    sink = ListSink()
    try:
        session = build_session(SessionParts(ws, make_sandbox()), policy=ScriptedPolicy([change, "Done."]),
                                sink=sink, limits=Limits())
        await session.run_turn("set x to 2")
        assert ws.read_bytes("app.py") == b"x = 2\n"
    finally:
        ws.delete()
    b = behaviour(sink.events)
    assert b.file_writes == writes and b.metrics()["file_writes"] == writes


def test_prose_is_the_text_outside_tool_calls() -> None:
    from rl.behaviour import prose_chars

    read = call("read_file", {"path": "a.py"})
    assert prose_chars(read) == 0 and prose_chars("") == 0
    assert prose_chars("  I'll read it.\n" + read + "\n") == len("I'll read it.")
    assert prose_chars("Two files.\n" + read + "\nand\n" + read + "\nDone.") == len("Two files.") + 3 + 5
    assert prose_chars('Ok.\n<tool_call name="read_file">\n<param name="path">a.py') == 3  # unclosed: not prose
    # as the runtime's parser reads it: a closing tag inside a parameter body does not end the call,
    # a self-closing call and a call broken by garbage are calls, not prose
    assert prose_chars('x <tool_call name="edit_file"><param name="replace">a </tool_call> b</param></tool_call> z') == 2
    assert prose_chars('ab <tool_call name="read_file"/> cd') == 4
    assert prose_chars('ab <tool_call name="read_file"><junk>zz</junk></tool_call> cd') == 4
    b = behaviour([AssistantMessage(step=1, text="Reading.\n" + read), AssistantMessage(step=2, text="All done.")])
    assert b.prose_chars == len("Reading.") + len("All done.") and b.metrics()["prose_chars"] == 17.0
