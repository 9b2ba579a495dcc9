"""``flywheel sessions`` and ``flywheel token list|revoke|create``: the server's log, read from the command line."""

from __future__ import annotations

import json
import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from agent.events import event_from_json
from agent.parser import encode_call as call
from backend.cli import main
from backend.db.engine import make_engine
from backend.db.log import SessionLog
from backend.sessions_cli import SessionsError, parse_since
from tools.workspace import remove_store
from tests.backend.conftest import Api, make_api
from tests.backend.test_sessions_api import wait_turn_end


@pytest.fixture
def api(tmp_path: Path) -> Iterator[Api]:
    with make_api(f"sqlite:///{tmp_path / 'data' / 'flywheel.db'}", tmp_path, semantic_search=False) as a:
        yield a


def run(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, str, str]:
    status = main(list(args))
    out, err = capsys.readouterr()
    return status, out, err


def log_args(api: Api) -> list[str]:
    return ["--data-dir", str(api.settings.data_dir)]


def edited_session(api: Api) -> str:
    s = api.create("alice", [
        call("edit_file", {"path": "app.py", "search": "a - b", "replace": "a + b"}),
        call("write_file", {"path": "docs/notes.md", "content": "# notes\n"}),
        "Fixed.",
    ])
    api.client.post(f"/v1/sessions/{s['id']}/messages", json={"text": "fix it"}, headers=api.h("alice"))
    wait_turn_end(api, s["id"])
    return str(s["id"])


def test_list_shows_sessions_with_filters(api: Api, capsys: pytest.CaptureFixture[str]) -> None:
    sid = edited_session(api)
    other = api.create("bob")["id"]
    status, out, _ = run(capsys, "sessions", "list", *log_args(api))
    assert status == 0 and sid[:12] in out and other[:12] in out and str(api.src) in out
    _, out, _ = run(capsys, "sessions", "list", "--owner", "bob", "--json", *log_args(api))
    assert [json.loads(line)["id"] for line in out.splitlines()] == [other]
    _, out, err = run(capsys, "sessions", "list", "--kind", "rl", *log_args(api))
    assert out == "" and "no sessions" in err
    _, out, _ = run(capsys, "sessions", "list", "--since", "1h", "--limit", "1", "--json", *log_args(api))
    assert len(out.splitlines()) == 1
    _, out, _ = run(capsys, "sessions", "list", "--since", "2999-01-01", *log_args(api))
    assert out == ""
    status, _, err = run(capsys, "sessions", "list", "--since", "yesterday", *log_args(api))
    assert status == 1 and "--since 'yesterday'" in err


def test_show_prints_the_record_and_transcript(api: Api, capsys: pytest.CaptureFixture[str]) -> None:
    sid = edited_session(api)
    status, out, _ = run(capsys, "sessions", "show", sid[:8], *log_args(api))
    assert status == 0
    assert f"session:   {sid}" in out and "owner:     alice" in out and "3 recorded outputs" in out
    assert "fix it" in out and "app.py" in out and "turn ended: completed" in out
    _, out, _ = run(capsys, "sessions", "show", sid, "--json", *log_args(api))
    assert json.loads(out)["id"] == sid


@pytest.mark.skipif(shutil.which("git") is None, reason="git is not installed")
def test_diff_is_a_patch_git_apply_accepts(api: Api, capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    sid = edited_session(api)
    status, patch, _ = run(capsys, "sessions", "diff", sid, *log_args(api))
    assert status == 0 and "+    return a + b" in patch and "new file mode 100644" in patch
    repo = tmp_path / "repo"
    shutil.copytree(api.src, repo)
    git = ["git", "-c", "user.email=t@t", "-c", "user.name=t"]
    subprocess.run([*git, "init", "-q"], cwd=repo, check=True)
    subprocess.run([*git, "add", "-A"], cwd=repo, check=True)
    subprocess.run([*git, "commit", "-qm", "start"], cwd=repo, check=True)
    check = subprocess.run([*git, "apply", "--check", "-"], cwd=repo, input=patch, text=True, capture_output=True)
    assert check.returncode == 0, check.stderr
    subprocess.run([*git, "apply", "-"], cwd=repo, input=patch, text=True, check=True)
    assert (repo / "app.py").read_text() == "def add(a, b):\n    return a + b\n"
    assert (repo / "docs" / "notes.md").read_text() == "# notes\n"
    _, out, _ = run(capsys, "sessions", "diff", sid, "--stat", *log_args(api))
    assert out.split() == ["modified", "app.py", "added", "docs/notes.md"]
    status, _, err = run(capsys, "sessions", "diff", sid, "-o", str(tmp_path / "s.patch"), *log_args(api))
    assert status == 0 and (tmp_path / "s.patch").read_text() == patch and "git apply" in err


def test_export_writes_every_event_as_json_lines(api: Api, capsys: pytest.CaptureFixture[str]) -> None:
    sid = edited_session(api)
    status, out, _ = run(capsys, "sessions", "export", sid, *log_args(api))
    events = [event_from_json(line) for line in out.splitlines()]
    assert status == 0 and [e.seq for e in events] == list(range(1, len(events) + 1))
    assert events[0].type == "user_message" and events[-1].type == "turn_end"


def test_bad_ids_and_missing_logs_are_one_line_errors(api: Api, capsys: pytest.CaptureFixture[str],
                                                      tmp_path: Path) -> None:
    api.create("alice")
    for ref, message in [("ffffffff", "no session ffffffff"), ("../x", "is not a session id"), ("", "is not a session id")]:
        status, _, err = run(capsys, "sessions", "show", ref, *log_args(api))
        assert status == 1 and message in err and len(err.strip().splitlines()) == 1, err
    nowhere = tmp_path / "typo"
    status, _, err = run(capsys, "sessions", "list", "--data-dir", str(nowhere))
    assert status == 1 and "no session log at" in err and not nowhere.exists()
    status, _, err = run(capsys, "sessions", "list", "--db", "notaurl")
    assert status == 1 and "not a database URL" in err
    status, _, err = run(capsys, "sessions", "list", "--db", "postgresql+psycopg://u@127.0.0.1:9/x")
    assert status == 1 and "cannot open the session log" in err and len(err.strip().splitlines()) == 1


def test_ambiguous_prefix_is_refused(api: Api, capsys: pytest.CaptureFixture[str]) -> None:
    ids = [api.create("alice")["id"] for _ in range(20)]
    shared = next(a[0] for a in ids if sum(b.startswith(a[0]) for b in ids) > 1)
    status, _, err = run(capsys, "sessions", "show", shared, *log_args(api))
    assert status == 1 and "more than one session" in err


def test_diff_of_a_session_whose_workspace_is_gone(api: Api, capsys: pytest.CaptureFixture[str]) -> None:
    sid = edited_session(api)
    info = api.client.get(f"/v1/sessions/{sid}", headers=api.h("alice")).json()
    remove_store(api.settings.data_dir / "workspaces" / "ws" / info["workspace_id"])  # unmounts first (overlays)
    status, _, err = run(capsys, "sessions", "diff", sid, *log_args(api))
    assert status == 1 and "is gone" in err


def test_parse_since() -> None:
    from datetime import datetime

    now = datetime(2025, 1, 31, 12, 0)
    assert parse_since("30m", now) == datetime(2025, 1, 31, 11, 30)
    assert parse_since("2d", now) == datetime(2025, 1, 29, 12, 0)
    assert parse_since("2025-01-02T03:04+01:00") == datetime(2025, 1, 2, 2, 4)
    with pytest.raises(SessionsError):
        parse_since("soon")


# -- tokens -------------------------------------------------------------------------


def test_token_list_and_revoke(api: Api, capsys: pytest.CaptureFixture[str]) -> None:
    status, out, _ = run(capsys, "token", "list", *log_args(api))
    assert status == 0 and "alice" in out and "staff" in out and "fw_" not in out
    assert api.client.get("/v1/sessions", headers=api.h("bob")).status_code == 200
    status, _, err = run(capsys, "token", "revoke", "bob", *log_args(api))
    assert status == 0 and "revoked" in err
    assert api.client.get("/v1/sessions", headers=api.h("bob")).status_code == 401  # at once, on the running app
    _, out, _ = run(capsys, "token", "list", "--json", *log_args(api))
    assert {t["name"]: t["revoked"] for t in map(json.loads, out.splitlines())} == {
        "alice": False, "bob": True, "sue": False}
    status, _, err = run(capsys, "token", "revoke", "bob", *log_args(api))
    assert status == 1 and "already revoked" in err
    status, _, err = run(capsys, "token", "revoke", "nobody", *log_args(api))
    assert status == 1 and "no token named 'nobody'" in err


def test_token_create_refuses_a_database_no_server_uses(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    data = tmp_path / "fresh"
    status, out, err = run(capsys, "token", "create", "--name", "carol", "--data-dir", str(data))
    assert status == 1 and out == "" and "--create-db" in err and not data.exists()
    status, out, _ = run(capsys, "token", "create", "--name", "carol", "--data-dir", str(data), "--create-db")
    assert status == 0 and out.startswith("fw_")
    log = SessionLog(make_engine(f"sqlite:///{data / 'flywheel.db'}"))
    assert log.verify_token(out.strip()) is not None
    status, out, _ = run(capsys, "token", "create", "--name", "dave", "--data-dir", str(data))  # exists now
    assert status == 0 and out.startswith("fw_")
