"""CI-sized round of bench.scale.vector_placement: the same corpus in two databases, chunk vectors out of line in
one (pgvector's STORAGE external) and in their rows in the other (migration 0051), the product's search paths
measured against both. Timings are the bench's business; this checks the two sides are what they claim."""

import json

from bench.scale.vector_placement import main


def test_vector_placement_bench_runs_small(tmp_path, capsys):
    report = tmp_path / "placement.json"
    assert main(["--chunks", "3000", "--queries", "5", "--tenants", "t-mid,t-small", "--json", str(report)]) == 0
    out = capsys.readouterr().out
    data = json.loads(report.read_text())
    out_of_line, inline = data["placement"]["out of line"], data["placement"]["inline"]
    assert out_of_line["chunks"] == inline["chunks"] >= 2900, "the same corpus on both sides"
    assert out_of_line["avg_text_chars"] == inline["avg_text_chars"] == 1000
    assert out_of_line["out_of_line"] == out_of_line["chunks"], "pgvector's placement moves every vector out"
    assert inline["out_of_line"] == 0, "migration 0051 keeps every vector in its row"
    assert inline["toast_bytes"] < out_of_line["toast_bytes"]
    rows = data["results"]
    assert {(r["tenant"], r["mode"]) for r in rows if r["setting"] == "product" and r["scope"] == "all"} == {
        (t, m) for t in ("t-mid", "t-small") for m in ("dense", "hybrid", "lexical")}
    for r in rows:
        for side in ("out of line", "inline"):
            assert r[side]["p50_ms"] > 0
        if r["exact_path"]:
            assert r["answers_differ"] == 0, r
            assert r["inline"]["recall_at_10"] == r["out of line"]["recall_at_10"] == 1.0, r
    assert "exact-path answers that differ between the two databases: 0" in out
