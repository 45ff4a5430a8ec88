"""The claim statement reads two partial indexes and never scans or sorts the queue (pgqueuer-style plan test)."""

from __future__ import annotations

import json
from collections.abc import Iterator
from datetime import UTC, datetime
from typing import Any

import psycopg
import pytest

from resources.task_queue import NEVER_STARTED_MESSAGE
from sql import queries
from tests.plans import walk

QUEUE_ROWS = 20_000


def walk_inline(node: dict[str, Any]) -> Iterator[dict[str, Any]]:
    """The node and what feeds it, leaving out CTEs and subplans (which EXPLAIN hangs under the top node)."""
    yield node
    for child in node.get("Plans", []):
        if child.get("Parent Relationship") not in ("InitPlan", "SubPlan"):
            yield from walk_inline(child)


def scans_of_index_task(node: dict[str, Any]) -> list[dict[str, Any]]:
    return [n for n in walk_inline(node) if n.get("Relation Name") == "index_task"]


@pytest.fixture
def big_queue(db, db_url) -> str:
    """20k tasks shaped like a busy day: mostly SUCCEEDED, some due, waiting, running, expired."""
    where = {"tenant": "plan", "document": "doc", "first": 1, "count": QUEUE_ROWS}
    db.execute("task_bench_load_versions", where)
    db.execute("task_bench_analyze")
    db.execute("task_bench_load_tasks", {**where, "profile": "minilm-v1", "now": None})
    with psycopg.connect(db_url, autocommit=True) as conn:
        conn.execute(
            """
            UPDATE index_task SET
              status = CASE WHEN task_id % 20 = 0 THEN 'PENDING'
                            WHEN task_id % 20 = 1 THEN 'RETRY_WAIT'
                            WHEN task_id % 20 IN (2, 3) THEN 'RUNNING'
                            WHEN task_id % 20 = 4 THEN 'DEAD'
                            ELSE 'SUCCEEDED' END,
              next_attempt_at = now() + (task_id % 7 - 3) * interval '1 minute',
              lease_owner = CASE WHEN task_id % 20 IN (2, 3) THEN 'w' END,
              lease_until = CASE WHEN task_id % 20 IN (2, 3) THEN now() + (task_id % 5 - 2) * interval '1 minute' END
            """
        )
        conn.execute("VACUUM ANALYZE index_task")
    return db_url


def claim_plan(url: str) -> dict[str, Any]:
    """The planner's own choice (enable_seqscan left on) for the real claim statement and parameters."""
    params = {"source": "queue", "task_id": None, "owner": "w1", "limit": 10, "lease_seconds": 60.0,
              "now": datetime.now(UTC), "reserve": True, "giveback_limit": 5,
              "never_started_message": NEVER_STARTED_MESSAGE}
    with psycopg.connect(url) as conn:
        (plan,) = conn.execute("EXPLAIN (FORMAT JSON) " + queries["task_claim"], params).fetchone()
    plan = plan if isinstance(plan, list) else json.loads(plan)
    return plan[0]["Plan"]


@pytest.mark.parametrize("running", ["many", "none"])
def test_claim_walks_both_partial_indexes_and_never_seq_scans_the_queue(big_queue, running):
    if running == "none":  # statistics that say nothing runs must not tempt the planner off the lease index
        with psycopg.connect(big_queue, autocommit=True) as conn:
            conn.execute("UPDATE index_task SET status = 'PENDING', lease_owner = NULL, lease_until = NULL"
                         " WHERE status = 'RUNNING'")
            conn.execute("VACUUM ANALYZE index_task")
    root = claim_plan(big_queue)
    nodes = list(walk(root))
    used = {n.get("Index Name") for n in nodes}
    assert {"index_task_due_idx", "index_task_lease_idx", "index_task_tenant_due_idx"} <= used, json.dumps(root, indent=1)
    seq = [n for n in nodes if n["Node Type"] == "Seq Scan" and n.get("Relation Name") == "index_task"]
    assert not seq, json.dumps(root, indent=1)
    # Each index walk is cut by its own LIMIT; any sort sees only the at most 2 x limit candidates.
    for n in nodes:
        if n["Node Type"] == "Sort":
            assert not scans_of_index_task(n), json.dumps(n, indent=1)
    for n in nodes:
        if n.get("Index Name") in ("index_task_due_idx", "index_task_lease_idx"):
            assert n["Node Type"] == "Index Scan" and n.get("Scan Direction") == "Forward"

    # The check is meaningful: on the same data the textbook OR-ed claim scans or sorts the queue.
    textbook = """
        EXPLAIN (FORMAT JSON)
        SELECT task_id FROM index_task
        WHERE status IN ('PENDING', 'RETRY_WAIT', 'RUNNING')
          AND ((status <> 'RUNNING' AND next_attempt_at <= now()) OR (status = 'RUNNING' AND lease_until <= now()))
        ORDER BY coalesce(lease_until, next_attempt_at) LIMIT 10 FOR UPDATE SKIP LOCKED
    """
    with psycopg.connect(big_queue) as conn:
        (plan,) = conn.execute(textbook).fetchone()
    nodes = list(walk(plan[0]["Plan"]))
    assert any(
        (n["Node Type"] == "Seq Scan" and n.get("Relation Name") == "index_task")
        or (n["Node Type"] == "Sort" and scans_of_index_task(n))
        for n in nodes
    ), json.dumps(plan, indent=1)


def test_bench_smoke(pg_server_url, monkeypatch):
    """bench.queue runs end to end at CI size and reports a positive rate."""
    from bench.queue.__main__ import run

    monkeypatch.setenv("KBINDEX_DATABASE_URL", pg_server_url)
    lines: list[str] = []
    results = run([1000], [1], 1.5, out=lines.append)
    assert results[(1000, 1)] > 0
    assert any("claim+complete per second" in line for line in lines)
