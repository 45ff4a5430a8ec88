"""bench.scale.small_docs at CI size: 20 one-paragraph documents, 3 interleaved passes of pipeline (the real
``dagster dev``, fake model), bare encode and bare system; the report has both ratios with their spread, and
the bare system's database ends each pass with the pipeline's chunks, lexical rows, postings and pointers."""

from __future__ import annotations

import json

import pytest

# A soak round: tests/acceptance/test_bench_pipeline_smoke.py runs the same passes and floors in the default run.
pytestmark = [pytest.mark.slow, pytest.mark.soak]


@pytest.mark.timeout(300)
def test_small_docs_reports_both_floors_over_three_passes_on_equal_work(pg_server_url, tmp_path, monkeypatch, capsys):
    from bench.scale.small_docs import main

    corpus = tmp_path / "corpus"
    (corpus / "en-sotu").mkdir(parents=True)
    (corpus / "en-peps").mkdir()
    words = "refund invoice travel hotel contract retention employee approval budget audit".split()
    paragraphs = [f"Paragraph {i}: " + " ".join(words[(i + j) % len(words)] for j in range(50)) for i in range(24)]
    (corpus / "en-sotu" / "a.txt").write_text("\n\n".join(paragraphs))
    monkeypatch.setenv("KBINDEX_DATABASE_URL", pg_server_url)
    report_path = tmp_path / "small.json"
    assert main(["--corpus", str(corpus), "--docs", "20", "--fake-model", "--passes", "3", "--timeout", "150",
                 "--json", str(report_path)]) == 0
    printed = capsys.readouterr().out
    assert "pipeline / bare encode" in printed and "pipeline / bare system" in printed
    assert "equal work           yes" in printed
    report = json.loads(report_path.read_text())
    passes, floor = report["passes"], report["floor"]
    assert len(passes) == floor["passes"] == 3
    for key in ("ratio_encode", "ratio_system"):
        r = floor[key]
        assert len(r["values"]) == 3 and r["min"] <= r["median"] <= r["max"] and r["median"] > 0
    for p in passes:
        assert p["throughput"]["final_states"] == {"SUCCEEDED": 20}
        pipeline_rows, bare_rows = p["rows"]["pipeline"], p["rows"]["bare_system"]
        assert pipeline_rows == bare_rows  # equal work on both sides
        assert bare_rows["pointers"] == 20 and bare_rows["chunks"] == p["throughput"]["chunks"] == p["bare_system"]["chunks"]
        assert set(p["bare_system"]["core_seconds"]) == {"encode", "PostgreSQL", "client"}
        assert p["bare_encode"]["chunks"] == p["distinct_texts"]
        parts = p["throughput"]["dagster_parts"]  # where Dagster's core-seconds went: the runs ran in forked children
        assert parts["run processes"] > 0 and "daemon" in parts and "code server" in parts
        assert abs(sum(parts.values()) - p["throughput"]["cpu_seconds"]["Dagster"]) < 0.2
        assert abs(sum(p["idle_dagster_parts"].values()) - p["idle_during_bare"]["Dagster"]) < 0.2
    assert "Dagster by part      run processes" in printed
    assert floor["equal_work"]
