"""Model-based test: random queue operations against a plain-Python model of the task state machine.

Hypothesis drives publish, publish of the same bytes again, claim, heartbeat, progress, complete, fail
(random codes), crash-fail, cancel, retry, with jumps of the pinned clock past leases before claims and lease uses; after every step the database must agree
with the model (status, attempts, lease) and with its own event history, and no two grants may
share a (task, attempt).
"""

from __future__ import annotations

import itertools
import random
from dataclasses import dataclass
from datetime import datetime, timedelta

import psycopg
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import (
    RuleBasedStateMachine,
    initialize,
    invariant,
    precondition,
    rule,
    run_state_machine_as_test,
)

from pipelines.domain.errors import IllegalTransition, LeaseLost, TaskCancelled, is_retryable
from pipelines.domain.task_states import Stage, backoff_seconds
from resources.blob_store import BlobStore
from resources.publisher import Publisher
from resources.task_queue import Lease, TaskQueue
from tests.integration.conftest import PinnedClock

LEASE = 10.0
MAX_ATTEMPTS = 2
BASE, CAP = 1.0, 8.0
SEED = 1234
CODES = ["EMBEDDING_TIMEOUT", "RUN_CRASHED", "INTERNAL_ERROR", "PARSE_ERROR", "EMBEDDING_INVALID_RESPONSE"]
STAGES = list(Stage)
# Clock jumps before a claim or a lease use: none, a little, to exactly the lease end, past it.
ADVANCES = st.sampled_from([0.0, 0.001, 4.0, LEASE, LEASE + 1.0])


@dataclass
class Model:
    """What the database should hold for one task."""

    status: str
    attempts: int
    max_attempts: int
    next_attempt_at: datetime
    owner: str | None = None
    lease_until: datetime | None = None
    stage_rank: int = 0
    completed: int = 0


def make_machine(db, db_url: str, tmp_path):
    names = itertools.count()

    class QueueMachine(RuleBasedStateMachine):
        def __init__(self) -> None:
            super().__init__()
            with psycopg.connect(db_url, autocommit=True) as conn:
                conn.execute("TRUNCATE document, index_task, task_event RESTART IDENTITY CASCADE")
            self.clock = PinnedClock()
            self.queue = TaskQueue(
                db, lease_seconds=LEASE, clock=self.clock, backoff_base=BASE, backoff_cap=CAP,
                rng=random.Random(SEED),
            )
            self.rng = random.Random(SEED)  # draws the same backoffs as the queue, call for call
            self.publisher = Publisher(db, BlobStore(str(tmp_path / "blobs")), max_attempts=MAX_ATTEMPTS)
            self.model: dict[int, Model] = {}
            self.documents: dict[int, tuple[str, bytes]] = {}  # task -> the document and bytes it indexes
            self.leases: list[Lease] = []  # every lease ever granted, stale ones included
            self.granted: set[tuple[int, int]] = set()
            self.seen_attempts: dict[int, int] = {}

        # -- helpers ---------------------------------------------------------------------------

        def holds(self, lease: Lease) -> bool:
            m = self.model[lease.task_id]
            return (
                m.status == "RUNNING"
                and m.owner == lease.owner
                and m.attempts == lease.attempt
                and m.lease_until is not None
                and m.lease_until > self.clock.now
            )

        def expect_refusal(self, lease: Lease, call) -> None:
            expected = TaskCancelled if self.model[lease.task_id].status == "CANCELLED" else LeaseLost
            try:
                call()
            except expected:
                return
            raise AssertionError(f"{expected.__name__} expected for {lease}")

        def draw_lease(self, data) -> Lease:
            """Mostly one of the newest leases (likely still live), sometimes any stale one."""
            return data.draw(st.one_of(st.sampled_from(self.leases[-3:]), st.sampled_from(self.leases)))

        def unfinished(self) -> int:
            return sum(m.status not in ("SUCCEEDED", "DEAD", "CANCELLED") for m in self.model.values())

        def end_lease(self, m: Model) -> None:
            m.owner = None
            m.lease_until = None

        # -- rules -----------------------------------------------------------------------------

        @initialize()
        def first_tasks(self) -> None:
            for _ in range(2):
                self.publish()

        @precondition(lambda self: len(self.model) < 12 and self.unfinished() < 3)
        @rule()
        def publish(self) -> None:
            n = next(names)
            result = self.publisher.publish("acme", f"doc-{n}", f"body {n}".encode(), f"d{n}.txt")
            row = self.queue.get(result.task_id)
            self.model[result.task_id] = Model("PENDING", 0, MAX_ATTEMPTS, row["next_attempt_at"])
            self.documents[result.task_id] = (f"doc-{n}", f"body {n}".encode())

        @rule(data=st.data())
        def publish_again(self, data) -> None:
            """The owner publishes a document's same bytes again: a CANCELLED task is re-queued (attempts kept,
            a publisher's worth more granted); any other status is returned unchanged."""
            tid = data.draw(st.sampled_from(sorted(self.model)))
            document, body = self.documents[tid]
            result = self.publisher.publish("acme", document, body, "again.txt")
            m = self.model[tid]
            assert (result.task_id, result.created, result.requeued) == (tid, False, m.status == "CANCELLED")
            if m.status == "CANCELLED":
                m.status, m.max_attempts = "PENDING", m.attempts + MAX_ATTEMPTS
                m.next_attempt_at = self.queue.get(tid)["next_attempt_at"]  # the database's now(), not the pin
            assert result.status == m.status

        @rule(owner=st.sampled_from(["a", "a", "b"]), limit=st.integers(1, 3), advance=ADVANCES)
        def claim(self, owner: str, limit: int, advance: float) -> None:
            """Time passes (often past leases), then a claimer asks for work."""
            now = self.clock.advance(advance)
            due = [(m.next_attempt_at, tid) for tid, m in self.model.items()
                   if m.status in ("PENDING", "RETRY_WAIT") and m.next_attempt_at <= now]
            expired = [(m.lease_until, tid) for tid, m in self.model.items()
                       if m.status == "RUNNING" and m.lease_until is not None and m.lease_until <= now]
            # Ties on the boundary may go either way (the index breaks them by heap position), so every
            # tie is a candidate: an exhausted one the walk took ends DEAD and fills a place.
            candidates = sorted(due + expired)
            boundary = candidates[limit - 1][0] if len(candidates) >= limit else None
            claimed = self.queue.claim(owner, limit)
            got = {c.lease.task_id for c in claimed}
            exhausted = {
                tid for _, tid in candidates
                if self.model[tid].status == "RUNNING" and self.model[tid].attempts >= self.model[tid].max_attempts
            }
            dead_now = {tid for tid in exhausted if self.queue.get(tid)["status"] == "DEAD"}
            chosen = got | dead_now
            assert len(chosen) == min(limit, len(candidates)), (chosen, candidates)
            assert not (got & exhausted), "an exhausted task was granted a lease"
            for since, tid in candidates:
                if boundary is None or since < boundary:
                    assert tid in chosen, f"task {tid} due at {since} was passed over"
                elif since > boundary:
                    assert tid not in chosen
            for c in claimed:
                m = self.model[c.lease.task_id]
                m.status, m.attempts, m.owner = "RUNNING", m.attempts + 1, owner
                m.lease_until = now + timedelta(seconds=LEASE)
                m.stage_rank, m.completed = 0, 0
                assert (c.lease.attempt, c.lease.owner, c.lease.lease_until) == (m.attempts, owner, m.lease_until)
                pair = (c.lease.task_id, c.lease.attempt)
                assert pair not in self.granted, f"lease attempt {pair} granted twice"
                self.granted.add(pair)
                self.leases.append(c.lease)
            for tid in dead_now:
                m = self.model[tid]
                m.status = "DEAD"
                self.end_lease(m)

        @precondition(lambda self: bool(self.leases))
        @rule(
            data=st.data(),
            op=st.sampled_from(["heartbeat", "progress", "complete", "fail", "crash"]),
            stage=st.integers(0, 1),
            completed=st.integers(0, 3),
            code=st.sampled_from(CODES),
            advance=ADVANCES,
        )
        def use_lease(self, data, op: str, stage: int, completed: int, code: str, advance: float) -> None:
            """Time passes, then a run (or the run-failure sensor) acts on a lease ever granted, live or stale."""
            self.clock.advance(advance)
            lease = self.draw_lease(data)
            if op == "progress":
                self.progress(lease, stage, completed)
            elif op == "fail":
                self.fail(lease, code)
            else:
                getattr(self, op)(lease)

        @rule(data=st.data(), op=st.sampled_from(["cancel", "retry", "retry"]))
        def operator(self, data, op: str) -> None:
            """A person cancels or retries any task, legal or not."""
            getattr(self, op)(data.draw(st.sampled_from(sorted(self.model))))

        def heartbeat(self, lease: Lease) -> None:
            if self.holds(lease):
                renewed = self.queue.heartbeat(lease)
                self.model[lease.task_id].lease_until = self.clock.now + timedelta(seconds=LEASE)
                assert renewed.lease_until == self.model[lease.task_id].lease_until
            else:
                self.expect_refusal(lease, lambda: self.queue.heartbeat(lease))

        def progress(self, lease: Lease, stage: int, completed: int) -> None:
            if self.holds(lease):
                self.queue.progress(lease, STAGES[stage], completed, 5)
                m = self.model[lease.task_id]
                if stage + 1 > m.stage_rank:
                    m.stage_rank, m.completed = stage + 1, completed
                elif stage + 1 == m.stage_rank:
                    m.completed = max(m.completed, completed)
            else:
                self.expect_refusal(lease, lambda: self.queue.progress(lease, STAGES[stage], completed, 5))

        def complete(self, lease: Lease) -> None:
            if self.holds(lease):
                self.queue.complete(lease, chunk_count=1)
                m = self.model[lease.task_id]
                m.status = "SUCCEEDED"
                self.end_lease(m)
            else:
                self.expect_refusal(lease, lambda: self.queue.complete(lease))

        def fail(self, lease: Lease, code: str) -> None:
            delay = backoff_seconds(lease.attempt, base=BASE, cap=CAP, rng=self.rng)
            if self.holds(lease):
                status = self.queue.fail(lease, code, "failed")
                m = self.model[lease.task_id]
                if is_retryable(code) and m.attempts < m.max_attempts:
                    m.status = "RETRY_WAIT"
                    m.next_attempt_at = self.clock.now + timedelta(seconds=delay)
                else:
                    m.status = "DEAD"
                self.end_lease(m)
                assert status == m.status
            else:
                self.expect_refusal(lease, lambda: self.queue.fail(lease, code, "failed"))

        def crash(self, lease: Lease) -> None:
            """The run-failure sensor reports a crashed run's lease attempt."""
            m = self.model[lease.task_id]
            outcomes = self.queue.fail_crashed_run([(lease.task_id, lease.attempt)], owner=lease.owner,
                                                   run_owner=lease.owner)
            result = outcomes[0].status if outcomes else None
            if m.status == "RUNNING" and m.attempts == lease.attempt:
                m.status = "RETRY_WAIT" if m.attempts < m.max_attempts else "DEAD"
                if m.status == "RETRY_WAIT":
                    m.next_attempt_at = self.clock.now
                self.end_lease(m)
                assert result == m.status
            else:
                assert result is None

        def cancel(self, tid: int) -> None:
            m = self.model[tid]
            if m.status in ("PENDING", "RETRY_WAIT", "RUNNING"):
                self.queue.cancel(tid)
                m.status = "CANCELLED"
                self.end_lease(m)
            else:
                try:
                    self.queue.cancel(tid)
                except IllegalTransition:
                    return
                raise AssertionError(f"cancel of a {m.status} task was accepted")

        def retry(self, tid: int) -> None:
            m = self.model[tid]
            if m.status in ("DEAD", "CANCELLED"):
                self.queue.retry(tid, extra_attempts=2)
                m.status, m.max_attempts, m.next_attempt_at = "PENDING", m.attempts + 2, self.clock.now
            else:
                try:
                    self.queue.retry(tid)
                except IllegalTransition:
                    return
                raise AssertionError(f"retry of a {m.status} task was accepted")

        # -- invariants -----------------------------------------------------------------------

        @invariant()
        def database_matches_model(self) -> None:
            rows = {r["task_id"]: r for r in self.queue.list(limit=1000)}
            assert set(rows) == set(self.model)
            for tid, m in self.model.items():
                r = rows[tid]
                assert (r["status"], r["attempts"], r["max_attempts"]) == (m.status, m.attempts, m.max_attempts), tid
                assert r["attempts"] >= self.seen_attempts.get(tid, 0), "attempts went down"
                self.seen_attempts[tid] = r["attempts"]
                if m.status == "RUNNING":
                    assert (r["lease_owner"], r["lease_until"]) == (m.owner, m.lease_until)
                    assert (STAGES.index(Stage(r["stage"])) + 1 if r["stage"] else 0, r["completed"]) == (
                        m.stage_rank,
                        m.completed,
                    )
                else:
                    assert r["lease_owner"] is None and r["lease_until"] is None
                if m.status in ("PENDING", "RETRY_WAIT"):
                    assert abs(r["next_attempt_at"] - m.next_attempt_at) <= timedelta(microseconds=1)

        @invariant()
        def events_reconstruct_each_status(self) -> None:
            for tid, m in self.model.items():
                status, attempt = None, 0
                for e in self.queue.events(tid):
                    assert e["attempt"] >= attempt
                    attempt = e["attempt"]
                    if e["kind"] == "progress":
                        assert status == "RUNNING"
                        continue
                    assert e["from_status"] == status, (tid, e)
                    status = e["to_status"]
                assert (status, attempt) == (m.status, m.attempts), tid

        @invariant()
        def at_most_one_live_lease_per_task(self) -> None:
            live = [(lease.task_id, lease.attempt) for lease in self.leases if self.holds(lease)]
            assert len(live) == len({tid for tid, _ in live})

    return QueueMachine


def test_queue_matches_its_model(db, db_url, tmp_path):
    machine = make_machine(db, db_url, tmp_path)
    run_state_machine_as_test(
        machine,
        settings=settings(
            max_examples=60,
            stateful_step_count=40,
            deadline=None,
            suppress_health_check=list(HealthCheck),
            derandomize=True,
        ),
    )
