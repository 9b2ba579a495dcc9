"""HTTP hardening that applies to every response: security headers, no tokens in URLs or logs.

:class:`SecurityHeaders` (pure ASGI middleware, so streaming and WebSocket
routes pass through untouched) adds to every HTTP response:

* ``Content-Security-Policy``: :data:`APP_CSP` -- scripts, styles, fonts,
  images and connections only from the server's own origin (``connect-src
  'self'`` covers its WebSocket), no inline scripts or ``eval``, no plugins,
  no ``<base>``, not framable. FastAPI's own API pages (``/docs``,
  ``/redoc``) get :data:`DOCS_CSP` instead: they load Swagger UI / ReDoc
  from a CDN with an inline bootstrap script, which the strict policy would
  break. They show the public schema and hold no data.
* ``X-Content-Type-Options: nosniff``, ``Referrer-Policy: no-referrer``,
  ``X-Frame-Options: DENY``, ``Cross-Origin-Opener-Policy: same-origin``;
  ``Cache-Control: no-store`` on ``/v1`` responses (they carry session data)
  unless the route set its own.

Tokens never travel in URLs: a request with a query parameter named like a
credential (:data:`TOKEN_PARAMS`) is refused with 400 ``token_in_url``
before any route runs (the browser app sends ``Authorization`` on REST and
the ``flywheel.token.<TOKEN>`` subprotocol on the WebSocket). Because the
access log still records the refused URL, :func:`install_log_redaction` puts
:class:`RedactTokens` on the server's log handlers: anything that looks like
a Flywheel token (``fw_`` and 20+ URL-safe characters) or a credential
parameter's value is replaced by ``[redacted]`` in every log line.

Not guaranteed: a token pasted into a message or a tool's output is stored in
the session log like any other text (it is data, not a credential, there);
redaction covers records that pass through the handlers present when the
server started (uvicorn's and the root logger's).
"""

from __future__ import annotations

import logging
import re
from collections.abc import Iterable
from urllib.parse import parse_qsl

from starlette.types import ASGIApp, Message, Receive, Scope, Send

from backend import errors

APP_CSP = (
    "default-src 'self'; script-src 'self'; style-src 'self'; img-src 'self' data:; font-src 'self'; "
    "connect-src 'self'; object-src 'none'; base-uri 'none'; form-action 'self'; frame-ancestors 'none'"
)
"""The policy on every response but the API docs: nothing inline, nothing from elsewhere."""
DOCS_CSP = (
    "default-src 'self'; script-src 'self' 'unsafe-inline' https://cdn.jsdelivr.net; "
    "style-src 'self' 'unsafe-inline' https://cdn.jsdelivr.net https://fonts.googleapis.com; "
    "font-src 'self' https://fonts.gstatic.com; img-src 'self' data: https://fastapi.tiangolo.com "
    "https://cdn.redoc.ly; worker-src blob:; connect-src 'self'; object-src 'none'; base-uri 'none'; "
    "frame-ancestors 'none'"
)
"""FastAPI's ``/docs`` and ``/redoc`` pages only (CDN assets and an inline bootstrap)."""
DOCS_PATHS = frozenset({"/docs", "/docs/oauth2-redirect", "/redoc"})
TOKEN_PARAMS = frozenset({"token", "access_token", "api_key", "apikey", "auth", "authorization", "bearer"})
"""Query parameter names refused anywhere: credentials do not go in URLs."""

_TOKEN_RE = re.compile(r"fw_[A-Za-z0-9_-]{20,}")
_PARAM_RE = re.compile(r"(?i)\b(" + "|".join(sorted(TOKEN_PARAMS)) + r")=([^&\s\"']+)")
REDACTED = "[redacted]"


def credential_params(query_string: bytes) -> list[str]:
    """The credential-like parameter names in a raw query string (lower-cased)."""
    names = {k.lower() for k, _ in parse_qsl(query_string.decode("latin-1"), keep_blank_values=True)}
    return sorted(names & TOKEN_PARAMS)


def security_headers(path: str) -> list[tuple[bytes, bytes]]:
    """The headers :class:`SecurityHeaders` adds to a response for ``path``."""
    csp = DOCS_CSP if path in DOCS_PATHS else APP_CSP
    out = [(b"content-security-policy", csp.encode()), (b"x-content-type-options", b"nosniff"),
           (b"referrer-policy", b"no-referrer"), (b"x-frame-options", b"DENY"),
           (b"cross-origin-opener-policy", b"same-origin")]
    if path.startswith("/v1/"):
        out.append((b"cache-control", b"no-store"))
    return out


class SecurityHeaders:
    """Adds :func:`security_headers` to every HTTP response (a header the app set itself wins)
    and refuses credentials in the query string (HTTP 400; a WebSocket handshake is refused by
    its route, ``backend.api.ws``, with the same status)."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        path: str = scope.get("path", "")
        extra = security_headers(path)
        found = credential_params(scope.get("query_string", b""))
        if found:
            await _refuse(send, extra, found)
            return

        async def send_with_headers(message: Message) -> None:
            if message["type"] == "http.response.start":
                have = {k.lower() for k, _ in message.get("headers", [])}
                message = {**message, "headers": [*message.get("headers", []),
                                                  *((k, v) for k, v in extra if k not in have)]}
            await send(message)

        await self.app(scope, receive, send_with_headers)


def token_in_url_detail(names: Iterable[str]) -> str:
    return (f"credentials do not go in URLs (query parameter {', '.join(names)}): send "
            "'Authorization: Bearer <token>' (WebSocket: the subprotocol flywheel.token.<token>)")


async def _refuse(send: Send, headers: list[tuple[bytes, bytes]], names: list[str]) -> None:
    import json

    body = json.dumps(errors.error_body(token_in_url_detail(names), "token_in_url")).encode()
    await send({"type": "http.response.start", "status": 400,
                "headers": [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode()),
                            *headers]})
    await send({"type": "http.response.body", "body": body})


def redact(text: str) -> str:
    """``text`` with Flywheel tokens and credential parameter values replaced by ``[redacted]``."""
    return _PARAM_RE.sub(lambda m: f"{m.group(1)}={REDACTED}", _TOKEN_RE.sub(REDACTED, text))


class RedactTokens(logging.Filter):
    """A log filter that redacts a record's message and string arguments (:func:`redact`); never drops one."""

    def filter(self, record: logging.LogRecord) -> bool:
        # message and arguments redacted one by one, so formatters that read ``args``
        # (uvicorn's access log does) keep working
        if isinstance(record.msg, str):
            record.msg = redact(record.msg)
        if isinstance(record.args, tuple):
            record.args = tuple(redact(a) if isinstance(a, str) else a for a in record.args)
        elif isinstance(record.args, dict):
            record.args = {k: redact(v) if isinstance(v, str) else v for k, v in record.args.items()}
        return True


_FILTER = RedactTokens()
LOGGERS = ("", "uvicorn", "uvicorn.error", "uvicorn.access", "fastapi", "backend", "agent")


def install_log_redaction() -> None:
    """Put :class:`RedactTokens` on the server's loggers and their handlers (idempotent).
    Call after the ASGI server configured logging (the app's startup does)."""
    for name in LOGGERS:
        logger = logging.getLogger(name)
        if _FILTER not in logger.filters:
            logger.addFilter(_FILTER)
        for handler in logger.handlers:
            if _FILTER not in handler.filters:
                handler.addFilter(_FILTER)
