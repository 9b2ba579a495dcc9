"""Shared by the RL tests: one local Ray runtime for the whole test session (started on first use)."""

from __future__ import annotations

from collections.abc import Iterator

import pytest


@pytest.fixture(scope="session")
def ray_session() -> Iterator[object]:
    """``ray.init`` once: 2 CPUs, no dashboard, a small object store. Tests that need Ray take this fixture."""
    import ray  # a dependency (pyproject): a missing ray fails, never skips

    ray.init(num_cpus=2, include_dashboard=False, object_store_memory=200 * 1024 * 1024,
             log_to_driver=False, configure_logging=False)
    try:
        yield ray
    finally:
        ray.shutdown()
