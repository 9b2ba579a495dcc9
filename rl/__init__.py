"""The RL flywheel: task sets and graders (``rl.tasks``), rollouts through the
production runtime on Ray (``rl.rollout``), GRPO training of the MoE policy
(``rl.train``). Imports nothing heavy at import time."""
