"""Domain errors and the one error body of the server API.

Code below the HTTP edge (the hub, replay, policies) raises a
:class:`DomainError` subclass that says *what* went wrong — never an HTTP
status. The edge (``backend.app``'s exception handlers) maps each class to a
status and writes :class:`ErrorBody`; so do the handlers for FastAPI's own
errors (401 from authentication, 404/405 for unknown routes, 422 for a body
or query that does not match its schema), so a client parses one shape
everywhere::

    {"detail": "no session 1234", "code": "not_found", "errors": []}

``detail`` is a one-line human message (kept under that name so clients
written for FastAPI's ``{"detail": ...}`` keep working); ``code`` is a stable
machine-readable word; ``errors`` lists the fields at fault for validation
errors (``code`` ``invalid_request``, HTTP 422) and is empty otherwise.
WebSocket errors use the same body (:func:`error_body`) inside their own
message envelope.

Not guaranteed: the wording of ``detail`` (match on ``code``), or that
``errors`` names every problem of a request (pydantic stops at some).
"""

from __future__ import annotations

from typing import Any, ClassVar

from pydantic import BaseModel, Field


class DomainError(Exception):
    """A request the backend refuses; the message is one line for the user.

    Subclasses name the kind of refusal (``code``); the HTTP status for each
    is chosen at the edge, not here."""

    code: ClassVar[str] = "error"


class InvalidRequest(DomainError):
    """The request is well-formed but asks for something impossible (400)."""

    code = "bad_request"


class Forbidden(DomainError):
    """The caller may not do this (403)."""

    code = "forbidden"


class NotFound(DomainError):
    """The thing the request names does not exist (404)."""

    code = "not_found"


class Conflict(DomainError):
    """The request conflicts with the current state, e.g. a turn is running (409)."""

    code = "conflict"


class Gone(DomainError):
    """The thing existed but its data is gone, e.g. a deleted workspace (410)."""

    code = "gone"


class FieldError(BaseModel):
    """One field a validation error points at."""

    loc: list[str | int] = Field(description="where: ('body', 'policy', 'model'), ('query', 'after'), ...")
    msg: str = Field(description="what is wrong, for a person")
    type: str = Field(description="pydantic's error type, e.g. string_too_long")


class ErrorBody(BaseModel):
    """Every error response of the server API (and WebSocket ``request_error`` messages)."""

    detail: str = Field(description="one line for a person; not a stable contract (match on code)")
    code: str = Field(description="stable machine-readable kind: bad_request, unauthorized, forbidden, not_found, "
                      "method_not_allowed, conflict, gone, invalid_request (422), too_large, internal_error, ...")
    errors: list[FieldError] = Field(default_factory=list, description="the fields at fault (422 only)")


# Codes for the statuses FastAPI and Starlette raise themselves.
STATUS_CODES: dict[int, str] = {
    400: "bad_request", 401: "unauthorized", 403: "forbidden", 404: "not_found", 405: "method_not_allowed",
    409: "conflict", 410: "gone", 413: "too_large", 422: "invalid_request", 429: "too_many_requests",
    500: "internal_error", 503: "unavailable",
}


def code_for_status(status: int) -> str:
    """The ``code`` of an error answered with HTTP ``status``."""
    return STATUS_CODES.get(status, "error" if status >= 500 else "bad_request")


def error_body(detail: str, code: str, errors: list[dict[str, Any]] | None = None) -> dict[str, Any]:
    """An :class:`ErrorBody` as a JSON object; ``detail`` is cut to its first line (at most 500 characters)."""
    line = (detail.strip().splitlines() or [""])[0][:500]
    return ErrorBody(detail=line, code=code, errors=[FieldError(**e) for e in errors or []]).model_dump(mode="json")


def field_errors(raw: list[Any]) -> list[dict[str, Any]]:
    """Pydantic/FastAPI validation errors as :class:`FieldError` dicts (the offending input is left out:
    it may be huge, e.g. a 100,000-character name, or secret)."""
    out = []
    for e in raw:
        loc = [p if isinstance(p, int) else str(p) for p in e.get("loc", ())]
        out.append({"loc": loc, "msg": str(e.get("msg", "invalid")), "type": str(e.get("type", "value_error"))})
    return out


def validation_detail(errors: list[dict[str, Any]]) -> str:
    """One line summarising validation errors: ``body.title: String should have at most 200 characters; ...``."""
    parts = [f"{'.'.join(map(str, e['loc']))}: {e['msg']}" for e in errors[:3]]
    more = f" (and {len(errors) - 3} more)" if len(errors) > 3 else ""
    return ("invalid request: " + "; ".join(parts) + more) if parts else "invalid request"
