"""The ACP TypeScript SDK's client (``ClientSideConnection``) drives ``flywheel acp``:
``tests/clients/acp/acp_client.test.mjs`` under node's test runner (its dependencies
are installed with ``npm ci`` by ``scripts/setup.sh --test``)."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[3]
CLIENT = ROOT / "tests" / "clients" / "acp"


@pytest.mark.timeout(450)  # four flywheel acp starts: minutes on a busy machine (tests run niced)
def test_the_typescript_sdk_client_passes_against_flywheel_acp() -> None:
    node = shutil.which("node")
    if node is None:
        pytest.skip("node is not installed (scripts/setup.sh --test installs it)")
    if not (CLIENT / "node_modules" / "@agentclientprotocol" / "sdk").is_dir():
        pytest.skip(f"the ACP TypeScript SDK is not installed: run `npm ci` in {CLIENT} (scripts/setup.sh --test)")
    env = dict(os.environ, PYTHON=sys.executable)
    done = subprocess.run([node, "--test", "--test-reporter=tap", str(CLIENT)], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=420)
    report = done.stdout + done.stderr
    assert done.returncode == 0, report[-6000:]
    assert "# pass 4" in report and "# fail 0" in report, report[-3000:]
