"""Checkpoints: one directory, loadable by one call.

``DIR/model.safetensors`` (the state dict, incl. the router-bias buffers),
``DIR/config.json`` (exactly :class:`ModelConfig`'s JSON, so anything can read
it with ``ModelConfig.from_json``), ``DIR/tokenizer.json`` and
``DIR/meta.json`` (``step`` and the caller's ``extra``, JSON-serialisable).
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

WEIGHTS, CONFIG, META = "model.safetensors", "config.json", "meta.json"


def _write_text(path: Path, text: str) -> None:
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(text)
    tmp.replace(path)


def save_checkpoint(directory: str | Path, model: MoETransformer, tokenizer: Tokenizer, *, step: int,
                    extra: dict[str, Any] | None = None) -> Path:
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
    _write_text(d / META, json.dumps({"step": step, "extra": extra or {}}, indent=2, sort_keys=True) + "\n")
    return d


def load_config(directory: str | Path) -> ModelConfig:
    return ModelConfig.from_json((Path(directory) / CONFIG).read_text())


def load_meta(directory: str | Path) -> dict[str, Any]:
    path = Path(directory) / META
    return json.loads(path.read_text()) if path.is_file() else {"step": 0, "extra": {}}


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
    model.load_state_dict(state, strict=True)
    return model.to(device).eval(), Tokenizer.load(d)
