"""Checkpoint save/load: identical logits, the tokenizer and metadata come back, one call."""

from __future__ import annotations

import json
from pathlib import Path

import torch

import pytest

from agent.model.checkpoint import CheckpointError, load_checkpoint, load_meta, load_profile, save_checkpoint
from agent.model.config import ModelConfig
from agent.model.tokenizer import Tokenizer
from agent.model.transformer import MoETransformer
from agent.prompt import COMPACT_PROFILE, DEFAULT_PROFILE, PromptProfile


def test_round_trip_identical_logits(tokenizer: Tokenizer, tmp_path: Path) -> None:
    cfg = ModelConfig.preset("tiny", vocab_size=tokenizer.vocab_size, router_bias_rate=0.01, shared_expert=True)
    torch.manual_seed(0)
    model = MoETransformer(cfg).eval()
    with torch.no_grad():
        for block in model.blocks:  # the router bias is state and must travel with the weights
            block.moe.router_bias.normal_(0, 0.1)
    save_checkpoint(tmp_path, model, tokenizer, step=7, extra={"note": "test"})
    assert {p.name for p in tmp_path.iterdir()} == {"model.safetensors", "config.json", "tokenizer.json", "meta.json"}
    assert ModelConfig.from_json((tmp_path / "config.json").read_text()) == cfg
    loaded, tok = load_checkpoint(tmp_path)
    assert not loaded.training and loaded.cfg == cfg
    ids = torch.tensor([tokenizer.encode("def main():\n    return 0\n<|end|>")])
    with torch.no_grad():
        assert torch.equal(loaded(ids).logits, model(ids).logits)
    assert tok.encode("x = 1") == tokenizer.encode("x = 1")
    assert load_meta(tmp_path) == {"step": 7, "extra": {"note": "test"},
                                   "prompt_profile": {"name": "default", "fingerprint": DEFAULT_PROFILE.fingerprint}}
    json.loads((tmp_path / "meta.json").read_text())


def test_precision_override(tokenizer: Tokenizer, tmp_path: Path) -> None:
    cfg = ModelConfig.preset("tiny", vocab_size=tokenizer.vocab_size)
    save_checkpoint(tmp_path, MoETransformer(cfg), tokenizer, step=0)
    loaded, _ = load_checkpoint(tmp_path, precision="bf16")
    assert loaded.cfg.precision == "bf16"


def _tiny(tokenizer: Tokenizer) -> MoETransformer:
    torch.manual_seed(0)
    return MoETransformer(ModelConfig.preset("tiny", vocab_size=tokenizer.vocab_size, n_layers=1))


def test_the_prompt_profile_is_stored_and_checked(tokenizer: Tokenizer, tmp_path: Path) -> None:
    save_checkpoint(tmp_path, _tiny(tokenizer), tokenizer, step=1, profile=COMPACT_PROFILE)
    assert load_profile(tmp_path) == COMPACT_PROFILE
    meta_path = tmp_path / "meta.json"
    meta = json.loads(meta_path.read_text())
    # the profile's text changed under the checkpoint: a clear error, not a silent mismatch
    meta["prompt_profile"]["fingerprint"] = "0" * 16
    meta_path.write_text(json.dumps(meta))
    with pytest.raises(CheckpointError, match="prompt changed since training"):
        load_profile(tmp_path)
    meta["prompt_profile"] = {"name": "gone", "fingerprint": "x"}
    meta_path.write_text(json.dumps(meta))
    with pytest.raises(CheckpointError, match="'gone'.*known: compact, default"):
        load_profile(tmp_path)
    del meta["prompt_profile"]  # saved before profiles existed
    meta_path.write_text(json.dumps(meta))
    assert load_profile(tmp_path) == DEFAULT_PROFILE


def test_an_unregistered_profile_cannot_be_saved(tokenizer: Tokenizer, tmp_path: Path) -> None:
    with pytest.raises(CheckpointError, match="register it"):
        save_checkpoint(tmp_path, _tiny(tokenizer), tokenizer, step=1,
                        profile=PromptProfile(name="compact", system="edited"))


def test_weights_that_miss_part_of_the_architecture_are_a_clear_error(tokenizer: Tokenizer, tmp_path: Path) -> None:
    """A copy-head checkpoint from before the head gained its twin key map: named, not a torch traceback."""
    from safetensors.torch import load_file, save_file

    model = MoETransformer(ModelConfig.preset("tiny", vocab_size=tokenizer.vocab_size, copy_head=True))
    save_checkpoint(tmp_path, model, tokenizer, step=0, profile=COMPACT_PROFILE)
    weights = next(tmp_path.glob("*.safetensors"))
    state = load_file(str(weights))
    del state["copy.wk_twin.weight"]
    save_file(state, str(weights))
    with pytest.raises(CheckpointError, match=r"missing copy\.wk_twin\.weight; unexpected none \(a copy head"):
        load_checkpoint(tmp_path)
