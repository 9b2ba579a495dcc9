"""Server settings: one documented class, read from ``FLYWHEEL_*`` env vars.

Fail-closed rules (checked by :meth:`Settings.check_secure`):

* binding anything but a loopback address needs at least one API token in the
  database (there is no anonymous mode) and explicit allowed origins;
* session workspaces may only come from ``allowed_roots`` (by default the
  bundled demo workspace only): nobody points a session at ``/etc``;
* model servers are chosen by the operator (``openai_base_url``), never by a
  request, so the server cannot be used to reach arbitrary URLs.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Literal

from backend.net import is_loopback
from pydantic import Field, field_validator
from pydantic_settings import BaseSettings, SettingsConfigDict

DEMO_WORKSPACE = Path(__file__).with_name("demo") / "workspace"


def default_data_dir() -> Path:
    base = os.environ.get("XDG_DATA_HOME") or str(Path.home() / ".local" / "share")
    return Path(base) / "flywheel"


class InsecureSettings(ValueError):
    """The settings would expose the server unsafely; the message says what to change."""


class Settings(BaseSettings):
    model_config = SettingsConfigDict(env_prefix="FLYWHEEL_", extra="ignore")

    host: str = Field("127.0.0.1", description="address to bind; non-loopback needs tokens and allowed origins")
    port: int = Field(8421, ge=0, le=65535, description="TCP port (0 = pick a free one)")
    data_dir: Path = Field(default_factory=default_data_dir, description="database, workspaces, snapshots")
    db_url: str | None = Field(None, description="SQLAlchemy URL; default: SQLite file in data_dir")
    allowed_roots: list[Path] = Field(
        default_factory=lambda: [DEMO_WORKSPACE],
        description="directories (and git repos) sessions may copy their workspace from",
    )
    allowed_origins: list[str] = Field(
        default_factory=lambda: ["http://127.0.0.1", "http://localhost"],
        description="browser Origins allowed on the WebSocket (any port on these hosts)",
    )
    openai_base_url: str | None = Field(None, description="OpenAI-compatible server for policy 'openai'")
    openai_model: str = "default"
    openai_api_key: str | None = None
    openai_api: Literal["chat", "completions"] = Field(
        "chat", description="'completions' sends the runtime's own rendered prompt (use with `flywheel policy serve`)"
    )
    sandbox: bool = Field(True, description="run commands under bubblewrap; False refuses run_command")
    index_dir: Path | None = Field(
        None, description="search indexes and the shared embedding cache; default data_dir/index "
        "(the same place `flywheel index` uses by default)")
    semantic_search: bool = Field(
        True, description="give sessions the semantic_search tool; each workspace is indexed in the background "
        "(embeddings cached in data_dir/index, shared by all workspaces)")
    client_queue_events: int = Field(2048, ge=16, description="per-client buffer before a slow client is dropped")
    max_sessions_running: int = Field(256, ge=1)

    @field_validator("allowed_roots", mode="after")
    @classmethod
    def _resolve_roots(cls, roots: list[Path]) -> list[Path]:
        return [Path(os.path.realpath(r)) for r in roots]

    @property
    def database_url(self) -> str:
        if self.db_url:
            return self.db_url
        return f"sqlite:///{self.data_dir / 'flywheel.db'}"

    @property
    def is_loopback(self) -> bool:
        return is_loopback(self.host)

    def check_secure(self, *, token_count: int) -> None:
        """Raise :class:`InsecureSettings` for an unsafe exposed configuration."""
        if self.is_loopback:
            return
        if token_count == 0:
            raise InsecureSettings(
                f"refusing to listen on {self.host}: no API token exists. "
                "Create one with `flywheel token create --name NAME --role user` first."
            )
        if any(o in ("*", "null") for o in self.allowed_origins):
            raise InsecureSettings(f"refusing to listen on {self.host} with a wildcard allowed origin")
