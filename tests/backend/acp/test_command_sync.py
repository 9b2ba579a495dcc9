"""Writing back what commands change: :class:`CommandSync` on a real workspace copy and a
real project directory (a "command" here is whatever writes the copy's tree, as a sandboxed
command does), then end to end: ``run_command`` in ``flywheel acp`` and the editor receiving
``fs/write_text_file`` with the file's content."""

from __future__ import annotations

import asyncio
import os
from pathlib import Path

import pytest
from acp import text_block

from agent.approval import ApprovalDecision
from backend.acp.command_sync import MAX_WRITE_BACK_BYTES, CommandReports, CommandSync
from backend.acp.fs_bridge import DiskFiles, EditorWorkspace
from tests.backend.acp.conftest import CALC, EditorClient, call, running_agent, script
from tools.workspace import WorkspaceStore

FIXED = "def add(a, b):\n    return a + b\n"


@pytest.fixture
def setup(tmp_path: Path):
    project = tmp_path / "project"
    project.mkdir()
    (project / "calc.py").write_text(CALC)
    (project / "old.txt").write_text("to be deleted\n")
    store = WorkspaceStore(tmp_path / "store", progress=False)
    ws = store.from_dir(project)
    yield project, ws, EditorWorkspace(ws, DiskFiles(project))
    ws.delete()


def test_created_and_changed_text_files_land_in_the_project_once(setup) -> None:
    project, ws, view = setup
    sync = CommandSync(view)
    (ws.root / "calc.py").write_text(FIXED)
    (ws.root / "out").mkdir()
    (ws.root / "out" / "made.txt").write_text("hello\n")
    report = asyncio.run(sync.after_command("t1s1c0"))
    assert {(w.path, w.old, w.new) for w in report.written} == {("calc.py", CALC, FIXED),
                                                               ("out/made.txt", None, "hello\n")}
    assert (project / "calc.py").read_text() == FIXED and (project / "out" / "made.txt").read_text() == "hello\n"
    assert sync.reports.take("t1s1c0") is report
    again = asyncio.run(sync.after_command("t1s2c0"))  # nothing new: nothing written, nothing said
    assert again.written == [] and again.left == [] and sync.reports.take("t1s2c0") is None


def test_binary_large_linked_and_deleted_files_stay_in_the_copy_with_one_notice_each(setup) -> None:
    project, ws, view = setup
    sync = CommandSync(view)
    (ws.root / "blob.bin").write_bytes(b"\x00\x01\x02")
    (ws.root / "big.log").write_text("x" * (MAX_WRITE_BACK_BYTES + 1))
    os.symlink("calc.py", ws.root / "link.py")
    (ws.root / "old.txt").unlink()
    report = asyncio.run(sync.after_command())
    why = dict(report.left)
    assert report.written == []
    assert why["blob.bin"] == "binary or not UTF-8" and why["big.log"] == "over 1 MiB"
    assert why["link.py"] == "a symlink or special file" and "ACP cannot delete files" in why["old.txt"]
    assert not (project / "blob.bin").exists() and not (project / "big.log").exists()
    assert not (project / "link.py").exists() and (project / "old.txt").exists()
    assert "Left in the session's copy" in report.notice() and "blob.bin (binary or not UTF-8)" in report.notice()
    assert asyncio.run(sync.after_command()).left == []  # said once
    (ws.root / "blob.bin").write_bytes(b"\x00\x09")
    assert [p for p, _ in asyncio.run(sync.after_command()).left] == ["blob.bin"]  # changed again: said again


def test_a_file_the_user_changed_meanwhile_is_not_overwritten(setup) -> None:
    project, ws, view = setup
    sync = CommandSync(view)
    (project / "calc.py").write_text("# the user's edit\n" + CALC)
    (ws.root / "calc.py").write_text(FIXED)
    report = asyncio.run(sync.after_command())
    assert report.written == [] and report.left == [("calc.py", "changed in the editor meanwhile")]
    assert (project / "calc.py").read_text() == "# the user's edit\n" + CALC


def test_what_the_model_edited_or_read_is_not_written_again(setup) -> None:
    project, ws, view = setup
    sync = CommandSync(view)
    view.write_bytes("calc.py", FIXED.encode())  # an edit: in both already
    (project / "calc.py").write_text("# typed after the edit\n" + FIXED)
    report = asyncio.run(sync.after_command())  # the copy agrees with what both had: the user's text stays
    assert report.written == [] and report.left == []
    assert (project / "calc.py").read_text() == "# typed after the edit\n" + FIXED
    view.read_bytes("calc.py")  # a read brings the user's text in; a command then changes it
    (ws.root / "calc.py").write_text("# typed after the edit\n" + FIXED + "# by the command\n")
    (written,) = asyncio.run(sync.after_command()).written
    assert written.old == "# typed after the edit\n" + FIXED
    assert (project / "calc.py").read_text().endswith("# by the command\n")


def test_a_refused_write_back_writes_nothing_and_says_why(setup) -> None:
    project, ws, view = setup
    asked: list[tuple[str | None, list[str]]] = []

    async def refuse(call_id: str | None, paths: list[str]) -> ApprovalDecision:
        asked.append((call_id, paths))
        return ApprovalDecision(False, "")

    sync = CommandSync(view, approve=refuse, reports=CommandReports())
    (ws.root / "calc.py").write_text(FIXED)
    report = asyncio.run(sync.after_command("t1s1c0"))
    assert asked == [("t1s1c0", ["calc.py"])]
    assert report.left == [("calc.py", "not written: the user declined")]
    assert (project / "calc.py").read_text() == CALC


def test_after_the_first_look_changes_are_found_by_stat_without_hashing_the_tree(setup) -> None:
    project, ws, view = setup
    (ws.root / ".gitignore").write_text("build/\n")
    hashed: list[int] = []
    real = ws.changed_paths
    ws.changed_paths = lambda *a: hashed.append(1) or real(*a)  # counts the full comparisons
    sync = CommandSync(view)
    asyncio.run(sync.before_command())
    assert [w.path for w in asyncio.run(sync.after_command()).written] == [".gitignore"]  # made above
    (ws.root / "build").mkdir()
    (ws.root / "build" / "out.o").write_text("ignored\n")  # hidden by .gitignore: never written back
    (ws.root / "calc.py").write_text(FIXED)
    report = asyncio.run(sync.after_command())
    assert [w.path for w in report.written] == ["calc.py"] and hashed == []
    assert not (project / "build").exists()
    assert asyncio.run(sync.after_command()).written == []  # nothing new


def test_a_session_opened_again_writes_back_only_what_commands_change_from_then_on(setup) -> None:
    project, ws, view = setup
    (ws.root / "calc.py").write_text(FIXED)  # an edit of the earlier process: the user has undone it since
    sync = CommandSync(view, baseline=True)
    asyncio.run(sync.before_command())
    (ws.root / "new.txt").write_text("new\n")
    report = asyncio.run(sync.after_command())
    assert [w.path for w in report.written] == ["new.txt"] and report.left == []
    assert (project / "calc.py").read_text() == CALC
    without = CommandSync(EditorWorkspace(ws, DiskFiles(project)))  # what the baseline prevents
    assert [w.path for w in asyncio.run(without.after_command()).written] == ["calc.py"]


# -- end to end (each test starts flywheel acp: conftest.STARTUP_TIMEOUT_S) -----------


async def _run(client: EditorClient, tmp_path: Path, project: Path, outputs: list[str], *args: str) -> str:
    async with running_agent(client, tmp_path / "data", *args, "--policy",
                             f"scripted:{script(tmp_path, outputs)}") as conn:
        sid = (await conn.new_session(cwd=str(project), mcp_servers=[])).session_id
        resp = await asyncio.wait_for(conn.prompt(session_id=sid, prompt=[text_block("go")]), 60)
        assert resp.stop_reason == "end_turn"
        return sid


@pytest.mark.timeout(240)
async def test_a_command_that_writes_files_sends_them_to_the_editor(tmp_path: Path, project: Path) -> None:
    command = ("mkdir -p gen && printf 'made by a command\\n' > gen/out.txt && sed -i 's/a - b/a + b/' calc.py"
               " && printf '\\000\\001' > gen/blob.bin")
    outputs = [call("run_command", command=command), call("read_file", path="calc.py"), "done"]
    calc, out = str(project / "calc.py"), str(project / "gen" / "out.txt")
    client = EditorClient()
    await _run(client, tmp_path, project, outputs, "--mode", "auto")
    assert sorted(client.writes) == [(calc, FIXED), (out, "made by a command\n")]
    assert (project / "gen" / "out.txt").read_text() == "made by a command\n"
    assert not (project / "gen" / "blob.bin").exists()
    done = [u for u in client.call_updates("t1s1c0") if u.get("status") == "completed"][-1]
    diffs = {c["path"]: c for c in done["content"] if c["type"] == "diff"}
    assert diffs[calc]["oldText"] == CALC and diffs[calc]["newText"] == FIXED
    assert diffs[out].get("oldText") is None and diffs[out]["newText"] == "made by a command\n"
    notice = done["content"][-1]["content"]["text"]
    assert "Written to the editor: " in notice and "gen/blob.bin (binary or not UTF-8)" in notice
    # the next read sees the command's change (it is what the editor has now)
    read = client.call_updates("t1s2c0")[-1]
    assert read["status"] == "completed" and "a + b" in read["content"][0]["content"]["text"]


@pytest.mark.timeout(240)
async def test_without_fs_capabilities_a_commands_files_land_on_disk(tmp_path: Path, project: Path) -> None:
    client = EditorClient(fs=False)
    await _run(client, tmp_path, project, [call("run_command", command="echo hi > hi.txt"), "ok"], "--mode", "auto")
    assert client.writes == [] and (project / "hi.txt").read_text() == "hi\n"


@pytest.mark.timeout(240)
async def test_in_ask_mode_the_write_back_is_asked_and_a_refusal_keeps_the_project(
        tmp_path: Path, project: Path) -> None:
    client = EditorClient(answer="allow_once")
    outputs = [call("run_command", command="echo hi > hi.txt"), "ok"]

    async def answer(session_id: str, tool_call, options, **kwargs):  # allow the command, refuse the write-back
        client.permissions.append(tool_call.model_dump(by_alias=True, exclude_none=True, mode="json"))
        from acp.schema import AllowedOutcome, RequestPermissionResponse

        option = "allow_once" if len(client.permissions) == 1 else "reject_once"
        return RequestPermissionResponse(outcome=AllowedOutcome(outcome="selected", option_id=option))

    client.request_permission = answer  # type: ignore[method-assign]
    await _run(client, tmp_path, project, outputs, "--mode", "ask")
    command, write_back = client.permissions
    assert command["kind"] == "execute" and write_back["kind"] == "edit"
    assert write_back["toolCallId"] == "t1s1c0.write-back"
    assert write_back["locations"] == [{"path": str(project / "hi.txt")}]
    assert "Write the files the command changed: hi.txt" == write_back["title"]
    (card,) = [u for u in client.of("tool_call") if u["toolCallId"] == "t1s1c0.write-back"]  # shown before asked
    assert card["kind"] == "edit" and card["status"] == "pending"
    assert client.call_updates("t1s1c0.write-back")[-1]["status"] == "failed"
    assert client.writes == [] and not (project / "hi.txt").exists()
    done = client.call_updates("t1s1c0")[-1]
    assert "hi.txt (not written: the user declined)" in done["content"][-1]["content"]["text"]
