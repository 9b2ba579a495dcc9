"""Shared by the server benchmarks (load, crash): a real ``flywheel serve``
subprocess, a tiny workspace, REST helpers and scripted model outputs.

The server runs as its own process (``python -m backend.cli serve``), exactly
as an operator starts it; the benchmark talks to it over HTTP/WebSocket only.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import httpx

from _common import ROOT  # noqa: F401  (puts the repo on sys.path)

from agent.parser import encode_call
from backend.server_process import ServerError, ServerProcess

class Server(ServerProcess):
    """``flywheel serve`` for a benchmark: one allowed root, logs under ``logs``.

    Process handling, readiness and /proc readings are ``ServerProcess``'s;
    this only adapts the constructor.
    """

    def __init__(self, data_dir: Path, allow_root: Path, logs: Path, *, port: int = 0, name: str = "server",
                 env: dict[str, str] | None = None):
        # one token drives every session of a benchmark: lift the per-token socket cap (32)
        super().__init__(data_dir=data_dir, allow_roots=[allow_root], port=port, log_dir=logs / name,
                         start_timeout=60.0,
                         env={"PYTHONUNBUFFERED": "1", "FLYWHEEL_MAX_SOCKETS_PER_TOKEN": "4096", **(env or {})})
        self.name = name  # crash.py's error path prints it with the log tail

    def start(self, timeout: float | None = None) -> Server:
        super().start()
        return self

    def tail(self, n: int = 2000) -> str:
        return self.logs(tail=n)


def make_workspace(root: Path) -> Path:
    """A small Python project for read_file / grep / list_dir."""
    ws = root / "workspace"
    (ws / "src" / "pkg").mkdir(parents=True, exist_ok=True)
    (ws / "tests").mkdir(exist_ok=True)
    (ws / "README.md").write_text("# Demo\n\nA tiny package used by the Flywheel server benchmarks.\n")
    (ws / "src" / "pkg" / "__init__.py").write_text('"""pkg."""\nfrom .stats import mean, median\n')
    (ws / "src" / "pkg" / "stats.py").write_text(
        '"""Tiny statistics helpers."""\n\n\n'
        "def mean(values):\n    return sum(values) / len(values)\n\n\n"
        "def median(values):\n    s = sorted(values)\n    n = len(s)\n"
        "    mid = n // 2\n    return s[mid] if n % 2 else (s[mid - 1] + s[mid]) / 2\n"
    )
    (ws / "src" / "pkg" / "text.py").write_text(
        "def words(s):\n    return s.split()\n\n\ndef count_words(s):\n    return len(words(s))\n"
    )
    (ws / "tests" / "test_stats.py").write_text(
        "from pkg import mean, median\n\n\ndef test_mean():\n    assert mean([1, 2, 3]) == 2\n\n\n"
        "def test_median():\n    assert median([3, 1, 2]) == 2\n"
    )
    return ws


CALL_SETS = [
    [("read_file", {"path": "src/pkg/stats.py"}), ("grep", {"pattern": "def "}), ("list_dir", {"path": "src/pkg"})],
    [("read_file", {"path": "tests/test_stats.py"}), ("read_file", {"path": "src/pkg/text.py"}),
     ("grep", {"pattern": "median", "path": "src"})],
    [("list_dir", {"path": "."}), ("read_file", {"path": "README.md"}), ("grep", {"pattern": "import"})],
]


def tool_step(i: int, prose: str = "") -> str:
    """One model output: a sentence, then three parallel calls."""
    calls = CALL_SETS[i % len(CALL_SETS)]
    prose = prose or f"Let me look at the code (round {i}): three things at once.\n\n"
    return prose + "\n".join(encode_call(name, args) for name, args in calls) + "\n"


def final_step(i: int) -> str:
    return f"Done with round {i}: mean() and median() look right, and the tests cover both."


async def acreate_session(client: httpx.AsyncClient, server: Server, workspace: Path, outputs: list[str], *,
                          chunk_chars: int = 24, delay_s: float = 0.0, title: str = "") -> dict[str, Any]:
    body = {"workspace": {"path": str(workspace)}, "title": title,
            "policy": {"kind": "scripted", "outputs": outputs, "chunk_chars": chunk_chars, "delay_s": delay_s}}
    r = await client.post(server.url + "/v1/sessions", json=body, headers=server.headers, timeout=120)
    if r.status_code != 201:
        raise ServerError(f"create session: {r.status_code} {r.text[:500]}")
    return r.json()


async def afetch_events(client: httpx.AsyncClient, server: Server, session_id: str) -> list[dict[str, Any]]:
    """Every event of a session from the log, via the REST pages."""
    out: list[dict[str, Any]] = []
    after = 0
    while True:
        r = await client.get(f"{server.url}/v1/sessions/{session_id}/events",
                             params={"after": after, "limit": 5000}, headers=server.headers, timeout=120)
        if r.status_code != 200:
            raise ServerError(f"events of {session_id}: {r.status_code} {r.text[:500]}")
        page = r.json()
        out += page["events"]
        after = page["next_after"]
        if not page["more"]:
            return out

