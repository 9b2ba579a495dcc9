"""Markers for the benchmark smoke tests."""

from __future__ import annotations

import pytest


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line(
        "markers", "benchmark_smoke: runs a benchmark script's --quick mode end to end (a real server process)"
    )
