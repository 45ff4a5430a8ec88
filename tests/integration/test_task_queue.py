"""The task queue's verbs against a real database: claim, fencing, failure policy, cancel, retry, reads."""

from __future__ import annotations

import random
import re
from datetime import timedelta
from pathlib import Path

import pytest

from pipelines.domain.errors import IllegalTransition, LeaseLost, TaskCancelled, TaskNotFound
from pipelines.domain.task_states import Stage, TaskStatus, backoff_seconds
from resources.blob_store import BlobStore
from resources.publisher import Publisher
from resources.task_queue import Lease, TaskQueue
from sql import queries


def lock_fenced(queue, tx, leases):
    """The fenced lock as the publish transaction takes it: sent, then read."""
    return queue.read_lock_fenced(tx, leases, queue.send_lock_fenced(tx, leases)[0])


def transitions(queue: TaskQueue, task_id: int) -> list[tuple[str | None, str, int]]:
    return [(e["from_status"], e["to_status"], e["attempt"]) for e in queue.events(task_id) if e["kind"] == "transition"]


def test_every_query_name_the_queue_uses_exists():
    source = (Path(__file__).resolve().parents[2] / "resources" / "task_queue.py").read_text()
    used = set(re.findall(r'(?:fetch_one|fetch_all|execute)\(\s*"(\w+)"', source))
    assert used and used <= set(queries), used - set(queries)


def test_claim_grants_one_lease_per_due_task_and_logs_it(queue, publish_task, clock):
    a, b = publish_task(), publish_task()
    claimed = queue.claim("w1", limit=10)
    assert sorted(c.lease.task_id for c in claimed) == sorted([a.task_id, b.task_id])
    for c in claimed:
        assert c.lease.attempt == 1 and c.lease.owner == "w1"
        assert c.lease.lease_until == clock.now + timedelta(seconds=30)
        assert (c.tenant_id, c.profile, c.task_type, c.version_number) == ("acme", "minilm-v1", "INDEX", 1)
    assert queue.claim("w2") == []
    assert transitions(queue, a.task_id) == [(None, "PENDING", 0), ("PENDING", "RUNNING", 1)]
    row = queue.get(a.task_id)
    assert (row["status"], row["attempts"], row["lease_owner"], row["started_at"]) == ("RUNNING", 1, "w1", clock.now)


def test_claim_respects_limit_and_takes_the_oldest_due_first(queue, publish_task):
    ids = [publish_task().task_id for _ in range(5)]
    first = queue.claim("w1", limit=2)
    assert [c.lease.task_id for c in first] == ids[:2]
    assert queue.claim("w1", limit=0) == []
    assert [c.lease.task_id for c in queue.claim("w1", limit=10)] == ids[2:]


def test_heartbeat_extends_the_lease(queue, publish_task, clock):
    publish_task()
    (c,) = queue.claim("w1")
    clock.advance(20)
    lease = queue.heartbeat(c.lease)
    assert lease.lease_until == clock.now + timedelta(seconds=30)
    clock.advance(25)  # past the first lease_until, inside the extended one
    queue.heartbeat(lease)
    assert queue.claim("w2") == []


@pytest.mark.parametrize("new_owner", ["w2", "w1"])
def test_a_taken_over_lease_cannot_write_any_more(queue, publish_task, clock, db, new_owner):
    task = publish_task()
    (old,) = queue.claim("w1")
    clock.advance(31)
    (new,) = queue.claim(new_owner)
    assert (new.lease.task_id, new.lease.attempt) == (task.task_id, 2)
    stale = old.lease
    for write in (
        lambda: queue.heartbeat(stale),
        lambda: queue.progress(stale, Stage.EMBED, 1, 2),
        lambda: queue.complete(stale, chunk_count=1),
        lambda: queue.fail(stale, "EMBEDDING_TIMEOUT", "slow"),
    ):
        with pytest.raises(LeaseLost) as info:
            write()
        assert info.value.data["reason"] == "taken over by attempt 2"
    with db.transaction() as tx:
        assert [(lease, type(exc)) for lease, exc in lock_fenced(queue, tx, [stale])[1]] == [(stale, LeaseLost)]
    row = queue.get(task.task_id)
    assert (row["status"], row["attempts"], row["lease_owner"], row["stage"]) == ("RUNNING", 2, new_owner, None)
    queue.complete(new.lease, chunk_count=4)
    assert queue.get(task.task_id)["chunk_count"] == 4


def test_an_expired_lease_is_lost_even_before_anyone_takes_it_over(queue, publish_task, clock):
    publish_task()
    (c,) = queue.claim("w1")
    clock.advance(30)  # lease_until > now is required: equal is expired
    with pytest.raises(LeaseLost) as info:
        queue.heartbeat(c.lease)
    assert info.value.data["reason"] == "expired"
    with pytest.raises(LeaseLost):
        queue.complete(c.lease)


def test_a_finished_lease_is_lost(queue, publish_task):
    publish_task()
    (c,) = queue.claim("w1")
    queue.complete(c.lease)
    with pytest.raises(LeaseLost) as info:
        queue.complete(c.lease)
    assert info.value.data["reason"] == "finished (SUCCEEDED)"


def test_a_forged_owner_is_refused(queue, publish_task):
    publish_task()
    (c,) = queue.claim("w1")
    forged = Lease(c.lease.task_id, c.lease.attempt, "intruder", c.lease.lease_until)
    with pytest.raises(LeaseLost, match="held by w1"):
        queue.complete(forged)
    with pytest.raises(TaskNotFound):
        queue.heartbeat(Lease(999_999, 1, "w1", c.lease.lease_until))


def test_expired_leases_with_no_attempts_left_end_dead(db, tmp_path, make_queue, clock):
    publisher = Publisher(db, BlobStore(str(tmp_path / "b")), max_attempts=2)
    task = publisher.publish("acme", "doc", b"x", "x.txt")
    queue = make_queue()
    assert [c.lease.attempt for c in queue.claim("w1")] == [1]
    clock.advance(31)
    assert [c.lease.attempt for c in queue.claim("w2")] == [2]
    clock.advance(31)
    assert queue.claim("w3") == []
    row = queue.get(task.task_id)
    assert (row["status"], row["attempts"], row["error_code"], row["lease_owner"]) == (
        "DEAD",
        2,
        "LEASE_ATTEMPTS_EXHAUSTED",
        None,
    )
    assert transitions(queue, task.task_id)[-1] == ("RUNNING", "DEAD", 2)
    assert queue.stats()["dead_by_code"] == {"LEASE_ATTEMPTS_EXHAUSTED": 1}


def test_retryable_failure_waits_a_jittered_backoff_then_is_due_again(make_queue, publish_task, clock):
    queue = make_queue(rng=random.Random(7), backoff_base=10.0, backoff_cap=300.0)
    task = publish_task()
    (c,) = queue.claim("w1")
    assert queue.fail(c.lease, "EMBEDDING_RATE_LIMITED", "429 from provider") == TaskStatus.RETRY_WAIT
    row = queue.get(task.task_id)
    expected = backoff_seconds(1, base=10.0, cap=300.0, rng=random.Random(7))
    assert row["next_attempt_at"] - clock.now == pytest.approx(timedelta(seconds=expected), abs=timedelta(microseconds=2))
    assert (row["status"], row["error_code"], row["lease_owner"], row["lease_until"]) == (
        "RETRY_WAIT",
        "EMBEDDING_RATE_LIMITED",
        None,
        None,
    )
    clock.now = row["next_attempt_at"] - timedelta(milliseconds=1)
    assert queue.claim("w1") == []
    clock.now = row["next_attempt_at"]
    (again,) = queue.claim("w1")
    assert again.lease.attempt == 2
    assert transitions(queue, task.task_id)[-2:] == [("RUNNING", "RETRY_WAIT", 1), ("RETRY_WAIT", "RUNNING", 2)]


def test_backoff_grows_and_is_capped_in_the_stored_schedule(make_queue, publish_task, clock, db, tmp_path):
    publisher = Publisher(db, BlobStore(str(tmp_path / "b")), max_attempts=12)
    queue = make_queue(rng=random.Random(1), backoff_base=1.0, backoff_cap=20.0)
    task = publisher.publish("acme", "doc", b"x", "x.txt")
    delays = []
    for attempt in range(1, 10):
        (c,) = queue.claim("w1")
        assert c.lease.attempt == attempt
        queue.fail(c.lease, "EMBEDDING_UNAVAILABLE", "down")
        row = queue.get(task.task_id)
        delay = (row["next_attempt_at"] - clock.now).total_seconds()
        assert 0.0 <= delay <= min(20.0, 2 ** (attempt - 1))
        delays.append(delay)
        clock.now = row["next_attempt_at"]
    assert max(delays) <= 20.0 and max(delays) > 2.0
    assert len(set(delays)) == len(delays)  # jittered


def test_permanent_codes_are_not_retried(queue, publish_task):
    task = publish_task()
    (c,) = queue.claim("w1")
    assert queue.fail(c.lease, "PARSE_ERROR", "bad pdf") == TaskStatus.DEAD
    row = queue.get(task.task_id)
    assert (row["status"], row["attempts"], row["error_code"]) == ("DEAD", 1, "PARSE_ERROR")
    assert queue.claim("w1") == []


def test_retryable_failure_without_attempts_left_is_dead(db, tmp_path, make_queue):
    publisher = Publisher(db, BlobStore(str(tmp_path / "b")), max_attempts=1)
    task = publisher.publish("acme", "doc", b"x", "x.txt")
    queue = make_queue()
    (c,) = queue.claim("w1")
    assert queue.fail(c.lease, "EMBEDDING_TIMEOUT", "slow") == TaskStatus.DEAD
    assert queue.get(task.task_id)["error_code"] == "EMBEDDING_TIMEOUT"


def test_failure_messages_are_sanitized(queue, publish_task):
    task = publish_task()
    (c,) = queue.claim("w1")
    queue.fail(c.lease, "INTERNAL_ERROR", "boom at /srv/app/secret/file.py\nTraceback (most recent call last):")
    message = queue.get(task.task_id)["error_message"]
    assert "/srv" not in message and "Traceback" not in message and "\n" not in message
    assert queue.events(task.task_id)[-1]["message"] == message


def test_cancel_of_a_running_task_stops_the_old_owner(queue, publish_task):
    task = publish_task()
    (c,) = queue.claim("w1")
    queue.cancel(task.task_id)
    for write in (
        lambda: queue.heartbeat(c.lease),
        lambda: queue.progress(c.lease, Stage.PARSE, 1, 1),
        lambda: queue.complete(c.lease),
        lambda: queue.fail(c.lease, "EMBEDDING_TIMEOUT", "slow"),
    ):
        with pytest.raises(TaskCancelled):
            write()
    row = queue.get(task.task_id)
    assert (row["status"], row["lease_owner"], row["attempts"]) == ("CANCELLED", None, 1)
    assert transitions(queue, task.task_id)[-1] == ("RUNNING", "CANCELLED", 1)
    assert queue.claim("w2") == []


def test_cancel_of_pending_and_retry_wait(queue, publish_task, clock):
    pending = publish_task()
    queue.cancel(pending.task_id)
    waiting = publish_task()
    (c,) = queue.claim("w1")
    queue.fail(c.lease, "EMBEDDING_TIMEOUT", "slow")
    queue.cancel(waiting.task_id)
    assert [queue.get(t.task_id)["status"] for t in (pending, waiting)] == ["CANCELLED", "CANCELLED"]
    clock.advance(3600)
    assert queue.claim("w1") == []


def _to_status(queue: TaskQueue, publish_task, status: str) -> int:
    task = publish_task()
    if status == "PENDING":
        return task.task_id
    (c,) = queue.claim("w1")
    if status == "SUCCEEDED":
        queue.complete(c.lease)
    elif status == "DEAD":
        queue.fail(c.lease, "PARSE_ERROR", "bad")
    elif status == "CANCELLED":
        queue.cancel(task.task_id)
    elif status == "RETRY_WAIT":
        queue.fail(c.lease, "EMBEDDING_TIMEOUT", "slow")
    return task.task_id


@pytest.mark.parametrize("status", ["SUCCEEDED", "DEAD", "CANCELLED"])
def test_cancel_is_refused_unless_cancellable(queue, publish_task, status):
    task_id = _to_status(queue, publish_task, status)
    before = queue.events(task_id)
    with pytest.raises(IllegalTransition) as info:
        queue.cancel(task_id)
    assert info.value.data["status"] == status
    assert queue.get(task_id)["status"] == status and queue.events(task_id) == before


@pytest.mark.parametrize("status", ["PENDING", "RUNNING", "RETRY_WAIT", "SUCCEEDED"])
def test_retry_is_refused_unless_dead_or_cancelled(queue, publish_task, status):
    task_id = _to_status(queue, publish_task, status)
    before = queue.events(task_id)
    with pytest.raises(IllegalTransition, match=status):
        queue.retry(task_id)
    assert queue.get(task_id)["status"] == status and queue.events(task_id) == before


def test_unknown_tasks_are_not_found(queue):
    for verb in (queue.get, queue.cancel, queue.retry):
        with pytest.raises(TaskNotFound):
            verb(424242)
    assert queue.events(424242) == []


def test_manual_retry_keeps_attempts_and_grants_more(db, tmp_path, make_queue, clock):
    publisher = Publisher(db, BlobStore(str(tmp_path / "b")), max_attempts=2)
    task = publisher.publish("acme", "doc", b"x", "x.txt")
    queue = make_queue()
    for _ in range(2):
        (c,) = queue.claim("w1")
        queue.fail(c.lease, "EMBEDDING_TIMEOUT", "slow")
        clock.advance(3600)
    assert queue.get(task.task_id)["status"] == "DEAD"
    queue.retry(task.task_id, extra_attempts=3)
    row = queue.get(task.task_id)
    assert (row["status"], row["attempts"], row["max_attempts"]) == ("PENDING", 2, 5)
    (c,) = queue.claim("w1")
    assert c.lease.attempt == 3
    assert transitions(queue, task.task_id)[-2:] == [("DEAD", "PENDING", 2), ("PENDING", "RUNNING", 3)]
    with pytest.raises(ValueError):
        queue.retry(task.task_id, extra_attempts=0)


def test_progress_never_goes_backwards_within_an_attempt(queue, publish_task, clock):
    task = publish_task()
    (c,) = queue.claim("w1")
    queue.progress(c.lease, Stage.PARSE, 1, 1)
    queue.progress(c.lease, Stage.EMBED, 5, 10)
    queue.progress(c.lease, Stage.EMBED, 3, 10)  # late report: ignored
    queue.progress(c.lease, Stage.CHUNK, 9, 9)  # earlier stage: ignored
    row = queue.get(task.task_id)
    assert (row["stage"], row["completed"], row["total"]) == ("embed", 5, 10)
    queue.progress(c.lease, Stage.EMBED, 10, 10)
    progress = [(e["stage"], e["completed"]) for e in queue.events(task.task_id) if e["kind"] == "progress"]
    assert progress == [("parse", 1), ("embed", 5), ("embed", 10)]
    clock.advance(31)
    (again,) = queue.claim("w2")  # a new attempt starts from nothing
    assert queue.get(task.task_id)["stage"] is None
    queue.progress(again.lease, Stage.PARSE, 0, 1)
    assert queue.get(task.task_id)["stage"] == "parse"


def test_complete_inside_the_callers_transaction_commits_or_rolls_back_with_it(queue, publish_task, db):
    task = publish_task()
    (c,) = queue.claim("w1")
    with pytest.raises(RuntimeError), db.transaction() as tx:
        locked, refused = lock_fenced(queue, tx, [c.lease])
        assert list(locked) == [task.task_id] and refused == []
        queue.complete_published(tx, [c.lease], [3])
        raise RuntimeError("the chunk write failed")
    assert queue.get(task.task_id)["status"] == "RUNNING"
    with db.transaction() as tx:
        lock_fenced(queue, tx, [c.lease])
        queue.complete_published(tx, [c.lease], [3])
    row = queue.get(task.task_id)
    assert (row["status"], row["chunk_count"], row["lease_owner"]) == ("SUCCEEDED", 3, None)


def test_lock_fenced_locks_held_leases_and_explains_the_lost_ones(queue, publish_task, db, clock):
    for _ in range(3):
        publish_task()
    a, b, c = queue.claim("w1")
    queue.cancel(b.lease.task_id)
    stale = Lease(c.lease.task_id, c.lease.attempt + 1, "w1", c.lease.lease_until)
    with db.transaction() as tx:
        locked, refused = lock_fenced(queue, tx, [c.lease, a.lease, b.lease, stale])
        assert sorted(locked) == sorted([a.lease.task_id, c.lease.task_id])
        assert [(lease, type(exc)) for lease, exc in refused] == [(b.lease, TaskCancelled), (stale, LeaseLost)]
    with pytest.raises(ValueError):
        with db.transaction() as tx:
            lock_fenced(queue, tx, [a.lease, Lease(c.lease.task_id, 1, "w2", c.lease.lease_until)])


def test_progress_many_moves_every_held_lease_forward_and_returns_the_lost_ones(queue, publish_task, clock):
    for _ in range(3):
        publish_task()
    a, b, c = queue.claim("w1")
    assert queue.progress_many([a.lease, b.lease, c.lease], Stage.EMBED, [5, 0, 2], [10, 4, 2]) == []
    assert queue.progress_many([a.lease], Stage.EMBED, [3], [10]) == []  # late report: ignored
    assert queue.progress_many([b.lease], Stage.PARSE, [1], [1]) == []  # earlier stage: ignored
    rows = [queue.get(x.lease.task_id) for x in (a, b, c)]
    assert [(r["stage"], r["completed"], r["total"]) for r in rows] == [("embed", 5, 10), ("embed", 0, 4), ("embed", 2, 2)]
    progress = [(e["stage"], e["completed"]) for e in queue.events(a.lease.task_id) if e["kind"] == "progress"]
    assert progress == [("embed", 5)]  # one event per advance, none for the ignored report
    queue.cancel(b.lease.task_id)
    clock.advance(31)  # every lease expired: each refusal says why
    (again,) = [x for x in queue.claim("w2", limit=3) if x.lease.task_id == c.lease.task_id]
    refused = queue.progress_many([a.lease, b.lease, c.lease], Stage.PUBLISH, [0, 0, 0], [1, 1, 1])
    assert [(lease.task_id, type(exc)) for lease, exc in refused] == [
        (a.lease.task_id, LeaseLost), (b.lease.task_id, TaskCancelled), (c.lease.task_id, LeaseLost)]
    assert queue.progress_many([], Stage.PARSE, [], []) == []


def test_complete_many_completes_held_leases_and_returns_the_lost_ones(queue, publish_task, clock):
    for _ in range(3):
        publish_task()
    a, b, c = queue.claim("w1")
    queue.cancel(b.lease.task_id)
    lost = queue.complete_many([a.lease, b.lease, c.lease])
    assert lost == [b.lease]
    assert [queue.get(x.lease.task_id)["status"] for x in (a, b, c)] == ["SUCCEEDED", "CANCELLED", "SUCCEEDED"]
    assert transitions(queue, a.lease.task_id)[-1] == ("RUNNING", "SUCCEEDED", 1)
    with pytest.raises(ValueError):
        queue.complete_many([a.lease, Lease(9, 1, "other", a.lease.lease_until)])


def test_fail_crashed_run_only_hits_the_crashed_attempt(queue, publish_task, clock):
    task = publish_task()
    (c,) = queue.claim("w1")
    clock.advance(31)
    (again,) = queue.claim("w2")
    assert queue.fail_crashed_run([(task.task_id, c.lease.attempt)], owner="w1", run_owner="w1") == []  # long gone
    assert queue.get(task.task_id)["status"] == "RUNNING"
    # attempt 2 crashed: failed at once, even after its lease ran out, but only by its own run
    clock.advance(120)
    assert queue.fail_crashed_run([(task.task_id, again.lease.attempt)], owner="w1", run_owner="w1") == []
    outcomes = queue.fail_crashed_run([(task.task_id, again.lease.attempt)], message="run 42 failed",
                                      owner="w2", run_owner="w2")
    assert [o.status for o in outcomes] == [TaskStatus.RETRY_WAIT]
    row = queue.get(task.task_id)
    assert (row["status"], row["error_code"], row["next_attempt_at"]) == ("RETRY_WAIT", "RUN_CRASHED", clock.now)
    assert [x.lease.attempt for x in queue.claim("w3")] == [3]
    with pytest.raises(LeaseLost):
        queue.complete(again.lease)


def test_list_events_and_stats(queue, publish_task, clock):
    tasks = [publish_task(tenant=t) for t in ("acme", "acme", "globex", "acme")]
    c1, c2 = queue.claim("w1", limit=2)
    queue.fail(c1.lease, "PARSE_ERROR", "bad")
    queue.heartbeat(c2.lease)
    clock.advance(10)
    stats = queue.stats()
    assert stats["due_now"] == 2 and stats["oldest_due_age_seconds"] >= 10
    assert (stats["running"], stats["pending"], stats["dead"], stats["succeeded"], stats["cancelled"]) == (1, 2, 1, 0, 0)
    assert stats["expiring_within_minute"] == 1 and stats["expired_leases"] == 0
    assert stats["dead_by_code"] == {"PARSE_ERROR": 1}
    clock.advance(60)
    assert queue.stats()["expired_leases"] == 1
    assert [t["task_id"] for t in queue.list(tenant="acme")] == [tasks[3].task_id, tasks[1].task_id, tasks[0].task_id]
    assert [t["task_id"] for t in queue.list(status="pending")] == [tasks[3].task_id, tasks[2].task_id]
    assert len(queue.list(limit=1)) == 1
    first, *rest = queue.events(tasks[0].task_id)
    assert [e["event_id"] for e in queue.events(tasks[0].task_id, after_event_id=first["event_id"])] == [
        e["event_id"] for e in rest
    ]
