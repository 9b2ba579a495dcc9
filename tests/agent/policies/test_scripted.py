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
