"""Opening the server's session log from a command (``flywheel sessions``, ``flywheel token``).

The log is found as ``flywheel serve`` finds it: ``--db`` / ``FLYWHEEL_DB_URL``, else the
SQLite file in ``--data-dir`` / ``FLYWHEEL_DATA_DIR`` (:class:`backend.settings.Settings`).
Unlike ``serve``, these commands never create a database unless told to
(``create=True``): a typo in ``--data-dir`` must not leave a fresh, empty log that no
server reads. Every failure is a :class:`LogNotFound` with a one-line message.

Not guaranteed: a database that exists but belongs to another program is only told
apart by its missing ``alembic_version`` table.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from sqlalchemy import inspect
from sqlalchemy.engine import make_url
from sqlalchemy.exc import ArgumentError, SQLAlchemyError

from backend.db.engine import make_engine, migrate
from backend.db.log import SessionLog
from backend.settings import Settings, SettingsError, load_settings


class LogNotFound(Exception):
    """There is no session log where the settings point, or it cannot be opened; one-line message."""


def log_settings(*, data_dir: Path | None = None, db: str | None = None) -> Settings:
    """The server's settings with these overrides, as ``flywheel serve`` would read them."""
    try:
        return load_settings(Settings, data_dir=data_dir, db_url=db)
    except SettingsError as exc:
        raise LogNotFound(str(exc)) from None


def open_log(settings: Settings, *, create: bool = False, create_hint: str = "") -> SessionLog:
    """The session log the settings name, migrated to the newest schema.

    Without ``create``, a missing SQLite file or a database without Flywheel's schema is
    refused (``create_hint`` says how to create it anyway).
    """
    url = settings.database_url
    try:
        parsed = make_url(url)
    except ArgumentError:
        raise LogNotFound(f"not a database URL: {_safe(url)!r} (e.g. sqlite:///PATH or "
                          "postgresql+psycopg://user@host/db)") from None
    hint = f"; {create_hint}" if create_hint else ""
    if not create and parsed.get_backend_name() == "sqlite" and parsed.database not in (None, "", ":memory:"):
        path = Path(parsed.database or "")
        if not path.exists():
            raise LogNotFound(f"no session log at {path}: no server has used this data directory "
                              f"(start `flywheel serve --data-dir {path.parent}` first){hint}")
    try:
        engine = make_engine(url)
        if not create and not inspect(engine).has_table("alembic_version"):
            engine.dispose()
            raise LogNotFound(f"the database {_safe(url)} has no Flywheel session log (no server has used it){hint}")
        migrate(engine)
    except SQLAlchemyError as exc:
        orig: Any = getattr(exc, "orig", None) or exc
        raise LogNotFound(f"cannot open the session log {_safe(url)}: {str(orig).strip().splitlines()[0][:300]}") from None
    except ModuleNotFoundError as exc:
        raise LogNotFound(f"cannot open the session log {_safe(url)}: the driver {exc.name!r} is not installed") from None
    return SessionLog(engine)


def _safe(url: str) -> str:
    """The URL without its password."""
    try:
        return make_url(url).render_as_string(hide_password=True)
    except ArgumentError:
        return url.split("@")[-1]
