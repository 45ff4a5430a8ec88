"""bench.scale.small_docs turns corpus paragraphs into distinct one-paragraph documents."""

import pytest

from bench.scale.small_docs import paragraph_documents, per_version_seconds


def _corpus(tmp_path, paragraphs):
    (tmp_path / "en-sotu").mkdir()
    (tmp_path / "en-peps").mkdir()
    (tmp_path / "en-sotu" / "a.txt").write_text("\n\n".join(paragraphs))
    return tmp_path


def test_paragraphs_become_distinct_documents(tmp_path):
    long = [f"Paragraph {i} " + "word " * 60 for i in range(6)]
    corpus = _corpus(tmp_path, [*long, long[0], "too short"])  # a duplicate and a short one are left out
    docs = paragraph_documents(corpus, 6)
    assert len(docs) == 6 and len({body for _, body in docs}) == 6
    assert all(200 <= len(body) <= 2000 for _, body in docs)


def test_too_few_paragraphs_is_an_error_not_a_smaller_bench(tmp_path):
    corpus = _corpus(tmp_path, ["word " * 60, "other " * 60])
    with pytest.raises(ValueError, match="only 2 paragraphs"):
        paragraph_documents(corpus, 3)


def test_step_seconds_are_spread_over_the_versions():
    assert per_version_seconds({"step_seconds": {"parse": [1.0, 3.0]}}, 8) == {"parse": 0.5}
