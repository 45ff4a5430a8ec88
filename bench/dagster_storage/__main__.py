"""Dagster's event writes and polls with dagster_postgres' NullPool engines vs kbindex's pooled ones.

``python -m bench.dagster_storage [--events 1000]`` starts a throwaway PostgreSQL and, on one fresh
database per side, does what a run and the daemon do to Dagster's storage: store ``--events`` log
events of a run and read runs and instigator states after every tenth. It prints each side's wall
time, its own CPU and PostgreSQL's (the server's process tree, backends included), the connections
opened, and the ratios, side by side (resources/dagster_storage.py says why it matters).
"""

from __future__ import annotations

import argparse
import logging
import time
import uuid
from dataclasses import dataclass
from typing import Any

import psycopg
from psycopg import sql as pgsql
from sqlalchemy import event

from bench.cpu import postgres_pid, tree_seconds


@dataclass
class Side:
    name: str
    wall_seconds: float
    client_cpu_seconds: float
    postgres_cpu_seconds: float
    connections: int


def _storages(kind: str, url: str) -> Any:
    if kind == "pooled":
        import os

        from resources.dagster_storage import KbindexDagsterStorage

        os.environ["DAGSTER_PG_URL"] = url
        return KbindexDagsterStorage()
    from dagster_postgres import DagsterPostgresStorage

    return DagsterPostgresStorage(postgres_url=url)


def _work(storage: Any, events: int) -> None:
    from dagster._core.events.log import EventLogEntry

    run_id = str(uuid.uuid4())
    for i in range(events):
        storage.event_log_storage.store_event(EventLogEntry(
            error_info=None, level=logging.INFO, user_message=f"event {i}", run_id=run_id,
            timestamp=time.time(), step_key="search_index", job_name="index_versions", dagster_event=None,
        ))
        if i % 10 == 0:  # the daemon's and the run's reads between writes
            storage.run_storage.get_runs(limit=1)
            storage.schedule_storage.all_instigator_state()


def measure(kind: str, admin_url: str, events: int) -> Side:
    from resources.local_databases import psycopg2_url
    from resources.local_postgres import with_database

    name = f"bench_dagster_storage_{kind}"
    with psycopg.connect(admin_url, autocommit=True) as conn:
        conn.execute(pgsql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(pgsql.Identifier(name)))
        conn.execute(pgsql.SQL("CREATE DATABASE {}").format(pgsql.Identifier(name)))
    try:
        url = psycopg2_url(with_database(admin_url, name))
        storage = _storages(kind, url)
        opened = [0]
        for part in (storage.event_log_storage, storage.run_storage, storage.schedule_storage):
            event.listen(part._engine, "connect", lambda *_: opened.__setitem__(0, opened[0] + 1))  # noqa: SLF001
        _work(storage, 20)  # warm: tables exist, imports done
        server = postgres_pid(admin_url)
        pg0, cpu0, wall0, opened[0] = tree_seconds(server) if server else 0.0, time.process_time(), time.perf_counter(), 0
        _work(storage, events)
        return Side(kind, time.perf_counter() - wall0, time.process_time() - cpu0,
                    (tree_seconds(server) - pg0) if server else 0.0, opened[0])
    finally:
        with psycopg.connect(admin_url, autocommit=True) as conn:
            conn.execute(pgsql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(pgsql.Identifier(name)))


def run(admin_url: str, events: int) -> dict[str, Any]:
    null, pooled = measure("nullpool", admin_url, events), measure("pooled", admin_url, events)
    ratio = {field: round(getattr(null, field) / getattr(pooled, field), 2) if getattr(pooled, field) else None
             for field in ("wall_seconds", "client_cpu_seconds", "postgres_cpu_seconds")}
    return {"events": events, "sides": [null.__dict__, pooled.__dict__], "nullpool_over_pooled": ratio}


def render(report: dict[str, Any]) -> str:
    lines = [f"{report['events']} events stored (+ a runs and instigator read every 10th)",
             f"{'engine':<10} {'wall s':>8} {'client CPU s':>13} {'PostgreSQL CPU s':>17} {'connections':>12}"]
    for s in report["sides"]:
        lines.append(f"{s['name']:<10} {s['wall_seconds']:>8.2f} {s['client_cpu_seconds']:>13.2f} "
                     f"{s['postgres_cpu_seconds']:>17.2f} {s['connections']:>12}")
    r = report["nullpool_over_pooled"]
    lines.append(f"NullPool / pooled: wall {r['wall_seconds']}x, client CPU {r['client_cpu_seconds']}x, "
                 f"PostgreSQL CPU {r['postgres_cpu_seconds']}x")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.dagster_storage", description=__doc__.splitlines()[0])
    parser.add_argument("--events", type=int, default=1000)
    args = parser.parse_args(argv)
    from resources.local_postgres import temporary_server

    with temporary_server("kbindex-bench-dgstore-", external_env="KBINDEX_DATABASE_URL") as admin_url:
        print(render(run(admin_url, args.events)))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
