"""Who the caller is: ``GET /v1/me`` (the browser app signs in by checking its token here)."""

from __future__ import annotations

from fastapi import APIRouter
from pydantic import BaseModel, Field

from backend.api.deps import CurrentUser

router = APIRouter(prefix="/v1", tags=["account"])


class Me(BaseModel):
    name: str = Field(description="the token's name: the owner of the sessions it creates")
    role: str = Field(description="user or staff")
    is_staff: bool = Field(description="staff may list, replay and review every session and RL run")


@router.get("/me")
async def me(user: CurrentUser) -> Me:
    """The caller's name and role; 401 for a missing, invalid or revoked token."""
    return Me(name=user.name, role=user.role, is_staff=user.is_staff)
