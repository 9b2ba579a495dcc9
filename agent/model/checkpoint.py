"""Checkpoints: one directory, loadable by one call.

``DIR/model.safetensors`` (the state dict, incl. the router-bias buffers),
``DIR/config.json`` (exactly :class:`ModelConfig`'s JSON, so anything can read
it with ``ModelConfig.from_json``), ``DIR/tokenizer.json`` and
``DIR/meta.json`` (``step``, the caller's ``extra``, JSON-serialisable, and
``prompt_profile``: the name and fingerprint of the
:class:`agent.prompt.PromptProfile` the model is prompted with — serving and
RL render with it, see :func:`load_profile`).
Each file is written to a temporary name and renamed, so a crash mid-save
leaves the previous file of that name intact; the directory as a whole is not
updated atomically (a crash between renames can mix two saves — save to a new
directory when that matters).
"""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path
from typing import Any

import torch
from safetensors.torch import load_file, save_file

from agent.model.config import ModelConfig, Precision
from agent.model.tokenizer import Tokenizer
from agent.model.transformer import MoETransformer
from agent.prompt import DEFAULT_PROFILE, PROFILES, PromptProfile

WEIGHTS, CONFIG, META = "model.safetensors", "config.json", "meta.json"


def _write_text(path: Path, text: str) -> None:
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(text)
    tmp.replace(path)


class CheckpointError(ValueError):
    """A checkpoint that cannot be used as it is (its message says why and what to do)."""


def save_checkpoint(directory: str | Path, model: MoETransformer, tokenizer: Tokenizer, *, step: int,
                    extra: dict[str, Any] | None = None, profile: PromptProfile = DEFAULT_PROFILE) -> Path:
    """Write the checkpoint; ``profile`` is the prompt profile the model was (or will
    be) trained with — it must be registered in :data:`agent.prompt.PROFILES`."""
    if PROFILES.get(profile.name) != profile:
        raise CheckpointError(f"prompt profile {profile.name!r} is not the registered one of that name "
                              f"(agent.prompt.PROFILES): register it before saving a checkpoint with it")
    d = Path(directory)
    d.mkdir(parents=True, exist_ok=True)
    if tokenizer.vocab_size > model.cfg.vocab_size:
        raise ValueError(f"tokenizer has {tokenizer.vocab_size} ids but the model only {model.cfg.vocab_size}")
    state = {k: v.detach().to("cpu").contiguous() for k, v in model.state_dict().items()}
    tmp = d / (WEIGHTS + ".tmp")
    save_file(state, str(tmp), metadata={"format": "pt", "step": str(step)})
    tmp.replace(d / WEIGHTS)
    _write_text(d / CONFIG, model.cfg.to_json() + "\n")
    tokenizer.save(d)
    meta = {"step": step, "extra": extra or {},
            "prompt_profile": {"name": profile.name, "fingerprint": profile.fingerprint}}
    _write_text(d / META, json.dumps(meta, indent=2, sort_keys=True) + "\n")
    return d


def load_config(directory: str | Path) -> ModelConfig:
    return ModelConfig.from_json((Path(directory) / CONFIG).read_text())


def load_meta(directory: str | Path) -> dict[str, Any]:
    path = Path(directory) / META
    return json.loads(path.read_text()) if path.is_file() else {"step": 0, "extra": {}}


def load_profile(directory: str | Path) -> PromptProfile:
    """The prompt profile a checkpoint is served with.

    A checkpoint saved before profiles existed (no ``prompt_profile`` in its
    meta) gets :data:`agent.prompt.DEFAULT_PROFILE`. Raises
    :class:`CheckpointError` when the stored profile is unknown here or its
    fingerprint differs from the registered profile of that name (the prompt
    changed since training: serving it would be a train/serve mismatch).
    """
    stored = load_meta(directory).get("prompt_profile")
    if stored is None:
        return DEFAULT_PROFILE
    if not isinstance(stored, dict) or not isinstance(stored.get("name"), str):
        raise CheckpointError(f"{Path(directory) / META}: prompt_profile must be an object with a name")
    name, fingerprint = stored["name"], stored.get("fingerprint")
    profile = PROFILES.get(name)
    if profile is None:
        raise CheckpointError(f"checkpoint {directory} uses prompt profile {name!r}, which this version of "
                              f"Flywheel does not have (known: {', '.join(sorted(PROFILES))})")
    if fingerprint != profile.fingerprint:
        raise CheckpointError(
            f"checkpoint {directory} was trained with prompt profile {name!r} fingerprint {fingerprint}, but "
            f"agent.prompt's {name!r} is now {profile.fingerprint}: the prompt changed since training. Retrain "
            f"(or fine-tune) with the current profile, or restore the profile's old text")
    return profile


def load_checkpoint(directory: str | Path, device: torch.device | str = "cpu", *,
                    precision: Precision | None = None) -> tuple[MoETransformer, Tokenizer]:
    """Model (in eval mode, on ``device``) and tokenizer. ``precision`` overrides the
    saved config's (the weights are the same in every precision)."""
    d = Path(directory)
    cfg = load_config(d)
    if precision is not None:
        cfg = replace(cfg, precision=precision)
    model = MoETransformer(cfg)
    state = load_file(str(d / WEIGHTS), device="cpu")
    expected = model.state_dict()
    missing, unexpected = sorted(set(expected) - set(state)), sorted(set(state) - set(expected))
    if missing or unexpected:
        hint = (" (a copy head saved before its twin entries, same-token bonus and pointer distance were added: "
                "retrain or re-run SFT with this version)" if any(k.startswith("copy.") for k in missing) else "")
        raise CheckpointError(f"checkpoint {d}: its weights do not match its config.json's architecture; missing "
                              f"{', '.join(missing) or 'none'}; unexpected {', '.join(unexpected) or 'none'}{hint}")
    model.load_state_dict(state, strict=True)
    return model.to(device).eval(), Tokenizer.load(d)
