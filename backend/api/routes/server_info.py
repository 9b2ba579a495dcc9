"""What this server offers a new session: the workspaces it may copy and the policies it accepts.

So a client can offer lists instead of asking for typed paths and JSON. Any
signed-in caller may read them (they are what ``POST /v1/sessions`` accepts
from anyone). Not guaranteed: ``suggested`` lists at most
:data:`MAX_SUGGESTED` directories per root, one level deep; any directory
under a root may be used, listed or not.
"""

from __future__ import annotations

import asyncio
import os
from pathlib import Path
from typing import Any

from fastapi import APIRouter
from pydantic import BaseModel, Field

from backend.api.deps import CurrentUser, StateDep
from backend.policies import DEMO_DIR, demo_policy, demo_script

router = APIRouter(prefix="/v1", tags=["server"])
MAX_SUGGESTED = 100


class SuggestedWorkspace(BaseModel):
    path: str = Field(description='pass as {"workspace": {"path": ...}} (or {"git": ...} when git is true)')
    label: str
    git: bool = Field(description="a git work tree (a session may also start from one of its commits)")


class Workspaces(BaseModel):
    roots: list[str] = Field(description="the allowed roots (--allow-root): sessions copy directories under them")
    suggested: list[SuggestedWorkspace]


class PolicyPreset(BaseModel):
    name: str
    policy: dict[str, Any] = Field(description="pass as the session's policy")
    request: str = Field("", description="the message the preset's script answers")
    workspace: str | None = Field(None, description="the workspace the preset is made for, if the server allows it")


class Policies(BaseModel):
    kinds: list[str] = Field(description="policy kinds POST /v1/sessions accepts (openai only with a model server)")
    openai_model: str | None = Field(description="the model an openai policy without one uses; null: no server")
    presets: list[PolicyPreset]


def _suggestions(roots: list[Path]) -> list[SuggestedWorkspace]:
    out: list[SuggestedWorkspace] = []
    demo = (DEMO_DIR / "workspace").resolve()
    for root in roots:
        if not root.is_dir():
            continue
        out.append(SuggestedWorkspace(path=str(root), label="the demo project" if root == demo else root.name or str(root),
                                      git=(root / ".git").exists()))
        try:
            with os.scandir(root) as it:
                names = sorted(e.name for e in it if e.is_dir(follow_symlinks=False) and not e.name.startswith("."))
        except OSError:
            continue
        children = [root / n for n in names[:MAX_SUGGESTED]] if root != demo else []
        out += [SuggestedWorkspace(path=str(c), label=f"{root.name}/{c.name}", git=(c / ".git").exists())
                for c in children]
    return out


@router.get("/workspaces")
async def workspaces(state: StateDep, _: CurrentUser) -> Workspaces:
    """The allowed roots and the directories worth offering (each root and its subdirectories)."""
    roots = state.settings.allowed_roots
    return Workspaces(roots=[str(r) for r in roots], suggested=await asyncio.to_thread(_suggestions, roots))


@router.get("/policies")
async def policies(state: StateDep, _: CurrentUser) -> Policies:
    """The policy kinds this server accepts, its default model, and presets (the bundled demo's script)."""
    factory = state.hub.policies
    demo = (DEMO_DIR / "workspace").resolve()
    allowed = any(demo == r or demo.is_relative_to(r) for r in state.settings.allowed_roots)
    preset = PolicyPreset(name="demo", policy=demo_policy(), request=demo_script()["request"],
                          workspace=str(demo) if allowed else None)
    return Policies(kinds=factory.kinds(), openai_model=factory.openai_model if factory.openai_base_url else None,
                    presets=[preset])
