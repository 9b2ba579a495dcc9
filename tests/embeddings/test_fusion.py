"""embeddings/fusion.py: the convex combination of max-normalised scores."""

from __future__ import annotations

import pytest

from embeddings.fusion import BM25_WEIGHT, fuse, normalise


def test_normalise_divides_by_the_best_score() -> None:
    assert normalise([(1, 4.0), (2, 2.0), (3, 0.0)]) == {1: 1.0, 2: 0.5, 3: 0.0}
    assert normalise([(1, 0.0), (2, -1.0)]) == {1: 0.0, 2: 0.0}
    assert normalise([]) == {}


def test_weight_zero_is_vector_order_and_one_is_bm25_order() -> None:
    vec = [(1, 0.9), (2, 0.8), (3, 0.7)]
    lex = [(3, 12.0), (2, 6.0), (4, 1.0)]
    assert [c for c, _ in fuse(vec, lex, 0.0)][:3] == [1, 2, 3]
    assert [c for c, _ in fuse(vec, lex, 1.0)][:2] == [3, 2]


def test_a_strong_keyword_match_lifts_a_close_vector_second() -> None:
    vec = [(1, 0.80), (2, 0.79), (3, 0.40)]
    lex = [(2, 20.0), (3, 2.0)]  # chunk 1 has no term in common with the query
    ranked = [c for c, _ in fuse(vec, lex)]
    assert ranked[0] == 2 and set(ranked) == {1, 2, 3}


def test_missing_from_one_list_takes_that_lists_floor_not_zero() -> None:
    vec = [(1, 1.0), (2, 0.5)]
    lex = [(1, 10.0), (3, 5.0)]
    scores = dict(fuse(vec, lex, 0.5))
    assert scores[2] == pytest.approx(0.5 * 0.5 + 0.5 * 0.5)  # bm25 floor is 0.5, not 0
    assert scores[3] == pytest.approx(0.5 * 0.5 + 0.5 * 0.5)


def test_ties_break_by_id_and_bad_weights_are_refused() -> None:
    assert [c for c, _ in fuse([(5, 1.0), (4, 1.0)], [])] == [4, 5]
    assert 0 < BM25_WEIGHT < 0.5
    with pytest.raises(ValueError, match="weight"):
        fuse([], [], 1.5)


def test_linked_chunks_are_lifted_even_from_outside_both_lists() -> None:
    vec = [(1, 0.9), (2, 0.8)]
    lex = [(1, 10.0), (2, 9.0)]
    assert [c for c, _ in fuse(vec, lex, 0.7)] == [1, 2]
    ranked = fuse(vec, lex, 0.7, linked={7: 1.0, 2: 0.5}, link_weight=1.0)
    assert [c for c, _ in ranked] == [7, 2, 1]
    # a zero link weight is the plain combination (the linked chunk trails at the floors)
    assert [c for c, _ in fuse(vec, lex, 0.7, linked={7: 1.0}, link_weight=0.0)] == [1, 2, 7]
    with pytest.raises(ValueError, match="link weight"):
        fuse(vec, lex, 0.7, linked={7: 1.0}, link_weight=-1.0)
