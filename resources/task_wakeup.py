"""Wake-ups on new task events, for a claimer that would otherwise only look again at its next tick.

Dagster's sensor daemon evaluates a sensor at most every 5 s (``MIN_INTERVAL_LOOP_TIME``), so a publish
waited 2.5 s on average for its claim before a run could start (issue #34: publish -> searchable p50 5 s).
The claiming sensor instead LISTENs before it claims and, finding nothing due, waits here for the
``task_event`` trigger's NOTIFY (every publish writes a PENDING event) up to a deadline inside the tick, then
claims again. LISTEN comes first, so a publish committed between the claim and the wait still wakes it.

Any task event wakes it (progress, heartbeats of other runs too): the caller re-checks what is due, which
is one indexed read, and waits again until its deadline.
"""

from __future__ import annotations

import time
from collections.abc import Callable

import psycopg

from resources.database import connection_params
from sql import queries

APPLICATION_NAME = "kbindex-claim-wakeup"
STOP_CHECK_SECONDS = 0.2
"""How often a wait with a ``stop`` check calls it: a tick asked to stop ends this soon."""


class TaskWakeup:
    """One LISTEN connection for the length of one wait (a sensor tick); a context manager."""

    def __init__(self, url: str, role: str = "run") -> None:
        self.conn = psycopg.connect(url, autocommit=True, application_name=APPLICATION_NAME,
                                    **connection_params(url, role))
        try:
            self.conn.execute(queries["listen_task_event"])
        except BaseException:
            self.conn.close()
            raise

    def wait(self, deadline: float, stop: Callable[[], bool] | None = None) -> bool:
        """Block until a task event is notified (True) or ``deadline`` (``time.monotonic()``) passes or ``stop()``
        says so (False). Notifications that arrived meanwhile are all taken: one wake-up per wait, however many."""
        woke = False
        while not woke:
            timeout = deadline - time.monotonic()
            if timeout <= 0 or (stop is not None and stop()):
                return False
            if stop is not None:
                timeout = min(timeout, STOP_CHECK_SECONDS)
            for _ in self.conn.notifies(timeout=timeout, stop_after=1):
                woke = True
        if woke:  # drain what else is queued, without blocking, so the next wait sees only later events
            for _ in self.conn.notifies(timeout=0):
                pass
        return woke

    def close(self) -> None:
        self.conn.close()

    def __enter__(self) -> TaskWakeup:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
