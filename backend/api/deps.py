"""Dependencies shared by the routes: the app state, the caller, the session."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass
from typing import Annotated

from fastapi import Depends, HTTPException, Path, Request, status
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer

from backend.db.log import Principal, SessionInfo, SessionLog
from backend.errors import Forbidden, NotFound
from backend.hub import Hub
from backend.settings import Settings
from tools.workspace import WorkspaceStore


@dataclass
class AppState:
    settings: Settings
    log: SessionLog
    hub: Hub
    store: WorkspaceStore


def get_state(request: Request) -> AppState:
    return request.app.state.flywheel


StateDep = Annotated[AppState, Depends(get_state)]
_bearer = HTTPBearer(auto_error=False, description="an API token from `flywheel token create`")


async def current_user(
    state: StateDep, creds: Annotated[HTTPAuthorizationCredentials | None, Depends(_bearer)]
) -> Principal:
    if creds is None or creds.scheme.lower() != "bearer":
        raise HTTPException(status.HTTP_401_UNAUTHORIZED, "missing bearer token", {"WWW-Authenticate": "Bearer"})
    principal = await asyncio.to_thread(state.log.verify_token, creds.credentials)
    if principal is None:
        raise HTTPException(status.HTTP_401_UNAUTHORIZED, "invalid or revoked token", {"WWW-Authenticate": "Bearer"})
    return principal


CurrentUser = Annotated[Principal, Depends(current_user)]


def can_access(user: Principal, info: SessionInfo) -> bool:
    return user.is_staff or info.owner == user.name


async def owned_session(
    session_id: Annotated[str, Path(max_length=64, description="a session id")], state: StateDep, user: CurrentUser,
) -> SessionInfo:
    info = await asyncio.to_thread(state.log.get_session, session_id)
    if info is None:
        raise NotFound(f"no session {session_id}")
    if not can_access(user, info):
        raise Forbidden("this session belongs to another user")
    return info


SessionDep = Annotated[SessionInfo, Depends(owned_session)]


def require_staff(user: CurrentUser) -> Principal:
    if not user.is_staff:
        raise Forbidden("staff only")
    return user


StaffUser = Annotated[Principal, Depends(require_staff)]
