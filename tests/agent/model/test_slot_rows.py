"""SlotRows: which rows of the cache a cached forward reads as a view (no copy) and which it gathers,
and that spreading queries into the view and picking them back is a bijection on the query rows."""

from __future__ import annotations

import pytest
import torch

from agent.model.slot_rows import SlotRows


def test_rows_in_order_are_a_view_with_no_spreading() -> None:
    cache = torch.arange(8 * 3, dtype=torch.float32).view(8, 3)
    rows = SlotRows.of(torch.tensor([2, 3, 4]))
    assert rows.span == slice(2, 5) and rows.index is None and rows.width == 3
    taken = rows.take(cache)
    assert taken.data_ptr() == cache[2].data_ptr()  # a view: nothing copied
    q = torch.randn(3, 5)
    assert rows.spread(q) is q and rows.pick(q) is q


def test_close_rows_in_any_order_are_a_view_with_spare_rows() -> None:
    cache = torch.arange(8 * 3, dtype=torch.float32).view(8, 3)
    slots = torch.tensor([5, 1, 3])  # range 1..5: 5 rows for 3 queries (<= 2 x 3)
    rows = SlotRows.of(slots)
    assert rows.span == slice(1, 6) and rows.width == 5
    assert rows.take(cache).data_ptr() == cache[1].data_ptr()
    q = torch.randn(3, 4)
    spread = rows.spread(q)
    assert spread.shape == (5, 4)
    torch.testing.assert_close(spread[[4, 0, 2]], q, rtol=0, atol=0)  # each query sits at its slot's row
    assert spread[[1, 3]].abs().sum() == 0  # spare rows are zeros
    torch.testing.assert_close(rows.pick(spread), q, rtol=0, atol=0)
    # what the view computes for a query row is that slot's data, as the gather would give it
    torch.testing.assert_close(rows.pick(rows.take(cache)), cache[slots], rtol=0, atol=0)


def test_scattered_rows_are_gathered() -> None:
    cache = torch.randn(32, 2)
    slots = torch.tensor([0, 31])  # a range of 32 for 2 queries: reading it would cost 16x the gather
    rows = SlotRows.of(slots)
    assert rows.span is None and rows.width == 2
    taken = rows.take(cache)
    torch.testing.assert_close(taken, cache[slots], rtol=0, atol=0)
    assert taken.data_ptr() != cache.data_ptr()  # a copy
    q = torch.randn(2, 3)
    assert rows.spread(q) is q and rows.pick(q) is q


@pytest.mark.parametrize(("slots", "spread", "view"), [
    ([0, 1, 2, 3], 0.0, False),  # 0: always gather
    ([0, 7], 4.0, True),  # width 8 <= 4 x 2
    ([0, 8], 4.0, False),  # width 9 > 8
    ([6], 1.0, True),  # one row is its own range
])
def test_max_spread_bounds_the_view(slots: list[int], spread: float, view: bool) -> None:
    assert (SlotRows.of(torch.tensor(slots), max_spread=spread).span is not None) is view
