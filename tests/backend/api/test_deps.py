"""backend/api/deps.py: every staff-only route refuses a user's token with 403, found by walking the app's routes."""

from __future__ import annotations

import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from fastapi.dependencies.models import Dependant
from fastapi.routing import APIRoute

from backend.api.deps import require_staff
from tests.backend.conftest import Api, make_api
from tests.backend.test_contracts import assert_error


@pytest.fixture
def api(tmp_path: Path) -> Iterator[Api]:
    with make_api(f"sqlite:///{tmp_path / 'fw.db'}", tmp_path, semantic_search=False) as a:
        yield a


def needs_staff(dep: Dependant) -> bool:
    return dep.call is require_staff or any(needs_staff(d) for d in dep.dependencies)


def api_routes(routes: list[Any]) -> Iterator[APIRoute]:
    for r in routes:
        if isinstance(r, APIRoute):
            yield r
        elif getattr(r, "original_router", None) is not None:  # an included router (FastAPI >= 0.16x)
            yield from api_routes(r.original_router.routes)


def staff_routes(app: Any) -> list[tuple[str, str]]:
    return sorted((m, r.path) for r in api_routes(app.routes) if needs_staff(r.dependant) for m in r.methods)


def test_every_staff_route_refuses_users(api: Api) -> None:
    routes = staff_routes(api.client.app)
    assert {("GET", "/v1/rl/runs"), ("GET", "/v1/rl/runs/{run_id}"),
            ("GET", "/v1/rl/runs/{run_id}/iterations/{iteration}/rollouts"), ("GET", "/v1/feedback")} <= set(routes)
    own = api.create("alice")["id"]  # a session alice may see: the refusal is about the route, not the session
    for method, path in routes:
        url = re.sub(r"\{session_id\}", own, path)
        url = re.sub(r"\{iteration\}", "0", url)
        url = re.sub(r"\{[a-z_]+\}", "x", url)
        r = api.client.request(method, url, headers=api.h("alice"), json={})
        assert_error(r, 403, "forbidden")
        assert r.json()["detail"] == "staff only", (method, path)
        assert api.client.request(method, url, headers=api.h("sue"), json={}).status_code != 403, (method, path)
