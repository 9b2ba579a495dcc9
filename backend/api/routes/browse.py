"""The session browser: filtered, searched, keyset-paginated lists of sessions and the filters' values.

Users browse their own sessions (naming another owner is 403); staff browse
everyone's, users' sessions and RL rollouts alike. See
:mod:`backend.db.browse` for the ordering and cursor, :mod:`backend.db.search`
for the search syntax.
"""

from __future__ import annotations

import asyncio
from datetime import datetime
from typing import Annotated, Literal

from fastapi import APIRouter, Query
from pydantic import BaseModel, Field

from backend.api.deps import CurrentUser, StateDep
from backend.api.routes.schemas import Session
from backend.api.routes.sessions import MAX_SEQ, naive_utc
from backend.db.browse import BrowseFilters, CursorError, FeedbackFilter, Order, browse_sessions, facets
from backend.db.search import QueryError, parse_query
from backend.errors import Forbidden, InvalidRequest

router = APIRouter(prefix="/v1/browse", tags=["browse"])


class SnippetSegment(BaseModel):
    text: str = Field(description="plain text (render it as text, never as markup)")
    match: bool = Field(description="a word the search matched")


class MessageMatch(BaseModel):
    seq: int = Field(description="the first matching message's event seq")
    type: str = Field(description="user_message or assistant_message")
    snippet: list[SnippetSegment]


class BrowsedSession(Session):
    match: MessageMatch | None = Field(None, description="with q: the session's first matching message")


class SessionPage(BaseModel):
    sessions: list[BrowsedSession]
    next_cursor: str | None = Field(description="pass as cursor= for the next page; null on the last page")


class FacetValues(BaseModel):
    owners: list[str]
    policies: list[str] = Field(description="policy_name values (the policy filter)")
    runs: list[str] = Field(description="RL run ids (training runs; held-out evaluations end in /heldout)")


@router.get("/sessions")
async def browse(
    state: StateDep,
    user: CurrentUser,
    q: Annotated[str | None, Query(max_length=500, description='search messages: words (ANDed), "a phrase", '
                                   "prefix*")] = None,
    owner: Annotated[str | None, Query(max_length=200)] = None,
    status_: Annotated[Literal["idle", "running", "cancelled"] | None, Query(alias="status")] = None,
    kind: Literal["user", "rl"] | None = None,
    since: Annotated[datetime | None, Query(description="created at or after (ISO 8601; no zone: UTC)")] = None,
    until: Annotated[datetime | None, Query(description="created before")] = None,
    policy: Annotated[str | None, Query(max_length=300, description="a policy_name, exactly")] = None,
    run: Annotated[str | None, Query(max_length=64, description="an RL run id")] = None,
    iteration: Annotated[int | None, Query(ge=0, le=MAX_SEQ)] = None,
    task: Annotated[str | None, Query(max_length=200, description="an RL task id, exactly")] = None,
    min_reward: Annotated[float | None, Query(allow_inf_nan=False)] = None,
    max_reward: Annotated[float | None, Query(allow_inf_nan=False)] = None,
    feedback: Annotated[FeedbackFilter | None, Query(description="any / none: some or no feedback; up, down: a "
                                                     "turn so rated; kept, reverted: a file so marked")] = None,
    order: Order = "newest",
    limit: Annotated[int, Query(ge=1, le=200)] = 50,
    cursor: Annotated[str | None, Query(max_length=600)] = None,
) -> SessionPage:
    """A page of sessions, newest (or oldest) first, filtered and optionally searched."""
    if not user.is_staff:
        if owner not in (None, user.name):
            raise Forbidden("only staff can browse other users' sessions")
        owner = user.name
    try:
        terms = tuple(parse_query(q)) if q is not None and q.strip() else ()
    except QueryError as exc:
        raise InvalidRequest(str(exc)) from None
    filters = BrowseFilters(owner=owner, status=status_, kind=kind, since=naive_utc(since), until=naive_utc(until),
                            policy=policy, run=run, iteration=iteration, task=task, min_reward=min_reward,
                            max_reward=max_reward, feedback=feedback, terms=terms)
    try:
        page = await asyncio.to_thread(browse_sessions, state.log.engine, filters, limit=limit, cursor=cursor,
                                       order=order)
    except CursorError as exc:
        raise InvalidRequest(str(exc)) from None
    out = []
    for info in page.sessions:
        m = page.matches.get(info.id)
        match = None if m is None else MessageMatch(seq=m.seq, type=m.type, snippet=[
            SnippetSegment(text=s.text, match=s.match) for s in m.snippet])
        out.append(BrowsedSession.model_validate({**info.public(), "match": match}))
    return SessionPage(sessions=out, next_cursor=page.next_cursor)


@router.get("/facets")
async def browse_facets(state: StateDep, user: CurrentUser) -> FacetValues:
    """The values the owner, policy and run filters can take (users: among their own sessions)."""
    got = await asyncio.to_thread(facets, state.log.engine, None if user.is_staff else user.name)
    return FacetValues(owners=got.owners, policies=got.policies, runs=got.runs)
