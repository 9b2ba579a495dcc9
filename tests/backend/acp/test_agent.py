"""``flywheel acp`` driven by the Python SDK's client side (``acp.spawn_agent_process``),
as an editor drives it: a subprocess on stdio, a scripted policy on a temporary project."""

from __future__ import annotations

import asyncio
import os
import time
from pathlib import Path

import pytest
from acp import RequestError, text_block
from sqlalchemy import create_engine, text

from tests.backend.acp.conftest import CALC, FIX, EditorClient, call, running_agent, script

pytestmark = pytest.mark.timeout(240)  # each test starts flywheel acp (conftest.STARTUP_TIMEOUT_S)

FIXED = "def add(a, b):\n    return a + b\n"


async def _prompt(conn, sid: str, what: str = "fix add", timeout: float = 30):
    return await asyncio.wait_for(conn.prompt(session_id=sid, prompt=[text_block(what)]), timeout)


async def test_a_prompt_streams_text_tool_calls_and_diffs_and_edits_land_through_the_editor(
        tmp_path: Path, project: Path) -> None:
    calc = str(project / "calc.py")
    client = EditorClient(buffers={calc: "# unsaved note\n" + CALC})  # the user's unsaved change
    async with running_agent(client, tmp_path / "data", "--policy", f"scripted:{script(tmp_path, FIX)}") as conn:
        sid = (await conn.new_session(cwd=str(project), mcp_servers=[])).session_id
        resp = await _prompt(conn, sid)
    assert resp.stop_reason == "end_turn"
    assert "Reading it." in client.text() and "Done: add() now adds." in client.text()
    starts = {u["toolCallId"]: u for u in client.of("tool_call")}
    assert [starts[c]["kind"] for c in ("t1s1c0", "t1s2c0", "t1s3c0")] == ["read", "edit", "execute"]
    assert starts["t1s1c0"]["locations"] == [{"path": calc}]
    assert starts["t1s2c0"]["locations"] == [{"path": calc}]
    # the read saw the unsaved buffer
    read_done = client.call_updates("t1s1c0")[-1]
    assert read_done["status"] == "completed" and "# unsaved note" in read_done["content"][0]["content"]["text"]
    # the edit: a diff with the whole old and new text, and one write through the editor carrying it
    diffs = [c for u in client.call_updates("t1s2c0") for c in u.get("content", []) if c["type"] == "diff"]
    assert diffs[-1] == {"type": "diff", "path": calc, "oldText": "# unsaved note\n" + CALC,
                         "newText": "# unsaved note\n" + FIXED}
    assert client.writes == [(calc, "# unsaved note\n" + FIXED)]
    assert Path(calc).read_text() == "# unsaved note\n" + FIXED
    assert client.call_updates("t1s2c0")[-1]["status"] == "completed"
    # the command asked first (the default mode asks for commands, not edits) and saw the fixed file
    assert [p["toolCallId"] for p in client.permissions] == ["t1s3c0"]
    assert client.permissions[0]["kind"] == "execute"
    done = [u for u in client.call_updates("t1s3c0") if u.get("status") == "completed"][-1]
    assert "\n5\n" in done["content"][0]["content"]["text"]
    # recorded in the embedded log like any session
    engine = create_engine(f"sqlite:///{tmp_path / 'data' / 'flywheel.db'}")
    with engine.connect() as db:
        owner, status = db.execute(text("select owner, status from sessions where id = :i"), {"i": sid}).one()
        kinds = [r[0] for r in db.execute(text("select type from events where session_id = :i order by seq"),
                                          {"i": sid})]
    engine.dispose()
    assert (owner, status) == ("acp", "idle")
    assert kinds[0] == "user_message" and kinds[-1] == "turn_end" and "file_edit" in kinds


async def test_a_rejected_command_does_not_run_and_the_model_is_told(tmp_path: Path, project: Path) -> None:
    client = EditorClient(answer="reject_once")
    async with running_agent(client, tmp_path / "data", "--policy", f"scripted:{script(tmp_path, FIX)}") as conn:
        sid = (await conn.new_session(cwd=str(project), mcp_servers=[])).session_id
        assert (await _prompt(conn, sid)).stop_reason == "end_turn"
    final = client.call_updates("t1s3c0")[-1]
    assert final["status"] == "failed"
    assert "declined this command; it did not run" in final["content"][0]["content"]["text"]


async def test_allow_always_asks_once_for_the_same_command(tmp_path: Path, project: Path) -> None:
    cmd = call("run_command", command="echo hi")
    client = EditorClient(answer="allow_always")
    async with running_agent(client, tmp_path / "data", "--policy",
                             f"scripted:{script(tmp_path, [cmd, cmd, 'ok'])}") as conn:
        sid = (await conn.new_session(cwd=str(project), mcp_servers=[])).session_id
        assert (await _prompt(conn, sid)).stop_reason == "end_turn"
    assert [p["toolCallId"] for p in client.permissions] == ["t1s1c0"]
    assert client.call_updates("t1s2c0")[-1]["status"] == "completed"


async def test_a_permission_reply_that_never_comes_times_out_into_a_refusal(tmp_path: Path, project: Path) -> None:
    client = EditorClient(answer="never")
    outputs = [call("run_command", command="echo hi"), "gave up", "second turn"]
    async with running_agent(client, tmp_path / "data", "--permission-timeout", "0.5", "--policy",
                             f"scripted:{script(tmp_path, outputs)}") as conn:
        sid = (await conn.new_session(cwd=str(project), mcp_servers=[])).session_id
        assert (await _prompt(conn, sid)).stop_reason == "end_turn"
        final = client.call_updates("t1s1c0")[-1]
        assert final["status"] == "failed"
        assert "no answer from the editor within 0.5 s" in final["content"][0]["content"]["text"]
        assert (await _prompt(conn, sid, "again")).stop_reason == "end_turn"  # still up
        assert "second turn" in client.text()


def _host_processes_with(needle: str) -> list[int]:
    out = []
    for pid in os.listdir("/proc"):
        if pid.isdigit():
            try:
                cmdline = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode()
            except OSError:
                continue
            if needle in cmdline:
                out.append(int(pid))
    return out


async def test_cancel_stops_the_turn_within_a_second_and_kills_the_command(tmp_path: Path, project: Path) -> None:
    client = EditorClient(wait_for=lambda u: u.get("toolCallId") == "t1s1c0" and u.get("status") == "in_progress"
                          and u["sessionUpdate"] == "tool_call_update")
    outputs = [call("run_command", command="echo started; sleep 37.25"), "never reached"]
    async with running_agent(client, tmp_path / "data", "--mode", "auto", "--policy",
                             f"scripted:{script(tmp_path, outputs)}") as conn:
        sid = (await conn.new_session(cwd=str(project), mcp_servers=[])).session_id
        turn = asyncio.ensure_future(_prompt(conn, sid))
        await asyncio.wait_for(client.seen.wait(), 20)
        deadline = time.monotonic() + 5  # in_progress is sent as the call starts, just before the process
        while not _host_processes_with("sleep 37.25") and time.monotonic() < deadline:
            await asyncio.sleep(0.05)
        assert _host_processes_with("sleep 37.25"), "the command should be running"
        t0 = time.monotonic()
        await conn.cancel(session_id=sid)
        resp = await asyncio.wait_for(turn, 5)
        elapsed = time.monotonic() - t0
        assert resp.stop_reason == "cancelled"
        assert elapsed < 1.0, f"cancel took {elapsed:.2f} s"
        assert not _host_processes_with("sleep 37.25")
        final = client.call_updates("t1s1c0")[-1]
        assert final["status"] == "failed" and "cancelled" in final["content"][0]["content"]["text"]
        assert "never reached" not in client.text()


async def test_session_load_replays_the_history_then_continues(tmp_path: Path, project: Path) -> None:
    policy = f"scripted:{script(tmp_path, [*FIX, 'Second answer.'])}"
    first = EditorClient()
    async with running_agent(first, tmp_path / "data", "--policy", policy) as conn:
        sid = (await conn.new_session(cwd=str(project), mcp_servers=[])).session_id
        await _prompt(conn, sid)
    again = EditorClient()
    async with running_agent(again, tmp_path / "data", "--policy", policy) as conn:
        await asyncio.wait_for(conn.load_session(cwd=str(project), session_id=sid, mcp_servers=[]), 30)
        replayed = list(again.updates)
        assert replayed[0] == {"sessionUpdate": "user_message_chunk", "content": {"type": "text", "text": "fix add"}}
        assert "Reading it." in again.text() and "Done: add() now adds." in again.text()
        assert [u["toolCallId"] for u in again.of("tool_call")] == ["t1s1c0", "t1s2c0", "t1s3c0"]
        diff = [c for u in again.call_updates("t1s2c0") for c in u.get("content", []) if c["type"] == "diff"][-1]
        assert "return a - b" in diff["oldText"] and "return a + b" in diff["newText"]
        assert again.permissions == []  # history is shown, never asked again
        assert (await _prompt(conn, sid, "and now?")).stop_reason == "end_turn"
        assert "Second answer." in again.text()
        with pytest.raises(RequestError) as err:
            await conn.load_session(cwd=str(project), session_id="0" * 32, mcp_servers=[])
        assert "no session" in str(err.value)


async def test_paths_outside_the_project_are_refused_and_never_asked_of_the_editor(
        tmp_path: Path, project: Path) -> None:
    outputs = [call("read_file", path="../outside.txt") + call("read_file", path="/etc/passwd")
               + call("write_file", path="../outside.txt", content="pwned"), "refused"]
    client = EditorClient()
    async with running_agent(client, tmp_path / "data", "--mode", "auto", "--policy",
                             f"scripted:{script(tmp_path, outputs)}") as conn:
        sid = (await conn.new_session(cwd=str(project), mcp_servers=[])).session_id
        assert (await _prompt(conn, sid)).stop_reason == "end_turn"
    for cid, why in (("t1s1c0", "outside"), ("t1s1c1", "absolute paths are not allowed"), ("t1s1c2", "outside")):
        final = client.call_updates(cid)[-1]
        assert final["status"] == "failed", final
        assert why in final["content"][0]["content"]["text"]
    assert client.reads == [] and client.writes == []
    assert (tmp_path / "outside.txt").read_text() == "secret\n"


async def test_without_fs_capabilities_edits_land_on_disk(tmp_path: Path, project: Path) -> None:
    client = EditorClient(fs=False)
    async with running_agent(client, tmp_path / "data", "--mode", "auto", "--policy",
                             f"scripted:{script(tmp_path, FIX)}") as conn:
        sid = (await conn.new_session(cwd=str(project), mcp_servers=[])).session_id
        assert (await _prompt(conn, sid)).stop_reason == "end_turn"
    assert client.reads == [] and client.writes == []
    assert (project / "calc.py").read_text() == FIXED


async def test_bad_requests_get_json_rpc_errors_and_the_agent_stays_up(tmp_path: Path, project: Path) -> None:
    client = EditorClient()
    async with running_agent(client, tmp_path / "data", "--policy", f"scripted:{script(tmp_path, ['hi'])}") as conn:
        with pytest.raises(RequestError) as err:
            await conn.new_session(cwd="relative/dir", mcp_servers=[])
        assert err.value.code == -32602 and "absolute" in str(err.value)
        with pytest.raises(RequestError) as err:
            await conn.prompt(session_id="nope", prompt=[text_block("hi")])
        assert "unknown session" in str(err.value)
        sid = (await conn.new_session(cwd=str(project), mcp_servers=[])).session_id
        with pytest.raises(RequestError) as err:
            await conn.set_session_mode(session_id=sid, mode_id="yolo")
        assert "unknown mode" in str(err.value)
        await conn.set_session_mode(session_id=sid, mode_id="ask")
        assert (await _prompt(conn, sid)).stop_reason == "end_turn"


async def test_the_mode_is_stored_with_the_session_and_restored_by_session_load(tmp_path: Path, project: Path) -> None:
    cmd = call("run_command", command="echo hi")
    policy = f"scripted:{script(tmp_path, [cmd, 'first', cmd, 'second'])}"
    first = EditorClient()
    async with running_agent(first, tmp_path / "data", "--mode", "ask", "--policy", policy) as conn:
        resp = await conn.new_session(cwd=str(project), mcp_servers=[])
        sid = resp.session_id
        assert resp.modes.current_mode_id == "ask"
        await conn.set_session_mode(session_id=sid, mode_id="auto")
        assert (await _prompt(conn, sid)).stop_reason == "end_turn"
    assert first.permissions == []  # auto asks nothing
    engine = create_engine(f"sqlite:///{tmp_path / 'data' / 'flywheel.db'}")
    with engine.connect() as db:
        source = db.execute(text("select source from sessions where id = :i"), {"i": sid}).scalar_one()
    engine.dispose()
    assert '"acp_mode": "auto"' in source
    again = EditorClient()
    async with running_agent(again, tmp_path / "data", "--policy", policy) as conn:  # started in the default mode
        loaded = await asyncio.wait_for(conn.load_session(cwd=str(project), session_id=sid, mcp_servers=[]), 30)
        assert loaded.modes.current_mode_id == "auto"
        assert (await _prompt(conn, sid, "again")).stop_reason == "end_turn"
        assert "second" in again.text()
    assert again.permissions == []  # still auto: the command ran unasked
    fresh = EditorClient()
    async with running_agent(fresh, tmp_path / "data", "--mode", "ask", "--policy", policy) as conn:
        new = await conn.new_session(cwd=str(project), mcp_servers=[])
        assert new.modes.current_mode_id == "ask"
        await conn.cancel(session_id=new.session_id)
    with create_engine(f"sqlite:///{tmp_path / 'data' / 'flywheel.db'}").connect() as db:
        stored = db.execute(text("select source from sessions where id = :i"), {"i": new.session_id}).scalar_one()
    assert '"acp_mode": "ask"' in stored
