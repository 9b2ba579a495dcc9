"""``flywheel mcp`` approvals (``backend/mcp_approval.py``) with the official ``mcp`` Python client:
the client's user is asked with elicitation before edits and commands (over the initialize
handshake and over the 2026-07-28 per-request envelope, stdio and HTTP); accept runs the call,
decline and cancel refuse it; a client without elicitation gets a refusal naming the flag."""

from __future__ import annotations

import asyncio
import shutil
import subprocess
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import mcp_types as types
import pytest
from mcp import Client

from agent.approval import ApprovalRequest
from backend.mcp_approval import ELICIT_KEY, McpApprovals, decision_of
from backend.server_process import REPO
from tests.backend.mcp_procs import TOKEN, flywheel_mcp_argv, http_server, stdio_params

pytestmark = [pytest.mark.skipif(shutil.which("bwrap") is None, reason="bubblewrap (bwrap) is not installed"),
              pytest.mark.timeout(120)]

APP = "def add(a, b):\n    return a - b\n"
HANDSHAKE, MODERN = "2025-11-25", "2026-07-28"
EDIT = {"path": "app.py", "search": "a - b", "replace": "a + b"}

Callback = Callable[[Any, types.ElicitRequestParams], Awaitable[types.ElicitResult]]


@pytest.fixture
def served(tmp_path: Path) -> Path:
    d = tmp_path / "served"
    d.mkdir()
    (d / "app.py").write_text(APP)
    return d


class Answers:
    """An elicitation callback answering from a list, keeping every question it was asked."""

    def __init__(self, *answers: types.ElicitResult) -> None:
        self.answers = list(answers)
        self.asked: list[types.ElicitRequestFormParams] = []

    async def __call__(self, context: Any, params: types.ElicitRequestParams) -> types.ElicitResult:
        assert isinstance(params, types.ElicitRequestFormParams)
        self.asked.append(params)
        return self.answers.pop(0)


def accept(approve: bool = True, reason: str | None = None) -> types.ElicitResult:
    content: dict[str, Any] = {"approve": approve}
    if reason is not None:
        content["reason"] = reason
    return types.ElicitResult(action="accept", content=content)


def text(result: types.CallToolResult) -> str:
    assert len(result.content) == 1 and result.content[0].type == "text"
    return result.content[0].text


@pytest.mark.parametrize("mode", ["legacy", "auto"])
async def test_a_client_without_elicitation_gets_a_refusal_naming_the_flag(served: Path, mode: str) -> None:
    async with Client(stdio_params(served), mode=mode) as client:
        assert client.protocol_version == (HANDSHAKE if mode == "legacy" else MODERN)
        read = await client.call_tool("read_file", {"path": "app.py"})  # reads are never asked about
        assert not read.is_error and "return a - b" in text(read)
        for name, args in (("edit_file", EDIT), ("run_command", {"command": "touch ran.txt"}),
                           ("write_file", {"path": "new.txt", "content": "x"})):
            refused = await client.call_tool(name, args)
            assert refused.is_error, name
            assert "did not run" in text(refused) and "does not support elicitation" in text(refused)
            assert "--approval-mode auto" in text(refused) and "FLYWHEEL_MCP_APPROVAL_MODE=auto" in text(refused)
            assert refused.structured_content == {"ok": False, "data": {"approval": "unavailable"}, "edits": []}
    assert (served / "app.py").read_text() == APP
    assert sorted(p.name for p in served.iterdir()) == ["app.py"]  # no command ran, no file was written


@pytest.mark.parametrize("mode", ["legacy", "auto"])
async def test_accept_decline_and_cancel(served: Path, mode: str) -> None:
    answers = Answers(types.ElicitResult(action="decline"), types.ElicitResult(action="cancel"),
                      accept(False, "use make test instead"), accept(), accept())
    async with Client(stdio_params(served), mode=mode, elicitation_callback=answers) as client:
        assert client.protocol_version == (HANDSHAKE if mode == "legacy" else MODERN)
        declined = await client.call_tool("edit_file", EDIT)
        assert declined.is_error and text(declined).startswith("the user declined this edit_file call; it did not run.")
        assert declined.structured_content["data"] == {"declined": True}  # type: ignore[index]
        cancelled = await client.call_tool("edit_file", EDIT)
        assert cancelled.is_error and "dismissed without an answer" in text(cancelled)
        said_no = await client.call_tool("run_command", {"command": "touch ran.txt"})
        assert said_no.is_error and "declined this command" in text(said_no)
        assert "The user said: use make test instead" in text(said_no)
        assert (served / "app.py").read_text() == APP and not (served / "ran.txt").exists()
        edited = await client.call_tool("edit_file", EDIT)
        assert not edited.is_error and "+    return a + b" in text(edited)
        ran = await client.call_tool("run_command", {"command": "touch ran.txt; echo made"})
        assert not ran.is_error and text(ran) == "exit code 0\nmade\n"
        assert not (await client.call_tool("grep", {"pattern": "return"})).is_error  # not asked
    assert (served / "app.py").read_text() == APP.replace("a - b", "a + b") and (served / "ran.txt").exists()
    assert len(answers.asked) == 5 and not answers.answers
    edit_q, command_q = answers.asked[0], answers.asked[2]
    assert f"flywheel mcp on {served.resolve()} (ask-edits):" in edit_q.message
    assert "the agent wants to edit app.py" in edit_q.message and "-a - b" in edit_q.message
    assert "+a + b" in edit_q.message
    assert "the agent wants to run this command" in command_q.message and "$ touch ran.txt" in command_q.message
    assert edit_q.requested_schema["required"] == ["approve"]
    assert edit_q.requested_schema["properties"]["approve"]["type"] == "boolean"


async def test_ask_commands_asks_before_commands_only(served: Path) -> None:
    answers = Answers(types.ElicitResult(action="decline"))
    async with Client(stdio_params(served, "--approval-mode", "ask-commands"), mode="legacy",
                      elicitation_callback=answers) as client:
        assert not (await client.call_tool("edit_file", EDIT)).is_error
        refused = await client.call_tool("run_command", {"command": "touch ran.txt"})
        assert refused.is_error and "declined this command" in text(refused)
    assert len(answers.asked) == 1 and "touch ran.txt" in answers.asked[0].message
    assert not (served / "ran.txt").exists() and "a + b" in (served / "app.py").read_text()


async def test_an_answer_is_bound_to_its_call_and_good_for_one_run(served: Path) -> None:
    """2026-07-28: the answer travels in the retried call; it cannot approve other arguments,
    a forged state, or the same call a second time."""
    async with Client(stdio_params(served), mode="auto", elicitation_callback=Answers()) as client:
        assert client.protocol_version == MODERN
        session = client.session
        first = await session.call_tool("run_command", {"command": "echo one >> log.txt"}, allow_input_required=True)
        assert isinstance(first, types.InputRequiredResult) and first.input_requests is not None
        assert set(first.input_requests) == {ELICIT_KEY} and first.request_state
        yes = {ELICIT_KEY: accept()}
        other = await session.call_tool("run_command", {"command": "echo two >> log.txt"}, input_responses=yes,
                                        request_state=first.request_state, allow_input_required=True)
        assert isinstance(other, types.InputRequiredResult)  # asked again: the answer was for another command
        encoded, _sig = first.request_state.rsplit(".", 1)
        forged = await session.call_tool("run_command", {"command": "echo one >> log.txt"}, input_responses=yes,
                                         request_state=encoded + "." + "0" * 64, allow_input_required=True)
        assert isinstance(forged, types.InputRequiredResult)
        assert not (served / "log.txt").exists()
        ran = await session.call_tool("run_command", {"command": "echo one >> log.txt"}, input_responses=yes,
                                      request_state=first.request_state, allow_input_required=True)
        assert isinstance(ran, types.CallToolResult) and not ran.is_error
        again = await session.call_tool("run_command", {"command": "echo one >> log.txt"}, input_responses=yes,
                                        request_state=first.request_state, allow_input_required=True)
        assert isinstance(again, types.InputRequiredResult)  # used up
    assert (served / "log.txt").read_text() == "one\n"


async def test_an_unanswered_question_times_out_as_a_refusal(served: Path) -> None:
    async def never(context: Any, params: types.ElicitRequestParams) -> types.ElicitResult:
        await asyncio.sleep(30)
        return accept()

    async with Client(stdio_params(served, "--approval-timeout", "1"), mode="legacy",
                      elicitation_callback=never) as client:
        refused = await client.call_tool("edit_file", EDIT)
        assert refused.is_error and "(no answer within 1 s)" in text(refused)
        assert not (await client.call_tool("list_dir", {})).is_error  # still serving
    assert (served / "app.py").read_text() == APP


@pytest.mark.parametrize("mode", ["legacy", "auto"])
async def test_over_http_the_client_is_asked_on_its_call(served: Path, mode: str) -> None:
    from mcp.client.streamable_http import streamable_http_client
    from mcp.shared._httpx_utils import create_mcp_http_client

    answers = Answers(accept(), types.ElicitResult(action="decline"))
    with http_server(served) as srv:
        async with create_mcp_http_client(headers={"Authorization": f"Bearer {TOKEN}"}) as http, \
                Client(streamable_http_client(srv.url, http_client=http), mode=mode,
                       elicitation_callback=answers) as client:
            assert not (await client.call_tool("edit_file", EDIT)).is_error
            refused = await client.call_tool("write_file", {"path": "new.txt", "content": "x"})
            assert refused.is_error and "declined this write_file call" in text(refused)
    assert len(answers.asked) == 2 and "a + b" in (served / "app.py").read_text()
    assert not (served / "new.txt").exists()


def test_bad_approval_settings_are_one_line_errors(served: Path) -> None:
    import os
    import sys

    for extra, env, message in (
            (["--approval-timeout", "0"], {}, "--approval-timeout 0 must be a positive number of seconds"),
            ([], {"FLYWHEEL_MCP_APPROVAL_MODE": "sometimes"}, "FLYWHEEL_MCP_APPROVAL_MODE='sometimes'")):
        done = subprocess.run(flywheel_mcp_argv(served, *extra), cwd=REPO, capture_output=True, text=True,
                              timeout=60, env={**os.environ, **env}, stdin=subprocess.DEVNULL)
        assert done.returncode == 2 and len(done.stderr.strip().splitlines()) == 1, done.stderr
        assert message in done.stderr, done.stderr
    done = subprocess.run([sys.executable, "-m", "backend.cli", "mcp", "--help"], cwd=REPO, capture_output=True,
                          text=True, timeout=60)
    assert "--approval-mode {ask-edits,ask-commands,auto}" in done.stdout


def test_what_an_answer_decides() -> None:
    assert decision_of(accept()).approved and decision_of(types.ElicitResult(action="accept")).approved
    assert not decision_of(accept(False, " no ")).approved and decision_of(accept(False, " no ")).reason == "no"
    assert not decision_of(types.ElicitResult(action="accept", content={"approve": "yes"})).approved
    assert not decision_of(types.ElicitResult(action="decline", content={"approve": True})).approved
    assert decision_of(accept(False, "x" * 5000)).reason == "x" * 2000


def test_modes_and_what_they_ask(tmp_path: Path) -> None:
    from agent.runtime import SessionParts
    from agent.tool_runner import ToolRunner
    from tools.sandbox import make_sandbox
    from tools.workspace import WorkspaceStore

    (tmp_path / "w").mkdir()
    runner = ToolRunner(SessionParts(WorkspaceStore(tmp_path / "s").attach(tmp_path / "w"), make_sandbox()))
    calls = {"read_file": {"path": "a"}, "edit_file": EDIT, "write_file": {"path": "b", "content": ""},
             "run_command": {"command": "ls"}, "grep": {"pattern": "x"}}
    asked = {mode: {n for n, a in calls.items() if McpApprovals(mode).request_for(runner, n, a) is not None}
             for mode in ("ask-edits", "ask-commands", "auto")}
    assert asked == {"ask-edits": {"edit_file", "write_file", "run_command"}, "ask-commands": {"run_command"},
                     "auto": set()}
    assert McpApprovals().request_for(runner, "edit_file", {"path": "a"}) is None  # invalid: refused unasked
    request = McpApprovals().request_for(runner, "run_command", {"command": "ls"}, "mcp-7")
    assert request == ApprovalRequest("mcp-7", "run_command", {"command": "ls"}, "command")
    with pytest.raises(ValueError, match="unknown approval mode"):
        McpApprovals("ask")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="positive"):
        McpApprovals(timeout_s=0)


def test_the_command_line_offers_the_runtimes_modes_and_defaults() -> None:
    from agent.approval import APPROVAL_MODES
    from backend import mcp_approval, mcp_cli
    from backend.settings import ClientSettings

    assert set(mcp_cli.APPROVAL_MODES) == set(APPROVAL_MODES)  # spelled out there to keep --help light
    assert mcp_cli.DEFAULT_APPROVAL_TIMEOUT_S == mcp_approval.DEFAULT_APPROVAL_TIMEOUT_S
    assert ClientSettings.model_fields["mcp_approval_mode"].default == mcp_approval.DEFAULT_APPROVAL_MODE


def test_the_mode_comes_from_the_flag_the_environment_or_the_config_file(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from backend.settings import ClientSettings, load_settings

    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path))
    monkeypatch.delenv("FLYWHEEL_MCP_APPROVAL_MODE", raising=False)
    assert load_settings(ClientSettings).mcp_approval_mode == "ask-edits"
    (tmp_path / "flywheel").mkdir()
    (tmp_path / "flywheel" / "config.toml").write_text('mcp_approval_mode = "auto"\napproval_mode = "ask-edits"\n')
    assert load_settings(ClientSettings).mcp_approval_mode == "auto"
    monkeypatch.setenv("FLYWHEEL_MCP_APPROVAL_MODE", "ask-commands")
    assert load_settings(ClientSettings).mcp_approval_mode == "ask-commands"
    assert load_settings(ClientSettings, mcp_approval_mode="ask-edits").mcp_approval_mode == "ask-edits"
