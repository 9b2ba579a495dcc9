"""RL run checkpoints with exact resume.

One directory per saved iteration, ``OUT/checkpoints/iter_000007/``:

* the model as a serving checkpoint (:func:`agent.model.checkpoint.save_checkpoint`:
  ``model.safetensors``, ``config.json``, ``tokenizer.json``, ``meta.json`` with the
  prompt profile and the temperature it was trained at), so ``flywheel run --policy local:DIR`` serves it unchanged;
* ``optimizer.safetensors`` — every tensor of the optimizer state, keyed
  ``"<param index>.<name>"``; ``trainer_state.json`` — the rest of the optimizer
  state (param groups), the iteration, the weights version, the task order and the
  position in it, and the RNG states of Python and NumPy; ``rng.safetensors`` — the
  torch CPU generator state.

A save writes ``iter_N.tmp/`` completely, then renames it to ``iter_N`` and only then
rewrites ``OUT/checkpoints/latest`` (the name, via a temporary file): a run killed
mid-save leaves the previous checkpoint as the latest, and at worst a ``.tmp``
directory that the next save of that iteration replaces.

Not guaranteed: CUDA generator states (only the CPU generator is saved; GPU runs
resume with the same weights and optimizer but not the same sampling noise), and
resuming under another torch version or thread count bit for bit.
"""

from __future__ import annotations

import json
import random
import shutil
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch
from safetensors.torch import load_file, save_file

from agent.model.checkpoint import CheckpointError, load_config, save_checkpoint
from agent.model.config import ModelConfig
from agent.model.tokenizer import Tokenizer
from agent.model.transformer import MoETransformer
from agent.prompt import PromptProfile

__all__ = ["RunState", "check_architecture", "latest_checkpoint", "load_run_state", "save_run_state"]

LATEST = "latest"
OPTIMIZER, RNG, STATE = "optimizer.safetensors", "rng.safetensors", "trainer_state.json"
# fields that do not change the weights' shapes or meaning: a checkpoint may differ in them
_NON_ARCH = {"precision", "mxfp8_scope", "aux_loss_coef", "router_bias_rate", "max_seq_len", "rope_theta"}


@dataclass
class RunState:
    """What a resumed run continues from (besides the weights and the optimizer)."""

    iteration: int  # iterations completed
    weights_version: int
    task_order: list[str] = field(default_factory=list)  # the epoch's shuffled task ids
    task_pos: int = 0  # how many of task_order were used
    epoch: int = 0
    extra: dict[str, Any] = field(default_factory=dict)


def check_architecture(expected: ModelConfig, found: ModelConfig, *, where: str) -> None:
    """Raise :class:`CheckpointError` naming every architecture field that differs."""
    diffs = [f"{k}: run {getattr(expected, k)!r}, checkpoint {getattr(found, k)!r}"
             for k in expected.__dataclass_fields__ if k not in _NON_ARCH and getattr(expected, k) != getattr(found, k)]
    if diffs:
        raise CheckpointError(f"{where} is a checkpoint of another architecture than this run's model "
                              f"({'; '.join(diffs)}): use a checkpoint of this preset, or change model.preset")


def _rng_state() -> tuple[dict[str, torch.Tensor], dict[str, Any]]:
    np_state = np.random.get_state()
    py = random.getstate()
    return ({"torch_cpu": torch.get_rng_state()},
            {"python": [py[0], list(py[1]), py[2]],
             "numpy": [np_state[0], np_state[1].tolist(), int(np_state[2]), int(np_state[3]), float(np_state[4])]})


def _set_rng_state(tensors: dict[str, torch.Tensor], state: dict[str, Any]) -> None:
    torch.set_rng_state(tensors["torch_cpu"])
    v, internal, gauss = state["python"]
    random.setstate((v, tuple(internal), gauss))
    name, keys, pos, has_gauss, cached = state["numpy"]
    np.random.set_state((name, np.array(keys, dtype=np.uint32), pos, has_gauss, cached))


def _optimizer_split(opt: torch.optim.Optimizer) -> tuple[dict[str, torch.Tensor], dict[str, Any]]:
    sd = opt.state_dict()
    tensors: dict[str, torch.Tensor] = {}
    scalars: dict[str, dict[str, Any]] = {}
    for idx, st in sd["state"].items():
        for name, value in st.items():
            if isinstance(value, torch.Tensor):
                tensors[f"{idx}.{name}"] = value.detach().to("cpu").contiguous()
            else:
                scalars.setdefault(str(idx), {})[name] = value
    return tensors, {"param_groups": sd["param_groups"], "scalars": scalars}


def _optimizer_join(tensors: dict[str, torch.Tensor], meta: dict[str, Any]) -> dict[str, Any]:
    state: dict[int, dict[str, Any]] = {}
    for key, value in tensors.items():
        idx, name = key.split(".", 1)
        state.setdefault(int(idx), {})[name] = value
    for idx, sc in meta["scalars"].items():
        state.setdefault(int(idx), {}).update(sc)
    return {"state": state, "param_groups": meta["param_groups"]}


def save_run_state(out_dir: str | Path, model: MoETransformer, tokenizer: Tokenizer, optimizer: torch.optim.Optimizer,
                   state: RunState, *, profile: PromptProfile, temperature: float = 1.0) -> Path:
    """Save iteration ``state.iteration``'s checkpoint under ``OUT/checkpoints`` (see the module docstring).
    ``temperature`` is the one the policy was trained at (``rollout.temperature``); it is recorded in
    ``meta.json`` as ``extra.train_temperature``, for whoever serves or evaluates the checkpoint — nothing
    reads it back (serving samples at what its caller asks)."""
    root = Path(out_dir) / "checkpoints"
    root.mkdir(parents=True, exist_ok=True)
    name = f"iter_{state.iteration:06d}"
    final, tmp = root / name, root / (name + ".tmp")
    if tmp.exists():
        shutil.rmtree(tmp)
    save_checkpoint(tmp, model, tokenizer, step=state.iteration, profile=profile,
                    extra={"weights_version": state.weights_version, "rl": True, "train_temperature": temperature})
    opt_tensors, opt_meta = _optimizer_split(optimizer)
    save_file(opt_tensors, str(tmp / OPTIMIZER))
    rng_tensors, rng_meta = _rng_state()
    save_file(rng_tensors, str(tmp / RNG))
    doc = {"iteration": state.iteration, "weights_version": state.weights_version, "task_order": state.task_order,
           "task_pos": state.task_pos, "epoch": state.epoch, "extra": state.extra, "optimizer": opt_meta,
           "rng": rng_meta}
    (tmp / STATE).write_text(json.dumps(doc) + "\n")
    if final.exists():
        shutil.rmtree(final)
    tmp.rename(final)
    pointer = root / (LATEST + ".tmp")
    pointer.write_text(name + "\n")
    pointer.replace(root / LATEST)
    return final


def latest_checkpoint(out_dir: str | Path) -> Path | None:
    """The latest complete checkpoint of a run, or None when it has none."""
    root = Path(out_dir) / "checkpoints"
    pointer = root / LATEST
    if not pointer.is_file():
        return None
    path = root / pointer.read_text().strip()
    if not (path / STATE).is_file():
        raise CheckpointError(f"{pointer} names {path.name}, which is not a complete checkpoint; "
                              f"point it at an earlier iter_* directory or start the run afresh")
    return path


def load_run_state(directory: str | Path, model: MoETransformer, optimizer: torch.optim.Optimizer) -> RunState:
    """Restore weights, optimizer and RNG from ``directory`` into ``model``/``optimizer``; returns
    the run state. Raises :class:`CheckpointError` for a checkpoint of another architecture."""
    d = Path(directory)
    check_architecture(model.cfg, load_config(d), where=str(d))
    model.load_state_dict(load_file(str(d / "model.safetensors")), strict=True)
    doc = json.loads((d / STATE).read_text())
    optimizer.load_state_dict(_optimizer_join(load_file(str(d / OPTIMIZER)), doc["optimizer"]))
    _set_rng_state(load_file(str(d / RNG)), doc["rng"])
    return RunState(iteration=doc["iteration"], weights_version=doc["weights_version"], task_order=doc["task_order"],
                    task_pos=doc["task_pos"], epoch=doc["epoch"], extra=doc["extra"])
