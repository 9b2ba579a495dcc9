"""Policies, and the one place that turns a policy config into a :class:`Policy`.

A config is one of three typed values (``PolicyConfig``, an alias for type checkers):

* :class:`ScriptedConfig` — recorded model outputs (tests, demos, replay);
* :class:`agent.policies.openai_compat.OpenAIConfig` — an OpenAI-compatible server;
* :class:`LocalConfig` — Flywheel's own model, in-process.

:func:`build_policy` is the only code that constructs a policy from a config.
Drivers reach it two ways: the CLI parses a spec string
(:func:`parse_policy_spec`, ``scripted:FILE`` / ``openai[:MODEL]`` /
``local:CHECKPOINT``; :func:`make_policy` does both steps), and the server
validates a stored JSON config first (``backend.policies.PolicyFactory``,
which never lets a request choose the URL or the key) and then calls
:func:`build_policy`.

Not guaranteed: building does not contact a model server (an unreachable URL
fails at the first model call, as a :class:`PolicyError`); a local policy
loads its checkpoint at build time.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from agent.policy import Policy, PolicyError

if TYPE_CHECKING:
    from typing import TypeAlias

    from agent.policies.openai_compat import OpenAIConfig

__all__ = ["LocalConfig", "ScriptedConfig", "build_policy", "make_policy", "parse_policy_spec"]


@dataclass(frozen=True, slots=True)
class ScriptedConfig:
    """Recorded outputs, one per model call. ``consumed`` outputs were used
    already (a resumed session continues with the next one)."""

    outputs: Sequence[str] = field(default_factory=tuple)
    chunk_chars: int = 24
    delay_s: float = 0.0
    consumed: int = 0


@dataclass(frozen=True, slots=True)
class LocalConfig:
    """A checkpoint directory of Flywheel's model (``flywheel model train``)."""

    checkpoint: str
    device: str = "cpu"


if TYPE_CHECKING:
    # For type checkers only: OpenAIConfig is imported lazily (it pulls in httpx).
    PolicyConfig: TypeAlias = ScriptedConfig | OpenAIConfig | LocalConfig


def build_policy(config: PolicyConfig) -> Policy:
    """The policy a config describes. Raises :class:`PolicyError` for a config it
    cannot build (a missing checkpoint) and ``TypeError`` for a non-config."""
    if isinstance(config, ScriptedConfig):
        from agent.policies.scripted import ScriptedPolicy

        return ScriptedPolicy(config.outputs, chunk_chars=config.chunk_chars, delay_s=config.delay_s,
                              consumed=config.consumed)
    if isinstance(config, LocalConfig):
        from agent.policies.local import LocalPolicy

        return LocalPolicy(config.checkpoint, device=config.device)
    from agent.policies.openai_compat import OpenAICompatPolicy, OpenAIConfig

    if isinstance(config, OpenAIConfig):
        return OpenAICompatPolicy(config)
    raise TypeError(f"not a policy config: {config!r} (use ScriptedConfig, OpenAIConfig or LocalConfig)")


def parse_policy_spec(spec: str, **openai_options: object) -> PolicyConfig:
    """The config for a CLI spec: ``scripted:FILE`` (the file is read now),
    ``openai[:MODEL]`` (options from ``openai_options``, then the
    ``FLYWHEEL_OPENAI_*`` environment) or ``local:CHECKPOINT``.

    Raises :class:`PolicyError` naming the accepted forms on anything else.
    """
    kind, _, arg = spec.partition(":")
    if kind == "scripted":
        from agent.policies.scripted import load_outputs

        if not arg:
            raise PolicyError("scripted policy needs a file: --policy scripted:PATH.json")
        return ScriptedConfig(outputs=load_outputs(arg))
    if kind == "openai":
        from agent.policies.openai_compat import OpenAIConfig

        if arg:
            openai_options.setdefault("model", arg)
        return OpenAIConfig.from_env(**openai_options)
    if kind == "local":
        if not arg:
            raise PolicyError("local policy needs a checkpoint directory: --policy local:CHECKPOINT")
        return LocalConfig(arg)
    raise PolicyError(f"unknown policy {spec!r}: use scripted:FILE.json, openai[:MODEL] or local:CHECKPOINT")


def make_policy(spec: str, **openai_options: object) -> Policy:
    """``build_policy(parse_policy_spec(spec, **openai_options))``. ``openai_options``
    (``base_url``, ``model``, ``api_key``, ``api``; None values are ignored) apply
    only to ``openai`` specs."""
    return build_policy(parse_policy_spec(spec, **openai_options))
