"""Fixtures for the API tests: a real app on SQLite and (when reachable) PostgreSQL."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from fastapi.testclient import TestClient
from sqlalchemy import text

from backend.app import create_app
from backend.db.engine import make_engine, migrate, server_reachable
from backend.db.log import SessionLog
from backend.settings import Settings

PG_URL = "postgresql+psycopg://postgres@127.0.0.1:5432/test"


def postgres_reachable() -> bool:
    return server_reachable(PG_URL)


@contextmanager
def postgres_schema(prefix: str = "fwtest") -> Iterator[str]:
    """A database URL on a fresh PostgreSQL schema (dropped afterwards) at :data:`PG_URL`."""
    schema = f"{prefix}_{uuid.uuid4().hex[:12]}"
    admin = make_engine(PG_URL)
    with admin.begin() as conn:
        conn.execute(text(f'CREATE SCHEMA "{schema}"'))
    try:
        yield f"{PG_URL}?options=-csearch_path%3D{schema}"
    finally:
        with admin.begin() as conn:
            conn.execute(text(f'DROP SCHEMA "{schema}" CASCADE'))
        admin.dispose()


@pytest.fixture(params=["sqlite", "postgresql"])
def db_url(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[str]:
    if request.param == "sqlite":
        yield f"sqlite:///{tmp_path / 'fw.db'}"
        return
    if not postgres_reachable():
        pytest.skip("PostgreSQL is not reachable at 127.0.0.1:5432 (start it to run these tests on it)")
    with postgres_schema() as url:
        yield url


@dataclass
class Api:
    client: TestClient
    tokens: dict[str, str]
    src: Path
    settings: Settings

    def h(self, who: str) -> dict[str, str]:
        return {"Authorization": f"Bearer {self.tokens[who]}"}

    def create(self, who: str = "alice", outputs: list[str] | None = None, **policy: object) -> dict:
        body = {"workspace": {"path": str(self.src)},
                "policy": {"kind": "scripted", "outputs": outputs if outputs is not None else ["hello"], **policy}}
        r = self.client.post("/v1/sessions", json=body, headers=self.h(who))
        assert r.status_code == 201, r.text
        return r.json()


@contextmanager
def make_api(db_url: str, tmp_path: Path, **settings: Any) -> Iterator[Api]:
    """A running app on ``db_url`` with users alice, bob (users) and sue (staff), and a one-file source tree."""
    src = tmp_path / "src"
    src.mkdir()
    (src / "app.py").write_text("def add(a, b):\n    return a - b\n")
    engine = make_engine(db_url)
    migrate(engine)
    log = SessionLog(engine)
    tokens = {name: log.create_token(name, role) for name, role in
              [("alice", "user"), ("bob", "user"), ("sue", "staff")]}
    engine.dispose()
    s = Settings(data_dir=tmp_path / "data", db_url=db_url, allowed_roots=[src], port=0, **settings)
    with TestClient(create_app(s)) as client:
        yield Api(client, tokens, src, s)


@pytest.fixture
def api(db_url: str, tmp_path: Path) -> Iterator[Api]:
    # semantic_search off: these tests are about the API, and indexing would load the embedder in each
    # (tests/backend/test_semantic_search_api.py runs the server with it on, as deployed)
    with make_api(db_url, tmp_path, semantic_search=False) as a:
        yield a
