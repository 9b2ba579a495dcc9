"""The README's model pipeline, end to end and bounded: ``flywheel model train --preset tiny``
then ``flywheel run --policy local:DIR`` (and ``flywheel policy serve``'s published profile).

The model trains for two steps, so only the pipeline is asserted, not what the model says.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from fastapi.testclient import TestClient

from agent.model.checkpoint import load_config, load_profile
from agent.model.tokenizer import SPECIAL_TOKENS, Tokenizer
from agent.prompt import COMPACT_PROFILE, Message, render_prompt
from backend.cli import main as cli_main
from backend.policy_server import create_app_from_checkpoint
from tools.registry import default_tools


@pytest.fixture(scope="module")
def trained(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("model") / "tiny"
    rc = cli_main(["model", "train", "--preset", "tiny", "--steps", "2", "--seq-len", "32", "--batch", "2",
                   "--corpus-mb", "1", "--log-every", "1", "--out", str(out)])
    assert rc == 0
    return out


def test_train_stores_the_compact_profile_and_the_prompt_fits(trained: Path) -> None:
    assert load_profile(trained) == COMPACT_PROFILE
    context = load_config(trained).max_seq_len
    prompt = render_prompt([Message("user", "fix the failing test")], [t.spec for t in default_tools()],
                           profile=COMPACT_PROFILE)
    used = len(Tokenizer.load(trained).encode(prompt.text))
    assert context - used >= 512, (used, context)  # room for a reply and a step or two


def test_run_with_the_local_policy_completes_a_turn(trained: Path, tmp_path: Path,
                                                    capsys: pytest.CaptureFixture[str]) -> None:
    src = tmp_path / "ws"
    src.mkdir()
    (src / "app.py").write_text("def add(a, b):\n    return a - b\n")
    cli_main(["run", "--workspace", str(src), "--policy", f"local:{trained}", "--max-steps", "1", "--json",
              "say hello"])
    out, err = capsys.readouterr()
    events = [json.loads(line) for line in out.splitlines() if line.startswith("{")]
    kinds = [e["type"] for e in events]
    assert "error" not in kinds, (err, [e for e in events if e["type"] == "error"])
    [message] = [e for e in events if e["type"] == "assistant_message"]
    assert message["token_ids"] and len(message["token_ids"]) == len(message["logprobs"])
    # no role marker in the generated text (an untrained model may well sample an ordinary BPE piece
    # such as "<|temp", learned from the code corpus: that is not a marker)
    assert not any(marker in message["text"] for marker in SPECIAL_TOKENS), message["text"]
    # and any special id the model samples ends the message: it can only be the last id (agent.model.engine)
    special = set(Tokenizer.load(trained).special_ids.values())
    assert not special & set(message["token_ids"][:-1]), message["token_ids"]
    [end] = [e for e in events if e["type"] == "turn_end"]
    # an untrained model may stop, hit its (clamped) token limit, or call a tool: all are a finished turn
    assert end["reason"] in ("completed", "max_tokens", "max_steps"), end


def test_policy_serve_publishes_the_checkpoints_profile(trained: Path) -> None:
    with TestClient(create_app_from_checkpoint(trained, max_slots=1)) as client:
        [model] = client.get("/v1/models").json()["data"]
    assert model["prompt_profile"] == {"name": "compact", "fingerprint": COMPACT_PROFILE.fingerprint}
    assert model["max_model_len"] == 1024
