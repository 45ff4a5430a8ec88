"""What Dagster's storage calls cost per engine: dagster_postgres's NullPool, our pool as it was, our pool now.

``python -m bench.dagster_storage [--events 1000] [--ticks 100] [--delay-ms 0]`` starts a throwaway PostgreSQL
and, on one fresh database per side, does what a run and the daemon do to Dagster's storage:

- **events**: store ``--events`` log events of a run, reading runs and instigator states after every tenth;
- **ticks**: ``--ticks`` sensor ticks as the daemon records them (read the sensor's state, create the tick,
  finish it, write the state back, purge old ticks, read the live runs).

Sides, all on the same database server, one after the other:

- ``nullpool``: plain dagster_postgres, a new connection per storage call;
- ``pooled, pinged``: KbindexDagsterStorage as it was (but on one engine), a pool that tests every checkout (``SELECT 1``) and
  Dagster's schema checks asked of the catalog on every call (``ping_after_idle_seconds=0,
  remember_schema_checks=False``);
- ``kbindex``: KbindexDagsterStorage as configured by default (tests only connections idle for
  ``PING_AFTER_IDLE_S``, remembers schema checks).

Per side and workload it prints the statements sent (every one a round trip to PostgreSQL, counted at the
driver, tests and catalog queries included), the connections opened, wall time, the client's CPU and
PostgreSQL's (its process tree). ``--delay-ms N`` sends every side's connections through ``bench/relay.py``
holding each chunk N ms each way (a slow link, no netem needed): wall time then shows what the round trips
cost a daemon far from its database.
"""

from __future__ import annotations

import argparse
import contextlib
import logging
import os
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import psycopg
from psycopg import sql as pgsql
from sqlalchemy import event

from bench.cpu import postgres_pid, tree_seconds

SIDES = ("nullpool", "pooled, pinged", "kbindex")
WORKLOADS = ("events", "ticks")


@dataclass
class Result:
    side: str
    workload: str
    count: int
    statements: int
    connections: int
    wall_seconds: float
    client_cpu_seconds: float
    postgres_cpu_seconds: float


def _storage(side: str, url: str) -> Any:
    if side == "nullpool":
        from dagster_postgres import DagsterPostgresStorage

        return DagsterPostgresStorage(postgres_url=url)
    from resources.dagster_storage import KbindexDagsterStorage

    os.environ["DAGSTER_PG_URL"] = url
    if side == "pooled, pinged":
        return KbindexDagsterStorage(ping_after_idle_seconds=0, remember_schema_checks=False)
    return KbindexDagsterStorage()


def _dispose(storage: Any) -> None:
    for part in (storage.event_log_storage, storage.run_storage, storage.schedule_storage):
        part.dispose()


class Counter:
    """Statements (catalog queries among them) and connections of a storage's engines, counted at the driver,
    connection tests included. Connections opened before it was made are closed, so it sees every one."""

    def __init__(self, storage: Any) -> None:
        import psycopg2.extensions

        self.statements = self.catalog = self.connections = 0
        counter = self

        class CountingCursor(psycopg2.extensions.cursor):
            def execute(self, query: Any, vars: Any = None) -> Any:  # noqa: A002 - psycopg2's name
                counter.statements += 1
                counter.catalog += "pg_catalog" in str(query)
                return super().execute(query, vars)

        def opened(dbapi_connection: Any, _record: Any) -> None:
            counter.connections += 1
            dbapi_connection.cursor_factory = CountingCursor

        parts = (storage.event_log_storage, storage.run_storage, storage.schedule_storage)
        for engine in {id(p._engine): p._engine for p in parts}.values():  # noqa: SLF001 - bench; kbindex's share one
            event.listen(engine, "connect", opened)
            engine.pool.dispose()  # connections opened before counting are replaced

    def reset(self) -> None:
        self.statements = self.catalog = self.connections = 0


def _events(storage: Any, n: int) -> None:
    from dagster._core.events.log import EventLogEntry

    run_id = str(uuid.uuid4())
    for i in range(n):
        storage.event_log_storage.store_event(EventLogEntry(
            error_info=None, level=logging.INFO, user_message=f"event {i}", run_id=run_id,
            timestamp=time.time(), step_key="search_index", job_name="index_versions", dagster_event=None,
        ))
        if i % 10 == 0:  # the daemon's and the run's reads between writes
            storage.run_storage.get_runs(limit=1)
            storage.schedule_storage.all_instigator_state()


def _sensor_state() -> Any:
    from dagster._core.remote_origin import GrpcServerCodeLocationOrigin, RemoteInstigatorOrigin, RemoteRepositoryOrigin
    from dagster._core.scheduler.instigation import (
        InstigatorState,
        InstigatorStatus,
        InstigatorType,
        SensorInstigatorData,
    )

    location = GrpcServerCodeLocationOrigin(host="localhost", port=4000, location_name="bench")
    origin = RemoteInstigatorOrigin(RemoteRepositoryOrigin(location, "__repository__"), "claim_index_tasks")
    return InstigatorState(origin, InstigatorType.SENSOR, InstigatorStatus.RUNNING,
                           SensorInstigatorData(last_tick_timestamp=time.time(), min_interval=1, cursor="0"))


def _ticks(storage: Any, n: int) -> None:
    """The storage calls of a sensor tick, in the daemon's order (sensor daemon: state, tick, state, purge)."""
    from dagster._core.scheduler.instigation import InstigatorType, TickData, TickStatus
    from dagster._core.storage.dagster_run import DagsterRunStatus, RunsFilter

    schedules, state = storage.schedule_storage, _sensor_state()
    if schedules.get_instigator_state(state.instigator_origin_id, state.selector_id) is None:
        schedules.add_instigator_state(state)
    live = RunsFilter(statuses=[DagsterRunStatus.QUEUED, DagsterRunStatus.STARTING, DagsterRunStatus.STARTED])
    for _ in range(n):
        schedules.get_instigator_state(state.instigator_origin_id, state.selector_id)
        tick = schedules.create_tick(TickData(
            instigator_origin_id=state.instigator_origin_id, instigator_name="claim_index_tasks",
            instigator_type=InstigatorType.SENSOR, status=TickStatus.STARTED, timestamp=time.time(),
            selector_id=state.selector_id))
        storage.run_storage.get_run_records(live)  # the claiming sensor's one read of the live runs
        schedules.update_tick(tick.with_status(TickStatus.SKIPPED))
        schedules.update_instigator_state(state)
        schedules.purge_ticks(state.instigator_origin_id, state.selector_id, before=time.time() - 86400,
                              tick_statuses=[TickStatus.SKIPPED])


WORK = {"events": _events, "ticks": _ticks}


@contextlib.contextmanager
def _database(admin_url: str, name: str) -> Iterator[str]:
    from resources.local_databases import psycopg2_url
    from resources.local_postgres import with_database

    with psycopg.connect(admin_url, autocommit=True) as conn:
        conn.execute(pgsql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(pgsql.Identifier(name)))
        conn.execute(pgsql.SQL("CREATE DATABASE {}").format(pgsql.Identifier(name)))
    try:
        yield psycopg2_url(with_database(admin_url, name))
    finally:
        with psycopg.connect(admin_url, autocommit=True) as conn:
            conn.execute(pgsql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(pgsql.Identifier(name)))


@contextlib.contextmanager
def _relayed(admin_url: str, url: str, delay_ms: int) -> Iterator[str]:
    """``url`` through a local bench/relay.py holding each chunk ``delay_ms`` each way (as is with 0)."""
    if delay_ms <= 0:
        yield url
        return
    from sqlalchemy.engine import make_url

    from bench.relay import local_relay

    with local_relay(admin_url, delay_ms) as port:
        yield make_url(url).set(host="127.0.0.1", port=port, query={}).render_as_string(hide_password=False)


def measure(side: str, admin_url: str, counts: dict[str, int], delay_ms: int = 0) -> list[Result]:
    name = "bench_dagster_storage_" + side.replace(",", "").replace(" ", "_")
    with _database(admin_url, name) as direct, _relayed(admin_url, direct, delay_ms) as url:
        _dispose(_storage(side, direct))  # tables created over the direct link, before anything is timed
        storage = _storage(side, url)
        counter = Counter(storage)
        for workload in WORKLOADS:
            WORK[workload](storage, 2)  # warm: imports done, connections open, checks answered
        server = postgres_pid(admin_url)
        results = []
        for workload in WORKLOADS:
            counter.reset()
            pg0, cpu0, wall0 = tree_seconds(server) if server else 0.0, time.process_time(), time.perf_counter()
            WORK[workload](storage, counts[workload])
            results.append(Result(side, workload, counts[workload], counter.statements, counter.connections,
                                  time.perf_counter() - wall0, time.process_time() - cpu0,
                                  (tree_seconds(server) - pg0) if server else 0.0))
        _dispose(storage)
        return results


def run(admin_url: str, events: int, ticks: int, delay_ms: int = 0) -> dict[str, Any]:
    counts = {"events": events, "ticks": ticks}
    results = [r.__dict__ for side in SIDES for r in measure(side, admin_url, counts, delay_ms)]
    return {"counts": counts, "delay_ms_each_way": delay_ms, "results": results}


def per_call(report: dict[str, Any], side: str, workload: str, field: str) -> float:
    row = next(r for r in report["results"] if r["side"] == side and r["workload"] == workload)
    return row[field] / row["count"]


def render(report: dict[str, Any]) -> str:
    delay = report["delay_ms_each_way"]
    lines = [f"{report['counts']['events']} events (+ a runs and instigator read every 10th), "
             f"{report['counts']['ticks']} sensor ticks; link delay {delay} ms each way",
             f"{'side':<15} {'work':<7} {'statements/call':>15} {'conns':>6} {'wall ms/call':>13} "
             f"{'client CPU ms/call':>19} {'PG CPU ms/call':>15}"]
    for r in report["results"]:
        n = r["count"]
        lines.append(f"{r['side']:<15} {r['workload']:<7} {r['statements'] / n:>15.2f} {r['connections']:>6} "
                     f"{1000 * r['wall_seconds'] / n:>13.2f} {1000 * r['client_cpu_seconds'] / n:>19.3f} "
                     f"{1000 * r['postgres_cpu_seconds'] / n:>15.3f}")
    for workload in WORKLOADS:
        ratios = []
        for field in ("statements", "wall_seconds", "postgres_cpu_seconds"):
            now = per_call(report, "kbindex", workload, field)
            ratios.append(f"{field.split('_')[0]} "
                          + " / ".join(f"{per_call(report, s, workload, field) / now:.2f}x" if now else "n/a"
                                       for s in SIDES[:2]))
        lines.append(f"{workload}: nullpool / pooled-pinged over kbindex: " + "; ".join(ratios))
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.dagster_storage", description=__doc__.splitlines()[0])
    parser.add_argument("--events", type=int, default=1000)
    parser.add_argument("--ticks", type=int, default=100)
    parser.add_argument("--delay-ms", type=int, default=0, help="hold each chunk this long each way (bench/relay.py)")
    args = parser.parse_args(argv)
    from resources.local_postgres import temporary_server

    with temporary_server("kbindex-bench-dgstore-", external_env="KBINDEX_DATABASE_URL") as admin_url:
        print(render(run(admin_url, args.events, args.ticks, args.delay_ms)))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
