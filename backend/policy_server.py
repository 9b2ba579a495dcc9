"""An OpenAI-compatible HTTP endpoint for Flywheel's own model (``flywheel policy serve``).

It works with the official ``openai`` Python client (``tests/backend/test_policy_server_openai.py``
drives it with that package). Routes (all under ``/v1``):

* ``GET /models`` and ``GET /models/{id}`` — the one served model (also under
  the alias ``default``), with ``max_model_len`` and ``prompt_profile``
  (``{"name", "fingerprint"}`` of the checkpoint's :class:`agent.prompt.PromptProfile`;
  ``OpenAICompatPolicy`` in completions mode reads it to render the prompt the
  model was trained with). Any other id is 404 ``model_not_found``.
* ``POST /chat/completions`` — ``messages`` are flattened by
  ``agent.prompt.flatten``, the runtime's own template (:func:`render_messages`)
  and generation stops at the end marker (the newline the template puts before
  it is not part of the content). Streaming (SSE, OpenAI's
  ``chat.completion.chunk`` format, with ``stream_options.include_usage``) and
  non-streaming, ``n`` choices either way. ``logprobs: true`` is honoured
  (``choices[].logprobs.content``: each sampled content token's logprob).
* ``POST /completions`` — raw completion; ``prompt`` is text, a list of token
  ids (token-in), or a batch: a list of texts or of token-id lists (choice
  ``k * n + j`` is the ``j``-th sample of prompt ``k``). Streaming and
  non-streaming, ``n`` choices either way.

Extensions (token-out, for RL), on every ``/completions`` choice, always
present (``logprobs`` need not be requested):

* ``token_ids`` — the sampled token ids, including the one that ended the
  sequence (an end token, or the token that completed a stop sequence);
* ``prompt_token_ids`` — the prompt as the model saw it;
* ``logprobs`` — the standard object, with ``token_logprobs`` aligned with
  ``token_ids`` (the model's temperature-1 logprobs; see
  ``agent.model.sampling.sample``), ``tokens`` (each id decoded alone) and
  ``top_logprobs: null`` (not computed). Streamed chunks carry the same
  fields for their own tokens.

One request parameter (both endpoints) that OpenAI does not have:
``logprobs_mode`` — ``"raw"`` (default: temperature-1 logprobs, as above) or
``"processed"`` (the logprobs of the distribution each token was drawn from,
``log_softmax(logits / temperature)``; top-p is not applied), so a trainer
sampling at a temperature other than 1 gets old-policy logprobs that match
its own tempered forward pass. vLLM offers the same choice as a server flag.

``max_tokens`` (default: as many as fit) is clamped to the room the prompt
leaves in the model's context (unlike vLLM, which rejects such requests); a
prompt that leaves no room is a 400 with code ``context_length_exceeded``.
Generation never emits the template's markers as text (see
``agent.model.engine``).

Nothing is silently ignored: a parameter whose value this server cannot honour
is a 400 with code ``unsupported_parameter`` and ``param`` naming it —
``top_logprobs`` > 0 (and ``logprobs`` > 0 on completions: top logprobs are not
computed), ``echo``, ``suffix``, ``best_of`` other than ``n``, ``tools``/
``functions`` and a ``tool_choice`` other than none/auto (the model writes XML
tool calls as text), ``response_format`` other than text, non-zero penalties,
a non-empty ``logit_bias``, and any parameter OpenAI does not define. Values
that change nothing are accepted (``user``, ``metadata``, ``store``,
``service_tier``, ``best_of == n``, ``logprobs: 0``). Every error, unknown
routes included, is OpenAI-shaped: ``{"error": {"message", "type", "param",
"code"}}``.

Every route's body is typed in ``/openapi.json`` (``backend/policy_server_schemas.py``):
the JSON answer, the ``text/event-stream`` chunks of a streamed one, and the error shape.

Not guaranteed: the order in which chunks of different choices interleave in
a stream (each choice's own chunks are in order); ``usage`` counts a batched
request's prompts once each, not once per choice.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import secrets
import sys
import time
from collections.abc import AsyncIterator, Sequence
from contextlib import aclosing, asynccontextmanager
from pathlib import Path
from typing import Annotated, Any, Literal, TypeVar

from fastapi import Depends, FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, StreamingResponse
from pydantic import BaseModel, ConfigDict, Field
from starlette.exceptions import HTTPException as StarletteHTTPException
from pydantic_settings import BaseSettings, SettingsConfigDict

from agent.model.generation import LogprobsMode
from agent.prompt import CHAT_TEMPLATE, DEFAULT_PROFILE, ChatTemplate, Message, PromptProfile, flatten
from backend.policy_server_schemas import (
    ChatCompletion,
    Completion,
    ModelCard,
    ModelList,
    document_streams,
    error_responses,
)


class PolicyServerSettings(BaseSettings):
    """Environment settings of ``flywheel policy serve`` (flags override them)."""

    model_config = SettingsConfigDict(env_prefix="FLYWHEEL_POLICY_", extra="ignore")

    api_key: str | None = None  # FLYWHEEL_POLICY_API_KEY: required off loopback

class ApiError(Exception):
    """An OpenAI-shaped error: ``{"error": {"message", "type", "param", "code"}}`` with an HTTP status."""

    def __init__(self, status: int, message: str, *, type_: str = "invalid_request_error", code: str | None = None,
                 param: str | None = None):
        super().__init__(message)
        self.status, self.message, self.type, self.code, self.param = status, message, type_, code, param

    def body(self) -> dict[str, Any]:
        return {"error": {"message": self.message, "type": self.type, "param": self.param, "code": self.code}}


def unsupported(param: str, why: str) -> ApiError:
    """A parameter this server cannot honour: refused (400, code ``unsupported_parameter``), never ignored."""
    return ApiError(400, f"{param}: {why}", code="unsupported_parameter", param=param)


MAX_NAME = 256  # model names, stop sequences: longer is refused
MAX_CHOICES = 128  # prompts x n in one request


# -- request bodies ----------------------------------------------------------------


class _Body(BaseModel):
    """Parameters common to both endpoints. Every OpenAI parameter is either honoured,
    accepted where its value changes nothing (``user``, ``metadata``, ``store``, a zero
    penalty, ``logit_bias: {}``, ``best_of == n``...), or refused with a 400 naming it
    (:meth:`refuse_unsupported`); a parameter OpenAI does not have is refused too
    (``extra="forbid"``), so nothing is silently ignored."""

    model_config = ConfigDict(extra="forbid")

    model: str | None = Field(default=None, max_length=MAX_NAME)
    stream: bool = False
    stream_options: dict[str, Any] | None = None
    temperature: float | None = Field(default=None, ge=0, le=2)
    top_p: float | None = Field(default=None, gt=0, le=1)
    stop: (Annotated[str, Field(max_length=MAX_NAME)]
           | Annotated[list[Annotated[str, Field(max_length=MAX_NAME)]], Field(max_length=16)] | None) = None
    seed: int | None = None
    n: int = Field(default=1, ge=1, le=16)
    presence_penalty: float | None = Field(default=None, ge=-2, le=2)
    frequency_penalty: float | None = Field(default=None, ge=-2, le=2)
    logit_bias: dict[str, float] | None = None
    user: str | None = Field(default=None, max_length=MAX_NAME)  # accepted; no effect
    logprobs_mode: LogprobsMode = "raw"  # extension: see the module docstring

    @property
    def include_usage(self) -> bool:
        return bool((self.stream_options or {}).get("include_usage"))

    def stops(self) -> list[str]:
        return [self.stop] if isinstance(self.stop, str) else list(self.stop or [])

    def refuse_unsupported(self) -> None:
        """Raise :class:`ApiError` for a parameter value this server would otherwise ignore."""
        for name in ("presence_penalty", "frequency_penalty"):
            if getattr(self, name):
                raise unsupported(name, "penalties are not implemented (only 0 is accepted)")
        if self.logit_bias:
            raise unsupported("logit_bias", "not implemented (only {} is accepted)")
        if self.stream_options and set(self.stream_options) - {"include_usage"}:
            extra = ", ".join(sorted(set(self.stream_options) - {"include_usage"}))
            raise unsupported("stream_options", f"only include_usage is supported, not {extra}")


class ChatMessage(BaseModel):
    model_config = ConfigDict(extra="ignore")  # name, tool_call_id...: the template has no place for them

    role: Literal["system", "developer", "user", "assistant", "tool"]
    content: str | list[dict[str, Any]] | None = None
    tool_calls: list[dict[str, Any]] | None = None

    def text(self) -> str:
        if self.tool_calls:
            raise unsupported("messages.tool_calls", "this model writes tool calls as text (XML); send them as content")
        if isinstance(self.content, list):  # content parts: only text is understood
            parts = []
            for part in self.content:
                if part.get("type") != "text" or not isinstance(part.get("text"), str):
                    raise ApiError(400, "only text content parts are supported", param="messages")
                parts.append(part["text"])
            return "".join(parts)
        return self.content or ""


class ChatRequest(_Body):
    messages: list[ChatMessage] = Field(min_length=1)
    max_tokens: int | None = Field(default=None, ge=1)
    max_completion_tokens: int | None = Field(default=None, ge=1)
    logprobs: bool | None = None  # honoured: choices[].logprobs.content
    top_logprobs: int | None = Field(default=None, ge=0, le=20)
    tools: list[dict[str, Any]] | None = None
    tool_choice: str | dict[str, Any] | None = None
    parallel_tool_calls: bool | None = None
    functions: list[dict[str, Any]] | None = None
    function_call: str | dict[str, Any] | None = None
    response_format: dict[str, Any] | None = None
    metadata: dict[str, str] | None = None  # accepted; no effect
    store: bool | None = None  # accepted; nothing is stored
    service_tier: str | None = Field(default=None, max_length=32)  # accepted; one tier

    def refuse_unsupported(self) -> None:
        super().refuse_unsupported()
        if self.top_logprobs:
            raise unsupported("top_logprobs", "top logprobs are not computed (0 is accepted; logprobs: true gives "
                              "each sampled token's logprob)")
        if self.tools or self.functions:
            name = "tools" if self.tools else "functions"
            raise unsupported(name, "function calling is not supported: the model writes XML tool calls as text "
                              "(see the prompt profile)")
        for name in ("tool_choice", "function_call"):
            if getattr(self, name) not in (None, "none", "auto"):
                raise unsupported(name, "function calling is not supported")
        if self.response_format and self.response_format.get("type") != "text":
            raise unsupported("response_format", f"only {{'type': 'text'}} is supported, not "
                              f"{self.response_format.get('type')!r}")


TokenIds = list[Annotated[int, Field(ge=0)]]


class CompletionRequest(_Body):
    prompt: str | TokenIds | list[str] | list[TokenIds]
    max_tokens: int | None = Field(default=16, ge=1)  # OpenAI's default for completions
    logprobs: int | None = Field(default=None, ge=0, le=5)  # token logprobs are always returned (0 accepted)
    echo: bool | None = None
    suffix: str | None = None
    best_of: int | None = Field(default=None, ge=1, le=16)

    def prompts(self) -> list[str | list[int]]:
        """The prompts of a (possibly batched) request: one text or token list each."""
        p = self.prompt
        if isinstance(p, str):
            return [p]
        if not p:
            raise ApiError(400, "prompt is empty: give text, token ids, or a list of either", param="prompt")
        if all(isinstance(x, int) for x in p):
            return [list(p)]  # type: ignore[arg-type]
        return list(p)  # type: ignore[arg-type]

    def refuse_unsupported(self) -> None:
        super().refuse_unsupported()
        if self.logprobs:
            raise unsupported("logprobs", "top logprobs are not computed; every choice carries each sampled "
                              "token's logprob (logprobs.token_logprobs) without asking, so pass 0 or omit it")
        if self.echo:
            raise unsupported("echo", "echoing the prompt is not supported (prompt_token_ids has the prompt)")
        if self.suffix:
            raise unsupported("suffix", "insertion (fill-in-the-middle) is not supported")
        if self.best_of is not None and self.best_of != self.n:
            raise unsupported("best_of", "only best_of == n is supported (every sampled choice is returned)")


def render_messages(messages: Sequence[tuple[str, str]], template: ChatTemplate = CHAT_TEMPLATE) -> str:
    """Chat messages → the text the model sees: ``agent.prompt.flatten``, the
    function ``render_prompt`` uses, with OpenAI's ``developer`` role read as
    ``system``. (The runtime sends tool results as ``user`` messages, so over
    HTTP they arrive with the user marker; see ``agent.prompt``.)
    """
    return flatten([Message("system" if role == "developer" else role, content)  # type: ignore[arg-type]
                    for role, content in messages], template)


# -- the app -----------------------------------------------------------------------


def create_app(engine: Any, *, model_id: str, api_key: str | None = None,
               prompt_profile: PromptProfile = DEFAULT_PROFILE) -> FastAPI:
    """The endpoint over a (not yet started) :class:`agent.model.engine.Engine`;
    the app's lifespan starts and stops it. ``prompt_profile`` is published in
    ``GET /v1/models`` (the checkpoint's; see ``agent.model.checkpoint.load_profile``)."""
    from agent.model.engine import EngineError, GenerationRequest, PromptTooLong

    tokenizer = engine.tokenizer

    running: list[asyncio.AbstractEventLoop] = []

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        await engine.start()
        running.append(asyncio.get_running_loop())
        try:
            yield
        finally:
            running.clear()
            await engine.stop()

    def begin_shutdown() -> None:
        """Stop the engine now, from any thread or a signal handler: running and waiting
        requests end at once (streams with an in-band ``server_error``, others with a 500),
        so the server's graceful shutdown has nothing left to wait for."""
        for loop in list(running):
            if not loop.is_closed():
                loop.call_soon_threadsafe(lambda: loop.create_task(engine.stop()))

    async def authorise(request: Request) -> None:
        if api_key and not secrets.compare_digest(
            request.headers.get("authorization", ""), f"Bearer {api_key}"
        ):
            raise ApiError(401, "invalid or missing API key (Authorization: Bearer KEY)", type_="authentication_error",
                           code="invalid_api_key")

    app = FastAPI(title="Flywheel policy server", lifespan=lifespan, dependencies=[Depends(authorise)],
                  responses=error_responses(401))
    document_streams(app)
    app.state.begin_shutdown = begin_shutdown

    @app.exception_handler(ApiError)
    async def api_error(_: Request, exc: ApiError) -> JSONResponse:
        return JSONResponse(exc.body(), status_code=exc.status)

    @app.exception_handler(RequestValidationError)
    async def invalid(_: Request, exc: RequestValidationError) -> JSONResponse:
        errs = list(exc.errors())

        def param(e: Any) -> str:  # "stop", "messages.0.role": without pydantic's union tags ("constrained-str")
            return ".".join(str(p) for p in e["loc"][1:] if isinstance(p, int) or str(p).isidentifier())

        extra = [e for e in errs if e.get("type") == "extra_forbidden"]
        if extra:  # a parameter this server does not know: refused, never ignored
            err = unsupported(param(extra[0]), "not a parameter this server supports")
        else:
            where = "; ".join(f"{param(e)}: {e['msg']}" for e in errs[:3])
            err = ApiError(400, f"invalid request: {where}", param=(param(errs[0]) if errs else None) or None)
        return JSONResponse(err.body(), status_code=400)

    @app.exception_handler(StarletteHTTPException)
    async def http_error(request: Request, exc: StarletteHTTPException) -> JSONResponse:
        if exc.status_code == 404:
            err = ApiError(404, f"Invalid URL ({request.method} {request.url.path})", code="unknown_url")
        elif exc.status_code == 405:
            err = ApiError(405, f"{request.method} is not allowed on {request.url.path}", code="method_not_allowed")
        else:
            err = ApiError(exc.status_code, str(exc.detail))
        return JSONResponse(err.body(), status_code=err.status, headers=getattr(exc, "headers", None))

    def check_model(name: str | None) -> None:
        if name not in (None, model_id, "default"):
            raise ApiError(404, f"model {name[:MAX_NAME]!r} is not served here; this server serves {model_id!r}",
                           code="model_not_found", param="model")

    def make_request(body: _Body, prompt_ids: list[int], max_tokens: int | None, stops: list[str],
                     index: int, param: str) -> GenerationRequest:
        req = GenerationRequest(
            prompt_ids=prompt_ids, max_tokens=max_tokens or engine.max_len,
            temperature=1.0 if body.temperature is None else body.temperature,
            top_p=1.0 if body.top_p is None else body.top_p, stop=stops,
            seed=None if body.seed is None else body.seed + index, logprobs_mode=body.logprobs_mode,
        )
        try:
            return engine.fit(req)  # max_tokens clamped to what the context leaves
        except EngineError as exc:
            code = "context_length_exceeded" if isinstance(exc, PromptTooLong) else None
            raise ApiError(400, str(exc), code=code, param=param) from None

    def encode_prompt(prompt: str | list[int]) -> list[int]:
        return tokenizer.encode(prompt) if isinstance(prompt, str) else list(prompt)

    def card() -> dict[str, Any]:
        return {"id": model_id, "object": "model", "created": 0, "owned_by": "flywheel", "max_model_len": engine.max_len,
                "prompt_profile": {"name": prompt_profile.name, "fingerprint": prompt_profile.fingerprint}}

    @app.get("/v1/models", response_model=ModelList)
    async def models() -> dict[str, Any]:
        return {"object": "list", "data": [card()]}

    @app.get("/v1/models/{name:path}", response_model=ModelCard, responses=error_responses(404))
    async def model(name: str) -> dict[str, Any]:
        """The served model (also under its alias ``default``); 404 ``model_not_found`` for any other id."""
        if name not in (model_id, "default"):
            raise ApiError(404, f"model {name[:MAX_NAME]!r} is not served here; this server serves {model_id!r}",
                           code="model_not_found", param="model")
        return card()

    @app.post("/v1/chat/completions", response_model=ChatCompletion, responses=error_responses(400, 404, 500))
    async def chat(body: ChatRequest) -> dict[str, Any] | StreamingResponse:
        check_model(body.model)
        body.refuse_unsupported()
        prompt_ids = tokenizer.encode(render_messages([(m.role, m.text()) for m in body.messages]))
        max_tokens = body.max_completion_tokens or body.max_tokens
        stops = [*CHAT_TEMPLATE.turn_stops, *body.stops()]
        reqs = [make_request(body, prompt_ids, max_tokens, stops, i, "messages") for i in range(body.n)]
        cid, created = f"chatcmpl-{secrets.token_hex(12)}", int(time.time())
        logprobs = bool(body.logprobs)
        if body.stream:
            return _sse(_chat_stream(engine, reqs, cid, created, model_id, body.include_usage, logprobs))
        done = await _complete_all(engine, reqs)
        return {
            "id": cid, "object": "chat.completion", "created": created, "model": model_id,
            "choices": [{"index": i, "message": {"role": "assistant", "content": c.text},
                         "logprobs": _chat_logprobs(engine, c.token_ids, c.logprobs) if logprobs else None,
                         "finish_reason": c.finish_reason} for i, c in enumerate(done)],
            "usage": _usage(len(prompt_ids), sum(len(c.token_ids) for c in done)),
        }

    @app.post("/v1/completions", response_model=Completion, responses=error_responses(400, 404, 500))
    async def completions(body: CompletionRequest) -> dict[str, Any] | StreamingResponse:
        check_model(body.model)
        body.refuse_unsupported()
        prompts = [encode_prompt(p) for p in body.prompts()]
        if len(prompts) * body.n > MAX_CHOICES:
            raise ApiError(400, f"{len(prompts)} prompts x n={body.n} is more than {MAX_CHOICES} choices per request",
                           param="prompt")
        # choice k*n + j is the j-th sample of prompt k (OpenAI's order)
        reqs = [make_request(body, ids, body.max_tokens, body.stops(), k * body.n + j, "prompt")
                for k, ids in enumerate(prompts) for j in range(body.n)]
        cid, created = f"cmpl-{secrets.token_hex(12)}", int(time.time())
        prompt_tokens = sum(map(len, prompts))
        if body.stream:
            return _sse(_completion_stream(engine, reqs, cid, created, model_id, body.include_usage, prompt_tokens))
        done = await _complete_all(engine, reqs)
        choices = []
        for i, (r, c) in enumerate(zip(reqs, done, strict=True)):
            choices.append({"index": i, "text": c.text, "finish_reason": c.finish_reason,
                            **_token_fields(tokenizer, c.token_ids, c.logprobs), "prompt_token_ids": r.prompt_ids})
        return {"id": cid, "object": "text_completion", "created": created, "model": model_id, "choices": choices,
                "usage": _usage(prompt_tokens, sum(len(c.token_ids) for c in done))}

    return app


def _usage(prompt: int, completion: int) -> dict[str, int]:
    return {"prompt_tokens": prompt, "completion_tokens": completion, "total_tokens": prompt + completion}


def _token_fields(tokenizer: Any, ids: Sequence[int], logprobs: Sequence[float]) -> dict[str, Any]:
    return {"token_ids": list(ids), "logprobs": {
        "tokens": [tokenizer.decode([t]) for t in ids], "token_logprobs": list(logprobs), "top_logprobs": None,
        "text_offset": None,
    }}


def _chat_logprobs(engine: Any, ids: Sequence[int], logprobs: Sequence[float]) -> dict[str, Any]:
    """OpenAI's chat ``logprobs`` for sampled tokens: each content token's logprob (the end
    marker is no content and is left out), ``top_logprobs`` empty (not computed).
    Not guaranteed: that the tokens' text joins to the content (tokens of a stop sequence
    are listed; a token that splits a UTF-8 character shows as U+FFFD)."""
    content = []
    for t, lp in zip(ids, logprobs, strict=True):
        if t in engine.end_ids:
            continue
        text = engine.tokenizer.decode([t])
        content.append({"token": text, "logprob": lp, "bytes": list(text.encode("utf-8", "replace")),
                        "top_logprobs": []})
    return {"content": content, "refusal": None}


async def _complete_all(engine: Any, reqs: list[Any]) -> list[Any]:
    from agent.model.engine import EngineError

    try:
        return list(await asyncio.gather(*(engine.complete(r) for r in reqs)))
    except EngineError as exc:
        raise ApiError(500, str(exc), type_="server_error") from None


def _sse(events: AsyncIterator[dict[str, Any]]) -> StreamingResponse:
    async def body() -> AsyncIterator[str]:
        async with aclosing(events) as it:  # a client that goes away frees its engine slots
            async for event in it:
                yield f"data: {json.dumps(event)}\n\n"
        yield "data: [DONE]\n\n"

    return StreamingResponse(body(), media_type="text/event-stream", headers={"Cache-Control": "no-cache"})


T = TypeVar("T")


async def merge(streams: Sequence[AsyncIterator[T]]) -> AsyncIterator[T]:
    """Items of several async iterators as they come (each stream's own order is kept).
    Closing the merged iterator closes every stream (a request's engine slots are freed);
    an exception in one stream is raised here after the others are closed."""
    if len(streams) == 1:
        async with aclosing(streams[0]) as only:  # type: ignore[type-var]
            async for item in only:
                yield item
        return
    queue: asyncio.Queue[tuple[int, Any]] = asyncio.Queue()

    async def pump(it: AsyncIterator[T]) -> None:
        try:
            async with aclosing(it) as a:  # type: ignore[type-var]
                async for item in a:
                    queue.put_nowait((0, item))
        except Exception as exc:  # noqa: BLE001 - re-raised by the reader
            queue.put_nowait((2, exc))
        finally:
            queue.put_nowait((1, None))

    tasks = [asyncio.create_task(pump(it)) for it in streams]
    try:
        left = len(tasks)
        while left:
            kind, item = await queue.get()
            if kind == 1:
                left -= 1
            elif kind == 2:
                raise item
            else:
                yield item
    finally:
        for t in tasks:
            t.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)


async def _chat_stream(engine: Any, reqs: list[Any], cid: str, created: int, model_id: str,
                       include_usage: bool, logprobs: bool) -> AsyncIterator[dict[str, Any]]:
    produced = [0] * len(reqs)
    async for event in merge([_chat_choice(engine, r, i, cid, created, model_id, include_usage, logprobs, produced)
                              for i, r in enumerate(reqs)]):
        yield event
    if include_usage:
        yield {"id": cid, "object": "chat.completion.chunk", "created": created, "model": model_id, "choices": [],
               "usage": _usage(len(reqs[0].prompt_ids), sum(produced))}


async def _chat_choice(engine: Any, req: Any, index: int, cid: str, created: int, model_id: str,
                       include_usage: bool, logprobs: bool, produced: list[int]) -> AsyncIterator[dict[str, Any]]:
    from agent.model.engine import EngineError

    def chunk(delta: dict[str, Any], finish: str | None = None, lp: dict[str, Any] | None = None) -> dict[str, Any]:
        event = {"id": cid, "object": "chat.completion.chunk", "created": created, "model": model_id,
                 "choices": [{"index": index, "delta": delta, "logprobs": lp, "finish_reason": finish}]}
        return {**event, "usage": None} if include_usage else event

    yield chunk({"role": "assistant", "content": ""})
    try:
        async with aclosing(engine.generate(req)) as pieces:
            async for piece in pieces:
                produced[index] += len(piece.token_ids)
                lp = _chat_logprobs(engine, piece.token_ids, piece.logprobs) if logprobs else None
                if piece.text or (lp and lp["content"]):
                    yield chunk({"content": piece.text}, lp=lp)
                if piece.finish_reason:
                    yield chunk({}, piece.finish_reason)
    except EngineError as exc:  # mid-stream: the status is sent already, so report in-band
        yield ApiError(500, str(exc), type_="server_error").body()


async def _completion_stream(engine: Any, reqs: list[Any], cid: str, created: int, model_id: str,
                             include_usage: bool, prompt_tokens: int) -> AsyncIterator[dict[str, Any]]:
    produced = [0] * len(reqs)

    def event(choices: list[dict[str, Any]]) -> dict[str, Any]:
        e = {"id": cid, "object": "text_completion", "created": created, "model": model_id, "choices": choices}
        return {**e, "usage": None} if include_usage else e

    async def one(index: int, req: Any) -> AsyncIterator[dict[str, Any]]:
        from agent.model.engine import EngineError

        try:
            async with aclosing(engine.generate(req)) as pieces:
                async for piece in pieces:
                    produced[index] += len(piece.token_ids)
                    yield event([{"index": index, "text": piece.text, "finish_reason": piece.finish_reason,
                                  **_token_fields(engine.tokenizer, piece.token_ids, piece.logprobs)}])
        except EngineError as exc:
            yield ApiError(500, str(exc), type_="server_error").body()

    async for e in merge([one(i, r) for i, r in enumerate(reqs)]):
        yield e
    if include_usage:
        yield {**event([]), "usage": _usage(prompt_tokens, sum(produced))}


# -- `flywheel policy serve` -------------------------------------------------------


def create_app_from_checkpoint(
    checkpoint: Path, *, model_id: str | None = None, max_slots: int = 32, device: str = "cpu",
    api_key: str | None = None,
) -> FastAPI:
    from agent.model.checkpoint import load_checkpoint, load_profile
    from agent.model.engine import Engine

    profile = load_profile(checkpoint)
    model, tokenizer = load_checkpoint(checkpoint, device=device)
    engine = Engine(model, tokenizer, max_slots=max_slots, device=device)
    return create_app(engine, model_id=model_id or checkpoint.resolve().name, api_key=api_key,
                      prompt_profile=profile)


MAX_SLOTS = 1024
LOG_LEVELS = ("critical", "error", "warning", "info", "debug", "trace")
SHUTDOWN_GRACE_S = 5.0  # on SIGTERM/SIGINT, requests still streaming after this are cut


def check_settings(args: argparse.Namespace) -> str | None:
    """The first impossible setting of ``flywheel policy serve`` as a one-line message, else None.
    Checked before the checkpoint loads, so a wrong flag costs nothing."""
    from backend.cli_checks import CliCheckError, check_device, check_port

    if not 1 <= args.max_slots <= MAX_SLOTS:
        return f"--max-slots {args.max_slots}: give 1-{MAX_SLOTS} (sequences decoded together)"
    if args.model_name is not None and not (0 < len(args.model_name) <= MAX_NAME and args.model_name.strip()
                                            and args.model_name.isprintable()):
        return f"--model-name must be 1-{MAX_NAME} printable characters"
    if args.log_level.lower() not in LOG_LEVELS:
        return f"--log-level {args.log_level!r}: one of {', '.join(LOG_LEVELS)}"
    try:
        check_port(args.port)
        check_device(args.device)
    except CliCheckError as exc:
        return str(exc)
    if not Path(args.checkpoint).is_dir():
        return f"no checkpoint directory at {args.checkpoint}"
    return None


def serve(args: argparse.Namespace) -> int:
    """``flywheel policy serve``: check the settings, load the checkpoint, listen, print the
    base URL, serve until SIGINT or SIGTERM (requests still streaming get
    :data:`SHUTDOWN_GRACE_S` seconds, then the server exits). Every refusal is one line on
    stderr and exit status 1."""
    import uvicorn

    from backend.cli_checks import CliCheckError, listen, one_line, quiet_third_party
    from backend.net import is_loopback

    quiet_third_party()

    def fail(message: str) -> int:
        print(f"flywheel policy serve: {message}", file=sys.stderr)
        return 1

    api_key = args.api_key or PolicyServerSettings().api_key or None
    if not is_loopback(args.host) and not api_key:
        return fail(f"refusing to serve on {args.host} without an API key "
                    "(--api-key or FLYWHEEL_POLICY_API_KEY); loopback addresses need none")
    problem = check_settings(args)
    if problem:
        return fail(problem)
    try:
        sock = listen(args.host, args.port)  # before loading: a port in use fails in a second, not after a minute
    except CliCheckError as exc:
        return fail(str(exc))
    try:
        app = create_app_from_checkpoint(Path(args.checkpoint), model_id=args.model_name,
                                         max_slots=args.max_slots, device=args.device, api_key=api_key)
    except Exception as exc:  # noqa: BLE001 - a bad checkpoint of any kind is one line, not a traceback
        sock.close()
        return fail(f"cannot load {args.checkpoint}: {one_line(exc)}")
    host = f"[{args.host}]" if ":" in args.host else args.host
    print(f"Flywheel policy server at http://{host}:{sock.getsockname()[1]}/v1", flush=True)
    class Server(uvicorn.Server):
        def handle_exit(self, sig: int, frame: Any) -> None:
            app.state.begin_shutdown()  # streams end now instead of holding the shutdown up
            super().handle_exit(sig, frame)

    config = uvicorn.Config(app, log_level=args.log_level.lower(), ws="none", lifespan="on",
                            timeout_graceful_shutdown=SHUTDOWN_GRACE_S)
    Server(config).run(sockets=[sock])
    return 0
