"""API tokens in the session log: who may call the server, as which role.

A token is shown once, when it is created; the log keeps only its SHA-256
(:func:`hash_token`). :class:`TokenLog` is the part of
:class:`backend.db.log.SessionLog` that creates and checks them (the
``flywheel token`` commands list and revoke them, ``backend.tokens_cli``).

Not guaranteed: a revoked token is refused from the next check on; nothing
here closes what it already opened (a WebSocket stays open).
"""

from __future__ import annotations

import hashlib
import secrets
from dataclasses import dataclass
from datetime import UTC, datetime

from sqlalchemy import Engine, func, select
from sqlalchemy.orm import Session as DbSession

from backend.db.models import TokenRow

ROLES = ("user", "staff")


def hash_token(token: str) -> str:
    return hashlib.sha256(token.encode()).hexdigest()


@dataclass(frozen=True, slots=True)
class Principal:
    """Who is calling: a token's name (the user) and role."""

    name: str
    role: str

    @property
    def is_staff(self) -> bool:
        return self.role == "staff"


class TokenError(ValueError):
    pass


class TokenLog:
    """Token methods of the log; the class that uses it sets ``engine``."""

    engine: Engine

    def create_token(self, name: str, role: str) -> str:
        """Create a token and return it (the only time it is visible)."""
        if role not in ROLES:
            raise TokenError(f"role must be one of {', '.join(ROLES)}, not {role!r}")
        if not name or len(name) > 200:
            raise TokenError("token name must be 1-200 characters")
        token = "fw_" + secrets.token_urlsafe(32)
        created = datetime.now(UTC).replace(tzinfo=None)  # naive UTC, as every timestamp in the log
        with DbSession(self.engine) as db, db.begin():
            if db.scalar(select(TokenRow.id).where(TokenRow.name == name)) is not None:
                raise TokenError(f"a token named {name!r} already exists")
            db.add(TokenRow(name=name, role=role, token_hash=hash_token(token), created_at=created))
        return token

    def verify_token(self, token: str) -> Principal | None:
        if not token or len(token) > 200:
            return None
        with DbSession(self.engine) as db:
            row = db.scalar(select(TokenRow).where(TokenRow.token_hash == hash_token(token)))
            if row is None or row.revoked:
                return None
            return Principal(row.name, row.role)

    def token_count(self) -> int:
        with DbSession(self.engine) as db:
            return int(db.scalar(select(func.count()).select_from(TokenRow).where(~TokenRow.revoked)) or 0)
