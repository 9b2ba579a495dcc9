"""The one model config: a dataclass that scales from a ~1M-parameter CPU test
model to ~1B parameters on a GPU (``preset``)."""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, replace
from typing import Any, Literal

Precision = Literal["fp32", "bf16", "mxfp8"]
MXFP8Scope = Literal["all", "experts"]


@dataclass(frozen=True)
class ModelConfig:
    vocab_size: int = 8192
    d_model: int = 128
    n_layers: int = 4
    n_heads: int = 4
    n_kv_heads: int = 4  # grouped-query attention when < n_heads
    n_experts: int = 8
    top_k: int = 2
    d_ff: int = 256  # hidden size of each expert
    shared_expert: bool = False  # one always-on expert beside the routed ones
    max_seq_len: int = 1024
    rope_theta: float = 10000.0
    norm_eps: float = 1e-5
    aux_loss_coef: float = 0.01  # load-balancing auxiliary loss (0 disables)
    router_bias_rate: float = 0.0  # auxiliary-loss-free balancing: bias update speed (0 disables)
    precision: Precision = "fp32"  # matmul numerics of the experts and linears
    # under mxfp8: "all" = routed experts, shared expert and attention projections in MXFP8;
    # "experts" = only the routed experts' grouped GEMMs (torchao/torchtitan's default filter), the rest fp32
    mxfp8_scope: MXFP8Scope = "all"
    # a pointer-sentinel copy head (agent.model.copy_head) mixes the LM head's distribution with a
    # distribution over the tokens that FOLLOWED earlier positions of the context: copying a path or a
    # line the model has seen is one attention lookup instead of an induction circuit to grow
    copy_head: bool = False
    # the copy head's pointer may point only at positions at least this far back (1: any earlier
    # one); a larger distance stops the pointer from copying its own last copies in a loop
    copy_min_distance: int = 1
    # successor-aware copy keys: every pointer entry's score also sees the token it would emit
    # (agent.model.copy_head, "One option"); only with copy_head
    copy_successor_keys: bool = False
    # the copy head's pointer may not point into the model output it is writing (only at the context
    # before that output's <|assistant|> marker): a pointer that copies its own output loops
    # ("helium_nebula/helium_nebula/..."); agent.model.copy_head, "Context only". Only with copy_head.
    # Measured harmful (docs/rl/runs.md, thirty-second run): it removes the in-output copies the
    # demonstrations need (replace from search) with the loops; off by default
    copy_context_only: bool = False

    def __post_init__(self) -> None:
        if self.d_model % self.n_heads:
            raise ValueError("d_model must be divisible by n_heads")
        if self.n_heads % self.n_kv_heads:
            raise ValueError("n_heads must be divisible by n_kv_heads")
        if not 1 <= self.top_k <= self.n_experts:
            raise ValueError("top_k must be in 1..n_experts")
        if self.precision not in ("fp32", "bf16", "mxfp8"):
            raise ValueError(f"unknown precision {self.precision!r}")
        if self.copy_min_distance < 1:
            raise ValueError("copy_min_distance must be >= 1")
        if self.copy_successor_keys and not self.copy_head:
            raise ValueError("copy_successor_keys needs copy_head")
        if self.copy_context_only and not self.copy_head:
            raise ValueError("copy_context_only needs copy_head")
        if self.mxfp8_scope not in ("all", "experts"):
            raise ValueError(f"unknown mxfp8_scope {self.mxfp8_scope!r}: choose all or experts")

    @property
    def dense_precision(self) -> Precision:
        """Numerics of the attention projections and the shared expert (``mxfp8_scope`` can keep them fp32)."""
        return "fp32" if self.precision == "mxfp8" and self.mxfp8_scope == "experts" else self.precision

    @property
    def head_dim(self) -> int:
        return self.d_model // self.n_heads

    @classmethod
    def preset(cls, name: str, **overrides: Any) -> ModelConfig:
        """``tiny`` (~0.5M params, CPU tests), ``mini`` (~2M, the CPU RL experiment:
        4 layers, enough to copy paths and code from its context), ``small`` (~14M, CPU
        training), ``1b`` (~1B total params, GPU).

        Context (``max_seq_len``): tiny and small hold 1,024 tokens, enough for
        the compact prompt profile's system prompt (~310 tokens with the
        default tools) plus a few steps of conversation; the full profile
        (~1,700 tokens) needs the 1b preset's 4,096. The context costs no
        parameters (rotary positions) and no training time (windows are
        ``--seq-len`` long); only the generation engine's KV cache grows.
        """
        presets = {
            "tiny": cls(vocab_size=4096, d_model=64, n_layers=2, n_heads=4, n_kv_heads=2, n_experts=4, top_k=2,
                        d_ff=128, max_seq_len=1024),
            "mini": cls(vocab_size=2048, d_model=128, n_layers=4, n_heads=4, n_kv_heads=2, n_experts=4, top_k=2,
                        d_ff=256, max_seq_len=2048),
            "small": cls(vocab_size=8192, d_model=256, n_layers=4, n_heads=8, n_kv_heads=4, n_experts=8, top_k=2,
                         d_ff=512, max_seq_len=1024),
            "1b": cls(vocab_size=32768, d_model=1536, n_layers=16, n_heads=16, n_kv_heads=4, n_experts=16, top_k=2,
                      d_ff=1536, shared_expert=True, max_seq_len=4096),
        }
        if name not in presets:
            raise ValueError(f"unknown preset {name!r}: choose from {', '.join(presets)}")
        return replace(presets[name], **overrides)

    def to_json(self) -> str:
        return json.dumps(asdict(self), indent=2, sort_keys=True)

    @classmethod
    def from_json(cls, text: str) -> ModelConfig:
        data = json.loads(text)
        known = {f for f in cls.__dataclass_fields__}
        unknown = set(data) - known
        if unknown:
            raise ValueError(f"unknown config fields: {', '.join(sorted(unknown))}")
        return cls(**data)
