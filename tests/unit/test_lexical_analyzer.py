"""The ``english`` lexical analyzer (pipelines/domain/lexical.py ``english_term_counts``, resources/lexical.py
``analyzer_for``): stemmed whole words without stop words, the CJK n-grams of ``wordpiece`` unchanged, ids in a
range of their own, the same ids in every process."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from pipelines.domain.lexical import (
    ANALYZERS,
    BIGRAM_BASE,
    CJK_BASE,
    ENGLISH_STOP_WORDS,
    WORD_BASE,
    LexicalParams,
    check_params,
    english_term_counts,
    english_words,
    term_counts,
    word_id,
)
from resources.lexical import analyzer_for, profile_analyzer
from resources.tokenizer import ModelTokenizer

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def english():
    return analyzer_for("all-MiniLM-L6-v2", "english")


def test_inflections_share_one_stemmed_term(english):
    counts = english("Running runs; the runner RUN")
    assert counts[word_id("run")] == 3, "running, runs and RUN stem to run (case-folded)"
    assert counts[word_id("runner")] == 1, "Snowball keeps runner apart"
    assert english("policies")[word_id("polici")] == 1 and english("policy") == english("Policy")


def test_stop_words_and_possessives(english):
    assert english_words("The dog's bone is in the garden and it's theirs") == ["dog", "bone", "garden", "theirs"]
    assert not english("the of and to a in is it"), "only stop words: no term"
    assert len(ENGLISH_STOP_WORDS) == 33  # Lucene's English stop set


def test_cjk_keeps_exactly_the_wordpiece_unigrams_and_bigrams(english):
    tokenizer = ModelTokenizer()
    for text in ("首都首都", "北京大学的学生", "北 京", "北abc京", "中文，英文。"):
        cjk = {t: n for t, n in term_counts(text, tokenizer).items() if t >= CJK_BASE}
        ngrams = {t: n for t, n in english(text).items() if t >= CJK_BASE and not WORD_BASE <= t < BIGRAM_BASE}
        assert ngrams == cjk, text
    mixed = english("Python 编程 running")
    assert mixed[CJK_BASE + ord("编")] == 1 and mixed[word_id("python")] == 1 and mixed[word_id("run")] == 1


def test_id_spaces_are_disjoint(english):
    tokenizer = ModelTokenizer()
    text = "Antidisestablishmentarianism 2024 naïve café résumé 北京 x" * 2
    words = [t for t in english(text) if WORD_BASE <= t < BIGRAM_BASE]
    assert len(words) == 7
    for t in english(text):
        assert t >= CJK_BASE, "no word takes a WordPiece id"
        if t < BIGRAM_BASE:
            assert (t < CJK_BASE + 0x110000) != (t >= WORD_BASE), "a unigram or a word, never both"
    assert all(t < CJK_BASE for t in term_counts("antidisestablishmentarianism", tokenizer))
    assert CJK_BASE + 0x10FFFF < WORD_BASE and word_id("") >= WORD_BASE
    assert all(WORD_BASE <= word_id(w) < BIGRAM_BASE for w in ("a", "zzzz", "北", "x" * 500))
    assert max(word_id(str(i)) for i in range(2000)) < 2**31 - 1, "fits the integer[] column"


def test_word_ids_are_the_same_in_another_process():
    """Not Python's hash(): a query in the API server must find rows a Dagster run wrote."""
    words = ["run", "polici", "café"]
    script = (f"from pipelines.domain.lexical import word_id; print([word_id(w) for w in {words!r}])")
    out = subprocess.run([sys.executable, "-c", script], cwd=ROOT, capture_output=True, text=True, check=True,
                         env={"PYTHONHASHSEED": "12345", "PATH": "/usr/bin:/bin", "PYTHONPATH": str(ROOT)})
    assert out.stdout.strip() == str([word_id(w) for w in words])


def test_the_stemmer_is_injected():
    counts = english_term_counts("Cats and DOGS", lambda words: [w.upper() for w in words])
    assert dict(counts) == {word_id("CATS"): 1, word_id("DOGS"): 1}
    assert not english_term_counts("", lambda words: pytest.fail("no words: the stemmer is not called"))


def test_the_analyzer_is_a_checked_profile_parameter():
    assert ANALYZERS == ("wordpiece", "english") and LexicalParams().analyzer == "english"
    assert LexicalParams.of({"lexical_analyzer": "english"}).analyzer == "english"
    assert LexicalParams.of({}).analyzer == "wordpiece", "a row from before migration 0045"
    with pytest.raises(ValueError, match="analyzer must be one of wordpiece, english"):
        check_params(LexicalParams(analyzer="porter"))
    with pytest.raises(ValueError, match="analyzer"):
        analyzer_for("all-MiniLM-L6-v2", "snowball")
    wordpiece = profile_analyzer({"model": "all-MiniLM-L6-v2"})
    assert all(t < CJK_BASE for t in wordpiece("running runs")), "the default stays word pieces"
    assert profile_analyzer({"model": "all-MiniLM-L6-v2", "lexical_analyzer": "english"})("running") == {
        word_id("run"): 1}
