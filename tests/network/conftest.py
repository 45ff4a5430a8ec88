"""Fixtures of the multi-host tests: PostgreSQL in one network namespace, clients in another (bench/netns.py).

The whole directory skips, with the reason, where namespaces or nftables are not permitted.
"""

from __future__ import annotations

import itertools
import os
from collections.abc import Iterator

import psycopg
import pytest
from psycopg import sql as pgsql

from bench.netns import Hosts, unavailable

_names = itertools.count()

FAST_BOUNDS = {
    "KBINDEX_PG_CONNECT_TIMEOUT_S": "2",
    "KBINDEX_PG_KEEPALIVES_IDLE_S": "1",
    "KBINDEX_PG_KEEPALIVES_INTERVAL_S": "1",
    "KBINDEX_PG_KEEPALIVES_COUNT": "2",
    "KBINDEX_PG_TCP_USER_TIMEOUT_MS": "3000",
    "KBINDEX_PG_IDLE_IN_TRANSACTION_MS": "3000",
    "KBINDEX_PG_RECONNECT_S": "1",
}
"""The tests' bounds: the defaults' shape at a tenth of the time (a silent connection errors within ~4 s)."""
NO_CLIENT_BOUNDS = {**FAST_BOUNDS, "KBINDEX_PG_KEEPALIVES_IDLE_S": "0", "KBINDEX_PG_TCP_USER_TIMEOUT_MS": "0"}
"""The same with the client's network bounds off: what every connection had before issue #32."""


@pytest.fixture(scope="session")
def hosts() -> Iterator[Hosts]:
    reason = unavailable()
    if reason:
        pytest.skip(reason)
    with Hosts() as h:
        h.wait_ready()
        from resources.migrations import migrate

        with psycopg.connect(h.local_url(), autocommit=True) as conn:
            conn.execute("CREATE DATABASE net_template")
        migrate(h.local_url("net_template"))
        yield h


@pytest.fixture
def net_db(hosts: Hosts) -> Iterator[str]:
    """A fresh migrated database on the namespaced server; yields its name (hosts.local_url / remote_url)."""
    name = f"net_{os.getpid()}_{next(_names)}"
    with psycopg.connect(hosts.local_url(), autocommit=True) as conn:
        conn.execute(pgsql.SQL("CREATE DATABASE {} TEMPLATE net_template").format(pgsql.Identifier(name)))
    try:
        yield name
    finally:
        hosts.heal()
        with psycopg.connect(hosts.local_url(), autocommit=True) as conn:
            conn.execute(pgsql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(pgsql.Identifier(name)))
