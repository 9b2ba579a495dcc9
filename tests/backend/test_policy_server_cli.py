"""``flywheel policy serve`` on the command line: impossible settings are one-line refusals
before anything loads, and the server always exits on SIGTERM."""

from __future__ import annotations

import os
import re
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest
import torch

from backend.cli import main as cli_main
from backend.policy_server import SHUTDOWN_GRACE_S
from tests.backend.test_policy_server import checkpoint  # noqa: F401 - fixture

REPO = Path(__file__).resolve().parents[2]


def refused(capsys: pytest.CaptureFixture[str], *argv: str) -> str:
    assert cli_main(["policy", "serve", *argv]) == 1
    err = capsys.readouterr().err
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("flywheel policy serve: ") and "Traceback" not in err, err
    return lines[0]


@pytest.mark.parametrize(("flags", "message"), [
    (["--max-slots", "0"], "--max-slots 0"),
    (["--max-slots", "-3"], "--max-slots -3"),
    (["--max-slots", "100000"], "--max-slots 100000"),
    (["--port", "70000"], "--port 70000 is out of range"),
    (["--port", "-1"], "--port -1 is out of range"),
    (["--device", "bogus"], "not a torch device"),
    (["--log-level", "loud"], "--log-level"),
    (["--model-name", ""], "--model-name"),
    (["--model-name", "x" * 1000], "--model-name"),
])
def test_impossible_settings_are_refused_at_start(checkpoint: Path, capsys: pytest.CaptureFixture[str],  # noqa: F811
                                                  flags: list[str], message: str) -> None:
    assert message in refused(capsys, str(checkpoint), *flags)


@pytest.mark.skipif(torch.cuda.is_available(), reason="needs a machine without CUDA")
def test_cuda_without_cuda_is_one_line(checkpoint: Path, capsys: pytest.CaptureFixture[str]) -> None:  # noqa: F811
    assert "CUDA is not available" in refused(capsys, str(checkpoint), "--device", "cuda")


def test_a_port_in_use_is_one_line(checkpoint: Path, capsys: pytest.CaptureFixture[str]) -> None:  # noqa: F811
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        line = refused(capsys, str(checkpoint), "--port", str(taken.getsockname()[1]))
    assert "the port is in use" in line


def test_a_broken_checkpoint_is_one_line(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    (tmp_path / "config.json").write_text("{not json")
    assert "cannot load" in refused(capsys, str(tmp_path), "--port", "0")
    assert "no checkpoint directory" in refused(capsys, str(tmp_path / "missing"))


# A server whose every forward takes 50 ms, so a 400-token stream is still running when SIGTERM comes.
SLOW = """
import sys, time
import agent.model.transformer as t
forward = t.MoETransformer.forward
def slow(self, *a, **k):
    time.sleep(0.05)
    return forward(self, *a, **k)
t.MoETransformer.forward = slow
from backend.cli import main
sys.exit(main(sys.argv[1:]))
"""


def start(checkpoint: Path, log: Path) -> tuple[subprocess.Popen[bytes], str]:  # noqa: F811
    with open(log, "wb") as out:
        proc = subprocess.Popen([sys.executable, "-c", SLOW, "policy", "serve", str(checkpoint), "--port", "0",
                                 "--model-name", "tiny", "--log-level", "warning"],
                                cwd=REPO, stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                env={**os.environ, "PYTHONPATH": str(REPO)})
    deadline = time.monotonic() + 90
    while not (m := re.search(r"at (http://\S+/v1)", log.read_text())):
        if proc.poll() is not None or time.monotonic() > deadline:
            proc.kill()
            raise AssertionError(f"the server did not start:\n{log.read_text()}")
        time.sleep(0.05)
    url = m.group(1)
    while True:
        try:
            if httpx.get(f"{url}/models", timeout=2).status_code == 200:
                return proc, url
        except httpx.TransportError:
            pass
        if time.monotonic() > deadline:
            proc.kill()
            raise AssertionError(f"the server never answered:\n{log.read_text()}")
        time.sleep(0.05)


def exits_within(proc: subprocess.Popen[bytes], seconds: float) -> int:
    try:
        return proc.wait(timeout=seconds)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()
        raise AssertionError(f"still running {seconds} s after SIGTERM") from None


def test_sigterm_ends_the_server_even_mid_stream(checkpoint: Path, tmp_path: Path) -> None:  # noqa: F811
    proc, url = start(checkpoint, tmp_path / "a.log")
    body = {"prompt": "import os", "max_tokens": 400, "stream": True, "temperature": 1.0, "seed": 1}
    got = []
    with httpx.stream("POST", f"{url}/completions", json=body, timeout=60) as r:
        lines = r.iter_lines()
        got.append(next(lines))  # the stream is running (400 tokens take about 20 s)
        t0 = time.monotonic()
        proc.send_signal(signal.SIGTERM)
        try:
            got += list(lines)
        except httpx.HTTPError:
            pass  # the server cut the stream: fine
    # uvicorn shuts down, then re-raises the signal: the status is "terminated by SIGTERM"
    assert exits_within(proc, SHUTDOWN_GRACE_S + 15) in (0, -signal.SIGTERM)
    took = time.monotonic() - t0
    assert took < SHUTDOWN_GRACE_S + 15, took
    assert len([ln for ln in got if ln.startswith("data: ")]) < 400  # cut, not run to the end
    assert took < 10, took  # the engine stops at the signal: nothing waits for the grace period
    data = [ln for ln in got if ln]
    assert '"server_error"' in data[-2] and data[-1] == "data: [DONE]", data[-3:]  # ended in-band
    print(f"exited {took:.1f} s after SIGTERM, {len(got)} lines streamed")
    log = (tmp_path / "a.log").read_text()
    assert "Traceback" not in log, log
    # an idle server exits at once
    proc, _ = start(checkpoint, tmp_path / "b.log")
    proc.send_signal(signal.SIGTERM)
    assert exits_within(proc, 10) in (0, -signal.SIGTERM)
