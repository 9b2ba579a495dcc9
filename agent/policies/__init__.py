"""Policies and the one place that builds a policy from a spec string."""

from __future__ import annotations

from agent.policy import Policy, PolicyError


def make_policy(spec: str, **openai_options: object) -> Policy:
    """Build a policy from ``scripted:FILE``, ``openai`` (options from args/env) or
    ``local:CHECKPOINT`` (Flywheel's own model, in-process).

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
    if kind == "local":
        from agent.policies.local import LocalPolicy

        if not arg:
            raise PolicyError("local policy needs a checkpoint directory: --policy local:CHECKPOINT")
        return LocalPolicy(arg)
    raise PolicyError(f"unknown policy {spec!r}: use scripted:FILE.json, openai[:MODEL] or local:CHECKPOINT")
