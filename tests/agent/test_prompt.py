"""Prompt rendering: schemas drive the descriptions; one deterministic function."""

from __future__ import annotations

from pathlib import Path

from agent.model.tokenizer import Tokenizer, train_tokenizer
from agent.prompt import (
    CHAT_TEMPLATE,
    COMPACT_PROFILE,
    DEFAULT_PROFILE,
    Message,
    describe_tools,
    flatten,
    profile_named,
    render_prompt,
)
from tools.base import ParamSpec, ParamType, ToolSpec
from tools.registry import default_tools

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


def test_compact_tool_detail_is_one_line_per_tool_from_the_schema() -> None:
    specs = [t.spec for t in default_tools(semantic_search=True)]
    text = describe_tools(specs, "compact")
    lines = text.splitlines()
    assert lines[0] == "# Tools" and len(lines) == 1 + len(specs)
    assert "- grep(pattern, path?=., glob?, case_insensitive?: boolean=False, context?: integer=0): " \
        "Search file contents with a regular expression." in lines
    assert all(line.startswith(f"- {s.name}(") for line, s in zip(lines[1:], specs, strict=True))
    spec = ToolSpec("t", "Do it (carefully). More.", (ParamSpec("body", ParamType.TEXT, "x"),))
    assert describe_tools([spec], "compact") == "# Tools\n- t(body: text): Do it."


def test_compact_profile_fits_the_tiny_context_with_room_to_generate() -> None:
    """The tiny preset (1,024 tokens) must hold the compact prompt and a reply; the
    full prompt does not fit. Measured with a tokenizer trained like the tiny one."""
    from agent.model.config import ModelConfig

    texts = [p.read_text() for p in sorted((Path(__file__).parents[2] / "agent").rglob("*.py"))]
    tok: Tokenizer = train_tokenizer(texts, 4096)
    specs = [t.spec for t in default_tools()]
    conv = [Message("user", "fix the failing test in tests/test_app.py")]
    compact = len(tok.encode(render_prompt(conv, specs, profile=profile_named("compact")).text))
    full = len(tok.encode(render_prompt(conv, specs).text))
    context = ModelConfig.preset("tiny").max_seq_len
    assert compact <= 450 and context - compact >= 512, (compact, context)
    assert full > context  # why the compact profile exists


def test_the_text_form_is_flatten_of_the_messages() -> None:
    conv = [Message("user", "hi"), Message("tool", "<tool_result/>")]
    rendered = render_prompt(conv, [SPEC], profile=COMPACT_PROFILE)
    system = rendered.messages[0]["content"]
    assert rendered.text == flatten([Message("system", system), *conv])
    assert system.startswith(COMPACT_PROFILE.system) and "## grep" not in system
    assert COMPACT_PROFILE.fingerprint != DEFAULT_PROFILE.fingerprint


def test_turn_stops_and_special_tokens_come_from_the_template() -> None:
    assert CHAT_TEMPLATE.turn_stops == ("\n<|end|>", "<|end|>")
    assert CHAT_TEMPLATE.special_tokens == ("<|system|>", "<|user|>", "<|assistant|>", "<|tool|>", "<|end|>")
