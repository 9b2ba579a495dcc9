"""Two ``flywheel serve`` on one data directory: the second refuses to start and leaves the first's turn alone."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from backend.cli import CliError, lock_data_dir
from backend.server_process import REPO, ServerProcess

pytestmark = pytest.mark.timeout(90)


def test_lock_is_exclusive_and_released_with_its_fd(tmp_path: Path) -> None:
    fd = lock_data_dir(tmp_path)
    assert (tmp_path / "serve.lock").read_text().strip().isdigit()
    probe = subprocess.run([sys.executable, "-c", "import sys; from pathlib import Path; from backend.cli import "
                            "lock_data_dir, CliError\ntry: lock_data_dir(Path(sys.argv[1]))\nexcept CliError as e: "
                            "print(e); sys.exit(3)", str(tmp_path)], capture_output=True, text=True, cwd=REPO)
    assert probe.returncode == 3 and "another flywheel serve (pid" in probe.stdout
    os.close(fd)
    os.close(lock_data_dir(tmp_path))  # free again
    with pytest.raises(CliError):  # and held within one process too (a second open file description)
        fd = lock_data_dir(tmp_path)
        try:
            lock_data_dir(tmp_path)
        finally:
            os.close(fd)


def test_second_server_refuses_and_the_first_turn_runs_on(tmp_path: Path) -> None:
    src = tmp_path / "src"
    src.mkdir()
    (src / "a.txt").write_text("x\n")
    with ServerProcess(data_dir=tmp_path / "data", allow_roots=[src], log_dir=tmp_path / "logs") as srv, \
            srv.client() as http:
        policy = {"kind": "scripted", "outputs": ["slow answer " * 50], "chunk_chars": 2, "delay_s": 0.03}  # ~9 s
        sid = http.post("/v1/sessions", json={"workspace": {"path": str(src)}, "policy": policy}).json()["id"]
        assert http.post(f"/v1/sessions/{sid}/messages", json={"text": "go"}).status_code == 202
        second = subprocess.run(
            [sys.executable, "-m", "backend.cli", "serve", "--port", "0", "--data-dir", str(srv.data_dir),
             "--allow-root", str(src)], capture_output=True, text=True, timeout=60, cwd=REPO)
        assert second.returncode == 1
        assert "another flywheel serve" in second.stderr and str(srv.data_dir) in second.stderr
        assert len(second.stderr.strip().splitlines()) == 1 and "Traceback" not in second.stderr
        assert http.get(f"/v1/sessions/{sid}").json()["status"] == "running"  # the refusal came mid-turn
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            events = http.get(f"/v1/sessions/{sid}/events", params={"limit": 5000}).json()["events"]
            ends = [e for e in events if e["type"] == "turn_end"]
            if ends:
                break
            time.sleep(0.1)
        assert ends and ends[0]["reason"] == "completed", json.dumps(events[-3:])
    srv.kill9()
    srv.start()  # the lock died with the killed process
    try:
        with srv.client() as http:
            assert http.get("/health").status_code == 200
    finally:
        srv.stop()
