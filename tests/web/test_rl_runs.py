"""RL runs in a real browser, as staff: the list, a run's curves, one click from a curve point to the
rollouts behind it, and on to a rollout's replay."""

from __future__ import annotations

from typing import Any

import pytest

from tests.web import harness

RUN = "web-e2e-run"


@pytest.fixture(scope="module")
def seeded(server: harness.WebServer) -> str:
    server.seed_rl_run(RUN, iterations=3, tasks=2, samples=2)
    return RUN


def test_curve_point_to_rollouts_to_replay(page: Any, server: harness.WebServer, seeded: str) -> None:
    harness.sign_in(page, server.url, server.staff)
    page.click("nav.top a:has-text('RL runs')")
    page.click(f"a:has-text('{seeded}')")
    page.wait_for_selector(".chart .u-over")
    titles = page.locator(".chart h2").all_inner_texts()
    assert any("success" in t for t in titles) and any("parallel" in t for t in titles), titles

    # click the success-rate curve at its last point (iteration 3): the rollouts behind it open
    over = page.locator(".chart", has_text="success").first.locator(".u-over")
    box = over.bounding_box()
    over.click(position={"x": box["width"] - 2, "y": box["height"] / 2})
    page.wait_for_url("**iteration=3")
    page.wait_for_selector(".rollouts article")
    tasks = page.locator(".rollouts article .card-name").all_inner_texts()
    assert tasks == ["task-0", "task-1"]
    assert page.locator(".rollouts li").count() == 4
    assert "reward 1" in page.inner_text(".rollouts")

    harness.check_screen(page, "rl-run")

    page.locator(".rollouts a", has_text="sample 0").first.click()
    page.wait_for_selector(".timeline .bar.call")
    assert f"RL rollout · run {seeded} · iteration 3" in page.inner_text(".replay-head")
    page.console.assert_clean()


def test_staff_views_are_refused_to_users_by_the_server(page: Any, server: harness.WebServer, seeded: str) -> None:
    other = server.create_session(["hello"], token=server.staff, title="staff's own")
    harness.sign_in(page, server.url, server.user)
    assert page.locator("nav.top a:has-text('RL runs')").count() == 0
    for url in ("#/runs", f"#/runs/{seeded}", f"#/replay/{other['id']}"):
        page.goto(f"{server.url}/{url}")
        page.wait_for_selector(".problem")
        assert "Refused by the server (403)" in page.inner_text(".problem"), url
    page.console.assert_clean(r"status of 403 \(Forbidden\)")
