"""The server's policy configs: a validation layer over agent.policies.build_policy."""

from __future__ import annotations

import pytest

from agent.policies import ScriptedConfig
from agent.policies.openai_compat import OpenAICompatPolicy, OpenAIConfig
from agent.policies.scripted import ScriptedPolicy
from backend.policies import PolicyConfigError, PolicyFactory


def test_stored_configs_become_typed_configs_with_the_operators_url_and_key() -> None:
    f = PolicyFactory(openai_base_url="http://127.0.0.1:9/v1", openai_api_key="k", openai_api="completions")
    assert f.config({"kind": "scripted", "outputs": ["a", "b"]}, consumed=1) == ScriptedConfig(
        outputs=["a", "b"], chunk_chars=24, delay_s=0.0, consumed=1)
    openai = f.config({"kind": "openai", "model": "m", "temperature": 0.5})
    assert openai == OpenAIConfig(base_url="http://127.0.0.1:9/v1", model="m", api_key="k", temperature=0.5,
                                  api="completions")


async def test_a_request_can_never_choose_the_url_or_key() -> None:
    f = PolicyFactory(openai_base_url="http://127.0.0.1:9/v1")
    for field in ("base_url", "api_key", "extra_body"):
        with pytest.raises(PolicyConfigError, match="unsupported openai policy fields"):
            f.build({"kind": "openai", field: "http://evil.example"})
    policy = f.build({"kind": "openai"})
    assert isinstance(policy, OpenAICompatPolicy) and policy.config.base_url == "http://127.0.0.1:9/v1"
    await policy.aclose()
    with pytest.raises(PolicyConfigError, match="no model server configured"):
        PolicyFactory(openai_base_url=None).build({"kind": "openai"})


def test_resumed_scripted_policy_continues_after_the_consumed_outputs() -> None:
    p = PolicyFactory(openai_base_url=None).build({"kind": "scripted", "outputs": ["a", "b", "c"]}, consumed=2)
    assert isinstance(p, ScriptedPolicy) and p.remaining == 1
