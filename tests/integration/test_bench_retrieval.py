"""bench.retrieval at CI size (issue #35): the tiny small-en fixture through the real publish, index and search
path, every row printed side by side, the profile's own embedder, and the stored index equal to brute force."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from bench.retrieval.__main__ import ROWS, context_report, main, report, row_name, row_order, use_model
from resources.embedder import DEFAULT_MODEL_NAME

EVAL = Path(__file__).resolve().parents[1] / "fixtures" / "eval" / "small-en"


def test_the_bench_prints_every_row_for_the_profiles_model(pg_server_url, monkeypatch, capsys):
    monkeypatch.setenv("KBINDEX_DATABASE_URL", pg_server_url)  # its scratch database goes on the test server
    # The packaged torch model loads in seconds; the default int8 one is built on first use (bench.embed tests it).
    assert main(["--corpus", str(EVAL), "--model", "all-MiniLM-L6-v2", "--max-queries", "12", "--repeats", "0",
                 "--json"]) == 0
    r = json.loads(capsys.readouterr().out)
    assert (r["corpus"], r["model"], r["queries"], r["regression_check"]) == ("small-en", "all-MiniLM-L6-v2", 12, False)
    assert r["analyzers"] == ["wordpiece", "english"], "both lexical analyzers by default, side by side"
    english = [row_name(row, "english") for row in ("lexical", "hybrid-weighted", "hybrid-rrf")]
    assert english == ["lexical-english", "hybrid-weighted-english", "hybrid-rrf-english"]
    assert r["rows"] == row_order(["wordpiece", "english"]) and set(ROWS) | set(english) == set(r["rows"])
    for row in r["rows"]:  # stock BM25 included: bm25s is a test dependency
        assert 0.5 < r[row]["ndcg@10"] <= 1 and 0 < r[row]["recall@10"] <= 1, (row, r[row])
    assert r["profiles"] == {"wordpiece": "bench-wordpiece", "english": "bench"}, "a profile of its own per analyzer"
    assert abs(r["ndcg_gap"]) <= 0.01, "the stored index ranks as the same embedder does in memory"
    printed = report(r)
    assert all(f"  {row} " in printed for row in r["rows"]) and "regression check" not in printed
    assert "regression check" in report({**r, "corpus": "xquad-zh", "regression_check": True})


def test_the_bench_embeds_with_the_default_profiles_model_unless_told(db):
    assert use_model(db, None)["model"] == DEFAULT_MODEL_NAME  # int8: what an install indexes with
    profile = use_model(db, "fake-384")
    assert (profile["model"], profile["is_active"]) == ("fake-384", True)


PEP_SMALL = Path(__file__).resolve().parents[1] / "fixtures" / "eval" / "pep-titles-small"


def test_the_bench_measures_without_and_with_context_side_by_side(pg_server_url, monkeypatch, capsys):
    """The CI-sized round of --context: the same corpus under a plain profile and a context profile (titles
    published as file names reach only the latter), both through the real path, printed side by side."""
    monkeypatch.setenv("KBINDEX_DATABASE_URL", pg_server_url)
    assert main(["--corpus", str(EVAL), "--model", "all-MiniLM-L6-v2", "--max-queries", "12", "--repeats", "0",
                 "--context", "--analyzer", "wordpiece", "--json"]) == 0
    plain, ctx = (json.loads(line) for line in capsys.readouterr().out.splitlines())
    assert (plain["context"], ctx["context"], ctx["titles"]) == (False, True, 40)
    assert plain["bm25-stock"] == {**ctx["bm25-stock"], "p50_ms": plain["bm25-stock"]["p50_ms"],
                                   "p95_ms": plain["bm25-stock"]["p95_ms"]}  # reads the text only
    for r in (plain, ctx):
        assert abs(r["ndcg_gap"]) <= 0.01, "each profile's stored index ranks as its embedder does in memory"
    # The Wikipedia titles (Super_Bowl_50, Oxygen, ...) are in what the context profile embeds: dense moves.
    assert ctx["dense"] != plain["dense"]
    printed = context_report(plain, ctx)
    assert "+context" in printed and all(f"  {row} " in printed for row in ROWS)
    assert "title + headings" in report(ctx) and "title + headings" not in report(plain)


def test_the_pep_titles_fixture_is_hard_for_both_rankers(pg_server_url, monkeypatch, capsys):
    """pep-titles-small (PEP title -> PEP opening text): a CI-sized round of the set keyword matching does not solve."""
    monkeypatch.setenv("KBINDEX_DATABASE_URL", pg_server_url)
    assert main(["--corpus", str(PEP_SMALL), "--model", "all-MiniLM-L6-v2", "--repeats", "0", "--json"]) == 0
    r = json.loads(capsys.readouterr().out)
    assert (r["corpus"], r["paragraphs"], r["queries"], r["titles"]) == ("pep-titles-small", 51, 50, 0)
    for row in ROWS:
        assert 0.3 < r[row]["ndcg@10"] < 0.97, (row, r[row])


def test_the_bench_takes_one_analyzer_or_a_list_and_refuses_an_unknown_one(pg_server_url, monkeypatch, capsys):
    monkeypatch.setenv("KBINDEX_DATABASE_URL", pg_server_url)
    assert main(["--corpus", str(EVAL), "--model", "fake-384", "--max-queries", "3", "--repeats", "0", "--json",
                 "--analyzer", "english"]) == 0
    r = json.loads(capsys.readouterr().out)
    assert r["analyzers"] == ["english"] and "lexical" not in r and "lexical-english" in r and "dense" in r
    with pytest.raises(SystemExit):
        main(["--corpus", str(EVAL), "--analyzer", "wordpiece,porter"])
    assert "porter" in capsys.readouterr().err


def test_the_reranked_row_goes_through_the_profiles_http_reranker(pg_server_url, monkeypatch, capsys):
    """--rerank-url: the last analyzer's profile gets the reranker as `kbindex profile rerank` sets it, and the
    reranked row is search's hybrid reordered by it (the fake provider: word overlap); its failures are counted."""
    from bench.fake_embedding_server import FakeEmbeddingServer

    monkeypatch.setenv("KBINDEX_DATABASE_URL", pg_server_url)
    with FakeEmbeddingServer(schedule={2: "unavailable", 3: "unavailable"}) as server:
        assert main(["--corpus", str(EVAL), "--model", "fake-384", "--max-queries", "8", "--repeats", "0", "--json",
                     "--analyzer", "english", "--rerank-url", server.url, "--rerank-model", "fake-rerank",
                     "--rerank-candidates", "20"]) == 0
        r = json.loads(capsys.readouterr().out)
        sent = [rec for rec in server.records if rec.get("kind") == "rerank"]
    assert r["rows"][-1] == "reranked" and 0 < r["reranked"]["ndcg@10"] <= 1
    assert r["rerank"] == {"row": "reranked", "analyzer": "english", "url": server.url, "model": "fake-rerank", "candidates": 20,
                           "failed_queries": 1}, "the second query's rerank failed after its retries: counted"
    assert len({rec["query"] for rec in sent}) == 8, "each of the 8 queries (the untimed warm-up repeats the first)"
    assert "rerank failed on 1 of 8 queries" in report(r)
    assert "reranked: not measured" in report({**r, "rerank": None})
