"""Which policies a server session may use, built from a stored config.

A session's policy config is stored with it (so a restarted server rebuilds
the same policy) and is one of:

* ``{"kind": "scripted", "outputs": [...], "chunk_chars"?: int, "delay_s"?: float}``
  — recorded model outputs (tests, demos, replay, load benchmarks);
* ``{"kind": "openai", "model"?: str, "temperature"?: float}`` — the operator's
  OpenAI-compatible server from the settings. A request can never choose the
  URL or key (the server must not become a proxy to arbitrary hosts).

This module is only the server's validation layer: :meth:`PolicyFactory.validate`
checks and normalises a requested config, :meth:`PolicyFactory.config` turns a
stored one into a typed config (filling in the operator's URL and key), and
the policy itself is built by :func:`agent.policies.build_policy`, the same
function the CLI uses.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Literal

from agent.policies import ScriptedConfig, build_policy
from agent.policies.openai_compat import OpenAIConfig
from agent.policy import Policy

MAX_SCRIPT_CHARS = 8 * 1024 * 1024
DEMO_DIR = Path(__file__).with_name("demo")
"""The bundled demo: ``workspace/`` (a small project with a bug) and ``script.json`` (its request and outputs)."""


def demo_script() -> dict[str, Any]:
    """The demo's ``{"request": str, "outputs": [str, ...]}``."""
    return json.loads((DEMO_DIR / "script.json").read_text())  # type: ignore[no-any-return]


def demo_policy() -> dict[str, Any]:
    """``--policy demo``: the bundled demo's recorded outputs, streamed gently."""
    return {"kind": "scripted", "outputs": demo_script()["outputs"], "chunk_chars": 8, "delay_s": 0.01}


class PolicyConfigError(ValueError):
    """A requested policy config the server refuses; the message says what to change."""


class PolicyFactory:
    def __init__(self, *, openai_base_url: str | None, openai_model: str = "default", openai_api_key: str | None = None,
                 openai_api: Literal["chat", "completions"] = "chat"):
        self.openai_base_url = openai_base_url
        self.openai_api = openai_api
        self.openai_model = openai_model
        self.openai_api_key = openai_api_key

    def kinds(self) -> list[str]:
        return ["scripted", "openai"] if self.openai_base_url else ["scripted"]

    def validate(self, config: dict[str, Any]) -> dict[str, Any]:
        """Check a requested config; returns the normalised config to store."""
        kind = config.get("kind")
        if kind == "scripted":
            outputs = config.get("outputs")
            if not isinstance(outputs, list) or not all(isinstance(o, str) for o in outputs):
                raise PolicyConfigError("scripted policy needs 'outputs': a list of strings")
            if sum(map(len, outputs)) > MAX_SCRIPT_CHARS:
                raise PolicyConfigError(f"scripted outputs are larger than {MAX_SCRIPT_CHARS} characters")
            chunk = config.get("chunk_chars", 24)
            delay = config.get("delay_s", 0.0)
            if not isinstance(chunk, int) or not 1 <= chunk <= 1 << 20:
                raise PolicyConfigError("chunk_chars must be an integer in 1..1048576")
            if not isinstance(delay, int | float) or not 0 <= delay <= 5:
                raise PolicyConfigError("delay_s must be a number in 0..5")
            return {"kind": "scripted", "outputs": outputs, "chunk_chars": chunk, "delay_s": float(delay)}
        if kind == "openai":
            if not self.openai_base_url:
                raise PolicyConfigError("this server has no model server configured (FLYWHEEL_OPENAI_BASE_URL)")
            extra = set(config) - {"kind", "model", "temperature"}
            if extra:
                raise PolicyConfigError(f"unsupported openai policy fields: {', '.join(sorted(extra))}")
            model = config.get("model", self.openai_model)
            temperature = config.get("temperature", 0.0)
            if not isinstance(model, str) or not isinstance(temperature, int | float):
                raise PolicyConfigError("model must be a string and temperature a number")
            return {"kind": "openai", "model": model, "temperature": float(temperature)}
        raise PolicyConfigError(f"unknown policy kind {kind!r}; available: {', '.join(self.kinds())}")

    def config(self, config: dict[str, Any], *, consumed: int = 0) -> ScriptedConfig | OpenAIConfig:
        """The typed config for a stored (or requested) one, validated again; the URL,
        key and API of an ``openai`` policy are always the operator's. ``consumed``
        model calls already happened (a resumed scripted session continues with its
        next output)."""
        config = self.validate(config)
        if config["kind"] == "scripted":
            return ScriptedConfig(outputs=config["outputs"], chunk_chars=config["chunk_chars"],
                                  delay_s=config["delay_s"], consumed=consumed)
        return OpenAIConfig(
            base_url=self.openai_base_url or "", model=config["model"], api_key=self.openai_api_key,
            temperature=config["temperature"], api=self.openai_api,
        )

    def build(self, config: dict[str, Any], *, consumed: int = 0) -> Policy:
        """``agent.policies.build_policy(self.config(config, consumed=consumed))``."""
        return build_policy(self.config(config, consumed=consumed))
