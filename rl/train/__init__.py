"""GRPO training of the MoE policy (``grpo``), the SFT warm start (``sft``), exact-resume
checkpoints (``checkpoints``), per-iteration metrics (``metrics``) and the loop (``loop``).
Heavy imports (torch) happen inside these modules' functions or on importing them, never
on ``import rl``."""
