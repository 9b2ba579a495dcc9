"""kernels/metrics.py."""

from __future__ import annotations

import math

import pytest
import torch

from kernels.metrics import sqnr_db


def test_known_ratio() -> None:
    ref = torch.ones(100)
    assert sqnr_db(ref, ref * 1.1) == pytest.approx(20.0)  # signal 100, noise 100 * 0.01


def test_edge_values() -> None:
    assert sqnr_db(torch.ones(3), torch.ones(3)) == math.inf
    assert sqnr_db(torch.zeros(3), torch.ones(3)) == -math.inf
    assert math.isnan(sqnr_db(torch.tensor([1.0, math.nan]), torch.ones(2)))
    with pytest.raises(ValueError):
        sqnr_db(torch.ones(3), torch.ones(4))
