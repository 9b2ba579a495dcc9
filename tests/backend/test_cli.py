"""The ``flywheel`` command line, run as a real subprocess."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from agent.events import event_from_json
from agent.parser import encode_call
from tests.terminal import on_terminal
from tools.overlay import overlay_unavailable

RUN = [sys.executable, "-m", "backend.cli", "run"]
needs_bwrap = pytest.mark.skipif(shutil.which("bwrap") is None, reason="bubblewrap (bwrap) is not installed")


def flywheel(*args: str, env: dict[str, str] | None = None, timeout: float = 120) -> subprocess.CompletedProcess[str]:
    full_env = {**os.environ, "NO_COLOR": "1", **(env or {})}
    return subprocess.run(
        [sys.executable, "-m", "backend.cli", *args], capture_output=True, text=True, timeout=timeout, env=full_env,
        stdin=subprocess.DEVNULL, cwd=Path(__file__).resolve().parents[2],
    )


def test_help_lists_run() -> None:
    r = flywheel("--help")
    assert r.returncode == 0 and "run" in r.stdout


@needs_bwrap
def test_demo_fixes_the_bug_and_prints_transcript() -> None:
    r = flywheel("run")
    assert r.returncode == 0, r.stderr
    out = r.stdout
    assert "▶ run_command" in out and "✎ stats.py" in out
    assert "FAIL: test_mean" in out and "turn ended: completed" in out
    assert "+    return sum(values) / len(values)" in out
    assert ".pyc" not in out  # the sandbox keeps bytecode out of the workspace diff


@needs_bwrap
def test_json_mode_prints_valid_ordered_events() -> None:
    r = flywheel("run", "--json")
    assert r.returncode == 0, r.stderr
    events = [event_from_json(line) for line in r.stdout.splitlines()]
    assert [e.seq for e in events] == list(range(1, len(events) + 1))
    assert events[0].type == "user_message" and events[-1].type == "turn_end"
    assert any(e.type == "file_edit" for e in events)


def test_own_workspace_with_script_and_original_untouched(tmp_path: Path) -> None:
    src = tmp_path / "proj"
    src.mkdir()
    (src / "a.txt").write_text("old\n")
    script = tmp_path / "s.json"
    script.write_text(json.dumps([encode_call("edit_file", {"path": "a.txt", "search": "old", "replace": "new"}), "ok"]))
    r = flywheel("run", "--workspace", str(src), "--policy", f"scripted:{script}", "change it",
                 env={"FLYWHEEL_UNSAFE_NO_SANDBOX": "1"} if shutil.which("bwrap") is None else None)
    assert r.returncode == 0, r.stderr
    assert "-old" in r.stdout and "+new" in r.stdout
    assert (src / "a.txt").read_text() == "old\n"


def test_git_workspace_at_commit(tmp_path: Path) -> None:
    repo = tmp_path / "repo"
    repo.mkdir()
    git = ["git", "-C", str(repo), "-c", "user.email=t@t", "-c", "user.name=t"]
    subprocess.run(["git", "init", "-q", str(repo)], check=True)
    (repo / "f.txt").write_text("one\n")
    subprocess.run([*git, "add", "."], check=True)
    subprocess.run([*git, "commit", "-qm", "1"], check=True)
    first = subprocess.run([*git, "rev-parse", "HEAD"], capture_output=True, text=True, check=True).stdout.strip()
    (repo / "f.txt").write_text("two\n")
    subprocess.run([*git, "commit", "-qam", "2"], check=True)
    script = tmp_path / "s.json"
    script.write_text(json.dumps([encode_call("read_file", {"path": "f.txt"}), "done"]))
    r = flywheel("run", "--git", str(repo), "--commit", first, "--policy", f"scripted:{script}", "--json", "read",
                 env={"FLYWHEEL_UNSAFE_NO_SANDBOX": "1"} if shutil.which("bwrap") is None else None)
    assert r.returncode == 0, r.stderr
    results = [e for e in map(event_from_json, r.stdout.splitlines()) if e.type == "tool_result"]
    assert "one" in results[0].output and "two" not in results[0].output


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["run", "--workspace", "/nonexistent/dir", "--policy", "scripted:backend/demo/script.json", "hi"],
         "is not a directory"),
        (["run", "--workspace", ".", "--policy", "scripted:missing.json", "hi"], "script file not found"),
        (["run", "--workspace", ".", "--policy", "gpt5", "hi"], "unknown policy 'gpt5'"),
        (["run", "--workspace", ".", "hi"], "choose a policy"),
        (["run", "--copy", "--policy", "demo", "hi"], "--copy applies to --workspace"),
        (["run", "--git", "/tmp", "--commit", "deadbeef", "--policy", "openai", "hi"], "could not create the workspace"),
    ],
)
def test_bad_input_gets_a_clear_error_without_traceback(args: list[str], message: str) -> None:
    r = flywheel(*args, env={"FLYWHEEL_UNSAFE_NO_SANDBOX": "1"} if shutil.which("bwrap") is None else None)
    assert r.returncode != 0
    assert message in r.stderr.lower() or message in r.stderr
    assert "Traceback" not in r.stderr


def test_model_server_down_is_reported(tmp_path: Path) -> None:
    (tmp_path / "main.py").write_text("print('hi')\n")  # a small tree: the repo itself holds a 3 GB .venv
    r = flywheel("run", "--workspace", str(tmp_path), "--policy", "openai", "--base-url", "http://127.0.0.1:9/v1", "hi",
                 env={"FLYWHEEL_UNSAFE_NO_SANDBOX": "1"} if shutil.which("bwrap") is None else None)
    assert r.returncode == 1
    assert "cannot reach the OpenAI-compatible server" in r.stdout + r.stderr


# -- the end of a run: apply, export or discard -------------------------------------

NO_BWRAP = {"FLYWHEEL_UNSAFE_NO_SANDBOX": "1"} if shutil.which("bwrap") is None else {}


def _env(tmp_path: Path) -> dict[str, str]:
    """The environment of a ``flywheel run`` on a terminal: no colour, an empty config directory."""
    return {**os.environ, "NO_COLOR": "1", **NO_BWRAP, "XDG_CONFIG_HOME": str(tmp_path / "cfg")}


def _edit_project(tmp_path: Path, *extra: str) -> tuple[Path, Path]:
    src = tmp_path / "proj"
    src.mkdir()
    (src / "a.txt").write_text("old\n")
    (src / "gone.txt").write_text("bye\n")
    script = tmp_path / "s.json"
    script.write_text(json.dumps([
        *extra,
        encode_call("edit_file", {"path": "a.txt", "search": "old", "replace": "new"}),
        encode_call("write_file", {"path": "sub/b.txt", "content": "bee\n"}),
        encode_call("run_command", {"command": "rm gone.txt"}),
        "ok",
    ]))
    return src, script


def test_apply_writes_the_changes_to_the_original(tmp_path: Path) -> None:
    src, script = _edit_project(tmp_path)
    r = flywheel("run", "--workspace", str(src), "--policy", f"scripted:{script}", "--apply", "change it",
                 env={**NO_BWRAP, "XDG_CONFIG_HOME": str(tmp_path / "cfg")})
    assert r.returncode == 0, r.stdout + r.stderr
    assert (src / "a.txt").read_text() == "new\n" and (src / "sub" / "b.txt").read_text() == "bee\n"
    assert not (src / "gone.txt").exists()
    assert f"applied to {src.resolve()}: 2 file(s) written, 1 deleted" in r.stdout


def test_apply_refuses_when_the_original_changed_meanwhile(tmp_path: Path) -> None:
    """A copied workspace (--copy) does not see the user's edit: the apply then finds it and refuses."""
    src, script = _edit_project(tmp_path, encode_call("run_command", {"command": "sleep 2"}))
    proc = subprocess.Popen(
        [sys.executable, "-m", "backend.cli", "run", "--workspace", str(src), "--copy", "--policy",
         f"scripted:{script}", "--yes", "change it"], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        env={**os.environ, "NO_COLOR": "1", **NO_BWRAP, "XDG_CONFIG_HOME": str(tmp_path / "cfg")},
        cwd=Path(__file__).resolve().parents[2])
    assert proc.stdout is not None
    for line in proc.stdout:  # the workspace was copied once the first command runs
        if "sleep 2" in line:
            break
    (src / "a.txt").write_text("the user's edit\n")
    out, err = proc.communicate(timeout=60)
    assert proc.returncode == 1, out + err
    assert (src / "a.txt").read_text() == "the user's edit\n"
    assert not (src / "sub").exists() and (src / "gone.txt").exists()  # nothing written
    assert "a.txt: edited there since the session started" in out and "nothing was written" in out
    saved = Path(out.split("saved as a patch: ")[1].split()[0])
    try:
        assert "+bee" in saved.read_text()  # the work is not lost
    finally:
        saved.unlink()


def test_in_place_the_agent_sees_the_users_edit_and_a_clash_is_refused(tmp_path: Path) -> None:
    """Mounted in place (the default where overlays work), the session sees the user's edits to files it
    has not written; one to a file it wrote is refused at the apply, and never taken for the session's."""
    if overlay_unavailable(tmp_path) is not None:
        pytest.skip("overlays do not work here: flywheel run copies the directory")
    src = tmp_path / "proj"
    src.mkdir()
    (src / "a.txt").write_text("old\n")
    (src / "notes.txt").write_text("v1\n")
    script = tmp_path / "s.json"
    script.write_text(json.dumps([
        encode_call("edit_file", {"path": "a.txt", "search": "old", "replace": "new"}),
        encode_call("run_command", {"command": "sleep 2"}),
        encode_call("run_command", {"command": "cat notes.txt"}),
        "done",
    ]))
    proc = subprocess.Popen(
        [sys.executable, "-m", "backend.cli", "run", "--workspace", str(src), "--policy", f"scripted:{script}",
         "--yes", "change it"], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=_env(tmp_path),
        cwd=Path(__file__).resolve().parents[2])
    assert proc.stdout is not None
    for line in proc.stdout:
        if "sleep 2" in line:
            break
    (src / "a.txt").write_text("the user's edit\n")
    (src / "notes.txt").write_text("v2 from the editor\n")
    out, err = proc.communicate(timeout=60)
    assert "v2 from the editor" in out  # the command saw the user's newer notes
    assert "workspace changes (1 file(s))" in out and "notes.txt" not in out.split("workspace changes")[1]
    assert proc.returncode == 1, out + err
    assert (src / "a.txt").read_text() == "the user's edit\n" and "a.txt: edited there since" in out
    assert (src / "notes.txt").read_text() == "v2 from the editor\n"
    saved = Path(out.split("saved as a patch: ")[1].split()[0])
    try:
        assert "+new" in saved.read_text()
    finally:
        saved.unlink()


def test_export_patch_and_the_default_leave_the_original_alone(tmp_path: Path) -> None:
    src, script = _edit_project(tmp_path)
    env = {**NO_BWRAP, "XDG_CONFIG_HOME": str(tmp_path / "cfg")}
    r = flywheel("run", "--workspace", str(src), "--policy", f"scripted:{script}", "--json",
                 "--export-patch", str(tmp_path / "out.patch"), "change it", env=env)
    assert r.returncode == 0, r.stderr
    assert all(line.startswith("{") for line in r.stdout.splitlines())  # --json: stdout stays JSON lines
    patch = (tmp_path / "out.patch").read_text()
    assert "+new" in patch and "deleted file mode 100644" in patch and "wrote" in r.stderr
    r = flywheel("run", "--workspace", str(src), "--policy", f"scripted:{script}", "change it", env=env)
    assert r.returncode == 0 and "not applied to" in r.stdout and "--apply" in r.stdout  # no prompt off a terminal
    assert (src / "a.txt").read_text() == "old\n" and (src / "gone.txt").exists()
    if shutil.which("git"):
        check = subprocess.run(["git", "apply", "--check", str(tmp_path / "out.patch")], cwd=src,
                               capture_output=True, text=True)
        assert check.returncode == 0, check.stderr


def test_demo_is_never_applied(tmp_path: Path) -> None:
    r = flywheel("run", "--apply", env={**NO_BWRAP, "XDG_CONFIG_HOME": str(tmp_path / "cfg")})
    assert r.returncode == 1 and "bundled example" in r.stdout
    assert "Traceback" not in r.stderr


def test_config_file_gives_the_default_policy_and_flags_override_it(tmp_path: Path) -> None:
    src, script = _edit_project(tmp_path)
    cfg = tmp_path / "cfg" / "flywheel"
    cfg.mkdir(parents=True)
    (cfg / "config.toml").write_text(f'policy = "scripted:{script}"\napproval_mode = "ask-edits"\n')
    env = {**NO_BWRAP, "XDG_CONFIG_HOME": str(tmp_path / "cfg")}
    r = flywheel("run", "--workspace", str(src), "--discard", "change it", env=env)
    assert r.returncode == 1 and "approval mode ask-edits asks before edits and commands" in r.stderr  # no terminal
    r = flywheel("run", "--workspace", str(src), "--yes", "--discard", "change it", env=env)
    assert r.returncode == 0 and "discarded" in r.stdout and "+new" in r.stdout, r.stderr
    assert "needs your approval" in r.stdout and "approved" in r.stdout
    other = tmp_path / "other.json"
    other.write_text(json.dumps(["nothing to do"]))
    r = flywheel("run", "--workspace", str(src), "--policy", f"scripted:{other}", "--approval-mode", "auto", "--json",
                 "hi", env=env)
    assert r.returncode == 0 and "nothing to do" in r.stdout and "edit_file" not in r.stdout
    (cfg / "config.toml").write_text('approval_mode = "sometimes"\n')
    r = flywheel("run", "--workspace", str(src), "--discard", "hi", env=env)
    assert r.returncode == 1 and "approval_mode='sometimes' in" in r.stderr and "Traceback" not in r.stderr
    (cfg / "config.toml").write_text('polcy = "x"\n')
    r = flywheel("run", "--workspace", str(src), "hi", env=env)
    assert r.returncode == 1 and "unknown setting(s) 'polcy'" in r.stderr


def test_on_a_terminal_it_asks_and_applies(tmp_path: Path) -> None:
    src, script = _edit_project(tmp_path)
    with on_terminal(RUN + ["--workspace", str(src), "--policy", f"scripted:{script}", "go"],
                     env=_env(tmp_path)) as term:
        term.until("[d]iscard (default): ")
        assert (src / "a.txt").read_text() == "old\n"  # nothing before the answer
        term.send("a")
        term.until("1 deleted")
        assert term.wait(timeout=30) == 0
    assert (src / "a.txt").read_text() == "new\n" and not (src / "gone.txt").exists()


@pytest.mark.parametrize(("args", "message"), [
    (["serve", "--port", "70000"], "--port=70000: Input should be less than or equal to 65535"),
    (["sessions", "list", "--db", "sqlite:////nonexistent/dir/x.db"], "no session log at /nonexistent/dir/x.db"),
    (["token", "list", "--db", "bogus://"], "cannot open the session log"),
])
def test_more_bad_input_is_one_line(args: list[str], message: str, tmp_path: Path) -> None:
    r = flywheel(*args, "--data-dir", str(tmp_path / "d"))
    assert r.returncode == 1 and message in r.stderr, r.stderr
    assert len(r.stderr.strip().splitlines()) == 1 and "Traceback" not in r.stderr


def _asking_script(tmp_path: Path) -> tuple[Path, Path]:
    src = tmp_path / "proj"
    src.mkdir()
    (src / "a.txt").write_text("old\n")
    script = tmp_path / "ask.json"
    script.write_text(json.dumps([
        encode_call("run_command", {"command": "echo one > made.txt\necho two >> made.txt"}),
        encode_call("edit_file", {"path": "a.txt", "search": "old", "replace": "new"}),
        "done",
    ]))
    return src, script


def test_run_asks_on_the_terminal_before_commands_and_edits(tmp_path: Path) -> None:
    src, script = _asking_script(tmp_path)
    keep = tmp_path / "kept"
    with on_terminal(RUN + ["--workspace", str(src), "--policy", f"scripted:{script}", "--approval-mode", "ask-edits",
                            "--json", "--discard", "--data-dir", str(keep), "go"], env=_env(tmp_path)) as term:
        asked = term.until("allow? y = yes")
        assert "the agent wants to run this command (run_command t1s1c0):" in asked
        assert "  $ echo one > made.txt" in asked and "  > echo two >> made.txt" in asked  # the whole command
        term.send("n not now")
        asked = term.until("allow? y = yes")
        assert "the agent wants to edit a.txt (edit_file t1s2c0):" in asked and "  -old" in asked and "  +new" in asked
        term.send("y")
        term.until('"type":"turn_end"')
        assert term.wait() == 0
    events = [event_from_json(line) for line in term.text.splitlines() if line.startswith("{")]
    resolved = [(e.call_id, e.approved, e.reason, e.by) for e in events if e.type == "approval_resolved"]
    assert resolved == [("t1s1c0", False, "not now", "user"), ("t1s2c0", True, "", "user")]
    declined = next(e for e in events if e.type == "tool_result" and e.call_id == "t1s1c0")
    assert not declined.ok and declined.data.get("declined") is True
    assert any(e.type == "file_edit" and e.path == "a.txt" for e in events)
    kept = [p for p in keep.rglob("a.txt") if p.read_text() == "new\n"]
    assert kept and not any(keep.rglob("made.txt"))  # the refused command never ran


def test_run_without_a_terminal_refuses_to_ask_and_yes_approves(tmp_path: Path) -> None:
    src, script = _asking_script(tmp_path)
    args = ["run", "--workspace", str(src), "--policy", f"scripted:{script}", "--approval-mode", "ask-commands"]
    r = flywheel(*args, "--discard", "go", env=_env(tmp_path))
    assert r.returncode == 1 and "Traceback" not in r.stderr
    assert r.stderr.strip() == ("flywheel run: approval mode ask-commands asks before commands, but stdin is not a "
                                "terminal, so nobody can answer: run flywheel run on a terminal, pass --yes to approve "
                                "every call, or use --approval-mode auto")
    r = flywheel(*args, "--yes", "--json", "--discard", "go", env=_env(tmp_path))
    assert r.returncode == 0, r.stderr
    events = [event_from_json(line) for line in r.stdout.splitlines()]
    asked = [e.call_id for e in events if e.type == "approval_requested"]
    assert asked == ["t1s1c0"]  # ask-commands: the edit is not asked about
    resolved = next(e for e in events if e.type == "approval_resolved")
    assert resolved.approved and resolved.reason == "--yes"
    assert next(e for e in events if e.type == "tool_result" and e.call_id == "t1s1c0").ok
    r = flywheel(*args[:-2], "--yes", "--apply", "go", env=_env(tmp_path))  # auto: nothing asked; --yes applies
    assert r.returncode == 0 and (src / "a.txt").read_text() == "new\n" and (src / "made.txt").exists(), r.stdout


def test_an_interrupt_withdraws_the_question(tmp_path: Path) -> None:
    import signal

    src, script = _asking_script(tmp_path)
    with on_terminal(RUN + ["--workspace", str(src), "--policy", f"scripted:{script}", "--approval-mode",
                            "ask-commands", "--discard", "go"], env=_env(tmp_path)) as term:
        term.until("allow? y = yes")
        term.proc.send_signal(signal.SIGINT)
        term.until("turn ended: interrupted")
        assert term.wait(timeout=20) == 1  # the turn did not complete; nothing waits for the answer
    assert "cancelled" in term.text and not (src / "made.txt").exists()
