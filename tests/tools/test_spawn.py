"""spawn_piped: pipes and exit through the loop, on asyncio and on uvloop, without forking the server."""

from __future__ import annotations

import asyncio
import os
import shutil
import subprocess
import sys
import time
from collections.abc import Callable, Coroutine
from pathlib import Path
from typing import Any

import pytest
import uvloop

from tools.spawn import spawn_piped

ROOT = Path(__file__).resolve().parents[2]
FORKS = {"n": 0}
os.register_at_fork(after_in_parent=lambda: FORKS.__setitem__("n", FORKS["n"] + 1))  # a real fork() runs this

LOOPS: dict[str, Callable[[Coroutine[Any, Any, Any]], Any]] = {"asyncio": asyncio.run, "uvloop": uvloop.run}


@pytest.mark.parametrize("loop", LOOPS)
def test_reads_both_pipes_and_the_exit_status(loop: str, tmp_path: Path) -> None:
    script = "import sys; sys.stdout.write('out\\n' * 20000); sys.stderr.write('err'); sys.exit(3)"

    async def main() -> tuple[bytes, bytes, int]:
        proc = await spawn_piped([sys.executable, "-c", script], cwd=tmp_path, env=os.environ)
        try:
            out, err = await asyncio.gather(proc.stdout.read(), proc.stderr.read())
            return out, err, await proc.wait()
        finally:
            proc.close()

    out, err, rc = LOOPS[loop](main())
    assert (out, err, rc) == (b"out\n" * 20000, b"err", 3)


@pytest.mark.parametrize("loop", LOOPS)
def test_kill_ends_a_running_child(loop: str, tmp_path: Path) -> None:
    async def main() -> tuple[int, float]:
        proc = await spawn_piped(["sleep", "30"], cwd=tmp_path, env=os.environ)
        started = time.monotonic()
        proc.kill()
        rc = await asyncio.wait_for(proc.wait(), 5)
        proc.close()
        proc.kill()  # reaped already: nothing to signal, no error
        return rc, time.monotonic() - started

    rc, took = LOOPS[loop](main())
    assert rc == -9 and took < 5


def test_a_missing_program_raises_and_leaves_nothing_open(tmp_path: Path) -> None:
    before = len(os.listdir("/proc/self/fd"))

    async def main() -> None:
        await spawn_piped([str(tmp_path / "no-such-program")], cwd=tmp_path, env=os.environ)

    with pytest.raises(FileNotFoundError):
        asyncio.run(main())
    assert len(os.listdir("/proc/self/fd")) == before


def test_uvloop_spawns_without_forking_the_process(tmp_path: Path) -> None:
    async def spawn_both() -> tuple[int, int]:
        FORKS["n"] = 0
        proc = await spawn_piped(["true"], cwd=tmp_path, env=os.environ)
        await proc.wait()
        proc.close()
        ours = FORKS["n"]
        child = await asyncio.create_subprocess_exec("true", cwd=tmp_path)  # uvloop's own: libuv fork()
        await child.wait()
        return ours, FORKS["n"] - ours

    ours, uvloops = uvloop.run(spawn_both())
    assert ours == 0
    assert uvloops == 1  # the control: the hook does see a fork


@pytest.mark.skipif(shutil.which("strace") is None, reason="needs strace (apt-get install strace)")
def test_each_pipe_descriptor_is_closed_once_on_uvloop(tmp_path: Path) -> None:
    # uvloop's connect_read_pipe closes a pipe's descriptor twice; in a threaded server the second
    # close can land on a descriptor another thread was just given. strace sees every close(2).
    script = tmp_path / "spawn5.py"
    script.write_text(
        "import asyncio, os, uvloop\n"
        "from tools.spawn import spawn_piped\n"
        "async def main():\n"
        "    for _ in range(5):\n"
        "        p = await spawn_piped(['true'], cwd='/', env=os.environ)\n"
        "        await asyncio.gather(p.stdout.read(), p.stderr.read())\n"
        "        await p.wait()\n"
        "        p.close()\n"
        "uvloop.run(main())\n"
    )
    trace = tmp_path / "trace"
    subprocess.run(["strace", "-f", "-qq", "-e", "trace=close", "-o", str(trace), sys.executable, str(script)],
                   check=True, cwd=ROOT, env={**os.environ, "PYTHONPATH": str(ROOT)}, timeout=60)
    closes = trace.read_text().splitlines()
    assert sum("close(" in line for line in closes) > 20  # the trace did record the closes
    assert [line for line in closes if "EBADF" in line] == []


def test_a_spawn_cancelled_while_starting_leaves_no_child(tmp_path: Path) -> None:
    pid_file = tmp_path / "pid"
    script = tmp_path / "child.sh"
    script.write_text(f"#!/bin/sh\necho $$ > {pid_file}\nexec sleep 30\n")
    script.chmod(0o755)

    async def main() -> None:
        task = asyncio.ensure_future(spawn_piped([str(script)], cwd=tmp_path, env=os.environ))
        await asyncio.sleep(0)  # Popen is now running on its thread
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        await asyncio.sleep(0.5)  # Popen returns; the child is killed and reaped

    asyncio.run(main())
    if pid_file.exists():  # it got as far as running: it must be gone now
        with pytest.raises(ProcessLookupError):
            os.kill(int(pid_file.read_text()), 0)
