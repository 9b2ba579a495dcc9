"""Opening a session on a big project, end to end: the server's POST /v1/sessions and ``flywheel run``.

``workspace_fork.py`` measures the store's calls; this measures what a user
waits for. A tree of ``--files`` files (default 100,000, 3 GB: 5% source
files, the rest an ignored ``.venv``, as ``workspace_fork.make_project``
builds it) is opened:

* through a real ``flywheel serve`` (default settings: the directory is
  mounted in place): ``POST /v1/sessions`` until its 201, ``--opens`` times, ``PAUSE_S`` apart;
  then one turn runs a command that counts the ``.venv``'s files and reads a
  source file (what commands need is there), and ``GET /changes`` answers;
* the same with ``FLYWHEEL_WORKSPACE_SOURCE=copy`` (the directory copied into
  the data directory first: the behaviour before), once;
* ``flywheel run --workspace TREE`` (a one-command script, ``--discard``,
  ``--no-record``): the whole process's wall time, in place and with ``--copy``.

The last line is one JSON object (also ``benchmarks/results/workspace_open.json``;
``--quick``: 2,000 small files, written to ``workspace_open_quick.json``).
Not measured: the first open's background storing of blobs (``workspace_fork``
reports it), a tree on another file system than the data directory's.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import httpx

from _common import ROOT, median, write_result
from _server import Server
from workspace_fork import make_project

from agent.parser import encode_call
from tools.overlay import mounts_under, overlay_unavailable

PAUSE_S = 2.0
"""Between two opens: each open stores its starting files' bytes in a background thread, which a
user's next open does not usually race (it would share the server's CPU with the next hashing)."""
COUNT_CMD = "find .venv -type f | wc -l; wc -c < src/pkg0000/mod000.py"


async def _server_opens(server: Server, tree: Path, opens: int, *, run_turn: bool) -> dict[str, Any]:
    out: dict[str, Any] = {}
    async with httpx.AsyncClient(timeout=600) as client:
        times: list[float] = []
        sid = ""
        outputs = [encode_call("run_command", {"command": COUNT_CMD}), "counted"]
        for _ in range(opens):
            body = {"workspace": {"path": str(tree)},
                    "policy": {"kind": "scripted", "outputs": outputs}}
            start = time.perf_counter()
            r = await client.post(server.url + "/v1/sessions", json=body, headers=server.headers)
            times.append((time.perf_counter() - start) * 1000)
            if r.status_code != 201:
                raise SystemExit(f"POST /v1/sessions: {r.status_code} {r.text[:300]}")
            sid = r.json()["id"]
            await asyncio.sleep(PAUSE_S)
        out["create_session_ms"] = {"p50": round(median(times), 1), "runs": [round(t, 1) for t in times]}
        if run_turn:
            r = await client.post(f"{server.url}/v1/sessions/{sid}/messages", json={"text": "count"},
                                  headers=server.headers)
            assert r.status_code == 202, r.text
            result = ""
            deadline = time.monotonic() + 300
            while time.monotonic() < deadline and not result:
                page = (await client.get(f"{server.url}/v1/sessions/{sid}/events", params={"after": 0, "limit": 5000},
                                         headers=server.headers)).json()
                for ev in page["events"]:
                    if ev.get("type") == "tool_result":
                        result = str(ev.get("output") or ev.get("content") or json.dumps(ev))
                await asyncio.sleep(0.2)
            out["command_output"] = result.strip()[-200:]
            start = time.perf_counter()
            r = await client.get(f"{server.url}/v1/sessions/{sid}/changes", headers=server.headers)
            out["changes_ms"] = round((time.perf_counter() - start) * 1000, 1)
            out["changes_status"] = r.status_code
    return out


def _serve(tmp: Path, tree: Path, name: str, opens: int, *, env: dict[str, str], run_turn: bool) -> dict[str, Any]:
    data = tmp / f"data-{name}"
    with Server(data, tree.parent, tmp / "logs", name=name, env={"FLYWHEEL_SEMANTIC_SEARCH": "false", **env}) as srv:
        return asyncio.run(_server_opens(srv, tree, opens, run_turn=run_turn))


def _flywheel_run(tmp: Path, tree: Path, *, copy: bool) -> dict[str, Any]:
    script = tmp / "run_script.json"
    script.write_text(json.dumps([encode_call("run_command", {"command": COUNT_CMD}), "counted"]))
    cmd = [sys.executable, "-m", "backend.cli", "run", "--workspace", str(tree), "--policy", f"scripted:{script}",
           "--discard", "--no-record", "--json", "count", *(["--copy"] if copy else [])]
    env = {**os.environ, "XDG_CONFIG_HOME": str(tmp / "cfg"), "NO_COLOR": "1"}
    start = time.perf_counter()
    r = subprocess.run(cmd, capture_output=True, text=True, env=env, cwd=ROOT, timeout=1800)
    wall = (time.perf_counter() - start) * 1000
    if r.returncode != 0:
        raise SystemExit(f"flywheel run failed ({r.returncode}): {r.stderr[-800:]}")
    outputs = [json.loads(line) for line in r.stdout.splitlines() if line.startswith("{")]
    result = next((e for e in outputs if e.get("type") == "tool_result"), {})
    return {"wall_ms": round(wall), "command_output": str(result.get("output", "")).strip()[-200:]}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--quick", action="store_true", help="smoke run: 2,000 small files")
    ap.add_argument("--files", type=int, default=None, help="files in the tree (default 100000)")
    ap.add_argument("--bytes-per-file", type=int, default=None, help="average file size (default 30 KiB)")
    ap.add_argument("--opens", type=int, default=None, help="sessions opened in place (default 5)")
    ap.add_argument("--dir", type=Path, default=None, help="where the tree and data go (default: the temp dir)")
    args = ap.parse_args()
    quick = args.quick
    files = args.files or (2000 if quick else 100_000)
    bpf = args.bytes_per_file or (2048 if quick else 30 * 1024)
    opens = args.opens or (2 if quick else 5)
    out: dict[str, Any] = {"quick": quick, "files": files, "bytes_per_file": bpf,
                           "load_average_at_start": [round(x, 2) for x in os.getloadavg()]}
    with tempfile.TemporaryDirectory(dir=args.dir, prefix="fw-open-") as tmp_s:
        tmp = Path(tmp_s)
        out["overlay"] = overlay_unavailable(tmp) or "available"
        tree = tmp / "projects" / "big"
        tree.mkdir(parents=True)
        start = time.perf_counter()
        out["tree"] = make_project(tree, files, bpf)
        out["generate_ms"] = round((time.perf_counter() - start) * 1000)
        print(f"tree: {out['tree']}", file=sys.stderr, flush=True)
        out["serve_in_place"] = _serve(tmp, tree, "in-place", opens, env={}, run_turn=True)
        print(f"serve, in place: {out['serve_in_place']}", file=sys.stderr, flush=True)
        out["serve_copy"] = _serve(tmp, tree, "copy", 1, env={"FLYWHEEL_WORKSPACE_SOURCE": "copy"}, run_turn=False)
        print(f"serve, copy: {out['serve_copy']}", file=sys.stderr, flush=True)
        out["run_in_place"] = _flywheel_run(tmp, tree, copy=False)
        out["run_copy"] = _flywheel_run(tmp, tree, copy=True)
        print(f"flywheel run: {out['run_in_place']} / --copy {out['run_copy']}", file=sys.stderr, flush=True)
        left = mounts_under(tmp)
        assert not left, f"mounts left behind: {left}"
        shutil.rmtree(tmp / "projects", ignore_errors=True)
    out["load_average_at_end"] = [round(x, 2) for x in os.getloadavg()]
    venv_files = str(out["tree"]["venv_files"])
    out["checks"] = {
        "command_sees_the_venv": all(venv_files in o.split() for o in (
            out["serve_in_place"].get("command_output", ""), out["run_in_place"]["command_output"])),
        "changes_ok": out["serve_in_place"].get("changes_status") == 200,
    }
    p50 = out["serve_in_place"]["create_session_ms"]["p50"]
    out["speedup_vs_copy"] = {
        "serve": round(out["serve_copy"]["create_session_ms"]["p50"] / p50, 1),
        "run": round(out["run_copy"]["wall_ms"] / out["run_in_place"]["wall_ms"], 1),
    }
    if files >= 100_000:
        out["targets"] = {"session_open_under_1s_at_100k": p50 < 1000}
    write_result("workspace_open_quick" if quick else "workspace_open", out)


if __name__ == "__main__":
    main()
