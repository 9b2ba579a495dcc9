"""Kernel tests run Triton kernels in its interpreter when there is no GPU.

The interpreter must be chosen before ``triton`` is first imported (torchao
imports it too), so this is set while pytest collects this directory.
"""

from __future__ import annotations

import os

import torch

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")
