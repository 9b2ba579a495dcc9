"""``flywheel chat`` end to end: a real server process, the client as a subprocess with piped stdin."""

from __future__ import annotations

import asyncio
import io
import json
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from agent.parser import encode_call
from backend.chat import ChatClient, ChatConfig, ChatError
from backend.server_process import REPO, ServerProcess

pytestmark = pytest.mark.timeout(30)  # a hung client fails its test (Reader.until blocks on readline)
ENV = {**os.environ, "NO_COLOR": "1"}
EDIT_SCRIPT = [
    "Let me look first.\n" + encode_call("read_file", {"path": "a.txt"}),
    encode_call("edit_file", {"path": "a.txt", "search": "old", "replace": "new"}),
    "Done: replaced old with new.",
    "Second answer.",
]


def scripted(outputs: list[str], **kw: Any) -> str:
    return json.dumps({"kind": "scripted", "outputs": outputs, **kw})


def chat_cmd(srv: ServerProcess, *args: str, token: str | None = None) -> list[str]:
    return [sys.executable, "-m", "backend.cli", "chat", "--server", srv.url, "--token", token or srv.token, *args]


def chat(srv: ServerProcess, *args: str, lines: str = "", token: str | None = None,
         timeout: float = 20) -> subprocess.CompletedProcess[str]:
    return subprocess.run(chat_cmd(srv, *args, token=token), input=lines, capture_output=True, text=True,
                          timeout=timeout, env=ENV, cwd=REPO)


def events(stdout: str) -> list[dict[str, Any]]:
    return [json.loads(line) for line in stdout.splitlines() if line.startswith("{")]


@pytest.fixture(scope="module")
def workspace(tmp_path_factory: pytest.TempPathFactory) -> Path:
    ws = tmp_path_factory.mktemp("src") / "proj"
    ws.mkdir()
    (ws / "a.txt").write_text("old\n")
    return ws


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory, workspace: Path) -> Iterator[ServerProcess]:
    with ServerProcess(data_dir=tmp_path_factory.mktemp("srv") / "data", allow_roots=[workspace]) as srv:
        yield srv


class Reader:
    """Reads a running client's stdout line by line, with a deadline."""

    def __init__(self, proc: subprocess.Popen[str]):
        self.proc = proc
        self.lines: list[str] = []

    def until(self, pred: Any, timeout: float = 15) -> dict[str, Any]:
        assert self.proc.stdout is not None
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            line = self.proc.stdout.readline()  # the client flushes per event; EOF ends the loop
            if not line:
                break
            self.lines.append(line)
            if line.startswith("{") and pred(json.loads(line)):
                return json.loads(line)
        raise AssertionError(f"no matching event; got:\n{''.join(self.lines)[-2000:]}")


def test_transcript_shows_text_tool_call_and_diff(server: ServerProcess, workspace: Path) -> None:
    r = chat(server, "--workspace", str(workspace), "--policy", scripted(EDIT_SCRIPT), lines="fix it\n")
    assert r.returncode == 0, r.stderr
    out = r.stdout
    assert out.startswith("session ")
    assert "you › fix it" in out and "Let me look first." in out
    assert "▶ read_file path='a.txt'" in out and "✓ read_file" in out and "│     1\told" in out
    assert "✎ a.txt" in out and "  -old" in out and "  +new" in out
    assert "Done: replaced old with new." in out and "turn ended: completed" in out
    assert (workspace / "a.txt").read_text() == "old\n"  # the session edits its own copy


def test_piped_lines_run_turn_by_turn(server: ServerProcess, workspace: Path) -> None:
    r = chat(server, "--json", "--workspace", str(workspace), "--policy", scripted(EDIT_SCRIPT),
             lines="fix it\nand then?\n")
    assert r.returncode == 0, r.stderr
    evs = events(r.stdout)
    assert [e["seq"] for e in evs] == list(range(1, len(evs) + 1))
    kinds = [(e["type"], e["turn"]) for e in evs if e["type"] in ("user_message", "turn_end")]
    assert kinds == [("user_message", 1), ("turn_end", 1), ("user_message", 2), ("turn_end", 2)]
    assert all(e["reason"] == "completed" for e in evs if e["type"] == "turn_end")
    assert "session " in r.stderr  # --json keeps stdout for events


def test_attach_shows_history_then_continues(server: ServerProcess, workspace: Path) -> None:
    first = chat(server, "--workspace", str(workspace), "--policy", scripted(["one", "two"]), lines="hi\n")
    assert first.returncode == 0, first.stderr
    sid = first.stdout.split()[1]
    r = chat(server, "--json", "--session", sid, lines="again\n")
    assert r.returncode == 0, r.stderr
    evs = events(r.stdout)
    assert [e["seq"] for e in evs] == list(range(1, len(evs) + 1))
    said = [e["text"] for e in evs if e["type"] == "assistant_delta"]
    assert "".join(said) == "onetwo"
    assert [e["text"] for e in evs if e["type"] == "user_message"] == ["hi", "again"]


def test_quit_stops_reading_input(server: ServerProcess, workspace: Path) -> None:
    r = chat(server, "--workspace", str(workspace), "--policy", scripted(["ok"]), lines="first\n/quit\nnever sent\n")
    assert r.returncode == 0, r.stderr
    assert "you › first" in r.stdout and "never sent" not in r.stdout


def test_request_error_is_shown_and_the_client_goes_on(server: ServerProcess, workspace: Path) -> None:
    made = chat(server, "--workspace", str(workspace), "--policy", scripted(["ok"]))
    sid = made.stdout.split()[1]
    with server.client() as c:
        c.post(f"/v1/sessions/{sid}/cancel").raise_for_status()
    r = chat(server, "--session", sid, lines="refused\nrefused again\n")
    assert r.returncode == 0, r.stderr
    assert r.stderr.count("server: this session was cancelled") == 2 and "Traceback" not in r.stderr


APPROVE_SCRIPT = [encode_call("edit_file", {"path": "a.txt", "search": "old", "replace": "new"}), "done"]


def test_an_asking_chat_needs_a_terminal_or_yes(server: ServerProcess, workspace: Path) -> None:
    r = chat(server, "--workspace", str(workspace), "--policy", scripted(APPROVE_SCRIPT), "--approval-mode",
             "ask-edits", lines="fix it\n")
    assert r.returncode == 1 and "Traceback" not in r.stderr and "session " not in r.stdout  # nothing was created
    assert "stdin is not a terminal, so nobody can answer" in r.stderr and "--yes" in r.stderr
    r = chat(server, "--json", "--workspace", str(workspace), "--policy", scripted(APPROVE_SCRIPT),
             "--approval-mode", "ask-edits", "--yes", "--discard", lines="fix it\n")
    assert r.returncode == 0, r.stderr
    evs = events(r.stdout)
    assert [e["call_id"] for e in evs if e["type"] == "approval_requested"] == ["t1s1c0"]
    resolved = next(e for e in evs if e["type"] == "approval_resolved")
    assert resolved["approved"] is True and resolved["reason"] == "--yes" and resolved["by"] == "user"
    assert any(e["type"] == "file_edit" for e in evs)
    sid = r.stderr.split("session ")[1].split()[0]  # attaching to an asking session needs a terminal too
    r = chat(server, "--session", sid, lines="again\n")
    assert r.returncode == 1 and "approval mode ask-edits asks before edits and commands" in r.stderr


def test_on_a_terminal_chat_asks_and_sends_the_answer(server: ServerProcess, workspace: Path) -> None:
    from tests.terminal import on_terminal

    cmd = chat_cmd(server, "--workspace", str(workspace), "--policy", scripted([*APPROVE_SCRIPT, "as you wish"]),
                   "--approval-mode", "ask-commands", "--discard")
    with on_terminal(cmd, env=ENV) as term:  # ask-commands: the edit runs unasked
        term.until("you › ")
        term.send("fix it")
        term.until("turn ended: completed")
        assert "allow?" not in term.text
    script = [encode_call("run_command", {"command": "echo hi > made.txt\nrm a.txt"}), "ok", "second"]
    cmd = chat_cmd(server, "--workspace", str(workspace), "--policy", scripted(script), "--approval-mode",
                   "ask-edits", "--discard")
    with on_terminal(cmd, env=ENV) as term:
        term.until("you › ")
        term.send("clean up")
        asked = term.until("allow? y = yes")
        assert "the agent wants to run this command (run_command t1s1c0):" in asked
        assert "  $ echo hi > made.txt" in asked and "  > rm a.txt" in asked
        term.send("maybe")
        term.until("please answer y or n")
        term.send("n keep a.txt")
        term.until("declined: keep a.txt")
        term.until("turn ended: completed")
        term.until("you › ")
        term.send("/diff")
        term.until("no changes yet")  # the command never ran
        term.send("/quit")
        assert term.wait(timeout=20) == 0


def test_bad_token_exits_1_with_a_clear_message(server: ServerProcess, workspace: Path) -> None:
    r = chat(server, "--workspace", str(workspace), "--policy", scripted(["x"]), token="fw_not-a-token")
    assert r.returncode == 1
    assert "rejected the token" in r.stderr and "Traceback" not in r.stderr


def test_other_users_session_is_forbidden(server: ServerProcess, workspace: Path) -> None:
    made = chat(server, "--workspace", str(workspace), "--policy", scripted(["x"]))
    sid = made.stdout.split()[1]
    tok = subprocess.run([sys.executable, "-m", "backend.cli", "token", "create", "--name", "mallory",
                          "--data-dir", str(server.data_dir)], capture_output=True, text=True, env=ENV, cwd=REPO,
                         timeout=20, check=True).stdout.strip()
    r = chat(server, "--session", sid, token=tok, lines="hi\n")
    assert r.returncode == 1
    assert "forbidden" in r.stderr and "Traceback" not in r.stderr


def test_unreachable_server_exits_1(workspace: Path) -> None:
    with socket.socket() as s:  # a port nobody listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    r = subprocess.run([sys.executable, "-m", "backend.cli", "chat", "--server", f"http://127.0.0.1:{port}",
                        "--workspace", str(workspace)], input="", capture_output=True, text=True, timeout=20,
                       env={**ENV, "FLYWHEEL_TOKEN": "fw_whatever"}, cwd=REPO)
    assert r.returncode == 1
    assert "cannot reach the Flywheel server" in r.stderr and "Traceback" not in r.stderr


def test_ctrl_c_interrupts_the_turn_then_quits_at_the_prompt(server: ServerProcess, workspace: Path) -> None:
    slow = scripted(["word " * 400], delay_s=0.02, chunk_chars=4)
    with subprocess.Popen(chat_cmd(server, "--json", "--workspace", str(workspace), "--policy", slow),
                          stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                          env=ENV, cwd=REPO) as p:
        try:
            assert p.stdin is not None
            p.stdin.write("talk\n")
            p.stdin.flush()
            out = Reader(p)
            out.until(lambda e: e["type"] == "assistant_delta")
            p.send_signal(signal.SIGINT)
            end = out.until(lambda e: e["type"] == "turn_end")
            assert end["reason"] == "interrupted"
            p.send_signal(signal.SIGINT)  # at the prompt (stdin still open): quits
            assert p.wait(timeout=10) == 0
        finally:
            p.kill()


def test_reconnects_after_kill9_and_shows_every_event_once(tmp_path: Path, workspace: Path) -> None:
    slow = scripted(["word " * 200], delay_s=0.02, chunk_chars=4)
    with ServerProcess(data_dir=tmp_path / "data", allow_roots=[workspace]) as srv, \
            subprocess.Popen(chat_cmd(srv, "--json", "--workspace", str(workspace), "--policy", slow),
                             stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                             env=ENV, cwd=REPO) as p:
        try:
            assert p.stdin is not None
            p.stdin.write("talk slowly\n")
            p.stdin.close()  # EOF: the client exits once this turn has ended
            out = Reader(p)
            out.until(lambda e: e["type"] == "assistant_delta" and e["seq"] >= 10)
            srv.kill9()
            time.sleep(0.3)  # the client sees the socket die and starts retrying
            srv.restart()
            out.until(lambda e: e["type"] == "turn_end")
            assert p.wait(timeout=15) == 0
            rest = p.stdout.read() if p.stdout else ""
            shown = events("".join(out.lines) + rest)
            err = p.stderr.read() if p.stderr else ""
        finally:
            p.kill()
        assert "reconnected; resuming after seq" in err and "Traceback" not in err
        seqs = [e["seq"] for e in shown]
        assert seqs == list(range(1, len(seqs) + 1)), seqs  # nothing lost, nothing twice
        assert shown[-1]["type"] == "turn_end" and shown[-1]["reason"] == "shutdown"
        with srv.client() as c:
            logged = c.get(f"/v1/sessions/{shown[0]['session_id']}/events", params={"limit": 5000}).json()["events"]
        assert [e["seq"] for e in logged] == seqs


async def test_gives_up_with_a_clear_message_when_the_server_stays_down(
    tmp_path: Path, workspace: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    r, w = os.pipe()
    with ServerProcess(data_dir=tmp_path / "data", allow_roots=[workspace]) as srv, \
            os.fdopen(r) as stdin, os.fdopen(w, "w") as feed:
        monkeypatch.setattr(sys, "stdin", stdin)
        cfg = ChatConfig(srv.url, srv.token, workspace, None, json.loads(scripted(["word " * 400], delay_s=0.02)),
                         json=True, give_up_s=1.0)
        out, err = io.StringIO(), io.StringIO()
        client = asyncio.create_task(ChatClient(cfg, out=out, err=err).run())
        feed.write("talk\n")
        feed.flush()
        while '"assistant_delta"' not in out.getvalue():
            assert not client.done(), err.getvalue()
            await asyncio.sleep(0.05)
        srv.kill9()  # and it never comes back
        with pytest.raises(ChatError, match="could not reconnect for 1 s"):
            await asyncio.wait_for(client, 15)
    assert "reconnecting in 0.2 s" in err.getvalue()


# -- untrusted text (issue 10) -------------------------------------------------

HOSTILE = ("title \x1b]0;pwned\x07 clear \x1b[2J clip \x1b]52;c;ZWNobyBwd25lZA==\x07 c1 \x9b2J "
           "bidi \u202eabc\u202c lone \ud800 end\r$ fake prompt")


def test_escape_sequences_from_the_model_are_shown_inert(server: ServerProcess, workspace: Path) -> None:
    # json.dumps writes "\ud800" as an escape; the server's JSON reader turns it back into a lone surrogate.
    r = chat(server, "--workspace", str(workspace), "--policy", scripted([HOSTILE]), lines="go\n")
    assert r.returncode == 0, r.stderr
    assert not any(c in r.stdout for c in "\x1b\x07\x9b\u202e\r\ud800")
    assert "title ^[]0;pwned^G clear ^[[2J clip ^[]52;c;ZWNobyBwd25lZA==^G c1 \\x9b2J bidi \\u202eabc" in r.stdout
    assert "lone \ufffd end^M$ fake prompt" in r.stdout


def test_json_mode_is_exact_json_and_inert(server: ServerProcess, workspace: Path) -> None:
    r = chat(server, "--workspace", str(workspace), "--json", "--policy", scripted([HOSTILE]), lines="go\n")
    assert r.returncode == 0, r.stderr
    assert not any(c in r.stdout for c in "\x1b\x07\x9b\u202e\r")
    message = next(e for e in events(r.stdout) if e["type"] == "assistant_message")
    assert message["text"] == HOSTILE.replace("\ud800", "\ufffd")  # exact, but for the unencodable surrogate


async def test_server_messages_and_raw_json_are_inert(workspace: Path) -> None:
    out, err = io.StringIO(), io.StringIO()
    for as_json in (False, True):
        client = ChatClient(ChatConfig("http://127.0.0.1:9", "t", workspace, json=as_json), out=out, err=err)
        try:
            client._on_message(json.dumps({"type": "request_error", "status": 400, "message": "no \x1b]0;x\x07"}))
            client._on_message('{"type": "future_type", "seq": 1, "text": "\\ud800 \\u009b \\u001b[2J"}')
        finally:
            await client._http.aclose()
    assert "server: no ^[]0;x^G" in err.getvalue() and "\x1b" not in err.getvalue()
    line = out.getvalue().strip()  # only --json shows an unknown type
    assert json.loads(line)["text"] == "\ufffd \x9b \x1b[2J"
    assert not any(c in line for c in "\x1b\x9b\ud800")


# -- the session's changes: /diff, /apply, /undo, /model, and the end of the chat ----------

@pytest.fixture(scope="module")
def projects(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("projects")


@pytest.fixture(scope="module")
def apply_server(tmp_path_factory: pytest.TempPathFactory, projects: Path) -> Iterator[ServerProcess]:
    with ServerProcess(data_dir=tmp_path_factory.mktemp("srv2") / "data", allow_roots=[projects]) as srv:
        yield srv


@pytest.fixture
def project(projects: Path, request: pytest.FixtureRequest) -> Path:
    p = projects / request.node.name.replace("[", "_").replace("]", "_")
    p.mkdir()
    (p / "a.txt").write_text("old\n")
    return p


EDIT = encode_call("edit_file", {"path": "a.txt", "search": "old", "replace": "new"})


def test_end_of_chat_applies_with_apply_flag(apply_server: ServerProcess, project: Path) -> None:
    r = chat(apply_server, "--workspace", str(project), "--policy",
             scripted([EDIT, encode_call("write_file", {"path": "n/b.txt", "content": "b\n"}), "done"]),
             "--apply", lines="go\n")
    assert r.returncode == 0, r.stderr
    assert (project / "a.txt").read_text() == "new\n" and (project / "n" / "b.txt").read_text() == "b\n"
    assert "the session's changes (2 file(s): 1 added, 1 modified)" in r.stdout and "+new" in r.stdout
    assert f"applied to {project}: 2 file(s) written" in r.stdout


def test_end_of_chat_without_a_flag_off_a_terminal_only_says_how(apply_server: ServerProcess,
                                                                 project: Path) -> None:
    r = chat(apply_server, "--workspace", str(project), "--policy", scripted([EDIT, "done"]), lines="go\n")
    assert r.returncode == 0, r.stderr
    assert (project / "a.txt").read_text() == "old\n"
    sid = r.stdout.split()[1]
    assert f"flywheel chat --session {sid} --apply" in r.stdout
    later = chat(apply_server, "--session", sid, "--apply")  # as it says: attach and apply, no message
    assert later.returncode == 0, later.stderr
    assert (project / "a.txt").read_text() == "new\n"


def test_discard_says_the_server_keeps_the_changes_and_it_does(apply_server: ServerProcess, project: Path) -> None:
    r = chat(apply_server, "--workspace", str(project), "--policy", scripted([EDIT, "done"]), "--discard",
             lines="go\n")
    assert r.returncode == 0, r.stderr
    sid = r.stdout.split()[1]
    assert ("discarded the session's changes (1 file(s): 1 modified); nothing was written to your directory, but session "
            f"{sid} keeps them in its workspace on the server") in r.stdout
    assert (project / "a.txt").read_text() == "old\n"
    later = chat(apply_server, "--session", sid, "--apply")
    assert later.returncode == 0 and (project / "a.txt").read_text() == "new\n", later.stdout + later.stderr


def test_end_of_chat_refuses_when_the_directory_changed(apply_server: ServerProcess, project: Path) -> None:
    with subprocess.Popen(chat_cmd(apply_server, "--json", "--workspace", str(project), "--policy",
                                   scripted([EDIT, "done"]), "--yes"),
                          stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                          env=ENV, cwd=REPO) as proc:
        try:
            assert proc.stdin is not None
            proc.stdin.write("go\n")
            proc.stdin.flush()
            Reader(proc).until(lambda e: e["type"] == "turn_end")
            (project / "a.txt").write_text("mine\n")
            _, err = proc.communicate(timeout=20)  # EOF: the chat ends, --yes applies
        finally:
            proc.kill()
    assert proc.returncode == 1, err
    assert "a.txt: edited there since the session started" in err and "nothing was written" in err
    assert (project / "a.txt").read_text() == "mine\n"
    Path(err.split("saved as a patch: ")[1].split()[0]).unlink()


def test_diff_undo_and_the_model_is_told(apply_server: ServerProcess, project: Path) -> None:
    r = chat(apply_server, "--workspace", str(project), "--json", "--policy",
             scripted([EDIT, "done", "second answer"]), "--discard",
             lines="/help\n/undo\ngo\n/diff\n/undo\n/diff\n/bogus\n//slash\n")
    assert r.returncode == 0, r.stderr
    err = r.stderr
    assert "/apply" in err and "nothing to undo" in err
    assert err.count("+new") == 1 and "no changes yet" in err  # /diff before and after the /undo
    assert "undid the last turn's changes to 1 file(s): a.txt" in err and "unknown command /bogus" in err
    texts = [e["text"] for e in events(r.stdout) if e["type"] == "user_message"]
    assert texts[0] == "go"
    assert texts[1].startswith("[The user undid the changes of your previous turn") and texts[1].endswith("/slash")
    assert (project / "a.txt").read_text() == "old\n"


def test_apply_mid_chat_then_the_end_applies_the_rest(apply_server: ServerProcess, project: Path) -> None:
    again = encode_call("edit_file", {"path": "a.txt", "search": "new", "replace": "newer"})
    r = chat(apply_server, "--workspace", str(project), "--policy", scripted([EDIT, "done", again, "done"]),
             "--apply", lines="go\n/apply\nagain\n")
    assert r.returncode == 0, r.stdout + r.stderr
    assert r.stdout.count(f"applied to {project}") == 2
    assert (project / "a.txt").read_text() == "newer\n"  # the first /apply is not a conflict for the second


@pytest.mark.timeout(120)  # its own server and model server
def test_model_shows_and_switches_in_a_branch(tmp_path: Path) -> None:
    from tests.openai_server import ScriptedChatServer

    src = tmp_path / "src"
    src.mkdir()
    (src / "a.txt").write_text("old\n")
    model = ScriptedChatServer([EDIT, "first done", "second answer"])
    with model.running(), ServerProcess(data_dir=tmp_path / "data", allow_roots=[src], extra_args=[
            "--openai-base-url", model.base_url, "--openai-model", "base"]) as srv:
        r = chat(srv, "--workspace", str(src), "--discard", lines="go\n/model\n/model other\nnext\n", timeout=60)
    assert r.returncode == 0, r.stderr
    assert "model: openai, model 'base'" in r.stdout and "now in session" in r.stdout
    assert "second answer" in r.stdout
    assert [q["body"]["model"] for q in model.requests] == ["base", "base", "other"]
    assert "edit_file" not in r.stdout.split("now in session")[1]  # the re-executed steps are not shown again
