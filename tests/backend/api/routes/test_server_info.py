"""GET /v1/workspaces and GET /v1/policies."""

from __future__ import annotations

import subprocess
from pathlib import Path

from backend.policies import DEMO_DIR
from tests.backend.conftest import Api, make_api
from tests.backend.test_contracts import assert_error


def test_workspaces_lists_the_roots_and_their_directories(api: Api) -> None:
    (api.src / "pkg").mkdir()
    (api.src / ".hidden").mkdir()
    (api.src / "repo").mkdir()
    subprocess.run(["git", "init", "-q", str(api.src / "repo")], check=True)
    body = api.client.get("/v1/workspaces", headers=api.h("alice")).json()
    assert body["roots"] == [str(api.src.resolve())]
    got = {w["path"]: w for w in body["suggested"]}
    assert set(got) == {str(api.src.resolve()), str(api.src.resolve() / "pkg"), str(api.src.resolve() / "repo")}
    assert got[str(api.src.resolve() / "repo")]["git"] is True and got[str(api.src.resolve() / "pkg")]["git"] is False
    r = api.client.post("/v1/sessions", headers=api.h("alice"),
                        json={"workspace": {"path": body["suggested"][1]["path"]}, "policy": {"kind": "scripted", "outputs": []}})
    assert r.status_code == 201  # what it suggests is accepted
    assert_error(api.client.get("/v1/workspaces"), 401, "unauthorized")


def test_policies_offer_the_demo_where_its_workspace_is_allowed(api: Api, tmp_path: Path) -> None:
    body = api.client.get("/v1/policies", headers=api.h("alice")).json()
    assert body["kinds"] == ["scripted"] and body["openai_model"] is None
    demo = body["presets"][0]
    assert demo["name"] == "demo" and demo["workspace"] is None and "stats.py" in demo["request"]
    (tmp_path / "b").mkdir()
    with make_api(f"sqlite:///{tmp_path / 'b.db'}", tmp_path / "b", semantic_search=False,
                  openai_base_url="http://127.0.0.1:9/v1", openai_model="m") as other:
        state = other.client.app.state.flywheel  # type: ignore[attr-defined]
        state.settings.allowed_roots.append((DEMO_DIR / "workspace").resolve())
        body = other.client.get("/v1/policies", headers=other.h("alice")).json()
        assert body["kinds"] == ["scripted", "openai"] and body["openai_model"] == "m"
        preset = body["presets"][0]
        assert preset["workspace"] == str((DEMO_DIR / "workspace").resolve())
        r = other.client.post("/v1/sessions", headers=other.h("alice"),
                              json={"workspace": {"path": preset["workspace"]}, "policy": preset["policy"]})
        assert r.status_code == 201, r.text
