"""Checks that turn a command's impossible settings into one-line messages, before any work.

Each ``check_*`` raises :class:`CliCheckError` whose message is one line that
names the flag and says what to change; the command prints it after its own
prefix (``flywheel serve: ...``) and exits non-zero. Nothing here prints or
exits itself, so ``flywheel serve``, ``flywheel policy serve``, ``flywheel
embeddings train`` and ``flywheel index`` share the wording.

Not guaranteed: that a setting that passes stays good (a port free now may
be taken before the server binds it; :func:`listen` is the check that binds),
or that :func:`check_database` catches every failure a later query may hit.
"""

from __future__ import annotations

import argparse
import errno
import logging
import os
import re
import socket
import sys
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from sqlalchemy import Engine

    from backend.settings import Settings

DEFAULT_EMBEDDING_MODEL = "all-MiniLM-L6-v2"  # embeddings.embedder.DEFAULT_MODEL (bundled, works offline)


class CliCheckError(ValueError):
    """A setting a command cannot run with; the message is one line for the user."""


def one_line(exc: BaseException) -> str:
    """An exception as one short line: its first non-empty line, without SQLAlchemy's
    "(Background on this error at: ...)" and driver prefixes."""
    text = str(exc).strip()
    for line in text.splitlines():
        line = line.strip()
        if line and not line.startswith("(Background on this error"):
            if line.startswith("(") and ") " in line:  # "(psycopg.OperationalError) connection failed: ..."
                line = line.split(") ", 1)[1]
            return line[:300]
    return type(exc).__name__


def guarded(command: str, fn: Callable[[argparse.Namespace], int],
            errors: Callable[[], tuple[type[BaseException], ...]]) -> Callable[[argparse.Namespace], int]:
    """``fn`` as the action of ``flywheel COMMAND ACTION`` (the action is ``args.COMMAND_command``):
    the failures it expects — ``errors()``, imported only when one happens, so ``--help``
    stays fast — print ``flywheel COMMAND ACTION: message`` (inert) and exit 1."""
    def run(args: argparse.Namespace) -> int:
        try:
            return int(fn(args) or 0)
        except Exception as exc:
            if not isinstance(exc, errors()):
                raise
            from agent.text_safety import inert

            action = getattr(args, f"{command}_command", "")
            print(inert(f"flywheel {command} {action}: {exc}"), file=sys.stderr)
            return 1
    return run


def check_port(port: int | None, flag: str = "--port") -> None:
    """A TCP port a server can listen on: 0 (any free one) to 65535."""
    if port is not None and not 0 <= port <= 65535:
        raise CliCheckError(f"{flag} {port} is out of range: give 1-65535, or 0 for a free port")


def listen(host: str, port: int, flag: str = "--port") -> socket.socket:
    """The listening socket for ``host:port`` (see :func:`backend.net.bind_socket`), or a
    one-line :class:`CliCheckError`: port out of range, port in use, address not on this machine."""
    from backend.net import bind_socket

    check_port(port, flag)
    try:
        return bind_socket(host, port)
    except socket.gaierror as exc:
        raise CliCheckError(f"--host {host}: cannot resolve it ({exc.strerror or exc})") from None
    except OSError as exc:
        if exc.errno == errno.EADDRINUSE:
            raise CliCheckError(f"cannot listen on {host}:{port}: the port is in use (another server?); "
                                f"choose another with {flag}, or {flag} 0 for a free one") from None
        if exc.errno == errno.EADDRNOTAVAIL:
            raise CliCheckError(f"cannot listen on {host}:{port}: {host} is not an address of this machine") from None
        if exc.errno == errno.EACCES:
            raise CliCheckError(f"cannot listen on {host}:{port}: permission denied "
                                "(ports below 1024 need privileges)") from None
        raise CliCheckError(f"cannot listen on {host}:{port}: {exc.strerror or one_line(exc)}") from None


def check_device(device: str, flag: str = "--device") -> str:
    """A torch device this machine has: ``cpu``, ``cuda``/``cuda:N`` with CUDA and that
    many GPUs, ``mps`` on Apple silicon. Returns the device string."""
    import torch

    try:
        dev = torch.device(device)
    except (RuntimeError, ValueError):
        raise CliCheckError(f"{flag} {device!r} is not a torch device (e.g. cpu, cuda, cuda:1)") from None
    if dev.type == "cuda":
        if not torch.cuda.is_available():
            why = ("this torch build has no CUDA" if torch.version.cuda is None
                   else "no CUDA GPU is visible (check the driver and CUDA_VISIBLE_DEVICES)")
            raise CliCheckError(f"{flag} {device}: CUDA is not available here ({why}); use {flag} cpu")
        count = torch.cuda.device_count()
        if dev.index is not None and dev.index >= count:
            raise CliCheckError(f"{flag} {device}: this machine has {count} CUDA device(s) (cuda:0..cuda:{count - 1})")
    elif dev.type == "mps":
        if not torch.backends.mps.is_available():
            raise CliCheckError(f"{flag} {device}: MPS is not available here; use {flag} cpu")
    elif dev.type != "cpu":
        raise CliCheckError(f"{flag} {device}: only cpu, cuda and mps devices are supported")
    return device


def check_db_url(url: str, flag: str = "--db") -> None:
    """A SQLAlchemy URL whose driver is installed (no connection is made)."""
    from sqlalchemy.engine import make_url
    from sqlalchemy.exc import ArgumentError, NoSuchModuleError

    try:
        parsed = make_url(url)
    except (ArgumentError, ValueError):
        raise CliCheckError(f"{flag} {url!r} is not a database URL (e.g. sqlite:///path/flywheel.db or "
                            "postgresql+psycopg://user@host/db)") from None
    try:
        parsed.get_dialect()
    except NoSuchModuleError:
        raise CliCheckError(f"{flag}: unknown database kind {parsed.drivername!r} "
                            "(use sqlite:///... or postgresql+psycopg://...)") from None
    except ImportError as exc:
        raise CliCheckError(f"{flag}: the driver for {parsed.drivername!r} is not installed ({one_line(exc)})") from None


def _where(url: str) -> str:
    """A URL without its password, for messages."""
    from sqlalchemy.engine import make_url

    try:
        return make_url(url).render_as_string(hide_password=True)
    except Exception:  # noqa: BLE001 - only for a message
        return url.split("@")[-1]


def check_database(url: str, flag: str = "--db", *, connect_timeout_s: int = 10) -> None:
    """:func:`check_db_url`, then connect once (PostgreSQL waits at most
    ``connect_timeout_s``): an unreachable server, a wrong password or an
    unwritable SQLite path is a one-line :class:`CliCheckError`."""
    from sqlalchemy import create_engine, text
    from sqlalchemy.engine import make_url
    from sqlalchemy.exc import SQLAlchemyError

    check_db_url(url, flag)
    parsed = make_url(url)
    connect_args: dict[str, object] = {}
    if parsed.get_backend_name() == "postgresql":
        connect_args["connect_timeout"] = connect_timeout_s
    elif parsed.get_backend_name() == "sqlite" and parsed.database not in (None, "", ":memory:"):
        parent = Path(parsed.database).parent
        try:
            parent.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            raise CliCheckError(f"{flag}: cannot create {parent}: {exc.strerror or one_line(exc)}") from None
        if not os.access(parent, os.W_OK):
            raise CliCheckError(f"{flag}: cannot write to {parent} (the SQLite database lives there)")
    engine = create_engine(url, connect_args=connect_args)
    try:
        with engine.connect() as conn:
            conn.execute(text("SELECT 1"))
    except SQLAlchemyError as exc:
        raise CliCheckError(f"cannot open the database {_where(url)}: {one_line(exc)}") from None
    finally:
        engine.dispose()


def open_log_engine(url: str, flag: str = "--db") -> Engine:
    """``backend.db.engine.make_engine(url)`` migrated to the newest schema, after
    :func:`check_database`; any failure is a one-line :class:`CliCheckError`."""
    from sqlalchemy.exc import SQLAlchemyError

    from backend.db.engine import make_engine, migrate

    check_database(url, flag)
    engine = make_engine(url)
    try:
        migrate(engine)
    except SQLAlchemyError as exc:
        engine.dispose()
        raise CliCheckError(f"cannot prepare the database {_where(url)}: {one_line(exc)}") from None
    return engine


def server_settings(**overrides: object) -> Settings:
    """``flywheel serve``'s :class:`backend.settings.Settings` from its flags (None: not given)
    and the ``FLYWHEEL_*`` environment; a bad value (a port out of range, ``FLYWHEEL_PORT=abc``)
    is a one-line :class:`CliCheckError` naming the flag or variable."""
    from backend.settings import Settings, SettingsError, load_settings

    port = overrides.get("port")
    if isinstance(port, int):
        check_port(port)
    try:
        return load_settings(Settings, **overrides)
    except SettingsError as exc:
        raise CliCheckError(str(exc)) from None


def check_data_dir(path: Path, flag: str = "--data-dir") -> Path:
    """Create the data directory if needed; one line if it cannot be created or written."""
    try:
        path.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise CliCheckError(f"{flag} {path}: cannot create it ({exc.strerror or one_line(exc)})") from None
    if not os.access(path, os.W_OK | os.X_OK):
        raise CliCheckError(f"{flag} {path}: not writable")
    return path


def check_embedding_model(name: str, flag: str = "--model") -> None:
    """An embedding model that loads offline: the bundled ``all-MiniLM-L6-v2``, a local
    directory, or a model already in the Hugging Face cache (this machine downloads nothing)."""
    if name == DEFAULT_EMBEDDING_MODEL:
        return
    path = Path(name).expanduser()
    if path.is_dir():
        if not any((path / f).exists() for f in ("modules.json", "config.json")):
            raise CliCheckError(f"{flag} {name}: the directory has no modules.json or config.json "
                                "(not a sentence-transformers model)")
        return
    if path.exists():
        raise CliCheckError(f"{flag} {name}: a model is a directory, not a file")
    try:
        from huggingface_hub import try_to_load_from_cache
    except ImportError:  # pragma: no cover - sentence-transformers depends on it
        try_to_load_from_cache = None
    if try_to_load_from_cache is not None and name.count("/") <= 1:  # a hub id: NAME or OWNER/NAME
        candidates = [name] if "/" in name else [name, f"sentence-transformers/{name}"]
        for repo in candidates:
            for f in ("modules.json", "config.json"):
                try:
                    hit = try_to_load_from_cache(repo, f)
                except Exception:  # noqa: BLE001 - an invalid repo id is just "not cached"
                    hit = None
                if isinstance(hit, str):
                    return
    raise CliCheckError(f"{flag} {name}: unknown embedding model: not the bundled {DEFAULT_EMBEDDING_MODEL}, a local "
                        "model directory, or a model in the Hugging Face cache (nothing is downloaded)")


def check_file(path: Path | str, flag: str) -> Path:
    """An existing, readable file."""
    p = Path(path)
    if not p.exists():
        raise CliCheckError(f"{flag} {p}: no such file")
    if not p.is_file():
        raise CliCheckError(f"{flag} {p}: not a file")
    if not os.access(p, os.R_OK):
        raise CliCheckError(f"{flag} {p}: not readable")
    return p


def check_dir(path: Path | str, flag: str) -> Path:
    """An existing directory."""
    p = Path(path)
    if not p.is_dir():
        raise CliCheckError(f"{flag} {p}: {'not a directory' if p.exists() else 'no such directory'}")
    return p


# Log records third-party packages emit on every normal run that say nothing to a Flywheel user:
# torchao (imported by transformers, under sentence-transformers) trying to load its CUDA-only
# kernels on a CPU build, and torch's pytree deprecation note about torchao's enums.
_NOISE: dict[str, re.Pattern[str]] = {
    "torchao": re.compile(r"^Failed to load \S+\.so\b"),
    "torch.utils._pytree": re.compile(r"is an Enum subclass and is now natively supported by torch\.compile"),
}


class _DropNoise(logging.Filter):
    def __init__(self, pattern: re.Pattern[str]):
        super().__init__()
        self.pattern = pattern

    def filter(self, record: logging.LogRecord) -> bool:
        return not self.pattern.search(record.getMessage())


def quiet_third_party() -> None:
    """Drop the known third-party log lines of a normal run (see ``_NOISE``), at their
    loggers, so nothing else they log is hidden. Idempotent; call it before the import
    that triggers them (sentence-transformers, torchao). Not guaranteed: new noise from
    a newer version of those packages is not recognised."""
    for name, pattern in _NOISE.items():
        logger = logging.getLogger(name)
        if not any(isinstance(f, _DropNoise) for f in logger.filters):
            logger.addFilter(_DropNoise(pattern))
