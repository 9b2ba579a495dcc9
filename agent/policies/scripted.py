"""A policy that replays recorded model outputs, one per model call.

Used by the tests, the demo and replay: the outputs stream through the same
parser, executor and tools as a real model's. It is a real feature, not a
mock. It does not look at the prompt, so a script recorded against one
workspace may call tools that fail against another (which is what replay's
re-execution reports).
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator, Sequence
from pathlib import Path

from agent.policy import PolicyChunk, PolicyError
from agent.prompt import RenderedPrompt


def load_outputs(path: str | Path) -> list[str]:
    """The outputs of a script file: ``{"outputs": [...]}`` or a bare JSON list of
    strings. Raises :class:`PolicyError` saying what is wrong with the file."""
    p = Path(path)
    try:
        data = json.loads(p.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise PolicyError(f"script file not found: {p}") from None
    except json.JSONDecodeError as exc:
        raise PolicyError(f"script file {p} is not valid JSON: {exc}") from None
    outputs = data.get("outputs") if isinstance(data, dict) else data
    if not isinstance(outputs, list) or not all(isinstance(o, str) for o in outputs):
        raise PolicyError(f'script file {p} must hold {{"outputs": ["...", ...]}} (a list of strings)')
    return outputs


class ScriptedPolicy:
    """``consumed``: outputs already used (a resumed session continues with the
    next one); clamped to the number of outputs."""

    name = "scripted"

    def __init__(self, outputs: Sequence[str], *, chunk_chars: int = 24, delay_s: float = 0.0, consumed: int = 0):
        if chunk_chars < 1:
            raise ValueError("chunk_chars must be >= 1")
        if consumed < 0:
            raise ValueError("consumed must be >= 0")
        self.outputs = list(outputs)
        self.chunk_chars = chunk_chars
        self.delay_s = delay_s
        self.calls = min(consumed, len(self.outputs))
        self.prompts: list[RenderedPrompt] = []

    @classmethod
    def from_file(cls, path: str | Path, *, chunk_chars: int = 24, delay_s: float = 0.0) -> ScriptedPolicy:
        """A policy over :func:`load_outputs`'s outputs."""
        return cls(load_outputs(path), chunk_chars=chunk_chars, delay_s=delay_s)

    @property
    def remaining(self) -> int:
        return len(self.outputs) - self.calls

    async def stream(self, prompt: RenderedPrompt) -> AsyncIterator[PolicyChunk]:
        if self.calls >= len(self.outputs):
            raise PolicyError(
                f"the scripted policy has no output left (it had {len(self.outputs)}); "
                "the recording ends here"
            )
        self.prompts.append(prompt)
        text = self.outputs[self.calls]
        self.calls += 1
        n = self.chunk_chars
        for i in range(0, len(text), n):
            if self.delay_s:
                await asyncio.sleep(self.delay_s)
            yield PolicyChunk(text[i : i + n])

    async def aclose(self) -> None:
        return None
