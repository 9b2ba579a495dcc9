"""The FastAPI application factory. No module-level app, engine or settings."""

from __future__ import annotations

import asyncio
import gc
import logging
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from typing import TYPE_CHECKING, Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException as StarletteHTTPException

from backend import errors
from backend.api import ws
from backend.api.deps import AppState
from backend.api.routes import account, browse, changes, feedback, health, replay, rl, server_info, sessions
from backend.api.security import SecurityHeaders, install_log_redaction
from backend.db.engine import make_engine, migrate
from backend.db.log import SessionInfo, SessionLog
from backend.db.writer import EventWriter
from backend.hub import Hub, HubError
from backend.policies import PolicyConfigError, PolicyFactory
from backend.run_log import run_in_progress
from backend.settings import Settings
from backend.web_app import mount_web_app
from tools.mcp_client import McpToolset
from tools.sandbox import SandboxUnavailable, make_sandbox
from tools.workspace import Workspace, WorkspaceError, WorkspaceStore

if TYPE_CHECKING:
    from tools.protocols import Workspace as WorkspaceLike

log = logging.getLogger(__name__)


def create_app(settings: Settings | None = None) -> FastAPI:
    from backend.cli_checks import quiet_third_party

    settings = settings or Settings()
    quiet_third_party()  # the embedder's imports (semantic_search) log known noise on every load

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        install_log_redaction()  # after the ASGI server configured logging: no token reaches a log line
        engine = make_engine(settings.database_url)
        await asyncio.to_thread(migrate, engine)
        session_log = SessionLog(engine)
        settings.check_secure(token_count=await asyncio.to_thread(session_log.token_count))
        store = WorkspaceStore(settings.data_dir / "workspaces",
                               overlay=None if settings.workspace_overlay == "auto" else False)
        # Mounts a killed server left (before its reaper got to them): this server owns the data
        # directory now (flywheel serve holds its lock), so they are stale. Workspaces mount again on use.
        stale = await asyncio.to_thread(store.unmount_all)
        if stale:
            log.warning("unmounted %d workspace(s) a previous server left mounted", len(stale))
        await asyncio.to_thread(store.overlay_unavailable)  # probed now, not in the first session's open
        toolset = await _external_tools(settings)
        hub = make_hub(settings, session_log, store, extra_tools=tuple(toolset.tools),
                       running_elsewhere=lambda sid: run_in_progress(settings.data_dir, sid))
        recovered = await hub.recover()
        if recovered:
            log.warning("closed %d turn(s) left open by the last shutdown", recovered)
        app.state.flywheel = AppState(settings=settings, log=session_log, hub=hub, store=store)
        try:
            yield
        finally:
            await hub.shutdown()
            await toolset.close()
            hub.writer.close()
            engine.dispose()

    app = FastAPI(
        title="Flywheel",
        version="0.1.0",
        description="Agent IDE backend: sessions, live event streams, replay. See docs/protocol.md. "
        "Every error is an ErrorBody: {detail, code, errors}. This schema (/openapi.json) and the "
        "interactive docs (/docs, /redoc) are public: they describe the API and hold no data; "
        "every /v1 route needs a bearer token.",
        lifespan=lifespan,
        responses=ERROR_RESPONSES,
    )
    install_error_handlers(app)
    app.add_middleware(SecurityHeaders)  # CSP and friends on every response; no credentials in URLs
    app.include_router(health.router)
    app.include_router(account.router)
    app.include_router(browse.router)
    app.include_router(server_info.router)
    app.include_router(rl.router)
    app.include_router(feedback.router)
    app.include_router(sessions.router)
    app.include_router(replay.router)
    app.include_router(changes.router)
    app.include_router(ws.router)
    mount_web_app(app, settings.web_dist)

    return app


def tune_gc_for_serving() -> None:
    """Keep the cyclic garbage collector from stopping every session for long.

    A full collection scans every tracked object while the event loop waits: with the
    ~130k objects startup leaves (modules, schemas, the app) one took 40-200 ms under
    load, and with the default thresholds they came every few seconds (plus ~480
    young collections per 25k events). So what is alive now moves out of its reach
    (``gc.freeze``), and young collections wait for 10,000 new objects instead of 700.
    Not guaranteed: objects created later (a module imported lazily, e.g. the
    embedder's at the first search) are scanned as usual; cyclic garbage among the
    frozen objects is never freed.
    """
    gc.collect()
    gc.freeze()
    gc.set_threshold(10_000, 10, 10)


def make_hub(settings: Settings, session_log: SessionLog, store: WorkspaceStore, *,
             workspace_view: Callable[[SessionInfo, Workspace], WorkspaceLike] | None = None,
             running_elsewhere: Callable[[str], bool] | None = None, extra_tools: tuple[Any, ...] = ()) -> Hub:
    """The hub over ``session_log`` and ``store`` as the settings configure it: the sandbox
    (none, with a warning, where it cannot run and the settings do not allow running
    unsandboxed), the event writer (close it with ``hub.writer.close()``), the search
    index pool, the policies. ``flywheel serve`` and ``flywheel acp`` both build theirs here."""
    sandbox = None
    if settings.sandbox:
        try:
            sandbox = make_sandbox(hide=[store.root, settings.data_dir], extra_ro=settings.sandbox_extra_ro,
                                   allow_unsandboxed=settings.unsafe_no_sandbox)
        except SandboxUnavailable as exc:
            log.warning("%s — run_command is disabled for this server", exc)
    indexes = None
    if settings.semantic_search:
        from embeddings.background import IndexPool

        indexes = IndexPool(settings.search_index_dir)
    return Hub(
        log_=session_log, writer=EventWriter(session_log), store=store, sandbox=sandbox,
        policies=PolicyFactory(openai_base_url=settings.openai_base_url, openai_model=settings.openai_model,
                               openai_api_key=settings.openai_api_key, openai_api=settings.openai_api),
        client_queue_events=settings.client_queue_events, indexes=indexes, workspace_view=workspace_view,
        running_elsewhere=running_elsewhere, max_sockets_per_token=settings.max_sockets_per_token,
        extra_tools=extra_tools,
    )


async def _external_tools(settings: Settings) -> McpToolset:
    """The MCP servers of ``settings.mcp_config`` (else the config file's ``[mcp_servers]``),
    connected; one that does not connect is logged and left out. A bad config stops the start."""
    from backend.mcp_config import config_file_servers, load_mcp_file, open_toolset

    configs = load_mcp_file(settings.mcp_config) if settings.mcp_config is not None else config_file_servers()
    if not configs:
        return McpToolset()
    return await open_toolset(configs, log.info, log.warning)


# Documented on every route: the error statuses any route can answer with, all one shape.
ERROR_RESPONSES: dict[int | str, dict[str, object]] = {
    401: {"model": errors.ErrorBody, "description": "no, invalid or revoked token"},
    422: {"model": errors.ErrorBody, "description": "the request does not match its schema (see errors)"},
}

# Domain error -> HTTP status: the only place these two meet.
DOMAIN_STATUS: dict[type[errors.DomainError], int] = {
    errors.InvalidRequest: 400, errors.Forbidden: 403, errors.NotFound: 404, errors.Conflict: 409, errors.Gone: 410,
}


def status_of(exc: errors.DomainError) -> int:
    """The HTTP status for a domain error: its nearest class in :data:`DOMAIN_STATUS` (400 if none)."""
    for cls in type(exc).__mro__:
        if cls in DOMAIN_STATUS:
            return DOMAIN_STATUS[cls]  # type: ignore[index]
    return 400


def _error(status: int, detail: str, code: str | None = None, *, errors_: list[dict[str, object]] | None = None,
           headers: dict[str, str] | None = None) -> JSONResponse:
    body = errors.error_body(detail, code or errors.code_for_status(status), errors_)  # type: ignore[arg-type]
    return JSONResponse(body, status_code=status, headers=headers)


def install_error_handlers(app: FastAPI) -> None:
    """Map every error to :class:`backend.errors.ErrorBody`: domain errors by class, FastAPI's own
    (401, 404/405 on unknown routes, 422 validation) by status, anything unexpected to a 500
    whose detail says nothing about the server's insides."""

    @app.exception_handler(errors.DomainError)
    async def domain_error(_: Request, exc: errors.DomainError) -> JSONResponse:
        return _error(status_of(exc), str(exc), exc.code)

    @app.exception_handler(HubError)
    async def hub_error(_: Request, exc: HubError) -> JSONResponse:
        # HubError still carries a status (backend/hub.py); it moves to DomainError subclasses.
        return _error(exc.status, str(exc))

    @app.exception_handler(PolicyConfigError)
    async def policy_error(_: Request, exc: PolicyConfigError) -> JSONResponse:
        return _error(400, str(exc), "bad_policy")

    @app.exception_handler(WorkspaceError)
    async def workspace_error(_: Request, exc: WorkspaceError) -> JSONResponse:
        return _error(410, f"the session's workspace is gone: {exc}", "gone")

    @app.exception_handler(StarletteHTTPException)
    async def http_error(request: Request, exc: StarletteHTTPException) -> JSONResponse:
        detail = exc.detail if isinstance(exc.detail, str) else str(exc.detail)
        if exc.status_code == 404 and detail == "Not Found":
            detail = f"no route {request.url.path}"
        elif exc.status_code == 405:
            detail = f"{request.method} is not allowed on {request.url.path}"
        return _error(exc.status_code, detail, headers=getattr(exc, "headers", None))

    @app.exception_handler(RequestValidationError)
    async def invalid(_: Request, exc: RequestValidationError) -> JSONResponse:
        found = errors.field_errors(list(exc.errors()))
        return _error(422, errors.validation_detail(found), "invalid_request", errors_=found)  # type: ignore[arg-type]

    @app.exception_handler(Exception)
    async def internal(_: Request, exc: Exception) -> JSONResponse:
        log.error("unhandled error", exc_info=exc)
        return _error(500, "internal server error (logged on the server)", "internal_error")
