"""Typed response bodies of the server API, so ``/openapi.json`` documents real shapes.

Session and event bodies allow fields this module does not list (``extra="allow"``):
a field added to :class:`backend.db.log.SessionInfo` or to an event reaches clients
at once (``tests/backend/test_contracts.py`` fails until it is documented here).
Not guaranteed: the order of keys in a body.
"""

from __future__ import annotations

import functools
import operator
from typing import Annotated, Any, Literal, get_args

from pydantic import BaseModel, ConfigDict, Field, create_model

from agent.events import Event


class Health(BaseModel):
    status: Literal["ok"] = "ok"


class Session(BaseModel):
    """A session as the API shows it (``SessionInfo.public()``)."""

    model_config = ConfigDict(extra="allow")

    id: str
    owner: str
    status: str = Field(description="idle, running or cancelled")
    title: str
    source: dict[str, Any] = Field(description='where the workspace came from: {"kind": "dir"|"git", "path", "commit"?}')
    workspace_id: str
    base_snapshot: str
    policy: dict[str, Any] = Field(description="the stored policy config (see POST /v1/sessions)")
    created_at: str = Field(description="ISO 8601, UTC (ends with Z)")
    updated_at: str = Field(description="ISO 8601, UTC (ends with Z)")
    last_seq: int = Field(description="seq of the newest event (0: none yet)")
    turns: int
    output_tokens: int
    parent_id: str | None = Field(description="the session this one was branched from")
    branch_step: int | None = Field(description="model calls of the parent re-executed before the branch continued")
    kind: str = Field("user", description="user, or rl for an RL rollout")
    rl_run: str | None = None
    rl_iteration: int | None = None
    rl_task: str | None = None
    rl_sample: int | None = None
    rl_reward: float | None = None
    rl_status: str | None = None
    policy_name: str = Field("", description='the policy\'s kind and model: "openai:MODEL", "scripted", "rl" (the '
                             "session browser's policy filter)")
    feedback_up: int = Field(0, description="turns rated thumbs-up (GET /v1/sessions/{id}/feedback lists them)")
    feedback_down: int = Field(0, description="turns rated thumbs-down")
    files_kept: int = Field(0, description="changed files marked keep")
    files_reverted: int = Field(0, description="changed files reverted to the session's start")


class EventsPage(BaseModel):
    events: list[Event] = Field(description="events with seq > after, in seq order (see docs/protocol.md)")
    next_after: int = Field(description="pass as after= for the next page")
    more: bool = Field(description="more events exist after this page")


class ChangedFile(BaseModel):
    path: str = Field(description="workspace-relative")
    kind: str = Field(description="added, modified or deleted (or another kind the workspace reports)")


class Diff(BaseModel):
    diff: str = Field(description="a unified diff of the workspace against its start")
    files: list[ChangedFile]


class Accepted(BaseModel):
    accepted: Literal[True] = True


class Interrupted(BaseModel):
    interrupted: bool = Field(description="false when no turn was running")


class Cancelled(BaseModel):
    cancelled: Literal[True] = True


class CallComparison(BaseModel):
    """One call, recorded vs re-executed (matched by call_id). Outputs and edits are given only when the
    call is not ``same``."""

    call_id: str
    name: str | None
    status: Literal["same", "differs", "missing", "extra", "recorded"] = Field(
        description="recorded: an external (MCP) tool's call, answered from the recording, not run again")
    recorded_ok: bool | None = None
    replayed_ok: bool | None = None
    recorded_output: str | None = None
    replayed_output: str | None = None
    turn: int | None = None
    step: int | None = None
    index: int | None = None
    args: dict[str, Any] | None = Field(None, description="the call's arguments (the recording's)")
    recorded_duration_ms: float | None = None
    replayed_duration_ms: float | None = None
    differs_in: list[Literal["ok", "output", "edits"]] = Field(default_factory=list)
    recorded_edits: list[str] | None = Field(None, description="the call's file_edit diffs in the recording")
    replayed_edits: list[str] | None = Field(None, description="... and in the re-execution")


class ReplayedRevert(BaseModel):
    turn: int
    path: str
    ok: bool = Field(description="false: the re-executed workspace did not have that change (see detail)")
    detail: str = ""


class ReexecuteReport(BaseModel):
    session_id: str
    counts: dict[Literal["same", "differs", "missing", "extra", "recorded"], int]
    calls: list[CallComparison]
    reverts: list[ReplayedRevert] = Field(default_factory=list, description="files the user reverted, re-applied "
                                          "after their turns")


def _timed(cls: type[BaseModel]) -> type[BaseModel]:
    return create_model(f"Timed{cls.__name__}", __base__=cls,
                        t=(float, Field(description="seconds since the session's first event")))


# An event with its time offset: each event type of agent.events, plus "t".
_EVENT_TYPES: tuple[type[BaseModel], ...] = get_args(get_args(Event)[0])
TimelineEntry = Annotated[  # type: ignore[valid-type]
    functools.reduce(operator.or_, (_timed(c) for c in _EVENT_TYPES)), Field(discriminator="type"),
]
