"""Helpers for the ACP tests: a temporary project, scripted model outputs, and a
client built on the ``agent-client-protocol`` package's client side that spawns
``flywheel acp`` as an editor does."""

from __future__ import annotations

import asyncio
import json
import os
import sys
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
from acp import spawn_agent_process
from acp.schema import (
    AllowedOutcome,
    ClientCapabilities,
    DeniedOutcome,
    FileSystemCapabilities,
    ReadTextFileResponse,
    RequestPermissionResponse,
    WriteTextFileResponse,
)

ROOT = Path(__file__).resolve().parents[3]

CALC = "def add(a, b):\n    return a - b\n"

STARTUP_TIMEOUT_S = 120
"""How long ``flywheel acp`` may take to start and answer ``initialize``: its imports take
seconds, and minutes of wall time on a machine busy with other work (tests run niced)."""


def call(name: str, **params: str) -> str:
    """One tool call in the model's XML format."""
    body = "".join(f'<param name="{k}">{v}</param>\n' for k, v in params.items())
    return f'<tool_call name="{name}">\n{body}</tool_call>'


FIX = [
    "Reading it.\n\n" + call("read_file", path="calc.py"),
    "Fixing.\n\n" + call("edit_file", path="calc.py", search="    return a - b\n", replace="    return a + b\n"),
    "Checking.\n\n" + call("run_command", command="python3 -c 'import calc; print(calc.add(2, 3))'"),
    "Done: add() now adds.",
]
"""The scripted fix: a read, an edit, a command, a closing message."""


@pytest.fixture
def project(tmp_path: Path) -> Path:
    root = tmp_path / "project"
    root.mkdir()
    (root / "calc.py").write_text(CALC)
    (root / "notes.txt").write_text("notes\n")
    (tmp_path / "outside.txt").write_text("secret\n")
    return root


def script(tmp_path: Path, outputs: list[str], name: str = "script.json") -> Path:
    path = tmp_path / name
    path.write_text(json.dumps({"outputs": outputs}))
    return path


@dataclass
class EditorClient:
    """An editor: records every update and request. ``buffers`` are unsaved buffer
    texts by absolute path (reads see them); writes land on disk and in ``writes``.
    ``answer``: the permission option to pick (``allow_once``, ``allow_always``,
    ``reject_once``), ``cancelled``, or ``never`` (the answer never comes)."""

    answer: str = "allow_once"
    fs: bool = True
    write_delay_s: float = 0.0
    updates: list[dict[str, Any]] = field(default_factory=list)
    permissions: list[dict[str, Any]] = field(default_factory=list)
    reads: list[str] = field(default_factory=list)
    writes: list[tuple[str, str]] = field(default_factory=list)
    buffers: dict[str, str] = field(default_factory=dict)
    seen: asyncio.Event = field(default_factory=asyncio.Event)
    wait_for: Any = None  # a predicate on an update; ``seen`` is set when one matches

    async def session_update(self, session_id: str, update: Any, **kwargs: Any) -> None:
        data = update.model_dump(by_alias=True, exclude_none=True, mode="json")
        self.updates.append(data)
        if self.wait_for is not None and self.wait_for(data):
            self.seen.set()

    async def request_permission(self, session_id: str, tool_call: Any, options: list[Any], **kwargs: Any) -> Any:
        self.permissions.append(tool_call.model_dump(by_alias=True, exclude_none=True, mode="json"))
        if self.answer == "never":
            await asyncio.Event().wait()
        if self.answer == "cancelled":
            return RequestPermissionResponse(outcome=DeniedOutcome(outcome="cancelled"))
        assert self.answer in {o.option_id for o in options}
        return RequestPermissionResponse(outcome=AllowedOutcome(outcome="selected", option_id=self.answer))

    async def read_text_file(self, session_id: str, path: str, line: int | None = None, limit: int | None = None,
                             **kwargs: Any) -> ReadTextFileResponse:
        self.reads.append(path)
        if path in self.buffers:
            return ReadTextFileResponse(content=self.buffers[path])
        return ReadTextFileResponse(content=Path(path).read_text())

    async def write_text_file(self, session_id: str, path: str, content: str, **kwargs: Any) -> WriteTextFileResponse:
        await asyncio.sleep(self.write_delay_s)
        self.writes.append((path, content))
        self.buffers.pop(path, None)
        Path(path).write_text(content)
        return WriteTextFileResponse()

    def of(self, kind: str) -> list[dict[str, Any]]:
        return [u for u in self.updates if u["sessionUpdate"] == kind]

    def text(self) -> str:
        return "".join(u["content"]["text"] for u in self.of("agent_message_chunk"))

    def call_updates(self, call_id: str) -> list[dict[str, Any]]:
        return [u for u in self.updates if u.get("toolCallId") == call_id]


def agent_env() -> dict[str, str]:
    env = dict(os.environ)
    env["PYTHONPATH"] = str(ROOT) + os.pathsep + env.get("PYTHONPATH", "")
    env["FLYWHEEL_SEMANTIC_SEARCH"] = "0"
    return env


def agent_command(data_dir: Path, *args: str) -> list[str]:
    return [sys.executable, "-m", "backend.cli", "acp", "--data-dir", str(data_dir), *args]


@asynccontextmanager
async def running_agent(client: EditorClient, data_dir: Path, *args: str) -> AsyncIterator[Any]:
    """``flywheel acp`` spawned as an editor spawns it, initialised; yields the connection."""
    cmd = agent_command(data_dir, *args)
    async with spawn_agent_process(client, cmd[0], *cmd[1:], env=agent_env()) as (conn, proc):
        fs = FileSystemCapabilities(read_text_file=client.fs, write_text_file=client.fs)
        await asyncio.wait_for(conn.initialize(protocol_version=1, client_capabilities=ClientCapabilities(fs=fs)),
                               STARTUP_TIMEOUT_S)
        conn.process = proc
        yield conn
