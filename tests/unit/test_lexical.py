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
    term_counts,
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
