"""A REINDEX task that was already attempted is due work: the sensor's claim takes it again (issue #12, defect 3).

Never-attempted REINDEX backlog stays for the operator's backfill; but once a backfill run has tried a task
(it failed retryably, its run crashed, or it went DEAD and a person retried it), no backfill comes back for it,
so the sensor's claim must pick it up when it is due, like any INDEX task.
"""

from __future__ import annotations

import random

import psycopg
import pytest

from resources.task_queue import TaskQueue


@pytest.fixture
def shadow(db, publish_task, queue: TaskQueue):
    """Two documents indexed live, a building profile 'shadow' and one never-attempted REINDEX task per document."""
    docs = [publish_task(document=f"doc-{n}") for n in range(2)]
    for c in queue.claim("sensor", limit=10):
        queue.complete(c.lease, chunk_count=1)
    with psycopg.connect(db.url, autocommit=True) as conn:
        conn.execute(
            "INSERT INTO index_profile (name, model, dimension, chunk_tokens, chunk_overlap, building)"
            " VALUES ('shadow', 'fake-384', 384, 128, 16, true)"
        )
    tried, backlog = (queue.ensure_task("acme", d.document_id, 1, "shadow") for d in docs)
    assert {queue.get(t)["task_type"] for t in (tried, backlog)} == {"REINDEX"}
    return tried, backlog


def _sensor_claims(queue: TaskQueue) -> list[tuple[int, int]]:
    return [(c.lease.task_id, c.lease.attempt) for c in queue.claim("sensor", limit=10)]


def test_a_retryably_failed_reindex_task_is_claimed_after_its_backoff(make_queue, shadow, clock):
    tried, backlog = shadow
    queue = make_queue(backoff_base=100.0, rng=random.Random(7))
    run = queue.claim_task(tried, "backfill-run")
    assert queue.fail(run.lease, "EMBEDDING_TIMEOUT", "slow provider") == "RETRY_WAIT"
    due_at = queue.get(tried)["next_attempt_at"]
    assert due_at > clock.now
    assert _sensor_claims(queue) == []  # still backing off
    clock.now = due_at
    assert _sensor_claims(queue) == [(tried, 2)]
    assert queue.get(backlog)["status"] == "PENDING"  # the backfill's share is left alone


def test_a_reindex_task_of_a_crashed_run_is_claimed_at_once(queue, shadow):
    tried, backlog = shadow
    run = queue.claim_task(tried, "backfill-run")
    assert [o.status for o in queue.fail_crashed_run([(tried, run.lease.attempt)], owner="backfill-run", run_owner="backfill-run")] == ["RETRY_WAIT"]
    (claimed,) = queue.claim("sensor", limit=10)
    assert (claimed.lease.task_id, claimed.lease.attempt, claimed.task_type, claimed.profile) == (
        tried, 2, "REINDEX", "shadow"
    )
    assert queue.get(backlog)["status"] == "PENDING"


def test_a_dead_reindex_task_retried_by_hand_is_claimed(queue, shadow):
    tried, backlog = shadow
    run = queue.claim_task(tried, "backfill-run")
    assert queue.fail(run.lease, "PARSE_ERROR", "bad file") == "DEAD"
    assert _sensor_claims(queue) == []
    queue.retry(tried, extra_attempts=2)
    assert _sensor_claims(queue) == [(tried, 2)]
    assert queue.get(backlog)["status"] == "PENDING"


def test_never_attempted_reindex_backlog_is_left_to_the_backfill(queue, shadow, clock):
    tried, backlog = shadow
    clock.advance(3600)
    assert _sensor_claims(queue) == []
    assert queue.claim_task(backlog, "backfill-run").lease.attempt == 1


def test_the_claim_walks_the_due_index_with_a_reindex_backlog(db, publish_task, clock):
    """A large never-attempted REINDEX backlog and a few retried ones: the claim still walks index_task_due_idx."""
    import json

    from tests.integration.test_claim_plan import claim_plan, scans_of_index_task, walk

    where = {"tenant": "plan", "document": "doc", "first": 1, "count": 5000}
    db.execute("task_bench_load_versions", where)
    db.execute("task_bench_analyze")
    db.execute("task_bench_load_tasks", {**where, "profile": "minilm-v1", "now": None})
    with psycopg.connect(db.url, autocommit=True) as conn:
        conn.execute(
            """
            UPDATE index_task SET
              task_type = CASE WHEN task_id % 10 = 0 THEN 'INDEX' ELSE 'REINDEX' END,
              attempts = CASE WHEN task_id % 10 = 1 THEN 1 ELSE 0 END,
              status = CASE WHEN task_id % 10 = 1 THEN 'RETRY_WAIT' WHEN task_id % 10 = 2 THEN 'SUCCEEDED'
                            ELSE 'PENDING' END
            """
        )
        conn.execute("VACUUM ANALYZE index_task")
    root = claim_plan(db.url)
    nodes = list(walk(root))
    assert "index_task_due_idx" in {n.get("Index Name") for n in nodes}, json.dumps(root, indent=1)
    assert not [n for n in nodes if n["Node Type"] == "Seq Scan" and n.get("Relation Name") == "index_task"]
    assert not [n for n in nodes if n["Node Type"] == "Sort" and scans_of_index_task(n)]
    claimed = TaskQueue(db).claim("sensor", limit=20)
    assert len(claimed) == 20
    assert all(c.task_type == "INDEX" or c.lease.attempt == 2 for c in claimed)
