"""bench.dagster_storage at CI size: every side runs both workloads, counted at the driver.

The counts are exact, not timings: the pooled storage opens no connection per call, and the storage as
configured now sends fewer statements per call than the pool that tested every checkout and asked the
catalog on every schema check (``pooled, pinged``)."""

from __future__ import annotations

from bench.dagster_storage.__main__ import SIDES, WORKLOADS, per_call, render, run


def test_bench_dagster_storage_reports_every_side_and_workload(pg_server_url):
    report = run(pg_server_url, 60, 10)
    assert [(r["side"], r["workload"]) for r in report["results"]] == [(s, w) for s in SIDES for w in WORKLOADS]
    null = {r["workload"]: r for r in report["results"] if r["side"] == "nullpool"}
    assert null["events"]["connections"] >= 60 and null["ticks"]["connections"] >= 10 * 5
    for r in report["results"]:
        assert r["wall_seconds"] > 0 and r["client_cpu_seconds"] > 0 and r["statements"] > 0
        if r["side"] != "nullpool":
            assert r["connections"] <= 2, r  # the pool's (the counting starts with an empty pool)
    for workload, at_least in (("events", 1.5), ("ticks", 3.0)):
        before, now = (per_call(report, s, workload, "statements") for s in ("pooled, pinged", "kbindex"))
        assert before >= at_least * now, (workload, before, now)
    assert "pooled-pinged over kbindex" in render(report)
