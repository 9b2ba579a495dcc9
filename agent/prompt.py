"""Prompt rendering: the one function every policy uses, in serving and in RL.

``render_prompt(conversation, tools)`` returns both forms a policy may need:

* ``messages`` — chat messages for OpenAI-compatible servers (tool results are
  sent as ``user`` messages, since the XML format carries no tool-call ids);
* ``text`` — the same conversation flattened with :data:`CHAT_TEMPLATE`'s
  role markers (:func:`flatten`, also what ``flywheel policy serve`` applies
  to chat messages), for local models that tokenise text themselves.

How much the system prompt says is a :class:`PromptProfile`: ``default``
(full tool descriptions, ~1,700 tokens with the tiny tokenizer and the
default tools) or ``compact`` (one line per tool, for models with a short
context; see :data:`COMPACT_PROFILE`). Both are generated from the same
:class:`tools.base.ToolSpec` objects the validator uses. Rendering is
deterministic: same conversation, tools and profile, same bytes.
"""

from __future__ import annotations

import functools
import hashlib
import json
import re
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

COMPACT_SYSTEM_PROMPT = """\
You are Flywheel, a coding agent. Use tools to inspect and change the workspace; \
answer without a tool call when done."""

COMPACT_FORMAT_INSTRUCTIONS = """\
Call tools with XML; values are raw text, results come back in <tool_result>:
<tool_call name="TOOL">
<param name="PARAM">value</param>
</tool_call>"""

ToolDetail = Literal["full", "compact"]


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
    tool_detail: ToolDetail = "full"

    @property
    def fingerprint(self) -> str:
        """A hash of everything the profile itself puts in the prompt: its system
        prompt, its tool detail and the calling instructions for that detail.

        A checkpoint stores it, so a profile edited after training is detected
        at load time. Not covered: the tools' own descriptions (``ToolSpec``),
        which change with the tool set, not with the profile.
        """
        content = json.dumps([self.name, self.system, self.tool_detail, format_instructions(self.tool_detail)])
        return hashlib.sha256(content.encode()).hexdigest()[:16]


DEFAULT_PROFILE = PromptProfile()
# For models whose context cannot hold the full tool descriptions (the tiny and
# small presets): ~250 tokens of system prompt with the default tools.
COMPACT_PROFILE = PromptProfile(name="compact", system=COMPACT_SYSTEM_PROMPT, tool_detail="compact")
PROFILES: dict[str, PromptProfile] = {p.name: p for p in (DEFAULT_PROFILE, COMPACT_PROFILE)}


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

    @property
    def special_tokens(self) -> tuple[str, ...]:
        """Each marker without its newline: the tokenizer's special tokens, in
        role order (system, user, assistant, tool) then the end marker."""
        return tuple(self.marker(r).rstrip("\n") for r in ("system", "user", "assistant", "tool", "end"))  # type: ignore[arg-type]

    @property
    def turn_stops(self) -> tuple[str, ...]:
        """Stop strings that end a generated turn. A message is rendered as
        marker + content + ``"\n"`` + end marker, so a model ends its turn with
        ``"\n<|end|>"``: cutting there returns exactly the content that
        re-renders to what it generated; the bare end marker is the fallback."""
        end = self.end.rstrip("\n")
        return ("\n" + end, end)


CHAT_TEMPLATE = ChatTemplate()


@dataclass(frozen=True, slots=True)
class RenderedPrompt:
    messages: list[dict[str, str]] = field(default_factory=list)
    text: str = ""


def describe_tools(specs: Sequence[ToolSpec], detail: ToolDetail = "full") -> str:
    """Tool descriptions for the model, generated from the schemas.

    ``full``: each tool's whole description, every parameter with its type,
    default and description, and an example call. ``compact``: one line per
    tool — ``name(param: type, optional?: type=default): first sentence`` —
    with ``string`` types left implicit; the model then relies on the
    validator's error messages (which show the full form) for the details.
    """
    if detail == "compact":
        return "\n".join(["# Tools", *(_compact_line(spec) for spec in specs)])
    if detail != "full":
        raise ValueError(f"unknown tool detail {detail!r}: choose full or compact")
    parts = ["# Tools"]
    for spec in specs:
        lines = [f"## {spec.name}", spec.description.strip(), "Parameters:"]
        for p in spec.params:
            need = "required" if p.required else f"optional, default {p.default!r}"
            lines.append(f"- {p.name} ({p.type.value}, {need}): {p.description}")
        lines.append("Form:\n" + example_call(spec))
        parts.append("\n".join(lines))
    return "\n\n".join(parts)


_SENTENCE_END = re.compile(r"(?<=[.!?])\s")
_PARENTHESIS = re.compile(r"\s*\([^()]*\)")


def _compact_line(spec: ToolSpec) -> str:
    params = []
    for p in spec.params:
        kind = "" if p.type.value == "string" else f": {p.type.value}"
        if p.required:
            params.append(f"{p.name}{kind}")
        else:
            default = "" if p.default is None else f"={p.default}"
            params.append(f"{p.name}?{kind}{default}")
    summary = _PARENTHESIS.sub("", _SENTENCE_END.split(spec.description.strip(), maxsplit=1)[0])
    return f"- {spec.name}({', '.join(params)}): {summary}"


def format_instructions(detail: ToolDetail = "full") -> str:
    """How to call tools, as the system prompt says it for ``detail``."""
    return COMPACT_FORMAT_INSTRUCTIONS if detail == "compact" else FORMAT_INSTRUCTIONS


def system_prompt(specs: Sequence[ToolSpec], base: str = DEFAULT_SYSTEM_PROMPT, detail: ToolDetail = "full") -> str:
    """The system prompt: ``base``, how to call tools, the tools. Memoised per (specs, base,
    detail) -- it is rendered for every model call -- unless a spec holds an unhashable
    default, which is then described afresh each time."""
    key = (tuple(specs), base, detail)
    try:
        hash(key)
    except TypeError:
        return _system_prompt(*key)
    return _cached_system_prompt(*key)


def _system_prompt(specs: tuple[ToolSpec, ...], base: str, detail: ToolDetail) -> str:
    return "\n\n".join([base.strip(), format_instructions(detail), describe_tools(specs, detail)])


_cached_system_prompt = functools.lru_cache(maxsize=64)(_system_prompt)


def flatten(messages: Sequence[Message], template: ChatTemplate = CHAT_TEMPLATE) -> str:
    """Messages → the flat text a local model reads: per message its role
    marker, the content, a newline and the end marker; then the assistant
    marker (the generation prompt). The one implementation of the template,
    used by :func:`render_prompt` and by ``flywheel policy serve``."""
    pieces: list[str] = []
    for m in messages:
        pieces += [template.marker(m.role), m.content, "\n", template.end]
    pieces.append(template.assistant)
    return "".join(pieces)


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
    that predate profiles); the profile's tool detail still applies.
    """
    system = system_prompt(specs, profile.system if base_system is None else base_system, profile.tool_detail)
    messages = [{"role": "system", "content": system}]
    for m in conversation:
        chat_role = "user" if m.role == "tool" else m.role
        if messages[-1]["role"] == chat_role and chat_role != "system":
            # Chat servers expect alternating roles: merge consecutive turns.
            messages[-1] = {"role": chat_role, "content": messages[-1]["content"] + "\n\n" + m.content}
        else:
            messages.append({"role": chat_role, "content": m.content})
    text = flatten([Message("system", system), *conversation], template)
    return RenderedPrompt(messages=messages, text=text)
