"""``flywheel run`` with untrusted text: lone surrogates, non-UTF-8 names, escape sequences (issue 10)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from agent.events import event_from_json
from agent.parser import encode_call

REPO = Path(__file__).resolve().parents[2]
HOSTILE = "title \x1b]0;pwned\x07 clear \x1b[2J clip \x1b]52;c;ZWNobyBwd25lZA==\x07 c1 \x9b2J lone \ud800\r$ fake prompt"
TERMINAL_ACTIVE = "\x1b\x07\x9b\r"


def run(tmp_path: Path, outputs: list[str], *extra: str) -> subprocess.CompletedProcess[str]:
    script = tmp_path / "outputs.json"
    script.write_text(json.dumps(outputs))  # "\ud800" is written as its JSON escape and read back as a lone surrogate
    ws = tmp_path / "ws"
    ws.mkdir(exist_ok=True)
    (ws / "a.txt").write_text("old\n")
    os.close(os.open(os.fsencode(ws) + b"/\xff.txt", os.O_CREAT | os.O_WRONLY, 0o644))
    return subprocess.run(
        [sys.executable, "-m", "backend.cli", "run", "--workspace", str(ws), "--policy", f"scripted:{script}",
         *extra, "go"],
        capture_output=True, text=True, timeout=120, cwd=REPO, env={**os.environ, "NO_COLOR": "1"},
    )


def test_json_mode_survives_a_lone_surrogate_in_model_text(tmp_path: Path) -> None:
    r = run(tmp_path, [HOSTILE], "--json")
    assert r.returncode == 0, r.stderr
    events = [event_from_json(line) for line in r.stdout.splitlines()]
    assert events[-1].type == "turn_end" and events[-1].reason == "completed"
    message = next(e for e in events if e.type == "assistant_message")
    assert message.text == HOSTILE.replace("\ud800", "\ufffd")  # JSON stays exact for everything encodable
    assert not any(c in r.stdout for c in TERMINAL_ACTIVE)  # escaped by JSON, inert on a terminal


def test_a_non_utf8_file_name_is_listed_as_visible_escape_and_the_turn_completes(tmp_path: Path) -> None:
    r = run(tmp_path, [encode_call("list_dir", {"path": "."}), "listed"], "--json")
    assert r.returncode == 0, r.stderr
    events = [event_from_json(line) for line in r.stdout.splitlines()]
    result = next(e for e in events if e.type == "tool_result")
    assert result.ok and "\\xff.txt" in result.output
    assert events[-1].type == "turn_end" and events[-1].reason == "completed", events[-1]


def test_transcript_and_final_diff_are_inert(tmp_path: Path) -> None:
    name = "evil\x1b]0;t\x07.txt"
    outputs = [HOSTILE + "\n" + encode_call("write_file", {"path": name, "content": "x \x1b[2J y\n"}), "done"]
    r = run(tmp_path, outputs)
    assert r.returncode == 0, r.stderr
    assert not any(c in r.stdout for c in TERMINAL_ACTIVE), r.stdout
    assert "title ^[]0;pwned^G clear ^[[2J" in r.stdout and "^M$ fake prompt" in r.stdout
    assert "+x ^[[2J y" in r.stdout and "workspace changes" in r.stdout  # the final diff, printed by the CLI
