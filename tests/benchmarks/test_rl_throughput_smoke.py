"""Smoke run of benchmarks/rl_throughput.py on a random tiny model (~40 s): the five runs happen, the
prefix cache saves prefill, and the KV-cache read comparison (view vs gather) is reported."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.benchmarks.bench_module import run_benchmark

pytestmark = [pytest.mark.benchmark_smoke, pytest.mark.timeout(420)]


def test_rl_throughput_small_reports_every_arm(tmp_path: Path) -> None:
    result = run_benchmark("rl_throughput", "--tasks", "2", "--group", "2", "--max-steps", "2", "--max-tokens", "8",
                           "--name", "rl_throughput_smoke", results=tmp_path, timeout=400)
    runs = result["runs"]
    assert [(r["workers"], r["prefix_cache"], r["slot_view_spread"]) for r in runs] == [
        (1, True, None), (2, True, None), (2, True, 0.0), (2, True, None), (2, False, None)]
    for r in runs:
        assert r["rollouts"] == 4 and sum(r["statuses"].values()) == 4 and r["sampled_tokens"] > 0
        assert "_samples" not in r
    assert result["prefill_tokens"]["with_cache"] < result["prefill_tokens"]["without_cache"]
    kv = result["kv_read"]
    assert min(kv["view_sampled_tokens_per_s"], kv["gather_sampled_tokens_per_s"],
               kv["view_repeat_sampled_tokens_per_s"]) > 0
    assert 0.0 <= kv["same_samples_view_gather"] <= 1.0 and 0.0 <= kv["same_samples_view_view"] <= 1.0
