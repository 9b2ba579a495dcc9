"""ACP latency: from a tool call's closing tag to the editor receiving ``tool_call``, and
from the end of an edit call to the editor receiving its ``fs/write_text_file``.

``flywheel acp`` is spawned as an editor spawns it (the Python SDK's client side on
stdio), in-process sessions on a temporary project, with a scripted policy that streams
its outputs in 24-character chunks. Each model step writes four ``edit_file`` calls (on
distinct files) and one ``read_file``; the default ``agent`` mode lets edits through
(each still passes the runtime's approval round trip, recorded in the log).

Reference instant: the ``tool_call_started`` event's ``ts``, read back from the session
log -- it is stamped when the parser has the call's closing tag and the call is
validated, before the event is committed and sent. Both processes use the same wall
clock. ``tool_call`` latency therefore covers: commit to the SQLite log, the hub's
broadcast, the event-to-update mapping and the JSON-RPC write to the client's stdin;
the write latency covers the approval round trip, the tool's thread and the
``fs/read_text_file`` check that precedes every write.

Prints one JSON object (last line) and writes ``benchmarks/results/acp_latency.json``
(``acp_latency_quick.json`` with ``--quick``).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from _common import ROOT, percentile, write_result

from acp import spawn_agent_process, text_block
from acp.schema import ClientCapabilities, FileSystemCapabilities, ReadTextFileResponse, WriteTextFileResponse
from sqlalchemy import create_engine, text

EDITS_PER_STEP = 4


def outputs(turns: int, steps: int) -> list[str]:
    out, n = [], 0
    for _ in range(turns):
        for _ in range(steps):
            calls = []
            for _ in range(EDITS_PER_STEP):
                calls.append(f'<tool_call name="edit_file">\n<param name="path">f{n}.py</param>\n'
                             f'<param name="search">x = 0\n</param>\n<param name="replace">x = 1\n</param>\n'
                             "</tool_call>")
                n += 1
            calls.append(f'<tool_call name="read_file">\n<param name="path">f{n - 1}.py</param>\n</tool_call>')
            out.append("Editing the next files.\n\n" + "\n".join(calls))
        out.append("Done.")
    return out


class Editor:
    def __init__(self) -> None:
        self.tool_call_at: dict[str, float] = {}
        self.write_at: dict[str, float] = {}

    async def session_update(self, session_id: str, update: Any, **kwargs: Any) -> None:
        if update.session_update == "tool_call":
            self.tool_call_at[update.tool_call_id] = time.time()

    async def request_permission(self, *args: Any, **kwargs: Any) -> Any:
        raise RuntimeError("the benchmark runs no commands")

    async def read_text_file(self, session_id: str, path: str, **kwargs: Any) -> ReadTextFileResponse:
        return ReadTextFileResponse(content=Path(path).read_text())

    async def write_text_file(self, session_id: str, path: str, content: str, **kwargs: Any) -> WriteTextFileResponse:
        self.write_at.setdefault(Path(path).name, time.time())
        Path(path).write_text(content)
        return WriteTextFileResponse()


async def run(turns: int, steps: int, tmp: Path) -> dict[str, Any]:
    project = tmp / "project"
    project.mkdir()
    for i in range(turns * steps * EDITS_PER_STEP):
        (project / f"f{i}.py").write_text("x = 0\n")
    script = tmp / "script.json"  # scripted:FILE streams in 24-character chunks, no delay
    script.write_text(json.dumps({"outputs": outputs(turns, steps)}))
    env = dict(os.environ, PYTHONPATH=str(ROOT), FLYWHEEL_SEMANTIC_SEARCH="0")
    editor = Editor()
    data = tmp / "data"
    cmd = [sys.executable, "-m", "backend.cli", "acp", "--data-dir", str(data), "--policy", f"scripted:{script}"]
    async with spawn_agent_process(editor, cmd[0], *cmd[1:], env=env) as (conn, _proc):
        fs = FileSystemCapabilities(read_text_file=True, write_text_file=True)
        await conn.initialize(protocol_version=1, client_capabilities=ClientCapabilities(fs=fs))
        sid = (await conn.new_session(cwd=str(project), mcp_servers=[])).session_id
        t0 = time.monotonic()
        for _ in range(turns):
            resp = await conn.prompt(session_id=sid, prompt=[text_block("edit them")])
            assert resp.stop_reason == "end_turn", resp
        wall = time.monotonic() - t0
    engine = create_engine(f"sqlite:///{data / 'flywheel.db'}")
    with engine.connect() as db:
        rows = db.execute(text("select body from events where session_id = :s and type = 'tool_call_started'"),
                          {"s": sid}).scalars().all()
    engine.dispose()
    started = {(e := json.loads(b))["call_id"]: e for b in rows}
    to_tool_call = [(editor.tool_call_at[c] - e["ts"]) * 1000 for c, e in started.items() if c in editor.tool_call_at]
    to_write = [(editor.write_at[e["args"]["path"]] - e["ts"]) * 1000 for e in started.values()
                if e["name"] == "edit_file" and e["args"]["path"] in editor.write_at]
    edits = turns * steps * EDITS_PER_STEP
    assert len(to_tool_call) == len(started) == edits + turns * steps, (len(to_tool_call), len(started))
    assert len(to_write) == edits, len(to_write)
    assert all((project / f"f{i}.py").read_text() == "x = 1\n" for i in range(edits))

    def stats(ms: list[float]) -> dict[str, float]:
        return {"p50_ms": round(percentile(ms, 50), 3), "p99_ms": round(percentile(ms, 99), 3),
                "max_ms": round(max(ms), 3), "n": len(ms)}

    return {"closing_tag_to_tool_call": stats(to_tool_call), "edit_call_to_fs_write_request": stats(to_write),
            "turns": turns, "steps_per_turn": steps, "edits": edits, "wall_s": round(wall, 2),
            "log": "sqlite", "transport": "stdio (the agent-client-protocol package on both sides)"}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true", help="1 turn of 5 steps (a smoke run)")
    ap.add_argument("--turns", type=int, default=8)
    ap.add_argument("--steps", type=int, default=25, help="model steps per turn (at most 30)")
    args = ap.parse_args()
    turns, steps = (1, 5) if args.quick else (args.turns, args.steps)
    with tempfile.TemporaryDirectory(prefix="fw-acp-bench-") as tmp:
        result = asyncio.run(run(turns, steps, Path(tmp)))
    write_result("acp_latency", result, quick=args.quick)


if __name__ == "__main__":
    main()
