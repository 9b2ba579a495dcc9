"""Matmul numerics per ``ModelConfig.precision``, in one place.

* ``fp32`` — plain fp32 everywhere.
* ``bf16`` — ``torch.autocast(dtype=bfloat16)`` around the model body: fp32
  master weights, matmuls (linears, attention, experts, LM head) in bf16; the
  router, the norms' statistics, softmax and the loss in fp32 (the router
  explicitly, the rest by autocast's own op lists). We
  chose autocast over bf16 parameters so the optimizer keeps fp32 weights and a
  checkpoint is the same file whatever precision trained it.
* ``mxfp8`` — the attention projections and the shared expert go through
  ``kernels.linear.mxfp8_linear`` and the routed experts through
  ``kernels.grouped.grouped_mm(..., precision="mxfp8")``. Embedding, LM head,
  router, norms and the attention core (QK^T, softmax, PV) stay fp32, as in
  DeepSeek-V3's FP8 recipe and torchao's MX training (the head and the router are
  the most sensitive matmuls; keeping the router exact also means fp32 and mxfp8
  route identically, so their outputs are comparable token by token).
  ``ModelConfig.mxfp8_scope="experts"`` narrows MXFP8 to the routed experts'
  grouped GEMMs (the attention projections and the shared expert stay fp32),
  the scope torchao's torchtitan converter uses by default. It buys accuracy
  of the input gradient (tests/agent/model/test_mxfp8.py: ~24 dB -> ~31 dB)
  at the cost of the dense GEMMs' speed-up on MX hardware.

Parameters are the same ``nn.Parameter`` objects in every precision: switching
precision never changes the state dict.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from agent.model.config import Precision


class KernelsUnavailable(RuntimeError):
    """``precision="mxfp8"`` was asked for but the MXFP8 kernels cannot be imported."""


def require_kernels(precision: Precision) -> None:
    """Fail at construction time (not at the first forward) when mxfp8 has no kernels."""
    if precision != "mxfp8":
        return
    try:
        import kernels.linear  # noqa: F401
        import kernels.mx  # noqa: F401
        from kernels.linear import mxfp8_linear  # noqa: F401
    except ImportError as exc:
        raise KernelsUnavailable(
            "precision='mxfp8' needs the MXFP8 kernels (kernels.mx, kernels.linear.mxfp8_linear and "
            f"kernels.grouped.grouped_mm(precision='mxfp8')), which are not importable here: {exc}. "
            "Use precision='fp32' or 'bf16'."
        ) from exc


def _mxfp8_linear() -> Callable[..., torch.Tensor]:
    from kernels.linear import mxfp8_linear

    return mxfp8_linear


class Linear(nn.Linear):
    """``nn.Linear`` whose matmul follows the model's precision (see module docstring)."""

    def __init__(self, in_features: int, out_features: int, *, precision: Precision = "fp32",
                 bias: bool = False, **kwargs: Any) -> None:
        super().__init__(in_features, out_features, bias=bias, **kwargs)
        require_kernels(precision)
        self.precision = precision

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.precision == "mxfp8":
            return _mxfp8_linear()(x, self.weight, self.bias)
        return F.linear(x, self.weight, self.bias)

    def extra_repr(self) -> str:
        return super().extra_repr() + f", precision={self.precision}"


def autocast_for(precision: Precision, device_type: str) -> contextlib.AbstractContextManager[Any]:
    """The context the model body runs in: bf16 autocast for ``bf16``, nothing otherwise."""
    if precision == "bf16":
        return torch.autocast(device_type=device_type, dtype=torch.bfloat16)
    return contextlib.nullcontext()


def fp32_region(device_type: str) -> contextlib.AbstractContextManager[Any]:
    """Autocast off: for the router, which always runs in fp32."""
    return torch.autocast(device_type=device_type, enabled=False)
