"""Lexical terms, BM25 and fusion (pipelines/domain/lexical.py), with the model's real WordPiece tokenizer."""

from __future__ import annotations

import numpy as np
import pytest

from pipelines.domain.lexical import (
    BIGRAM_BASE,
    CJK_BASE,
    LexicalParams,
    bm25_matrix,
    bm25_term,
    candidate_terms,
    check_mode,
    fuse,
    fuse_matrix,
    idf,
    lazy_terms,
    term_bound,
    term_counts,
    theta_estimate,
)
from resources.tokenizer import ModelTokenizer


@pytest.fixture(scope="module")
def tokenizer() -> ModelTokenizer:
    return ModelTokenizer()


def test_english_terms_are_the_models_word_pieces(tokenizer):
    counts = term_counts("Policy the policy, POLICY!", tokenizer)
    (policy,) = [i for i, _, _ in tokenizer.pieces("policy")]
    assert counts[policy] == 3 and all(t < CJK_BASE for t in counts)


def test_chinese_gets_every_ideograph_and_adjacent_pairs_even_where_wordpiece_says_unk(tokenizer):
    counts = term_counts("首都首都", tokenizer)  # 首 is [UNK] to the MiniLM vocabulary
    assert counts[CJK_BASE + ord("首")] == 2 and counts[CJK_BASE + ord("都")] == 2
    bigrams = {t: n for t, n in counts.items() if t >= BIGRAM_BASE}
    assert sorted(bigrams.values()) == [1, 2]  # 首都 twice, 都首 once
    assert 100 not in counts, "no [UNK] term for an ideograph"


def test_no_bigram_across_a_gap_or_a_latin_word(tokenizer):
    assert not [t for t in term_counts("北 京", tokenizer) if t >= BIGRAM_BASE]
    assert not [t for t in term_counts("北abc京", tokenizer) if t >= BIGRAM_BASE]
    assert [t for t in term_counts("北京", tokenizer) if t >= BIGRAM_BASE]


def test_idf_and_bm25_shape():
    assert idf(10, 1) > idf(10, 5) > idf(10, 10) > 0
    short = bm25_term(1, 5, 10, 1.0, 1.2, 0.75)
    long = bm25_term(1, 20, 10, 1.0, 1.2, 0.75)
    assert short > long, "length normalisation"
    assert bm25_term(10, 10, 10, 1.0, 1.2, 0.75) < 2.2 + 1e-9, "saturates at k1 + 1"


def test_candidate_terms_take_the_rarest_within_budget_and_always_one():
    assert candidate_terms({1: 5, 2: 1, 3: 100}, budget=10) == [2, 1]
    assert candidate_terms({1: 500, 2: 400}, budget=10) == [2]
    assert candidate_terms({1: 0}, budget=10) == []


def test_lazy_terms_are_the_longest_run_of_commonest_that_can_be_pruned():
    idfs = {1: 1.0, 2: 2.0, 3: 6.0, 4: 7.0}
    # 12,000 >= 4 x 2,430 and 14,000 >= 4 x 430, but (1 + 2) x 2.2 = 6.6 is not below the idf where the
    # others reach the walk's cut of 100 (term 3's, 6.0): only term 1 (2.2) can be probed.
    assert lazy_terms({1: 12_000, 2: 2_000, 3: 400, 4: 30}, idfs, walk_at_least=100, k1=1.2) == [1]
    # With rarer terms that rank higher, both.
    assert lazy_terms({1: 9_000, 2: 2_000, 3: 30}, {1: 1.0, 2: 1.5, 3: 6.0}, walk_at_least=10, k1=1.2) == [1, 2]
    # Two equally common terms: neither alone outnumbers the rest 4 to 1, together they do.
    assert lazy_terms({1: 2_400, 2: 2_200, 3: 600}, {1: 1.0, 2: 1.0, 3: 6.0}, walk_at_least=10, k1=1.2) == [1, 2]
    assert lazy_terms({1: 2_000, 2: 1_800, 3: 1_500}, {1: 1.0, 2: 1.0, 3: 1.2}, walk_at_least=10, k1=1.2) == []
    # A common term whose most reaches the walk's cut cannot be pruned.
    assert lazy_terms({1: 9_000, 2: 30}, {1: 3.0, 2: 6.0}, walk_at_least=10, k1=1.2) == []
    # The walked terms must hold the walk's cut.
    assert lazy_terms({1: 9_000, 2: 2_000, 3: 30}, {1: 0.5, 2: 1.5, 3: 6.0}, walk_at_least=2_000, k1=1.2) == [1]
    assert lazy_terms({1: 9_000, 2: 2_000, 3: 30}, {1: 0.5, 2: 1.5, 3: 6.0}, walk_at_least=4_000, k1=1.2) == []
    assert lazy_terms({1: 500}, {1: 1.0}, walk_at_least=0, k1=1.2) == [], "a lone term is always walked"
    assert lazy_terms({}, {}, walk_at_least=0, k1=1.2) == []


def test_lazy_terms_take_tighter_bounds_and_another_ratio_when_given():
    dfs, idfs = {1: 12_000, 2: 2_000, 3: 400, 4: 30}, {1: 1.0, 2: 2.0, 3: 6.0, 4: 7.0}
    # Term 1 and 2's idf x (k1 + 1) sum to 6.6, not below theta's estimate (6.0); bounds of 1.5 and 3.0 are.
    assert lazy_terms(dfs, idfs, walk_at_least=100, k1=1.2, bounds={1: 1.5, 2: 3.0, 3: 9, 4: 9}) == [1, 2]
    assert lazy_terms(dfs, idfs, walk_at_least=100, k1=1.2, bounds={1: 1.5, 2: 4.6, 3: 9, 4: 9}) == [1]
    # 9,000 against 3,000 is not 4 to 1, but it is 2 to 1.
    dfs = {1: 9_000, 2: 2_600, 3: 400}
    assert lazy_terms(dfs, {1: 1.0, 2: 5.0, 3: 6.0}, walk_at_least=100, k1=1.2) == []
    assert lazy_terms(dfs, {1: 1.0, 2: 5.0, 3: 6.0}, walk_at_least=100, k1=1.2, ratio=2) == [1]


def test_a_terms_bound_is_reached_at_its_kept_extremes_and_never_passed():
    """term_bound(max tf, min length / tf) is bm25_term of a posting at both extremes, at least that of every
    posting within them (tf up to the max, length / tf down to the min), and idf x (k1 + 1) when none is kept."""
    rng = np.random.default_rng(52)
    for _ in range(200):
        k1, b, avg, term_idf = rng.uniform(0.5, 2), rng.uniform(0, 1), rng.uniform(5, 200), rng.uniform(0.1, 9)
        max_tf, min_per_tf = int(rng.integers(1, 20)), rng.uniform(1, 50)
        bound = term_bound(term_idf, k1, b, avg, max_tf, min_per_tf)
        assert bound == pytest.approx(bm25_term(max_tf, min_per_tf * max_tf, avg, term_idf, k1, b))
        for _ in range(20):
            tf = int(rng.integers(1, max_tf + 1))
            assert bm25_term(tf, tf * rng.uniform(min_per_tf, 4 * min_per_tf), avg, term_idf, k1, b) <= bound + 1e-12
        assert bound < term_idf * (k1 + 1)
    assert term_bound(2.0, 1.2, 0.75, 10.0) == pytest.approx(2.0 * 2.2)
    assert term_bound(2.0, 1.2, 0.75, 10.0, None, None) == term_bound(2.0, 1.2, 0.75, 10.0, 0, None)


def test_theta_estimate_is_the_idf_where_the_walked_terms_reach_the_cut():
    dfs, idfs = {1: 9_000, 2: 300, 3: 200}, {1: 1.0, 2: 5.0, 3: 6.0}
    assert theta_estimate(dfs, idfs, [2, 3], 100) == 6.0
    assert theta_estimate(dfs, idfs, [2, 3], 400) == 5.0
    assert theta_estimate(dfs, idfs, [2, 3], 600) == 0.0


def test_bm25_matrix_is_the_sum_of_term_contributions():
    chunks = [{1: 2, 2: 1}, {2: 3}, {3: 1, 1: 1}]
    scores = bm25_matrix(chunks, [[1, 2]], 1.2, 0.75)
    lengths = [3, 3, 2]
    avg = sum(lengths) / 3
    expected = [
        sum(bm25_term(c[t], lengths[i], avg, idf(3, sum(t in x for x in chunks)), 1.2, 0.75) for t in (1, 2) if t in c)
        for i, c in enumerate(chunks)
    ]
    assert scores[0] == pytest.approx(expected)
    assert np.array_equal(scores, np.round(np.asarray(expected)[None, :] * 1e9) / 1e9)  # on search's 1e-9 grid


def test_fuse_and_fuse_matrix_agree_and_lexical_weight_moves_the_order():
    cos = {"a": 0.9, "b": 0.2, "c": -0.5}
    bm = {"a": 1.0, "b": 4.0}
    fused = dict(fuse(cos, bm, 0.5))
    assert fused["a"] == pytest.approx(0.5 * 0.25 + 0.5 * 0.9) and fused["c"] == 0.0
    matrix = fuse_matrix(np.array([[0.9, 0.2, -0.5]]), np.array([[1.0, 4.0, 0.0]]), 0.5)
    assert list(matrix[0]) == pytest.approx([fused["a"], fused["b"], fused["c"]])
    assert fuse(cos, bm, 1.0)[0][0] == "b" and fuse(cos, bm, 0.0)[0][0] == "a"
    assert [cid for cid, _ in fuse(cos, {}, 0.5)] == ["a", "b", "c"], "no lexical hit: the dense order"


def test_params_and_modes():
    assert LexicalParams.of({}) == LexicalParams(analyzer="wordpiece"), "a row from before migration 0045"
    assert LexicalParams.of({"search_mode": "dense", "lexical_weight": 0.3}).lexical_weight == 0.3
    assert check_mode("lexical") == "lexical"
    with pytest.raises(ValueError):
        check_mode("sparse")
