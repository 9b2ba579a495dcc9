"""Settings read from ``FLYWHEEL_*`` env vars: the only place the packages read them.

* :class:`ClientSettings`: the terminal commands (``flywheel chat``, ``flywheel replay``,
  and the policy and approval mode of ``flywheel run``, and ``flywheel mcp``'s approval mode):
  ``FLYWHEEL_SERVER``, ``FLYWHEEL_TOKEN``, ``FLYWHEEL_POLICY``, ``FLYWHEEL_APPROVAL_MODE``,
  ``FLYWHEEL_MCP_APPROVAL_MODE``, each also read from the
  config file (:func:`config_path`, TOML). Command-line flags override the environment,
  which overrides the config file.
* :class:`LocalSettings`: what every driver that runs sessions on this machine shares
  (``flywheel serve``, ``flywheel run``, ``flywheel index``): the data directory, the
  search-index directory (``data_dir/index`` unless ``FLYWHEEL_INDEX_DIR``; one embedding
  cache for all three) and the unsafe no-sandbox switch.
* :class:`Settings`: the server (a :class:`LocalSettings` plus everything ``serve`` needs).

Values reach the other packages as arguments (``tools.sandbox.make_sandbox(allow_unsandboxed=)``,
``WorkspaceIndex(data_dir=)``); ``tools/``, ``embeddings/`` and ``agent/`` never read the
environment for ``FLYWHEEL_*`` themselves (``tests/test_package_rules.py`` checks).

Fail-closed rules (checked by :meth:`Settings.check_secure`):

* binding anything but a loopback address needs at least one API token in the
  database (there is no anonymous mode) and explicit allowed origins;
* session workspaces may only come from ``allowed_roots`` (by default the
  bundled demo workspace only): nobody points a session at ``/etc``;
* model servers are chosen by the operator (``openai_base_url``), never by a
  request, so the server cannot be used to reach arbitrary URLs.
"""

from __future__ import annotations

import json
import os
import tomllib
from pathlib import Path
from typing import Annotated, Any, Literal, TypeVar

from backend.net import is_loopback
from pydantic import Field, ValidationError, field_validator
from pydantic_settings import BaseSettings, InitSettingsSource, NoDecode, PydanticBaseSettingsSource, SettingsConfigDict

DEMO_WORKSPACE = Path(__file__).with_name("demo") / "workspace"
WEB_DIST = Path(__file__).resolve().parents[1] / "web" / "dist"
"""Where ``scripts/setup.sh`` (``npm ci && npm run build`` in ``web/``) puts the built web app."""
DEFAULT_HOST = "127.0.0.1"
DEFAULT_PORT = 8421
DEFAULT_SERVER = f"http://{DEFAULT_HOST}:{DEFAULT_PORT}"


MCP_SERVERS_TABLE = "mcp_servers"
"""The config file's one table: ``[mcp_servers.NAME]``, external MCP servers for ``flywheel serve``."""

ApprovalMode = Literal["ask-commands", "ask-edits", "auto"]
APPROVAL_MODES: tuple[str, ...] = ("ask-commands", "ask-edits", "auto")
"""What a session asks the user before it acts: before running a command, before editing a
file (and running a command), or nothing (``auto``, the default). Stored and passed on here;
the session enforces it."""


def config_path() -> Path:
    """The config file: ``$XDG_CONFIG_HOME/flywheel/config.toml``, else ``~/.config/flywheel/config.toml``."""
    base = os.environ.get("XDG_CONFIG_HOME") or str(Path.home() / ".config")
    return Path(base) / "flywheel" / "config.toml"


def default_data_dir() -> Path:
    """``$XDG_DATA_HOME/flywheel``, else ``~/.local/share/flywheel``."""
    base = os.environ.get("XDG_DATA_HOME") or str(Path.home() / ".local" / "share")
    return Path(base) / "flywheel"


class SettingsError(ValueError):
    """An environment variable (or override) has a value its setting refuses; the message
    names the variable and what is wrong."""


class InsecureSettings(ValueError):
    """The settings would expose the server unsafely; the message says what to change."""


class _FlywheelEnv(BaseSettings):
    model_config = SettingsConfigDict(env_prefix="FLYWHEEL_", extra="ignore")


def read_config(path: Path, allowed: set[str]) -> dict[str, Any]:
    """The config file's settings (``{}`` if there is none); :class:`SettingsError` names the
    file for a file that is not TOML or a key that is not a setting. Not guaranteed: tables
    (``[section]``) other than those in ``allowed`` are refused like unknown keys."""
    try:
        raw = path.read_bytes()
    except FileNotFoundError:
        return {}
    except OSError as exc:
        raise SettingsError(f"cannot read the config file {path}: {exc.strerror or exc}") from None
    try:
        data = tomllib.loads(raw.decode("utf-8"))
    except (tomllib.TOMLDecodeError, UnicodeDecodeError) as exc:
        raise SettingsError(f"the config file {path} is not valid TOML: {exc}") from None
    unknown = sorted(set(data) - allowed)
    if unknown:
        raise SettingsError(f"the config file {path} has unknown setting(s) {', '.join(map(repr, unknown))}; "
                            f"known: {', '.join(sorted(allowed))}")
    return data


class ClientSettings(_FlywheelEnv):
    """The terminal commands' defaults: flags override ``FLYWHEEL_*``, which override the
    config file (:func:`config_path`), which overrides the defaults here."""

    server: str = Field(DEFAULT_SERVER, description="server URL")
    token: str | None = Field(None, description="API token (`flywheel serve` prints one)")
    policy: Annotated[str | dict[str, Any] | None, NoDecode] = Field(
        None, description='default policy: "demo", "openai", "openai:MODEL", "scripted:FILE.json", or (chat) a '
        'policy object such as {kind = "openai", model = "qwen"}')
    approval_mode: ApprovalMode = Field(
        "auto", description="ask-commands (ask before running a command), ask-edits (before editing a file or "
        "running a command) or auto (never ask)")
    mcp_approval_mode: ApprovalMode = Field(
        "ask-edits", description="`flywheel mcp`: what the MCP client's user is asked before a call (the same "
        "modes; asked with MCP elicitation); auto lets the client decide")

    @field_validator("policy", mode="before")
    @classmethod
    def _policy_json(cls, value: object) -> object:
        # NoDecode: an env value stays a string (pydantic-settings would deep-merge a decoded
        # object with the config file's); one that looks like JSON is decoded here, whole.
        if isinstance(value, str) and value.lstrip().startswith("{"):
            try:
                return json.loads(value)
            except json.JSONDecodeError as exc:
                raise ValueError(f"not valid JSON: {exc}") from None
        return value

    @classmethod
    def settings_customise_sources(
        cls, settings_cls: type[BaseSettings], init_settings: PydanticBaseSettingsSource,
        env_settings: PydanticBaseSettingsSource, dotenv_settings: PydanticBaseSettingsSource,
        file_secret_settings: PydanticBaseSettingsSource,
    ) -> tuple[PydanticBaseSettingsSource, ...]:
        config = read_config(config_path(), set(cls.model_fields) | {MCP_SERVERS_TABLE})
        config.pop(MCP_SERVERS_TABLE, None)  # `flywheel serve`'s external MCP servers (backend.mcp_config)
        return init_settings, env_settings, InitSettingsSource(settings_cls, init_kwargs=config)


class LocalSettings(_FlywheelEnv):
    """What ``serve``, ``run`` and ``index`` share, so they find one data directory and one
    embedding cache by default. Not guaranteed: a flag given to one command (``--data-dir``)
    does not move the others."""

    data_dir: Path = Field(default_factory=default_data_dir, description="database, workspaces, snapshots")
    index_dir: Path | None = Field(
        None, description="search indexes and the shared embedding cache; default data_dir/index "
        "(the same place `flywheel index` and `flywheel run --semantic-search` use by default)")
    unsafe_no_sandbox: bool = Field(
        False, description="if bubblewrap is missing, run commands WITHOUT isolation instead of refusing "
        "(dangerous; FLYWHEEL_UNSAFE_NO_SANDBOX=1, or `flywheel run --unsafe-no-sandbox`)")
    sandbox_extra_ro: Annotated[list[Path], NoDecode] = Field(
        default_factory=list, description="host directories commands may read besides the system ones, "
        "e.g. a Python with pytest (FLYWHEEL_SANDBOX_EXTRA_RO, colon-separated); never scanned for secrets")

    @field_validator("sandbox_extra_ro", mode="before")
    @classmethod
    def _split_paths(cls, value: object) -> object:
        if isinstance(value, str):
            return [Path(p) for p in value.split(":") if p]
        return value

    @property
    def search_index_dir(self) -> Path:
        """Where search indexes and the embedding cache live: ``index_dir``, else ``data_dir/index``."""
        return self.index_dir or self.data_dir / "index"


class McpSettings(LocalSettings):
    """``flywheel mcp``: the token its HTTP transport requires (``FLYWHEEL_MCP_TOKEN``; one is
    made and printed when unset)."""

    mcp_token: str | None = Field(None, min_length=16, description="bearer token for `flywheel mcp --transport http`")


class Settings(LocalSettings):
    """The server's settings (``flywheel serve``), refusing unsafe exposed configurations."""

    host: str = Field(DEFAULT_HOST, description="address to bind; non-loopback needs tokens and allowed origins")
    port: int = Field(DEFAULT_PORT, ge=0, le=65535, description="TCP port (0 = pick a free one)")
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
    workspace_overlay: Literal["auto", "off"] = Field(
        "auto", description="auto: session workspaces are copy-on-write overlays where they work here (forks, "
        "branches and checkpoints cost milliseconds; unmounted at shutdown, stale mounts cleaned at start); "
        "off: plain copies (FLYWHEEL_WORKSPACE_OVERLAY=off)")
    workspace_source: Literal["in-place", "copy"] = Field(
        "in-place", description="in-place: a session opened on a directory mounts that directory itself as the "
        "read-only lower layer of its overlay (milliseconds whatever its size; the directory is never written, and "
        "its later changes to files the session has not written show through); copy: the directory is first copied "
        "into the data directory (isolated from later changes; seconds to minutes for a big tree). Without "
        "overlays a session is always a copy (FLYWHEEL_WORKSPACE_SOURCE=copy)")
    semantic_search: bool = Field(
        True, description="give sessions the semantic_search tool; each workspace is indexed in the background "
        "(embeddings cached in data_dir/index, shared by all workspaces)")
    mcp_config: Path | None = Field(
        None, description="file listing external MCP servers whose tools every session gets (JSON "
        "`{\"mcpServers\": ...}` or TOML `[mcp_servers.NAME]`); default: the `[mcp_servers]` tables of the config file")
    client_queue_events: int = Field(2048, ge=16, description="per-client buffer before a slow client is dropped")
    max_sessions_running: int = Field(256, ge=1)
    max_sockets_per_token: int = Field(32, ge=1, description="WebSockets one token may hold open at a time "
                                       "(more are refused with 429)")
    web_dist: Path = Field(WEB_DIST, description="the built web app served at / (scripts/setup.sh builds web/ there)")

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
                "Create one with `flywheel token create --name NAME --role user` (with this server's "
                "--data-dir or --db) first."
            )
        if any(o in ("*", "null") for o in self.allowed_origins):
            raise InsecureSettings(f"refusing to listen on {self.host} with a wildcard allowed origin")


S = TypeVar("S", bound="_FlywheelEnv")


def load_settings(cls: type[S], **overrides: Any) -> S:
    """``cls(**overrides)`` with the environment read, pydantic's errors turned into one
    :class:`SettingsError` that names each ``FLYWHEEL_*`` variable at fault. An override of
    None means "not given" (the environment or the default applies), as argparse leaves it."""
    overrides = {k: v for k, v in overrides.items() if v is not None}
    try:
        return cls(**overrides)
    except ValidationError as exc:
        problems = []
        for err in exc.errors():
            name = str(err["loc"][0]) if err["loc"] else "?"
            if name in overrides:
                where = f"--{name.replace('_', '-')}={err.get('input')!r}"
            elif issubclass(cls, ClientSettings) and f"FLYWHEEL_{name.upper()}" not in os.environ:
                where = f"{name}={err.get('input')!r} in {config_path()}"
            else:
                where = f"FLYWHEEL_{name.upper()}={err.get('input')!r}"
            problems.append(f"{where}: {err['msg']}")
        raise SettingsError("invalid setting: " + "; ".join(problems)) from None
