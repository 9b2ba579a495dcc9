"""``flywheel policy serve`` driven by the official ``openai`` Python package.

Everything the server accepts works through the client (models, chat and
completions, streaming, ``n`` choices, batched prompts, logprobs), and
everything it cannot honour is refused with an OpenAI-shaped 400 that names
the parameter — never silently ignored.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterator
from typing import Any

import openai
import pytest
import torch

from agent.model.engine import Engine
from agent.prompt import CHAT_TEMPLATE
from backend.policy_server import create_app, render_messages
from tests.backend.test_policy_server import _serve_in_thread, checkpoint, local  # noqa: F401 - fixtures

MESSAGES = [{"role": "system", "content": "be brief"}, {"role": "user", "content": "fix the bug"}]


@pytest.fixture(scope="module")
def base_url(local) -> Iterator[str]:  # noqa: F811 - the fixture imported above
    model, tok = local
    app = create_app(Engine(model, tok, max_slots=8, max_len=256), model_id="tiny", api_key="sekret")
    with _serve_in_thread(app) as url:
        yield url


@pytest.fixture
def client(base_url: str) -> Iterator[openai.OpenAI]:
    with openai.OpenAI(base_url=base_url, api_key="sekret", max_retries=0, timeout=60) as c:
        yield c


def extra(obj: Any, name: str) -> Any:
    """A field the server adds to OpenAI's objects (token ids), as the client keeps it."""
    return (obj.model_extra or {})[name]


def test_models_list_and_retrieve(client: openai.OpenAI) -> None:
    assert [m.id for m in client.models.list()] == ["tiny"]
    m = client.models.retrieve("tiny")
    assert m.id == "tiny" and m.object == "model" and extra(m, "max_model_len") == 256
    assert client.models.retrieve("default").id == "tiny"
    with pytest.raises(openai.NotFoundError) as info:
        client.models.retrieve("gpt-4")
    assert info.value.code == "model_not_found"


def test_a_wrong_key_is_an_authentication_error(base_url: str) -> None:
    with openai.OpenAI(base_url=base_url, api_key="wrong", max_retries=0) as c, \
            pytest.raises(openai.AuthenticationError):
        c.models.list()


def test_chat_with_logprobs_matches_the_token_logprobs(client: openai.OpenAI, local) -> None:  # noqa: F811
    model, tok = local
    r = client.chat.completions.create(model="tiny", messages=MESSAGES, max_tokens=12, temperature=0, logprobs=True,
                                       top_logprobs=0)
    [choice] = r.choices
    content = choice.logprobs.content
    assert content and all(t.top_logprobs == [] for t in content)
    assert len(content) <= r.usage.completion_tokens <= len(content) + 1  # + the end marker, which is no content
    # the same greedy generation through /completions gives the token ids: the logprobs are the model's own
    text = render_messages([(m["role"], m["content"]) for m in MESSAGES])
    raw = client.completions.create(model="tiny", prompt=text, max_tokens=12, temperature=0,
                                    stop=list(CHAT_TEMPLATE.turn_stops))
    ids = extra(raw.choices[0], "token_ids")
    prompt = tok.encode(text)
    ref = model.logprobs(torch.tensor([prompt + ids]))[0, len(prompt) - 1:].tolist()
    kept = [lp for t, lp in zip(ids, ref, strict=True) if t not in set(tok.special_ids.values())]
    assert [t.logprob for t in content] == pytest.approx(kept, abs=1e-5)
    assert choice.message.content == raw.choices[0].text
    # without logprobs: none
    r = client.chat.completions.create(model="tiny", messages=MESSAGES, max_tokens=4, temperature=0)
    assert r.choices[0].logprobs is None


def test_chat_streams_n_choices(client: openai.OpenAI) -> None:
    body: dict[str, Any] = {"model": "tiny", "messages": MESSAGES, "max_tokens": 10, "n": 3, "seed": 5}
    whole = client.chat.completions.create(**body)
    assert [c.index for c in whole.choices] == [0, 1, 2]
    stream = client.chat.completions.create(**body, stream=True, stream_options={"include_usage": True})
    text: dict[int, str] = defaultdict(str)
    finish: dict[int, str] = {}
    usage = None
    for chunk in stream:
        if chunk.usage is not None:
            usage = chunk.usage
        for c in chunk.choices:
            assert c.index not in finish, "a chunk after the choice finished"
            text[c.index] += c.delta.content or ""
            if c.finish_reason:
                finish[c.index] = c.finish_reason
    assert sorted(finish) == [0, 1, 2]
    assert [text[i] for i in range(3)] == [c.message.content for c in whole.choices]  # seeded: the same samples
    assert usage is not None and usage.completion_tokens == whole.usage.completion_tokens
    assert usage.prompt_tokens == whole.usage.prompt_tokens


def test_chat_stream_with_logprobs(client: openai.OpenAI) -> None:
    stream = client.chat.completions.create(model="tiny", messages=MESSAGES, max_tokens=8, temperature=0,
                                            logprobs=True, stream=True)
    lps = [t.logprob for chunk in stream for c in chunk.choices if c.logprobs for t in c.logprobs.content or []]
    whole = client.chat.completions.create(model="tiny", messages=MESSAGES, max_tokens=8, temperature=0, logprobs=True)
    assert lps == [t.logprob for t in whole.choices[0].logprobs.content] and lps


def test_batched_prompts_and_n(client: openai.OpenAI, local) -> None:  # noqa: F811
    _, tok = local
    prompts = ["def add(a, b):", "import os\n"]
    r = client.completions.create(model="tiny", prompt=prompts, n=2, max_tokens=6, seed=3)
    assert [c.index for c in r.choices] == [0, 1, 2, 3]
    for c in r.choices:  # choice k*n + j belongs to prompt k
        assert extra(c, "prompt_token_ids") == tok.encode(prompts[c.index // 2])
        assert len(extra(c, "token_ids")) == len(c.logprobs.token_logprobs) <= 6
    assert r.usage.prompt_tokens == sum(len(tok.encode(p)) for p in prompts)
    assert r.usage.completion_tokens == sum(len(extra(c, "token_ids")) for c in r.choices)
    # the same batch streamed: each choice's text and tokens, in order, under its index
    text: dict[int, str] = defaultdict(str)
    ids: dict[int, list[int]] = defaultdict(list)
    for chunk in client.completions.create(model="tiny", prompt=prompts, n=2, max_tokens=6, seed=3, stream=True):
        for c in chunk.choices:
            text[c.index] += c.text
            ids[c.index] += extra(c, "token_ids")
    assert [text[i] for i in range(4)] == [c.text for c in r.choices]
    assert [ids[i] for i in range(4)] == [extra(c, "token_ids") for c in r.choices]
    # token-id prompts, batched
    batch = [tok.encode(p) for p in prompts]
    r2 = client.completions.create(model="tiny", prompt=batch, max_tokens=6, seed=3)
    assert [extra(c, "prompt_token_ids") for c in r2.choices] == batch
    assert r2.choices[0].text == r.choices[0].text  # choice 0 has seed 3 in both


CHAT_REFUSED = [
    ("top_logprobs", {"logprobs": True, "top_logprobs": 2}),
    ("tools", {"tools": [{"type": "function", "function": {"name": "f", "parameters": {"type": "object"}}}]}),
    ("tool_choice", {"tool_choice": "required"}),
    ("response_format", {"response_format": {"type": "json_object"}}),
    ("presence_penalty", {"presence_penalty": 0.5}),
    ("frequency_penalty", {"frequency_penalty": -1.0}),
    ("logit_bias", {"logit_bias": {"5": 10}}),
    ("modalities", {"modalities": ["audio"]}),
    ("frobnicate", {"extra_body": {"frobnicate": True}}),
]
COMPLETION_REFUSED = [
    ("logprobs", {"logprobs": 2}),
    ("echo", {"echo": True}),
    ("suffix", {"suffix": "return x"}),
    ("best_of", {"best_of": 3}),
    ("presence_penalty", {"presence_penalty": 1.0}),
]


@pytest.mark.parametrize(("param", "kwargs"), CHAT_REFUSED, ids=[p for p, _ in CHAT_REFUSED])
def test_chat_refuses_what_it_cannot_honour(client: openai.OpenAI, param: str, kwargs: dict[str, Any]) -> None:
    with pytest.raises(openai.BadRequestError) as info:
        client.chat.completions.create(model="tiny", messages=MESSAGES, max_tokens=2, **kwargs)
    assert info.value.param == param and info.value.code == "unsupported_parameter", info.value.body
    assert info.value.type == "invalid_request_error" and param in info.value.message


@pytest.mark.parametrize(("param", "kwargs"), COMPLETION_REFUSED, ids=[p for p, _ in COMPLETION_REFUSED])
def test_completions_refuse_what_they_cannot_honour(client: openai.OpenAI, param: str, kwargs: dict[str, Any]) -> None:
    with pytest.raises(openai.BadRequestError) as info:
        client.completions.create(model="tiny", prompt="x", max_tokens=2, **kwargs)
    assert info.value.param == param and info.value.code == "unsupported_parameter", info.value.body


def test_values_that_change_nothing_are_accepted(client: openai.OpenAI) -> None:
    r = client.chat.completions.create(model="tiny", messages=MESSAGES, max_tokens=2, user="u", tool_choice="none",
                                       response_format={"type": "text"}, presence_penalty=0, logit_bias={},
                                       metadata={"k": "v"}, store=False, seed=1)
    assert r.choices[0].finish_reason in ("stop", "length")
    r = client.completions.create(model="tiny", prompt="x", max_tokens=2, n=2, best_of=2, logprobs=0, echo=False,
                                  user="u")
    assert len(r.choices) == 2


def test_errors_are_openai_shaped_on_unknown_routes(client: openai.OpenAI) -> None:
    with pytest.raises(openai.NotFoundError) as info:
        client.get("/embeddings", cast_to=object)
    assert info.value.code == "unknown_url" and info.value.body == {
        "message": "Invalid URL (GET /v1/embeddings)", "type": "invalid_request_error", "param": None,
        "code": "unknown_url"}
    with pytest.raises(openai.BadRequestError) as bad:
        client.completions.create(model="tiny", prompt=[], max_tokens=2)
    assert bad.value.param == "prompt"
    with pytest.raises(openai.BadRequestError) as long:
        client.completions.create(model="m" * 100_000, prompt="x", max_tokens=2)
    assert long.value.param == "model" and len(long.value.message) < 500


def test_stop_sequences_are_bounded_not_miscounted(client: openai.OpenAI) -> None:
    r = client.completions.create(model="tiny", prompt="x", max_tokens=2, stop="a stop of twenty chr")
    assert r.choices[0].finish_reason in ("stop", "length")
    with pytest.raises(openai.BadRequestError) as info:
        client.completions.create(model="tiny", prompt="x", max_tokens=2, stop=["s"] * 17)
    assert info.value.param == "stop"
    with pytest.raises(openai.BadRequestError):
        client.completions.create(model="tiny", prompt="x", max_tokens=2, stop="s" * 300)
