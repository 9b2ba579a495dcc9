"""The OpenAI-compatible policy against a real streaming HTTP server on loopback."""

from __future__ import annotations

import asyncio
import socket

import pytest

from agent.policies import make_policy
from agent.policies.openai_compat import OpenAICompatPolicy, OpenAIConfig
from agent.policy import PolicyError
from agent.prompt import COMPACT_PROFILE, DEFAULT_PROFILE, Message, render_prompt
from tests.openai_server import ScriptedChatServer

PROMPT = render_prompt([Message("user", "hello")], [])


async def collect(policy: OpenAICompatPolicy) -> tuple[str, list]:
    chunks = [c async for c in policy.stream(PROMPT)]
    return "".join(c.text for c in chunks), chunks


async def test_streams_text_and_sends_rendered_messages() -> None:
    server = ScriptedChatServer(['Hi <tool_call name="x"/> done'], api_key="k1")
    with server.running():
        policy = OpenAICompatPolicy(OpenAIConfig(base_url=server.base_url, model="m", api_key="k1"))
        try:
            text, chunks = await collect(policy)
        finally:
            await policy.aclose()
    assert text == 'Hi <tool_call name="x"/> done'
    assert len(chunks) > 3  # really streamed in pieces
    assert chunks[-1].output_tokens is not None
    req = server.requests[0]
    assert req["body"]["messages"] == PROMPT.messages and req["body"]["stream"] is True
    assert req["body"]["model"] == "m" and req["auth"] == "Bearer k1"


async def test_server_down_is_a_clear_error() -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]  # nothing listens here once closed
    policy = OpenAICompatPolicy(OpenAIConfig(base_url=f"http://127.0.0.1:{port}/v1", connect_timeout_s=2))
    with pytest.raises(PolicyError, match=r"cannot reach the OpenAI-compatible server .*is it running\?"):
        await collect(policy)
    await policy.aclose()


async def test_http_error_is_reported_with_body() -> None:
    server = ScriptedChatServer(["x"], status=500)
    with server.running():
        policy = OpenAICompatPolicy(OpenAIConfig(base_url=server.base_url))
        with pytest.raises(PolicyError, match="HTTP 500.*scripted failure"):
            await collect(policy)
        await policy.aclose()


def test_make_policy_reads_env_and_rejects_unknown(monkeypatch) -> None:
    monkeypatch.setenv("FLYWHEEL_OPENAI_BASE_URL", "http://127.0.0.1:9/v1")
    monkeypatch.setenv("FLYWHEEL_OPENAI_MODEL", "env-model")
    p = make_policy("openai")
    assert isinstance(p, OpenAICompatPolicy)
    assert p.config.base_url == "http://127.0.0.1:9/v1" and p.config.model == "env-model"
    assert make_policy("openai:other").config.model == "other"  # type: ignore[attr-defined]
    with pytest.raises(PolicyError, match="unknown policy"):
        make_policy("gpt5")
    monkeypatch.setenv("FLYWHEEL_OPENAI_API", "grpc")  # read by the OpenAIEnv settings class
    with pytest.raises(PolicyError, match="FLYWHEEL_OPENAI_API"):
        make_policy("openai")


async def test_an_unreachable_server_in_completions_mode_is_a_clear_error_at_first_use() -> None:
    policy = OpenAICompatPolicy(OpenAIConfig(base_url="http://127.0.0.1:9/v1", api="completions",
                                             connect_timeout_s=1))  # no I/O here
    assert policy.prompt_profile is None
    for _ in range(2):  # a failure is not remembered: the next use asks again
        with pytest.raises(PolicyError, match=r"cannot reach http://127.0.0.1:9/v1/models to learn the served "
                                              r"model's prompt profile .*is the server running\?"):
            await collect(policy)
        assert policy.prompt_profile is None
    await policy.aclose()


COMPACT_CARD = {"id": "m", "object": "model", "prompt_profile": {"name": "compact",
                                                                 "fingerprint": COMPACT_PROFILE.fingerprint}}


async def test_completions_mode_learns_the_profile_at_first_use_without_blocking_the_loop() -> None:
    server = ScriptedChatServer([], models=[COMPACT_CARD], models_delay_s=0.5)
    with server.running():
        policy = OpenAICompatPolicy(OpenAIConfig(base_url=server.base_url, model="m", api="completions"))
        assert policy.prompt_profile is None and server.model_lists == 0  # nothing asked when built
        ticks = 0

        async def tick() -> None:
            nonlocal ticks
            while True:
                await asyncio.sleep(0.01)
                ticks += 1

        ticker = asyncio.create_task(tick())
        try:
            learnt = await asyncio.gather(*(policy.resolve_prompt_profile() for _ in range(3)))
        finally:
            ticker.cancel()
            await policy.aclose()
    assert learnt == [COMPACT_PROFILE] * 3 and policy.prompt_profile == COMPACT_PROFILE
    assert server.model_lists == 1  # asked once, by the first caller; the others waited for it
    assert ticks >= 10  # the loop ran on while the server took 0.5 s to answer


async def test_a_session_renders_with_the_profile_learnt_at_first_use(tmp_path) -> None:
    from agent.events import ListSink
    from agent.runtime import SessionParts, build_session
    from agent.prompt import COMPACT_SYSTEM_PROMPT, DEFAULT_SYSTEM_PROMPT
    from tools.workspace import WorkspaceStore

    (tmp_path / "src").mkdir()
    ws = WorkspaceStore(tmp_path / "store").from_dir(tmp_path / "src")
    server = ScriptedChatServer(["Nothing to do."], models=[COMPACT_CARD])
    with server.running():
        policy = OpenAICompatPolicy(OpenAIConfig(base_url=server.base_url, model="m", api="completions"))
        session = build_session(SessionParts(ws), policy=policy, sink=ListSink())
        assert session.profile is None  # the policy's own, not known yet
        outcome = await session.run_turn("hello")
        await policy.aclose()
    assert outcome.reason == "completed" and session.profile == COMPACT_PROFILE
    [request] = server.requests
    assert COMPACT_SYSTEM_PROMPT in request["body"]["prompt"]
    assert DEFAULT_SYSTEM_PROMPT not in request["body"]["prompt"]
    ws.delete()


@pytest.mark.parametrize(
    "payload",
    ['5', '{"choices": ["x"]}', '{"choices": [{"delta": {"content": {"a": 1}}}]}',
     '{"choices": [], "usage": {"completion_tokens": "many"}}', "not json", '{"error": {"message": "boom"}}'],
)
async def test_malformed_stream_events_are_policy_errors(payload: str) -> None:
    import httpx

    def handler(request: httpx.Request) -> httpx.Response:
        return httpx.Response(200, text=f"data: {payload}\n\ndata: [DONE]\n\n",
                              headers={"content-type": "text/event-stream"})

    policy = OpenAICompatPolicy(OpenAIConfig(base_url="http://model.test/v1"), transport=httpx.MockTransport(handler))
    with pytest.raises(PolicyError):
        await collect(policy)
    await policy.aclose()


async def test_completions_mode_sends_the_rendered_text_and_reads_token_ids() -> None:
    server = ScriptedChatServer(["Hello <tool_call"])
    with server.running():
        policy = OpenAICompatPolicy(OpenAIConfig(base_url=server.base_url, api="completions"))
        try:
            text, chunks = await collect(policy)
        finally:
            await policy.aclose()
    body = server.requests[0]["body"]
    assert server.requests[0]["path"] == "/v1/completions"
    assert policy.prompt_profile == DEFAULT_PROFILE  # the server publishes none (no GET /v1/models)
    assert body["prompt"] == PROMPT.text and "messages" not in body  # byte for byte what a local policy sees
    assert "\n<|end|>" in body["stop"]
    assert text == "Hello <tool_call"
    ids = [i for c in chunks for i in c.token_ids]
    assert ids == [ord(c) for c in text] and all(lp == -0.5 for c in chunks for lp in c.logprobs)
