"""``Database.transaction(pipelined=True)``: statements queued without waiting, committed together or not at all,
and the connection usable again after any failure. Real PostgreSQL; the charge statement is the writer."""

from __future__ import annotations

import psycopg
import pytest

from pipelines.domain.errors import IndexWriteFailed
from resources.database import CHECK_AFTER_IDLE_S, IdleCheck


def _stored(db_url: str, tenant: str) -> list[tuple[int]]:
    with psycopg.connect(db_url) as other:
        return other.execute("SELECT stored_bytes FROM tenant_storage WHERE tenant_id = %s", (tenant,)).fetchall()


def test_submitted_statements_commit_together_at_the_end(db, db_url):
    with db.transaction(pipelined=True) as tx:
        first = tx.submit("tenant_storage_charge", {"tenant_id": "acme", "byte_size": 10})
        second = tx.fetch_one("tenant_storage_charge", {"tenant_id": "acme", "byte_size": 5})  # waits for both
        assert first.fetchone()["stored_bytes"] == 10 and second["stored_bytes"] == 15
        assert _stored(db_url, "acme") == []  # another session sees nothing before the commit
    assert _stored(db_url, "acme") == [(15,)]


def _pool_rolled_back(caplog) -> list[str]:
    """What psycopg's pool had to roll back itself: a connection handed back still inside a transaction."""
    return [r.getMessage() for r in caplog.records if r.name.startswith("psycopg.pool") and "rolling back" in r.getMessage()]


def test_a_server_error_in_a_queued_statement_rolls_everything_back_and_the_connection_serves_again(db, db_url,
                                                                                                    caplog):
    with pytest.raises(IndexWriteFailed) as failed:  # numeric_value_out_of_range, raised at the next wait
        with db.transaction(pipelined=True) as tx:
            tx.submit("tenant_storage_charge", {"tenant_id": "acme", "byte_size": 10})
            tx.submit("tenant_storage_charge", {"tenant_id": "acme", "byte_size": 2**63 - 1})  # bigint overflow
            tx.fetch_one("tenant_storage_get", {"tenant_id": "acme"})
    assert failed.value.data.get("sqlstate") == "22003"
    assert _stored(db_url, "acme") == []
    assert _pool_rolled_back(caplog) == []  # the transaction rolled itself back before the connection went back
    for _ in range(3):  # every pooled connection is back in a usable state
        with db.transaction(pipelined=True) as tx:
            tx.fetch_one("tenant_storage_charge", {"tenant_id": "acme", "byte_size": 1})
    assert _stored(db_url, "acme") == [(3,)]


def test_an_exception_in_the_block_after_good_statements_rolls_them_back(db, db_url, caplog):
    with pytest.raises(RuntimeError):
        with db.transaction(pipelined=True) as tx:
            tx.submit("tenant_storage_charge", {"tenant_id": "acme", "byte_size": 10})  # sent, never waited for
            raise RuntimeError("refused in Python, as a quota is")
    assert _stored(db_url, "acme") == []
    assert _pool_rolled_back(caplog) == []
    assert db.fetch_one("tenant_storage_get", {"tenant_id": "acme"}) is not None  # the connection serves again


class _Conn:
    """Stands in for a pooled connection: counts the checks that reach the server."""

    autocommit = True

    def __init__(self) -> None:
        self.checks = 0

    def execute(self, query: str) -> None:
        self.checks += 1


def test_a_connection_is_checked_only_when_new_or_after_sitting_idle(monkeypatch):
    clock = [100.0]
    monkeypatch.setattr("resources.database.time.monotonic", lambda: clock[0])
    idle, conn = IdleCheck(), _Conn()
    idle.check(conn)  # new: never returned
    idle.reset(conn)
    clock[0] += CHECK_AFTER_IDLE_S / 2
    idle.check(conn)  # back from a moment ago: no round trip
    assert conn.checks == 1
    idle.reset(conn)
    clock[0] += CHECK_AFTER_IDLE_S
    idle.check(conn)  # idle as long as a restart takes: checked
    assert conn.checks == 2
