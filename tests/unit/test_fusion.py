"""Hybrid fusion per profile (issue #35): reciprocal rank fusion beside the weighted sum (pipelines/domain/lexical.py)."""

from __future__ import annotations

import numpy as np
import pytest

from pipelines.domain.lexical import (
    LexicalParams,
    check_params,
    competition_ranks,
    fuse,
    fuse_rrf,
    rrf_matrix,
)


def test_rrf_scores_are_the_reciprocal_ranks_of_each_side():
    dense = {"a": 0.9, "b": 0.8, "c": 0.1}
    lexical = {"c": 12.0, "b": 3.0}
    got = dict(fuse_rrf(dense, lexical, 60, 0.5))
    assert got["a"] == pytest.approx(0.5 / 61)  # dense rank 1, no lexical rank
    assert got["b"] == pytest.approx(0.5 / 62 + 0.5 / 62)
    assert got["c"] == pytest.approx(0.5 / 63 + 0.5 / 61)
    assert [cid for cid, _ in fuse_rrf(dense, lexical, 60, 0.5)] == ["c", "b", "a"]


def test_rrf_ranks_not_scores_where_the_weighted_sum_follows_the_scores():
    """One huge BM25 outlier dominates the weighted sum (its normalised score is 1, the rest ~0) but RRF only
    sees that it is lexical rank 1: a chunk second on both sides beats it."""
    dense = {"both": 0.80, "dense_top": 0.90}
    lexical = {"outlier": 1000.0, "both": 1.0}
    assert fuse(dense, lexical, 0.5)[0][0] == "outlier"
    assert fuse_rrf(dense, lexical, 60, 0.5)[0][0] == "both"


def test_rrf_ties_share_a_rank_and_break_by_id():
    assert competition_ranks({"x": 2.0, "y": 2.0, "z": 1.0}) == {"x": 1, "y": 1, "z": 3}
    fused = fuse_rrf({"y": 0.5, "x": 0.5}, {}, 60, 0.5)
    assert fused[0][1] == fused[1][1] == pytest.approx(0.5 / 61), "a tie scores the same, whatever the input order"
    assert [cid for cid, _ in fused] == ["x", "y"], "then by id, as the weighted sum breaks ties"
    # A chunk tied with another on one side is not favoured by where the tie happened to be listed.
    a = fuse_rrf({"p": 0.7, "q": 0.7}, {"q": 5.0}, 60, 0.5)
    b = fuse_rrf({"q": 0.7, "p": 0.7}, {"q": 5.0}, 60, 0.5)
    assert a == b and a[0][0] == "q"


def test_rrf_with_one_side_empty_is_that_sides_order():
    dense = {"a": 0.2, "b": 0.9, "c": 0.5}
    assert [cid for cid, _ in fuse_rrf(dense, {}, 60, 0.5)] == ["b", "c", "a"]
    assert [cid for cid, _ in fuse_rrf({}, {"a": 1.0, "b": 7.0}, 60, 0.5)] == ["b", "a"]
    assert fuse_rrf({}, {}, 60, 0.5) == []


def test_rrf_k_decides_how_much_a_top_rank_outweighs_agreement():
    """'solo' is first on the lexical side only; 'pair' is fourth on both sides. A small k makes rank 1 worth
    much more than rank 4 (solo wins: 1/2 against 2/5); a large k flattens ranks so agreement of both sides
    wins (2/64 against 1/61)."""
    dense = {"d1": 0.9, "d2": 0.8, "d3": 0.75, "pair": 0.7}
    lexical = {"solo": 9.0, "l2": 8.0, "l3": 7.5, "pair": 7.0}
    def order(k):
        return [cid for cid, _ in fuse_rrf(dense, lexical, k, 0.5)]
    assert order(1).index("solo") < order(1).index("pair")
    assert order(60)[0] == "pair"
    with pytest.raises(ValueError):
        fuse_rrf(dense, lexical, 0, 0.5)


def test_rrf_weight_moves_the_order_to_one_side():
    dense = {"a": 0.9, "b": 0.1}
    lexical = {"b": 5.0, "a": 1.0}
    assert fuse_rrf(dense, lexical, 60, 1.0)[0][0] == "b"
    assert fuse_rrf(dense, lexical, 60, 0.0)[0][0] == "a"


def test_rrf_matrix_agrees_with_rrf_over_each_sides_depth_best():
    """The quality gate's matrix form fuses as search does: each side's `depth` best chunks only, ties shared,
    no lexical rank for a chunk without a matching term (BM25 0)."""
    rng = np.random.default_rng(7)
    cosines = rng.uniform(-0.2, 1.0, size=(3, 12))
    bm25 = np.where(rng.uniform(size=(3, 12)) < 0.4, 0.0, rng.uniform(0, 9, size=(3, 12)))
    bm25[0, 3] = bm25[0, 4] = bm25[0].max()  # a tie at the top of one query's lexical side
    depth = 5
    matrix = rrf_matrix(cosines, bm25, 10, 0.3, depth)
    for q in range(3):
        dense_top = np.argsort(-cosines[q], kind="stable")[:depth]
        lexical = {f"{j:02d}": float(bm25[q, j]) for j in range(12) if bm25[q, j] > 0}
        lexical_top = dict(sorted(lexical.items(), key=lambda kv: (-kv[1], kv[0]))[:depth])
        expected = dict(fuse_rrf({f"{j:02d}": float(cosines[q, j]) for j in dense_top}, lexical_top, 10, 0.3))
        for j in range(12):
            assert matrix[q, j] == pytest.approx(expected.get(f"{j:02d}", 0.0)), (q, j)


def test_profile_fusion_parameters_are_checked_and_read_from_a_row():
    assert LexicalParams.of({}) == LexicalParams(analyzer="wordpiece") and LexicalParams().fusion == "weighted"
    assert LexicalParams.of({"fusion": "rrf", "rrf_k": 20}).rrf_k == 20
    assert check_params(LexicalParams(fusion="rrf", rrf_k=1)).fusion == "rrf"
    for bad in (LexicalParams(fusion="max"), LexicalParams(fusion="rrf", rrf_k=0), LexicalParams(rrf_k=100_001)):
        with pytest.raises(ValueError):
            check_params(bad)
