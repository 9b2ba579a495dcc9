"""``flywheel run`` sessions in the local session log.

A run is recorded where ``flywheel serve`` keeps its log (``--db`` /
``FLYWHEEL_DB_URL``, else the SQLite file in ``FLYWHEEL_DATA_DIR``, by default
``~/.local/share/flywheel``; created if no server made it yet), as a session
like a server's: owner :data:`RUN_OWNER` (the name of the staff token
``flywheel serve`` creates on a loopback address), its starting snapshot (the
manifest in the log, the file bytes copied into the server's workspace store),
every event through the server's :class:`backend.db.writer.EventWriter` (each
committed before it is shown), and its status (``running``, then ``idle``). So
``flywheel sessions list|show|export`` show it with no server, and
``flywheel replay`` (a server on the same data directory) views, re-executes
and branches it. The specs of its external tools (``flywheel run --mcp``) are
kept in its ``source`` (``external_tools``), so a re-execution answers their
calls from the recording, with no server up, as for a server session.

While it runs the process holds ``DATA_DIR/runs/ID.lock`` (``flock``); a
server that starts meanwhile sees the lock (:func:`run_in_progress`) and does
not close the run's turn as one a crash left open.

Not guaranteed: the run's workspace is its own temporary copy, so the session
has none in the log (``flywheel sessions diff`` says so; messages to it over
the API answer 410: branch it to go on); with ``--data-dir`` the kept copy is
named in the session's ``source`` (``workspace_store``) and ``sessions diff``
reads it there. The starting files' bytes are copied when the turn ends: a run
killed with ``kill -9`` is listed (its open turn closed by the next server
start) but cannot be re-executed.
"""

from __future__ import annotations

import asyncio
import os
import uuid
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from agent.events import Event

if TYPE_CHECKING:
    from tools.base import ToolSpec
    from backend.db.log import SessionLog
    from backend.db.writer import EventWriter
    from backend.settings import Settings
    from tools.workspace import Workspace, WorkspaceStore

__all__ = ["RUN_OWNER", "RunRecorder", "policy_record", "run_in_progress"]

RUN_OWNER = "local"
"""The owner of ``flywheel run`` sessions (the staff token ``flywheel serve`` makes on loopback)."""
LOCK_DIR = "runs"


def _lock_path(data_dir: Path, session_id: str) -> Path:
    return data_dir / LOCK_DIR / f"{session_id}.lock"


def run_in_progress(data_dir: Path, session_id: str) -> bool:
    """Whether a ``flywheel run`` process is recording ``session_id`` now (it holds the lock)."""
    import fcntl

    try:
        fd = os.open(_lock_path(data_dir, session_id), os.O_RDONLY | os.O_CLOEXEC)
    except OSError:
        return False
    try:
        fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
    except OSError:
        return True
    finally:
        os.close(fd)
    return False


def policy_record(config: object) -> dict[str, Any]:
    """What the log keeps of a run's policy config: as a server stores one, never a URL or a key."""
    from agent.policies import LocalConfig, ScriptedConfig

    if isinstance(config, ScriptedConfig):
        return {"kind": "scripted", "outputs": list(config.outputs), "chunk_chars": config.chunk_chars,
                "delay_s": config.delay_s}
    if isinstance(config, LocalConfig):
        return {"kind": "local", "checkpoint": config.checkpoint}
    model, temperature = getattr(config, "model", "default"), getattr(config, "temperature", 0.0)
    return {"kind": "openai", "model": str(model), "temperature": float(temperature)}


@dataclass
class RunRecorder:
    """Records one ``flywheel run`` session: :meth:`start`, then the session's events
    (it is a :class:`agent.events.Sink`; put it before the display), then :meth:`finish`."""

    settings: Settings
    log: SessionLog
    session_id: str = field(default_factory=lambda: uuid.uuid4().hex)
    writer: EventWriter | None = None
    _lock: int | None = None

    @classmethod
    def open(cls, settings: Settings) -> RunRecorder:
        """The recorder for the server's log (:class:`backend.local_log.LogNotFound` if it cannot be opened)."""
        from backend.local_log import open_log

        settings.data_dir.mkdir(parents=True, exist_ok=True)
        return cls(settings, open_log(settings, create=True))

    @property
    def server_store(self) -> WorkspaceStore:
        from tools.workspace import WorkspaceStore

        return WorkspaceStore(self.settings.data_dir / "workspaces")

    def start(self, workspace: Workspace, *, title: str, source: dict[str, Any], policy: dict[str, Any],
              approval_mode: str, kept_in: Path | None, external_tools: Sequence[ToolSpec] = ()) -> None:
        """Create the session (status ``running``) and take its lock. ``external_tools``: the
        specs of the session's tools from outside (``--mcp``), kept in its ``source`` as a
        server session keeps them, so a re-execution answers their calls from the recording
        (:mod:`agent.recorded_tools`) instead of reporting unknown tools."""
        import fcntl

        from agent.recorded_tools import spec_record
        from backend.db.writer import EventWriter

        path = _lock_path(self.settings.data_dir, self.session_id)
        path.parent.mkdir(parents=True, exist_ok=True)
        self._lock = os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
        fcntl.flock(self._lock, fcntl.LOCK_EX)
        source = {**source, "driver": "flywheel run"}
        if approval_mode != "auto":
            source["approval_mode"] = approval_mode
        if kept_in is not None:
            source["workspace_store"] = str(kept_in)
        if external_tools:
            source["external_tools"] = [spec_record(spec) for spec in external_tools]
        self.log.save_snapshot(workspace.base)
        self.log.create_session(
            id=self.session_id, owner=RUN_OWNER, title=title[:200], source=source,
            workspace_id=workspace.id if kept_in is not None else "", base_snapshot=workspace.base.id, policy=policy,
        )
        self.log.set_status(self.session_id, "running")
        self.writer = EventWriter(self.log)

    async def emit(self, event: Event) -> None:
        assert self.writer is not None, "start() first"
        await self.writer.append(event)

    async def finish(self, workspace: Workspace) -> str | None:
        """Copy the starting files' bytes to the server's store, mark the session idle and
        release it; returns why it cannot be re-executed, or None."""
        from tools.snapshots import SnapshotError

        problem = None
        try:
            await asyncio.to_thread(workspace.store.blobs.wait)
            await asyncio.to_thread(self.server_store.import_snapshot, workspace.base, workspace.store.blobs)
        except (SnapshotError, OSError) as exc:
            problem = f"its starting files could not be saved for replay ({exc})"
        finally:
            if self.writer is not None:
                self.writer.close()
            self.log.set_status(self.session_id, "idle")
            self.release()
        return problem

    def release(self) -> None:
        if self._lock is not None:
            os.close(self._lock)
            self._lock = None
            _lock_path(self.settings.data_dir, self.session_id).unlink(missing_ok=True)
        self.log.engine.dispose()
