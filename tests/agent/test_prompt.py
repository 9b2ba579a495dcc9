"""Prompt rendering: schemas drive the descriptions; one deterministic function."""

from __future__ import annotations

from agent.prompt import CHAT_TEMPLATE, Message, describe_tools, render_prompt
from tools.base import ParamSpec, ParamType, ToolSpec

SPEC = ToolSpec("grep", "Search file contents.", (ParamSpec("pattern", ParamType.STRING, "a regex"),))


def test_descriptions_come_from_the_schema() -> None:
    text = describe_tools([SPEC])
    assert "## grep" in text and "- pattern (string, required): a regex" in text
    assert '<tool_call name="grep">' in text


def test_render_is_deterministic_and_merges_tool_results_as_user() -> None:
    conv = [Message("user", "hi"), Message("assistant", "calling"), Message("tool", "<tool_result/>"),
            Message("user", "more")]
    a = render_prompt(conv, [SPEC])
    assert a == render_prompt(conv, [SPEC])
    roles = [m["role"] for m in a.messages]
    assert roles == ["system", "user", "assistant", "user"]
    assert a.messages[-1]["content"] == "<tool_result/>\n\nmore"
    assert a.text.startswith(CHAT_TEMPLATE.system) and a.text.endswith(CHAT_TEMPLATE.assistant)
    assert CHAT_TEMPLATE.tool + "<tool_result/>" in a.text
