"""The terminal transcript shows untrusted text inert (issue 10)."""

from __future__ import annotations

import io
import re

import pytest

from agent.events import (
    ApprovalRequested,
    ApprovalResolved,
    AssistantDelta,
    ErrorEvent,
    Event,
    FileEditEvent,
    ToolCallQueued,
    ToolCallRunning,
    ToolCallStarted,
    ToolOutputDelta,
    ToolResultEvent,
    TurnEnd,
    UserMessage,
)
from backend.transcript import Transcript

# Seen in the wild: window title, screen clear, OSC 52 clipboard write, a faked prompt.
ATTACKS = {
    "title": "\x1b]0;pwned title\x07",
    "clear": "\x1b[2J\x1b[H",
    "clipboard": "\x1b]52;c;ZWNobyBwd25lZA==\x07",
    "prompt": "\r$ sudo rm -rf / # fake prompt",
    "c1": "\x9b31m",
    "bidi": "\u202eevil\u202c",
}
OUR_COLOURS = re.compile("\x1b\\[[0-9;]*m")  # the only escapes the transcript itself writes
ACTIVE = re.compile("[\x00-\x08\x0b-\x1f\x7f-\x9f\u202a-\u202e\u2066-\u2069]")


def events_carrying(text: str) -> list[Event]:
    return [
        UserMessage(text=f"user {text}"),
        AssistantDelta(step=1, text=f"model {text} says\n"),
        ToolCallStarted(step=1, index=0, call_id="c", name=f"tool{text}", args={"path": f"a{text}.py", "n": 1}),
        ToolCallStarted(step=1, index=1, call_id="d", name=f"bad{text}", args={}, valid=False),
        ToolResultEvent(step=1, index=0, call_id="c", name="run_command", ok=False, output=f"out {text}\nline 2"),
        ToolCallStarted(step=1, index=2, call_id=f"e{text}", name="run_command", args={"command": f"echo {text}"}),
        ToolCallQueued(step=1, index=2, call_id=f"e{text}", waiting_for=[f"c{text}"]),
        ApprovalRequested(step=1, index=2, call_id=f"e{text}", name=f"run{text}", args={}),
        ApprovalResolved(step=1, index=2, call_id=f"e{text}", approved=False, reason=f"no {text}"),
        ToolCallRunning(step=1, index=2, call_id=f"e{text}"),
        ToolOutputDelta(step=1, index=2, call_id=f"e{text}", text=f"live {text}\nhalf {text}"),
        ToolResultEvent(step=1, index=2, call_id=f"e{text}", name="run_command", ok=True, output=f"exit {text}\n"),
        FileEditEvent(call_id="c", path=f"f{text}.py", diff=f"--- a/f\n+++ b/f\n-old {text}\n+new {text}\n"),
        ErrorEvent(message=f"boom {text}"),
        TurnEnd(reason="error", steps=1, output_tokens=1, detail=f"detail {text}"),
    ]


def render(events: list[Event], color: bool) -> str:
    out = io.StringIO()
    t = Transcript(out, color=color)
    for e in events:
        t(e)
    return out.getvalue()


@pytest.mark.parametrize("color", [False, True], ids=["plain", "colour"])
@pytest.mark.parametrize("name", list(ATTACKS))
def test_no_escape_from_the_input_reaches_the_terminal(name: str, color: bool) -> None:
    text = render(events_carrying(ATTACKS[name]), color)
    ours_removed = OUR_COLOURS.sub("", text)
    assert "\x1b" not in ours_removed and "\r" not in ours_removed
    assert ACTIVE.search(ours_removed) is None
    if color:
        assert OUR_COLOURS.search(text)  # our colour is still there, added after sanitising


def test_the_text_stays_readable() -> None:
    text = render(events_carrying(ATTACKS["title"]) + events_carrying(ATTACKS["prompt"]), color=False)
    assert "model ^[]0;pwned title^G says" in text
    assert "  │ out ^M$ sudo rm -rf / # fake prompt" in text  # on the output's own line, not over another
    assert "✎ f^[]0;pwned title^G.py" in text
    assert "error (session): boom ^M$ sudo" in text


def test_crlf_output_is_not_shown_as_controls() -> None:
    text = render([ToolResultEvent(step=1, index=0, call_id="c", name="run_command", ok=True,
                                   output="one\r\ntwo\r\n")], color=False)
    assert "  │ one\n  │ two\n" in text and "^M" not in text


def lines_of(events: list[Event], **kw: object) -> list[str]:
    out = io.StringIO()
    t = Transcript(out, color=False, **kw)  # type: ignore[arg-type]
    for e in events:
        t(e)
    return out.getvalue().splitlines()


def started(call_id: str, command: str, index: int = 0) -> ToolCallStarted:
    return ToolCallStarted(step=1, index=index, call_id=call_id, name="run_command", args={"command": command})


def test_output_is_shown_as_it_streams_and_not_again_with_the_result() -> None:
    text = lines_of([
        started("t1s1c0", "pytest -q"),
        ToolOutputDelta(step=1, index=0, call_id="t1s1c0", text="collected 3 ite"),
        ToolOutputDelta(step=1, index=0, call_id="t1s1c0", text="ms\n..."),
        ToolOutputDelta(step=1, index=0, call_id="t1s1c0", text=".\n3 passed\n"),
        ToolResultEvent(step=1, index=0, call_id="t1s1c0", name="run_command", ok=True, duration_ms=1234.5,
                        output="exit code 0\ncollected 3 items\n....\n3 passed\n"),
    ])
    assert text == [
        "▶ run_command · t1s1c0",
        "  $ pytest -q",
        "  │ collected 3 items",
        "  │ ....",
        "  │ 3 passed",
        "✓ run_command t1s1c0 · 1234.5 ms",
        "  │ exit code 0",
    ]


def test_a_long_command_is_shown_in_full_not_summarised() -> None:
    command = "python3 -m pytest tests/" + " --deselect tests/test_x.py::test_case" * 6
    script = "cat > f.py <<'EOF'\n" + "".join(f"line{i}\n" for i in range(50)) + "EOF"
    text = lines_of([started("t1s1c0", command), started("t1s1c1", script, 1),
                     ToolCallStarted(step=1, index=2, call_id="t1s1c2", name="grep", args={"pattern": "p" * 150})])
    assert f"  $ {command}" in text and not any("chars)" in line for line in text[:2])
    assert text[3] == "  $ cat > f.py <<'EOF'" and text[4] == "  > line0"
    assert "  … 12 more lines of this command (--json shows all of it)" in text
    assert f"▶ grep pattern='{'p' * 150}' · t1s1c2" in text


def test_queued_approval_and_running_states_are_shown() -> None:
    text = lines_of([
        started("t1s1c0", "make"),
        started("t1s1c1", "make test", 1),
        ToolCallQueued(step=1, index=1, call_id="t1s1c1", waiting_for=["t1s1c0"]),
        ApprovalRequested(step=1, index=0, call_id="t1s1c0", name="run_command", args={"command": "make"}),
        ApprovalResolved(step=1, index=0, call_id="t1s1c0", approved=False, reason="not now"),
        ToolResultEvent(step=1, index=0, call_id="t1s1c0", name="run_command", ok=False,
                        output="the user declined this command; it did not run."),
        ToolCallRunning(step=1, index=1, call_id="t1s1c1"),
    ])
    assert "⏸ run_command t1s1c1 queued: waiting for t1s1c0" in text
    assert "? run_command t1s1c0 needs your approval to run this command" in text
    assert "  declined: not now" in text and "▷ run_command t1s1c1 running" in text
    assert "✗ run_command t1s1c0 · 0.0 ms" in text


def test_a_cancelled_call_shows_how_long_it_ran() -> None:
    text = lines_of([
        started("t1s1c0", "sleep 100"),
        ToolOutputDelta(step=1, index=0, call_id="t1s1c0", text="waiting"),
        ToolResultEvent(step=1, index=0, call_id="t1s1c0", name="run_command", ok=False, duration_ms=12_345.0,
                        output="cancelled: the user interrupted the turn (after running 12.3 s). "
                               "Its output so far:\nwaiting"),
    ])
    assert text[-3:] == [
        "  │ waiting",  # the unfinished last line is shown when the call ends
        "✗ run_command t1s1c0 · 12.3 s",
        "  │ cancelled: the user interrupted the turn (after running 12.3 s). Its output so far:",
    ]


def test_interleaved_output_names_its_call_and_live_lines_are_capped() -> None:
    text = lines_of([
        started("t1s1c0", "a"), started("t1s1c1", "b", 1),
        ToolOutputDelta(step=1, index=0, call_id="t1s1c0", text="a1\n"),
        ToolOutputDelta(step=1, index=1, call_id="t1s1c1", text="b1\nb2\nb3\nb4\n"),
        ToolOutputDelta(step=1, index=0, call_id="t1s1c0", text="a2\n"),
        ToolResultEvent(step=1, index=1, call_id="t1s1c1", name="run_command", ok=True,
                        output="exit code 0\nb1\nb2\nb3\nb4\n"),
    ], max_live_lines=2)
    assert text[4:] == [
        "  │ a1",
        "  ┄ run_command t1s1c1",
        "  │ b1",
        "  │ b2",
        "  │ … more output (shown: the first 2 lines; the result shows the end)",
        "  ┄ run_command t1s1c0",
        "  │ a2",
        "✓ run_command t1s1c1 · 0.0 ms",
        "  │ exit code 0",
        "  │ … its last 4 lines:",
        "  │ b1",
        "  │ b2",
        "  │ b3",
        "  │ b4",
    ]
