"""RL rollouts in the production session log (:class:`rl.rollout.log.RolloutLog` over :class:`SessionLog`).

Each rollout becomes a session like a user's: its starting snapshot is saved
the way the hub saves one (manifest in the database, file bytes in the
server's :class:`~tools.workspace.WorkspaceStore`), its events go through
the log's :class:`~backend.db.writer.EventStore` (the synchronous core of the
server's ``EventWriter``: same retries, same stand-ins for a bad event) with
the ``seq`` the worker gave them, and the session is tagged ``kind="rl"``
with its run, iteration, task, sample index, reward and status. So
``flywheel replay``, ``GET /v1/sessions/{id}/timeline`` and ``POST
.../reexecute`` open a rollout unchanged, and ``GET /v1/sessions?kind=rl&run=ID``
lists a run's rollouts (staff: rollouts belong to the RL owner, ``rl`` by
default). Runs and per-iteration metrics go to ``rl_runs``/``rl_iterations``.

Only ``backend/rl_cli.py`` (an entry point) constructs this and hands it to
``rl`` code, which sees only the protocol (``rl/`` never imports ``backend/``).

The starting workspace's file bytes are copied from the worker's blob store
(``Rollout.blob_root``) into the server's, streamed and hash-checked. Not
guaranteed: on a multi-node Ray cluster that directory must be reachable from
the process that records the rollouts (shared storage); otherwise recording
fails with :class:`RolloutLogError` naming the missing blob, rather than
recording a rollout that cannot be re-executed. Recording is not atomic
across the three calls of :func:`rl.rollout.log.persist`: a process killed
between them leaves a session with some of its events and no reward
(``rl_status`` NULL), which listings show as unfinished.
"""

from __future__ import annotations

import json
import re
import uuid
from pathlib import Path
from typing import TYPE_CHECKING, Any

from sqlalchemy import select
from sqlalchemy.orm import Session as DbSession

from agent.events import Event, event_from_json
from backend.db.log import SessionLog, now
from backend.db.writer import EventStore
from backend.db.models import RlIterationRow, RlRunRow
from tools.blobs import BlobStore
from tools.snapshots import Snapshot, SnapshotError
from tools.workspace import MissingBlob, WorkspaceStore

if TYPE_CHECKING:
    from backend.settings import Settings

__all__ = ["RL_OWNER", "RLSessionLog", "RolloutLogError", "open_rollout_log"]

RL_OWNER = "rl"
"""The default owner of rollout sessions (staff see them; users do not)."""
MAX_SESSION_ID = 32  # sessions.id is VARCHAR(32)
_RUN_ID = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,63}")
_STATUSES = ("finished", "limit", "policy_error", "infra_error")  # rl.types.RolloutStatus values


class RolloutLogError(ValueError):
    """A rollout (or run) that cannot be recorded as given; the message says what is wrong."""


class RLSessionLog:
    """Records rollouts, runs and iterations in the session log.

    ``store`` is the server's workspace store (``data_dir/workspaces``): the
    one ``POST /v1/sessions/{id}/reexecute`` restores starting workspaces from.
    """

    def __init__(self, log: SessionLog, store: WorkspaceStore, *, owner: str = RL_OWNER) -> None:
        if not owner or len(owner) > 200:
            raise RolloutLogError("the RL owner must be 1-200 characters")
        self.log, self.store, self.owner = log, store, owner
        self.events = EventStore(log)

    # -- rollouts (the RolloutLog protocol) --------------------------------------

    def create_session(self, *, session_id: str, run_id: str, iteration: int, task_id: str, sample: int,
                       base_snapshot: str = "", blob_root: str = "") -> None:
        """Save the starting snapshot (manifest and bytes) and open the tagged session."""
        if not 1 <= len(session_id) <= MAX_SESSION_ID:
            raise RolloutLogError(f"rollout session id {session_id!r} is {len(session_id)} characters; the log's "
                                  f"session ids are 1-{MAX_SESSION_ID} (put run/task/sample in the tags)")
        if len(task_id) > 200 or len(run_id) > 64:
            raise RolloutLogError(f"task id ({len(task_id)} chars, max 200) or run id ({len(run_id)}, max 64) "
                                  "too long")
        snapshot = self._import_snapshot(session_id, base_snapshot, blob_root)
        self.log.save_snapshot(snapshot)
        self.log.create_session(
            id=session_id, owner=self.owner, title=f"rl {run_id} iter {iteration} {task_id} #{sample}"[:200],
            source={"kind": "rl", "task": task_id}, workspace_id="", base_snapshot=snapshot.id,
            policy={"kind": "rl"}, kind="rl", rl_run=run_id, rl_iteration=iteration, rl_task=task_id,
            rl_sample=sample,
        )

    def append_events(self, session_id: str, events: list[dict[str, Any]]) -> None:
        """Parse the worker's JSON events (their ``seq`` kept) and commit them in one batch.

        Raises :class:`RolloutLogError` for an event that does not parse, belongs to
        another session or breaks ``seq`` order, before anything is written."""
        parsed: list[Event] = []
        last = 0
        for i, obj in enumerate(events):
            try:
                event = event_from_json(json.dumps(obj))
            except ValueError as exc:  # pydantic.ValidationError is a ValueError
                raise RolloutLogError(f"event {i} of rollout {session_id} is not a valid event: "
                                      f"{str(exc)[:500]}") from None
            if event.session_id != session_id:
                raise RolloutLogError(f"event {i} (seq {event.seq}) belongs to session {event.session_id!r}, "
                                      f"not {session_id!r}")
            if event.seq <= last:
                raise RolloutLogError(f"event {i} of rollout {session_id} has seq {event.seq} after seq {last}: "
                                      "events must come in increasing seq order")
            last = event.seq
            parsed.append(event)
        self.events.store(parsed)

    def finish(self, session_id: str, *, reward: float | None, status: str) -> None:
        if status not in _STATUSES:
            raise RolloutLogError(f"rollout status {status!r} is not one of {', '.join(_STATUSES)}")
        self.log.set_rl_outcome(session_id, reward=reward, status=status)

    # -- runs and iterations -------------------------------------------------------

    def record_run(self, config: dict[str, Any], *, run_id: str | None = None, notes: str = "") -> str:
        """Record a run (status ``running``) with its config; return its id (a new one if not given).

        Raises :class:`RolloutLogError` if the id is malformed or already recorded
        (a resumed run keeps its row: check with :meth:`get_run` first)."""
        run_id = run_id or uuid.uuid4().hex[:16]
        if not _RUN_ID.fullmatch(run_id):
            raise RolloutLogError(f"run id {run_id!r}: use 1-64 letters, digits, '.', '_' or '-'")
        with DbSession(self.log.engine) as db, db.begin():
            if db.get(RlRunRow, run_id) is not None:
                raise RolloutLogError(f"RL run {run_id!r} is already recorded")
            db.add(RlRunRow(id=run_id, created_at=now(), config=_json_value(config, "config"), status="running",
                            notes=notes))
        return run_id

    def set_run_status(self, run_id: str, status: str, *, notes: str | None = None) -> None:
        with DbSession(self.log.engine) as db, db.begin():
            row = db.get(RlRunRow, run_id)
            if row is None:
                raise RolloutLogError(f"no RL run {run_id!r} in the log")
            row.status = status[:16]
            if notes is not None:
                row.notes = notes

    def get_run(self, run_id: str) -> dict[str, Any] | None:
        with DbSession(self.log.engine) as db:
            row = db.get(RlRunRow, run_id)
            if row is None:
                return None
            return {"id": row.id, "created_at": row.created_at.isoformat() + "Z", "config": row.config,
                    "status": row.status, "notes": row.notes}

    def record_iteration(self, run_id: str, iteration: int, metrics: dict[str, Any]) -> None:
        """Record one iteration's metrics; a resumed run that repeats an iteration replaces its row."""
        value = _json_value(metrics, "metrics")
        with DbSession(self.log.engine) as db, db.begin():
            if db.get(RlRunRow, run_id) is None:
                raise RolloutLogError(f"no RL run {run_id!r} in the log: record_run before its iterations")
            row = db.get(RlIterationRow, (run_id, iteration))
            if row is None:
                db.add(RlIterationRow(run_id=run_id, iteration=iteration, metrics=value, created_at=now()))
            else:
                row.metrics, row.created_at = value, now()

    def iterations(self, run_id: str) -> list[tuple[int, dict[str, Any]]]:
        q = select(RlIterationRow).where(RlIterationRow.run_id == run_id).order_by(RlIterationRow.iteration)
        with DbSession(self.log.engine) as db:
            return [(r.iteration, r.metrics) for r in db.scalars(q)]

    # -- the starting workspace ----------------------------------------------------

    def _import_snapshot(self, session_id: str, manifest: str, blob_root: str) -> Snapshot:
        """The rollout's base snapshot, with every file's bytes in the server's store.

        No manifest (the fork failed): the empty snapshot, so the session still opens."""
        if not manifest:
            snapshot = Snapshot.from_manifest({})
            self.store.save_snapshot(snapshot)
            return snapshot
        try:
            snapshot = Snapshot.from_json(manifest.encode())
        except (SnapshotError, ValueError, KeyError, TypeError) as exc:
            raise RolloutLogError(f"rollout {session_id}: its base snapshot is not a valid manifest: {exc}") from None
        source = BlobStore(Path(blob_root)) if blob_root else None
        try:
            self.store.import_snapshot(snapshot, source)
        except MissingBlob as exc:
            raise RolloutLogError(
                f"rollout {session_id}: the bytes of {exc.path!r} (blob {exc.sha256}) are in neither the "
                f"server's store nor the worker's ({blob_root or 'not given'}); on a cluster, put the "
                "workers' store_root on storage this process can read") from None
        except SnapshotError as exc:
            raise RolloutLogError(f"rollout {session_id}: copying its starting workspace failed: {exc}") from None
        return snapshot


def open_rollout_log(settings: Settings | None = None, *, owner: str = RL_OWNER) -> RLSessionLog:
    """The server's session log and workspace store (``flywheel serve``'s settings: ``FLYWHEEL_DB_URL``
    or the SQLite file in the data directory, migrated to the newest schema), as a rollout log."""
    from backend.db.engine import make_engine, migrate
    from backend.settings import Settings, load_settings

    s = settings if settings is not None else load_settings(Settings)
    engine = make_engine(s.database_url)
    migrate(engine)
    return RLSessionLog(SessionLog(engine), WorkspaceStore(s.data_dir / "workspaces"), owner=owner)


def _json_value(value: dict[str, Any], what: str) -> dict[str, Any]:
    """``value`` as stored JSON: refuse what JSON cannot hold (NaN, objects) with a clear error."""
    try:
        return json.loads(json.dumps(value, allow_nan=False))  # type: ignore[no-any-return]
    except (TypeError, ValueError) as exc:
        raise RolloutLogError(f"the run's {what} is not JSON (NaN/inf or a non-JSON value): {exc}") from None
