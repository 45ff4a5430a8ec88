"""bench.chaos's reader: an error from a connection that lived through the injector's PostgreSQL restart is the
restart's doing, even though it only shows on the connection's first use after the server is back."""

from __future__ import annotations

import threading
from types import SimpleNamespace

import psycopg
import pytest

from bench.chaos import Chaos, Counters, Postgres


@pytest.fixture
def chaos(tmp_path):
    c = Chaos.__new__(Chaos)
    c.pg = Postgres(tmp_path / "pg")
    c.cfg = SimpleNamespace(pg_downtime=0.2)
    c.c, c.sources, c.network, c.out = Counters(), None, None, lambda message: None
    c.t0, c.pg_stops, c.pg_down, c.fault_lock = 0.0, 0, threading.Event(), threading.Lock()
    yield c
    c.pg.cleanup()


def test_a_connection_opened_before_a_restart_fails_after_it_and_counts_as_the_outage(chaos):
    conn = psycopg.connect(chaos.pg.admin_url, autocommit=True)
    opened_at = chaos.pg_stops
    conn.execute("SELECT 1")
    chaos._restart_postgres()
    with pytest.raises(psycopg.OperationalError):  # AdminShutdown (57P01) or a closed socket: the server went away
        conn.execute("SELECT 1")
    assert not chaos.pg_down.is_set()
    assert not chaos.outage(), "the database is up again: a fresh connection's error would be a finding"
    assert chaos.outage(since_stops=opened_at), "this connection's error is the restart's doing"
    with psycopg.connect(chaos.pg.admin_url, autocommit=True) as fresh:
        assert fresh.execute("SELECT 1").fetchone() == (1,)
        assert not chaos.outage(since_stops=chaos.pg_stops)
