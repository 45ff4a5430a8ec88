"""Invariant 1 under contention: concurrent claimers (threads and processes) never share a lease attempt.

Leases are a few milliseconds long, so most rounds take over expired leases from each other: the
hardest case for fencing. Every granted (task_id, attempt) is recorded; each must be granted once,
and every attempt a task's counter went through must have been handed to exactly one claimer.
"""

from __future__ import annotations

import multiprocessing
import random
import threading
from collections import Counter

import pytest

from pipelines.domain.errors import FenceRejected
from resources.blob_store import BlobStore
from resources.database import Database
from resources.publisher import Publisher
from resources.task_queue import TaskQueue

TASKS = 30
ROUNDS = 150
LEASE_SECONDS = 0.005


def claim_rounds(queue: TaskQueue, owner: str, rounds: int, seed: int) -> tuple[list[tuple[int, int]], list[tuple[int, int]]]:
    """Claim ``rounds`` times; heartbeat some leases, complete a few. Returns (granted, completed) pairs."""
    rng = random.Random(seed)
    granted: list[tuple[int, int]] = []
    completed: list[tuple[int, int]] = []
    for _ in range(rounds):
        for claimed in queue.claim(owner, limit=rng.randint(1, 4)):
            lease = claimed.lease
            granted.append((lease.task_id, lease.attempt))
            roll = rng.random()
            try:
                if roll < 0.3:
                    queue.heartbeat(lease)
                elif roll < 0.33:
                    queue.complete(lease)
                    completed.append((lease.task_id, lease.attempt))
            except FenceRejected:
                pass  # taken over already: expected with leases this short
    return granted, completed


def _process_main(url: str, owner: str, seed: int, start, out) -> None:
    with Database(url, max_size=1) as db:
        queue = TaskQueue(db, lease_seconds=LEASE_SECONDS)
        start.wait(60)
        out.put(claim_rounds(queue, owner, ROUNDS, seed))


def check(db: Database, granted: list[tuple[int, int]], completed: list[tuple[int, int]]) -> None:
    duplicates = [pair for pair, n in Counter(granted).items() if n > 1]
    assert not duplicates, f"lease attempts granted twice: {duplicates[:10]}"
    assert len(granted) > TASKS * 3, "too little contention to mean anything"
    queue = TaskQueue(db)
    by_task: dict[int, set[int]] = {}
    for task_id, attempt in granted:
        by_task.setdefault(task_id, set()).add(attempt)
    for task in queue.list(limit=TASKS * 2):
        attempts = by_task.get(task["task_id"], set())
        # Every attempt the counter went through was handed to exactly one claimer: none lost, none shared.
        assert attempts == set(range(1, task["attempts"] + 1)), task["task_id"]
    assert len({task_id for task_id, _ in completed}) == len(completed), "a task completed twice"
    for task_id, attempt in completed:
        row = queue.get(task_id)
        assert (row["status"], row["attempts"]) == ("SUCCEEDED", attempt)


@pytest.fixture
def many_tasks(db, tmp_path) -> None:
    publisher = Publisher(db, BlobStore(str(tmp_path / "blobs")), max_attempts=100_000)
    for i in range(TASKS):
        publisher.publish("acme", f"doc-{i}", f"body {i}".encode(), f"doc-{i}.txt")


@pytest.mark.parametrize("same_name", [False, True], ids=["distinct-owners", "same-owner-name"])
def test_threads_never_share_a_lease_attempt(db, many_tasks, same_name):
    workers = 8
    barrier = threading.Barrier(workers)
    results: list[tuple[list[tuple[int, int]], list[tuple[int, int]]]] = [([], [])] * workers

    def run(i: int) -> None:
        queue = TaskQueue(db, lease_seconds=LEASE_SECONDS)
        barrier.wait()
        results[i] = claim_rounds(queue, "worker" if same_name else f"worker-{i}", ROUNDS, seed=i)

    threads = [threading.Thread(target=run, args=(i,)) for i in range(workers)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    granted = [pair for g, _ in results for pair in g]
    completed = [pair for _, c in results for pair in c]
    check(db, granted, completed)


def test_processes_never_share_a_lease_attempt(db, db_url, many_tasks):
    ctx = multiprocessing.get_context("spawn")
    start, out = ctx.Event(), ctx.Queue()
    procs = [ctx.Process(target=_process_main, args=(db_url, "worker", i, start, out)) for i in range(4)]
    for p in procs:
        p.start()
    start.set()
    results = [out.get(timeout=120) for _ in procs]
    for p in procs:
        p.join(60)
        assert p.exitcode == 0
    granted = [pair for g, _ in results for pair in g]
    completed = [pair for _, c in results for pair in c]
    check(db, granted, completed)
