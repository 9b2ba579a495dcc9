"""Starting ``flywheel mcp`` as a real process for the MCP tests (stdio parameters, an HTTP server)."""

from __future__ import annotations

import os
import re
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from mcp import StdioServerParameters

from backend.server_process import REPO

TOKEN = "test-token-0123456789abcdef"


def child_env(**extra: str) -> dict[str, str]:
    """What the child needs: this tree first on the path, no model downloads."""
    return {"PYTHONPATH": str(REPO), "HF_HUB_OFFLINE": "1", **extra}


def flywheel_mcp_argv(workspace: Path, *args: str) -> list[str]:
    return [sys.executable, "-m", "backend.cli", "mcp", "--workspace", str(workspace), *args]


def stdio_params(workspace: Path, *args: str, **env: str) -> StdioServerParameters:
    argv = flywheel_mcp_argv(workspace, *args)
    return StdioServerParameters(command=argv[0], args=argv[1:], cwd=str(REPO), env=child_env(**env))


@dataclass
class HttpServer:
    url: str
    token: str
    process: subprocess.Popen[str]


@contextmanager
def http_server(workspace: Path, *args: str, token: str | None = TOKEN) -> Iterator[HttpServer]:
    """``flywheel mcp --transport http --port 0`` running until the block ends."""
    argv = flywheel_mcp_argv(workspace, "--transport", "http", "--port", "0", *args)
    if token is not None:
        argv += ["--token", token]
    proc = subprocess.Popen(argv, cwd=REPO, env={**os.environ, **child_env()}, stdin=subprocess.DEVNULL,
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    drain: threading.Thread | None = None
    try:
        url, shown_token, seen = None, None, []
        deadline = time.monotonic() + 60
        assert proc.stderr is not None
        while time.monotonic() < deadline and (url is None or shown_token is None):
            line = proc.stderr.readline()
            if not line:
                raise AssertionError(f"flywheel mcp exited ({proc.wait()}): {''.join(seen)}")
            seen.append(line)
            if m := re.search(r" at (http://\S+/mcp) ", line):
                url = m.group(1)
            if m := re.search(r"token: (\S+)", line):
                shown_token = m.group(1)
        assert url and shown_token, seen
        drain = threading.Thread(target=proc.stderr.read, daemon=True)  # a full pipe would block the server
        drain.start()
        yield HttpServer(url, shown_token, proc)
    finally:
        proc.terminate()
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        if drain is not None:
            drain.join(10)
        if proc.stderr is not None:
            proc.stderr.close()
