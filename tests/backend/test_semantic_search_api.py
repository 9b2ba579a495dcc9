"""The server as deployed (semantic_search on): sessions index their workspace in the background,
the tool answers "still being built" until then, edits reach the index, and re-execution matches."""

from __future__ import annotations

import os
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from agent.parser import encode_call as call
from tests.backend.conftest import Api, make_api
from tests.backend.test_sessions_api import wait_turn_end

os.environ.setdefault("HF_HUB_OFFLINE", "1")


@pytest.fixture
def search_api(tmp_path: Path) -> Iterator[Api]:
    with make_api(f"sqlite:///{tmp_path / 'fw.db'}", tmp_path) as a:  # default settings: semantic_search on
        yield a


def _results(events: list[dict]) -> list[dict]:
    return [e for e in events if e["type"] == "tool_result" and e["name"] == "semantic_search"]


def test_session_searches_its_workspace_and_sees_its_own_edits(search_api: Api) -> None:
    api = search_api
    hub = api.client.app.state.flywheel.hub  # type: ignore[attr-defined]
    assert hub.indexes is not None
    hub.indexes.wait_s = 120.0  # the first search waits for the build (which loads the embedding model)
    s = api.create("alice", [
        call("semantic_search", {"query": "add two numbers"}),
        call("write_file", {"path": "stats.py",
                            "content": "def median(xs):\n    xs = sorted(xs)\n    return xs[len(xs) // 2]\n"}),
        call("semantic_search", {"query": "middle value of a sorted list", "k": "1"}),
        "done",
    ])
    h = api.h("alice")
    assert len(hub.indexes) == 0  # nothing is indexed before a search
    api.client.post(f"/v1/sessions/{s['id']}/messages", json={"text": "find it"}, headers=h)
    events = wait_turn_end(api, s["id"], timeout=180)
    first, second = _results(events)
    assert first["ok"] and first["output"].startswith("app.py:1-2  add  "), first
    assert second["ok"] and second["output"].startswith("stats.py:1-3  median  "), second  # the session's own edit

    report = api.client.post(f"/v1/sessions/{s['id']}/reexecute", headers=h).json()
    assert report["counts"] == {"same": 3, "differs": 0, "missing": 0, "extra": 0}, report


def test_search_before_the_index_is_built_is_an_error_result_not_a_failure(search_api: Api) -> None:
    api = search_api
    hub = api.client.app.state.flywheel.hub  # type: ignore[attr-defined]
    hub.indexes.wait_s = 0.0
    blocker = hub.indexes.submit(lambda: time.sleep(1.5))  # the one build worker is busy
    s = api.create("alice", [call("semantic_search", {"query": "add"}), "ok"])
    api.client.post(f"/v1/sessions/{s['id']}/messages", json={"text": "go"}, headers=api.h("alice"))
    events = wait_turn_end(api, s["id"], timeout=60)
    (res,) = _results(events)
    assert not res["ok"] and "still being built" in res["output"] and "grep" in res["output"], res
    blocker.result()


def test_index_dir_setting_and_the_cli_default_agree(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from backend.settings import LocalSettings

    def default_data_dir() -> Path:  # what `flywheel index` and `flywheel run --semantic-search` use
        return LocalSettings().search_index_dir

    monkeypatch.setenv("FLYWHEEL_INDEX_DIR", str(tmp_path / "shared-index"))
    assert default_data_dir() == tmp_path / "shared-index"  # what `flywheel index` uses
    with make_api(f"sqlite:///{tmp_path / 'fw.db'}", tmp_path) as api:  # Settings reads FLYWHEEL_INDEX_DIR too
        assert api.client.app.state.flywheel.hub.indexes.data_dir == tmp_path / "shared-index"  # type: ignore[attr-defined]
    monkeypatch.delenv("FLYWHEEL_INDEX_DIR")
    monkeypatch.delenv("FLYWHEEL_DATA_DIR", raising=False)  # tests/conftest.py sets one for the suite
    monkeypatch.setenv("XDG_DATA_HOME", str(tmp_path / "xdg"))
    assert default_data_dir() == tmp_path / "xdg" / "flywheel" / "index"


def test_reexecute_and_branch_of_a_session_that_never_searched_do_not_load_the_embedder(search_api: Api) -> None:
    api = search_api
    hub = api.client.app.state.flywheel.hub  # type: ignore[attr-defined]
    s = api.create("alice", [call("read_file", {"path": "app.py"}), "it subtracts"])
    h = api.h("alice")
    api.client.post(f"/v1/sessions/{s['id']}/messages", json={"text": "look"}, headers=h)
    wait_turn_end(api, s["id"])
    report = api.client.post(f"/v1/sessions/{s['id']}/reexecute", headers=h).json()
    assert report["counts"] == {"same": 1, "differs": 0, "missing": 0, "extra": 0}, report
    r = api.client.post(f"/v1/sessions/{s['id']}/branch", headers=h,
                        json={"from_step": 1, "policy": {"kind": "scripted", "outputs": ["branched"]}})
    assert r.status_code == 201, r.text
    branch = wait_turn_end(api, r.json()["id"], turns=1)
    assert [e["text"] for e in branch if e["type"] == "assistant_message"][-1] == "branched"
    # the branch still offers semantic_search (same tool set as the original), but nothing was indexed
    live = hub.live.get(r.json()["id"])
    assert live is None or "semantic_search" in live.session.tools
    assert hub.indexes._embedder is None  # the embedding model was never loaded
    assert {ix.state for ix in hub.indexes._indexes.values()} <= {"idle"}  # no index was built or queued
