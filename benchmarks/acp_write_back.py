"""ACP write-back latency: from a command writing a file in the session's copy to the editor
receiving that file's ``fs/write_text_file``, on projects of several sizes.

``flywheel acp`` is spawned as an editor spawns it (the Python SDK's client side on stdio),
in-process sessions in the ``auto`` mode (nothing asked), with a scripted policy whose every
step is one ``run_command`` that writes the wall-clock time into a new file as its last act
(``date +%s.%N > out_K.txt``). The editor stamps the write request when it arrives; both
processes use the same clock. The latency covers the command's exit and the sandbox's
teardown, finding what changed (``Workspace.changed_paths``: every shown file of the copy is
hashed, so it grows with the project), the project-side check (``fs/read_text_file``) and
the JSON-RPC request. The project's files are 1 KiB each, in directories of 100.

Prints one JSON object (last line) and writes ``benchmarks/results/acp_write_back.json``
(``acp_write_back_quick.json`` with ``--quick``).
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

from acp import RequestError, spawn_agent_process, text_block
from acp.schema import ClientCapabilities, FileSystemCapabilities, ReadTextFileResponse, WriteTextFileResponse


def outputs(commands: int) -> list[str]:
    out = [f'<tool_call name="run_command">\n<param name="command">date +%s.%N > out_{k}.txt</param>\n</tool_call>'
           for k in range(commands)]
    return [*out, "Done."]


class Editor:
    def __init__(self) -> None:
        self.latency_ms: list[float] = []

    async def session_update(self, session_id: str, update: Any, **kwargs: Any) -> None:
        return None

    async def request_permission(self, *args: Any, **kwargs: Any) -> Any:
        raise RuntimeError("the benchmark runs in the auto mode")

    async def read_text_file(self, session_id: str, path: str, **kwargs: Any) -> ReadTextFileResponse:
        if not Path(path).is_file():  # a file the command created: not in the project yet
            raise RequestError.resource_not_found(path)
        return ReadTextFileResponse(content=Path(path).read_text())

    async def write_text_file(self, session_id: str, path: str, content: str, **kwargs: Any) -> WriteTextFileResponse:
        now = time.time()
        if Path(path).name.startswith("out_"):
            self.latency_ms.append((now - float(content.strip())) * 1000)
        Path(path).write_text(content)
        return WriteTextFileResponse()


async def run(files: int, commands: int, tmp: Path) -> dict[str, Any]:
    project = tmp / f"project_{files}"
    for i in range(files):
        d = project / f"d{i // 100}"
        d.mkdir(parents=True, exist_ok=True)
        (d / f"f{i}.py").write_text(f"# file {i}\n" + "x = 0\n" * 170)
    script = tmp / f"script_{files}.json"
    script.write_text(json.dumps({"outputs": outputs(commands)}))
    env = dict(os.environ, PYTHONPATH=str(ROOT), FLYWHEEL_SEMANTIC_SEARCH="0")
    editor = Editor()
    cmd = [sys.executable, "-m", "backend.cli", "acp", "--data-dir", str(tmp / f"data_{files}"), "--mode", "auto",
           "--policy", f"scripted:{script}"]
    async with spawn_agent_process(editor, cmd[0], *cmd[1:], env=env) as (conn, _proc):
        fs = FileSystemCapabilities(read_text_file=True, write_text_file=True)
        await conn.initialize(protocol_version=1, client_capabilities=ClientCapabilities(fs=fs))
        sid = (await conn.new_session(cwd=str(project), mcp_servers=[])).session_id
        t0 = time.monotonic()
        resp = await conn.prompt(session_id=sid, prompt=[text_block("run them")])
        assert resp.stop_reason == "end_turn", resp
        wall = time.monotonic() - t0
    ms = editor.latency_ms
    assert len(ms) == commands, (len(ms), commands)
    assert all((project / f"out_{k}.txt").exists() for k in range(commands))
    return {"files": files, "commands": commands, "p50_ms": round(percentile(ms, 50), 2),
            "p99_ms": round(percentile(ms, 99), 2), "max_ms": round(max(ms), 2), "wall_s": round(wall, 2)}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true", help="one small project, 5 commands (a smoke run)")
    ap.add_argument("--sizes", default="100,1000,10000", help="project sizes in files (comma separated)")
    ap.add_argument("--commands", type=int, default=25, help="commands per project (at most 29: one turn)")
    args = ap.parse_args()
    sizes, commands = ([100], 5) if args.quick else ([int(s) for s in args.sizes.split(",")], args.commands)
    load = os.getloadavg()[0]
    with tempfile.TemporaryDirectory(prefix="fw-acp-wb-") as tmp:
        runs = [asyncio.run(run(n, commands, Path(tmp))) for n in sizes]
    write_result("acp_write_back", {"command_wrote_file_to_fs_write_request": runs,
                                    "load_average_at_start": round(load, 2),
                                    "mode": "auto", "log": "sqlite"}, quick=args.quick)


if __name__ == "__main__":
    main()
