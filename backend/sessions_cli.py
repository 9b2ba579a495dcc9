"""``flywheel sessions list|show|diff|export``: the session log, read where ``flywheel serve`` keeps it.

These read the log and the server's workspaces directly (``--data-dir`` / ``--db``, as
``serve`` takes them), so they work with the server stopped, and never create a log.
A session is named by its id or any unique prefix of it.

* ``list``: newest first, filtered by ``--kind``, ``--status``, ``--since``, ``--owner``,
  ``--run``, at most ``--limit``; ``--json`` prints one session per line.
* ``show``: the session's record, then its transcript (``--json``: the record).
* ``diff``: the session's changes as a patch ``git apply`` accepts, run in the session's
  original directory (on a terminal: shown inert; piped: the exact patch).
* ``export``: every event as JSON lines, the format of ``flywheel run --json`` (what
  ``flywheel embeddings train --events`` reads).

Not guaranteed: ``diff`` of a session whose turn is running shows the workspace as it
is at that moment; a session whose workspace was deleted (RL rollouts) has no diff.
"""

from __future__ import annotations

import argparse
import json
import re
import sys
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import TYPE_CHECKING, Any, TextIO

from agent.text_safety import escape_json_text, inert

if TYPE_CHECKING:  # the rest is imported when a command runs: `flywheel --help` stays fast
    from backend.apply_back import ChangeSet
    from backend.db.log import SessionInfo, SessionLog
    from backend.settings import Settings


class SessionsError(Exception):
    """A one-line message for the user; exit status 1."""


def _log_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--db", help="SQLAlchemy URL of the session log (default: the server's SQLite file)")
    p.add_argument("--data-dir", type=Path, help="the server's data directory (env FLYWHEEL_DATA_DIR)")


def add_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "sessions", help="list, show, diff or export recorded sessions (reads the server's log; no server needed)",
        description="Read the session log where `flywheel serve` keeps it (--data-dir / --db). A session is "
        "named by its id or a unique prefix of it.",
    )
    ssub = p.add_subparsers(dest="sessions_command", metavar="ACTION", required=True)
    ls = ssub.add_parser("list", help="sessions, newest first")
    ls.add_argument("--kind", choices=["user", "rl"], help="user sessions or RL rollouts")
    ls.add_argument("--status", choices=["idle", "running", "cancelled"])
    ls.add_argument("--since", metavar="WHEN", help="created since: 2025-01-31, 2025-01-31T12:00, or 30m / 12h / 7d ago")
    ls.add_argument("--owner", help="only this token name's sessions")
    ls.add_argument("--run", metavar="RL_RUN", help="only this RL run's rollouts")
    ls.add_argument("--limit", type=int, default=20, help="at most this many (default 20)")
    ls.add_argument("--json", action="store_true", help="one JSON object per session and line")
    _log_args(ls)
    ls.set_defaults(func=_guarded(_list))
    show = ssub.add_parser("show", help="a session's record and transcript")
    show.add_argument("session_id", metavar="ID")
    show.add_argument("--no-transcript", action="store_true", help="only the record")
    show.add_argument("--json", action="store_true", help="the record as JSON")
    _log_args(show)
    show.set_defaults(func=_guarded(_show))
    diff = ssub.add_parser("diff", help="the session's changes as a patch for `git apply`")
    diff.add_argument("session_id", metavar="ID")
    diff.add_argument("--stat", action="store_true", help="only the changed files")
    diff.add_argument("-o", "--output", type=Path, metavar="FILE", help="write the patch here instead of stdout")
    _log_args(diff)
    diff.set_defaults(func=_guarded(_diff))
    export = ssub.add_parser("export", help="every event of a session as JSON lines")
    export.add_argument("session_id", metavar="ID")
    export.add_argument("-o", "--output", type=Path, metavar="FILE", help="write here instead of stdout")
    _log_args(export)
    export.set_defaults(func=_guarded(_export))


def _guarded(fn: Callable[[argparse.Namespace], int]) -> Callable[[argparse.Namespace], int]:
    from backend.cli_checks import guarded

    def errors() -> tuple[type[BaseException], ...]:
        from backend.apply_back import ApplyError
        from backend.local_log import LogNotFound

        return SessionsError, LogNotFound, ApplyError

    return guarded("sessions", fn, errors)


def _open(args: argparse.Namespace) -> tuple[Settings, SessionLog]:
    from backend.local_log import log_settings, open_log

    settings = log_settings(data_dir=args.data_dir, db=args.db)
    return settings, open_log(settings)


def parse_since(text: str, now: datetime | None = None) -> datetime:
    """``30m`` / ``12h`` / ``7d`` / ``2w`` ago, or an ISO date or time (UTC unless it has an offset),
    as the naive UTC time the log stores."""
    now = now or datetime.now(UTC).replace(tzinfo=None)
    m = re.fullmatch(r"\s*(\d+)\s*([mhdw])\s*", text)
    if m:
        n, unit = int(m.group(1)), m.group(2)
        return now - timedelta(**{{"m": "minutes", "h": "hours", "d": "days", "w": "weeks"}[unit]: n})
    try:
        t = datetime.fromisoformat(text.strip())
    except ValueError:
        raise SessionsError(f"--since {text!r}: give a date (2025-01-31), a time (2025-01-31T12:00) "
                            "or an age (30m, 12h, 7d, 2w)") from None
    return t.astimezone(UTC).replace(tzinfo=None) if t.tzinfo is not None else t


def resolve(log: SessionLog, ref: str) -> SessionInfo:
    """The session whose id is ``ref`` or starts with it (refused if none or several)."""
    from sqlalchemy import select
    from sqlalchemy.orm import Session as DbSession

    from backend.db.models import SessionRow

    ref = ref.strip().lower()
    if not re.fullmatch(r"[0-9a-f]{1,32}", ref):
        raise SessionsError(f"{ref!r} is not a session id (hexadecimal, as `flywheel sessions list` shows)")
    with DbSession(log.engine) as db:
        ids = list(db.scalars(select(SessionRow.id).where(SessionRow.id.startswith(ref)).limit(2)))
    if not ids:
        raise SessionsError(f"no session {ref} in the log")
    if len(ids) > 1:
        raise SessionsError(f"{ref} names more than one session; give more of the id")
    info = log.get_session(ids[0])
    assert info is not None
    return info


def _when(t: datetime) -> str:
    return t.strftime("%Y-%m-%d %H:%M")


def _what(info: SessionInfo) -> str:
    if info.kind == "rl":
        reward = "-" if info.rl_reward is None else f"{info.rl_reward:g}"
        return f"rl {info.rl_run} it{info.rl_iteration} {info.rl_task} #{info.rl_sample} reward {reward}"
    src = str(info.source.get("path", ""))
    if info.source.get("kind") == "git":
        src += f"@{info.source.get('commit', 'HEAD')}"
    return f"{src}  {info.title}".rstrip() if info.title else src


def _json_line(value: Any, out: TextIO) -> None:
    out.write(escape_json_text(json.dumps(value, ensure_ascii=False, separators=(",", ":"))) + "\n")


def _list(args: argparse.Namespace) -> int:
    if args.limit < 1:
        raise SessionsError("--limit must be at least 1")
    since = parse_since(args.since) if args.since else None
    _, log = _open(args)
    rows = log.list_sessions(owner=args.owner, status=args.status, since=since, limit=args.limit, kind=args.kind,
                             rl_run=args.run)
    if args.json:
        for info in rows:
            _json_line(info.public(), sys.stdout)
        return 0
    if not rows:
        print("no sessions", file=sys.stderr)
        return 0
    print(f"{'ID':<12}  {'CREATED (UTC)':<16}  {'OWNER':<10}  {'STATUS':<9}  {'TURNS':>5}  SOURCE / TITLE")
    for info in rows:
        print(inert(f"{info.id[:12]:<12}  {_when(info.created_at):<16}  {info.owner[:10]:<10}  {info.status:<9}  "
                    f"{info.turns:>5}  {_what(info)}"))
    if len(rows) == args.limit:
        print(f"(the newest {args.limit}; --limit N for more)", file=sys.stderr)
    return 0


def _show(args: argparse.Namespace) -> int:
    _, log = _open(args)
    info = resolve(log, args.session_id)
    if args.json:
        _json_line(info.public(), sys.stdout)
        return 0
    policy = dict(info.policy)
    if policy.get("kind") == "scripted":
        policy = {"kind": "scripted", "outputs": f"{len(policy.get('outputs') or [])} recorded outputs"}
    fields = [
        ("session", info.id), ("owner", info.owner), ("kind", info.kind), ("status", info.status),
        ("created", f"{_when(info.created_at)} UTC"), ("updated", f"{_when(info.updated_at)} UTC"),
        ("source", json.dumps(info.source, ensure_ascii=False)), ("title", info.title),
        ("policy", json.dumps(policy, ensure_ascii=False)),
        ("turns", f"{info.turns} ({info.last_seq} events, {info.output_tokens} output tokens)"),
    ]
    if info.parent_id:
        fields.append(("branch of", f"{info.parent_id} at step {info.branch_step}"))
    if info.kind == "rl":
        fields.append(("rollout", _what(info) + f" ({info.rl_status})"))
    for name, value in fields:
        if value:
            print(inert(f"{name + ':':<11}{value}"))
    if not args.no_transcript:
        from backend.transcript import Transcript

        print()
        transcript = Transcript(sys.stdout)
        for event in log.all_events(info.id):
            transcript(event)
    return 0


def session_changes(settings: Settings, log: SessionLog, info: SessionInfo) -> ChangeSet:
    """The changes of a session's workspace against its starting snapshot."""
    from backend.apply_back import ChangeSet
    from tools.workspace import WorkspaceError, WorkspaceStore

    kept = info.source.get("workspace_store")  # a `flywheel run --data-dir` kept its copy there
    root = Path(kept) if isinstance(kept, str) else settings.data_dir / "workspaces"
    if not info.workspace_id:
        what = ("`flywheel run` worked on a temporary copy (its changes were shown when it ended; "
                "run with --data-dir DIR to keep one)") if info.source.get("driver") == "flywheel run" else \
            "keeps no workspace"
        raise SessionsError(f"session {info.id[:12]} has no workspace to diff: {what}")
    if not (root / "ws" / info.workspace_id).is_dir():
        raise SessionsError(f"the workspace of session {info.id[:12]} is gone (it was deleted, or the server "
                            f"keeps it under another --data-dir than {settings.data_dir})")
    try:
        workspace = WorkspaceStore(root).open(info.workspace_id)
    except WorkspaceError as exc:
        raise SessionsError(str(exc)) from None
    return ChangeSet.from_workspace(workspace)


def _diff(args: argparse.Namespace) -> int:
    settings, log = _open(args)
    info = resolve(log, args.session_id)
    changes = session_changes(settings, log, info)
    where = info.source.get("path", "the original directory")
    if changes.skipped:
        print(f"note: {len(changes.skipped)} change(s) inside .git are left out", file=sys.stderr)
    if args.stat:
        for c in changes.changes:
            print(inert(f"{c.kind:<9} {c.path}"))
        print(changes.summary(), file=sys.stderr)
        return 0
    patch = changes.patch()
    if args.output is not None:
        try:
            args.output.write_text(patch, encoding="utf-8", newline="")
        except OSError as exc:
            raise SessionsError(f"cannot write {args.output}: {exc.strerror or exc}") from None
        print(inert(f"wrote {args.output} ({changes.summary()}); apply it in {where} with: "
                    f"git apply {args.output.resolve()}"), file=sys.stderr)
        return 0
    if not changes:
        print("no changes", file=sys.stderr)
        return 0
    if sys.stdout.isatty():
        sys.stdout.write(inert(patch))  # untrusted names and contents: shown, never acted on
    else:
        sys.stdout.buffer.write(patch.encode("utf-8"))
    sys.stdout.flush()
    return 0


def _export(args: argparse.Namespace) -> int:
    from agent.events import event_to_json

    _, log = _open(args)
    info = resolve(log, args.session_id)
    try:
        out = open(args.output, "w", encoding="utf-8") if args.output is not None else sys.stdout  # noqa: SIM115
    except OSError as exc:
        raise SessionsError(f"cannot write {args.output}: {exc.strerror or exc}") from None
    try:
        n, after = 0, 0
        while page := log.events(info.id, after=after, limit=5000):
            for event in page:
                out.write(escape_json_text(event_to_json(event)) + "\n")
            n, after = n + len(page), page[-1].seq
    except OSError as exc:
        raise SessionsError(f"cannot write {args.output}: {exc.strerror or exc}") from None
    finally:
        if out is not sys.stdout:
            out.close()
    if args.output is not None:
        print(f"wrote {n} events of session {info.id} to {args.output}", file=sys.stderr)
    return 0
