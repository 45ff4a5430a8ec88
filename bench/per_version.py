"""What each document version pays in one run, counted (not timed), at two run sizes side by side.

``python -m bench.per_version [--sizes 50,500] [--json out.json]``

For each size N it starts on fresh databases (a throwaway PostgreSQL; Dagster's storage in it, as in
production), publishes N one-paragraph documents, claims them all and runs them as ONE in-process run
(``dg.materialize`` over the key range, fake embedder: this counts the pipeline's writes, not the model).
Then it counts, divided by N:

- Dagster event-log rows written by the run, by event type, plus ``asset_event_tags`` rows;
- ``task_event`` rows by kind (progress rows are the fenced progress writes the task view shows) and the
  queue's progress statements (``task_progress_many`` calls, whatever their row count);
- kbindex statements by name over the whole run, and the statements inside the fenced publish
  transactions (``IndexSink._transaction``);
- and, for orientation only, the run's wall milliseconds per version (``run_ms``: one sample, on a shared
  machine; the counts are the figures to compare).

A per-version figure that is the same at both sizes is a fixed cost per version; one that grows with N is a
cost per run that grows faster than its work (what keeps runs from holding thousands of small versions).
tests/acceptance/test_per_version_costs.py pins the figures at a small N.
"""

from __future__ import annotations

import argparse
import json
import os
import tempfile
import time
from collections import Counter
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import psycopg

from sql import queries


@dataclass
class Counts:
    versions: int
    succeeded: int = 0
    dagster_events: Counter = field(default_factory=Counter)
    asset_event_tags: int = 0
    dagster_event_bytes: int = 0
    run_seconds: float = 0.0
    metadata_labels: set = field(default_factory=set)
    """The metadata labels of the run's materializations (all assets)."""
    task_events: Counter = field(default_factory=Counter)
    statements: Counter = field(default_factory=Counter)
    publish_statements: Counter = field(default_factory=Counter)

    def per_version(self) -> dict[str, Any]:
        n = max(1, self.versions)

        def per(counter: Counter) -> dict[str, float]:
            return {k: round(v / n, 3) for k, v in sorted(counter.items())}

        return {
            "versions": self.versions, "succeeded": self.succeeded,
            "dagster_event_rows": round(sum(self.dagster_events.values()) / n, 3),
            "dagster_events_by_type": per(self.dagster_events),
            "asset_event_tags_rows": round(self.asset_event_tags / n, 3),
            "dagster_event_bytes": round(self.dagster_event_bytes / n),
            "run_ms": round(1000 * self.run_seconds / n, 1),
            "task_event_rows": round(sum(self.task_events.values()) / n, 3),
            "task_events_by_kind": per(self.task_events),
            "progress_rows": round(self.task_events.get("progress", 0) / n, 3),
            "progress_statements": round(self.statements.get("task_progress_many", 0) / n, 3),
            "kb_statements": round(sum(self.statements.values()) / n, 3),
            "kb_statements_by_name": per(self.statements),
            "publish_tx_statements": round(sum(self.publish_statements.values()) / n, 3),
            "publish_tx_by_name": per(self.publish_statements),
        }


@contextmanager
def counting_statements(counts: Counts) -> Iterator[None]:
    """Count every named statement run through ``resources.database.Session`` (and those inside the publish
    transaction separately) while the context is open."""
    from resources import database, index_sink

    run, execute_many, transaction = database.Session._run, database.Session.execute_many, \
        index_sink.IndexSink._transaction
    in_publish = {"on": False}

    def counted(name: str) -> None:
        counts.statements[name] += 1
        if in_publish["on"]:
            counts.publish_statements[name] += 1

    def _run(self, name, params):  # type: ignore[no-untyped-def]
        counted(name)
        return run(self, name, params)

    def _execute_many(self, name, rows):  # type: ignore[no-untyped-def]
        counted(name)
        return execute_many(self, name, rows)

    def _transaction(self, items):  # type: ignore[no-untyped-def]
        in_publish["on"] = True
        try:
            return transaction(self, items)
        finally:
            in_publish["on"] = False

    database.Session._run, database.Session.execute_many = _run, _execute_many  # type: ignore[method-assign]
    index_sink.IndexSink._transaction = _transaction  # type: ignore[method-assign]
    try:
        yield
    finally:
        database.Session._run, database.Session.execute_many = run, execute_many  # type: ignore[method-assign]
        index_sink.IndexSink._transaction = transaction  # type: ignore[method-assign]


def documents(n: int) -> list[tuple[str, bytes]]:
    return [(f"para-{i:05d}.txt",
             f"Paragraph {i}: refunds for order {i} are paid within {i % 30 + 1} days of the request.".encode())
            for i in range(n)]


def measure_run(kb_url: str, dagster_url: str, n: int, tenant: str = "acme") -> Counts:
    """Publish ``n`` small documents into ``kb_url`` (migrated, fake profile), run them as one run on a Dagster
    instance stored at ``dagster_url`` (psycopg2 URL) and count what the run wrote."""
    import dagster as dg

    from pipelines.assets import indexing_assets
    from pipelines.partitions import VERSIONS_PARTITIONS_NAME
    from resources.blob_store import BlobStore
    from resources.dagster_resources import LEASES_TAG, OWNER_TAG, default_resources, encode_leases
    from resources.database import Database
    from resources.publisher import Publisher
    from resources.task_queue import TaskQueue

    counts = Counts(versions=n)
    db = Database(kb_url)
    try:
        publisher = Publisher(db, BlobStore(os.environ["KBINDEX_BLOB_URL"]))
        for name, body in documents(n):
            publisher.publish(tenant, name, body, name)
        queue = TaskQueue(db, lease_seconds=600)
        owner = "bench-per-version"
        claimed = queue.claim(owner, limit=n)
        ids = [t.lease.task_id for t in claimed]
        keys = [r["partition_key"] for r in db.fetch_all("document_version_partition_keys", {"task_ids": ids})]
        with psycopg.connect(kb_url) as conn:
            before = {row[0]: row[1] for row in conn.execute(queries["bench_task_events_by_kind"])}
        overrides = {"storage": {"postgres": {"postgres_url": dagster_url}}}
        with dg.instance_for_test(overrides=overrides) as instance:
            instance.add_dynamic_partitions(VERSIONS_PARTITIONS_NAME, keys)
            tags = {LEASES_TAG: encode_leases([(t.lease.task_id, t.lease.attempt) for t in claimed]),
                    OWNER_TAG: owner, "dagster/asset_partition_range_start": keys[0],
                    "dagster/asset_partition_range_end": keys[-1]}
            started = time.perf_counter()
            with counting_statements(counts):
                result = dg.materialize(indexing_assets, resources=default_resources(), instance=instance,
                                        tags=tags, raise_on_error=False)
            counts.run_seconds = time.perf_counter() - started
            run_id = result.run_id
            for asset in indexing_assets:
                for record in instance.fetch_materializations(asset.key, limit=n).records:
                    counts.metadata_labels.update(record.asset_materialization.metadata)
        with psycopg.connect(kb_url) as conn:
            counts.succeeded = conn.execute(queries["bench_tenant_succeeded_count"], {"tenant": tenant}).fetchone()[0]
        with psycopg.connect(kb_url) as conn:
            for kind, c in conn.execute(queries["bench_task_events_by_kind"]):
                if c - before.get(kind, 0):
                    counts.task_events[kind] = c - before.get(kind, 0)
        with psycopg.connect(dagster_url.replace("postgresql+psycopg2://", "postgresql://")) as conn:
            for kind, c in conn.execute(queries["bench_dagster_run_event_types"], {"run_id": run_id}):
                counts.dagster_events[kind or "log"] = c
            counts.dagster_event_bytes = conn.execute(
                queries["bench_dagster_run_event_bytes"], {"run_id": run_id}).fetchone()[0]
            counts.asset_event_tags = conn.execute(
                queries["bench_dagster_run_asset_event_tags"], {"run_id": run_id}).fetchone()[0]
    finally:
        db.close()
    return counts


def measure(admin_url: str, n: int, workdir: Path) -> Counts:
    """``measure_run`` on fresh databases of the server at ``admin_url``."""
    from bench import fresh_fake_model_databases

    kb_url, dagster_url = fresh_fake_model_databases(admin_url, f"pv_kb_{n}", f"pv_dg_{n}", workdir, str(n))
    return measure_run(kb_url, dagster_url, n)


def render(reports: list[dict[str, Any]]) -> str:
    rows = ["versions", "succeeded", "dagster_event_rows", "dagster_event_bytes", "asset_event_tags_rows", "task_event_rows",
            "progress_rows", "progress_statements", "kb_statements", "publish_tx_statements", "run_ms"]
    width = max(len(r) for r in rows) + 2
    lines = [f"{'per version':<{width}}" + "".join(f"{'N=' + str(r['versions']):>12}" for r in reports)]
    for row in rows:
        lines.append(f"{row:<{width}}" + "".join(f"{r[row]:>12}" for r in reports))
    for detail in ("dagster_events_by_type", "task_events_by_kind", "publish_tx_by_name"):
        names = sorted({k for r in reports for k in r[detail]})
        lines.append(f"\n{detail}")
        for name in names:
            lines.append(f"  {name:<{width - 2}}" + "".join(f"{r[detail].get(name, 0):>12}" for r in reports))
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.per_version", description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", default="50,500", help="comma-separated versions per run")
    parser.add_argument("--json", type=Path, default=None)
    args = parser.parse_args(argv)
    from resources.local_postgres import temporary_server

    reports = []
    with temporary_server("kbindex-bench-pv-", external_env="KBINDEX_BENCH_DATABASE_URL") as admin_url, \
            tempfile.TemporaryDirectory(prefix="pv-") as tmp:
        for n in (int(s) for s in args.sizes.split(",")):
            print(f"run of {n} versions ...", flush=True)
            reports.append(measure(admin_url, n, Path(tmp)).per_version())
    print(render(reports))
    if args.json:
        args.json.write_text(json.dumps(reports, indent=2))
    return 0 if all(r["succeeded"] == r["versions"] for r in reports) else 1


if __name__ == "__main__":
    raise SystemExit(main())
