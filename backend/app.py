"""The FastAPI application factory. No module-level app, engine or settings."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

from fastapi import FastAPI

from backend.api import ws
from backend.api.deps import AppState
from backend.api.routes import health, replay, sessions
from backend.db.engine import make_engine, migrate
from backend.db.log import EventWriter, SessionLog
from backend.hub import Hub
from backend.policies import PolicyFactory
from backend.settings import Settings
from tools.sandbox import SandboxUnavailable, make_sandbox
from tools.workspace import WorkspaceStore

log = logging.getLogger(__name__)


def create_app(settings: Settings | None = None) -> FastAPI:
    settings = settings or Settings()

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        engine = make_engine(settings.database_url)
        await asyncio.to_thread(migrate, engine)
        session_log = SessionLog(engine)
        settings.check_secure(token_count=await asyncio.to_thread(session_log.token_count))
        store = WorkspaceStore(settings.data_dir / "workspaces")
        sandbox = None
        if settings.sandbox:
            try:
                sandbox = make_sandbox(hide=[store.root, settings.data_dir], extra_ro=settings.sandbox_extra_ro,
                                       allow_unsandboxed=settings.unsafe_no_sandbox)
            except SandboxUnavailable as exc:
                log.warning("%s — run_command is disabled for this server", exc)
        writer = EventWriter(session_log)
        indexes = None
        if settings.semantic_search:
            from embeddings.background import IndexPool

            indexes = IndexPool(settings.search_index_dir)
        hub = Hub(
            log_=session_log, writer=writer, store=store, sandbox=sandbox,
            policies=PolicyFactory(openai_base_url=settings.openai_base_url, openai_model=settings.openai_model,
                                   openai_api_key=settings.openai_api_key, openai_api=settings.openai_api),
            client_queue_events=settings.client_queue_events, indexes=indexes,
        )
        recovered = await hub.recover()
        if recovered:
            log.warning("closed %d turn(s) left open by the last shutdown", recovered)
        app.state.flywheel = AppState(settings=settings, log=session_log, hub=hub, store=store)
        try:
            yield
        finally:
            await hub.shutdown()
            writer.close()
            engine.dispose()

    app = FastAPI(
        title="Flywheel",
        version="0.1.0",
        description="Agent IDE backend: sessions, live event streams, replay. See docs/protocol.md.",
        lifespan=lifespan,
    )
    app.include_router(health.router)
    app.include_router(sessions.router)
    app.include_router(replay.router)
    app.include_router(ws.router)

    return app
