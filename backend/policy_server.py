"""An OpenAI-compatible HTTP endpoint for Flywheel's own model (``flywheel policy serve``).

Routes (all under ``/v1``):

* ``GET /models`` — the one served model, with ``max_model_len`` and
  ``prompt_profile`` (``{"name", "fingerprint"}`` of the checkpoint's
  :class:`agent.prompt.PromptProfile`; ``OpenAICompatPolicy`` in completions
  mode reads it to render the prompt the model was trained with).
* ``POST /chat/completions`` — ``messages`` are flattened by
  ``agent.prompt.flatten``, the runtime's own template (:func:`render_messages`)
  and generation stops at the end marker (the newline the template puts before
  it is not part of the content). Streaming (SSE, OpenAI's
  ``chat.completion.chunk`` format, with ``stream_options.include_usage``) and
  non-streaming.
* ``POST /completions`` — raw completion; ``prompt`` is text *or* a list of
  token ids (token-in). Streaming and non-streaming.

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

``max_tokens`` (default: as many as fit) is clamped to the room the prompt
leaves in the model's context (unlike vLLM, which rejects such requests); a
prompt that leaves no room is a 400 with code ``context_length_exceeded``.
Generation never emits the template's markers as text (see
``agent.model.engine``).

Not supported: ``n > 1`` when streaming, ``echo``, ``best_of``, top
logprobs, tools/function calling (the model writes XML tool calls as text).
The model name must be the served id or ``"default"``; anything else is 404.
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
from typing import Any, Literal

from fastapi import Depends, FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, StreamingResponse
from pydantic import BaseModel, ConfigDict, Field
from pydantic_settings import BaseSettings, SettingsConfigDict

from agent.prompt import CHAT_TEMPLATE, DEFAULT_PROFILE, ChatTemplate, Message, PromptProfile, flatten


class PolicyServerSettings(BaseSettings):
    """Environment settings of ``flywheel policy serve`` (flags override them)."""

    model_config = SettingsConfigDict(env_prefix="FLYWHEEL_POLICY_", extra="ignore")

    api_key: str | None = None  # FLYWHEEL_POLICY_API_KEY: required off loopback

class ApiError(Exception):
    def __init__(self, status: int, message: str, *, type_: str = "invalid_request_error", code: str | None = None):
        super().__init__(message)
        self.status, self.message, self.type, self.code = status, message, type_, code

    def body(self) -> dict[str, Any]:
        return {"error": {"message": self.message, "type": self.type, "param": None, "code": self.code}}


# -- request bodies ----------------------------------------------------------------


class _Body(BaseModel):
    model_config = ConfigDict(extra="ignore")  # clients send many optional fields; unknown ones are ignored

    model: str | None = None
    stream: bool = False
    stream_options: dict[str, Any] | None = None
    temperature: float | None = Field(default=None, ge=0, le=2)
    top_p: float | None = Field(default=None, gt=0, le=1)
    stop: str | list[str] | None = None
    seed: int | None = None
    n: int = Field(default=1, ge=1, le=16)

    @property
    def include_usage(self) -> bool:
        return bool((self.stream_options or {}).get("include_usage"))

    def stops(self) -> list[str]:
        return [self.stop] if isinstance(self.stop, str) else list(self.stop or [])


class ChatMessage(BaseModel):
    model_config = ConfigDict(extra="ignore")

    role: Literal["system", "developer", "user", "assistant", "tool"]
    content: str | list[dict[str, Any]] | None = None

    def text(self) -> str:
        if isinstance(self.content, list):  # content parts: only text is understood
            parts = []
            for part in self.content:
                if part.get("type") != "text" or not isinstance(part.get("text"), str):
                    raise ApiError(400, "only text content parts are supported")
                parts.append(part["text"])
            return "".join(parts)
        return self.content or ""


class ChatRequest(_Body):
    messages: list[ChatMessage] = Field(min_length=1)
    max_tokens: int | None = Field(default=None, ge=1)
    max_completion_tokens: int | None = Field(default=None, ge=1)


class CompletionRequest(_Body):
    prompt: str | list[int]
    max_tokens: int | None = Field(default=16, ge=1)  # OpenAI's default for completions


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

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        await engine.start()
        try:
            yield
        finally:
            await engine.stop()

    async def authorise(request: Request) -> None:
        if api_key and not secrets.compare_digest(
            request.headers.get("authorization", ""), f"Bearer {api_key}"
        ):
            raise ApiError(401, "invalid or missing API key (Authorization: Bearer KEY)", type_="authentication_error")

    app = FastAPI(title="Flywheel policy server", lifespan=lifespan, dependencies=[Depends(authorise)])

    @app.exception_handler(ApiError)
    async def api_error(_: Request, exc: ApiError) -> JSONResponse:
        return JSONResponse(exc.body(), status_code=exc.status)

    @app.exception_handler(RequestValidationError)
    async def invalid(_: Request, exc: RequestValidationError) -> JSONResponse:
        where = "; ".join(f"{'.'.join(map(str, e['loc'][1:]))}: {e['msg']}" for e in exc.errors())
        return JSONResponse(ApiError(400, f"invalid request: {where}").body(), status_code=400)

    def check_model(name: str | None) -> None:
        if name not in (None, model_id, "default"):
            raise ApiError(404, f"model {name!r} is not served here; this server serves {model_id!r}",
                           code="model_not_found")

    def make_request(body: _Body, prompt_ids: list[int], max_tokens: int | None, stops: list[str],
                     index: int = 0) -> GenerationRequest:
        req = GenerationRequest(
            prompt_ids=prompt_ids, max_tokens=max_tokens or engine.max_len,
            temperature=1.0 if body.temperature is None else body.temperature,
            top_p=1.0 if body.top_p is None else body.top_p, stop=stops,
            seed=None if body.seed is None else body.seed + index,
        )
        try:
            return engine.fit(req)  # max_tokens clamped to what the context leaves
        except EngineError as exc:
            code = "context_length_exceeded" if isinstance(exc, PromptTooLong) else None
            raise ApiError(400, str(exc), code=code) from None

    def encode_prompt(prompt: str | list[int]) -> list[int]:
        return tokenizer.encode(prompt) if isinstance(prompt, str) else list(prompt)

    @app.get("/v1/models")
    async def models() -> dict[str, Any]:
        return {"object": "list", "data": [{
            "id": model_id, "object": "model", "created": 0, "owned_by": "flywheel", "max_model_len": engine.max_len,
            "prompt_profile": {"name": prompt_profile.name, "fingerprint": prompt_profile.fingerprint},
        }]}

    @app.post("/v1/chat/completions", response_model=None)
    async def chat(body: ChatRequest) -> dict[str, Any] | StreamingResponse:
        check_model(body.model)
        prompt_ids = tokenizer.encode(render_messages([(m.role, m.text()) for m in body.messages]))
        max_tokens = body.max_completion_tokens or body.max_tokens
        reqs = [make_request(body, prompt_ids, max_tokens, [*CHAT_TEMPLATE.turn_stops, *body.stops()], i) for i in range(body.n)]
        cid, created = f"chatcmpl-{secrets.token_hex(12)}", int(time.time())
        if body.stream:
            if body.n != 1:
                raise ApiError(400, "n > 1 is supported only without streaming")
            return _sse(_chat_events(engine, reqs[0], cid, created, model_id, body.include_usage))
        done = await _complete_all(engine, reqs)
        return {
            "id": cid, "object": "chat.completion", "created": created, "model": model_id,
            "choices": [{"index": i, "message": {"role": "assistant", "content": c.text}, "logprobs": None,
                         "finish_reason": c.finish_reason} for i, c in enumerate(done)],
            "usage": _usage(len(reqs[0].prompt_ids), sum(len(c.token_ids) for c in done)),
        }

    @app.post("/v1/completions", response_model=None)
    async def completions(body: CompletionRequest) -> dict[str, Any] | StreamingResponse:
        check_model(body.model)
        prompt_ids = encode_prompt(body.prompt)
        reqs = [make_request(body, prompt_ids, body.max_tokens, body.stops(), i) for i in range(body.n)]
        cid, created = f"cmpl-{secrets.token_hex(12)}", int(time.time())
        if body.stream:
            if body.n != 1:
                raise ApiError(400, "n > 1 is supported only without streaming")
            return _sse(_completion_events(engine, reqs[0], cid, created, model_id, body.include_usage))
        done = await _complete_all(engine, reqs)
        choices = []
        for i, c in enumerate(done):
            choices.append({"index": i, "text": c.text, "finish_reason": c.finish_reason,
                            **_token_fields(tokenizer, c.token_ids, c.logprobs), "prompt_token_ids": prompt_ids})
        return {"id": cid, "object": "text_completion", "created": created, "model": model_id, "choices": choices,
                "usage": _usage(len(prompt_ids), sum(len(c.token_ids) for c in done))}

    return app


def _usage(prompt: int, completion: int) -> dict[str, int]:
    return {"prompt_tokens": prompt, "completion_tokens": completion, "total_tokens": prompt + completion}


def _token_fields(tokenizer: Any, ids: Sequence[int], logprobs: Sequence[float]) -> dict[str, Any]:
    return {"token_ids": list(ids), "logprobs": {
        "tokens": [tokenizer.decode([t]) for t in ids], "token_logprobs": list(logprobs), "top_logprobs": None,
    }}


async def _complete_all(engine: Any, reqs: list[Any]) -> list[Any]:
    from agent.model.engine import EngineError

    try:
        return list(await asyncio.gather(*(engine.complete(r) for r in reqs)))
    except EngineError as exc:
        raise ApiError(500, str(exc), type_="server_error") from None


def _sse(events: AsyncIterator[dict[str, Any]]) -> StreamingResponse:
    async def body() -> AsyncIterator[str]:
        async with aclosing(events) as it:  # a client that goes away frees its engine slot
            async for event in it:
                yield f"data: {json.dumps(event)}\n\n"
        yield "data: [DONE]\n\n"

    return StreamingResponse(body(), media_type="text/event-stream", headers={"Cache-Control": "no-cache"})


async def _chat_events(engine: Any, req: Any, cid: str, created: int, model_id: str,
                       include_usage: bool) -> AsyncIterator[dict[str, Any]]:
    from agent.model.engine import EngineError

    def chunk(delta: dict[str, Any], finish: str | None = None) -> dict[str, Any]:
        event = {"id": cid, "object": "chat.completion.chunk", "created": created, "model": model_id,
                 "choices": [{"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish}]}
        return {**event, "usage": None} if include_usage else event

    yield chunk({"role": "assistant", "content": ""})
    produced = 0
    try:
        async with aclosing(engine.generate(req)) as pieces:
            async for piece in pieces:
                produced += len(piece.token_ids)
                if piece.text:
                    yield chunk({"content": piece.text})
                if piece.finish_reason:
                    yield chunk({}, piece.finish_reason)
    except EngineError as exc:  # mid-stream: the status is sent already, so report in-band
        yield ApiError(500, str(exc), type_="server_error").body()
        return
    if include_usage:
        yield {"id": cid, "object": "chat.completion.chunk", "created": created, "model": model_id, "choices": [],
               "usage": _usage(len(req.prompt_ids), produced)}


async def _completion_events(engine: Any, req: Any, cid: str, created: int, model_id: str,
                             include_usage: bool) -> AsyncIterator[dict[str, Any]]:
    from agent.model.engine import EngineError

    def event(choices: list[dict[str, Any]]) -> dict[str, Any]:
        return {"id": cid, "object": "text_completion", "created": created, "model": model_id, "choices": choices}

    produced = 0
    try:
        async with aclosing(engine.generate(req)) as pieces:
            async for piece in pieces:
                produced += len(piece.token_ids)
                choice = {"index": 0, "text": piece.text, "finish_reason": piece.finish_reason,
                          **_token_fields(engine.tokenizer, piece.token_ids, piece.logprobs)}
                yield {**event([choice]), "usage": None} if include_usage else event([choice])
    except EngineError as exc:
        yield ApiError(500, str(exc), type_="server_error").body()
        return
    if include_usage:
        yield {**event([]), "usage": _usage(len(req.prompt_ids), produced)}


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


def serve(args: argparse.Namespace) -> int:
    """``flywheel policy serve``: load the checkpoint, listen, print the base URL, serve until interrupted."""
    import uvicorn

    from backend.net import bind_socket, is_loopback

    api_key = args.api_key or PolicyServerSettings().api_key or None
    if not is_loopback(args.host) and not api_key:
        print(f"flywheel policy serve: refusing to serve on {args.host} without an API key "
              "(--api-key or FLYWHEEL_POLICY_API_KEY); loopback addresses need none", file=sys.stderr)
        return 1
    if not Path(args.checkpoint).is_dir():
        print(f"flywheel policy serve: no checkpoint directory at {args.checkpoint}", file=sys.stderr)
        return 1
    try:
        app = create_app_from_checkpoint(Path(args.checkpoint), model_id=args.model_name,
                                         max_slots=args.max_slots, device=args.device, api_key=api_key)
    except (OSError, ValueError) as exc:
        print(f"flywheel policy serve: cannot load {args.checkpoint}: {exc}", file=sys.stderr)
        return 1
    try:
        sock = bind_socket(args.host, args.port)
    except OSError as exc:
        print(f"flywheel policy serve: cannot listen on {args.host}:{args.port}: {exc}", file=sys.stderr)
        return 1
    host = f"[{args.host}]" if ":" in args.host else args.host
    print(f"Flywheel policy server at http://{host}:{sock.getsockname()[1]}/v1", flush=True)
    config = uvicorn.Config(app, log_level=args.log_level, ws="none", lifespan="on")
    uvicorn.Server(config).run(sockets=[sock])
    return 0
