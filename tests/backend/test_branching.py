"""Branching a recorded session (``POST /v1/sessions/{id}/branch``, ``backend.replay.plan_branch``).

A branch from step 0 re-asks the first request; a branch cut inside a turn
continues that same turn (its user message, the recorded steps, then the new
policy); a branch whose scripted policy is the session's own script (the demo)
continues the script instead of restarting it.
"""

from __future__ import annotations

import time

import pytest

from agent.events import ListSink
from agent.parser import encode_call as call
from agent.policies.scripted import ScriptedPolicy
from agent.runtime import SessionParts, build_session
from backend.replay import BranchPlan, Continuation, RecordedTurn, branch_consumed, plan_branch, run_recording
from tests.backend.conftest import Api

TURNS = [RecordedTurn("fix it", ["a", "b", "c"]), RecordedTurn("and test", ["d"])]
OUTPUTS = [
    "Reading. " + call("read_file", {"path": "app.py"}),
    call("edit_file", {"path": "app.py", "search": "a - b", "replace": "a + b"}),
    "Fixed.",
]


def test_plan_at_boundaries_and_inside_turns() -> None:
    assert plan_branch(TURNS, 0) == BranchPlan([], Continuation("fix it", []))
    assert plan_branch(TURNS, 2) == BranchPlan([], Continuation("fix it", ["a", "b"]))
    assert plan_branch(TURNS, 3) == BranchPlan([TURNS[0]], Continuation("and test", []))
    assert plan_branch(TURNS, 4) == BranchPlan(TURNS, Continuation(None, [], only_if_tool_results=True))
    assert plan_branch(TURNS, 2, auto_continue=False) == BranchPlan([RecordedTurn("fix it", ["a", "b"])], None)
    assert plan_branch(TURNS, 0, auto_continue=False) == BranchPlan([], None)
    with pytest.raises(ValueError):
        plan_branch(TURNS, 5)


def test_a_scripted_branch_continues_its_own_script() -> None:
    same = {"kind": "scripted", "outputs": ["a", "b", "c", "d"]}
    assert branch_consumed(same, TURNS, 2) == 2 and branch_consumed(same, TURNS, 0) == 0
    assert branch_consumed({"kind": "scripted", "outputs": ["other"]}, TURNS, 2) == 0
    assert branch_consumed({"kind": "openai"}, TURNS, 2) == 0


async def test_a_cut_turn_and_its_continuation_are_one_turn(tmp_path) -> None:  # noqa: ANN001
    from tools.workspace import WorkspaceStore

    src = tmp_path / "src"
    src.mkdir()
    (src / "app.py").write_text("def add(a, b):\n    return a - b\n")
    ws = WorkspaceStore(tmp_path / "store").from_dir(src)
    sink = ListSink()
    branch_policy = ScriptedPolicy(OUTPUTS, consumed=1)  # the session's own script, after step 1
    session = build_session(SessionParts(workspace=ws, sandbox=None), policy=branch_policy, sink=sink)
    plan = plan_branch([RecordedTurn("fix", OUTPUTS)], 1)
    await run_recording(plan.recorded, session)
    assert plan.continuation is not None
    outcome = await session.run_turn(plan.continuation.user_text, policy=plan.continuation.policy(session.policy))
    kinds = [(e.type, getattr(e, "text", None)) for e in sink.events if e.type in ("user_message", "assistant_message")]
    assert kinds == [("user_message", "fix"), *[("assistant_message", o) for o in OUTPUTS]]
    assert outcome.reason == "completed" and {e.turn for e in sink.events} == {1}
    assert "a + b" in (ws.root / "app.py").read_text()


def events_of(api: Api, sid: str, turns: int, timeout: float = 20) -> list[dict]:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        events = api.client.get(f"/v1/sessions/{sid}/events?limit=5000", headers=api.h("alice")).json()["events"]
        info = api.client.get(f"/v1/sessions/{sid}", headers=api.h("alice")).json()
        if sum(e["type"] == "turn_end" for e in events) >= turns and info["status"] == "idle":
            return events
        time.sleep(0.05)
    raise AssertionError(f"no {turns} turn(s): {[e['type'] for e in events]}")


def recorded(api: Api, outputs: list[str]) -> str:
    s = api.create("alice", outputs)
    api.client.post(f"/v1/sessions/{s['id']}/messages", json={"text": "fix"}, headers=api.h("alice"))
    events_of(api, s["id"], 1)
    return str(s["id"])


def branch(api: Api, sid: str, step: int, outputs: list[str], **kw: object) -> str:
    r = api.client.post(f"/v1/sessions/{sid}/branch", headers=api.h("alice"),
                        json={"from_step": step, "policy": {"kind": "scripted", "outputs": outputs}, **kw})
    assert r.status_code == 201, r.text
    return str(r.json()["id"])


def summary(events: list[dict]) -> list[tuple[int, str, str]]:
    keep = ("user_message", "assistant_message", "turn_end")
    return [(e["turn"], e["type"], e.get("text", e.get("reason", ""))) for e in events if e["type"] in keep]


def test_a_branch_from_step_0_reasks_the_first_request(api: Api) -> None:
    sid = recorded(api, OUTPUTS)
    b = branch(api, sid, 0, ["I would rather not."])
    assert summary(events_of(api, b, 1)) == [
        (1, "user_message", "fix"), (1, "assistant_message", "I would rather not."), (1, "turn_end", "completed")]
    r = api.client.post(f"/v1/sessions/{b}/messages", json={"text": "go on"}, headers=api.h("alice"))
    assert r.status_code == 202  # a usable session


def test_a_branch_inside_a_turn_continues_that_turn(api: Api) -> None:
    sid = recorded(api, OUTPUTS)
    b = branch(api, sid, 1, ["Not changing it."])
    assert summary(events_of(api, b, 1)) == [
        (1, "user_message", "fix"), (1, "assistant_message", OUTPUTS[0]), (1, "assistant_message", "Not changing it."),
        (1, "turn_end", "completed")]
    assert api.client.get(f"/v1/sessions/{b}/diff", headers=api.h("alice")).json()["diff"] == ""


def test_a_branch_with_the_sessions_own_script_continues_it(api: Api) -> None:
    sid = recorded(api, OUTPUTS)
    b = branch(api, sid, 1, OUTPUTS)  # e.g. the demo policy: the same script
    texts = [t for _, kind, t in summary(events_of(api, b, 1)) if kind == "assistant_message"]
    assert texts == OUTPUTS  # step 1 re-executed, then steps 2 and 3: not the script from its start
    assert "+    return a + b" in api.client.get(f"/v1/sessions/{b}/diff", headers=api.h("alice")).json()["diff"]


def test_without_auto_continue_a_branch_stops_at_its_step(api: Api) -> None:
    sid = recorded(api, OUTPUTS)
    b = branch(api, sid, 1, ["x"], auto_continue=False)
    assert summary(events_of(api, b, 1)) == [
        (1, "user_message", "fix"), (1, "assistant_message", OUTPUTS[0]), (1, "turn_end", "max_steps")]


@pytest.mark.parametrize("own_script", [False, True])
def test_a_reloaded_branch_goes_on_where_its_script_is(api: Api, own_script: bool) -> None:
    # After its turn nobody watches the branch, so the hub drops it from memory and the next
    # message rebuilds it from the log: its script must resume after what it produced, not
    # after every output in its log (the re-executed step is not the script's own).
    sid = recorded(api, OUTPUTS)
    script = [*OUTPUTS, "More."] if own_script else ["Not changing it.", "More."]
    b = branch(api, sid, 1, script)
    events_of(api, b, 1)
    r = api.client.post(f"/v1/sessions/{b}/messages", json={"text": "go on"}, headers=api.h("alice"))
    assert r.status_code == 202
    assert summary(events_of(api, b, 2))[-2:] == [(2, "assistant_message", "More."), (2, "turn_end", "completed")]
