"""The claim takes each tenant's oldest due task before anyone's second (issue #31, finding 8): two tenants'
bulk backlogs, queued earlier, must not hold a third tenant's one task until they drain. Real database, the
real claim statement, and real threads claiming at once (no task leased twice)."""

from __future__ import annotations

import threading
from datetime import timedelta

import psycopg

BACKLOG = 200


def load(db, db_url, tenant: str, count: int, minutes_ago: float) -> None:
    where = {"tenant": tenant, "document": f"{tenant}-doc", "first": 1, "count": count}
    db.execute("task_bench_load_versions", where)
    db.execute("task_bench_analyze")
    db.execute("task_bench_load_tasks", {**where, "profile": "minilm-v1", "now": None})
    with psycopg.connect(db_url, autocommit=True) as conn:  # queued earlier than the claim's pinned clock
        conn.execute("UPDATE index_task SET next_attempt_at = now() - %s * interval '1 minute' + task_id * interval '1 ms'"
                     " WHERE tenant_id = %s", (minutes_ago, tenant))


def test_a_third_tenants_one_task_is_claimed_in_the_first_claim(db, db_url, queue):
    load(db, db_url, "big-a", BACKLOG, 60)
    load(db, db_url, "big-b", BACKLOG, 50)
    load(db, db_url, "small-c", 1, 1)  # the newest task of all: by age alone it would come 401st
    claimed = queue.claim("w1", limit=6)
    tenants = [t.tenant_id for t in claimed]
    assert "small-c" in tenants, tenants
    assert sorted(tenants) == ["big-a"] * 4 + ["big-b", "small-c"]  # three heads, then the oldest three (all big-a)
    oldest_a = min(t.lease.task_id for t in claimed if t.tenant_id == "big-a")
    with psycopg.connect(db_url) as conn:
        (first_a,) = conn.execute("SELECT min(task_id) FROM index_task WHERE tenant_id = 'big-a'").fetchone()
    assert oldest_a == first_a  # each tenant's head is its oldest


def test_heads_take_at_most_half_a_claim_and_a_claim_of_one_goes_by_age(db, db_url, queue):
    for i in range(6):  # t5 queued first: the oldest tasks are all t5's
        load(db, db_url, f"t{i}", 3, 10 + i)
    claimed = queue.claim("w1", limit=4)
    assert sorted(t.tenant_id for t in claimed) == ["t0", "t1", "t5", "t5"]  # 2 heads (name order), 2 by age
    (one,) = queue.claim("w2", limit=1)
    assert one.tenant_id == "t5"  # no head: a worker claiming one at a time never favours a tenant by its name


def test_concurrent_claimers_never_lease_a_task_twice(db, db_url, make_queue):
    load(db, db_url, "big-a", BACKLOG, 60)
    load(db, db_url, "big-b", BACKLOG, 50)
    for i in range(10):
        load(db, db_url, f"small-{i}", 1, 1)
    got: list[int] = []
    lock = threading.Lock()

    def claimer(n: int) -> None:
        q = make_queue()
        while True:
            batch = q.claim(f"w{n}", limit=8)
            if not batch:
                return
            with lock:
                got.extend(t.lease.task_id for t in batch)

    threads = [threading.Thread(target=claimer, args=(n,)) for n in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=120)
    assert len(got) == len(set(got)) == 2 * BACKLOG + 10
