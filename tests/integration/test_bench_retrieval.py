"""bench.retrieval at CI size (issue #35): the tiny small-en fixture through the real publish, index and search
path, every row printed side by side, the profile's own embedder, and the stored index equal to brute force."""

from __future__ import annotations

import json
from pathlib import Path

from bench.retrieval.__main__ import ROWS, main, report, use_model
from resources.embedder import DEFAULT_MODEL_NAME

EVAL = Path(__file__).resolve().parents[1] / "fixtures" / "eval" / "small-en"


def test_the_bench_prints_every_row_for_the_profiles_model(pg_server_url, monkeypatch, capsys):
    monkeypatch.setenv("KBINDEX_DATABASE_URL", pg_server_url)  # its scratch database goes on the test server
    # The packaged torch model loads in seconds; the default int8 one is built on first use (bench.embed tests it).
    assert main(["--corpus", str(EVAL), "--model", "all-MiniLM-L6-v2", "--max-queries", "12", "--repeats", "0",
                 "--json"]) == 0
    r = json.loads(capsys.readouterr().out)
    assert (r["corpus"], r["model"], r["queries"], r["regression_check"]) == ("small-en", "all-MiniLM-L6-v2", 12, False)
    for row in ROWS:  # stock BM25 included: bm25s is a test dependency
        assert 0.5 < r[row]["ndcg@10"] <= 1 and 0 < r[row]["recall@10"] <= 1, (row, r[row])
    assert abs(r["ndcg_gap"]) <= 0.01, "the stored index ranks as the same embedder does in memory"
    printed = report(r)
    assert all(f"  {row} " in printed for row in ROWS) and "regression check" not in printed
    assert "regression check" in report({**r, "corpus": "xquad-zh", "regression_check": True})


def test_the_bench_embeds_with_the_default_profiles_model_unless_told(db):
    assert use_model(db, None)["model"] == DEFAULT_MODEL_NAME  # int8: what an install indexes with
    profile = use_model(db, "fake-384")
    assert (profile["model"], profile["is_active"]) == ("fake-384", True)
