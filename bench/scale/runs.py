"""What one claiming tick and one indexing run cost on the Dagster side, as the partition key set grows.

``python -m bench.scale.runs [--keys 1000,100000] [--versions 30]`` starts a throwaway PostgreSQL, a
Dagster instance stored in it (as in production), and for each key count: adds that many dynamic
partition keys (older versions of a large corpus), publishes ``--versions`` fresh documents, runs one
claiming-sensor tick and then the run it requested in process (fake embedder: this measures the
Dagster and kbindex overhead, not the model). It prints the seconds of each and their ratio to the
smallest key count, side by side. A flat ratio (~1.0) is the target: nothing per tick or per run may
grow with the corpus (issue #14). The small-size round runs in the suite
(tests/integration/test_bench_scale_runs.py).
"""

from __future__ import annotations

import argparse
import os
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

import psycopg
from psycopg import sql as pgsql

ADD_BATCH = 10_000


@dataclass
class Round:
    keys: int
    seed_seconds: float
    tick_seconds: float
    run_seconds: float
    succeeded: int


def measure(admin_url: str, keys: int, versions: int, workdir: Path) -> Round:
    """One round on fresh databases: ``keys`` existing partition keys, ``versions`` fresh publishes."""
    import dagster as dg

    from pipelines import sensors
    from pipelines.assets import indexing_assets
    from pipelines.cli.dev_command import psycopg2_url
    from pipelines.partitions import VERSIONS_PARTITIONS_NAME
    from resources.blob_store import BlobStore
    from resources.dagster_resources import DatabaseResource, default_resources
    from resources.database import Database
    from resources.local_postgres import with_database
    from resources.migrations import migrate
    from resources.publisher import Publisher

    kb, dg_db = f"kb_{keys}", f"dg_{keys}"
    with psycopg.connect(admin_url, autocommit=True) as conn:
        for name in (kb, dg_db):
            conn.execute(pgsql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(pgsql.Identifier(name)))
            conn.execute(pgsql.SQL("CREATE DATABASE {}").format(pgsql.Identifier(name)))
    kb_url = with_database(admin_url, kb)
    migrate(kb_url)
    with psycopg.connect(kb_url, autocommit=True) as conn:
        conn.execute("UPDATE index_profile SET model = 'fake-384' WHERE is_active")
    os.environ.update(KBINDEX_DATABASE_URL=kb_url, KBINDEX_BLOB_URL=str(workdir / f"blobs-{keys}"),
                      KBINDEX_ARTIFACTS=str(workdir / f"artifacts-{keys}"), KBINDEX_HOME=str(workdir / "home"))
    overrides = {"storage": {"postgres": {"postgres_url": psycopg2_url(with_database(admin_url, dg_db))}}}
    with dg.instance_for_test(overrides=overrides) as instance:
        started = time.perf_counter()
        for start in range(0, keys, ADD_BATCH):  # the older versions of a large corpus
            batch = [f"old/doc-{i}/v1" for i in range(start, min(keys, start + ADD_BATCH))]
            instance.add_dynamic_partitions(VERSIONS_PARTITIONS_NAME, batch)
        seed_seconds = time.perf_counter() - started
        db = Database(kb_url)
        try:
            publisher = Publisher(db, BlobStore(os.environ["KBINDEX_BLOB_URL"]))
            for i in range(versions):
                body = "\n\n".join(f"Doc {i} paragraph {p}: refunds, travel and invoices." for p in range(6))
                publisher.publish("acme", f"fresh-{i}.txt", body.encode(), f"fresh-{i}.txt")
            started = time.perf_counter()
            with dg.build_sensor_context(instance=instance,
                                         resources={"database": DatabaseResource(url=kb_url)}) as ctx:
                result = sensors.claim_index_tasks(ctx)
            for request in result.dynamic_partitions_requests:
                instance.add_dynamic_partitions(VERSIONS_PARTITIONS_NAME, list(request.partition_keys))
            tick_seconds = time.perf_counter() - started
            started = time.perf_counter()
            for request in result.run_requests:
                dg.materialize(indexing_assets, resources=default_resources(), instance=instance,
                               tags=dict(request.tags), partition_key=request.partition_key, raise_on_error=False)
            run_seconds = time.perf_counter() - started
            succeeded = db.fetch_one("task_stats", {"now": None})["succeeded"]
        finally:
            db.close()
    return Round(keys, seed_seconds, tick_seconds, run_seconds, int(succeeded))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--keys", default="1000,100000", help="comma-separated existing partition key counts")
    parser.add_argument("--versions", type=int, default=30, help="fresh versions per round (one tick, its runs)")
    args = parser.parse_args(argv)
    counts = [int(k) for k in args.keys.split(",")]
    from resources.local_postgres import temporary_server

    rounds: list[Round] = []
    with temporary_server("kbindex-bench-scale-", external_env="KBINDEX_BENCH_DATABASE_URL") as admin_url, \
            tempfile.TemporaryDirectory(prefix="kb-scale-") as tmp:
        for keys in counts:
            print(f"round: {keys:,} existing keys ...", flush=True)
            rounds.append(measure(admin_url, keys, args.versions, Path(tmp)))
    base = rounds[0]
    print(f"\n{'keys':>10} {'seed s':>8} {'tick s':>8} {'run s':>8} {'tick x':>7} {'run x':>7} {'ok':>4}")
    for r in rounds:
        print(f"{r.keys:>10,} {r.seed_seconds:>8.2f} {r.tick_seconds:>8.2f} {r.run_seconds:>8.2f} "
              f"{r.tick_seconds / base.tick_seconds:>7.2f} {r.run_seconds / base.run_seconds:>7.2f} {r.succeeded:>4}")
    return 0 if all(r.succeeded == args.versions for r in rounds) else 1


if __name__ == "__main__":
    raise SystemExit(main())
