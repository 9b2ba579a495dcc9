"""External tools in a replay: answered from the recording, never called again.

A session may have tools from outside (an MCP server's, ``SessionParts.extra_tools``).
Re-executing such a session must not depend on that server being up, and must
not repeat what its tools did (post a message, open a ticket): the driver that
records a session keeps the external tools' specs (:func:`spec_record`, in the
session's ``source``), and a replay rebuilds them as :class:`RecordedTool` —
same name, same spec, so the same prompt — whose calls return the result the
recording holds for the same call (same tool, same arguments, in order),
marked ``data["from_recording"] = true`` so a re-execution report says so.

A call the recording has no result for (a branch that goes on past the
recording) is passed to ``live`` when one is given (the tool as connected
now), else it fails with a message that says the tool is not re-run.

Not guaranteed: two calls with the same arguments get the recorded results in
their recorded order, which is their call order unless the calls ran at once.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from agent.events import AssistantMessage, Event, ToolCallStarted, ToolResultEvent
from tools.base import ParamSpec, ParamType, Resources, Tool, ToolContext, ToolError, ToolResult, ToolSpec

__all__ = ["RecordedTool", "recorded_tools", "spec_from_record", "spec_record"]


def spec_record(spec: ToolSpec) -> dict[str, Any]:
    """``spec`` as JSON, for a session's record."""
    return {"name": spec.name, "description": spec.description, "params": [
        {"name": p.name, "type": p.type.value, "description": p.description, "required": p.required,
         "default": p.default, "schema": p.schema} for p in spec.params]}


def spec_from_record(obj: Mapping[str, Any]) -> ToolSpec:
    """The spec :func:`spec_record` wrote; ``ValueError`` for anything else."""
    try:
        params = tuple(ParamSpec(p["name"], ParamType(p["type"]), p["description"], bool(p["required"]),
                                 p.get("default"), p.get("schema")) for p in obj["params"])
        return ToolSpec(str(obj["name"]), str(obj["description"]), params)
    except (KeyError, TypeError, ValueError) as exc:
        raise ValueError(f"not a recorded tool spec: {exc}") from None


def _key(args: Mapping[str, Any]) -> str:
    return json.dumps(args, sort_keys=True, ensure_ascii=False, default=str)


class RecordedTool:
    """A recorded external tool: its calls are answered from ``results`` ((args, result) in call order)."""

    def __init__(self, spec: ToolSpec, results: Iterable[tuple[Mapping[str, Any], ToolResultEvent]],
                 live: Tool | None = None) -> None:
        self.spec = spec
        self.live = live
        self._results: dict[str, list[ToolResultEvent]] = {}
        for args, result in results:
            self._results.setdefault(_key(args), []).append(result)

    def resources(self, args: Mapping[str, Any]) -> Resources:
        if self.live is not None:
            return self.live.resources(args)
        return Resources(process_writes=frozenset({f"recorded://{self.spec.name}"}))

    async def run(self, args: Mapping[str, Any], ctx: ToolContext) -> ToolResult:
        queue = self._results.get(_key(args))
        if queue:
            recorded = queue.pop(0)
            return ToolResult(recorded.ok, recorded.output, {**recorded.data, "from_recording": True})
        if self.live is not None:
            return await self.live.run(args, ctx)
        raise ToolError(f"{self.spec.name} is an external tool: a replay does not call it again, and the "
                        "recording has no result for this call")


def recorded_tools(records: Sequence[Mapping[str, Any]], events: Sequence[Event],
                   live: Mapping[str, Tool] | None = None, *, model_calls: int | None = None) -> list[Tool]:
    """The recorded external tools of a session (``records`` from :func:`spec_record`), each
    answering from ``events``; ``live`` tools by name take the calls the recording lacks.
    ``model_calls``: answer only from the calls of the first that many model calls (a
    branch's ``from_step``: what it goes on to call is called live). A record that cannot
    be read is skipped (its calls then fail as unknown tools)."""
    steps = [(e.turn, e.step) for e in events if isinstance(e, AssistantMessage)]
    kept = set(steps[:max(0, model_calls)]) if model_calls is not None else None
    started = {e.call_id: e for e in events if isinstance(e, ToolCallStarted) and e.valid
               and (kept is None or (e.turn, e.step) in kept)}
    by_name: dict[str, list[tuple[Mapping[str, Any], ToolResultEvent]]] = {}
    for e in events:
        call = started.get(e.call_id) if isinstance(e, ToolResultEvent) else None
        if call is not None and call.name is not None:
            by_name.setdefault(call.name, []).append((call.args, e))  # type: ignore[arg-type]
    tools: list[Tool] = []
    for record in records:
        try:
            spec = spec_from_record(record)
        except ValueError:
            continue
        tools.append(RecordedTool(spec, by_name.get(spec.name, []), (live or {}).get(spec.name)))
    return tools
