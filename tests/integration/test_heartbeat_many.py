"""A heartbeat never waits on a row lock (issue #12, defect 4).

The publish transaction holds its task row locked while it writes the chunks. The run's heartbeat
thread must renew the other leases of the run meanwhile, leave the one being published alone (neither
renewed nor lost: its publish finishes or fails on its own), and still report leases that really are lost.
"""

from __future__ import annotations

import threading
import time
from contextlib import contextmanager

import psycopg
import pytest

from pipelines.domain.errors import LeaseLost, TaskCancelled
from resources.lease_keeper import LeaseKeeper
from resources.task_queue import TaskQueue


@contextmanager
def row_locked(db_url: str, task_id: int):
    """Hold the task's row lock in another connection, as the publish transaction does."""
    with psycopg.connect(db_url) as conn:  # not autocommit: the lock lives until the block ends
        conn.execute("SELECT 1 FROM index_task WHERE task_id = %s FOR UPDATE", [task_id])
        yield
        conn.rollback()


@pytest.fixture
def three_leases(db, publish_task):
    for _ in range(3):
        publish_task()
    queue = TaskQueue(db, lease_seconds=30.0)
    claimed = queue.claim("run-a", limit=3)
    assert len(claimed) == 3
    return queue, [c.lease for c in claimed]


def lease_until(queue: TaskQueue, task_id: int):
    return queue.get(task_id)["lease_until"]


def test_beat_once_renews_the_batch_while_one_row_is_being_published(three_leases, db_url):
    queue, (published, mate, other) = three_leases
    keeper = LeaseKeeper(queue, interval=60)
    for lease in (published, mate, other):  # the locked one first: today's loop stops on it
        keeper.hold(str(lease.task_id), lease)
    before = {lease.task_id: lease_until(queue, lease.task_id) for lease in (published, mate, other)}
    time.sleep(0.05)  # so a renewal moves lease_until visibly
    with row_locked(db_url, published.task_id):
        beat = threading.Thread(target=keeper.beat_once, daemon=True)
        beat.start()
        beat.join(timeout=5.0)
        blocked = beat.is_alive()
        if not blocked:
            for lease in (mate, other):
                assert lease_until(queue, lease.task_id) > before[lease.task_id]
                assert keeper.check(str(lease.task_id)).lease_until > lease.lease_until
    beat.join(timeout=10.0)  # the lock is gone: let a blocked heartbeat finish before the database goes
    assert not blocked, "beat_once waited on the row lock of the version being published"
    # Being published is neither renewed nor lost; once the lock is gone the next beat renews it.
    assert keeper.check(str(published.task_id)) == published
    assert keeper.heartbeats == 2
    keeper.beat_once()
    assert keeper.check(str(published.task_id)).lease_until > published.lease_until
    assert lease_until(queue, published.task_id) > before[published.task_id]


def test_heartbeat_many_tells_renewed_busy_and_lost_apart_in_one_statement(three_leases, db_url):
    queue, (busy, lost, renewed) = three_leases
    queue.cancel(lost.task_id)
    with row_locked(db_url, busy.task_id):
        result = queue.heartbeat_many([busy, lost, renewed])
    assert [lease.task_id for lease in result.renewed] == [renewed.task_id]
    assert result.renewed[0].lease_until > renewed.lease_until
    assert result.busy == [busy]
    ((lost_lease, why),) = result.lost
    assert lost_lease == lost and isinstance(why, TaskCancelled)


def test_a_locked_row_whose_fence_already_failed_is_lost_not_busy(three_leases, db_url):
    """Locked by someone else after being taken over: the lease is gone whatever the lock."""
    queue, (stale, _, _) = three_leases
    with psycopg.connect(db_url, autocommit=True) as conn:
        conn.execute("UPDATE index_task SET lease_until = now() - interval '1 second' WHERE task_id = %s",
                     [stale.task_id])
    (taken,) = queue.claim("run-b", limit=1)
    assert taken.lease.task_id == stale.task_id
    with row_locked(db_url, stale.task_id):
        result = queue.heartbeat_many([stale])
    assert result.renewed == [] and result.busy == []
    ((lease, why),) = result.lost
    assert lease == stale and isinstance(why, LeaseLost) and why.data["reason"] == "taken over by attempt 2"


def test_keeper_marks_a_cancelled_lease_lost_and_renews_the_rest_in_one_round_trip(three_leases, monkeypatch):
    queue, leases = three_leases
    keeper = LeaseKeeper(queue, interval=60)
    for lease in leases:
        keeper.hold(str(lease.task_id), lease)
    queue.cancel(leases[1].task_id)
    calls = []
    real = queue.heartbeat_many
    monkeypatch.setattr(queue, "heartbeat_many", lambda batch: calls.append(len(batch)) or real(batch))
    monkeypatch.setattr(queue, "heartbeat", lambda lease: pytest.fail("one statement per beat, not one per lease"))
    keeper.beat_once()
    assert calls == [3] and keeper.heartbeats == 2
    with pytest.raises(TaskCancelled):
        keeper.check(str(leases[1].task_id))
    keeper.beat_once()
    assert calls == [3, 2]  # a lost lease is not beaten again
    for lease in (leases[0], leases[2]):
        assert keeper.check(str(lease.task_id)).lease_until > lease.lease_until


def test_a_stale_and_a_fresh_lease_of_one_task_are_told_apart(three_leases, db_url):
    queue, (first, _, _) = three_leases
    with psycopg.connect(db_url, autocommit=True) as conn:
        conn.execute("UPDATE index_task SET lease_until = now() - interval '1 second' WHERE task_id = %s",
                     [first.task_id])
    (again,) = queue.claim("run-a", limit=1)  # the same owner takes its own expired task over
    assert (again.lease.task_id, again.lease.attempt) == (first.task_id, 2)
    result = queue.heartbeat_many([first, again.lease])
    assert [(lease.task_id, lease.attempt) for lease in result.renewed] == [(first.task_id, 2)]
    assert [lease for lease, _ in result.lost] == [first] and result.busy == []


def test_a_lease_its_own_publish_finished_is_finished_not_lost(three_leases, caplog):
    """Over a slow link a heartbeat sent before a publish committed is answered after it, and a run lets go of a
    published batch only when its last batch commits: each beat met those versions SUCCEEDED by their own
    attempt and reported them as lost leases (178 warnings in a 200-version burst over a 500-ms link, none lost).
    They are ``finished``: dropped from the keeper without a warning. One failed by someone else (the run-failure
    sensor records RUN_CRASHED with the same attempt) is still lost: its work must stop."""
    import logging

    queue, (published, crashed, live) = three_leases
    keeper = LeaseKeeper(queue, interval=60)
    for lease in (published, crashed, live):
        keeper.hold(str(lease.task_id), lease)
    queue.complete(published, chunk_count=1)
    queue.fail(crashed, "RUN_CRASHED", "the run process died before recording an outcome")
    result = queue.heartbeat_many([published, crashed, live])
    assert result.finished == [published] and result.busy == []
    assert [lease for lease, _ in result.lost] == [crashed] and [r.task_id for r in result.renewed] == [live.task_id]
    with caplog.at_level(logging.WARNING, logger="resources.lease_keeper"):
        keeper.beat_once()
    warned = [r.getMessage() for r in caplog.records if "lease lost" in r.getMessage()]
    assert warned == [f"task {crashed.task_id}: lease lost (LEASE_LOST): stopping its work"]
    assert str(published.task_id) not in keeper.keys()  # let go of, as the publish step would
    with pytest.raises(LeaseLost):
        keeper.check(str(crashed.task_id))
    assert keeper.check(str(live.task_id)).lease_until > live.lease_until
