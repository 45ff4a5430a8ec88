"""A run's leases, kept alive by one heartbeat thread for the whole run.

The keeper heartbeats every lease it holds every ``interval`` seconds (a third of the lease by
default), all of them in one statement that never waits on a row lock: a lease whose row is held
by its own publish transaction is skipped (neither renewed nor lost), so a long publish never
stalls its batch-mates' heartbeats. A heartbeat that is fenced out (lease expired, taken over, or
task cancelled) marks that lease lost; the run's steps call ``check(key)`` between units of work
and stop that version's work promptly, writing nothing more. Other versions in the same run carry on.

A heartbeat that cannot reach the database (a partition: its connection errors out within the bound of
``resources.settings.ConnectionBounds``, it never hangs) is retried at the next beat. Should no heartbeat
get through for a whole lease, ``check`` reports the lease lost by itself (``LeaseLost``, reason
"expired"): it must have expired and another run may already hold the task, so the run stops that work
without waiting for the database to say so. The deadline counts from when a renewal's answer arrived, so
it is never earlier than the lease's real expiry; fencing, not this clock, keeps late writes out.
"""

from __future__ import annotations

import logging
import threading
import time
from collections import defaultdict
from dataclasses import dataclass

from pipelines.domain.errors import FenceRejected, KbindexError, LeaseLost
from resources.task_queue import Lease, TaskQueue

log = logging.getLogger(__name__)


@dataclass
class _Held:
    lease: Lease
    lost: FenceRejected | None = None
    deadline: float = float("inf")
    """``time.monotonic()`` after which the lease has surely expired unless a heartbeat renewed it."""


class LeaseKeeper:
    def __init__(self, queue: TaskQueue, *, interval: float | None = None) -> None:
        self.queue = queue
        self.interval = interval if interval is not None else max(0.5, queue.lease_seconds / 3.0)
        self._held: dict[str, _Held] = {}
        self._guard = threading.Lock()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self.heartbeats = 0
        self.failed_beats = 0
        """Heartbeat statements that errored (database unreachable): each was given up, not waited on."""

    # -- holding ------------------------------------------------------------------------------
    def hold(self, key: str, lease: Lease) -> None:
        """Start keeping ``lease`` alive under ``key`` (a partition key)."""
        with self._guard:  # the lease was granted before now: it surely ends by now + lease_seconds
            self._held[key] = _Held(lease, deadline=time.monotonic() + self.queue.lease_seconds)

    def release(self, key: str) -> None:
        """Stop heartbeating ``key`` (after its task completed or failed)."""
        with self._guard:
            self._held.pop(key, None)

    def keys(self) -> list[str]:
        with self._guard:
            return list(self._held)

    def lease(self, key: str) -> Lease | None:
        with self._guard:
            held = self._held.get(key)
        return held.lease if held and self._lost(held) is None else None

    def check(self, key: str) -> Lease:
        """The live lease for ``key``, or raise the fence rejection that ended it."""
        with self._guard:
            held = self._held.get(key)
        if held is None:
            raise LeaseLost("this run holds no lease for that version")
        lost = self._lost(held)
        if lost is not None:
            raise lost
        return held.lease

    def _lost(self, held: _Held) -> FenceRejected | None:
        """Why ``held`` is lost: the fence said so, or no heartbeat got through before its deadline."""
        if held.lost is None and time.monotonic() > held.deadline:
            lease = held.lease
            held.lost = LeaseLost(
                f"lease of task {lease.task_id} attempt {lease.attempt} lost: expired, no heartbeat reached the "
                f"database for {self.queue.lease_seconds:g} s", reason="expired", task_id=lease.task_id,
                attempt=lease.attempt, owner=lease.owner)
            log.warning("task %s: no heartbeat got through for a whole lease: stopping its work", lease.task_id)
        return held.lost

    def mark_lost(self, key: str, exc: FenceRejected) -> None:
        with self._guard:
            held = self._held.get(key)
        if held is not None:
            held.lost = exc

    # -- heartbeating -------------------------------------------------------------------------
    def beat_once(self) -> None:
        """Heartbeat every live lease once, one statement per owner (the thread calls this; tests may too)."""
        with self._guard:
            held_now = list(self._held.values())
        live = [held for held in held_now if self._lost(held) is None]
        by_owner: dict[str, list[_Held]] = defaultdict(list)
        for held in live:
            by_owner[held.lease.owner].append(held)
        for batch in by_owner.values():
            self._beat(batch)

    def _beat(self, batch: list[_Held]) -> None:
        """One heartbeat statement for the leases of one owner; renewed, lost, or left alone while busy."""
        sent: dict[tuple[int, int], list[_Held]] = defaultdict(list)
        for held in batch:
            sent[(held.lease.task_id, held.lease.attempt)].append(held)
        try:
            result = self.queue.heartbeat_many([helds[0].lease for helds in sent.values()])
        except KbindexError as exc:  # database hiccup: try again next beat; fencing keeps us safe
            self.failed_beats += 1
            log.warning("heartbeat of %d lease(s) failed (%s), will retry", len(sent), exc.code)
            return
        answered = time.monotonic()  # renewed at the server's now(), which is before this
        for lease in result.renewed:
            for held in sent[(lease.task_id, lease.attempt)]:
                held.lease = lease
                held.deadline = answered + self.queue.lease_seconds
            self.heartbeats += 1
        for lease, exc in result.lost:
            for held in sent[(lease.task_id, lease.attempt)]:
                held.lost = exc
            log.warning("task %s: lease lost (%s): stopping its work", lease.task_id, exc.code)
        finished = {(lease.task_id, lease.attempt) for lease in result.finished}
        if finished:  # published by this run, not yet let go of: nothing to stop, nothing to renew
            with self._guard:
                for key in [k for k, h in self._held.items() if (h.lease.task_id, h.lease.attempt) in finished]:
                    del self._held[key]
        for lease in result.busy:  # locked by the lease's own publish, which commits or rolls back on its own;
            for held in sent[(lease.task_id, lease.attempt)]:  # nobody can take the row over meanwhile
                held.deadline = answered + self.queue.lease_seconds

    def _run(self) -> None:
        while not self._stop.wait(self.interval):
            self.beat_once()

    def start(self) -> None:
        if self._thread is None:
            self._thread = threading.Thread(target=self._run, name="kbindex-lease-heartbeat", daemon=True)
            self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=self.interval + 5)
            self._thread = None

    def __enter__(self) -> LeaseKeeper:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()
