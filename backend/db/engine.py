"""Engine set-up (SQLite WAL by default, PostgreSQL by URL) and migrations.

SQLite gets per-connection PRAGMAs: WAL (readers never block the writer),
``synchronous=NORMAL`` (a committed transaction survives a killed process;
an OS crash may lose the last few), foreign keys on, a busy timeout.
"""

from __future__ import annotations

import socket
from pathlib import Path
from typing import Any

from alembic import command
from alembic.config import Config
from sqlalchemy import Engine, create_engine, event
from sqlalchemy.engine import make_url

MIGRATIONS = Path(__file__).resolve().parent.parent / "migrations"


def make_engine(url: str, **kwargs: Any) -> Engine:
    parsed = make_url(url)
    if parsed.get_backend_name() == "sqlite":
        if parsed.database and parsed.database != ":memory:":
            Path(parsed.database).parent.mkdir(parents=True, exist_ok=True)
        engine = create_engine(url, connect_args={"check_same_thread": False, "timeout": 30}, **kwargs)

        @event.listens_for(engine, "connect")
        def _pragmas(dbapi_conn: Any, _record: Any) -> None:
            cur = dbapi_conn.cursor()
            cur.execute("PRAGMA journal_mode=WAL")
            cur.execute("PRAGMA synchronous=NORMAL")
            cur.execute("PRAGMA foreign_keys=ON")
            cur.execute("PRAGMA busy_timeout=30000")
            cur.close()

        return engine
    kwargs.setdefault("pool_pre_ping", True)
    kwargs.setdefault("pool_size", 10)
    return create_engine(url, **kwargs)


def server_reachable(url: str, timeout: float = 1.0) -> bool:
    """Whether a database server at ``url`` accepts TCP connections (always True for SQLite).
    Tests and benchmarks use it to skip PostgreSQL where none runs; it logs in to nothing."""
    parsed = make_url(url)
    if parsed.get_backend_name() == "sqlite":
        return True
    try:
        with socket.create_connection((parsed.host or "127.0.0.1", parsed.port or 5432), timeout=timeout):
            return True
    except OSError:
        return False


def alembic_config() -> Config:
    cfg = Config()
    cfg.set_main_option("script_location", str(MIGRATIONS))
    return cfg


def migrate(engine: Engine) -> None:
    """Create or upgrade the schema to the newest migration (idempotent)."""
    cfg = alembic_config()
    with engine.begin() as conn:
        cfg.attributes["connection"] = conn
        command.upgrade(cfg, "head")
