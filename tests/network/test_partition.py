"""Silent partitions between a worker host and the PostgreSQL host (issue #32), on a real link that drops
every packet (bench/netns.py): the worker gives up within its bound with a retryable error, the
server rolls the abandoned transaction back and frees its locks, the lease expires and another worker takes
the task over, and the old worker's late write after healing is fenced out.

The bounds are the defaults' shape at a tenth of the time (conftest.FAST_BOUNDS: a silent connection errors
within ~4 s); each test asserts a generous ceiling (liveness, not speed). The control test shows what the
same partition does without the client's bounds: the worker is still stuck when the ceiling has passed.
"""

from __future__ import annotations

import queue as queues
import subprocess
import threading
import time
from pathlib import Path

import psycopg
import pytest

from resources.blob_store import BlobStore
from resources.database import Database
from resources.publisher import Publisher
from resources.settings import ConnectionBounds
from resources.task_queue import TaskQueue
from tests.network.conftest import FAST_BOUNDS, NO_CLIENT_BOUNDS
from bench.netns import CLIENT_ADDR, Hosts

CLIENT = str(Path(__file__).with_name("client.py"))
LEASE_S = 6.0
BOUND_S = ConnectionBounds.from_env(FAST_BOUNDS).silent_bound_s()  # 4 s
CEILING_S = BOUND_S + 8.0
"""Bounded failure must come before this (scheduling slack on a shared 2-core machine included)."""


class Client:
    """A client process in namespace B, its stdout lines read into a queue."""

    def __init__(self, hosts: Hosts, *args: str, env: dict[str, str]) -> None:
        self.proc = hosts.client(CLIENT, *args, env=env)
        self.lines: queues.Queue[str] = queues.Queue()
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            self.lines.put(line.strip())

    def expect(self, prefix: str, timeout: float) -> str:
        deadline = time.monotonic() + timeout
        while True:
            left = deadline - time.monotonic()
            if left <= 0:
                raise TimeoutError(f"no {prefix!r} from the client within {timeout:g} s")
            try:
                line = self.lines.get(timeout=left)
            except queues.Empty:
                continue
            if line.startswith(prefix):
                return line

    def send(self) -> None:
        assert self.proc.stdin is not None
        self.proc.stdin.write("go\n")
        self.proc.stdin.flush()

    def close(self) -> str:
        if self.proc.poll() is None:
            self.proc.kill()
        _, err = self.proc.communicate(timeout=30)
        return err


@pytest.fixture
def task(hosts, net_db, tmp_path) -> int:
    with Database(hosts.local_url(net_db), max_size=1) as db:
        return Publisher(db, BlobStore(str(tmp_path / "blobs"))).publish("acme", "policy", b"refunds", "p.txt").task_id


def client_backends(hosts: Hosts, net_db: str) -> list[tuple]:
    with psycopg.connect(hosts.local_url(net_db), autocommit=True) as conn:
        return conn.execute("SELECT pid, state FROM pg_stat_activity "
                            "WHERE client_addr = %s AND datname = %s", (CLIENT_ADDR, net_db)).fetchall()


def waiting_on_a_lock(hosts: Hosts, net_db: str) -> bool:
    with psycopg.connect(hosts.local_url(net_db), autocommit=True) as conn:
        row = conn.execute("SELECT count(*) FROM pg_stat_activity WHERE client_addr = %s AND datname = %s "
                           "AND state = 'active' AND wait_event_type = 'Lock'", (CLIENT_ADDR, net_db)).fetchone()
    return row[0] == 1


def wait_for(predicate, timeout: float) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(0.1)
    return predicate()


def index_state(hosts: Hosts, net_db: str, task_id: int) -> tuple:
    with psycopg.connect(hosts.local_url(net_db), autocommit=True) as conn:
        chunks = conn.execute("SELECT count(*) FROM chunk").fetchone()[0]
        pointer = conn.execute("SELECT count(*) FROM search_pointer").fetchone()[0]
        status, attempts = conn.execute("SELECT status, attempts FROM index_task WHERE task_id = %s",
                                        (task_id,)).fetchone()
    return chunks, pointer, status, attempts


@pytest.mark.parametrize("point", ["idle_in_tx", "mid_statement", "commit"])
def test_a_partition_during_the_fenced_publish_fails_it_within_the_bound_and_nothing_is_half_written(
        hosts, net_db, task, point):
    client = Client(hosts, "publish", hosts.remote_url(net_db), point, str(LEASE_S), env=FAST_BOUNDS)
    blocker = None
    try:
        client.expect("CLAIMED", 60)
        if point == "mid_statement":  # the worker's lock statement will wait on this, server side
            blocker = psycopg.connect(hosts.local_url(net_db))
            blocker.execute("SELECT 1 FROM index_task WHERE task_id = %s FOR UPDATE", (task,))
        client.send()
        client.expect("AT", 30)
        if point == "mid_statement":  # cut while the statement waits for the lock: nothing of ours in flight
            assert wait_for(lambda: waiting_on_a_lock(hosts, net_db), 10)
            hosts.cut()
            blocker.commit()
        else:  # cut, then let the worker send its next statement (or COMMIT) into the silence
            hosts.cut()
            client.send()
        cut_at = time.monotonic()

        line = client.expect("ERR", CEILING_S)  # it gives up, and says so with a retryable code
        gave_up_after = time.monotonic() - cut_at
        print(f"{point}: the worker gave up {gave_up_after:.1f} s after the cut (bound {BOUND_S:g} s)")
        assert line == "ERR INDEX_WRITE_FAILED" and gave_up_after < CEILING_S

        # The server ends the abandoned backend (idle-in-transaction or its own TCP bounds) while the link is
        # still cut: its transaction rolls back, its row locks go.
        assert wait_for(lambda: client_backends(hosts, net_db) == [], CEILING_S), client_backends(hosts, net_db)
        print(f"{point}: the server ended the backend {time.monotonic() - cut_at:.1f} s after the cut")
        assert index_state(hosts, net_db, task) == (0, 0, "RUNNING", 1)

        # The lease runs out and another worker takes the task over, without waiting on any lock.
        with Database(hosts.local_url(net_db), max_size=1) as db:
            new = TaskQueue(db, lease_seconds=LEASE_S)
            assert wait_for(lambda: bool(new.claim_task(task, "new")), LEASE_S + 10)
        assert index_state(hosts, net_db, task) == (0, 0, "RUNNING", 2)

        hosts.heal()  # the old worker, now reachable again, tries once more: fenced, it writes nothing
        client.send()
        assert client.expect("LATE", 30) == "LATE LEASE_LOST"
        assert index_state(hosts, net_db, task) == (0, 0, "RUNNING", 2)
    finally:
        hosts.heal()
        if blocker is not None:
            blocker.close()
        client.close()


def test_control_without_the_client_bounds_the_same_partition_leaves_the_worker_stuck(hosts, net_db, task):
    """What each test above would see before issue #32: no keepalives, no tcp_user_timeout. Still no answer when
    the bounded worker would long have given up (TCP retransmits for ~15 minutes), so the tests above can fail."""
    client = Client(hosts, "publish", hosts.remote_url(net_db), "commit", str(LEASE_S), env=NO_CLIENT_BOUNDS)
    try:
        client.expect("CLAIMED", 60)
        client.send()
        client.expect("AT", 30)
        hosts.cut()
        client.send()
        with pytest.raises(TimeoutError):
            client.expect("ERR", CEILING_S)
        assert client.proc.poll() is None
    finally:
        hosts.heal()
        client.close()


@pytest.mark.parametrize("bounds", ["bounded", "unbounded"])
def test_the_heartbeat_thread_never_blocks_on_a_silent_link(hosts, net_db, task, bounds):
    """The keeper's beat in flight when the link goes silent fails within the bound (and would be retried); the
    lease is reported lost once no beat got through for a whole lease; the keeper's thread ends after stop().
    Unbounded (the control), the beat thread hangs in its first statement: no beat ever fails, and it is still
    hanging long after stop()."""
    env = FAST_BOUNDS if bounds == "bounded" else NO_CLIENT_BOUNDS
    join = CEILING_S if bounds == "bounded" else 2.0  # unbounded, it has hung for a ceiling already
    client = Client(hosts, "keeper", hosts.remote_url(net_db), str(LEASE_S), str(join), env=env)
    try:
        client.expect("CLAIMED", 60)
        assert wait_for(lambda: int(client.expect("STATE", 10).split()[2]) >= 2, 10)  # beats renew the lease
        hosts.cut()
        cut_at = time.monotonic()
        failed_after, lost_after = None, None
        while time.monotonic() - cut_at < LEASE_S + BOUND_S + 2:
            _, failed, _, lost = client.expect("STATE", 10).split()
            if int(failed) and failed_after is None:
                failed_after = time.monotonic() - cut_at
            if lost != "-" and lost_after is None:
                assert lost == "LEASE_LOST"
                lost_after = time.monotonic() - cut_at
        # In-memory, so with or without bounds: the run stops that work once the lease must have expired (and
        # beats no more for it: the lease is gone whatever the database would say).
        assert lost_after is not None and lost_after <= LEASE_S + 2
        client.send()
        _, took, alive = client.expect("STOPPED", CEILING_S + 10).split()
        print(f"keeper {bounds}: first failed beat {failed_after} s, lease lost {lost_after:.1f} s after the cut; "
              f"thread ended {took} s after stop: {alive == 'False'}")
        if bounds == "bounded":  # the beat in flight gave up within the bound; the thread ends after stop()
            assert failed_after is not None and failed_after < CEILING_S
            assert alive == "False" and float(took) < CEILING_S
        else:  # the beat in flight never returns
            assert failed_after is None and alive == "True"
    finally:
        hosts.heal()
        client.close()
