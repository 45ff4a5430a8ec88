"""Dagster's storage reuses its PostgreSQL connections and survives them being closed under it.

dagster_postgres alone opens a connection per storage call (NullPool); KbindexDagsterStorage keeps a
few (resources/dagster_storage.py). The test counts new DBAPI connections per engine, with plain
dagster_postgres beside it as the baseline that must show the churn.
"""

from __future__ import annotations

import psycopg
import pytest
from sqlalchemy import event

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
    engines = {name: (getattr(ours, name)._engine, getattr(plain, name)._engine)  # noqa: SLF001
               for name in ("run_storage", "event_log_storage", "schedule_storage")}
    counts = {name: (_count_connects(a), _count_connects(b)) for name, (a, b) in engines.items()}

    _storage_calls(ours, CALLS)
    _storage_calls(plain, CALLS)

    for name, (pooled, null) in counts.items():
        assert pooled[0] <= dagster_storage.POOL_SIZE, name
        assert null[0] >= CALLS, name  # the baseline: a connection per call


def test_connections_closed_by_the_server_are_replaced_not_failed(dagster_url, db_url):
    storage = dagster_storage.KbindexDagsterStorage()
    _storage_calls(storage, 2)
    database = db_url.partition("?")[0].rpartition("/")[2]
    with psycopg.connect(db_url, autocommit=True) as conn:  # what a PostgreSQL restart does to idle ones
        killed = conn.execute(
            "SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity WHERE datname = %s AND pid <> pg_backend_pid()",
            (database,),
        ).fetchone()[0]
    assert killed >= 1  # the pool held connections open
    _storage_calls(storage, 2)  # pool_pre_ping replaces the dead ones


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
