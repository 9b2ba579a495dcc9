"""The run_command tool: schema, resources, results, through the real sandbox."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any, cast

import pytest

from agent.calls import ToolCall
from agent.executor import Executor
from tools.base import WHOLE_TREE, ParamType, Resources, Tool, ToolContext, ToolError
from tools.registry import default_tools
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
    for phrase in ("no network", "read-only", "/tmp", "fresh shell", "/workspace", "same time"):
        assert phrase in tool.spec.description
    res = tool.resources({"command": "ls"})
    assert res == Resources(reads=frozenset({WHOLE_TREE}), process_writes=frozenset({WHOLE_TREE}))


def test_commands_conflict_only_with_file_edits() -> None:
    command = RunCommand().resources({"command": "ls"})
    edit = Resources(writes=frozenset({"a.py"}))
    read = Resources(reads=frozenset({"a.py"}))
    search = Resources(reads=frozenset({WHOLE_TREE}))
    assert not command.conflicts_with(command)
    assert not command.conflicts_with(read) and not read.conflicts_with(command)
    assert not command.conflicts_with(search) and not search.conflicts_with(command)
    assert command.conflicts_with(edit) and edit.conflicts_with(command)
    assert command.may_write_anywhere and not edit.may_write_anywhere


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
    """Through a real Workspace: files persist, the store and its other workspaces do not exist."""
    sibling = store.from_dir(outside)
    ctx = ToolContext(workspace=workspace, sandbox=BubblewrapSandbox(hide=[store.root]))
    listing = await RunCommand().run({"command": f"echo made > made.txt; ls -A {store.root}"}, ctx)
    assert (workspace.root / "made.txt").read_text() == "made\n"
    assert not listing.ok and "No such file or directory" in listing.output
    peek = await RunCommand().run({"command": f"cat {sibling.root}/canary.txt"}, ctx)
    assert not peek.ok and "CANARY" not in peek.output


@pytest.mark.parametrize(
    ("command", "message"),
    [("echo a\x00b", "NUL byte"), ("echo " + "x" * (130 << 10), "over the 131071-byte limit")],
)
async def test_unpassable_command_is_refused_clearly(tmp_path: Path, command: str, message: str) -> None:
    # Before: "internal error in run_command: ValueError: embedded null byte" / OSError E2BIG.
    with pytest.raises(ToolError, match=message):
        await RunCommand().run({"command": command}, _ctx(tmp_path, BubblewrapSandbox()))


@needs_bwrap
async def test_file_size_is_capped(sandboxed: ToolContext, tmp_path: Path) -> None:
    tool = RunCommand(limits=SandboxLimits(file_bytes=64 << 10))
    result = await tool.run({"command": "head -c 1000000 /dev/zero > big; truncate -s 8G sparse"}, sandboxed)
    assert not result.ok
    assert (tmp_path / "big").stat().st_size <= 64 << 10
    assert not (tmp_path / "sparse").exists() or (tmp_path / "sparse").stat().st_size <= 64 << 10


@needs_bwrap
async def test_workspace_over_its_disk_cap_fails_the_call(sandboxed: ToolContext) -> None:
    tool = RunCommand(limits=SandboxLimits(disk_bytes=1 << 20, file_bytes=1 << 20))
    fill = "for i in 1 2 3; do head -c 600000 /dev/urandom > f$i; done"
    result = await tool.run({"command": fill}, sandboxed)
    assert not result.ok and result.data["disk_limit_hit"]
    assert result.data["workspace_bytes"] > 1 << 20
    assert "over its disk cap" in result.output.partition("\n")[0]
    cleaned = await tool.run({"command": "rm f1 f2 f3"}, sandboxed)
    assert cleaned.ok and not cleaned.data["disk_limit_hit"]


def _step_executor(root: Path) -> tuple[Executor, ToolContext]:
    from tools.workspace import WorkspaceStore

    src = root / "src"
    src.mkdir()
    (src / "a.txt").write_text("before\n")
    ws = WorkspaceStore(root / "store").from_dir(src)
    ctx = ToolContext(workspace=ws, sandbox=BubblewrapSandbox(kill_grace_s=0.3))
    tools = {t.spec.name: t for t in default_tools()}
    return Executor(tools, ctx), ctx


@needs_bwrap
async def test_commands_of_one_step_run_concurrently(tmp_path: Path) -> None:
    ex, _ = _step_executor(tmp_path)
    for i in range(3):
        ex.submit(ToolCall(i, f"c{i}", "run_command", {"command": "sleep 1"}))
    outcomes = await ex.results()
    assert all(o.result.ok for o in outcomes)
    # Overlap, not a wall-clock bound: every command started before any finished.
    assert max(o.started_at for o in outcomes) < min(o.finished_at for o in outcomes)


@needs_bwrap
async def test_searches_run_alongside_a_command(tmp_path: Path) -> None:
    ex, _ = _step_executor(tmp_path)
    ex.submit(ToolCall(0, "c0", "run_command", {"command": "sleep 1"}))
    ex.submit(ToolCall(1, "c1", "grep", {"pattern": "before"}))
    ex.submit(ToolCall(2, "c2", "read_file", {"path": "a.txt"}))
    command, search, read = await ex.results()
    assert search.result.ok and read.result.ok
    assert search.finished_at < command.finished_at and read.finished_at < command.finished_at


@needs_bwrap
async def test_edits_and_commands_keep_call_order(tmp_path: Path) -> None:
    ex, ctx = _step_executor(tmp_path)
    ex.submit(ToolCall(0, "c0", "write_file", {"path": "a.txt", "content": "edited\n"}))
    ex.submit(ToolCall(1, "c1", "run_command", {"command": "sleep 0.3; cat a.txt; echo cmd > a.txt"}))
    ex.submit(ToolCall(2, "c2", "write_file", {"path": "a.txt", "content": "last\n"}))
    first, command, last = await ex.results()
    assert command.result.output.partition("\n")[2] == "edited\n"  # saw the earlier edit
    assert first.finished_at <= command.started_at and command.finished_at <= last.started_at
    assert (ctx.workspace.root / "a.txt").read_text() == "last\n"  # the later edit came after


@needs_bwrap
async def test_output_reaches_the_calls_listener_while_it_runs(sandboxed: ToolContext) -> None:
    import time

    from tools.progress import listening

    seen: list[tuple[float, str]] = []
    t0 = time.monotonic()
    with listening(lambda text: seen.append((time.monotonic() - t0, text))):
        # "é" written as two separate bytes: the listener still gets one whole character
        result = await RunCommand().run(
            {"command": "printf 'start \\303'; sleep 0.1; printf '\\251\\n'; sleep 0.6; echo end"}, sandboxed)
    assert result.ok and result.output.endswith("start é\nend\n")
    assert "".join(t for _, t in seen) == "start é\nend\n"
    assert seen[0][0] < 0.5 and seen[-1][0] >= 0.6  # the first piece came long before the end


async def test_without_a_listener_the_sandbox_is_called_as_before(tmp_path: Path) -> None:
    sandbox = _RecordingSandbox()  # has no on_output parameter
    result = await RunCommand().run({"command": "true"}, _ctx(tmp_path, sandbox))
    assert result.ok and sandbox.calls[0][0] == "true"


async def test_a_listener_gets_decoded_text_from_the_sandbox(tmp_path: Path) -> None:
    from tools.progress import listening

    class Streaming(_RecordingSandbox):
        async def run(self, command: str, cwd: Path, limits: SandboxLimits | None = None, *,
                      on_output: Any = None) -> CommandResult:
            for chunk in (b"caf\xc3", b"\xa9 \xff!\n"):  # a split character, then an invalid byte
                on_output(chunk)
            return await super().run(command, cwd, limits)

    got: list[str] = []
    with listening(got.append):
        await RunCommand().run({"command": "x"}, _ctx(tmp_path, Streaming()))
    assert got == ["caf", "é \ufffd!\n"]
