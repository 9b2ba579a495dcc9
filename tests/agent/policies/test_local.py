"""The local policy (``local:CHECKPOINT``): Flywheel's own model in-process, token-in/token-out."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest
import torch

from agent.events import AssistantMessage, ListSink
from agent.model.checkpoint import save_checkpoint
from agent.model.config import ModelConfig
from agent.model.tokenizer import Tokenizer
from agent.model.transformer import MoETransformer
from agent.policies import make_policy
from agent.policies.local import LocalPolicy
from agent.policy import Policy, PolicyChunk, PolicyError
from agent.prompt import Message, render_prompt
from agent.session import Limits, Session
from tests.agent.model.test_engine import tiny_tokenizer
from tools.registry import default_tools
from tools.workspace import WorkspaceStore

PROMPT = render_prompt([Message("user", "say hi")], [])


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory: pytest.TempPathFactory) -> Path:
    tok = tiny_tokenizer()
    torch.manual_seed(0)
    # long enough for the full system prompt with every tool's description
    model = MoETransformer(ModelConfig.preset("tiny", vocab_size=tok.vocab_size, max_seq_len=4096))
    return save_checkpoint(tmp_path_factory.mktemp("ckpt") / "tiny", model, tok, step=0)


@pytest.fixture
async def policy(checkpoint: Path):
    p = LocalPolicy(checkpoint, max_tokens=12, seed=0)  # seeded: a random model may sample <|end|> early
    yield p
    await p.aclose()


async def chunks_of(policy: Policy, prompt=PROMPT) -> list[PolicyChunk]:
    return [c async for c in policy.stream(prompt)]


async def test_streams_token_ids_and_training_logprobs_of_the_rendered_text(policy: LocalPolicy) -> None:
    assert isinstance(policy, Policy)
    chunks = await chunks_of(policy)
    ids = [t for c in chunks for t in c.token_ids]
    lps = [lp for c in chunks for lp in c.logprobs]
    assert len(ids) == len(lps) == 12 and all(len(c.token_ids) == len(c.logprobs) for c in chunks)
    assert chunks[-1].finish_reason == "length" and chunks[-1].output_tokens == 12
    assert "".join(c.text for c in chunks) == policy.tokenizer.decode(ids)
    # the model saw exactly the tokens of prompt.text (the shared chat template)
    prompt_ids = policy.tokenizer.encode(PROMPT.text)
    ref = policy.engine.model.logprobs(torch.tensor([prompt_ids + ids]))[0, len(prompt_ids) - 1 :]
    assert (ref - torch.tensor(lps)).abs().max().item() <= 1e-5


async def test_turn_ends_at_the_end_marker_without_the_templates_newline(policy: LocalPolicy) -> None:
    tok: Tokenizer = policy.tokenizer
    [newline] = tok.encode("\n")
    forced = {3: newline, 4: tok.end_id}  # step -> token: the turn ends with "\n<|end|>"
    steps = 0

    def force(_m, _i, logits: torch.Tensor) -> torch.Tensor:
        nonlocal steps
        steps += 1
        if steps in forced:
            logits[..., forced[steps]] += 1e4
        return logits

    handle = policy.engine.model.lm_head.register_forward_hook(force)
    try:
        chunks = await chunks_of(policy)
    finally:
        handle.remove()
    ids = [t for c in chunks for t in c.token_ids]
    text = "".join(c.text for c in chunks)
    assert len(ids) == 4 and ids[-2:] == [newline, tok.end_id] and chunks[-1].finish_reason == "stop"
    # the content re-renders (content + "\n" + "<|end|>") to exactly what the model generated
    assert text == tok.decode(ids[:-2]) and text + "\n<|end|>" == tok.decode(ids)


async def test_drives_the_real_session_and_records_tokens(checkpoint: Path, tmp_path: Path) -> None:
    src = tmp_path / "src"
    src.mkdir()
    (src / "a.py").write_text("x = 1\n")
    workspace = WorkspaceStore(tmp_path / "store").from_dir(src)
    policy = LocalPolicy(checkpoint, max_tokens=8, seed=3)
    sink = ListSink()
    session = Session(workspace=workspace, policy=policy, tools=default_tools(), sink=sink,
                      limits=Limits(max_steps=1))
    try:
        await session.run_turn("hello")
    finally:
        await policy.aclose()
        workspace.delete()
    [message, *_] = sink.of_type(AssistantMessage)
    n = message.output_tokens or 0
    assert len(message.token_ids) == len(message.logprobs) == n and 1 <= n <= 8
    # a random model may sample a special token (which ends the turn) before its 8th
    specials = set(policy.tokenizer.special_ids.values())
    body = message.token_ids[:-1] if message.token_ids[-1] in specials else message.token_ids
    assert n == 8 or message.token_ids[-1] in specials
    assert message.text == policy.tokenizer.decode(body)


async def test_concurrent_streams_share_decode_batches(policy: LocalPolicy) -> None:
    prompts = [render_prompt([Message("user", f"task {i}")], []) for i in range(4)]
    results = await asyncio.gather(*(chunks_of(policy, p) for p in prompts))
    # 12 each, unless a special token (which ends a turn) came first
    assert all(len(ids := [t for c in r for t in c.token_ids]) == 12 or ids[-1] <= 6 for r in results)
    assert policy.engine.stats.max_batch >= 2


async def test_fixed_seed_reproduces_a_rollout(checkpoint: Path) -> None:
    outs = []
    for _ in range(2):
        p = LocalPolicy(checkpoint, max_tokens=10, seed=42)
        outs.append([t for c in await chunks_of(p) for t in c.token_ids])
        await p.aclose()
    assert outs[0] == outs[1]


async def test_make_policy_builds_it_from_the_spec(checkpoint: Path) -> None:
    p = make_policy(f"local:{checkpoint}")
    assert isinstance(p, LocalPolicy) and p.engine.cfg.max_seq_len == 4096
    await p.aclose()


async def test_clear_errors(checkpoint: Path, tmp_path: Path, policy: LocalPolicy) -> None:
    with pytest.raises(PolicyError, match="needs a checkpoint directory"):
        make_policy("local:")
    with pytest.raises(PolicyError, match="no checkpoint directory"):
        make_policy(f"local:{tmp_path / 'missing'}")
    huge = render_prompt([Message("user", "word " * 5000)], [])
    with pytest.raises(PolicyError, match=r"prompt is \d+ tokens"):
        await chunks_of(policy, huge)


def test_one_policy_serves_successive_event_loops(checkpoint: Path) -> None:
    """A rollout worker may call asyncio.run() per batch with one long-lived policy."""
    policy = LocalPolicy(checkpoint, max_tokens=3, seed=0)
    runs = [asyncio.run(chunks_of(policy)) for _ in range(2)]
    asyncio.run(policy.aclose())
    assert [sum(len(c.token_ids) for c in r) for r in runs] == [3, 3]
