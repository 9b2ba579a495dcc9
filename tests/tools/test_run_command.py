"""The run_command tool: schema, resources, results, through the real sandbox."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any, cast

import pytest

from tools.base import WHOLE_TREE, ParamType, Resources, Tool, ToolContext, ToolError
from tools.run_command import RunCommand
from tools.sandbox import BubblewrapSandbox, CommandResult, SandboxLimits, probe_bwrap

_BWRAP_MISSING = probe_bwrap()
needs_bwrap = pytest.mark.skipif(
    _BWRAP_MISSING is not None,
    reason=f"bubblewrap unusable here ({_BWRAP_MISSING}): apt-get install bubblewrap",
)
pytestmark = pytest.mark.sandbox


@dataclass
class _Workspace:
    """Stand-in with the one attribute run_command uses (the real one is tools.workspace)."""

    root: Path


class _RecordingSandbox:
    """A Sandbox that records what it was asked to run (for the clamping test)."""

    def __init__(self) -> None:
        self.calls: list[tuple[str, Path, SandboxLimits | None]] = []

    async def run(
        self, command: str, cwd: Path, limits: SandboxLimits | None = None
    ) -> CommandResult:
        self.calls.append((command, cwd, limits))
        return CommandResult(
            exit_code=0, signal=None, duration_s=0.0, timed_out=False, truncated=False,
            oom_killed=False, output="", output_bytes_total=0,
        )


def _ctx(root: Path, sandbox: Any) -> ToolContext:
    return ToolContext(workspace=cast(Any, _Workspace(root)), sandbox=sandbox)


@pytest.fixture
def sandboxed(tmp_path: Path) -> ToolContext:
    return _ctx(tmp_path, BubblewrapSandbox(kill_grace_s=0.3))


def test_spec_and_resources() -> None:
    tool = RunCommand()
    assert isinstance(tool, Tool)
    assert tool.spec.name == "run_command"
    command, timeout = tool.spec.param("command"), tool.spec.param("timeout")
    assert command is not None and command.type is ParamType.TEXT and command.required
    assert timeout is not None and timeout.type is ParamType.INTEGER and not timeout.required
    for phrase in ("no network", "read-only", "/tmp", "fresh shell"):
        assert phrase in tool.spec.description
    assert tool.resources({"command": "ls"}) == Resources(writes=frozenset({WHOLE_TREE}))


@needs_bwrap
async def test_success_has_header_and_output(sandboxed: ToolContext) -> None:
    result = await RunCommand().run({"command": "echo hello"}, sandboxed)
    assert result.ok
    header, _, body = result.output.partition("\n")
    assert header == "exit code 0"  # no duration: deterministic commands give identical results
    assert result.data["duration_s"] >= 0
    assert body == "hello\n"
    assert result.data["exit_code"] == 0
    json.dumps(result.data)


@needs_bwrap
async def test_command_is_passed_byte_exact(sandboxed: ToolContext) -> None:
    command = "printf '%s|' \"a  b\" '<&>' \n\n"
    result = await RunCommand().run({"command": command}, sandboxed)
    assert result.output.partition("\n")[2] == "a  b|<&>|"


@needs_bwrap
async def test_nonzero_exit_is_not_ok(sandboxed: ToolContext) -> None:
    result = await RunCommand().run({"command": "echo oops >&2; exit 2"}, sandboxed)
    assert not result.ok
    assert result.output.startswith("exit code 2\n")
    assert "oops" in result.output


@needs_bwrap
async def test_timeout_is_reported(sandboxed: ToolContext) -> None:
    result = await RunCommand().run({"command": "sleep 30", "timeout": 1}, sandboxed)
    assert not result.ok and result.data["timed_out"]
    assert result.output.startswith("timed out after 1 s")


@needs_bwrap
async def test_truncation_is_reported(sandboxed: ToolContext) -> None:
    tool = RunCommand(limits=SandboxLimits(output_bytes=1000))
    result = await tool.run({"command": "seq 100000"}, sandboxed)
    assert result.ok and result.data["truncated"]
    assert "output truncated" in result.output.partition("\n")[0]
    assert "bytes truncated ...]" in result.output


@needs_bwrap
async def test_out_of_memory_is_reported(sandboxed: ToolContext) -> None:
    tool = RunCommand(limits=SandboxLimits(memory_bytes=32 << 20))
    hog = "python3 -c 'b = b\"x\" * (96 << 20)'"
    result = await tool.run({"command": hog}, sandboxed)
    assert not result.ok and result.data["oom_killed"]
    assert result.output.startswith("killed: out of memory")


async def test_timeout_is_clamped(tmp_path: Path) -> None:
    sandbox = _RecordingSandbox()
    tool = RunCommand(max_timeout_s=600)
    await tool.run({"command": "true", "timeout": 10**9}, _ctx(tmp_path, sandbox))
    await tool.run({"command": "true", "timeout": -5}, _ctx(tmp_path, sandbox))
    await tool.run({"command": "true"}, _ctx(tmp_path, sandbox))
    timeouts = [limits.timeout_s for _, _, limits in sandbox.calls if limits]
    assert timeouts == [600, 1, 60]
    assert all(cwd == tmp_path for _, cwd, _ in sandbox.calls)


@pytest.mark.parametrize("command", ["", "   \n\t"])
async def test_empty_command_is_an_error(tmp_path: Path, command: str) -> None:
    with pytest.raises(ToolError, match="empty"):
        await RunCommand().run({"command": command}, _ctx(tmp_path, _RecordingSandbox()))


async def test_no_sandbox_means_commands_are_disabled(tmp_path: Path) -> None:
    with pytest.raises(ToolError, match="commands are disabled: no sandbox is configured"):
        await RunCommand().run({"command": "ls"}, _ctx(tmp_path, None))


@needs_bwrap
async def test_real_workspace_with_store_hidden(store: Any, workspace: Any, outside: Path) -> None:
    """Through a real Workspace: files persist, the store's other contents stay invisible."""
    sibling = store.from_dir(outside)
    ctx = ToolContext(workspace=workspace, sandbox=BubblewrapSandbox(hide=[store.root]))
    listing = await RunCommand().run({"command": f"echo made > made.txt; ls -A {store.root}"}, ctx)
    assert (workspace.root / "made.txt").read_text() == "made\n"
    assert listing.output.partition("\n")[2].split() == ["ws"]  # no blobs, no snapshots
    listing = await RunCommand().run({"command": f"ls -A {store.root}/ws"}, ctx)
    assert listing.output.partition("\n")[2].split() == [workspace.root.parent.name]
    peek = await RunCommand().run({"command": f"cat {sibling.root}/canary.txt"}, ctx)
    assert not peek.ok and "CANARY" not in peek.output
