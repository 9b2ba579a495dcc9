"""Every event is JSON-serialisable by construction (issue 10)."""

from __future__ import annotations

import json
import types
import typing
from pathlib import Path
from typing import Any, Literal, get_args, get_origin

import pytest

from agent.events import (
    AssistantDelta,
    Event,
    ListSink,
    ToolCallStarted,
    ToolResultEvent,
    event_from_json,
    event_to_json,
)

BAD = "\udcff.txt \ud800 end"  # a surrogateescape'd byte 0xff, then a lone high surrogate
NESTED = {"k\ud800": ["\udcff", {"deep": b"\xfe\x80ok"}, ("t", Path("p\udcff"))], 7: {1, 2}}


def _event_classes() -> list[type]:
    union, _discriminator = get_args(Event)  # Annotated[A | B | ..., Field(discriminator="type")]
    return list(get_args(union))


def _value(annotation: Any) -> Any:
    """A value of ``annotation`` that holds unserialisable text wherever it can."""
    origin = get_origin(annotation)
    if origin is Literal:
        return get_args(annotation)[0]
    if origin in (typing.Union, types.UnionType):
        return _value(next(a for a in get_args(annotation) if a is not type(None)))
    if annotation is str:
        return BAD
    if annotation is bool:
        return True
    if annotation is int:
        return 1
    if annotation is float:
        return 1.5
    if origin is dict:
        return NESTED
    if origin is list:
        return [_value(get_args(annotation)[0])]
    raise AssertionError(f"no test value for {annotation!r}")


@pytest.mark.parametrize("cls", _event_classes(), ids=lambda c: c.__name__)
def test_every_field_of_every_event_type_serialises(cls: type) -> None:
    # Generic over the union: a field added later is covered without editing this test.
    hints = typing.get_type_hints(cls)
    kwargs = {name: _value(hints[name]) for name in cls.model_fields if name != "ts"}
    event = cls(**kwargs)
    line = event_to_json(event)
    line.encode("utf-8")  # strict: would raise on a surrogate
    back = event_from_json(line)
    assert back == event
    for name in kwargs:
        if hints[name] is str or hints[name] == (str | None):
            assert getattr(back, name) == "\\xff.txt \ufffd end", name


def test_surrogateescaped_bytes_become_visible_escapes_other_surrogates_replacement() -> None:
    e = ToolResultEvent(step=1, index=0, call_id="c", name="list_dir", ok=True, output="a.txt\n\udcff.txt\n")
    assert e.output == "a.txt\n\\xff.txt\n"  # what `list_dir` printed, byte 0xff shown as \xff
    assert AssistantDelta(step=1, text="x\ud800y\udfffz").text == "x\ufffdy\ufffdz"
    assert AssistantDelta(step=1, text="\ud83d\ude00").text == "\U0001f600"  # a pair is the character it encodes
    plain = "unchanged ünïcode 日本 \\x41"
    assert AssistantDelta(step=1, text=plain).text is plain


def test_byte_escapes_are_the_spelling_the_file_tools_show_and_accept() -> None:
    from tools.paths import display_path, unescape_path

    name = b"caf\xe9 \x80\xff.txt".decode("utf-8", "surrogateescape")
    shown = AssistantDelta(step=1, text=name).text
    assert shown == display_path(name) == "caf\\xe9 \\x80\\xff.txt"
    assert unescape_path(shown) == name  # the path layer maps it back to the bytes


def test_args_and_data_are_cleaned_recursively_into_json_values() -> None:
    e = ToolCallStarted(step=1, index=0, call_id="c", name="read_file", args=NESTED)
    assert e.args == {"k\ufffd": ["\\xff", {"deep": "\\xfe\\x80ok"}, ["t", "p\\xff"]], "7": [1, 2]}
    assert json.loads(event_to_json(e))["args"] == e.args


def test_unserialisable_objects_and_cycles_become_bounded_strings() -> None:
    loop: list[Any] = []
    loop.append(loop)

    class Opaque:
        def __repr__(self) -> str:
            return "<opaque \udcff>"

    e = ToolResultEvent(step=1, index=0, call_id="c", name="t", ok=True, output="",
                        data={"obj": Opaque(), "cycle": loop})
    assert e.data["obj"] == "<opaque \\xff>"
    depth, node = 0, e.data["cycle"]
    while isinstance(node, list):
        depth, node = depth + 1, node[0]
    assert node == "<nested too deep>" and depth < 40
    event_to_json(e)


def test_model_copy_updates_are_cleaned_too() -> None:
    # Session.emit stamps events with model_copy(update=...), which pydantic does not validate.
    e = AssistantDelta(step=1, text="ok").model_copy(update={"session_id": "s\udcff", "text": "\ud800"})
    assert (e.session_id, e.text) == ("s\\xff", "\ufffd")
    event_to_json(e)


def test_json_form_escapes_terminal_controls_and_stays_exact() -> None:
    text = "esc \x1b[2J del \x7f csi \x9b2J bidi \u202eabc\u202c \u2066x\u2069 ls \u2028"
    line = event_to_json(AssistantDelta(step=1, text=text))
    assert not any(c in line for c in "\x1b\x7f\x9b\u202e\u202c\u2066\u2069\u2028")
    assert "\\u009b" in line and "\\u202e" in line
    assert event_from_json(line).text == text  # exact


async def test_sinks_accept_cleaned_events() -> None:
    sink = ListSink()
    await sink.emit(AssistantDelta(step=1, text="\ud800"))
    assert sink.events[0].text == "\ufffd"


def test_live_tool_state_events_round_trip_and_are_known() -> None:
    from agent.events import (
        KNOWN_TYPES,
        ApprovalRequested,
        ApprovalResolved,
        ToolCallQueued,
        ToolCallRunning,
        ToolOutputDelta,
        event_from_json_or_none,
    )

    events = [
        ToolCallQueued(seq=1, step=1, index=1, call_id="t1s1c1", waiting_for=["t1s1c0"]),
        ToolCallRunning(seq=2, step=1, index=1, call_id="t1s1c1"),
        ToolOutputDelta(seq=3, step=1, index=0, call_id="t1s1c0", text="ok\n", cut=True),
        ApprovalRequested(seq=4, step=1, index=2, call_id="t1s1c2", name="run_command", args={"command": "ls"}),
        ApprovalResolved(seq=5, step=1, index=2, call_id="t1s1c2", approved=False, reason="no", by="recording"),
    ]
    for e in events:
        assert e.type in KNOWN_TYPES
        assert event_from_json(event_to_json(e)) == e == event_from_json_or_none(event_to_json(e))
    assert event_from_json_or_none('{"type": "from_a_newer_server", "seq": 9}') is None


def test_a_recording_from_before_the_live_events_still_loads() -> None:
    from agent.history import history_from_events

    old = [  # as written before tool_output_delta, tool_call_queued and approvals existed
        '{"type":"user_message","seq":1,"session_id":"s","ts":1.0,"turn":1,"text":"go"}',
        '{"type":"turn_started","seq":2,"session_id":"s","ts":1.0,"turn":1}',
        '{"type":"tool_call_started","seq":3,"session_id":"s","ts":1.0,"turn":1,"step":1,"index":0,'
        '"call_id":"t1s1c0","name":"run_command","args":{"command":"ls"},"valid":true}',
        '{"type":"tool_result","seq":4,"session_id":"s","ts":1.0,"turn":1,"step":1,"index":0,"call_id":"t1s1c0",'
        '"name":"run_command","ok":true,"output":"exit code 0\\n","data":{},"duration_ms":3.0}',
        '{"type":"assistant_message","seq":5,"session_id":"s","ts":1.0,"turn":1,"step":1,"text":"x"}',
        '{"type":"turn_end","seq":6,"session_id":"s","ts":1.0,"turn":1,"reason":"completed","steps":1,'
        '"output_tokens":1}',
    ]
    h = history_from_events([event_from_json(line) for line in old])
    assert h.last_seq == 6 and [m.role for m in h.conversation] == ["user", "assistant", "tool"]
