"""A burst of publishes into an index that already holds many versions, vs the same burst on an empty one.

``python -m bench.scale.burst [--seeded 100000] [--burst 1000] [--live-keys 10000] [--chunks 2]``

Nothing per tick or per run may grow with the corpus (issue #14): the target is a throughput ratio
>= 0.9. Two rounds, side by side in one run, each on fresh databases:

1. **empty**: a freshly migrated index;
2. **seeded**: ``--seeded`` versions already indexed, in a tenant of their own (documents, versions,
   SUCCEEDED tasks with their last event, search pointers, ``--chunks`` chunks each with random
   vectors in the product's HNSW graph), built set-based in SQL (seconds, not hours), and the
   Dagster key state pruning leaves behind: only the newest ``--live-keys`` versions (the lineage
   window) still have partition keys, recorded as the claiming sensor records them.

Then the same ``--burst`` generated documents are published as fast as possible and indexed by the
real path: ``dagster dev`` with the repository's dagster.yaml (claiming sensor, queued runs, run
processes), fake embedder (this measures kbindex and Dagster, not the model). Throughput is
versions per second from the first publish to the last terminal task (database clock).
The CI-sized round is tests/integration/test_bench_scale_burst.py.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import psycopg
from psycopg.rows import dict_row

from sql import queries

TENANT = "bench"  # bench.pipeline.Bench publishes and measures the burst in this tenant
SEED_TENANT = "seeded"  # the already indexed versions: Bench's per-tenant figures must not count them


def seed_index(kb_url: str, dg_url: str, versions: int, chunks: int, live_keys: int, out: Any) -> dict[str, float]:
    """``versions`` indexed versions of SEED_TENANT and the pruned Dagster key state; seconds per phase."""
    import dagster as dg

    from pipelines.cli.dev_command import psycopg2_url
    from pipelines.partitions import VERSIONS_PARTITIONS_NAME
    from resources.database import Database
    from resources.partition_keys import record_added

    timings: dict[str, float] = {}
    params = {"tenant": SEED_TENANT, "versions": versions, "chunks": chunks}
    with psycopg.connect(kb_url, autocommit=True) as conn:
        for name in ("bench_scale_seed_documents", "bench_scale_seed_versions", "bench_scale_seed_tasks",
                     "bench_scale_seed_events", "bench_scale_seed_pointers", "bench_scale_drop_hnsw",
                     "bench_scale_seed_chunks", "bench_scale_build_memory", "bench_scale_build_hnsw",
                     "bench_scale_analyze", "bench_scale_checkpoint"):
            started = time.perf_counter()
            conn.execute(queries[name], params)
            timings[name.removeprefix("bench_scale_")] = round(time.perf_counter() - started, 2)
            out(f"  {name.removeprefix('bench_scale_'):<14} {timings[name.removeprefix('bench_scale_')]:7.2f} s")
        keys = [r[0] for r in conn.execute(queries["bench_scale_live_keys"], {**params, "count": live_keys})][::-1]
    started = time.perf_counter()
    overrides = {"storage": {"postgres": {"postgres_url": psycopg2_url(dg_url)}}}
    with dg.instance_for_test(overrides=overrides) as instance:
        for first in range(0, len(keys), 10_000):
            instance.add_dynamic_partitions(VERSIONS_PARTITIONS_NAME, keys[first : first + 10_000])
    db = Database(kb_url)
    try:
        record_added(db, keys)
    finally:
        db.close()
    timings["dagster_keys"] = round(time.perf_counter() - started, 2)
    return timings


def index_counts(kb_url: str) -> dict[str, dict[str, int]]:
    """What the round left in the index, per tenant (bench_scale_index_counts)."""
    with psycopg.connect(kb_url) as conn:
        cur = conn.cursor(row_factory=dict_row)
        return {tenant: dict(cur.execute(queries["bench_scale_index_counts"], {"tenant": tenant}).fetchone() or {})
                for tenant in (TENANT, SEED_TENANT)}


def consistency(report: dict[str, Any], *, burst: int, seeded: int, chunks: int) -> list[str]:
    """Why the two rounds did not do the same work (empty: they did): every burst version SUCCEEDED and
    pointed in both rounds, the same chunks and lexical rows written, the seeded tenant intact (and absent
    from the empty round). A ratio of rounds that did different work measures nothing."""
    problems: list[str] = []
    empty, full = report["rounds"]
    for r in report["rounds"]:
        t, mine = r["throughput"], r["index"][TENANT]
        if t["final_states"] != {"SUCCEEDED": burst}:
            problems.append(f"{r['round']}: final states {t['final_states']}, not {burst} SUCCEEDED")
        if mine["pointers"] != burst or mine["unfinished"]:
            problems.append(f"{r['round']}: {mine['pointers']} search pointers for {burst} versions,"
                            f" {mine['unfinished']} tasks not SUCCEEDED")
        if mine["chunks"] != t["chunks"] or mine["lexical_chunks"] != mine["chunks"]:
            problems.append(f"{r['round']}: {mine['chunks']} chunks and {mine['lexical_chunks']} lexical rows,"
                            f" tasks say {t['chunks']}")
    if empty["index"][TENANT] != full["index"][TENANT]:
        problems.append(f"the rounds wrote different indexes: {empty['index'][TENANT]} vs {full['index'][TENANT]}")
    if empty["index"][SEED_TENANT] != {"pointers": 0, "chunks": 0, "lexical_chunks": 0, "unfinished": 0}:
        problems.append(f"the empty round holds seeded rows: {empty['index'][SEED_TENANT]}")
    seed = full["index"][SEED_TENANT]
    if seed["pointers"] != seeded or seed["chunks"] != seeded * chunks or seed["unfinished"]:
        problems.append(f"the seeded tenant changed during the burst: {seed} (seeded {seeded} x {chunks} chunks)")
    return problems


def burst_round(label: str, docs: list[tuple[str, bytes]], *, seeded: int, chunks: int, live_keys: int,
                timeout: float, out: Any, admin_url: str | None = None) -> dict[str, Any]:
    """One round on fresh databases: seed (unless ``seeded`` is 0), start Dagster, time the burst."""
    from contextlib import nullcontext

    from bench import server_url
    from bench.pipeline.__main__ import Bench, dagster_dev, scratch_databases

    result: dict[str, Any] = {"round": label, "seeded": seeded}
    with (nullcontext(admin_url) if admin_url else server_url()) as admin, \
            scratch_databases(admin) as (kb_url, dg_url):
        with psycopg.connect(kb_url, autocommit=True) as conn:
            conn.execute(queries["bench_set_active_model"], {"model": "fake-384"})
        if seeded:
            out(f"seeding {seeded:,} indexed versions ({chunks} chunks each), {live_keys:,} live partition keys…")
            result["seed_seconds"] = seed_index(kb_url, dg_url, seeded, chunks, live_keys, out)
        root = Path(tempfile.mkdtemp(prefix="kbindex-bench-burst-"))
        dagster = dagster_dev(kb_url, dg_url, root)
        bench = Bench(kb_url, dg_url, dagster, out)
        try:
            dagster.start()
            dagster.wait_ready()
            bench.warm_up(300.0)
            t = bench.throughput(docs, timeout)
            t["dagster"] = bench.runs(TENANT)
            result["index"] = index_counts(kb_url)
        finally:
            dagster.stop()
            bench.close()
            shutil.rmtree(root, ignore_errors=True)
    result.update(throughput=t, versions_per_second=round(t["succeeded_docs"] / t["wall_seconds"], 2))
    return result


def run(*, seeded: int, burst: int, live_keys: int, chunks: int, timeout: float = 1800.0,
        out: Any = print, admin_url: str | None = None) -> dict[str, Any]:
    """Both rounds; ``admin_url`` is a PostgreSQL to create the scratch databases in (else bench.server_url)."""
    from bench.pipeline.__main__ import generated_documents

    docs = generated_documents(burst)
    rounds = [burst_round("empty", docs, seeded=0, chunks=chunks, live_keys=0, timeout=timeout, out=out,
                          admin_url=admin_url),
              burst_round("seeded", docs, seeded=seeded, chunks=chunks, live_keys=min(live_keys, seeded),
                          timeout=timeout, out=out, admin_url=admin_url)]
    empty, full = rounds
    ratio = full["versions_per_second"] / empty["versions_per_second"] if empty["versions_per_second"] else 0.0
    report = {"burst": burst, "rounds": rounds, "ratio": round(ratio, 3)}
    report["problems"] = consistency(report, burst=burst, seeded=seeded, chunks=chunks)
    return report


def render(report: dict[str, Any]) -> str:
    lines = [f"{'round':<8} {'seeded':>9} {'ok':>5} {'wall s':>7} {'versions/s':>10} {'runs':>5} {'median run s':>12}"]
    for r in report["rounds"]:
        t = r["throughput"]
        lines.append(f"{r['round']:<8} {r['seeded']:>9,} {t['succeeded_docs']:>5} {t['wall_seconds']:>7.1f} "
                     f"{r['versions_per_second']:>10.2f} {t['dagster']['runs']:>5} {t['dagster']['run_seconds_median']!s:>12}")
    lines.append(f"throughput ratio seeded/empty {report['ratio']}  (target >= 0.9)")
    work = {r["round"]: r["index"][TENANT] for r in report["rounds"]}
    lines.append("work per round: " + "; ".join(f"{k}: {v['pointers']} pointers, {v['chunks']} chunks, "
                                                f"{v['lexical_chunks']} lexical rows" for k, v in work.items()))
    if report["problems"]:
        lines.extend(f"NOT COMPARABLE: {p}" for p in report["problems"])
    else:
        lines.append("same work on both sides: every version SUCCEEDED and pointed, same chunks, seeded tenant intact")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.scale.burst", description=__doc__.splitlines()[0])
    parser.add_argument("--seeded", type=int, default=100_000, help="versions already indexed")
    parser.add_argument("--burst", type=int, default=1000, help="documents published in the burst")
    parser.add_argument("--live-keys", type=int, default=10_000,
                        help="seeded versions that still have a Dagster partition key (the lineage window)")
    parser.add_argument("--chunks", type=int, default=2, help="chunks per seeded version")
    parser.add_argument("--timeout", type=float, default=1800.0)
    parser.add_argument("--json", type=Path, default=None)
    args = parser.parse_args(argv)
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
    report = run(seeded=args.seeded, burst=args.burst, live_keys=args.live_keys, chunks=args.chunks,
                 timeout=args.timeout, out=lambda line: print(line, flush=True))
    print(render(report))
    if args.json:
        args.json.write_text(json.dumps(report, indent=2, default=str))
    return 1 if report["problems"] else 0


if __name__ == "__main__":
    sys.exit(main())
