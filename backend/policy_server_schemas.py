"""The response bodies of ``flywheel policy serve`` (``backend/policy_server.py``), as typed models.

They are OpenAI's shapes plus this server's documented extensions (``max_model_len`` and
``prompt_profile`` on a model card; ``token_ids``, ``prompt_token_ids`` and always-present
``logprobs`` on completion choices), so ``/openapi.json`` documents what each route really
returns: ``application/json`` bodies, the ``text/event-stream`` chunks of a streamed
request (:func:`document_streams`), and the one error shape, :class:`ErrorResponse`.

Not guaranteed: the models describe; the routes build the bodies and FastAPI checks them
against these models (a mismatch is a 500, which the tests would show).
"""

from __future__ import annotations

from typing import Any, Literal

from fastapi import FastAPI
from fastapi.openapi.utils import get_openapi
from pydantic import BaseModel, ConfigDict, Field

__all__ = [
    "ChatCompletion", "ChatCompletionChunk", "Completion", "CompletionChunk", "ErrorResponse", "ModelCard",
    "ModelList", "document_streams", "error_responses",
]


class ErrorDetail(BaseModel):
    message: str
    type: str = Field(description="invalid_request_error, authentication_error or server_error")
    param: str | None = Field(description="the request parameter at fault, if one is")
    code: str | None = Field(description="e.g. unsupported_parameter, model_not_found, context_length_exceeded")


class ErrorResponse(BaseModel):
    """Every error, unknown routes included (OpenAI's shape)."""

    error: ErrorDetail


class PromptProfileRef(BaseModel):
    name: str
    fingerprint: str = Field(description="of the checkpoint's prompt profile (agent.prompt.PromptProfile)")


class ModelCard(BaseModel):
    id: str
    object: Literal["model"] = "model"
    created: int
    owned_by: str
    max_model_len: int = Field(description="the model's context, in tokens (prompt + completion)")
    prompt_profile: PromptProfileRef


class ModelList(BaseModel):
    object: Literal["list"] = "list"
    data: list[ModelCard]


class Usage(BaseModel):
    prompt_tokens: int
    completion_tokens: int
    total_tokens: int


class TokenLogprob(BaseModel):
    model_config = ConfigDict(ser_json_inf_nan="constants")  # as json.dumps writes them: -Infinity

    token: str
    logprob: float
    bytes: list[int]
    top_logprobs: list[Any] = Field(description="always empty: top logprobs are not computed")


class ChatLogprobs(BaseModel):
    content: list[TokenLogprob]
    refusal: None = None


class AssistantMessage(BaseModel):
    role: Literal["assistant"] = "assistant"
    content: str


class ChatChoice(BaseModel):
    index: int
    message: AssistantMessage
    logprobs: ChatLogprobs | None = Field(description="with logprobs: true")
    finish_reason: str | None


class ChatCompletion(BaseModel):
    id: str
    object: Literal["chat.completion"] = "chat.completion"
    created: int
    model: str
    choices: list[ChatChoice]
    usage: Usage


class ChatDelta(BaseModel):
    role: Literal["assistant"] | None = None
    content: str | None = None


class ChatChunkChoice(BaseModel):
    index: int
    delta: ChatDelta
    logprobs: ChatLogprobs | None
    finish_reason: str | None


class ChatCompletionChunk(BaseModel):
    """One ``data:`` line of a streamed chat completion (then ``data: [DONE]``)."""

    id: str
    object: Literal["chat.completion.chunk"] = "chat.completion.chunk"
    created: int
    model: str
    choices: list[ChatChunkChoice] = Field(description="empty in the last chunk when it carries the usage")
    usage: Usage | None = Field(None, description="with stream_options.include_usage: null, then the totals last")


class CompletionLogprobs(BaseModel):
    model_config = ConfigDict(ser_json_inf_nan="constants")

    tokens: list[str] = Field(description="each token id decoded alone")
    token_logprobs: list[float] = Field(description=(
        "aligned with token_ids (temperature-1 logprobs; with logprobs_mode: processed, those of the "
        "tempered distribution each token was drawn from)"))
    top_logprobs: None = Field(None, description="not computed")
    text_offset: None = None


class CompletionChoice(BaseModel):
    index: int = Field(description="choice k*n + j is the j-th sample of prompt k")
    text: str
    finish_reason: str | None
    token_ids: list[int] = Field(description="the sampled ids, including the one that ended the sequence")
    logprobs: CompletionLogprobs
    prompt_token_ids: list[int] = Field(description="the prompt as the model saw it")


class Completion(BaseModel):
    id: str
    object: Literal["text_completion"] = "text_completion"
    created: int
    model: str
    choices: list[CompletionChoice]
    usage: Usage


class CompletionChunkChoice(BaseModel):
    index: int
    text: str
    finish_reason: str | None
    token_ids: list[int]
    logprobs: CompletionLogprobs


class CompletionChunk(BaseModel):
    """One ``data:`` line of a streamed completion (then ``data: [DONE]``)."""

    id: str
    object: Literal["text_completion"] = "text_completion"
    created: int
    model: str
    choices: list[CompletionChunkChoice]
    usage: Usage | None = Field(None, description="with stream_options.include_usage: null, then the totals last")


def error_responses(*statuses: int) -> dict[int | str, dict[str, Any]]:
    """``responses=`` for a route: each status with :class:`ErrorResponse`."""
    why = {400: "a parameter that is invalid or cannot be honoured", 401: "no or a wrong API key",
           404: "no such model or route", 500: "the engine failed"}
    return {s: {"model": ErrorResponse, "description": why.get(s, "error")} for s in statuses}


STREAMS = {"/v1/chat/completions": ChatCompletionChunk, "/v1/completions": CompletionChunk}


def document_streams(app: FastAPI) -> None:
    """Make ``app.openapi()`` also describe the ``text/event-stream`` body of the routes in
    :data:`STREAMS` (``"stream": true``): each event is a chunk model, in the components."""

    def openapi() -> dict[str, Any]:
        if app.openapi_schema is not None:
            return app.openapi_schema
        spec = get_openapi(title=app.title, version=app.version, description=app.description, routes=app.routes)
        schemas = spec.setdefault("components", {}).setdefault("schemas", {})
        for path, chunk in STREAMS.items():
            schema = chunk.model_json_schema(ref_template="#/components/schemas/{model}")
            schemas.update(schema.pop("$defs", {}))
            schemas[chunk.__name__] = schema
            ok = spec["paths"][path]["post"]["responses"]["200"]
            ok["content"]["text/event-stream"] = {"schema": {"$ref": f"#/components/schemas/{chunk.__name__}"}}
            ok["description"] = ('the completion; with "stream": true, server-sent events, each '
                                 f'"data: <{chunk.__name__} JSON>", then "data: [DONE]"')
        app.openapi_schema = spec
        return spec

    app.openapi = openapi  # type: ignore[method-assign]
