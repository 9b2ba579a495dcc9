"""Policies and the one place that builds a policy from a spec string."""

from __future__ import annotations

from agent.policy import Policy, PolicyError


def make_policy(spec: str, **openai_options: object) -> Policy:
    """Build a policy from ``scripted:FILE`` or ``openai`` (options from args/env).

    Raises :class:`PolicyError` with the accepted forms on anything else.
    """
    kind, _, arg = spec.partition(":")
    if kind == "scripted":
        from agent.policies.scripted import ScriptedPolicy

        if not arg:
            raise PolicyError("scripted policy needs a file: --policy scripted:PATH.json")
        return ScriptedPolicy.from_file(arg)
    if kind == "openai":
        from agent.policies.openai_compat import OpenAICompatPolicy, OpenAIConfig

        if arg:
            openai_options.setdefault("model", arg)
        return OpenAICompatPolicy(OpenAIConfig.from_env(**openai_options))
    raise PolicyError(f"unknown policy {spec!r}: use scripted:FILE.json or openai[:MODEL]")
