"""Sessions: create, list, get, events, diff, send a message, interrupt, cancel."""

from __future__ import annotations

import asyncio
import os
from datetime import UTC, datetime
from pathlib import Path
from typing import Annotated, Any, Literal

from fastapi import APIRouter, HTTPException, Query, status
from pydantic import BaseModel, Field, model_validator

from backend.api.deps import CurrentUser, SessionDep, StateDep
from backend.hub import HubError
from backend.policies import PolicyConfigError
from tools.workspace import WorkspaceError

router = APIRouter(prefix="/v1/sessions", tags=["sessions"])


class WorkspaceSource(BaseModel):
    path: str | None = Field(None, description="a directory under one of the server's allowed roots")
    git: str | None = Field(None, description="a git repository under an allowed root (with commit)")
    commit: str = Field("HEAD", max_length=200)

    @model_validator(mode="after")
    def _one(self) -> WorkspaceSource:
        if (self.path is None) == (self.git is None):
            raise ValueError("give exactly one of 'path' or 'git'")
        return self


class CreateSession(BaseModel):
    workspace: WorkspaceSource
    policy: dict[str, Any] = Field(..., description='e.g. {"kind": "openai"} or {"kind": "scripted", "outputs": [...]}')
    title: str = Field("", max_length=200)


class SendMessage(BaseModel):
    text: str = Field(..., min_length=1, max_length=1_000_000)


class EventsPage(BaseModel):
    events: list[dict[str, Any]]
    next_after: int
    more: bool


def check_allowed(raw: str, roots: list[Path]) -> Path:
    """Resolve ``raw`` and require it to be inside an allowed root."""
    if "\x00" in raw or len(raw) > 4096:
        raise HTTPException(status.HTTP_400_BAD_REQUEST, "invalid path")
    real = Path(os.path.realpath(raw))
    if not any(real == r or real.is_relative_to(r) for r in roots):
        raise HTTPException(status.HTTP_403_FORBIDDEN, f"{raw} is not under an allowed source root")
    return real


@router.post("", status_code=status.HTTP_201_CREATED)
async def create_session(body: CreateSession, state: StateDep, user: CurrentUser) -> dict[str, Any]:
    roots = state.settings.allowed_roots
    src = body.workspace
    origin = check_allowed(src.path if src.path is not None else src.git or "", roots)  # 403 before anything else
    try:
        policy = state.hub.policies.validate(body.policy)
    except PolicyConfigError as exc:
        raise HTTPException(status.HTTP_400_BAD_REQUEST, str(exc)) from None
    try:
        if src.path is not None:
            if not origin.is_dir():
                raise HTTPException(status.HTTP_400_BAD_REQUEST, f"{src.path} is not a directory")
            workspace = await asyncio.to_thread(state.store.from_dir, origin)
            source = {"kind": "dir", "path": str(origin)}
        else:
            workspace = await asyncio.to_thread(state.store.from_git, origin, src.commit)
            source = {"kind": "git", "path": str(origin), "commit": src.commit}
    except (WorkspaceError, OSError) as exc:
        raise HTTPException(status.HTTP_400_BAD_REQUEST, f"could not create the workspace: {exc}") from None
    info = await state.hub.create(owner=user.name, workspace=workspace, policy=policy, title=body.title, source=source)
    return info.public()


@router.get("")
async def list_sessions(
    state: StateDep,
    user: CurrentUser,
    owner: str | None = None,
    status_: Annotated[Literal["idle", "running", "cancelled"] | None, Query(alias="status")] = None,
    since: datetime | None = None,
    until: datetime | None = None,
    kind: Literal["user", "rl"] | None = None,
    run: Annotated[str | None, Query(max_length=64, description="an RL run id (kind=rl sessions)")] = None,
    limit: Annotated[int, Query(ge=1, le=500)] = 50,
    offset: Annotated[int, Query(ge=0)] = 0,
) -> list[dict[str, Any]]:
    if not user.is_staff:
        if owner not in (None, user.name):
            raise HTTPException(status.HTTP_403_FORBIDDEN, "only staff can list other users' sessions")
        owner = user.name
    rows = await asyncio.to_thread(
        state.log.list_sessions, owner=owner, status=status_, since=_naive(since), until=_naive(until),
        limit=limit, offset=offset, kind=kind, rl_run=run,
    )
    return [r.public() for r in rows]


def _naive(t: datetime | None) -> datetime | None:
    """The log stores naive UTC times."""
    if t is None or t.tzinfo is None:
        return t
    return t.astimezone(UTC).replace(tzinfo=None)


@router.get("/{session_id}")
async def get_session(info: SessionDep) -> dict[str, Any]:
    return info.public()


@router.get("/{session_id}/events")
async def session_events(
    info: SessionDep, state: StateDep,
    after: Annotated[int, Query(ge=0)] = 0, limit: Annotated[int, Query(ge=1, le=5000)] = 500,
) -> EventsPage:
    events = await asyncio.to_thread(state.log.events, info.id, after=after, limit=limit + 1)
    page = events[:limit]
    return EventsPage(events=[e.model_dump(mode="json") for e in page],
                      next_after=page[-1].seq if page else after, more=len(events) > limit)


@router.get("/{session_id}/diff")
async def session_diff(info: SessionDep, state: StateDep) -> dict[str, Any]:
    try:
        ws = await asyncio.to_thread(state.store.open, info.workspace_id)
    except WorkspaceError as exc:
        raise HTTPException(status.HTTP_410_GONE, f"the workspace is gone: {exc}") from None
    diff = await asyncio.to_thread(ws.diff)
    files = await asyncio.to_thread(ws.changed_paths)
    return {"diff": diff, "files": [{"path": c.path, "kind": str(c.kind)} for c in files]}


@router.post("/{session_id}/messages", status_code=status.HTTP_202_ACCEPTED)
async def send_message(info: SessionDep, body: SendMessage, state: StateDep) -> dict[str, Any]:
    try:
        await state.hub.send(info, body.text)
    except HubError as exc:
        raise HTTPException(exc.status, str(exc)) from None
    return {"accepted": True}


@router.post("/{session_id}/interrupt")
async def interrupt(info: SessionDep, state: StateDep) -> dict[str, Any]:
    return {"interrupted": await state.hub.interrupt(info)}


@router.post("/{session_id}/cancel")
async def cancel(info: SessionDep, state: StateDep) -> dict[str, Any]:
    await state.hub.cancel(info)
    return {"cancelled": True}
