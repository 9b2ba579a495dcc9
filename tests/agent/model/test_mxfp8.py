"""MXFP8 numerics of the whole MoE layer and model (skipped until the kernels exist).

Protocol (torchao's MoE-training test, where issue 4's layer targets come
from): the same weights in fp32 and in mxfp8, inputs ~ N(0, 1), loss
``mse_loss(out, ones)``; SQNR of the output, the input gradient and every
weight gradient against fp32. A shared expert is on.

Two scopes (``ModelConfig.mxfp8_scope``):

* ``experts`` — only the routed experts' grouped GEMMs in MXFP8 (torchao's
  default filter, ``fqns=experts``): issue 4's 23 / 27 / 21 dB.
* ``all`` — the shared expert too. Its input gradient cannot reach 27 dB: it
  runs through five independently quantised operands (W2, the forward's
  gate and up activations, the re-quantised dgrad of SwiGLU, W13), each
  ~28.5-31 dB, which add up to ~23 dB; measured 23.5-24.3 dB at every size
  from the tiny preset to d_model 1024 (and 25.5 dB with the dgrad GEMMs
  left unquantised: the forward's activations alone cap it). Asserted here at
  its measured floor, 23 dB.
"""

from __future__ import annotations

from dataclasses import replace

import pytest
import torch
import torch.nn.functional as F

from agent.model.config import ModelConfig
from agent.model.moe import MoELayer

try:
    import kernels.mx  # noqa: F401
    from kernels.linear import mxfp8_linear  # noqa: F401
    from kernels.metrics import sqnr_db
except ImportError as exc:  # pragma: no cover - depends on the kernels being written
    pytest.skip(f"MXFP8 kernels not importable yet ({exc}); the mxfp8 model paths are untested",
                allow_module_level=True)

CFG = ModelConfig.preset("tiny", shared_expert=True, max_seq_len=64)


def _run(cfg: ModelConfig, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, dict[str, torch.Tensor]]:
    torch.manual_seed(0)
    layer = MoELayer(cfg)
    x = x.clone().requires_grad_(True)
    y = layer(x).y
    F.mse_loss(y, torch.ones_like(y)).backward()
    assert x.grad is not None
    return y.detach(), x.grad, {n: p.grad for n, p in layer.named_parameters() if p.grad is not None}


@pytest.fixture(scope="module", params=["experts", "all"])
def sqnr(request: pytest.FixtureRequest) -> dict[str, float | str]:
    torch.manual_seed(1)
    x = torch.randn(8, 128, CFG.d_model)
    y32, gx32, gw32 = _run(CFG, x)
    y8, gx8, gw8 = _run(replace(CFG, precision="mxfp8", mxfp8_scope=request.param), x)
    assert gw32.keys() == gw8.keys()
    return {"scope": request.param, "out": sqnr_db(y32, y8), "input_grad": sqnr_db(gx32, gx8),
            **{f"grad:{n}": sqnr_db(gw32[n], gw8[n]) for n in gw32}}


def test_moe_layer_output_and_weight_grads(sqnr: dict) -> None:
    assert sqnr["out"] >= 23.0, sqnr
    weight = {k: v for k, v in sqnr.items() if k.startswith("grad:")}
    assert weight and min(weight.values()) >= 21.0, sqnr


def test_moe_layer_input_grad(sqnr: dict) -> None:
    target = 27.0 if sqnr["scope"] == "experts" else 23.0  # see the module docstring for "all"
    assert sqnr["input_grad"] >= target, sqnr


def test_scope_experts_keeps_dense_layers_fp32() -> None:
    from agent.model.transformer import MoETransformer

    model = MoETransformer(replace(CFG, precision="mxfp8", mxfp8_scope="experts"))
    precisions = {m.precision for m in model.modules() if hasattr(m, "precision") and isinstance(m, torch.nn.Linear)}
    assert precisions == {"fp32"}
    assert {m.precision for m in model.modules() if isinstance(m, MoELayer)} == {"mxfp8"}
    with pytest.raises(ValueError, match="mxfp8_scope"):
        replace(CFG, mxfp8_scope="attention")


def test_mxfp8_model_cached_forward_matches() -> None:
    from agent.model.transformer import KVCache, MoETransformer

    torch.manual_seed(0)
    model = MoETransformer(replace(CFG, precision="mxfp8", vocab_size=97)).eval()
    ids = torch.randint(0, 97, (2, 20))
    with torch.no_grad():
        ref = model(ids).logits
        cache = KVCache(model.cfg, max_slots=2, max_len=32)
        slots = torch.tensor([1, 0])
        first = model(ids[:, :12], cache=cache, slots=slots).logits
        rest = [model(ids[:, t:t + 1], cache=cache, slots=slots).logits for t in range(12, 20)]
    got = torch.cat([first, *rest], dim=1)
    # same per-row quantisation in both paths; only float summation order differs
    assert float((got - ref).abs().max()) <= 1e-4
