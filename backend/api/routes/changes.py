"""A session's changes for the client to apply, and checkpoints to undo a turn.

* ``GET /v1/sessions/{id}/changes``: the workspace's changes against the session's
  starting snapshot, with contents (base64), as :class:`backend.apply_back.ChangeSet`
  JSON. The *client* applies them to its copy of the original directory (with the
  user's own permissions and conflict check): the server never writes outside its
  workspaces. 413 if the contents exceed :data:`backend.apply_back.MAX_CHANGE_BYTES`.
* ``POST /v1/sessions/{id}/checkpoints``: snapshot the workspace now (a client calls it
  before sending a message); returns the snapshot id.
* ``POST /v1/sessions/{id}/restore`` ``{"snapshot": ID}``: put the workspace back to one
  of *this session's* checkpoints (``/undo``); returns the paths that changed.

Checkpoint and restore answer 409 while a turn runs. Not guaranteed: checkpoints are
remembered in the server's memory (the last :data:`MAX_CHECKPOINTS` per session) and
are gone after a restart; a restore does not tell the model (the client says so in its
next message); a message that starts a turn while a restore is writing is not held off.
"""

from __future__ import annotations

import asyncio
from collections import OrderedDict
from typing import Any

from fastapi import APIRouter, HTTPException, Request, status
from pydantic import BaseModel, Field

from backend.api.deps import AppState, SessionDep, StateDep
from backend.apply_back import ApplyError, ChangeSet
from backend.db.log import SessionInfo
from tools.snapshots import SnapshotError
from tools.workspace import Workspace, WorkspaceError

router = APIRouter(prefix="/v1/sessions", tags=["changes"])
MAX_CHECKPOINTS = 50


class FileStateModel(BaseModel):
    kind: str = Field(description='"file" or "symlink"')
    executable: bool = False
    data_b64: str = Field(description="the file's bytes, or the symlink's target, base64")


class FileChangeModel(BaseModel):
    path: str = Field(description="workspace-relative, non-UTF-8 bytes as \\xHH")
    path_b64: str = Field(description="the exact path bytes, base64")
    kind: str = Field(description="added | modified | deleted")
    old: FileStateModel | None = Field(description="at the session's start; null if it did not exist")
    new: FileStateModel | None = Field(description="now; null if deleted")


class PathModel(BaseModel):
    path: str
    path_b64: str


class ChangesResponse(BaseModel):
    session_id: str
    source: dict[str, Any] = Field(description="where the workspace came from: the directory to apply to")
    changes: list[FileChangeModel]
    removed_dirs: list[PathModel] = Field(description="directories the session removed (remove when empty)")
    skipped: list[str] = Field(description="changes never applied (inside .git)")


class CheckpointResponse(BaseModel):
    snapshot: str


class RestoreRequest(BaseModel):
    snapshot: str = Field(..., min_length=64, max_length=64, pattern="^[0-9a-f]{64}$")


class RestoreResponse(BaseModel):
    snapshot: str
    restored: list[str] = Field(description="paths the restore changed (display form)")


def _checkpoints(request: Request) -> OrderedDict[str, list[str]]:
    state = request.app.state
    if not hasattr(state, "flywheel_checkpoints"):
        state.flywheel_checkpoints = OrderedDict()
    return state.flywheel_checkpoints  # type: ignore[no-any-return]


async def _workspace(state: AppState, info: SessionInfo) -> Workspace:
    try:
        return await asyncio.to_thread(state.store.open, info.workspace_id)
    except WorkspaceError as exc:
        raise HTTPException(status.HTTP_410_GONE, f"the workspace is gone: {exc}") from None


def _refuse_while_running(state: AppState, info: SessionInfo) -> None:
    live = state.hub.live.get(info.id)
    if (live is not None and live.running) or info.status == "running":
        raise HTTPException(status.HTTP_409_CONFLICT, "a turn is running in this session; wait for it or interrupt it")


@router.get("/{session_id}/changes", response_model=ChangesResponse)
async def session_changes(info: SessionDep, state: StateDep) -> dict[str, Any]:
    workspace = await _workspace(state, info)
    try:
        changes = await asyncio.to_thread(ChangeSet.from_workspace, workspace)
    except ApplyError as exc:
        raise HTTPException(status.HTTP_413_REQUEST_ENTITY_TOO_LARGE, str(exc)) from None
    return {"session_id": info.id, "source": info.source, **changes.to_json()}


@router.post("/{session_id}/checkpoints", response_model=CheckpointResponse)
async def checkpoint(info: SessionDep, state: StateDep, request: Request) -> dict[str, Any]:
    _refuse_while_running(state, info)
    workspace = await _workspace(state, info)
    try:
        snap = await asyncio.to_thread(workspace.snapshot)
    except SnapshotError as exc:
        raise HTTPException(status.HTTP_409_CONFLICT, f"cannot checkpoint the workspace: {exc}") from None
    kept = _checkpoints(request).setdefault(info.id, [])
    if snap.id in kept:
        kept.remove(snap.id)
    kept.append(snap.id)
    del kept[:-MAX_CHECKPOINTS]
    return {"snapshot": snap.id}


@router.post("/{session_id}/restore", response_model=RestoreResponse)
async def restore(info: SessionDep, body: RestoreRequest, state: StateDep, request: Request) -> dict[str, Any]:
    if body.snapshot not in _checkpoints(request).get(info.id, []):
        raise HTTPException(status.HTTP_404_NOT_FOUND, "no such checkpoint of this session (checkpoints are "
                            "forgotten when the server restarts)")
    _refuse_while_running(state, info)
    workspace = await _workspace(state, info)
    try:
        snap = await asyncio.to_thread(state.store.load_snapshot, body.snapshot)
        changed = await asyncio.to_thread(workspace.changed_paths, snap)
        await asyncio.to_thread(workspace.restore, snap)
    except SnapshotError as exc:
        raise HTTPException(status.HTTP_409_CONFLICT, f"cannot restore the checkpoint: {exc}") from None
    return {"snapshot": snap.id, "restored": [c.path for c in changed]}
