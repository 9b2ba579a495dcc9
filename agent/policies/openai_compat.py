"""A policy that streams from any OpenAI-compatible ``/v1/chat/completions``.

Works with vLLM, llama.cpp's server, Ollama and Flywheel's own
``flywheel policy serve``. Timeouts are on by default (5 s to connect, 120 s
between streamed chunks). Not guaranteed: token ids and logprobs (remote
servers return text only), exact token counts unless the server reports usage.

Prompt profile (``prompt_profile``, read by the session factory): in
``completions`` mode the runtime renders the text the model reads, so it must
use the profile the served checkpoint was trained with. The policy learns it
at first use, not when it is built: the session awaits
:meth:`OpenAICompatPolicy.resolve_prompt_profile` before it renders its first
prompt, which asks the server once (``GET /models`` on the policy's own async
client, bounded by the connect timeout; the event loop is never blocked):
``flywheel policy serve`` publishes its checkpoint's profile there. Until
then ``prompt_profile`` is None. A server that cannot be reached is a
:class:`PolicyError` naming the URL (the turn ends in error; the next turn
asks again). A server that publishes none (vLLM, llama.cpp, a server without
``/models``) gets :data:`agent.prompt.DEFAULT_PROFILE`; pass
``prompt_profile=`` to choose one yourself (nothing is asked then). A
published profile this version of Flywheel does not know, or whose
fingerprint differs, is a :class:`PolicyError` — never a silent fallback. In
``chat`` mode nothing is asked and the profile is the default (the server
applies its own template to the messages).

Environment: ``FLYWHEEL_OPENAI_BASE_URL``, ``_MODEL``, ``_API_KEY`` and
``_API`` are read by :class:`OpenAIEnv` (pydantic-settings), only in
:meth:`OpenAIConfig.from_env`.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Literal

import httpx
from pydantic_settings import BaseSettings, SettingsConfigDict

from agent.policy import PolicyChunk, PolicyError
from agent.prompt import CHAT_TEMPLATE, DEFAULT_PROFILE, PROFILES, PromptProfile, RenderedPrompt


class OpenAIEnv(BaseSettings):
    """``FLYWHEEL_OPENAI_*`` environment variables (unset or empty: not given)."""

    model_config = SettingsConfigDict(env_prefix="FLYWHEEL_OPENAI_", extra="ignore")

    base_url: str | None = None
    model: str | None = None
    api_key: str | None = None
    api: Literal["chat", "completions"] | None = None


@dataclass(frozen=True, slots=True)
class OpenAIConfig:
    base_url: str = "http://127.0.0.1:8000/v1"
    model: str = "default"
    api_key: str | None = None
    temperature: float = 0.0
    max_tokens: int = 4096
    connect_timeout_s: float = 5.0
    read_timeout_s: float = 120.0
    # "chat": /v1/chat/completions with the rendered messages (any server; the
    # server applies its own chat template). "completions": /v1/completions with
    # the runtime's own rendered text (``RenderedPrompt.text``), byte for byte
    # what a local policy sees, and token ids/logprobs back where the server
    # returns them (``flywheel policy serve`` does): use it for Flywheel's model.
    api: Literal["chat", "completions"] = "chat"
    extra_body: dict[str, object] = field(default_factory=dict)

    @classmethod
    def from_env(cls, **overrides: object) -> OpenAIConfig:
        """Read ``FLYWHEEL_OPENAI_BASE_URL``/``_MODEL``/``_API_KEY``/``_API`` (via
        :class:`OpenAIEnv`); explicit values win."""
        from pydantic import ValidationError

        try:
            env = OpenAIEnv()
        except ValidationError as exc:
            where = "; ".join(f"FLYWHEEL_OPENAI_{str(e['loc'][0]).upper()}: {e['msg']}" for e in exc.errors())
            raise PolicyError(f"invalid environment: {where}") from None
        values: dict[str, object] = {k: v for k, v in env.model_dump().items() if v}
        values.update({k: v for k, v in overrides.items() if v is not None})
        return cls(**values)  # type: ignore[arg-type]


class OpenAICompatPolicy:
    name = "openai"

    def __init__(self, config: OpenAIConfig, *, transport: httpx.AsyncBaseTransport | None = None,
                 prompt_profile: PromptProfile | None = None):
        """No I/O. ``prompt_profile``: None in completions mode asks the server at first use
        (:meth:`resolve_prompt_profile`; see the module docstring)."""
        self.config = config
        headers = {"Authorization": f"Bearer {config.api_key}"} if config.api_key else {}
        if prompt_profile is None and config.api != "completions":
            prompt_profile = DEFAULT_PROFILE
        # None: not learnt yet (completions mode); the session awaits resolve_prompt_profile().
        self.prompt_profile: PromptProfile | None = prompt_profile
        self._learning = asyncio.Lock()
        timeout = httpx.Timeout(config.read_timeout_s, connect=config.connect_timeout_s)
        self._client = httpx.AsyncClient(
            base_url=config.base_url.rstrip("/"), headers=headers, timeout=timeout, transport=transport
        )

    async def resolve_prompt_profile(self) -> PromptProfile:
        """The profile to render prompts with: the one given or learnt already, else the
        server's (:func:`discover_profile`, asked once; concurrent callers share the one
        request). Raises :class:`PolicyError` (see :func:`discover_profile`); a failure is
        not remembered, so the next call asks again."""
        if self.prompt_profile is not None:
            return self.prompt_profile
        async with self._learning:
            if self.prompt_profile is None:
                self.prompt_profile = await discover_profile(self._client, self.config)
            return self.prompt_profile

    async def stream(self, prompt: RenderedPrompt) -> AsyncIterator[PolicyChunk]:
        if self.config.api == "completions":
            await self.resolve_prompt_profile()  # a caller outside a session learns it here (PolicyError)
        common = {
            "model": self.config.model,
            "stream": True,
            "stream_options": {"include_usage": True},
            "temperature": self.config.temperature,
            "max_tokens": self.config.max_tokens,
            **self.config.extra_body,
        }
        if self.config.api == "completions":
            path = "/completions"
            body = {**common, "prompt": prompt.text, "stop": list(CHAT_TEMPLATE.turn_stops)}
        else:
            path = "/chat/completions"
            body = {**common, "messages": prompt.messages}
        url = f"{self.config.base_url.rstrip('/')}{path}"
        try:
            async with self._client.stream("POST", path, json=body) as response:
                if response.status_code >= 400:
                    detail = (await response.aread()).decode("utf-8", "replace")[:500]
                    raise PolicyError(f"{url} answered HTTP {response.status_code}: {detail}")
                async for chunk in _sse_chunks(response, url):
                    yield chunk
        except httpx.ConnectError as exc:
            raise PolicyError(
                f"cannot reach the OpenAI-compatible server at {url} ({exc}); is it running?"
            ) from None
        except httpx.TimeoutException as exc:
            raise PolicyError(f"the OpenAI-compatible server at {url} timed out ({type(exc).__name__})") from None
        except httpx.HTTPError as exc:
            raise PolicyError(f"error talking to {url}: {type(exc).__name__}: {exc}") from None

    async def aclose(self) -> None:
        await self._client.aclose()


async def _sse_chunks(response: httpx.Response, url: str) -> AsyncIterator[PolicyChunk]:
    async for line in response.aiter_lines():
        if not line.startswith("data:"):
            continue
        payload = line[5:].strip()
        if payload == "[DONE]":
            return
        try:
            data = json.loads(payload)
        except json.JSONDecodeError:
            raise PolicyError(f"{url} sent a malformed stream event: {payload[:200]!r}") from None
        for chunk in _read_event(data, url, payload):
            yield chunk


async def discover_profile(client: httpx.AsyncClient, config: OpenAIConfig) -> PromptProfile:
    """The prompt profile the server publishes for ``config.model`` (``GET /models`` with
    ``client``, whose base URL and headers are the server's and its key).

    Bounded by ``connect_timeout_s`` for each of connecting and reading.
    Returns :data:`DEFAULT_PROFILE` when the server publishes none (no
    ``/models`` route, no ``prompt_profile`` field). Raises :class:`PolicyError`
    when the server cannot be reached, refuses the key, or publishes a profile
    that is unknown here or whose fingerprint differs from ours.
    """
    url = f"{config.base_url.rstrip('/')}/models"
    try:
        response = await client.get("/models", timeout=config.connect_timeout_s)
    except httpx.HTTPError as exc:
        raise PolicyError(f"cannot reach {url} to learn the served model's prompt profile "
                          f"({type(exc).__name__}: {exc}); is the server running?") from None
    if response.status_code in (401, 403):
        raise PolicyError(f"{url} answered HTTP {response.status_code}: check the API key")
    if response.status_code >= 400:
        return DEFAULT_PROFILE  # no /models route (or not as OpenAI's): the server publishes no profile
    try:
        entries = response.json().get("data") or []
    except (ValueError, AttributeError):
        return DEFAULT_PROFILE
    models = [m for m in entries if isinstance(m, dict)]
    entry = next((m for m in models if m.get("id") == config.model), models[0] if len(models) == 1 else None)
    published = entry.get("prompt_profile") if entry is not None else None
    if not isinstance(published, dict):
        return DEFAULT_PROFILE
    name, fingerprint = published.get("name"), published.get("fingerprint")
    profile = PROFILES.get(name) if isinstance(name, str) else None
    if profile is None:
        raise PolicyError(f"{url}: the served model uses prompt profile {name!r}, which this version of Flywheel "
                          f"does not have (known: {', '.join(sorted(PROFILES))})")
    if fingerprint != profile.fingerprint:
        raise PolicyError(f"{url}: the served model's prompt profile {name!r} has fingerprint {fingerprint}, ours "
                          f"is {profile.fingerprint}: client and server run different prompt texts; update one")
    return profile


COMPLETION_STOPS = CHAT_TEMPLATE.turn_stops  # kept as a name for importers; the one definition is the template's


def _token_fields(choice: dict[str, object]) -> tuple[tuple[int, ...], tuple[float, ...]] | tuple[None, None]:
    """Token ids and their logprobs where the server returns them (Flywheel's
    ``token_ids`` extension with OpenAI's ``logprobs.token_logprobs``)."""
    ids = choice.get("token_ids")
    if ids is None:
        return (), ()
    lp = choice.get("logprobs")
    values = lp.get("token_logprobs") if isinstance(lp, dict) else None
    if (not isinstance(ids, list) or not all(isinstance(i, int) for i in ids)
            or not isinstance(values, list) or len(values) != len(ids)
            or not all(isinstance(v, int | float) for v in values)):
        return None, None
    return tuple(ids), tuple(float(v) for v in values)


def _read_event(data: object, url: str, payload: str) -> list[PolicyChunk]:
    """One SSE event → chunks. Anything not shaped like a chat completion
    chunk is a :class:`PolicyError`, never a TypeError in the session."""
    def bad(why: str) -> PolicyError:
        return PolicyError(f"{url} sent an unexpected stream event ({why}): {payload[:200]!r}")

    if not isinstance(data, dict):
        raise bad("not an object")
    if "error" in data:
        raise PolicyError(f"{url} reported an error: {json.dumps(data['error'])[:500]}")
    choices = data.get("choices") or []
    usage = data.get("usage") or {}
    if not isinstance(choices, list) or not isinstance(usage, dict):
        raise bad("choices must be a list and usage an object")
    out: list[PolicyChunk] = []
    for choice in choices:
        if not isinstance(choice, dict):
            raise bad("a choice is not an object")
        delta = choice.get("delta") or {}
        # chat chunks carry delta.content; completion chunks carry text
        text = delta.get("content") if isinstance(delta, dict) and "text" not in choice else choice.get("text")
        finish = choice.get("finish_reason")
        if text is not None and not isinstance(text, str):
            raise bad("content is not a string")
        if finish is not None and not isinstance(finish, str):
            raise bad("finish_reason is not a string")
        ids, lps = _token_fields(choice)
        if ids is None:
            raise bad("token_ids/logprobs are malformed")
        if text or finish or ids:
            out.append(PolicyChunk(text or "", token_ids=ids, logprobs=lps, finish_reason=finish))
    tokens = usage.get("completion_tokens")
    if tokens is not None:
        if not isinstance(tokens, int) or isinstance(tokens, bool) or tokens < 0:
            raise bad("completion_tokens is not a count")
        out.append(PolicyChunk("", output_tokens=tokens))
    return out
