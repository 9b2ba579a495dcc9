"""The terminal transcript shows untrusted text inert (issue 10)."""

from __future__ import annotations

import io
import re

import pytest

from agent.events import (
    AssistantDelta,
    ErrorEvent,
    Event,
    FileEditEvent,
    ToolCallStarted,
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
