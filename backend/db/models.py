"""ORM models. Schema changes go through Alembic (``backend/migrations``).

Events are append-only: a row is never updated or deleted by the server.
"""

from __future__ import annotations

from datetime import datetime

from typing import Any

from sqlalchemy import JSON, BigInteger, Float, ForeignKey, Index, Integer, String, Text, UniqueConstraint
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
    # migration 0003: the session browser's filters (policy_label of ``policy``) and feedback counts
    policy_name: Mapped[str] = mapped_column(String(300), default="", server_default="")
    feedback_up: Mapped[int] = mapped_column(Integer, default=0, server_default="0")
    feedback_down: Mapped[int] = mapped_column(Integer, default=0, server_default="0")
    files_kept: Mapped[int] = mapped_column(Integer, default=0, server_default="0")
    files_reverted: Mapped[int] = mapped_column(Integer, default=0, server_default="0")


class EventRow(Base):
    __tablename__ = "events"

    session_id: Mapped[str] = mapped_column(String(32), ForeignKey("sessions.id"), primary_key=True)
    seq: Mapped[int] = mapped_column(Integer, primary_key=True)
    type: Mapped[str] = mapped_column(String(32))
    turn: Mapped[int] = mapped_column(Integer)
    ts: Mapped[float] = mapped_column(Float)
    body: Mapped[str] = mapped_column(Text)  # the event as JSON (agent.events)


class FeedbackRow(Base):
    """A person's feedback on a session (migration 0003): a rating of a turn (``target`` "turn",
    ``rating`` up/down) or a verdict on a file the session changed (``target`` "file", ``verdict``
    keep/revert), with an optional comment. One row per (session, what, author): giving feedback
    again replaces it; every one is also an event (``feedback``) in the session's stream."""

    __tablename__ = "feedback"
    __table_args__ = (UniqueConstraint("session_id", "key", "author", name="uq_feedback_what_who"),)

    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    session_id: Mapped[str] = mapped_column(String(32), ForeignKey("sessions.id"))
    key: Mapped[str] = mapped_column(String(80))  # "turn:N" or "file:<sha256 of the path>"
    target: Mapped[str] = mapped_column(String(8))  # "turn" | "file"
    turn: Mapped[int | None] = mapped_column(Integer, nullable=True)
    path: Mapped[str | None] = mapped_column(Text, nullable=True)
    rating: Mapped[str | None] = mapped_column(String(8), nullable=True)  # "up" | "down"
    verdict: Mapped[str | None] = mapped_column(String(8), nullable=True)  # "keep" | "revert"
    comment: Mapped[str] = mapped_column(Text, default="")
    author: Mapped[str] = mapped_column(String(200))
    seq: Mapped[int] = mapped_column(Integer)  # the feedback event that recorded it last
    created_at: Mapped[datetime] = mapped_column()
    updated_at: Mapped[datetime] = mapped_column()


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
Index("ix_sessions_created_id", SessionRow.created_at, SessionRow.id)
Index("ix_sessions_owner_created", SessionRow.owner, SessionRow.created_at, SessionRow.id)
Index("ix_sessions_policy_name", SessionRow.policy_name)
Index("ix_sessions_parent", SessionRow.parent_id)
Index("ix_feedback_created", FeedbackRow.created_at)


def policy_label(policy: dict[str, Any]) -> str:
    """The name the session browser filters by: the policy's kind, and its model if it names one
    (``openai:qwen2.5-coder``, ``scripted``, ``rl``); at most 300 characters."""
    kind = str(policy.get("kind") or "unknown")
    model = policy.get("model")
    return (f"{kind}:{model}" if isinstance(model, str) and model else kind)[:300]
