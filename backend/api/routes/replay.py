"""Replay for support staff (and owners): timeline, re-execute, branch."""

from __future__ import annotations

import asyncio
from typing import Any

from fastapi import APIRouter, HTTPException, status
from pydantic import BaseModel, Field

from backend.api.deps import CurrentUser, SessionDep, StateDep
from backend.hub import HubError
from backend.policies import PolicyConfigError
from backend.replay import reexecute, timeline

router = APIRouter(prefix="/v1/sessions", tags=["replay"])


class BranchRequest(BaseModel):
    from_step: int = Field(..., ge=0, description="model calls of the original to re-execute first")
    policy: dict[str, Any] = Field(..., description="policy for the continuation")
    auto_continue: bool = Field(True, description="if step k ended with tool results, call the model at once")


@router.get("/{session_id}/timeline")
async def session_timeline(info: SessionDep, state: StateDep) -> list[dict[str, Any]]:
    events = await asyncio.to_thread(state.log.all_events, info.id)
    return timeline(events)


@router.post("/{session_id}/reexecute")
async def reexecute_session(info: SessionDep, state: StateDep) -> dict[str, Any]:
    events = await asyncio.to_thread(state.log.all_events, info.id)
    snapshot = await asyncio.to_thread(state.log.load_snapshot, info.base_snapshot)
    workspace = await asyncio.to_thread(state.store.from_snapshot, snapshot)
    parts = state.hub.replay_parts(workspace)
    try:
        report = await reexecute(info.id, events, parts)
    finally:
        await asyncio.to_thread(state.hub.release_parts, parts)
        await asyncio.to_thread(workspace.delete)
    return report.to_json()


@router.post("/{session_id}/branch", status_code=status.HTTP_201_CREATED)
async def branch_session(info: SessionDep, body: BranchRequest, state: StateDep, user: CurrentUser) -> dict[str, Any]:
    try:
        policy = state.hub.policies.validate(body.policy)
        new = await state.hub.branch(info, owner=user.name, from_step=body.from_step, policy=policy,
                                     auto_continue=body.auto_continue)
    except PolicyConfigError as exc:
        raise HTTPException(status.HTTP_400_BAD_REQUEST, str(exc)) from None
    except HubError as exc:
        raise HTTPException(exc.status, str(exc)) from None
    return new.public()
