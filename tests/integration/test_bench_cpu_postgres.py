"""bench/cpu.postgres_pid finds the postmaster of a local server even when the backend it asked exits
the moment its connection closes (CI lost that race once, and the bench then counted no PostgreSQL CPU)."""

from __future__ import annotations

import time

import psutil
import psycopg

from bench.cpu import CpuMeter, postgres_pid


def _connect_whose_close_waits_for_the_backend_to_exit(real_connect):
    def connect(*args, **kwargs):
        conn = real_connect(*args, **kwargs)
        backend = conn.execute("SELECT pg_backend_pid()").fetchone()[0]
        real_close = conn.close

        def close() -> None:
            real_close()
            deadline = time.monotonic() + 10
            while psutil.pid_exists(backend) and time.monotonic() < deadline:
                time.sleep(0.01)

        conn.close = close
        return conn

    return connect


def test_postgres_pid_is_the_postmaster_even_when_the_backend_exits_at_close(pg_server_url, monkeypatch):
    with psycopg.connect(pg_server_url, autocommit=True) as conn:
        backend = conn.execute("SELECT pg_backend_pid()").fetchone()[0]
        postmaster = psutil.Process(backend).ppid()
    monkeypatch.setattr(psycopg, "connect", _connect_whose_close_waits_for_the_backend_to_exit(psycopg.connect))
    assert postgres_pid(pg_server_url) == postmaster
    assert "postgres" in psutil.Process(postmaster).name()


def test_meter_counts_postgres_work(pg_server_url):
    meter = CpuMeter({"PostgreSQL": postgres_pid(pg_server_url)})
    meter.start()
    with psycopg.connect(pg_server_url, autocommit=True) as conn:
        conn.execute("SELECT count(*) FROM generate_series(1, 3000000)")
    assert meter.spent()["PostgreSQL"] > 0
