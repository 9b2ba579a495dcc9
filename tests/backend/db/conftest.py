"""A migrated SQLite session log per test."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from sqlalchemy import Engine

from backend.db.engine import make_engine, migrate


@pytest.fixture
def engine(tmp_path: Path) -> Iterator[Engine]:
    eng = make_engine(f"sqlite:///{tmp_path / 'log.db'}")
    migrate(eng)
    yield eng
    eng.dispose()
