"""ORM models. Schema changes go through Alembic (``backend/migrations``).

Events are append-only: a row is never updated or deleted by the server.
"""

from __future__ import annotations

from datetime import datetime

from sqlalchemy import JSON, BigInteger, Float, ForeignKey, Index, Integer, String, Text
from sqlalchemy.orm import DeclarativeBase, Mapped, mapped_column


class Base(DeclarativeBase):
    pass


class TokenRow(Base):
    """An API token. Only its SHA-256 is stored; the token is shown once."""

    __tablename__ = "tokens"

    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    name: Mapped[str] = mapped_column(String(200), unique=True)
    role: Mapped[str] = mapped_column(String(16))  # "user" | "staff"
    token_hash: Mapped[str] = mapped_column(String(64), unique=True)
    created_at: Mapped[datetime] = mapped_column()
    revoked: Mapped[bool] = mapped_column(default=False)


class SessionRow(Base):
    __tablename__ = "sessions"

    id: Mapped[str] = mapped_column(String(32), primary_key=True)
    owner: Mapped[str] = mapped_column(String(200), index=True)
    status: Mapped[str] = mapped_column(String(16), index=True)  # idle | running | cancelled
    title: Mapped[str] = mapped_column(String(200), default="")
    source: Mapped[dict] = mapped_column(JSON)  # {"kind": "dir"|"git", "path": ..., "commit": ...}
    workspace_id: Mapped[str] = mapped_column(String(64))
    base_snapshot: Mapped[str] = mapped_column(String(64), ForeignKey("snapshots.id"))
    policy: Mapped[dict] = mapped_column(JSON)
    created_at: Mapped[datetime] = mapped_column(index=True)
    updated_at: Mapped[datetime] = mapped_column()
    last_seq: Mapped[int] = mapped_column(Integer, default=0)
    turns: Mapped[int] = mapped_column(Integer, default=0)
    output_tokens: Mapped[int] = mapped_column(BigInteger, default=0)
    parent_id: Mapped[str | None] = mapped_column(String(32), ForeignKey("sessions.id"), nullable=True)
    branch_step: Mapped[int | None] = mapped_column(Integer, nullable=True)
    # RL rollouts (migration 0002): kind "rl" with the rollout's tags; all NULL for kind "user"
    kind: Mapped[str] = mapped_column(String(8), default="user", server_default="user")  # "user" | "rl"
    rl_run: Mapped[str | None] = mapped_column(String(64), nullable=True)
    rl_iteration: Mapped[int | None] = mapped_column(Integer, nullable=True)
    rl_task: Mapped[str | None] = mapped_column(String(200), nullable=True)
    rl_sample: Mapped[int | None] = mapped_column(Integer, nullable=True)
    rl_reward: Mapped[float | None] = mapped_column(Float, nullable=True)
    rl_status: Mapped[str | None] = mapped_column(String(16), nullable=True)  # rl.types.RolloutStatus


class EventRow(Base):
    __tablename__ = "events"

    session_id: Mapped[str] = mapped_column(String(32), ForeignKey("sessions.id"), primary_key=True)
    seq: Mapped[int] = mapped_column(Integer, primary_key=True)
    type: Mapped[str] = mapped_column(String(32))
    turn: Mapped[int] = mapped_column(Integer)
    ts: Mapped[float] = mapped_column(Float)
    body: Mapped[str] = mapped_column(Text)  # the event as JSON (agent.events)


class SnapshotRow(Base):
    """A workspace snapshot manifest; file contents live in the blob store."""

    __tablename__ = "snapshots"

    id: Mapped[str] = mapped_column(String(64), primary_key=True)
    manifest: Mapped[str] = mapped_column(Text)
    created_at: Mapped[datetime] = mapped_column()


class RlRunRow(Base):
    """One RL run (training or evaluation): its validated config and where it stands."""

    __tablename__ = "rl_runs"

    id: Mapped[str] = mapped_column(String(64), primary_key=True)
    created_at: Mapped[datetime] = mapped_column()
    config: Mapped[dict] = mapped_column(JSON)
    status: Mapped[str] = mapped_column(String(16))  # running | finished | failed
    notes: Mapped[str] = mapped_column(Text, default="")


class RlIterationRow(Base):
    """One iteration's metrics (``rl.train.metrics``) of one run."""

    __tablename__ = "rl_iterations"

    run_id: Mapped[str] = mapped_column(String(64), ForeignKey("rl_runs.id"), primary_key=True)
    iteration: Mapped[int] = mapped_column(Integer, primary_key=True)
    metrics: Mapped[dict] = mapped_column(JSON)
    created_at: Mapped[datetime] = mapped_column()


Index("ix_events_session_type", EventRow.session_id, EventRow.type)
Index("ix_sessions_kind_created", SessionRow.kind, SessionRow.created_at)
Index("ix_sessions_rl_rollout", SessionRow.rl_run, SessionRow.rl_iteration, SessionRow.rl_task, SessionRow.rl_sample)
