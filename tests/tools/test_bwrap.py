"""What a sandboxed command sees: host-independent paths, no host secrets, toolchains."""

from __future__ import annotations

import os
import sqlite3
import sys
from pathlib import Path

import pytest

from tools.base import ToolContext
from tools.bwrap import unreadable_entries
from tools.run_command import RunCommand
from tools.sandbox import BubblewrapSandbox, make_sandbox, probe_bwrap
from tools.workspace import WorkspaceStore

_BWRAP_MISSING = probe_bwrap()
needs_bwrap = pytest.mark.skipif(
    _BWRAP_MISSING is not None,
    reason=f"bubblewrap unusable here ({_BWRAP_MISSING}): apt-get install bubblewrap",
)
pytestmark = pytest.mark.sandbox

PROBES = [
    "pwd",
    "printf 'def f():\\n    return 1 / 0\\n\\nf()\\n' > boom.py && python3 boom.py",
    "git init -q && git status",
    "ls -A /workspace/.. && ls -la --time-style=+ /workspace",
    "env | sort",
    "hostname && id",
    "realpath . && readlink -f /proc/self/cwd",
]


async def _outputs(ctx: ToolContext) -> list[str]:
    return [(await RunCommand().run({"command": c}, ctx)).output for c in PROBES]


@needs_bwrap
async def test_two_forks_give_byte_identical_outputs(tmp_path: Path, src_tree: Path) -> None:
    stores = [WorkspaceStore(tmp_path / "store-a"), WorkspaceStore(tmp_path / "elsewhere" / "store-b")]
    sandbox = BubblewrapSandbox(hide=[s.root for s in stores])
    workspaces = [s.from_dir(src_tree) for s in stores]
    assert workspaces[0].root != workspaces[1].root
    a, b = [await _outputs(ToolContext(workspace=ws, sandbox=sandbox)) for ws in workspaces]
    assert a == b
    assert "/workspace/boom.py" in a[1] and "ZeroDivisionError" in a[1]
    assert a[0].endswith("\n/workspace\n")
    for out in a:
        assert str(tmp_path) not in out and "store" not in out


def _session_log(data_dir: Path) -> Path:
    db = data_dir / "flywheel.sqlite"
    with sqlite3.connect(db) as conn:
        conn.execute("create table events (body text)")
        conn.execute("insert into events values ('SESSION-LOG-SECRET')")
    return db


@needs_bwrap
@pytest.mark.parametrize("probe", ["shadow", "root", "sibling", "session_log"])
async def test_host_secrets_cannot_be_read(tmp_path: Path, src_tree: Path, outside: Path, probe: str) -> None:
    # Each of these reads succeeded before the allow-list (host uid 0 can open them).
    store = WorkspaceStore(tmp_path / "store")
    mine, sibling = store.from_dir(src_tree), store.from_dir(outside)
    data_dir = tmp_path / "data"
    data_dir.mkdir()
    db = _session_log(data_dir)
    if probe == "shadow":
        if not Path("/etc/shadow").exists() or Path("/etc/shadow").stat().st_mode & 0o004:
            pytest.skip("no private /etc/shadow on this host")
        command, secret = "cat /etc/shadow", "root:"
    elif probe == "root":
        command, secret = "ls -A /root && cat /root/.bashrc", "PS1"
    elif probe == "sibling":
        command, secret = f"cat {sibling.root}/canary.txt", "CANARY"
    else:
        command, secret = f"cat {db}", "SESSION-LOG-SECRET"
    # No ``hide``: the allow-list alone must keep these out.
    ctx = ToolContext(workspace=mine, sandbox=BubblewrapSandbox())
    result = await RunCommand().run({"command": command}, ctx)
    assert not result.ok
    assert secret not in result.output
    assert "No such file or directory" in result.output or "Permission denied" in result.output


def test_unreadable_entries_lists_private_files_and_dirs(tmp_path: Path) -> None:
    (tmp_path / "public").write_text("x")
    (tmp_path / "private").write_text("x")
    (tmp_path / "private").chmod(0o640)
    (tmp_path / "closed").mkdir()
    (tmp_path / "closed" / "inner").write_text("x")
    (tmp_path / "closed").chmod(0o700)
    (tmp_path / "open").mkdir()
    (tmp_path / "open" / "key").write_text("x")
    (tmp_path / "open" / "key").chmod(0o600)
    os.symlink("private", tmp_path / "link")
    (tmp_path / "open").chmod(0o755)
    assert unreadable_entries(tmp_path) == [tmp_path / "closed", tmp_path / "open" / "key", tmp_path / "private"]


@needs_bwrap
async def test_system_tools_work(tmp_path: Path) -> None:
    (tmp_path / "ws").mkdir()
    r = await BubblewrapSandbox().run(
        "python3 -c 'import json, sqlite3; print(6 * 7)' && bash --version | head -1 && git --version", tmp_path / "ws"
    )
    assert r.exit_code == 0, r.output
    assert r.output.startswith("42\nGNU bash") and "git version" in r.output


@needs_bwrap
async def test_demo_tests_run_with_the_system_python(tmp_path: Path) -> None:
    demo = Path(__file__).resolve().parents[2] / "backend" / "demo" / "workspace"
    ws = WorkspaceStore(tmp_path / "store").from_dir(demo)
    r = await BubblewrapSandbox().run("python3 -m unittest -v 2>&1", ws.root)
    assert "Ran " in r.output and "tests in" in r.output, r.output


@needs_bwrap
async def test_extra_ro_beneath_tmp_is_not_hidden_by_the_private_tmp(tmp_path: Path) -> None:
    # A checkout (and its venv) under /tmp, as CI clones may be: the private /tmp must not cover it.
    tool = Path("/tmp") / f"fw-toolchain-{os.getpid()}"
    (tool / "bin").mkdir(parents=True, exist_ok=True)
    try:
        (tool / "bin" / "tool").write_text("#!/bin/sh\necho toolchain works\n")
        (tool / "bin" / "tool").chmod(0o755)
        (tmp_path / "ws").mkdir()
        r = await make_sandbox(extra_ro=[tool]).run(f"{tool}/bin/tool && ls /tmp", tmp_path / "ws")
        assert r.exit_code == 0 and "toolchain works" in r.output, r.output
    finally:
        (tool / "bin" / "tool").unlink(missing_ok=True)
        (tool / "bin").rmdir()
        tool.rmdir()


@needs_bwrap
async def test_extra_ro_exposes_a_toolchain(tmp_path: Path) -> None:
    # The project's venv python (with pytest) lives outside the allow-list; an operator exposes it.
    (tmp_path / "ws").mkdir()
    prefixes = sorted({Path(sys.prefix), Path(os.path.realpath(sys.base_prefix))})
    python = Path(sys.prefix) / "bin" / "python"
    hidden = await BubblewrapSandbox().run(f"{python} -m pytest --version", tmp_path / "ws")
    assert hidden.exit_code != 0
    sandbox = make_sandbox(extra_ro=prefixes)
    shown = await sandbox.run(f"{python} -m pytest --version", tmp_path / "ws")
    assert shown.exit_code == 0 and "pytest" in shown.output, shown.output
    written = await sandbox.run(f"touch {prefixes[0]}/fw-probe", tmp_path / "ws")
    assert written.exit_code != 0 and not (prefixes[0] / "fw-probe").exists()
