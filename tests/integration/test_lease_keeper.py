"""The run's heartbeat thread keeps leases alive, and notices promptly when one is lost or cancelled."""

import time

import psycopg
import pytest

from pipelines.domain.errors import LeaseLost, TaskCancelled
from resources.blob_store import BlobStore
from resources.lease_keeper import LeaseKeeper
from resources.publisher import Publisher
from resources.task_queue import TaskQueue


@pytest.fixture
def claimed(db, tmp_path):
    publisher = Publisher(db, BlobStore(str(tmp_path)))
    ids = [publisher.publish("acme", f"doc-{i}", f"text {i}".encode(), "d.txt").task_id for i in range(2)]
    queue = TaskQueue(db, lease_seconds=1.0)
    return queue, queue.claim("run-a", limit=2), ids


def _wait(predicate, timeout=5.0):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(0.05)
    return False


def test_heartbeats_outlive_the_lease_for_the_whole_run(claimed):
    queue, tasks, _ = claimed
    with LeaseKeeper(queue, interval=0.2) as keeper:
        for t in tasks:
            keeper.hold(str(t.lease.task_id), t.lease)
        time.sleep(2.5)  # well past the 1 s lease
        for t in tasks:
            assert keeper.check(str(t.lease.task_id)).lease_until > t.lease.lease_until
    assert keeper.heartbeats >= 10
    assert all(queue.get(t.lease.task_id)["status"] == "RUNNING" for t in tasks)


def test_a_taken_over_lease_is_marked_lost_and_its_batch_mate_carries_on(claimed, db_url):
    queue, (first, second), _ = claimed
    keeper = LeaseKeeper(queue, interval=0.2)
    keeper.hold("first", first.lease)
    keeper.hold("second", second.lease)
    # Another run takes the first task over after its lease expired (no heartbeat happened meanwhile).
    with psycopg.connect(db_url, autocommit=True) as conn:
        conn.execute("UPDATE index_task SET lease_until = now() - interval '1 second' WHERE task_id = %s", [first.lease.task_id])
    (taken,) = queue.claim("run-b", limit=1)
    assert taken.lease.task_id == first.lease.task_id and taken.lease.attempt == first.lease.attempt + 1
    with keeper:
        assert _wait(lambda: keeper.lease("first") is None)
        with pytest.raises(LeaseLost):
            keeper.check("first")
        assert keeper.check("second").task_id == second.lease.task_id


def test_cancel_stops_the_run_promptly(claimed):
    queue, (first, _), _ = claimed
    with LeaseKeeper(queue, interval=0.2) as keeper:
        keeper.hold("first", first.lease)
        queue.cancel(first.lease.task_id)
        assert _wait(lambda: keeper.lease("first") is None, timeout=2.0)
        with pytest.raises(TaskCancelled):
            keeper.check("first")
