"""Fixtures for the whole suite."""

from __future__ import annotations

from collections.abc import Iterator

import pytest


@pytest.fixture(autouse=True, scope="session")
def _private_data_dir(tmp_path_factory: pytest.TempPathFactory) -> Iterator[None]:
    """The commands tests run (``flywheel run`` records its sessions in the local session log)
    write a temporary data directory, never the user's; the embedding cache stays where it
    was (``FLYWHEEL_INDEX_DIR``), so indexing tests reuse it."""
    from backend.settings import LocalSettings, load_settings

    index_dir = load_settings(LocalSettings).search_index_dir
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("FLYWHEEL_INDEX_DIR", str(index_dir))
        mp.setenv("FLYWHEEL_DATA_DIR", str(tmp_path_factory.mktemp("flywheel-data")))
        yield
