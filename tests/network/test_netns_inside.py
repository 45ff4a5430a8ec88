"""``bench.netns.inside``: the calling thread joins host B (what bench.chaos --network does with its whole soak),
reaches PostgreSQL over the veth link there, and is back in its own namespace after the block."""

from __future__ import annotations

import os
import subprocess
import threading

import psycopg

from bench.netns import Hosts, inside


def _netns() -> int:
    return os.stat("/proc/thread-self/ns/net").st_ino


def test_inside_joins_the_client_host_and_returns(hosts: Hosts):
    before = _netns()
    seen: list[int] = []
    with inside(hosts.ns_client):
        assert _netns() != before
        with psycopg.connect(hosts.remote_url(), connect_timeout=3) as conn:  # the link, not the Unix socket
            assert conn.execute("SELECT inet_client_addr()::text").fetchone()[0] == "10.77.0.2/32"
        t = threading.Thread(target=lambda: seen.append(_netns()))
        t.start()
        t.join()
        ip = subprocess.run(["ip", "-br", "addr"], capture_output=True, text=True, check=True).stdout
        assert "10.77.0.2/24" in ip  # a child process is on host B too
    assert _netns() == before
    assert seen == [_netns_of(hosts.ns_client)]


def _netns_of(name: str) -> int:
    return os.stat(f"/var/run/netns/{name}").st_ino


def test_stop_postgres_then_start_again(hosts: Hosts):
    hosts.stop_postgres()
    with inside(hosts.ns_client):
        try:
            psycopg.connect(hosts.remote_url(), connect_timeout=2).close()
            raise AssertionError("the server answered while stopped")
        except psycopg.OperationalError:
            pass
    hosts.start_postgres()
    hosts.wait_ready()
    with psycopg.connect(hosts.local_url()) as conn:
        assert conn.execute("SELECT 1").fetchone() == (1,)
