"""Sessions: create, list, get, events, diff, send a message, interrupt, cancel."""

from __future__ import annotations

import asyncio
import os
from datetime import UTC, datetime
from pathlib import Path
from typing import Annotated, Any, Literal

from fastapi import APIRouter, Query, status
from pydantic import BaseModel, Field, field_validator, model_validator

from backend.api.deps import CurrentUser, SessionDep, StateDep
from backend.api.routes.schemas import Accepted, Cancelled, ChangedFile, Diff, EventsPage, Interrupted, Session
from backend.errors import Forbidden, Gone, InvalidRequest
from tools.workspace import WorkspaceError

router = APIRouter(prefix="/v1/sessions", tags=["sessions"])


MAX_PATH = 4096
MAX_NAME = 256  # a model name, a policy kind: anything longer is refused (422)
MAX_SEQ = 2**31 - 1  # event seqs (and branch steps) are 32-bit INTEGER columns in the log
MAX_OFFSET = 2**63 - 1  # SQL OFFSET is a 64-bit integer


class WorkspaceSource(BaseModel):
    path: str | None = Field(None, max_length=MAX_PATH, description="a directory under one of the server's allowed roots")
    git: str | None = Field(None, max_length=MAX_PATH, description="a git repository under an allowed root (with commit)")
    commit: str = Field("HEAD", max_length=200)

    @model_validator(mode="after")
    def _one(self) -> WorkspaceSource:
        if (self.path is None) == (self.git is None):
            raise ValueError("give exactly one of 'path' or 'git'")
        return self


POLICY_DOC = (
    'the policy: {"kind": "openai", "model"?: str, "temperature"?: number} (the operator\'s model server) or '
    '{"kind": "scripted", "outputs": [str, ...], "chunk_chars"?: int, "delay_s"?: number} (recorded outputs). '
    f"Strings other than outputs are at most {MAX_NAME} characters."
)


def check_policy_fields(policy: dict[str, Any]) -> dict[str, Any]:
    """Refuse oversized fields before anything stores them: every string other than the
    scripted ``outputs`` (capped by ``backend.policies``) is at most :data:`MAX_NAME` characters."""
    for key, value in policy.items():
        if len(key) > MAX_NAME:
            raise ValueError(f"policy field names are at most {MAX_NAME} characters")
        if key != "outputs" and isinstance(value, str) and len(value) > MAX_NAME:
            raise ValueError(f"policy.{key} is {len(value)} characters; at most {MAX_NAME}")
        if key != "outputs" and isinstance(value, list | dict):
            raise ValueError(f"policy.{key} must be a string or a number")
    return policy


class CreateSession(BaseModel):
    workspace: WorkspaceSource
    policy: dict[str, Any] = Field(..., description=POLICY_DOC)
    title: str = Field("", max_length=200)
    approval_mode: Literal["auto", "ask-commands", "ask-edits"] = Field(
        "auto", description="auto: tools run without asking; ask-commands / ask-edits: the server sends an "
                            "approval request over the WebSocket before each command / edit")

    _policy = field_validator("policy")(check_policy_fields)


class SendMessage(BaseModel):
    text: str = Field(..., min_length=1, max_length=1_000_000)


def check_allowed(raw: str, roots: list[Path]) -> Path:
    """Resolve ``raw`` and require it to be inside an allowed root."""
    if "\x00" in raw or len(raw) > MAX_PATH:
        raise InvalidRequest("invalid path")
    real = Path(os.path.realpath(raw))
    if not any(real == r or real.is_relative_to(r) for r in roots):
        raise Forbidden(f"{raw} is not under an allowed source root")
    return real


@router.post("", status_code=status.HTTP_201_CREATED)
async def create_session(body: CreateSession, state: StateDep, user: CurrentUser) -> Session:
    roots = state.settings.allowed_roots
    src = body.workspace
    origin = check_allowed(src.path if src.path is not None else src.git or "", roots)  # 403 before anything else
    policy = state.hub.policies.validate(body.policy)  # PolicyConfigError: 400 at the edge
    if src.path is not None and not origin.is_dir():
        raise InvalidRequest(f"{src.path} is not a directory")
    try:
        if src.path is not None:
            workspace = await asyncio.to_thread(state.store.from_dir, origin,
                                                  in_place=state.settings.workspace_source == "in-place")
            source = {"kind": "dir", "path": str(origin)}
        else:
            workspace = await asyncio.to_thread(state.store.from_git, origin, src.commit)
            source = {"kind": "git", "path": str(origin), "commit": src.commit}
    except (WorkspaceError, OSError) as exc:
        raise InvalidRequest(f"could not create the workspace: {exc}") from None
    info = await state.hub.create(owner=user.name, workspace=workspace, policy=policy, title=body.title, source=source,
                                   approval_mode=body.approval_mode)
    return Session.model_validate(info.public())


@router.get("")
async def list_sessions(
    state: StateDep,
    user: CurrentUser,
    owner: Annotated[str | None, Query(max_length=200)] = None,
    status_: Annotated[Literal["idle", "running", "cancelled"] | None, Query(alias="status")] = None,
    since: datetime | None = None,
    until: datetime | None = None,
    kind: Literal["user", "rl"] | None = None,
    run: Annotated[str | None, Query(max_length=64, description="an RL run id (kind=rl sessions)")] = None,
    limit: Annotated[int, Query(ge=1, le=500)] = 50,
    offset: Annotated[int, Query(ge=0, le=MAX_OFFSET)] = 0,
) -> list[Session]:
    if not user.is_staff:
        if owner not in (None, user.name):
            raise Forbidden("only staff can list other users' sessions")
        owner = user.name
    rows = await asyncio.to_thread(
        state.log.list_sessions, owner=owner, status=status_, since=naive_utc(since), until=naive_utc(until),
        limit=limit, offset=offset, kind=kind, rl_run=run,
    )
    return [Session.model_validate(r.public()) for r in rows]


def naive_utc(t: datetime | None) -> datetime | None:
    """The log stores naive UTC times."""
    if t is None or t.tzinfo is None:
        return t
    return t.astimezone(UTC).replace(tzinfo=None)


@router.get("/{session_id}")
async def get_session(info: SessionDep) -> Session:
    return Session.model_validate(info.public())


@router.get("/{session_id}/events")
async def session_events(
    info: SessionDep, state: StateDep,
    after: Annotated[int, Query(ge=0, le=MAX_SEQ)] = 0, limit: Annotated[int, Query(ge=1, le=5000)] = 500,
) -> EventsPage:
    events = await asyncio.to_thread(state.log.events, info.id, after=after, limit=limit + 1)
    page = events[:limit]
    return EventsPage(events=page, next_after=page[-1].seq if page else after, more=len(events) > limit)


@router.get("/{session_id}/diff")
async def session_diff(info: SessionDep, state: StateDep) -> Diff:
    try:
        ws = await asyncio.to_thread(state.store.open, info.workspace_id)
    except WorkspaceError as exc:
        raise Gone(f"the workspace is gone: {exc}") from None
    diff = await asyncio.to_thread(ws.diff)
    files = await asyncio.to_thread(ws.changed_paths)
    return Diff(diff=diff, files=[ChangedFile(path=c.path, kind=str(c.kind)) for c in files])


@router.post("/{session_id}/messages", status_code=status.HTTP_202_ACCEPTED)
async def send_message(info: SessionDep, body: SendMessage, state: StateDep) -> Accepted:
    await state.hub.send(info, body.text)  # HubError / a missing workspace: mapped at the edge (409, 410)
    return Accepted()


@router.post("/{session_id}/interrupt")
async def interrupt(info: SessionDep, state: StateDep) -> Interrupted:
    return Interrupted(interrupted=await state.hub.interrupt(info))


@router.post("/{session_id}/cancel")
async def cancel(info: SessionDep, state: StateDep) -> Cancelled:
    await state.hub.cancel(info)
    return Cancelled()
