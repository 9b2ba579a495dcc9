"""Feedback: thumbs up/down on a turn, keep or revert a changed file -- the production half of the flywheel.

* ``POST /v1/sessions/{id}/feedback`` records one piece: ``{"turn": N, "rating": "up"|"down"}`` (the
  owner or staff; turn N must have ended) or ``{"path": P, "verdict": "keep"|"revert"}`` (the owner
  only; P must be a file the session changed). ``revert`` puts the file back as it was when the
  session started, in the session's workspace. Each is a ``feedback`` event in the session's stream
  (live watchers see it; replay shows it) and a row (``backend.db.feedback``) whose counts the
  session carries (``feedback_up``, ``feedback_down``, ``files_kept``, ``files_reverted``). Giving
  feedback on the same turn or file again replaces one's earlier feedback (the stream keeps both).
* ``GET /v1/sessions/{id}/feedback``: the session's feedback.
* ``GET /v1/feedback`` (staff): everyone's, in order, for turning into training data.

Not guaranteed: the model is not told about a revert (say so in the next message if it matters);
a revert is refused while a turn runs, and a message sent while it writes waits for it.
"""

from __future__ import annotations

import asyncio
from datetime import datetime
from typing import Annotated, Literal

from fastapi import APIRouter, Query, status
from pydantic import BaseModel, Field, model_validator

from agent.events import Event, FeedbackEvent
from backend.api.deps import CurrentUser, SessionDep, StaffUser, StateDep
from backend.api.routes.sessions import MAX_PATH, MAX_SEQ, naive_utc
from backend.db import feedback as store
from backend.errors import Conflict, Forbidden, Gone, InvalidRequest
from tools.base import FileEdit
from tools.workspace import WorkspaceError

router = APIRouter(tags=["feedback"])
MAX_COMMENT = 4000


class FeedbackRequest(BaseModel):
    """Either a turn's rating or a file's verdict."""

    turn: int | None = Field(None, ge=1, le=MAX_SEQ, description="the turn rated (with rating)")
    rating: Literal["up", "down"] | None = None
    path: str | None = Field(None, min_length=1, max_length=MAX_PATH,
                             description="a changed file, as GET /v1/sessions/{id}/diff lists it (with verdict)")
    verdict: Literal["keep", "revert"] | None = None
    comment: str = Field("", max_length=MAX_COMMENT)

    @model_validator(mode="after")
    def _one(self) -> FeedbackRequest:
        if (self.turn is None) == (self.path is None):
            raise ValueError('give either "turn" (with "rating") or "path" (with "verdict")')
        if self.turn is not None and (self.rating is None or self.verdict is not None):
            raise ValueError('a turn takes a "rating" (up or down), not a verdict')
        if self.path is not None and (self.verdict is None or self.rating is not None):
            raise ValueError('a file takes a "verdict" (keep or revert), not a rating')
        return self


class FeedbackOut(BaseModel):
    id: int
    session_id: str
    target: Literal["turn", "file"]
    turn: int | None
    path: str | None
    rating: Literal["up", "down"] | None
    verdict: Literal["keep", "revert"] | None
    comment: str
    author: str
    seq: int = Field(description="the feedback event that recorded it last")
    created_at: str
    updated_at: str


class Recorded(FeedbackOut):
    diff: str = Field("", description="revert: what the revert changed in the workspace (a unified diff)")


class FeedbackSummary(BaseModel):
    up: int
    down: int
    kept: int
    reverted: int


class SessionFeedback(BaseModel):
    feedback: list[FeedbackOut]
    summary: FeedbackSummary


class ExportedFeedback(FeedbackOut):
    owner: str
    kind: str = Field(description="user, or rl")
    policy_name: str


class FeedbackExport(BaseModel):
    feedback: list[ExportedFeedback]
    next_after: int | None = Field(description="pass as after= for the next page; null: no more now")


def _out(f: store.Feedback) -> dict[str, object]:
    return {"id": f.id, "session_id": f.session_id, "target": f.target, "turn": f.turn, "path": f.path,
            "rating": f.rating, "verdict": f.verdict, "comment": f.comment, "author": f.author, "seq": f.seq,
            "created_at": f.created_at.isoformat() + "Z", "updated_at": f.updated_at.isoformat() + "Z"}


@router.post("/v1/sessions/{session_id}/feedback", status_code=status.HTTP_201_CREATED)
async def give_feedback(info: SessionDep, body: FeedbackRequest, state: StateDep, user: CurrentUser) -> Recorded:
    """Rate a turn, or keep or revert a changed file (see the module docstring)."""
    hub, engine = state.hub, state.log.engine
    current = await asyncio.to_thread(state.log.get_session, info.id) or info
    if body.turn is not None:
        if body.turn > current.turns:
            raise InvalidRequest(f"this session has {current.turns} turn(s); there is no turn {body.turn}")
        live = hub.live.get(info.id)
        running = (live.running and not live.turn_ended) if live is not None else current.status == "running"
        if body.turn == current.turns and running:
            raise Conflict(f"turn {body.turn} is still running; rate it once it has ended")
        event: Event = await hub.record_event(info, FeedbackEvent(
            target="turn", of_turn=body.turn, rating=body.rating, comment=body.comment, by=user.name))
        row = await asyncio.to_thread(store.record, engine, session_id=info.id, author=user.name, seq=event.seq,
                                      turn=body.turn, rating=body.rating, comment=body.comment)
        return Recorded(**_out(row))
    if user.name != info.owner:
        raise Forbidden("only the session's owner can keep or revert its files")
    path = body.path or ""
    diff = ""
    if body.verdict == "revert":
        def make(edit: FileEdit) -> FeedbackEvent:
            return FeedbackEvent(target="file", path=path, verdict="revert", comment=body.comment, by=user.name,
                                 diff=edit.diff)

        edit, event = await hub.revert_file(info, path, make)  # HubError 409 / 410: mapped at the edge
        diff = edit.diff
    else:
        await _require_changed(state, info.workspace_id, path)
        event = await hub.record_event(info, FeedbackEvent(target="file", path=path, verdict="keep",
                                                           comment=body.comment, by=user.name))
    row = await asyncio.to_thread(store.record, engine, session_id=info.id, author=user.name, seq=event.seq,
                                  path=path, verdict=body.verdict, comment=body.comment)
    return Recorded(**_out(row), diff=diff)


async def _require_changed(state: StateDep, workspace_id: str, path: str) -> None:
    try:
        ws = await asyncio.to_thread(state.store.open, workspace_id)
    except WorkspaceError as exc:
        raise Gone(f"the session's workspace is gone: {exc}") from None
    changed = {c.path for c in await asyncio.to_thread(ws.changed_paths)}
    if path not in changed:
        raise Conflict(f"{path!r} is not changed in this session's workspace (nothing to keep)")


@router.get("/v1/sessions/{session_id}/feedback")
async def session_feedback(info: SessionDep, state: StateDep) -> SessionFeedback:
    """The session's feedback (everyone's, oldest first) and its counts."""
    rows = await asyncio.to_thread(store.of_session, state.log.engine, info.id)
    current = await asyncio.to_thread(state.log.get_session, info.id) or info
    return SessionFeedback(feedback=[FeedbackOut(**_out(r)) for r in rows], summary=FeedbackSummary(
        up=current.feedback_up, down=current.feedback_down, kept=current.files_kept, reverted=current.files_reverted))


@router.get("/v1/feedback")
async def export_feedback(
    state: StateDep, _: StaffUser,
    after: Annotated[int, Query(ge=0, le=2**63 - 1, description="the last id seen")] = 0,
    limit: Annotated[int, Query(ge=1, le=1000)] = 500,
    since: Annotated[datetime | None, Query(description="only feedback given or changed at or after this")] = None,
) -> FeedbackExport:
    """Everyone's feedback, in id order (staff only): for turning kept and reverted edits into training data."""
    rows = await asyncio.to_thread(store.all_feedback, state.log.engine, after=after, limit=limit + 1,
                                   since=naive_utc(since))
    page = rows[:limit]
    out = [ExportedFeedback(**_out(f), owner=owner, kind=kind, policy_name=policy) for f, owner, kind, policy in page]
    return FeedbackExport(feedback=out, next_after=page[-1][0].id if len(rows) > limit else None)
