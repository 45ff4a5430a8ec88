"""A cancel is never a dead end (issue #12, defect 6; DESIGN.md state table).

``kbindex retry`` moves a CANCELLED task back to PENDING, and publishing the same bytes again re-queues
it: the same row, attempts kept (the fencing token only grows), more attempts granted, and each
transition has its event row, so ``kbindex verify`` still finds every history a legal chain.
"""

from __future__ import annotations

import pytest

from pipelines.domain.errors import IllegalTransition, LeaseLost
from pipelines.domain.task_states import Stage
from resources.blob_store import BlobStore
from resources.publisher import Publisher
from resources.verifier import verify


def transitions(queue, task_id):
    return [(e["from_status"], e["to_status"], e["attempt"]) for e in queue.events(task_id) if e["kind"] == "transition"]


def assert_verified(db):
    report = verify(db, claim_interval=3600)
    assert report.ok, report.violations


def test_retry_moves_a_cancelled_task_back_to_pending(queue, publish_task, db):
    task = publish_task()
    (run,) = queue.claim("w1")
    queue.cancel(task.task_id)
    queue.retry(task.task_id, extra_attempts=3)
    row = queue.get(task.task_id)
    assert (row["status"], row["attempts"], row["max_attempts"], row["finished_at"]) == ("PENDING", 1, 4, None)
    assert transitions(queue, task.task_id)[-2:] == [("RUNNING", "CANCELLED", 1), ("CANCELLED", "PENDING", 1)]
    (again,) = queue.claim("w2")
    assert (again.lease.task_id, again.lease.attempt) == (task.task_id, 2)
    with pytest.raises(LeaseLost):  # the cancelled run's lease stays dead: its token is behind
        queue.progress(run.lease, Stage.PARSE, 1, 1)
    queue.complete(again.lease, chunk_count=0)
    assert_verified(db)


def test_a_cancelled_pending_task_is_retried_too(queue, publish_task, db):
    task = publish_task()
    queue.cancel(task.task_id)
    queue.retry(task.task_id, extra_attempts=2)
    assert transitions(queue, task.task_id) == [(None, "PENDING", 0), ("PENDING", "CANCELLED", 0),
                                               ("CANCELLED", "PENDING", 0)]
    assert queue.claim("w1")[0].lease.attempt == 1
    assert_verified(db)


def test_publishing_the_same_bytes_requeues_a_cancelled_task(db, tmp_path, queue):
    publisher = Publisher(db, BlobStore(str(tmp_path / "b")), max_attempts=3)
    first = publisher.publish("acme", "doc", b"same bytes", "doc.txt")
    assert (first.created, first.requeued, first.status) == (True, False, "PENDING")
    (run,) = queue.claim("w1")
    queue.cancel(first.task_id)
    again = publisher.publish("acme", "doc", b"same bytes", "doc.txt")
    assert (again.task_id, again.version, again.created, again.requeued, again.status) == (
        first.task_id, 1, False, True, "PENDING"
    )
    row = queue.get(first.task_id)
    assert (row["status"], row["attempts"], row["max_attempts"], row["finished_at"]) == ("PENDING", 1, 4, None)
    events = [e for e in queue.events(first.task_id) if e["kind"] == "transition"]
    assert (events[-1]["from_status"], events[-1]["to_status"], events[-1]["attempt"]) == ("CANCELLED", "PENDING", 1)
    assert events[-1]["message"] == "published again"
    (c,) = queue.claim("w2")
    assert (c.lease.task_id, c.lease.attempt) == (first.task_id, 2)
    # Nothing else to re-queue: a publish of the same bytes while it runs is the same task, unchanged.
    third = publisher.publish("acme", "doc", b"same bytes", "doc.txt")
    assert (third.task_id, third.created, third.requeued, third.status) == (first.task_id, False, False, "RUNNING")
    assert_verified(db)
    del run


@pytest.mark.parametrize("status", ["SUCCEEDED", "DEAD"])
def test_publishing_the_same_bytes_leaves_other_finished_tasks_alone(db, tmp_path, queue, status):
    publisher = Publisher(db, BlobStore(str(tmp_path / "b")))
    first = publisher.publish("acme", "doc", b"same bytes", "doc.txt")
    (c,) = queue.claim("w1")
    if status == "SUCCEEDED":
        queue.complete(c.lease, chunk_count=0)
    else:
        queue.fail(c.lease, "PARSE_ERROR", "bad")
    before = queue.events(first.task_id)
    again = publisher.publish("acme", "doc", b"same bytes", "doc.txt")
    assert (again.task_id, again.created, again.requeued, again.status) == (first.task_id, False, False, status)
    assert queue.events(first.task_id) == before


def test_new_bytes_after_a_cancel_make_a_new_version_and_leave_the_cancelled_one(db, tmp_path, queue):
    publisher = Publisher(db, BlobStore(str(tmp_path / "b")))
    first = publisher.publish("acme", "doc", b"one", "doc.txt")
    queue.cancel(first.task_id)
    second = publisher.publish("acme", "doc", b"two", "doc.txt")
    assert (second.version, second.created, second.requeued) == (2, True, False)
    assert queue.get(first.task_id)["status"] == "CANCELLED"


@pytest.mark.parametrize("status", ["PENDING", "RETRY_WAIT", "RUNNING", "SUCCEEDED"])
def test_retry_is_still_refused_for_live_and_succeeded_tasks(queue, publish_task, status):
    task = publish_task()
    if status != "PENDING":
        (c,) = queue.claim("w1")
        if status == "SUCCEEDED":
            queue.complete(c.lease)
        elif status == "RETRY_WAIT":
            queue.fail(c.lease, "EMBEDDING_TIMEOUT", "slow")
    with pytest.raises(IllegalTransition, match="only DEAD or CANCELLED"):
        queue.retry(task.task_id)
