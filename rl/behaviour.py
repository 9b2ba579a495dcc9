"""Per-rollout behaviour metrics, computed from the rollout's events.

What the trainer plots to see *how* the policy's behaviour changes (the
Composer report: more parallel tool calls, more reading and searching before
editing, fewer blind edits, fewer tokens):

* ``model_calls`` — ``assistant_message`` events (one per model call);
* ``tool_calls`` — ``tool_call_started`` events (valid or not);
  ``tool_calls_per_model_call``;
* ``parallel_by_step`` — per model call, whether it made two or more well-formed tool
  calls; ``parallel_share`` is their share of model calls;
* ``edits`` / ``blind_edits`` — successful ``edit_file``/``write_file`` calls
  on a file that existed, and those of them on a file the rollout had not
  *seen* before: read with ``read_file``, or named in a ``grep``, ``glob`` or
  ``semantic_search`` result that arrived earlier. Creating a new file is
  never blind;
* ``malformed_calls`` — calls the parser or the schema rejected (``valid=False``),
  and by kind (``malformed_<kind>``, from the rejection message's wording in
  ``agent.parser`` / ``agent.calls`` / ``agent.session``): ``unclosed`` (the
  response ended inside a call: out of tokens, or stopped), ``syntax`` (any
  other parse error), ``unknown_tool``, ``invalid_args`` (the schema: missing,
  unknown or repeated parameters), ``overflow`` (too many calls in one
  response), ``other``; ``malformed_truncated`` — those of them (any kind) whose model
  output the per-call token limit cut (the step's ``finish_reason`` is ``length``), so an
  ``unclosed`` call the limit truncated tells itself from one the model stopped inside;
* ``tokens`` — output tokens over all model calls;
* ``prose_chars`` — characters of model output outside tool-call blocks (narration before,
  between and after the calls, surrounding whitespace excluded), over all model calls; per
  model call it is how much a rollout talks (characters, not tokens: no tokenizer here);
* ``file_writes`` — successful ``edit_file``/``write_file`` calls, creations included. A
  rollout that changed the workspace with none did it through ``run_command`` (a ``sed -i``,
  a redirect): :func:`rl.train.metrics.rollout_metrics` reports the share of solved rollouts
  solved that way (``solved_by_command_share``), which tells which of the two forms RL
  reinforces.

Not guaranteed: paths are compared after ``./`` and ``..`` normalisation
only (a file reached through a symlink under another name counts as another
file); ``grep`` rows are recognised by the ``path:N:`` / ``path-N-`` shape the
tool prints, so a file name containing ``:N:`` may be mis-split; files
changed by ``run_command`` (``sed -i``) are not seen as edits.
"""

from __future__ import annotations

import posixpath
import re
from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from agent.events import AssistantMessage, Event, FileEditEvent, ToolCallStarted, ToolResultEvent
from agent.parser import StreamParser, TextDelta

__all__ = ["MALFORMED_KINDS", "Behaviour", "behaviour", "malformed_examples", "malformed_finishes", "malformed_kind",
           "malformed_reasons", "prose_chars"]

EDIT_TOOLS = frozenset({"edit_file", "write_file"})
_GREP_ROW = re.compile(r"^(.+?)[:-](\d+)[:-] ")
MALFORMED_KINDS = ("unclosed", "syntax", "unknown_tool", "invalid_args", "overflow", "other")
_QUOTED = re.compile(r"'[^']*'|\"[^\"]*\"|`[^`]*`")
_NUMBER = re.compile(r"\d+")


def _norm(path: object) -> str:
    p = posixpath.normpath(str(path or "").strip())
    return p.removeprefix("./")


@dataclass(slots=True)
class Behaviour:
    model_calls: int = 0
    tool_calls: int = 0
    parallel_by_step: list[bool] = field(default_factory=list)
    edits: int = 0
    blind_edits: int = 0
    malformed_calls: int = 0
    malformed_by_kind: dict[str, int] = field(default_factory=dict)
    malformed_truncated: int = 0  # rejected calls whose model output the per-call token limit cut
    tokens: int = 0
    file_writes: int = 0
    prose_chars: int = 0

    def metrics(self) -> dict[str, float]:
        """Flat numbers for ``Rollout.metrics`` (rates are 0.0 when their denominator is 0)."""
        mc = self.model_calls
        return {
            "model_calls": float(mc), "tool_calls": float(self.tool_calls),
            "tool_calls_per_model_call": self.tool_calls / mc if mc else 0.0,
            "parallel_steps": float(sum(self.parallel_by_step)),
            "parallel_share": sum(self.parallel_by_step) / mc if mc else 0.0,
            "edits": float(self.edits), "blind_edits": float(self.blind_edits),
            "blind_edit_rate": self.blind_edits / self.edits if self.edits else 0.0,
            "malformed_calls": float(self.malformed_calls), "tokens": float(self.tokens),
            "file_writes": float(self.file_writes), "prose_chars": float(self.prose_chars),
            **{f"malformed_{k}": float(self.malformed_by_kind.get(k, 0)) for k in MALFORMED_KINDS},
            "malformed_truncated": float(self.malformed_truncated),
        }


def _seen_paths(name: str | None, args: dict[str, Any], result: ToolResultEvent) -> set[str]:
    if name == "read_file":
        return {_norm(args.get("path"))}
    if name == "semantic_search":
        return {_norm(h.get("path")) for h in result.data.get("hits", []) if isinstance(h, dict)}
    lines = result.output.splitlines()[1:]  # the first line is the "N matches" / "N files match" header
    if name == "grep":
        return {_norm(m.group(1)) for ln in lines if (m := _GREP_ROW.match(ln))}
    if name == "glob":
        return {_norm(ln) for ln in lines if ln.strip()}
    return set()


def behaviour(events: Iterable[Event]) -> Behaviour:
    """The metrics of one rollout's events (in ``seq`` order)."""
    b = Behaviour()
    calls: dict[str, tuple[str | None, dict[str, Any]]] = {}
    per_step: dict[tuple[int, int], int] = {}
    steps: list[tuple[int, int]] = []
    created: set[str] = set()
    seen: set[str] = set()
    rejected: set[str] = set()
    evs = list(events)
    finishes = _finishes(evs)
    for e in evs:
        if isinstance(e, FileEditEvent) and e.created:
            created.add(e.call_id)
    for e in evs:
        if isinstance(e, AssistantMessage):
            b.model_calls += 1
            b.tokens += e.output_tokens or len(e.token_ids)
            b.prose_chars += prose_chars(e.text)
            steps.append((e.turn, e.step))
        elif isinstance(e, ToolCallStarted):
            b.tool_calls += 1
            b.malformed_calls += not e.valid
            if not e.valid:
                rejected.add(e.call_id)
                b.malformed_truncated += finishes.get((e.turn, e.step)) == "length"
            calls[e.call_id] = (e.name, dict(e.args))
            if e.valid:  # a malformed call is not a parallel one: broken calls must not buy the metric
                per_step[(e.turn, e.step)] = per_step.get((e.turn, e.step), 0) + 1
        elif isinstance(e, ToolResultEvent):
            name, args = calls.get(e.call_id, (e.name, {}))
            if e.call_id in rejected:
                kind = malformed_kind(e.output)
                b.malformed_by_kind[kind] = b.malformed_by_kind.get(kind, 0) + 1
            if not e.ok:
                continue
            if name in EDIT_TOOLS:
                b.file_writes += 1
                path = _norm(args.get("path"))
                if e.call_id not in created:
                    b.edits += 1
                    b.blind_edits += path not in seen
                seen.add(path)  # after writing it, the rollout knows the file
            else:
                seen |= _seen_paths(name, args, e)
    b.parallel_by_step = [per_step.get(s, 0) >= 2 for s in steps]
    return b


def prose_chars(text: str) -> int:
    """Characters of ``text`` that the runtime's own parser (:class:`agent.parser.StreamParser`)
    reads as text outside tool calls, each stretch between calls stripped of surrounding
    whitespace — so a ``</tool_call>`` inside a parameter, a self-closing call or a broken call
    count exactly as the session saw them (a malformed call's text is not prose)."""
    parser = StreamParser()
    stretches, current = [], []
    for ev in [*parser.feed(text), *parser.finish()]:
        if isinstance(ev, TextDelta):
            current.append(ev.text)
        elif current:
            stretches.append("".join(current))
            current = []
    stretches.append("".join(current))
    return sum(len(part.strip()) for part in stretches)


def malformed_kind(message: str) -> str:
    """Which of :data:`MALFORMED_KINDS` a rejected call's result message is (by its wording)."""
    if "unclosed <tool_call" in message:
        return "unclosed"
    if message.startswith("malformed tool call"):
        return "syntax"
    if message.startswith("unknown tool"):
        return "unknown_tool"
    if message.startswith("invalid call to"):
        return "invalid_args"
    if message.startswith("too many tool calls"):
        return "overflow"
    return "other"


def malformed_reasons(events: Iterable[Event], *, width: int = 80) -> Counter[str]:
    """What the rejected calls of one rollout were told, as a count per *kind* of message: the
    first line of each ``valid=False`` call's result with quoted text replaced by ``'…'`` and
    numbers by ``N``, cut at ``width`` characters (so "unknown tool 'reed_file'" and "unknown tool
    'raed'" are one kind). Not guaranteed: that two kinds never share a prefix of ``width``."""
    return Counter(_NUMBER.sub("N", _QUOTED.sub("'…'", _first_line(result.output)))[:width]
                   for _, result in _rejected(events))


def malformed_finishes(events: Iterable[Event]) -> Counter[str]:
    """The rejected calls of one rollout as ``"KIND:FINISH"`` counts: each call's
    :func:`malformed_kind` and how its model output ended (the step's ``finish_reason``:
    ``length`` when the per-call token limit cut it, ``stop`` when the model ended it itself,
    ``unknown`` when the policy did not say). ``unclosed:length`` is a call the limit truncated;
    ``unclosed:stop`` one the model stopped inside."""
    evs = list(events)
    finishes = _finishes(evs)
    return Counter(f"{malformed_kind(result.output)}:{finishes.get((call.turn, call.step)) or 'unknown'}"
                   for call, result in _rejected(evs))


def malformed_examples(events: Iterable[Event], n: int, *, task: str = "", chars: int = 1200) -> list[dict[str, Any]]:
    """Up to ``n`` rejected calls of one rollout, each with its message's first line, the model
    output of its step (the first ``chars`` characters: what the model actually wrote), that
    output's token count and how it ended (``finish``, as in :func:`malformed_finishes`)."""
    evs = list(events)
    steps = {(e.turn, e.step): e for e in evs if isinstance(e, AssistantMessage)}
    out: list[dict[str, Any]] = []
    for call, result in _rejected(evs)[:n]:
        step = steps.get((call.turn, call.step))
        out.append({"task": task, "kind": malformed_kind(result.output), "message": _first_line(result.output),
                    "output": step.text[:chars] if step else "", "output_tokens": step.output_tokens if step else 0,
                    "finish": (step.finish_reason if step else None) or "unknown"})
    return out


def _finishes(events: list[Event]) -> dict[tuple[int, int], str | None]:
    return {(e.turn, e.step): e.finish_reason for e in events if isinstance(e, AssistantMessage)}


def _rejected(events: Iterable[Event]) -> list[tuple[ToolCallStarted, ToolResultEvent]]:
    """Each rejected (``valid=False``) call with its result, in result order."""
    calls: dict[str, ToolCallStarted] = {}
    out = []
    for e in events:
        if isinstance(e, ToolCallStarted) and not e.valid:
            calls[e.call_id] = e
        elif isinstance(e, ToolResultEvent) and e.call_id in calls:
            out.append((calls[e.call_id], e))
    return out


def _first_line(text: str) -> str:
    return (text.strip().splitlines() or [""])[0]
