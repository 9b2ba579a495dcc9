"""Prompt rendering: the one function every policy uses, in serving and in RL.

``render_prompt(conversation, tools)`` returns both forms a policy may need:

* ``messages`` — chat messages for OpenAI-compatible servers (tool results are
  sent as ``user`` messages, since the XML format carries no tool-call ids);
* ``text`` — the same conversation flattened with :data:`CHAT_TEMPLATE`'s
  role markers, for local models that tokenise text themselves.

The tool descriptions come from the same :class:`tools.base.ToolSpec` objects
the validator uses. Rendering is deterministic: same conversation and tools,
same bytes.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Literal

from agent.calls import example_call
from tools.base import ToolSpec

Role = Literal["system", "user", "assistant", "tool"]

DEFAULT_SYSTEM_PROMPT = """\
You are Flywheel, a coding agent working inside the user's workspace. Inspect the \
code with tools before you change it, make the smallest correct change, and check \
your work (for example by running the tests). When you are done, answer without \
calling any tool."""

FORMAT_INSTRUCTIONS = """\
# Calling tools
Call a tool by writing XML anywhere in your answer:

<tool_call name="TOOL_NAME">
<param name="PARAM_NAME">value</param>
</tool_call>

Parameter values are raw text: write code exactly as it should appear, with no \
escaping of <, > or &. Only the literal text </param> ends a value; if a value must \
contain it, wrap the value in <![CDATA[ ... ]]>. Several calls in one answer run in \
parallel; their results come back in the same order, in <tool_result> elements. \
After the calls, stop and wait for the results."""


@dataclass(frozen=True, slots=True)
class PromptProfile:
    """How a model is prompted: its system prompt and how tools are described.

    A checkpoint stores its profile (``agent.model.checkpoint``); serving and
    RL both render with it, so a model sees the same prompt in training and in
    production. ``name`` is what is stored and logged; profiles are looked up
    by name in :data:`PROFILES`.
    """

    name: str = "default"
    system: str = DEFAULT_SYSTEM_PROMPT
    tool_detail: Literal["full", "compact"] = "full"


DEFAULT_PROFILE = PromptProfile()
PROFILES: dict[str, PromptProfile] = {DEFAULT_PROFILE.name: DEFAULT_PROFILE}


def profile_named(name: str) -> PromptProfile:
    """The registered profile called ``name``; raises ``KeyError`` naming the known ones."""
    try:
        return PROFILES[name]
    except KeyError:
        raise KeyError(f"unknown prompt profile {name!r}; known: {', '.join(sorted(PROFILES))}") from None


@dataclass(frozen=True, slots=True)
class Message:
    role: Role
    content: str


@dataclass(frozen=True, slots=True)
class ChatTemplate:
    """Role markers for the flattened text form (the local model's special tokens)."""

    system: str = "<|system|>\n"
    user: str = "<|user|>\n"
    assistant: str = "<|assistant|>\n"
    tool: str = "<|tool|>\n"
    end: str = "<|end|>\n"

    def marker(self, role: Role) -> str:
        return getattr(self, role)


CHAT_TEMPLATE = ChatTemplate()


@dataclass(frozen=True, slots=True)
class RenderedPrompt:
    messages: list[dict[str, str]] = field(default_factory=list)
    text: str = ""


def describe_tools(specs: Sequence[ToolSpec]) -> str:
    """Tool descriptions for the model, generated from the schemas."""
    parts = ["# Tools"]
    for spec in specs:
        lines = [f"## {spec.name}", spec.description.strip(), "Parameters:"]
        for p in spec.params:
            need = "required" if p.required else f"optional, default {p.default!r}"
            lines.append(f"- {p.name} ({p.type.value}, {need}): {p.description}")
        lines.append("Form:\n" + example_call(spec))
        parts.append("\n".join(lines))
    return "\n\n".join(parts)


def system_prompt(specs: Sequence[ToolSpec], base: str = DEFAULT_SYSTEM_PROMPT) -> str:
    return "\n\n".join([base.strip(), FORMAT_INSTRUCTIONS, describe_tools(specs)])


def render_prompt(
    conversation: Sequence[Message],
    specs: Sequence[ToolSpec],
    *,
    profile: PromptProfile = DEFAULT_PROFILE,
    base_system: str | None = None,
    template: ChatTemplate = CHAT_TEMPLATE,
) -> RenderedPrompt:
    """Render system prompt + conversation into chat messages and flat text.

    The text form ends with the assistant marker (generation prompt).
    ``base_system`` overrides the profile's system prompt (kept for callers
    that predate profiles).
    """
    system = system_prompt(specs, profile.system if base_system is None else base_system)
    messages = [{"role": "system", "content": system}]
    pieces = [template.system, system, "\n", template.end]
    for m in conversation:
        chat_role = "user" if m.role == "tool" else m.role
        if messages[-1]["role"] == chat_role and chat_role != "system":
            # Chat servers expect alternating roles: merge consecutive turns.
            messages[-1] = {"role": chat_role, "content": messages[-1]["content"] + "\n\n" + m.content}
        else:
            messages.append({"role": chat_role, "content": m.content})
        pieces += [template.marker(m.role), m.content, "\n", template.end]
    pieces.append(template.assistant)
    return RenderedPrompt(messages=messages, text="".join(pieces))
