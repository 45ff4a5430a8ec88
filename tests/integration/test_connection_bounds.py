"""Every PostgreSQL connection kbindex opens is bounded: network bounds always, statement bounds per role."""

from __future__ import annotations

import threading
import time

import psycopg
import pytest

from resources.database import Database, connection_params
from resources.settings import ConnectionBounds

NETWORK = {"connect_timeout", "keepalives", "keepalives_idle", "keepalives_interval", "keepalives_count",
           "tcp_user_timeout"}


@pytest.mark.parametrize("role", ["run", "api", "tool", "migration"])
def test_every_role_has_the_network_bounds(role):
    params = connection_params("postgresql://u@h/db", role, ConnectionBounds())
    assert NETWORK <= params.keys() and params["keepalives"] == 1
    assert all(params[k] > 0 for k in NETWORK)
    for server in ("tcp_keepalives_idle", "tcp_user_timeout"):
        assert f"-c {server}=" in params["options"]


def test_statement_bounds_follow_the_role():
    def options(role):
        return connection_params("postgresql://u@h/db", role, ConnectionBounds())["options"]

    assert "statement_timeout=300000" in options("run") and "lock_timeout=60000" in options("run")
    assert "statement_timeout=30000" in options("api") and "lock_timeout=10000" in options("api")
    for role in ("tool", "migration"):  # an index build, a verify or a 1M-row seeding may run long
        assert "statement_timeout" not in options(role) and "lock_timeout" not in options(role)
    assert "idle_in_transaction_session_timeout" in options("tool")
    assert "idle_in_transaction_session_timeout" not in options("migration")


def test_the_api_role_gives_up_on_a_silent_database_within_5_s_and_waits_4_s_for_a_connection(db_url):
    """People wait on API requests: 503 within ~5 s rather than the runs' ~35 s; the other roles keep theirs."""
    b = ConnectionBounds()
    api = connection_params("postgresql://u@h/db", "api", b)
    assert (api["keepalives_idle"], api["keepalives_interval"], api["tcp_user_timeout"]) == (2, 1, 4000)
    assert "-c tcp_user_timeout=4000" in api["options"] and "-c tcp_keepalives_idle=2" in api["options"]
    assert b.silent_bound_s("api") == 5.0 and b.silent_bound_s("run") == 35.0
    assert connection_params("postgresql://u@h/db", "run", b)["tcp_user_timeout"] == 30000
    with Database(db_url, max_size=1, role="api") as db:
        assert db.pool.timeout == 4.0
    with Database(db_url, max_size=1, role="run") as db:
        assert db.pool.timeout == 30.0 and db.pool.reconnect_timeout == 10.0  # not psycopg_pool's 300 s


def test_the_url_wins_and_zero_turns_a_bound_off():
    params = connection_params("postgresql://u@h/db?keepalives_idle=99&options=-c%20statement_timeout%3D0", "run",
                               ConnectionBounds())
    assert "keepalives_idle" not in params  # the URL's 99 stays
    assert params["options"].endswith("-c statement_timeout=0")  # later -c wins in PostgreSQL
    off = connection_params("postgresql://u@h/db", "run", ConnectionBounds.from_env(
        {"KBINDEX_PG_TCP_USER_TIMEOUT_MS": "0", "KBINDEX_PG_KEEPALIVES_IDLE_S": "0"}))
    assert "keepalives" not in off and "tcp_user_timeout" not in off
    assert "tcp_keepalives_idle" not in off["options"] and "tcp_user_timeout" not in off["options"]
    assert ConnectionBounds().silent_bound_s() == 35.0
    assert ConnectionBounds.from_env({"KBINDEX_PG_KEEPALIVES_IDLE_S": "0"}).silent_bound_s() == float("inf")


def test_a_negative_bound_is_refused():
    with pytest.raises(ValueError, match="KBINDEX_PG_CONNECT_TIMEOUT_S"):
        ConnectionBounds.from_env({"KBINDEX_PG_CONNECT_TIMEOUT_S": "-1"})


@pytest.mark.parametrize("raw", ["nan", "inf", "soon"])
def test_a_bound_that_is_not_a_finite_number_is_refused_by_name(raw):
    with pytest.raises(ValueError, match="KBINDEX_PG_RECONNECT_S"):
        ConnectionBounds.from_env({"KBINDEX_PG_RECONNECT_S": raw})


@pytest.mark.parametrize(("role", "statement", "idle"), [("run", "5min", "30s"), ("api", "30s", "30s"),
                                                         ("migration", "0", "0")])

def test_the_server_session_gets_the_role_s_settings(db_url, role, statement, idle):
    with Database(db_url, max_size=1, role=role) as db, db.session() as s:
        cur = s.conn.execute("SELECT current_setting('statement_timeout'), "
                             "current_setting('idle_in_transaction_session_timeout')")
        assert cur.fetchone() == (statement, idle)


def test_an_abandoned_transaction_is_ended_by_the_server(db_url, monkeypatch):
    """The server's half of the bound: a client that stops talking inside a transaction loses it."""
    monkeypatch.setenv("KBINDEX_PG_IDLE_IN_TRANSACTION_MS", "200")
    with psycopg.connect(db_url, **connection_params(db_url, "run")) as conn:
        conn.execute("SELECT 1")  # a transaction is open now (not autocommit), then nothing is sent
        time.sleep(0.6)
        with pytest.raises(psycopg.errors.IdleInTransactionSessionTimeout):
            conn.execute("SELECT 1")


def test_a_waiting_request_is_served_once_the_server_is_back_after_the_pool_gave_up_reconnecting(db_url, tmp_path,
                                                                                                  monkeypatch):
    """psycopg_pool gives up a reconnection series after KBINDEX_PG_RECONNECT_S and retries only on the next
    request; a request already waiting must not wait out its whole timeout once the server is reachable again
    (the same over a real partition: tests/network/test_claim_partition.py)."""
    from psycopg.conninfo import conninfo_to_dict, make_conninfo

    monkeypatch.setenv("KBINDEX_PG_RECONNECT_S", "1")
    info = conninfo_to_dict(db_url)
    real_socket = f"{info['host']}/.s.PGSQL.{info.get('port') or 5432}"
    away = tmp_path / "sock"  # the server's socket is not here yet: every connection attempt fails at once
    away.mkdir()
    db = Database(make_conninfo(db_url, host=str(away)), min_size=1, max_size=2, timeout=20.0, role="run")
    try:
        answered: list[float] = []
        started = time.monotonic()
        waiting = threading.Thread(target=lambda: (db.fetch_one("lexical_backfill_position"),
                                                   answered.append(time.monotonic())))
        waiting.start()
        time.sleep(3.5)  # past a whole 1-s series: the pool has given up at least once
        assert waiting.is_alive() and not answered
        (away / f".s.PGSQL.{info.get('port') or 5432}").symlink_to(real_socket)
        back = time.monotonic()
        waiting.join(20)
        assert answered, "the waiting request never got a connection"
        assert answered[0] - back < 5.0, (
            f"served {answered[0] - back:.1f} s after the server was reachable ({answered[0] - started:.1f} s in): "
            "the pool waited for a new request before it reconnected")
    finally:
        db.close()
