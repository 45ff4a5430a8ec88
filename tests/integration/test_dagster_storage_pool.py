"""Dagster's storage reuses its PostgreSQL connections and survives them being closed under it.

dagster_postgres alone opens a connection per storage call (NullPool); KbindexDagsterStorage keeps a
few (resources/dagster_storage.py). The test counts new DBAPI connections per engine, with plain
dagster_postgres beside it as the baseline that must show the churn.
"""

from __future__ import annotations

import time

import psycopg
import pytest
from sqlalchemy import event

from bench.dagster_storage.__main__ import Counter, _ticks
from resources import dagster_storage
from resources.local_databases import psycopg2_url

CALLS = 40


@pytest.fixture
def dagster_url(db_url, monkeypatch) -> str:
    url = psycopg2_url(db_url)
    monkeypatch.setenv("DAGSTER_PG_URL", url)
    return url


def _count_connects(engine) -> list[int]:
    opened = [0]
    event.listen(engine, "connect", lambda *_: opened.__setitem__(0, opened[0] + 1))
    return opened


def _storage_calls(storage, n: int) -> None:
    for _ in range(n):
        storage.run_storage.get_runs(limit=1)
        storage.event_log_storage.get_asset_keys()
        storage.schedule_storage.all_instigator_state()


def test_storage_calls_reuse_a_few_connections_where_dagster_postgres_opens_one_each(dagster_url):
    from dagster_postgres import DagsterPostgresStorage

    ours = dagster_storage.KbindexDagsterStorage()
    plain = DagsterPostgresStorage(postgres_url=dagster_url)
    names = ("run_storage", "event_log_storage", "schedule_storage")
    shared = {getattr(ours, name)._engine for name in names}  # noqa: SLF001
    assert len(shared) == 1  # one engine (one pool, one dialect set-up) for the three
    pooled = _count_connects(shared.pop())
    plain_counts = {name: _count_connects(getattr(plain, name)._engine) for name in names}  # noqa: SLF001

    _storage_calls(ours, CALLS)
    _storage_calls(plain, CALLS)

    assert pooled[0] <= dagster_storage.POOL_SIZE
    for name, null in plain_counts.items():
        assert null[0] >= CALLS, name  # the baseline: a connection per call


def test_if_dagster_postgres_changed_the_storage_is_plain_dagster_postgres_with_a_warning(dagster_url, monkeypatch,
                                                                                          caplog):
    from resources import dagster_private

    monkeypatch.setattr(dagster_private, "_fallen_back", {})

    def changed(*_a, **_k):
        raise TypeError("create_pg_engine() got an unexpected keyword argument 'pool_size'")

    monkeypatch.setattr(dagster_private, "create_pg_engine", changed)
    storage = dagster_storage.KbindexDagsterStorage()
    opened = _count_connects(storage.run_storage._engine)  # noqa: SLF001
    _storage_calls(storage, 3)
    assert opened[0] >= 3  # dagster_postgres's own NullPool: a connection per call
    assert "storage_pool" in dagster_private.fallen_back()
    assert any("storage_pool" in r.getMessage() and "_engine" in r.getMessage() for r in caplog.records)


def test_the_storage_bounds_dynamic_key_ranges_in_every_process_that_loads_it(dagster_url, monkeypatch):
    """The daemon and webserver load this storage, never the code location's VersionPartitions: building it is
    where their plain DynamicPartitionsDefinition gets its O(range) key ranges (dagster_private.bounded_ranges)."""
    from resources import dagster_private

    calls = []
    monkeypatch.setattr(dagster_private, "bound_dynamic_ranges", lambda: calls.append(1) or True)
    dagster_storage.KbindexDagsterStorage()
    assert calls == [1]


@pytest.mark.parametrize("ping_after_idle,expected", [(dagster_storage.PING_AFTER_IDLE_S, 1), (0, 2)])
def test_a_connection_in_steady_use_is_not_tested_at_each_checkout(dagster_url, ping_after_idle, expected):
    """Back-to-back calls take the connection just returned (last in, first out) and send no ``SELECT 1``
    before each one: one statement per call. Testing every checkout (0) doubles it."""
    storage = dagster_storage.KbindexDagsterStorage(ping_after_idle_seconds=ping_after_idle)
    counter = Counter(storage)
    storage.run_storage.get_runs(limit=1)  # opens the connection: not tested
    counter.reset()
    for _ in range(CALLS):
        storage.run_storage.get_runs(limit=1)
    assert counter.statements == expected * CALLS


def test_a_connection_closed_while_idle_is_tested_and_replaced(dagster_url, db_url):
    """What a PostgreSQL restart leaves: pooled connections closed by the server while unused for as long as
    it was down. Idle past the threshold, each is tested at checkout and replaced: no call fails."""
    storage = dagster_storage.KbindexDagsterStorage(ping_after_idle_seconds=0.2)
    _storage_calls(storage, 2)
    database = db_url.partition("?")[0].rpartition("/")[2]
    with psycopg.connect(db_url, autocommit=True) as conn:
        killed = conn.execute(
            "SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity WHERE datname = %s AND pid <> pg_backend_pid()",
            (database,),
        ).fetchone()[0]
    assert killed >= 1
    time.sleep(0.4)  # the outage: longer than the threshold
    _storage_calls(storage, 2)


def test_a_connection_closed_under_steady_use_fails_one_call_then_the_pool_recovers(dagster_url, db_url):
    """The price of not testing busy connections, and its bound: a connection closed *without* an outage
    (pg_terminate_backend, idle less than the threshold) fails the one call that takes it; that call invalidates
    the pool (the three storages share one), so the next calls reconnect. A PostgreSQL restart is not this case: its
    connections sit idle for the whole downtime, longer than ``PING_AFTER_IDLE_S``."""
    import sqlalchemy.exc

    storage = dagster_storage.KbindexDagsterStorage(ping_after_idle_seconds=60)
    _storage_calls(storage, 2)
    database = db_url.partition("?")[0].rpartition("/")[2]
    with psycopg.connect(db_url, autocommit=True) as conn:
        conn.execute("SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE datname = %s "
                     "AND pid <> pg_backend_pid()", (database,))
    failed = 0
    for call in (storage.run_storage.get_runs, storage.event_log_storage.get_asset_keys,
                 storage.schedule_storage.all_instigator_state) * 2:  # the three share one pool
        try:
            call()
        except sqlalchemy.exc.OperationalError:
            failed += 1
    assert failed == 1
    _storage_calls(storage, 2)


def test_schema_checks_are_asked_of_the_catalog_once(dagster_url):
    """A sensor tick's storage calls: Dagster reflects the table list on each (``has_instigators_table``);
    remembered, repeated ticks send no catalog query at all."""
    def catalog_queries(storage) -> int:
        counter = Counter(storage)
        _ticks(storage, 1)
        counter.reset()
        _ticks(storage, 5)
        return counter.catalog

    assert catalog_queries(dagster_storage.KbindexDagsterStorage()) == 0
    assert catalog_queries(dagster_storage.KbindexDagsterStorage(remember_schema_checks=False)) >= 5 * 5


def test_a_run_process_asks_nothing_about_the_tables_its_run_was_created_in(dagster_url, monkeypatch):
    """dagster_postgres reflects the catalog on a connection of its own per storage to create missing tables;
    a run process and the fork server skip it (their runs were created in those tables), every other process
    still asks."""
    from sqlalchemy import engine as sa_engine

    monkeypatch.setenv(dagster_storage.PROCESS_NAME_ENV, "daemon")
    dagster_storage.KbindexDagsterStorage()  # the tables exist from here on, as they do before any run
    opened: list[str] = []
    real_connect = sa_engine.Engine.connect
    monkeypatch.setattr(sa_engine.Engine, "connect", lambda self: opened.append("c") or real_connect(self))
    daemon = dagster_storage.KbindexDagsterStorage()
    assert len(opened) >= 3 and daemon.should_autocreate_tables  # a reflection per storage at least
    for name in ("run", "fork-server"):  # a run process; the warm launcher's fork server (an instance per exit)
        opened.clear()
        monkeypatch.setenv(dagster_storage.PROCESS_NAME_ENV, name)
        run = dagster_storage.KbindexDagsterStorage()
        assert opened == [] and not run.should_autocreate_tables, name
        assert run.run_storage.get_runs(limit=1) == []  # and its storage works on the existing tables
