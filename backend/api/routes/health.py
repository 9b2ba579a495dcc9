from __future__ import annotations

from fastapi import APIRouter

from backend.api.routes.schemas import Health

router = APIRouter(tags=["health"])


@router.get("/health")
async def health() -> Health:
    """Liveness; the only route without authentication."""
    return Health()
