"""The run config: one file, validated, unknown keys refused by name, three formats."""

from __future__ import annotations

from pathlib import Path

import pytest

from rl.config import ConfigError, load_run_config


def test_yaml_toml_json_load_the_same_config(tmp_path: Path) -> None:
    (tmp_path / "a.yaml").write_text("seed: 3\ngrpo:\n  group_size: 4\nmodel:\n  preset: small\n")
    (tmp_path / "a.toml").write_text("seed = 3\n[grpo]\ngroup_size = 4\n[model]\npreset = 'small'\n")
    (tmp_path / "a.json").write_text('{"seed": 3, "grpo": {"group_size": 4}, "model": {"preset": "small"}}')
    cfgs = [load_run_config(tmp_path / f"a.{ext}") for ext in ("yaml", "toml", "json")]
    assert cfgs[0] == cfgs[1] == cfgs[2] and cfgs[0].grpo.group_size == 4 and cfgs[0].grpo.eps_high == 0.28


@pytest.mark.parametrize(("text", "match"), [
    ("grpo:\n  gruop_size: 4\n", r"unknown key 'grpo.gruop_size'"),
    ("itterations: 3\n", r"unknown key 'itterations'"),
    ("grpo:\n  group_size: 1\n", r"grpo.group_size: Input should be greater than or equal to 2"),
    ("model:\n  preset: huge\n", r"model.preset: unknown preset 'huge'"),
    ("sft:\n  max_steps: 0\n", r"sft: .*max_steps: 0 .*needs dagger_rounds >= 1"),
    ("model:\n  copy_successor_keys: true\n", r"model: .*copy_successor_keys needs model.copy_head: true"),
    ("model:\n  copy_context_only: true\n", r"model: .*copy_context_only needs model.copy_head: true"),
    ("sft:\n  edit_context: wide\n", r"sft.edit_context: Input should be 'minimal' or 'hunk'"),
    ("rollout:\n  temperature: 0\n", r"rollout.temperature: Input should be greater than 0"),
    ("reward:\n  effort_per_call: 0.5\n", r"reward.effort_per_call: Input should be less than or equal to 0.2"),
    ("- a\n- b\n", r"top level must be a mapping"),
    ("a: [\n", r"not valid yaml"),
])
def test_bad_configs_name_what_is_wrong(tmp_path: Path, text: str, match: str) -> None:
    p = tmp_path / "run.yaml"
    p.write_text(text)
    with pytest.raises(ConfigError, match=match):
        load_run_config(p)


def test_missing_file_and_unknown_format(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="no config file"):
        load_run_config(tmp_path / "nope.yaml")
    (tmp_path / "run.ini").write_text("")
    with pytest.raises(ConfigError, match="unknown config format '.ini'"):
        load_run_config(tmp_path / "run.ini")


def test_limits_become_the_runtimes_limits() -> None:
    from agent.session import Limits
    from rl.config import LimitsConfig

    lim = LimitsConfig(max_model_calls=3, max_output_tokens=77, max_wall_s=9.5).to_limits()
    assert isinstance(lim, Limits)
    assert (lim.max_steps, lim.max_output_tokens, lim.max_wall_s) == (3, 77, 9.5)


def test_sft_narration_is_bounded() -> None:
    from pydantic import ValidationError

    from rl.config import SFTConfig

    assert SFTConfig(narration=3).narration == 3 and SFTConfig().narration == 0
    with pytest.raises(ValidationError, match="narration"):
        SFTConfig(narration=5)
