"""``flywheel token create|list|revoke``: the API tokens in the server's session log.

Tokens are stored hashed: ``create`` prints a new token once; ``list`` shows names,
roles and dates, never a token. ``revoke`` takes effect on the next request a running
server checks. Not guaranteed: a WebSocket already open with a revoked token stays open
until it closes.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Callable
from pathlib import Path

from agent.text_safety import inert


def add_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("token", help="manage API tokens (create, list, revoke)")
    tsub = p.add_subparsers(dest="token_command", metavar="ACTION", required=True)
    c = tsub.add_parser("create", help="create a token (printed once; stored hashed)")
    c.add_argument("--name", required=True)
    c.add_argument("--role", choices=["user", "staff"], default="user")
    c.add_argument("--create-db", action="store_true",
                   help="create the database if it does not exist yet (by default a missing one is refused: "
                   "no server would read it)")
    _log_args(c)
    c.set_defaults(func=_guarded(_create))
    ls = tsub.add_parser("list", help="token names, roles and dates (never the tokens)")
    ls.add_argument("--json", action="store_true", help="one JSON object per token and line")
    _log_args(ls)
    ls.set_defaults(func=_guarded(_list))
    r = tsub.add_parser("revoke", help="revoke a token by name (a running server refuses it at once)")
    r.add_argument("name")
    _log_args(r)
    r.set_defaults(func=_guarded(_revoke))


def _log_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--db", help="SQLAlchemy URL (default: the server's SQLite file)")
    p.add_argument("--data-dir", type=Path, help="the server's data directory (env FLYWHEEL_DATA_DIR)")


class _Refused(Exception):
    pass


def _guarded(fn: Callable[[argparse.Namespace], int]) -> Callable[[argparse.Namespace], int]:
    from backend.cli_checks import guarded

    def errors() -> tuple[type[BaseException], ...]:
        from backend.db.log import TokenError
        from backend.local_log import LogNotFound

        return LogNotFound, TokenError, _Refused

    return guarded("token", fn, errors)


def _create(args: argparse.Namespace) -> int:
    from backend.local_log import log_settings, open_log

    log = open_log(log_settings(data_dir=args.data_dir, db=args.db), create=args.create_db,
                   create_hint="pass --create-db to create it anyway")
    token = log.create_token(args.name, args.role)
    print(token)
    print(f"(token for {args.name!r}, role {args.role}; it is shown only now)", file=sys.stderr)
    return 0


def _list(args: argparse.Namespace) -> int:
    from sqlalchemy import select
    from sqlalchemy.orm import Session as DbSession

    from backend.db.models import TokenRow
    from backend.local_log import log_settings, open_log

    log = open_log(log_settings(data_dir=args.data_dir, db=args.db))
    with DbSession(log.engine) as db:
        rows = list(db.scalars(select(TokenRow).order_by(TokenRow.created_at, TokenRow.id)))
    if args.json:
        for t in rows:
            print(json.dumps({"name": t.name, "role": t.role, "created_at": t.created_at.isoformat() + "Z",
                              "revoked": t.revoked}))
        return 0
    if not rows:
        print("no tokens", file=sys.stderr)
        return 0
    print(f"{'NAME':<24}  {'ROLE':<5}  {'CREATED (UTC)':<16}  STATE")
    for t in rows:
        print(inert(f"{t.name:<24}  {t.role:<5}  {t.created_at.strftime('%Y-%m-%d %H:%M'):<16}  "
                    f"{'revoked' if t.revoked else 'active'}"))
    return 0


def _revoke(args: argparse.Namespace) -> int:
    from sqlalchemy import select, update
    from sqlalchemy.orm import Session as DbSession

    from backend.db.models import TokenRow
    from backend.local_log import log_settings, open_log

    log = open_log(log_settings(data_dir=args.data_dir, db=args.db))
    with DbSession(log.engine) as db, db.begin():
        row = db.scalar(select(TokenRow).where(TokenRow.name == args.name))
        if row is None:
            raise _Refused(f"no token named {args.name!r} (see `flywheel token list`)")
        if row.revoked:
            raise _Refused(f"the token {args.name!r} is already revoked")
        db.execute(update(TokenRow).where(TokenRow.id == row.id).values(revoked=True))
    print(f"revoked the token {args.name!r}", file=sys.stderr)
    return 0
