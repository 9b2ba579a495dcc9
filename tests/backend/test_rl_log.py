"""RL rollouts in the session log: recorded through RLSessionLog, listed, and re-executed by the server with 0 divergences."""

from __future__ import annotations

from pathlib import Path

import pytest

from agent.parser import encode_call as call
from agent.prompt import COMPACT_PROFILE
from backend.db.engine import make_engine
from backend.db.log import SessionLog
from backend.rl_log import RLSessionLog, RolloutLogError
from rl.rollout.log import persist
from rl.rollout.worker import DirTask, RolloutJob, RolloutRunner, WorkerConfig
from rl.types import Rollout, RolloutStatus
from tests.agent.model.test_engine import tiny_tokenizer
from tests.backend.conftest import make_api
from tools.workspace import WorkspaceStore

OUTPUTS = [
    "Look first." + call("read_file", {"path": "app.py"}) + call("run_command", {"command": "cat app.py; pwd; ls"}),
    "Fix." + call("edit_file", {"path": "app.py", "search": "a - b", "replace": "a + b"}),
    "Check." + call("run_command", {"command": "python3 -c 'import app; print(app.add(2, 3))'"}),
    "Done.",
]


RUN = "smoke-2026-12-02-seed0"
TASK = "fix_bug-train-d3-00042"


async def _rollout(tmp_path: Path, sample: int = 0) -> Rollout:
    """One rollout through the real path without Ray: fork, build_session, production tools, bwrap, TITO."""
    from agent.policies.tito import ScriptedCompleter

    src = tmp_path / "task"
    src.mkdir(exist_ok=True)
    (src / "app.py").write_text("def add(a, b):\n    return a - b\n")
    tok = tiny_tokenizer()
    config = WorkerConfig(store_root=str(tmp_path / "worker-store"), return_routes=False)
    runner = RolloutRunner(config, ScriptedCompleter(OUTPUTS, tok), tok, COMPACT_PROFILE)
    # realistic ids: the worker's session id must not grow with them (sessions.id is VARCHAR(32))
    task = DirTask(TASK, "fix add in app.py", str(src))
    [rollout] = await runner.run([RolloutJob(task, RUN, 3, sample)])
    assert rollout.status is RolloutStatus.FINISHED, rollout.detail
    rollout.reward = 1.0
    return rollout




async def test_a_recorded_rollout_reexecutes_through_the_server_with_0_divergences(db_url: str, tmp_path: Path) -> None:
    rollout = await _rollout(tmp_path)
    assert len(rollout.session_id) <= 32  # the log's sessions.id is VARCHAR(32) (PostgreSQL enforces it)
    with make_api(db_url, tmp_path, semantic_search=False) as api:
        engine = make_engine(db_url)
        try:
            rl_log = RLSessionLog(SessionLog(engine), WorkspaceStore(api.settings.data_dir / "workspaces"))
            run_id = rl_log.record_run({"name": RUN, "group_size": 4}, run_id=RUN)
            persist(rl_log, rollout, rollout.events)
            rl_log.record_iteration(run_id, 3, {"success_rate": 1.0})
            stored = SessionLog(engine).all_events(rollout.session_id)
        finally:
            engine.dispose()
        assert [e.seq for e in stored] == [e["seq"] for e in rollout.events]  # the worker's seq kept
        assert [e.model_dump(mode="json") for e in stored] == rollout.events

        sid = rollout.session_id
        r = api.client.post(f"/v1/sessions/{sid}/reexecute", headers=api.h("sue"))
        assert r.status_code == 200, r.text
        report = r.json()
        assert report["counts"] == {"same": 4, "differs": 0, "missing": 0, "extra": 0}, report

        timeline = api.client.get(f"/v1/sessions/{sid}/timeline", headers=api.h("sue")).json()
        assert [e["seq"] for e in timeline] == [e["seq"] for e in rollout.events]
        info = api.client.get(f"/v1/sessions/{sid}", headers=api.h("sue")).json()
        assert (info["kind"], info["owner"], info["rl_run"], info["rl_iteration"], info["rl_task"], info["rl_sample"],
                info["rl_reward"], info["rl_status"]) == ("rl", "rl", RUN, 3, TASK, 0, 1.0, "finished")

        api.create("alice")  # a user session beside it
        listed = api.client.get("/v1/sessions", params={"kind": "rl", "run": RUN}, headers=api.h("sue")).json()
        assert [s["id"] for s in listed] == [sid]
        users = api.client.get("/v1/sessions", params={"kind": "user"}, headers=api.h("sue")).json()
        assert len(users) == 1 and users[0]["kind"] == "user" and users[0]["rl_run"] is None
        assert api.client.get("/v1/sessions", params={"run": "other"}, headers=api.h("sue")).json() == []
        # users never see rollouts: listing is their own sessions, and a rollout's pages are staff-only
        assert api.client.get("/v1/sessions", params={"kind": "rl"}, headers=api.h("alice")).json() == []
        assert api.client.get(f"/v1/sessions/{sid}/timeline", headers=api.h("alice")).status_code in (403, 404)


def _log(tmp_path: Path) -> tuple[RLSessionLog, SessionLog]:
    from backend.db.engine import migrate

    engine = make_engine(f"sqlite:///{tmp_path / 'rl.db'}")
    migrate(engine)
    log = SessionLog(engine)
    return RLSessionLog(log, WorkspaceStore(tmp_path / "server-store")), log


async def test_starting_bytes_missing_everywhere_are_refused_naming_the_file(tmp_path: Path) -> None:
    rollout = await _rollout(tmp_path)
    rl_log, log = _log(tmp_path)
    rollout.blob_root = str(tmp_path / "nowhere")
    with pytest.raises(RolloutLogError, match=r"'app.py' \(blob [0-9a-f]{64}\) are in neither"):
        persist(rl_log, rollout, rollout.events)
    assert log.get_session(rollout.session_id) is None  # nothing half-recorded


async def test_events_of_another_session_or_out_of_order_are_refused_before_writing(tmp_path: Path) -> None:
    rollout = await _rollout(tmp_path)
    rl_log, log = _log(tmp_path)
    rl_log.create_session(session_id=rollout.session_id, run_id="r", iteration=0, task_id="t", sample=0,
                          base_snapshot=rollout.base_snapshot, blob_root=rollout.blob_root)
    foreign = [dict(rollout.events[0], session_id="someoneelse")]
    with pytest.raises(RolloutLogError, match="belongs to session 'someoneelse'"):
        rl_log.append_events(rollout.session_id, rollout.events[:2] + foreign)
    with pytest.raises(RolloutLogError, match="increasing seq order"):
        rl_log.append_events(rollout.session_id, rollout.events[1:2] + rollout.events[:1])
    with pytest.raises(RolloutLogError, match="not a valid event"):
        rl_log.append_events(rollout.session_id, [{"type": "no_such_event"}])
    assert log.all_events(rollout.session_id) == []
    with pytest.raises(RolloutLogError, match="not one of finished, limit"):
        rl_log.finish(rollout.session_id, reward=0.0, status="done")


def test_a_rollout_that_never_forked_is_recorded_with_an_empty_start_and_too_long_ids_are_refused(
        tmp_path: Path) -> None:
    rl_log, log = _log(tmp_path)
    rl_log.create_session(session_id="rl" + "0" * 30, run_id="r", iteration=0, task_id="t", sample=1)
    rl_log.finish("rl" + "0" * 30, reward=None, status="infra_error")
    info = log.get_session("rl" + "0" * 30)
    assert info is not None and (info.rl_status, info.rl_reward, info.rl_sample) == ("infra_error", None, 1)
    assert log.load_snapshot(info.base_snapshot).manifest == {}
    with pytest.raises(RolloutLogError, match="33 characters"):
        rl_log.create_session(session_id="x" * 33, run_id="r", iteration=0, task_id="t", sample=0)


def test_runs_and_iterations_are_recorded_and_a_repeated_iteration_replaces_its_metrics(tmp_path: Path) -> None:
    rl_log, _ = _log(tmp_path)
    run = rl_log.record_run({"lr": 1e-5, "presets": ["tiny"]})
    assert rl_log.get_run(run)["config"] == {"lr": 1e-5, "presets": ["tiny"]}  # type: ignore[index]
    with pytest.raises(RolloutLogError, match="already recorded"):
        rl_log.record_run({}, run_id=run)
    with pytest.raises(RolloutLogError, match="not JSON"):
        rl_log.record_run({"x": float("nan")})
    with pytest.raises(RolloutLogError, match="record_run before"):
        rl_log.record_iteration("nope", 0, {})
    rl_log.record_iteration(run, 0, {"loss": 1.0})
    rl_log.record_iteration(run, 1, {"loss": 0.5})
    rl_log.record_iteration(run, 1, {"loss": 0.4})  # resumed and repeated
    assert rl_log.iterations(run) == [(0, {"loss": 1.0}), (1, {"loss": 0.4})]
    rl_log.set_run_status(run, "finished")
    assert rl_log.get_run(run)["status"] == "finished"  # type: ignore[index]


async def test_open_rollout_log_uses_the_servers_database_and_store(tmp_path: Path) -> None:
    from backend.rl_log import open_rollout_log
    from backend.settings import Settings

    settings = Settings(data_dir=tmp_path / "data", port=0)
    rollout = await _rollout(tmp_path)
    rl_log = open_rollout_log(settings)
    try:
        persist(rl_log, rollout, rollout.events)
        assert rl_log.store.root == (tmp_path / "data" / "workspaces").resolve()
        assert rl_log.log.get_session(rollout.session_id).rl_status == "finished"  # type: ignore[union-attr]
    finally:
        rl_log.log.engine.dispose()
