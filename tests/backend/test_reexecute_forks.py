"""Re-execution on other copies of the workspace: a deterministic session whose
commands print paths (pwd, a traceback, git status) re-executes with 0
divergences, and two re-executions on two different forks give byte-identical
tool results — tool results do not depend on where a workspace lives."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from agent.events import ListSink, ToolResultEvent
from agent.parser import encode_call as call
from agent.policies.scripted import ScriptedPolicy
from agent.runtime import SessionParts, build_session
from backend.replay import reexecute
from tools.sandbox import make_sandbox
from tools.workspace import WorkspaceStore

pytestmark = pytest.mark.skipif(shutil.which("bwrap") is None, reason="bubblewrap (bwrap) is not installed")

COMMANDS = [
    "pwd && realpath boom.py",
    "python3 boom.py",  # a traceback names the script's path
    "git init -q && git add -A && git status --short && git rev-parse --show-toplevel",
    "ls /workspace/.. && echo $HOME && hostname",
]
OUTPUTS = [
    "Looking around.\n" + "".join(call("run_command", {"command": c}) for c in COMMANDS)
    + call("read_file", {"path": "boom.py"}) + call("grep", {"pattern": "raise"}),
    "Done.",
]


@pytest.fixture
def src(tmp_path: Path) -> Path:
    src = tmp_path / "src"
    src.mkdir()
    (src / "boom.py").write_text("def f():\n    raise ValueError('boom')\n\nf()\n")
    return src


async def run_session(parts: SessionParts) -> tuple[str, list]:
    sink = ListSink()
    session = build_session(parts, policy=ScriptedPolicy(OUTPUTS), sink=sink)
    outcome = await session.run_turn("show me where you are")
    assert outcome.reason == "completed"
    return session.session_id, sink.events


def results(events: list) -> list[tuple[str, bool, str]]:
    """In call order (results arrive in completion order)."""
    found = [(e.call_id, e.ok, e.output) for e in events if isinstance(e, ToolResultEvent)]
    return sorted(found, key=lambda r: int(r[0].rsplit("c", 1)[1]))


async def test_reexecute_on_two_forks_has_no_divergence(src: Path, tmp_path: Path) -> None:
    sandbox = make_sandbox()
    original = WorkspaceStore(tmp_path / "store-a").from_dir(src)
    sid, recorded = await run_session(SessionParts(original, sandbox))
    outputs = results(recorded)
    assert len(outputs) == len(COMMANDS) + 2
    assert "/workspace" in outputs[0][2] and 'File "/workspace/boom.py"' in outputs[1][2]
    for _, _, out in outputs:  # no host path of any of the copies leaks into a result
        assert str(tmp_path) not in out

    replays = []
    for _ in range(2):  # two fresh copies of the starting state, each in its own directory
        copy = original.store.from_snapshot(original.base)
        assert copy.root != original.root and copy.root not in [r.root for r in replays]
        report = await reexecute(sid, recorded, SessionParts(copy, sandbox))
        assert report.counts == {"same": len(outputs), "differs": 0, "missing": 0, "extra": 0}, report.to_json()
        replays.append(copy)

    # and the two forks' own sessions are byte-identical, call for call
    a = results((await run_session(SessionParts(replays[0].fork(), sandbox)))[1])
    b = results((await run_session(SessionParts(replays[1].fork(), sandbox)))[1])
    assert a == b == outputs
