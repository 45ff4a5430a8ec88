"""The durable index-task queue: domain verbs over the named statements of sql/queries/task.sql.

A claim hands out leases; the lease attempt (the task's ``attempts`` at the claim) is the
fencing token. Heartbeat, progress, complete and fail change nothing unless the caller still
holds ``(status RUNNING, owner, attempt, lease_until > now)``; when they change nothing, a read
explains why and raises ``TaskCancelled`` or ``LeaseLost`` (DESIGN.md invariants 1, 2, 7).
Every transition writes its ``task_event`` row in the same statement.
"""

from __future__ import annotations

import builtins
import random
from collections.abc import Callable, Sequence
from contextlib import AbstractContextManager, nullcontext
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from pipelines.domain.errors import (
    FenceRejected,
    IllegalTransition,
    LeaseLost,
    TaskCancelled,
    TaskNotFound,
    is_retryable,
    sanitize_message,
)
from pipelines.domain.task_states import Stage, TaskStatus, backoff_seconds, why_cannot_cancel, why_cannot_retry
from resources.database import Database, Session


NEVER_STARTED_MESSAGE = ("runs were created for this task again and again and none began; check the Dagster "
                         "daemon and the run launcher, then retry the task")
"""The message of a task that ends DEAD RUN_NEVER_STARTED (its reservations were given back too often)."""


@dataclass(frozen=True)
class Lease:
    """A run's right to finish or fail one task: valid while ``attempts == attempt`` and before ``lease_until``."""

    task_id: int
    attempt: int
    owner: str
    lease_until: datetime | None
    """None only for a lease to be granted by a claim in the same transaction (``lease_to_claim``)."""


@dataclass(frozen=True)
class ClaimedTask:
    """A granted lease plus what the run needs to know about the work."""

    lease: Lease
    tenant_id: str
    document_id: str
    version_number: int
    profile: str
    task_type: str


@dataclass(frozen=True)
class Heartbeats:
    """What one ``heartbeat_many`` did with each lease it was given."""

    renewed: list[Lease]
    """Extended: the leases with their new ``lease_until``."""
    busy: list[Lease]
    """Fence holds but the row is locked (its publish transaction is in flight): not renewed, not lost."""
    lost: list[tuple[Lease, FenceRejected]]
    """Fenced out, with the reason: ``TaskCancelled`` or ``LeaseLost``."""
    finished: list[Lease] = field(default_factory=list)
    """SUCCEEDED by this very attempt (its own publish committed while the heartbeat was on its way): not
    renewed, and not lost either: nothing is left to stop. Over a slow link a run's committed batches met
    this on every beat until the run let go of them, each reported as a lost lease."""


@dataclass(frozen=True)
class CrashOutcome:
    """What ``fail_crashed_run`` did with one lease of a dead run."""

    task_id: int
    status: TaskStatus
    run_size_cap: int | None
    """The cap on the task's next run size (crash bisection), None for none."""
    given_back: bool = False
    """The run never started the task: its attempt was given back and it is due again."""


@dataclass(frozen=True)
class RunLeases:
    """What ``runs_to_release`` needs of one Dagster run: its leases and who may hold them."""

    owner: str
    """The claiming tick that reserved the leases."""
    run_owner: str
    """The run, once it adopted them."""
    pairs: Sequence[tuple[int, int]]
    """``(task_id, attempt)`` of each lease."""
    waiting: bool
    """The run has not been launched yet (queued): released, it has no process to stop."""


class TaskQueue:
    """Claim, heartbeat, progress, complete, fail, cancel and retry index tasks.

    ``clock`` returns the time to use (tests pin it) or None for the database's ``now()``.
    """

    def __init__(
        self,
        db: Database,
        *,
        lease_seconds: float = 60.0,
        reservation_seconds: float = 900.0,
        giveback_limit: int = 5,
        clock: Callable[[], datetime | None] = lambda: None,
        backoff_base: float = 2.0,
        backoff_cap: float = 300.0,
        rng: random.Random | None = None,
    ) -> None:
        if lease_seconds <= 0:
            raise ValueError("lease_seconds must be positive")
        self.db = db
        self.lease_seconds = float(lease_seconds)
        self.reservation_seconds = max(float(reservation_seconds), self.lease_seconds)
        self.giveback_limit = int(giveback_limit)
        self.clock = clock
        self.backoff_base = backoff_base
        self.backoff_cap = backoff_cap
        self.rng = rng or random.Random()

    # -- helpers -----------------------------------------------------------------------------

    def _session(self, session: Session | None) -> AbstractContextManager[Session]:
        return nullcontext(session) if session is not None else self.db.session()

    def _fence(self, lease: Lease) -> dict[str, Any]:
        return {"task_id": lease.task_id, "owner": lease.owner, "attempt": lease.attempt, "now": self.clock()}

    def _refused(self, session: Session, lease: Lease, verb: str) -> Exception:
        """Explain a fenced write that changed nothing: TaskCancelled, LeaseLost (with a reason) or TaskNotFound."""
        row = session.fetch_one("task_fence_state", {"task_id": lease.task_id, "now": self.clock()})
        return _explain(row, lease, verb)

    def _lost(self, session: Session, lease: Lease, verb: str) -> FenceRejected:
        """``_refused`` for a lease among many: a task row that is gone takes its lease with it."""
        return _as_fence_rejection(self._refused(session, lease, verb), lease)

    # -- claiming (sql/queries/lease.sql: one statement, five sources) --------------------------

    def claim(
        self, owner: str, limit: int = 10, session: Session | None = None, *, expired_only: bool = False,
        for_run: bool = False,
    ) -> list[ClaimedTask]:
        """Lease up to ``limit`` due or lease-expired tasks in one atomic statement (invariant 1).

        Expired leases with no attempts left end DEAD (LEASE_ATTEMPTS_EXHAUSTED) and are not returned.
        ``expired_only`` takes over abandoned leases without starting new work (the run queue is full,
        but invariant 7 still wants expired leases reclaimed within a tick). ``for_run``: the leases are
        reservations for a run that has yet to start (the claiming sensor): they last
        ``reservation_seconds``, the run takes them with ``adopt``, and one that ends unadopted gives its
        attempt back (at most ``giveback_limit`` times). A worker looping on claims may pass its own
        autocommit ``session`` to skip the pool checkout.
        """
        return self._claim("expired" if expired_only else "queue", owner, limit, reserve=for_run, session=session)

    def claim_backfill(self, owner: str, limit: int, *, for_run: bool = False) -> list[ClaimedTask]:
        """Lease up to ``limit`` never-attempted REINDEX tasks of profiles whose backfill was requested
        (``profiles.request_backfill``), oldest first; the claiming sensor calls it with the capacity live
        indexing left free in its tick."""
        return self._claim("backfill", owner, limit, reserve=for_run)

    def claim_task(self, task_id: int, owner: str) -> ClaimedTask | None:
        """Lease one named task now if it is claimable (PENDING, RETRY_WAIT, or an expired lease); else None."""
        claimed = self._claim("task", owner, 1, task_id=task_id)
        return claimed[0] if claimed else None

    def send_claim_ahead(self, session: Session, lease: Lease) -> None:
        """Claim ``lease``'s task for its owner inside the caller's (pipelined) transaction, sent without waiting:
        the lease is the one that claim grants (``lease_to_claim``), so statements fenced on it can go right behind
        (the fast path's fenced publish). If the task was not claimable, or another claim moved its attempts, their
        fence refuses it and the caller rolls back. Its event says the fast path claimed it (source 'fast')."""
        session.submit("task_claim", self._claim_params("fast", lease.owner, 1, reserve=False, task_id=lease.task_id))

    @staticmethod
    def lease_to_claim(task_id: int, attempts: int, owner: str) -> Lease:
        """The lease a claim of a task with ``attempts`` grants ``owner`` (the attempt is the fencing token; the
        claim adds one). ``lease_until`` is unknown until it is granted: no fence reads it."""
        return Lease(task_id, attempts + 1, owner, None)

    def _claim_params(self, source: str, owner: str, limit: int, *, reserve: bool,
                      task_id: int | None) -> dict[str, Any]:
        return {
            "source": source,
            "task_id": task_id,
            "owner": owner,
            "limit": limit,
            "reserve": reserve,
            "lease_seconds": self.reservation_seconds if reserve else self.lease_seconds,
            "giveback_limit": self.giveback_limit,
            "never_started_message": NEVER_STARTED_MESSAGE,
            "now": self.clock(),
        }

    def _claim(self, source: str, owner: str, limit: int, *, reserve: bool = False, task_id: int | None = None,
               session: Session | None = None) -> list[ClaimedTask]:
        if limit < 1:
            return []
        with self._session(session) as s:
            rows = s.fetch_all("task_claim", self._claim_params(source, owner, limit, reserve=reserve,
                                                                task_id=task_id))
        return [
            ClaimedTask(
                lease=Lease(r["task_id"], r["attempts"], r["lease_owner"], r["lease_until"]),
                tenant_id=r["tenant_id"], document_id=r["document_id"], version_number=r["version_number"],
                profile=r["profile"], task_type=r["task_type"],
            )
            for r in rows
        ]

    def expire_orphaned_reservations(self, live_owners: Sequence[str], grace_seconds: float) -> int:
        """End the reservations whose run never appeared: made over ``grace_seconds`` ago by a tick that no
        waiting or working run names (``live_owners``). The next claim takes them over and gives their
        attempt back. Returns how many were ended."""
        rows = self.db.fetch_all(
            "lease_expire_orphaned",
            {"live_owners": list(live_owners), "grace_seconds": grace_seconds, "now": self.clock()},
        )
        return len(rows)

    # -- fenced verbs --------------------------------------------------------------------------

    def dagster_runs(self, task_id: int) -> builtins.list[dict[str, Any]]:
        """The Dagster run ids that worked on the task, with the attempt each worked on (from its history)."""
        return self.db.fetch_all("task_dagster_runs", {"task_id": task_id})

    def adopt(self, leases: Sequence[Lease], run_owner: str) -> list[Lease]:
        """Hand the claiming sensor's leases (all of one owner) to the run that starts them, in one fenced
        statement; returns the adopted leases, now owned by ``run_owner``. A lease missing from the
        result was lost before the run started (expired, taken over, cancelled, or already adopted by
        another run, e.g. the original of a re-execution)."""
        if not leases:
            return []
        owners = {lease.owner for lease in leases}
        if len(owners) != 1:
            raise ValueError("adopt takes the leases of one claiming owner")
        rows = self.db.fetch_all(
            "task_adopt",
            {
                "task_ids": [lease.task_id for lease in leases],
                "attempts": [lease.attempt for lease in leases],
                "owner": owners.pop(),
                "run_owner": run_owner,
                "lease_seconds": self.lease_seconds,
                "now": self.clock(),
            },
        )
        return [Lease(r["task_id"], r["attempts"], r["lease_owner"], r["lease_until"]) for r in rows]

    def heartbeat(self, lease: Lease, session: Session | None = None) -> Lease:
        """Extend the lease (fenced); returns the lease with its new ``lease_until``."""
        with self._session(session) as s:
            row = s.fetch_one("task_heartbeat", {**self._fence(lease), "lease_seconds": self.lease_seconds})
            if row is None:
                raise self._refused(s, lease, "heartbeat")
        return Lease(lease.task_id, lease.attempt, lease.owner, row["lease_until"])

    def heartbeat_many(self, leases: Sequence[Lease], session: Session | None = None) -> Heartbeats:
        """Extend many leases of one owner in one statement that never waits on a row lock.

        A lease whose row another transaction holds (its own publish, writing chunks) is ``busy``: its
        publish re-checked the fence when it took the lock and commits or rolls back on its own.
        """
        if not leases:
            return Heartbeats([], [], [])
        if len({lease.owner for lease in leases}) != 1:
            raise ValueError("heartbeat_many takes the leases of one owner")
        sent = {(lease.task_id, lease.attempt): lease for lease in leases}
        with self._session(session) as s:
            rows = s.fetch_all(
                "task_heartbeat_many",
                {
                    "owner": leases[0].owner,
                    "task_ids": [task_id for task_id, _ in sent],
                    "attempts": [attempt for _, attempt in sent],
                    "lease_seconds": self.lease_seconds,
                    "now": self.clock(),
                },
            )
            result = Heartbeats([], [], [])
            for r in rows:
                lease = sent[(r["task_id"], r["attempt"])]
                if r["outcome"] == "renewed":
                    result.renewed.append(Lease(lease.task_id, lease.attempt, lease.owner, r["lease_until"]))
                elif r["outcome"] == "busy":
                    result.busy.append(lease)
                elif r["outcome"] == "finished":
                    result.finished.append(lease)
                else:  # the statement returned the row's state: no further read explains it
                    result.lost.append((lease, _as_fence_rejection(_explain(
                        None if r["status"] is None else
                        {"status": r["status"], "attempts": r["current_attempt"], "lease_owner": r["current_owner"],
                         "lease_expired": r["lease_expired"]}, lease, "heartbeat"), lease)))
        return result

    def progress(
        self, lease: Lease, stage: Stage, completed: int, total: int, session: Session | None = None
    ) -> None:
        """Record where the run is (fenced). Never moves backwards within an attempt; an advance logs an event."""
        with self._session(session) as s:
            if self._progress(s, [lease], stage, [completed], [total]):
                raise self._refused(s, lease, "progress")

    def progress_many(
        self, leases: Sequence[Lease], stage: Stage, completed: Sequence[int], total: Sequence[int],
    ) -> list[tuple[Lease, FenceRejected]]:
        """``progress`` for many leases of one owner in one statement; returns the leases refused, with why.

        A run's step announces all its tasks at once: per-version statements are what made small
        documents slow (issue #14). ``completed``/``total`` are per lease.
        """
        if not leases:
            return []
        if len({lease.owner for lease in leases}) != 1:
            raise ValueError("progress_many takes the leases of one owner")
        with self.db.session() as s:
            return [(lease, self._lost(s, lease, "progress"))
                    for lease in self._progress(s, leases, stage, completed, total)]

    def _progress(self, s: Session, leases: Sequence[Lease], stage: Stage, completed: Sequence[int],
                  total: Sequence[int]) -> list[Lease]:
        """One fenced ``task_progress_many`` for ``leases`` (one owner); returns the leases it refused."""
        rows = s.fetch_all(
            "task_progress_many",
            {
                "owner": leases[0].owner,
                "task_ids": [lease.task_id for lease in leases],
                "attempts": [lease.attempt for lease in leases],
                "completeds": list(completed),
                "totals": list(total),
                "stage": Stage(stage).value,
                "now": self.clock(),
            },
        )
        moved = {(r["task_id"], r["attempts"]) for r in rows}
        return [lease for lease in leases if (lease.task_id, lease.attempt) not in moved]

    def complete(self, lease: Lease, *, chunk_count: int | None = None, session: Session | None = None) -> None:
        """RUNNING -> SUCCEEDED (fenced). Pass the publish transaction's ``session`` to commit with it."""
        with self._session(session) as s:
            if self._complete(s, [lease], [chunk_count]):
                raise self._refused(s, lease, "complete")

    def complete_many(self, leases: Sequence[Lease], session: Session | None = None) -> list[Lease]:
        """Complete many leases of one owner in one statement (fenced each); returns the leases refused."""
        if not leases:
            return []
        if len({lease.owner for lease in leases}) != 1:
            raise ValueError("complete_many takes the leases of one owner")
        with self._session(session) as s:
            return self._complete(s, leases, [None] * len(leases))

    def _complete(self, s: Session, leases: Sequence[Lease], chunk_counts: Sequence[int | None]) -> list[Lease]:
        """One fenced statement for all ``leases`` (one owner); returns the leases it refused."""
        rows = s.fetch_all("task_complete_many", self._completion(leases, chunk_counts))
        done = {r["task_id"] for r in rows}
        return [lease for lease in leases if lease.task_id not in done]

    def _completion(self, leases: Sequence[Lease], chunk_counts: Sequence[int | None]) -> dict[str, Any]:
        """``task_complete_many``'s parameters for ``leases`` (one owner)."""
        return {
            "owner": leases[0].owner,
            "task_ids": [lease.task_id for lease in leases],
            "attempts": [lease.attempt for lease in leases],
            "chunk_counts": list(chunk_counts),
            "now": self.clock(),
        }

    def fail(self, lease: Lease, code: str, message: str, session: Session | None = None) -> TaskStatus:
        """RUNNING -> RETRY_WAIT (retryable code, attempts left; full-jitter backoff) or DEAD (fenced)."""
        delay = backoff_seconds(lease.attempt, base=self.backoff_base, cap=self.backoff_cap, rng=self.rng)
        with self._session(session) as s:
            row = s.fetch_one(
                "task_fail",
                {
                    **self._fence(lease),
                    "code": code,
                    "message": sanitize_message(message),
                    "retryable": is_retryable(code),
                    "delay_seconds": delay,
                },
            )
            if row is None:
                raise self._refused(s, lease, "fail")
        return TaskStatus(row["status"])

    def fail_crashed_run(
        self, pairs: Sequence[tuple[int, int]], code: str = "RUN_CRASHED", message: str = "", *,
        owner: str, run_owner: str,
    ) -> builtins.list[CrashOutcome]:
        """For the run-failure sensor: end the leases of a dead run that are still its own, in one statement.

        ``owner`` is the tick that reserved them, ``run_owner`` the run. A lease the run never adopted is
        given back (due again, no error code: it never started). An adopted one fails with ``code``; with
        several such suspects the crash is nobody's fault yet: each gets its attempt back and a cap of half
        the suspects on its next run (crash bisection); a lone suspect's attempt counts as usual. A lease
        another run took over meanwhile is left alone.
        """
        if not pairs:
            return []
        rows = self.db.fetch_all(
            "lease_fail_crashed_run",
            {
                "task_ids": [int(t) for t, _ in pairs],
                "attempts": [int(a) for _, a in pairs],
                "owner": owner,
                "run_owner": run_owner,
                "code": code,
                "message": sanitize_message(message or "the run ended without recording an outcome"),
                "retryable": is_retryable(code),
                "giveback_limit": self.giveback_limit,
                "never_started_message": NEVER_STARTED_MESSAGE,
                "now": self.clock(),
            },
        )
        return [CrashOutcome(r["task_id"], TaskStatus(r["status"]), r["run_size_cap"], r["given_back"]) for r in rows]

    def runs_to_release(self, runs: Sequence[RunLeases]) -> builtins.list[int]:
        """Indexes of the runs that can do nothing useful any more (sql/queries/lease.sql
        ``lease_runs_to_release``): they hold none of their leases and lost at least one.
        One statement for every run, whatever their number."""
        flat = [(ix, r, t, a) for ix, r in enumerate(runs) for t, a in r.pairs]
        if not flat:
            return []
        rows = self.db.fetch_all(
            "lease_runs_to_release",
            {
                "run_ixs": [f[0] for f in flat],
                "owners": [f[1].owner for f in flat],
                "run_owners": [f[1].run_owner for f in flat],
                "task_ids": [int(f[2]) for f in flat],
                "attempts": [int(f[3]) for f in flat],
                "now": self.clock(),
            },
        )
        return [int(r["run_ix"]) for r in rows]

    def send_lock_fenced(self, session: Session, leases: Sequence[Lease]) -> tuple[Any, dict[str, Any]]:
        """``SELECT ... FOR UPDATE`` of the task rows (one owner) for the publish transaction, in task-id order, where
        each fence holds; sent without reading it (a pipelined transaction sends more behind it). Its cursor, for
        ``read_lock_fenced``, and its fence parameters (owner, task ids, attempts, the clock), for statements
        fenced the same way (``search_pointer_advance_fenced``)."""
        if len({lease.owner for lease in leases}) != 1:
            raise ValueError("lock_fenced takes the leases of one owner")
        fence = {"owner": leases[0].owner, "task_ids": [lease.task_id for lease in leases],
                 "attempts": [lease.attempt for lease in leases], "now": self.clock()}
        return session.submit("task_lock_fenced", fence), fence

    def read_lock_fenced(
        self, session: Session, leases: Sequence[Lease], sent: Any
    ) -> tuple[dict[int, dict[str, Any]], list[tuple[Lease, FenceRejected]]]:
        """The rows ``send_lock_fenced`` locked, by task id (waits for them and for everything sent before), and the
        leases it refused, with why."""
        rows = sent.fetchall()
        locked = {r["task_id"]: r for r in rows}
        held = {(r["task_id"], r["attempts"]) for r in rows}
        refused = [(lease, self._lost(session, lease, "publish")) for lease in leases
                   if (lease.task_id, lease.attempt) not in held]
        return locked, refused

    def complete_published(self, session: Session, leases: Sequence[Lease], chunk_counts: Sequence[int]) -> None:
        """RUNNING -> SUCCEEDED of leases the publish transaction ``session`` holds locked (fenced, one statement),
        then the server's check that each one moved (``task_completed_check``). Both are sent without waiting: a
        lease that ran out since the lock aborts the whole transaction at COMMIT with SQLSTATE KB002 NOT_COMPLETED
        (the caller explains it with ``explain_refused``)."""
        if not leases:
            return
        session.submit("task_complete_many", self._completion(leases, chunk_counts))
        session.submit("task_completed_check", {"task_ids": [lease.task_id for lease in leases]})

    def explain_refused(self, lease: Lease, verb: str) -> Exception:
        """Why a fenced ``verb`` of ``lease`` changed nothing (TaskCancelled, LeaseLost, TaskNotFound), read in a
        session of its own: for a transaction the server aborted, after it rolled back."""
        with self.db.session() as s:
            return self._refused(s, lease, verb)

    # -- operator verbs ---------------------------------------------------------------------

    def cancel(self, task_id: int) -> None:
        """PENDING/RETRY_WAIT/RUNNING -> CANCELLED; a running run finds out at its next fenced write."""
        with self.db.session() as s:
            if s.fetch_one("task_cancel", {"task_id": task_id, "now": self.clock()}):
                return
            row = s.fetch_one("task_get", {"task_id": task_id})
        if row is None:
            raise TaskNotFound(f"task {task_id} does not exist", task_id=task_id)
        status = TaskStatus(row["status"])
        raise IllegalTransition(why_cannot_cancel(status) or "the task changed concurrently", task_id=task_id, status=status)

    def retry(self, task_id: int, extra_attempts: int = 3) -> None:
        """DEAD or CANCELLED -> PENDING on the same row: attempts kept, ``extra_attempts`` more granted."""
        if extra_attempts < 1:
            raise ValueError("extra_attempts must be at least 1")
        with self.db.session() as s:
            if s.fetch_one("task_retry", {"task_id": task_id, "extra_attempts": extra_attempts, "now": self.clock()}):
                return
            row = s.fetch_one("task_get", {"task_id": task_id})
        if row is None:
            raise TaskNotFound(f"task {task_id} does not exist", task_id=task_id)
        status = TaskStatus(row["status"])
        if row.get("version_erased_at") is not None and row.get("version_kind") == "content":
            raise IllegalTransition("the document was erased: this version's content is gone; publish it again instead",
                                    task_id=task_id, status=status)
        raise IllegalTransition(why_cannot_retry(status) or "the task changed concurrently", task_id=task_id, status=status)

    # -- operator-launched runs (UI backfills, `dagster asset materialize`) ----------------------

    def ensure_task(self, tenant_id: str, document_id: str, version_number: int, profile: str, *, max_attempts: int = 5) -> int:
        """The task of a version under ``profile``: the existing one, else a new PENDING REINDEX task."""
        row = self.db.fetch_one(
            "task_ensure_for_version",
            {
                "tenant_id": tenant_id,
                "document_id": document_id,
                "version": version_number,
                "profile": profile,
                "max_attempts": max_attempts,
            },
        )
        if row is None:
            raise TaskNotFound(
                "superseded version: it has no task under this profile and is not the document's current version",
                profile=profile,
            )
        return int(row["task_id"])

    # -- reads -------------------------------------------------------------------------------

    def get(self, task_id: int) -> dict[str, Any]:
        """The task row; TaskNotFound if there is none."""
        row = self.db.fetch_one("task_get", {"task_id": task_id})
        if row is None:
            raise TaskNotFound(f"task {task_id} does not exist", task_id=task_id)
        return row

    def get_many(self, task_ids: Sequence[int]) -> dict[int, dict[str, Any]]:
        """The task rows of these ids in one statement, by id (ids that do not exist are missing)."""
        if not task_ids:
            return {}
        return {r["task_id"]: r for r in self.db.fetch_all("task_get_many", {"task_ids": list(task_ids)})}

    def events(self, task_id: int, after_event_id: int = 0) -> list[dict[str, Any]]:
        """The task's event rows after ``after_event_id``, oldest first."""
        return self.db.fetch_all("task_events", {"task_id": task_id, "after_event_id": after_event_id})

    def stats(self) -> dict[str, Any]:
        """Queue health: due, running, leases expiring/expired, per-status counts, dead by code."""
        row = self.db.fetch_one("task_stats", {"now": self.clock()})
        assert row is not None
        out = dict(row)
        out["dead_by_code"] = {k: int(v) for k, v in (out["dead_by_code"] or {}).items()}
        out["oldest_due_age_seconds"] = float(out["oldest_due_age_seconds"] or 0.0)
        return out

    def list(self, *, status: str | None = None, tenant: str | None = None, limit: int = 100) -> builtins.list[dict[str, Any]]:
        """Newest tasks first, optionally filtered by status and tenant."""
        if status is not None:
            status = TaskStatus(status.upper()).value
        return self.db.fetch_all("task_list", {"status": status, "tenant": tenant, "limit": limit})


def _explain(row: dict[str, Any] | None, lease: Lease, verb: str) -> Exception:
    """Why ``lease``'s fenced ``verb`` changed nothing, from the task row's status, attempts, owner and expiry."""
    data = {"task_id": lease.task_id, "attempt": lease.attempt, "owner": lease.owner}
    if row is None:
        return TaskNotFound(f"task {lease.task_id} does not exist", **data)
    status = row["status"]
    if status == TaskStatus.CANCELLED:
        return TaskCancelled(f"task {lease.task_id} was cancelled; {verb} refused", **data)
    if row["attempts"] != lease.attempt:
        reason = f"taken over by attempt {row['attempts']}"
    elif status != TaskStatus.RUNNING:
        reason = f"finished ({status})"
    elif row["lease_owner"] != lease.owner:
        reason = f"held by {row['lease_owner']}"
    elif row["lease_expired"]:
        reason = "expired"
    else:  # pragma: no cover - only reachable for a progress lock race
        reason = "changed concurrently"
    return LeaseLost(
        f"lease of task {lease.task_id} attempt {lease.attempt} lost: {reason}; {verb} refused",
        reason=reason, status=status, current_attempt=row["attempts"], **data,
    )


def _as_fence_rejection(refusal: Exception, lease: Lease) -> FenceRejected:
    """For a lease among many: a task row that is gone takes its lease with it."""
    if isinstance(refusal, FenceRejected):
        return refusal
    return LeaseLost(str(getattr(refusal, "message", refusal)), reason="not found", task_id=lease.task_id)
