"""Fixtures for task tests: a real workspace store and the real bubblewrap sandbox."""

from __future__ import annotations

from pathlib import Path

import pytest

from tools.sandbox import Sandbox, make_sandbox, probe_bwrap
from tools.workspace import WorkspaceStore


@pytest.fixture
def store(tmp_path: Path) -> WorkspaceStore:
    return WorkspaceStore(tmp_path / "store")


@pytest.fixture(scope="session")
def sandbox() -> Sandbox:
    reason = probe_bwrap()
    if reason is not None:
        pytest.skip(f"bubblewrap is not usable here: {reason}")
    return make_sandbox()
