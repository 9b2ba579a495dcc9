"""Replay for support staff (and owners): timeline, re-execute, branch."""

from __future__ import annotations

import asyncio
from typing import Any

from fastapi import APIRouter, status
from pydantic import BaseModel, Field, field_validator

from backend.api.deps import CurrentUser, SessionDep, StateDep
from backend.api.routes.schemas import ReexecuteReport, Session, TimelineEntry
from backend.api.routes.sessions import MAX_SEQ, POLICY_DOC, check_policy_fields
from backend.replay import reexecute, timeline

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
