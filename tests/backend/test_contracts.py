"""The server API's contracts: typed responses in /openapi.json and one error shape everywhere."""

from __future__ import annotations

import dataclasses
import re
from pathlib import Path
from typing import Any

import pytest

from backend import errors
from backend.api.routes.schemas import Session
from backend.app import status_of
from backend.db.log import SessionInfo
from tools.workspace import remove_store
from tests.backend.conftest import Api

REPO = Path(__file__).resolve().parents[2]
ERROR_KEYS = {"detail", "code", "errors"}


def resolve(spec: dict[str, Any], schema: dict[str, Any]) -> dict[str, Any]:
    while "$ref" in schema:
        name = schema["$ref"].rsplit("/", 1)[-1]
        schema = spec["components"]["schemas"][name]
    return schema


def is_real_shape(spec: dict[str, Any], schema: dict[str, Any]) -> bool:
    """A schema that says what is inside: an object with properties, a union of such, or an array of them
    (not ``{}`` nor a free-form ``{"type": "object", "additionalProperties": true}``)."""
    schema = resolve(spec, schema)
    if schema.get("type") == "array":
        return is_real_shape(spec, schema.get("items", {}))
    for key in ("oneOf", "anyOf"):
        if key in schema:
            return all(is_real_shape(spec, s) for s in schema[key])
    return bool(schema.get("properties"))


def assert_error(r: Any, status: int, code: str | None = None) -> dict[str, Any]:
    assert r.status_code == status, (r.status_code, r.text[:300])
    body = r.json()
    assert set(body) == ERROR_KEYS, body
    assert isinstance(body["detail"], str) and body["detail"] and "\n" not in body["detail"]
    assert isinstance(body["code"], str) and isinstance(body["errors"], list)
    if code is not None:
        assert body["code"] == code, body
    return body


def test_every_route_documents_a_typed_response_and_the_error_shape(api: Api) -> None:
    spec = api.client.get("/openapi.json").json()
    operations = [(m, p, op) for p, ops in spec["paths"].items() for m, op in ops.items()]
    assert len(operations) >= 12
    error_ref = "#/components/schemas/ErrorBody"
    for method, path, op in operations:
        ok = {s: r for s, r in op["responses"].items() if s.startswith("2")}
        assert ok, (method, path)
        for status, response in ok.items():
            schema = response.get("content", {}).get("application/json", {}).get("schema")
            assert schema is not None and is_real_shape(spec, schema), (method, path, status, schema)
        for status in ("401", "422"):
            if path == "/health" and status == "401":
                continue
            schema = op["responses"][status]["content"]["application/json"]["schema"]
            assert schema == {"$ref": error_ref}, (method, path, status, schema)
    assert "HTTPValidationError" not in spec["components"]["schemas"]  # FastAPI's default 422 body is not used
    # events are documented as the discriminated union, not as free-form objects
    page = resolve(spec, {"$ref": "#/components/schemas/EventsPage"})
    items = resolve(spec, page["properties"]["events"]["items"])
    assert "discriminator" in items and "turn_end" in items["discriminator"]["mapping"]


def test_the_session_schema_lists_every_session_field() -> None:
    assert {f.name for f in dataclasses.fields(SessionInfo)} <= set(Session.model_fields)


def test_errors_have_one_shape(api: Api) -> None:
    s = api.create("alice")
    h = api.h("alice")
    assert_error(api.client.get("/v1/sessions"), 401, "unauthorized")
    assert api.client.get("/v1/sessions").headers["www-authenticate"] == "Bearer"
    assert_error(api.client.get("/v1/sessions", headers={"Authorization": "Bearer fw_nope"}), 401, "unauthorized")
    assert_error(api.client.get("/v1/nothing-here", headers=h), 404, "not_found")
    assert_error(api.client.get("/nothing"), 404, "not_found")
    assert_error(api.client.get("/v1/sessions/0123456789abcdef", headers=h), 404, "not_found")
    assert_error(api.client.delete("/v1/sessions", headers=h), 405, "method_not_allowed")
    assert_error(api.client.get(f"/v1/sessions/{s['id']}", headers=api.h("bob")), 403, "forbidden")
    body = assert_error(api.client.post("/v1/sessions", json={"policy": {}}, headers=h), 422, "invalid_request")
    assert ["body", "workspace"] in [e["loc"] for e in body["errors"]]
    assert_error(api.client.post("/v1/sessions", content=b"{not json", headers={**h, "Content-Type": "application/json"}),
                 422, "invalid_request")
    assert_error(api.client.get("/v1/sessions?limit=0", headers=h), 422, "invalid_request")
    bad_policy = {"workspace": {"path": str(api.src)}, "policy": {"kind": "gpt5"}}
    body = assert_error(api.client.post("/v1/sessions", json=bad_policy, headers=h), 400, "bad_policy")
    assert "unknown policy kind" in body["detail"]
    assert_error(api.client.post("/v1/sessions", json={"workspace": {"path": "/etc"}, "policy": {"kind": "scripted",
                 "outputs": []}}, headers=h), 403, "forbidden")
    bad_step = {"from_step": 99, "policy": {"kind": "scripted", "outputs": []}}
    assert_error(api.client.post(f"/v1/sessions/{s['id']}/branch", json=bad_step, headers=h), 400)


@pytest.mark.parametrize("body", [
    {"policy": {"kind": "openai", "model": "m" * 100_000}},
    {"policy": {"kind": "scripted", "outputs": [], "chunk_chars": "9" * 100_000}},
    {"title": "t" * 100_000},
    {"workspace": {"path": "/" + "p" * 100_000}},
    {"workspace": {"git": "/" + "g" * 100_000}},
])
def test_oversized_fields_are_refused_with_422(api: Api, body: dict[str, Any]) -> None:
    full = {"workspace": {"path": str(api.src)}, "policy": {"kind": "scripted", "outputs": []}, **body}
    r = api.client.post("/v1/sessions", json=full, headers=api.h("alice"))
    err = assert_error(r, 422, "invalid_request")
    assert len(r.content) < 2000  # the huge input is not echoed back
    assert err["errors"] and err["errors"][0]["loc"][0] == "body"
    s = api.create("alice")
    if "policy" in body:  # branching takes a policy too
        r = api.client.post(f"/v1/sessions/{s['id']}/branch", json={"from_step": 0, **body}, headers=api.h("alice"))
        assert_error(r, 422, "invalid_request")


def test_out_of_range_query_values_are_422_not_500(api: Api) -> None:
    s = api.create("alice")
    h = api.h("alice")
    for query in (f"after={2**31}", f"after={2**63}", f"after={10**30}", "after=-1", "limit=5001"):
        assert_error(api.client.get(f"/v1/sessions/{s['id']}/events?{query}", headers=h), 422, "invalid_request")
    assert api.client.get(f"/v1/sessions/{s['id']}/events?after={2**31 - 1}", headers=h).json()["events"] == []
    assert api.client.get(f"/v1/sessions?offset={2**63 - 1}", headers=h).json() == []
    assert_error(api.client.get(f"/v1/sessions?offset={2**63}", headers=h), 422, "invalid_request")
    body = {"from_step": 2**31, "policy": {"kind": "scripted", "outputs": []}}
    assert_error(api.client.post(f"/v1/sessions/{s['id']}/branch", json=body, headers=h), 422, "invalid_request")
    assert_error(api.client.get(f"/v1/sessions/{'x' * 10_000}", headers=h), 422, "invalid_request")


def test_a_message_to_a_session_whose_workspace_is_gone_is_410(api: Api) -> None:
    s = api.create("alice")
    remove_store(api.settings.data_dir / "workspaces" / "ws" / s["workspace_id"])  # unmounts first (overlays)
    r = api.client.post(f"/v1/sessions/{s['id']}/messages", json={"text": "hi"}, headers=api.h("alice"))
    assert_error(r, 410, "gone")
    assert_error(api.client.get(f"/v1/sessions/{s['id']}/diff", headers=api.h("alice")), 410, "gone")


def test_typed_bodies_keep_their_shapes(api: Api) -> None:
    s = api.create("alice")
    h = api.h("alice")
    assert api.client.get("/health").json() == {"status": "ok"}
    assert api.client.post(f"/v1/sessions/{s['id']}/interrupt", headers=h).json() == {"interrupted": False}
    got = api.client.get(f"/v1/sessions/{s['id']}", headers=h).json()
    assert got == s and got["created_at"].endswith("Z") and got["parent_id"] is None


def test_docs_are_public_and_the_readme_says_so(api: Api) -> None:
    for path in ("/openapi.json", "/docs", "/redoc"):
        assert api.client.get(path).status_code == 200, path
    readme = (REPO / "README.md").read_text()
    line = next(ln for ln in readme.splitlines() if "/openapi.json" in ln and "/docs" in ln)
    assert re.search(r"\bpublic\b", line), line


def test_domain_errors_carry_no_status_and_map_at_the_edge() -> None:
    for cls in (errors.InvalidRequest, errors.Forbidden, errors.NotFound, errors.Conflict, errors.Gone):
        assert not hasattr(cls("x"), "status")

    class Busy(errors.Conflict):
        pass

    assert status_of(Busy("a turn is running")) == 409
    assert status_of(errors.Gone("x")) == 410 and status_of(errors.DomainError("x")) == 400
    body = errors.error_body("first line\nsecond line", "conflict")
    assert body == {"detail": "first line", "code": "conflict", "errors": []}
