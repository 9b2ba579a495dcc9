"""Replay for support staff (and owners): timeline, call timings, the conversation, re-execute, branch."""

from __future__ import annotations

import asyncio
from typing import Annotated, Any, Literal

from fastapi import APIRouter, Query, status
from pydantic import BaseModel, Field, field_validator

from agent.history import history_from_events
from agent.prompt import render_prompt
from backend.api.deps import CurrentUser, SessionDep, StateDep, can_access
from backend.api.routes.schemas import ReexecuteReport, Session, TimelineEntry
from backend.api.routes.sessions import MAX_SEQ, POLICY_DOC, check_policy_fields
from backend.db.browse import branches_of
from backend.replay import reexecute, timeline
from backend.timings import Timings, call_timings
from tools.registry import default_tools

router = APIRouter(prefix="/v1/sessions", tags=["replay"])


class BranchRequest(BaseModel):
    from_step: int = Field(..., ge=0, le=MAX_SEQ, description="model calls of the original to re-execute first")
    policy: dict[str, Any] = Field(..., description="policy for the continuation; " + POLICY_DOC)
    auto_continue: bool = Field(True, description="if step k ended with tool results, call the model at once")

    _policy = field_validator("policy")(check_policy_fields)


@router.get("/{session_id}/timeline")
async def session_timeline(info: SessionDep, state: StateDep) -> list[TimelineEntry]:  # type: ignore[valid-type]
    """Every event with ``t``, seconds since the first."""
    events = await asyncio.to_thread(state.log.all_events, info.id)
    return timeline(events)  # type: ignore[return-value]


@router.get("/{session_id}/calls")
async def session_calls(
    info: SessionDep, state: StateDep,
    outputs: Annotated[bool, Query(description="include results' output and edits' diffs")] = True,
) -> Timings:
    """Every tool call with when it was dispatched, ran and ended (seconds since ``t0``), its arguments,
    result and edits, and every model call (step): the bars of the replay view."""
    events = await asyncio.to_thread(state.log.all_events, info.id)
    return call_timings(events, outputs=outputs)


class ConversationMessage(BaseModel):
    role: Literal["system", "user", "assistant", "tool"]
    content: str
    seq: int | None = Field(description="the event it comes from (a tool message: its step's last tool_result); "
                            "None for the system prompt")


class Conversation(BaseModel):
    messages: list[ConversationMessage]
    upto: int = Field(description="the last seq taken into account")


@router.get("/{session_id}/conversation")
async def session_conversation(
    info: SessionDep, state: StateDep,
    upto: Annotated[int | None, Query(ge=0, le=MAX_SEQ, description="only events with seq <= upto")] = None,
) -> Conversation:
    """The conversation as the model saw it: the system prompt (with the tools this server gives a session),
    the user messages, the model's raw outputs and the tool results it read, rebuilt from the log the way a
    restarted server rebuilds it. Not guaranteed: the system prompt is rendered now, with the default prompt
    profile; a session driven by a local checkpoint with another profile (RL rollouts) read that profile's."""
    events = await asyncio.to_thread(state.log.all_events, info.id)
    if upto is not None:
        events = [e for e in events if e.seq <= upto]
    h = history_from_events(events)
    tools = default_tools(commands=state.hub.sandbox is not None, semantic_search=state.hub.indexes is not None)
    specs = [t.spec for t in tools]  # the tool set a session of this server gets (agent.runtime.session_tools)
    system = render_prompt([], specs).messages[0]["content"]
    messages = [ConversationMessage(role="system", content=system, seq=None)]
    messages += [ConversationMessage(role=m.role, content=m.content, seq=seq) for m, seq in zip(h.conversation,
                                                                                                h.seqs, strict=True)]
    return Conversation(messages=messages, upto=events[-1].seq if events else 0)


@router.get("/{session_id}/branches")
async def session_branches(info: SessionDep, state: StateDep, user: CurrentUser) -> list[Session]:
    """The sessions branched from this one (newest first) that the caller may see; a branch names its parent
    in ``parent_id`` and its step in ``branch_step``."""
    rows = await asyncio.to_thread(branches_of, state.log.engine, info.id)
    return [Session.model_validate(r.public()) for r in rows if can_access(user, r)]


@router.post("/{session_id}/reexecute")
async def reexecute_session(info: SessionDep, state: StateDep) -> ReexecuteReport:
    events = await asyncio.to_thread(state.log.all_events, info.id)
    snapshot = await asyncio.to_thread(state.log.load_snapshot, info.base_snapshot)
    workspace = await asyncio.to_thread(state.store.from_snapshot, snapshot)
    parts = state.hub.replay_parts(workspace, info, events)
    try:
        report = await reexecute(info.id, events, parts)
    finally:
        await asyncio.to_thread(state.hub.release_parts, parts)
        await asyncio.to_thread(workspace.delete)
    return ReexecuteReport.model_validate(report.to_json())


@router.post("/{session_id}/branch", status_code=status.HTTP_201_CREATED)
async def branch_session(info: SessionDep, body: BranchRequest, state: StateDep, user: CurrentUser) -> Session:
    policy = state.hub.policies.validate(body.policy)  # PolicyConfigError, HubError: mapped at the edge
    new = await state.hub.branch(info, owner=user.name, from_step=body.from_step, policy=policy,
                                 auto_continue=body.auto_continue)
    return Session.model_validate(new.public())
