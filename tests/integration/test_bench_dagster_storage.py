"""bench.dagster_storage at CI size: both sides run, and the pooled side opens no connection per call."""

from __future__ import annotations

from bench.dagster_storage.__main__ import render, run


def test_bench_dagster_storage_reports_both_engines_side_by_side(pg_server_url):
    report = run(pg_server_url, 60)
    null, pooled = report["sides"]
    assert (null["name"], pooled["name"]) == ("nullpool", "pooled")
    assert null["connections"] >= 60 and pooled["connections"] <= 2
    assert all(s["wall_seconds"] > 0 and s["client_cpu_seconds"] > 0 for s in report["sides"])
    assert report["nullpool_over_pooled"]["wall_seconds"] > 0
    assert "NullPool / pooled" in render(report)
