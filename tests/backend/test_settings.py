"""Settings: one definition of the data and index directories, FLYWHEEL_* read in one place."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from backend.settings import ClientSettings, LocalSettings, Settings, SettingsError, load_settings

REPO = Path(__file__).resolve().parents[2]


def _clean_env(tmp_path: Path, **extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("FLYWHEEL_") and k != "XDG_DATA_HOME"}
    return {**env, "HOME": str(tmp_path / "home"), "HF_HUB_OFFLINE": "1", **extra}


def test_index_dir_follows_the_data_dir_unless_set(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    for k in ("FLYWHEEL_INDEX_DIR", "FLYWHEEL_DATA_DIR"):
        monkeypatch.delenv(k, raising=False)
    assert Settings(data_dir=tmp_path / "d").search_index_dir == tmp_path / "d" / "index"
    monkeypatch.setenv("FLYWHEEL_DATA_DIR", str(tmp_path / "env-data"))
    assert LocalSettings().search_index_dir == tmp_path / "env-data" / "index"
    assert Settings().search_index_dir == LocalSettings().search_index_dir
    monkeypatch.setenv("FLYWHEEL_INDEX_DIR", str(tmp_path / "idx"))
    assert LocalSettings().search_index_dir == Settings().search_index_dir == tmp_path / "idx"


def test_flywheel_index_uses_the_servers_index_dir_under_flywheel_data_dir(tmp_path: Path) -> None:
    """`flywheel index` used to ignore FLYWHEEL_DATA_DIR (its own copy of the default knew only
    FLYWHEEL_INDEX_DIR and XDG), so it filled a cache the server never read."""
    tree = tmp_path / "tree"
    tree.mkdir()
    (tree / "m.py").write_text("def add(a, b):\n    return a + b\n")
    data = tmp_path / "data"
    r = subprocess.run([sys.executable, "-m", "backend.cli", "index", str(tree)], capture_output=True, text=True,
                       timeout=110, cwd=REPO, env=_clean_env(tmp_path, FLYWHEEL_DATA_DIR=str(data)))
    assert r.returncode == 0, r.stderr
    assert (data / "index" / "embeddings.sqlite").is_file(), r.stdout
    assert not (tmp_path / "home" / ".local").exists()


def test_bad_values_are_named_by_their_variable(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("FLYWHEEL_UNSAFE_NO_SANDBOX", "maybe")
    with pytest.raises(SettingsError, match="FLYWHEEL_UNSAFE_NO_SANDBOX='maybe'"):
        load_settings(LocalSettings)
    assert load_settings(LocalSettings, unsafe_no_sandbox=True).unsafe_no_sandbox is True  # a flag wins
    monkeypatch.setenv("FLYWHEEL_UNSAFE_NO_SANDBOX", "1")
    assert load_settings(LocalSettings, unsafe_no_sandbox=None).unsafe_no_sandbox is True  # None: not given


def test_client_settings(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("FLYWHEEL_TOKEN", raising=False)
    monkeypatch.delenv("FLYWHEEL_SERVER", raising=False)
    assert ClientSettings().server == f"http://127.0.0.1:{Settings().port}" and ClientSettings().token is None
    monkeypatch.setenv("FLYWHEEL_SERVER", "http://example.test:1")
    monkeypatch.setenv("FLYWHEEL_TOKEN", "fw_x")
    assert (ClientSettings().server, ClientSettings().token) == ("http://example.test:1", "fw_x")


def test_flywheel_run_reads_the_unsafe_switch_through_settings(tmp_path: Path) -> None:
    """A value the switch cannot mean is refused with its name (it used to be ignored unless exactly '1')."""
    r = subprocess.run([sys.executable, "-m", "backend.cli", "run"], capture_output=True, text=True, timeout=110,
                       cwd=REPO, env=_clean_env(tmp_path, FLYWHEEL_UNSAFE_NO_SANDBOX="sure"))
    assert r.returncode == 1 and "FLYWHEEL_UNSAFE_NO_SANDBOX='sure'" in r.stderr, r.stderr


def test_sandbox_extra_ro_is_colon_separated(monkeypatch) -> None:
    from backend.settings import LocalSettings

    monkeypatch.setenv("FLYWHEEL_SANDBOX_EXTRA_RO", "/opt/py:/srv/tools")
    assert LocalSettings().sandbox_extra_ro == [Path("/opt/py"), Path("/srv/tools")]


def test_config_file_under_xdg_config_home_and_what_overrides_it(tmp_path: Path,
                                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    from backend.settings import config_path

    for var in ("FLYWHEEL_SERVER", "FLYWHEEL_TOKEN", "FLYWHEEL_POLICY", "FLYWHEEL_APPROVAL_MODE"):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path))
    assert config_path() == tmp_path / "flywheel" / "config.toml"
    assert load_settings(ClientSettings).approval_mode == "auto"  # no file: the defaults
    (tmp_path / "flywheel").mkdir()
    config_path().write_text('server = "http://cfg:1"\ntoken = "fw_cfg"\napproval_mode = "ask-commands"\n'
                             'policy = {kind = "openai", model = "m"}\n')
    c = load_settings(ClientSettings)
    assert (c.server, c.token, c.approval_mode, c.policy) == (
        "http://cfg:1", "fw_cfg", "ask-commands", {"kind": "openai", "model": "m"})
    monkeypatch.setenv("FLYWHEEL_TOKEN", "fw_env")
    monkeypatch.setenv("FLYWHEEL_POLICY", '{"kind": "openai"}')  # replaces the file's object, not merged with it
    c = load_settings(ClientSettings, approval_mode="auto")  # a flag
    assert (c.server, c.token, c.approval_mode, c.policy) == ("http://cfg:1", "fw_env", "auto", {"kind": "openai"})
    config_path().write_text("token = \n")
    with pytest.raises(SettingsError, match="not valid TOML"):
        load_settings(ClientSettings)
    config_path().write_text('approval_mode = "never"\n')
    with pytest.raises(SettingsError, match=r"approval_mode='never' in .*config.toml"):
        load_settings(ClientSettings)
    monkeypatch.setenv("FLYWHEEL_APPROVAL_MODE", "never")
    with pytest.raises(SettingsError, match="FLYWHEEL_APPROVAL_MODE='never'"):
        load_settings(ClientSettings)
