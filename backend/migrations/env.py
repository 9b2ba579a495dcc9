"""Alembic environment: always run with a connection handed in by backend.db.engine.migrate."""

from __future__ import annotations

from alembic import context

from backend.db.models import Base

connection = context.config.attributes.get("connection")
if connection is None:
    raise RuntimeError("run migrations through backend.db.engine.migrate(engine)")
context.configure(connection=connection, target_metadata=Base.metadata, render_as_batch=True)
with context.begin_transaction():
    context.run_migrations()
