"""The scripted policy: replays outputs in order, streams in chunks, clear errors."""

from __future__ import annotations

import json

import pytest

from agent.policies import make_policy
from agent.policies.scripted import ScriptedPolicy
from agent.policy import PolicyError
from agent.prompt import RenderedPrompt


async def test_replays_outputs_in_chunks_then_reports_exhaustion() -> None:
    p = ScriptedPolicy(["hello world", "second"], chunk_chars=4)
    chunks = [c.text async for c in p.stream(RenderedPrompt())]
    assert chunks == ["hell", "o wo", "rld"]
    assert "".join([c.text async for c in p.stream(RenderedPrompt())]) == "second"
    with pytest.raises(PolicyError, match="no output left"):
        [c async for c in p.stream(RenderedPrompt())]


def test_from_file_errors_are_clear(tmp_path) -> None:
    with pytest.raises(PolicyError, match="not found"):
        make_policy(f"scripted:{tmp_path / 'missing.json'}")
    bad = tmp_path / "bad.json"
    bad.write_text("{nope")
    with pytest.raises(PolicyError, match="not valid JSON"):
        make_policy(f"scripted:{bad}")
    wrong = tmp_path / "wrong.json"
    wrong.write_text(json.dumps({"outputs": [1, 2]}))
    with pytest.raises(PolicyError, match="list of strings"):
        make_policy(f"scripted:{wrong}")
    ok = tmp_path / "ok.json"
    ok.write_text(json.dumps(["a", "b"]))
    assert make_policy(f"scripted:{ok}").outputs == ["a", "b"]  # type: ignore[attr-defined]


async def test_consumed_outputs_are_skipped_and_clamped() -> None:
    p = ScriptedPolicy(["one", "two"], consumed=1)
    assert p.remaining == 1 and "".join([c.text async for c in p.stream(RenderedPrompt())]) == "two"
    assert ScriptedPolicy(["one"], consumed=5).remaining == 0
    with pytest.raises(ValueError, match="consumed"):
        ScriptedPolicy([], consumed=-1)


def test_spec_strings_parse_to_the_configs_build_policy_takes(tmp_path) -> None:
    from agent.policies import LocalConfig, ScriptedConfig, build_policy, parse_policy_spec

    script = tmp_path / "s.json"
    script.write_text(json.dumps({"outputs": ["x"]}))
    config = parse_policy_spec(f"scripted:{script}")
    assert config == ScriptedConfig(outputs=["x"])
    policy = build_policy(ScriptedConfig(outputs=["x", "y"], chunk_chars=1, consumed=1))
    assert isinstance(policy, ScriptedPolicy) and policy.chunk_chars == 1 and policy.remaining == 1
    assert parse_policy_spec("local:/some/ckpt") == LocalConfig("/some/ckpt")
    openai = parse_policy_spec("openai:m1", base_url="http://127.0.0.1:1/v1", api_key=None)
    assert (openai.model, openai.base_url) == ("m1", "http://127.0.0.1:1/v1")  # type: ignore[union-attr]
    with pytest.raises(TypeError, match="not a policy config"):
        build_policy({"kind": "scripted"})  # type: ignore[arg-type]
    with pytest.raises(PolicyError, match="unknown policy"):
        parse_policy_spec("gpt5")
