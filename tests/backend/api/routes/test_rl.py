"""The RL routes (staff only): runs, curves, the rollouts behind a curve point (SQLite and PostgreSQL)."""

from __future__ import annotations

from backend.rl_log import RLSessionLog
from tests.backend.conftest import Api
from tests.backend.test_contracts import assert_error


def seed(api: Api) -> RLSessionLog:
    state = api.client.app.state.flywheel  # type: ignore[attr-defined]
    rl = RLSessionLog(state.log, state.store)
    rl.record_run({"iterations": 2, "lr": 1e-5}, run_id="run-a")
    rl.record_iteration("run-a", 0, {"iteration": 0, "success_rate": 0.25, "mean_reward": 0.1,
                                     "heldout_pass_at_1": 0.0, "logprob_diff_mean": 0.01})
    rl.record_iteration("run-a", 1, {"iteration": 1, "success_rate": 0.5, "mean_reward": 0.4, "note": "text",
                                     "parallel_call_share": 0.3})
    for it in (0, 1):
        for task in ("t-b", "t-a"):
            for sample in (1, 0):
                sid = f"r{it}{task[-1]}{sample}".ljust(32, "0")
                rl.create_session(session_id=sid, run_id="run-a", iteration=it, task_id=task, sample=sample)
                rl.finish(sid, reward=float(sample) * (it + 1) / 2, status="finished")
    rl.create_session(session_id="h" * 32, run_id="run-a/heldout", iteration=1, task_id="t-h", sample=0)
    rl.record_run({}, run_id="run-b")
    rl.set_run_status("run-a", "finished")
    return rl


def test_runs_curves_and_rollouts(api: Api) -> None:
    seed(api)
    h = api.h("sue")
    listed = api.client.get("/v1/rl/runs", headers=h).json()
    assert [r["id"] for r in listed] == ["run-b", "run-a"]
    a = listed[1]
    assert (a["status"], a["iterations"], a["last_iteration"], a["rollouts"], a["heldout_rollouts"]) == \
        ("finished", 2, 1, 8, 1)
    curves = api.client.get("/v1/rl/runs/run-a", headers=h).json()
    assert curves["iterations"] == [0, 1] and curves["config"] == {"iterations": 2, "lr": 1e-5}
    assert curves["series"]["success_rate"] == [0.25, 0.5]
    assert curves["series"]["parallel_call_share"] == [None, 0.3]  # not measured at iteration 0
    assert "note" not in curves["series"] and "iteration" not in curves["series"]
    panels = {p["title"]: p["keys"] for p in curves["panels"]}
    assert panels["success rate"] == ["success_rate"] and panels["sampler/trainer mismatch"] == ["logprob_diff_mean"]
    assert "blind-edit rate" not in panels  # never recorded
    it1 = api.client.get("/v1/rl/runs/run-a/iterations/1/rollouts", headers=h).json()
    assert [t["task"] for t in it1["tasks"]] == ["t-a", "t-b"]
    first = it1["tasks"][0]
    assert [r["sample"] for r in first["rollouts"]] == [0, 1] and [r["reward"] for r in first["rollouts"]] == [0.0, 1.0]
    assert first["mean_reward"] == 0.5 and first["best_reward"] == 1.0
    sid = first["rollouts"][1]["session_id"]
    session = api.client.get(f"/v1/sessions/{sid}", headers=h).json()  # one click on: the rollout itself
    assert (session["kind"], session["rl_iteration"], session["rl_task"]) == ("rl", 1, "t-a")
    held = api.client.get("/v1/rl/runs/run-a/iterations/1/rollouts?split=heldout", headers=h).json()
    assert [(t["task"], t["rollouts"][0]["status"], t["mean_reward"]) for t in held["tasks"]] == [("t-h", None, None)]
    assert api.client.get("/v1/rl/runs/run-a/iterations/7/rollouts", headers=h).json()["tasks"] == []
    assert_error(api.client.get("/v1/rl/runs/nope", headers=h), 404, "not_found")
    assert_error(api.client.get("/v1/rl/runs/nope/iterations/0/rollouts", headers=h), 404, "not_found")
    assert_error(api.client.get("/v1/rl/runs/run-a/iterations/-1/rollouts", headers=h), 422)
    assert_error(api.client.get("/v1/rl/runs/run-a/iterations/0/rollouts?split=x", headers=h), 422)


def test_users_are_refused(api: Api) -> None:
    seed(api)
    for path in ("/v1/rl/runs", "/v1/rl/runs/run-a", "/v1/rl/runs/run-a/iterations/0/rollouts"):
        assert_error(api.client.get(path, headers=api.h("alice")), 403, "forbidden")
