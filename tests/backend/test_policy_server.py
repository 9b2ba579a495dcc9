"""``flywheel policy serve``: the OpenAI-compatible endpoint over the real engine.

Most tests talk to a real ``flywheel policy serve`` process on a free port (a
tiny random model saved as a checkpoint); error paths use the app in-process.
"""

from __future__ import annotations

import asyncio
import json
import re
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
import torch
from fastapi.testclient import TestClient

from agent.model.checkpoint import load_checkpoint, save_checkpoint
from agent.model.config import ModelConfig
from agent.model.engine import Engine
from agent.model.transformer import MoETransformer
from agent.policies.openai_compat import OpenAICompatPolicy, OpenAIConfig
from agent.policy import PolicyError
from agent.prompt import COMPACT_PROFILE, DEFAULT_PROFILE, Message, PromptProfile, render_prompt
from backend.cli import main as cli_main
from backend.policy_server import create_app, render_messages
from tests.agent.model.test_engine import tiny_tokenizer

REPO = Path(__file__).resolve().parents[2]
PROMPT = render_prompt([Message("user", "fix the bug"), Message("assistant", "Which one?"), Message("user", "x")], [])


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory: pytest.TempPathFactory) -> Path:
    tok = tiny_tokenizer()
    torch.manual_seed(0)
    model = MoETransformer(ModelConfig.preset("tiny", vocab_size=tok.vocab_size, max_seq_len=1024))
    return save_checkpoint(tmp_path_factory.mktemp("ckpt") / "tiny-ckpt", model, tok, step=0, profile=COMPACT_PROFILE)


@pytest.fixture(scope="module")
def server(checkpoint: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """A real server process; yields its base URL (…/v1)."""
    log = tmp_path_factory.mktemp("log") / "server.out"
    with open(log, "wb") as out:
        proc = subprocess.Popen(
            [sys.executable, "-m", "backend.cli", "policy", "serve", str(checkpoint), "--port", "0",
             "--model-name", "tiny", "--log-level", "warning"],
            cwd=REPO, stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
        )
    try:
        deadline = time.monotonic() + 60
        while not (m := re.search(r"at (http://\S+/v1)", log.read_text())):
            if proc.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"policy server did not start:\n{log.read_text()}")
            time.sleep(0.05)
        url = m.group(1)
        while True:
            try:
                if httpx.get(f"{url}/models", timeout=1).status_code == 200:
                    break
            except httpx.TransportError:
                pass
            if time.monotonic() > deadline:
                raise RuntimeError(f"policy server never answered:\n{log.read_text()}")
            time.sleep(0.05)
        yield url
    finally:
        proc.terminate()
        proc.wait(timeout=10)


@pytest.fixture(scope="module")
def local(checkpoint: Path):
    return load_checkpoint(checkpoint)


def sse(response: httpx.Response) -> list[object]:
    return [json.loads(line[6:]) if line != "data: [DONE]" else "[DONE]"
            for line in response.iter_lines() if line.startswith("data: ")]


def test_chat_messages_render_exactly_like_the_runtime() -> None:
    assert render_messages([(m["role"], m["content"]) for m in PROMPT.messages]) == PROMPT.text


async def test_runtime_openai_policy_works_unchanged(server: str, local) -> None:
    _, tok = local
    policy = OpenAICompatPolicy(OpenAIConfig(base_url=server, model="tiny", max_tokens=16))  # temperature 0
    try:
        chunks = [c async for c in policy.stream(PROMPT)]
    finally:
        await policy.aclose()
    streamed = "".join(c.text for c in chunks)
    body = {"model": "tiny", "messages": PROMPT.messages, "temperature": 0, "max_tokens": 16}
    done = httpx.post(f"{server}/chat/completions", json=body, timeout=30).json()
    assert streamed == done["choices"][0]["message"]["content"]
    assert chunks[-1].output_tokens == done["usage"]["completion_tokens"]
    assert any(c.finish_reason for c in chunks)
    # the server built the prompt with the runtime's template
    assert done["usage"]["prompt_tokens"] == len(tok.encode(PROMPT.text))


def test_chat_stream_is_in_openai_chunk_format(server: str) -> None:
    body = {"model": "default", "messages": PROMPT.messages, "max_tokens": 8, "seed": 1, "stream": True,
            "stream_options": {"include_usage": True}}
    with httpx.stream("POST", f"{server}/chat/completions", json=body, timeout=30) as r:
        assert r.headers["content-type"].startswith("text/event-stream")
        events = sse(r)
    assert events[-1] == "[DONE]"
    *chunks, usage = events[:-1]
    assert all(c["object"] == "chat.completion.chunk" and c["model"] == "tiny" for c in chunks)
    assert chunks[0]["choices"][0]["delta"] == {"role": "assistant", "content": ""}
    assert len({c["id"] for c in chunks}) == 1
    assert chunks[-1]["choices"][0]["finish_reason"] in ("stop", "length")
    assert usage["choices"] == [] and usage["usage"]["completion_tokens"] <= 8


def test_completions_token_in_token_out_match_training_logprobs(server: str, local) -> None:
    model, tok = local
    prompt = tok.encode("def add(a, b):\n    return")
    body = {"model": "tiny", "prompt": prompt, "max_tokens": 20, "temperature": 1.0, "seed": 7}
    [choice] = httpx.post(f"{server}/completions", json=body, timeout=30).json()["choices"]
    ids, lps = choice["token_ids"], choice["logprobs"]["token_logprobs"]
    assert choice["prompt_token_ids"] == prompt and len(ids) == len(lps) > 0
    ref = model.logprobs(torch.tensor([prompt + ids]))[0, len(prompt) - 1 :]
    assert (ref - torch.tensor(lps)).abs().max().item() <= 1e-5
    end = set(tok.special_ids.values())
    assert choice["text"] == tok.decode([t for t in ids if t not in end])


def test_processed_logprobs_are_those_of_the_tempered_distribution(app_client: TestClient, local) -> None:
    """``logprobs_mode: processed`` at T = 0.5 gives log_softmax(logits / 0.5) of the sampled
    tokens (what a trainer at 0.5 computes); the default stays temperature-1."""
    model, tok = local
    prompt = tok.encode("def add(a, b):")
    body = {"prompt": prompt, "max_tokens": 12, "temperature": 0.5, "seed": 5}
    raw = app_client.post("/v1/completions", json=body).json()["choices"][0]
    processed = app_client.post("/v1/completions", json={**body, "logprobs_mode": "processed"}).json()["choices"][0]
    assert processed["token_ids"] == raw["token_ids"]  # same seed, same draws: only the reported logprobs differ
    ids = processed["token_ids"]
    with torch.no_grad():
        logits = model(torch.tensor([prompt + ids])).logits[0, len(prompt) - 1 : -1].float()
    picked = torch.tensor(ids).unsqueeze(-1)
    tempered = torch.log_softmax(logits / 0.5, -1).gather(-1, picked).squeeze(-1)
    plain = torch.log_softmax(logits, -1).gather(-1, picked).squeeze(-1)
    assert (tempered - torch.tensor(processed["logprobs"]["token_logprobs"])).abs().max().item() <= 1e-4
    assert (plain - torch.tensor(raw["logprobs"]["token_logprobs"])).abs().max().item() <= 1e-4
    assert (tempered - plain).abs().max().item() > 1e-2  # the two modes are distinguishable here
    chat = {"messages": [{"role": "user", "content": "x"}], "max_tokens": 4, "logprobs_mode": "sideways"}
    r = app_client.post("/v1/chat/completions", json=chat)
    assert r.status_code == 400 and r.json()["error"]["param"] == "logprobs_mode"


def test_completions_stream_carries_the_same_tokens(server: str, local) -> None:
    _, tok = local
    body = {"prompt": "import os", "max_tokens": 10, "seed": 3}
    whole = httpx.post(f"{server}/completions", json=body, timeout=30).json()["choices"][0]
    assert whole["prompt_token_ids"] == tok.encode("import os")
    with httpx.stream("POST", f"{server}/completions", json={**body, "stream": True}, timeout=30) as r:
        events = sse(r)
    choices = [e["choices"][0] for e in events[:-1]]
    assert [t for c in choices for t in c["token_ids"]] == whole["token_ids"]
    assert "".join(c["text"] for c in choices) == whole["text"]
    # the second request reuses the first's cached prompt: the same tokens, logprobs equal up to float noise
    assert [lp for c in choices for lp in c["logprobs"]["token_logprobs"]] == \
        pytest.approx(whole["logprobs"]["token_logprobs"], abs=1e-4)


def test_models_lists_the_served_model(server: str) -> None:
    data = httpx.get(f"{server}/models", timeout=5).json()
    assert data["object"] == "list" and [m["id"] for m in data["data"]] == ["tiny"]
    # the checkpoint's prompt profile, for clients that render the prompt themselves
    assert data["data"][0]["prompt_profile"] == {"name": "compact", "fingerprint": COMPACT_PROFILE.fingerprint}


# -- in-process: errors and auth ------------------------------------------------------


@pytest.fixture
def app_client(local) -> Iterator[TestClient]:
    model, tok = local
    app = create_app(Engine(model, tok, max_slots=4, max_len=64), model_id="m", api_key="sekret")
    with TestClient(app, headers={"Authorization": "Bearer sekret"}) as client:
        yield client


def test_errors_are_openai_shaped(app_client: TestClient) -> None:
    r = app_client.post("/v1/completions", json={"model": "gpt-4", "prompt": "x"})
    assert r.status_code == 404 and r.json()["error"]["code"] == "model_not_found"
    r = app_client.post("/v1/completions", json={"prompt": list(range(10, 80))})
    assert r.status_code == 400 and r.json()["error"]["code"] == "context_length_exceeded"
    assert "at most 63" in r.json()["error"]["message"]
    r = app_client.post("/v1/chat/completions", json={"messages": []})
    assert r.status_code == 400 and r.json()["error"]["type"] == "invalid_request_error"
    r = app_client.post("/v1/chat/completions", json={"messages": [{"role": "user", "content": "x"}], "n": 2,
                                                      "top_logprobs": 3})
    assert r.status_code == 400 and r.json()["error"] == {
        "message": r.json()["error"]["message"], "type": "invalid_request_error", "param": "top_logprobs",
        "code": "unsupported_parameter"}
    r = app_client.post("/v1/completions", json={"prompt": "x", "frobnicate": 1})
    assert r.status_code == 400 and r.json()["error"]["param"] == "frobnicate"
    for method, path in (("GET", "/v1/nope"), ("POST", "/v1/embeddings"), ("GET", "/nothing")):
        r = app_client.request(method, path)
        assert r.status_code == 404 and r.json() == {"error": {
            "message": f"Invalid URL ({method} {path})", "type": "invalid_request_error", "param": None,
            "code": "unknown_url"}}
    r = app_client.get("/v1/completions")
    assert r.status_code == 405 and set(r.json()["error"]) == {"message", "type", "param", "code"}


def test_n_choices_and_stop(app_client: TestClient) -> None:
    body = {"prompt": [5, 6, 7], "max_tokens": 6, "n": 3, "seed": 11}
    choices = app_client.post("/v1/completions", json=body).json()["choices"]
    assert [c["index"] for c in choices] == [0, 1, 2] and all(len(c["token_ids"]) <= 6 for c in choices)
    first = choices[0]  # seeded, so n=1 with the same seed repeats it
    assert len(first["text"]) >= 2
    stop = first["text"][1:2]
    got = app_client.post("/v1/completions", json={**body, "n": 1, "stop": stop}).json()["choices"][0]
    assert got["finish_reason"] == "stop" and got["text"] == first["text"][: first["text"].index(stop)]


def test_api_key_is_enforced(app_client: TestClient) -> None:
    r = app_client.get("/v1/models", headers={"Authorization": "Bearer wrong"})
    assert r.status_code == 401 and r.json()["error"]["type"] == "authentication_error"
    assert app_client.get("/v1/models").status_code == 200


def test_refuses_a_public_address_without_a_key(checkpoint: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert cli_main(["policy", "serve", str(checkpoint), "--host", "0.0.0.0"]) == 1
    assert "without an API key" in capsys.readouterr().err


def test_a_client_that_goes_away_frees_its_slot(local) -> None:
    import socket
    import threading

    import uvicorn

    model, tok = local
    engine = Engine(model, tok, max_slots=2, max_len=128)
    handle = model.register_forward_pre_hook(lambda *_: time.sleep(0.03))  # ~4 s for 120 tokens
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    server = uvicorn.Server(uvicorn.Config(create_app(engine, model_id="m"), log_level="warning", ws="none"))
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True)
    thread.start()
    try:
        while not server.started:
            time.sleep(0.01)
        url = f"http://127.0.0.1:{sock.getsockname()[1]}/v1/completions"
        with httpx.stream("POST", url, json={"prompt": [5], "max_tokens": 120, "stream": True}, timeout=10) as r:
            next(r.iter_lines())
            assert len(engine._active) == 1
        deadline = time.monotonic() + 2
        while engine._active and time.monotonic() < deadline:
            time.sleep(0.02)
        assert not engine._active and engine.free_slots == 2  # freed long before the 120 tokens were done
    finally:
        handle.remove()
        server.should_exit = True
        thread.join(timeout=10)


async def test_completions_mode_gives_the_runtime_token_in_token_out(server: str, local) -> None:
    """With api="completions" the server sees exactly ``prompt.text`` (tool turns
    included, which chat messages cannot carry) and the runtime gets the sampled
    token ids with logprobs equal to the training forward's."""
    model, tok = local
    conv = [Message("user", "look"), Message("assistant", "<tool_call name=\"list_dir\"/>"),
            Message("tool", '<tool_result name="list_dir" index="0" status="ok">a.py</tool_result>')]
    prompt = render_prompt(conv, [], profile=COMPACT_PROFILE)
    policy = OpenAICompatPolicy(OpenAIConfig(base_url=server, model="tiny", max_tokens=12, temperature=1.0,
                                             api="completions"))
    assert policy.prompt_profile is None  # nothing asked when built
    assert await policy.resolve_prompt_profile() == COMPACT_PROFILE  # learnt from GET /v1/models
    try:
        chunks = [c async for c in policy.stream(prompt)]
    finally:
        await policy.aclose()
    ids = [i for c in chunks for i in c.token_ids]
    lps = [lp for c in chunks for lp in c.logprobs]
    assert ids and len(ids) == len(lps)
    prompt_ids = tok.encode(prompt.text)
    full = torch.tensor([prompt_ids + ids])
    expected = model.logprobs(full)[0, len(prompt_ids) - 1 :]
    assert torch.allclose(torch.tensor(lps), expected, atol=1e-5)


def test_max_tokens_is_clamped_to_the_context(app_client: TestClient) -> None:
    """The runtime asks for 4096 tokens; the server gives what the 64-token context leaves."""
    body = {"prompt": list(range(10, 70)), "max_tokens": 4096, "seed": 2, "temperature": 0}
    r = app_client.post("/v1/completions", json=body)
    assert r.status_code == 200, r.text
    [choice] = r.json()["choices"]
    assert len(choice["token_ids"]) <= 4 and r.json()["usage"]["total_tokens"] <= 64


def test_chat_content_never_carries_a_role_marker(local, app_client: TestClient) -> None:
    model, tok = local
    calls = 0

    def force_user_marker(_m, _i, logits: torch.Tensor) -> torch.Tensor:
        nonlocal calls
        calls += 1
        if calls == 3:
            logits[..., tok.token_id("<|user|>")] += 1e4
        return logits

    handle = model.lm_head.register_forward_hook(force_user_marker)
    try:
        r = app_client.post("/v1/chat/completions", json={"messages": [{"role": "user", "content": "x"}],
                                                           "max_tokens": 20, "seed": 4})
    finally:
        handle.remove()
    [choice] = r.json()["choices"]
    assert choice["finish_reason"] == "stop" and "<|" not in choice["message"]["content"]
    assert r.json()["usage"]["completion_tokens"] == 3


def test_the_api_key_comes_from_the_settings_env(monkeypatch: pytest.MonkeyPatch, tmp_path: Path,
                                                  capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.setenv("FLYWHEEL_POLICY_API_KEY", "from-env")
    # past the key check (the key came from FLYWHEEL_POLICY_API_KEY), stopped by the missing checkpoint
    assert cli_main(["policy", "serve", str(tmp_path / "missing"), "--host", "0.0.0.0"]) == 1
    err = capsys.readouterr().err
    assert "no checkpoint directory" in err and "without an API key" not in err


def _serve_in_thread(app):  # noqa: ANN001, ANN202 - test helper
    import contextlib
    import socket
    import threading

    import uvicorn

    @contextlib.contextmanager
    def running() -> Iterator[str]:
        sock = socket.socket()
        sock.bind(("127.0.0.1", 0))
        server = uvicorn.Server(uvicorn.Config(app, log_level="warning", ws="none"))
        thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True)
        thread.start()
        try:
            deadline = time.monotonic() + 10
            while not server.started and time.monotonic() < deadline:
                time.sleep(0.01)
            yield f"http://127.0.0.1:{sock.getsockname()[1]}/v1"
        finally:
            server.should_exit = True
            thread.join(timeout=10)

    return running()


def test_a_client_refuses_a_server_whose_profile_text_differs(local) -> None:
    model, tok = local
    edited = PromptProfile(name="compact", system="an edited system prompt", tool_detail="compact")
    app = create_app(Engine(model, tok, max_slots=1, max_len=64), model_id="m", prompt_profile=edited)
    async def learn(policy: OpenAICompatPolicy) -> None:
        try:
            await policy.resolve_prompt_profile()
        finally:
            await policy.aclose()

    with _serve_in_thread(app) as url:
        with pytest.raises(PolicyError, match="different prompt texts"):
            asyncio.run(learn(OpenAICompatPolicy(OpenAIConfig(base_url=url, model="m", api="completions"))))
        chat = OpenAICompatPolicy(OpenAIConfig(base_url=url, model="m"))  # chat mode asks nothing
    assert chat.prompt_profile == DEFAULT_PROFILE


def test_openapi_documents_every_body(app_client: TestClient) -> None:
    from tests.backend.test_contracts import is_real_shape, resolve

    spec = app_client.get("/openapi.json").json()
    operations = [(m, p, op) for p, ops in spec["paths"].items() for m, op in ops.items()]
    assert {(m, p) for m, p, _ in operations} == {
        ("get", "/v1/models"), ("get", "/v1/models/{name}"), ("post", "/v1/chat/completions"),
        ("post", "/v1/completions")}
    for method, path, op in operations:
        ok = op["responses"]["200"]["content"]
        assert is_real_shape(spec, ok["application/json"]["schema"]), (method, path)
        assert resolve(spec, op["responses"]["401"]["content"]["application/json"]["schema"])["properties"].keys() \
            == {"error"}
    chunk = resolve(spec, spec["paths"]["/v1/chat/completions"]["post"]["responses"]["200"]["content"]
                    ["text/event-stream"]["schema"])
    assert chunk["properties"]["object"]["const"] == "chat.completion.chunk"
    choice = resolve(spec, resolve(spec, spec["paths"]["/v1/completions"]["post"]["responses"]["200"]["content"]
                                   ["application/json"]["schema"])["properties"]["choices"]["items"])
    assert {"token_ids", "prompt_token_ids", "logprobs"} <= choice["properties"].keys()  # the extensions too
    error = spec["paths"]["/v1/completions"]["post"]["responses"]["400"]["content"]["application/json"]["schema"]
    assert resolve(spec, error) == resolve(spec, {"$ref": "#/components/schemas/ErrorResponse"})


def test_answers_match_their_documented_models(app_client: TestClient) -> None:
    from backend.policy_server_schemas import ChatCompletion, Completion, ModelCard, ModelList

    assert ModelList.model_validate(app_client.get("/v1/models").json()).data[0].id == "m"
    assert ModelCard.model_validate(app_client.get("/v1/models/default").json()).max_model_len == 64
    chat = app_client.post("/v1/chat/completions", json={"messages": [{"role": "user", "content": "x"}],
                                                         "max_tokens": 3, "logprobs": True, "seed": 1})
    assert chat.status_code == 200, chat.text
    parsed = ChatCompletion.model_validate(chat.json())
    assert parsed.choices[0].logprobs is not None and parsed.usage.total_tokens > 0
    done = app_client.post("/v1/completions", json={"prompt": [5, 6, 7], "max_tokens": 3, "n": 2, "seed": 1})
    assert done.status_code == 200, done.text
    body = Completion.model_validate(done.json())
    assert [c.prompt_token_ids for c in body.choices] == [[5, 6, 7], [5, 6, 7]]
    assert all(len(c.token_ids) == len(c.logprobs.token_logprobs) for c in body.choices)
