"""The work of each indexing step for one leased version, plus the per-version failure boundary.

Assets call ``run_guarded`` once per partition key: a version whose lease is gone is skipped
without writing anything; a version whose step raises is classified to a stable code and failed
by a fenced ``fail`` right away, from inside the run. Either way only that version stops: its
batch-mates in the same run carry on (one bad document never fails its neighbours).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, TypeVar

from pipelines.domain.errors import FenceRejected, KbindexError, classify
from pipelines.domain.task_states import Stage

T = TypeVar("T")


@dataclass(frozen=True)
class Skipped:
    """Stands in for a version's output when its work stopped: why, and with which code if it failed."""

    reason: str
    error_code: str | None = None


@dataclass
class StepReport:
    """Per-version facts a step reports as materialization metadata."""

    outcome: str = "ok"
    seconds: float = 0.0
    details: dict[str, Any] | None = None


class ProgressThrottle:
    """Fenced progress writes at most every ``interval`` seconds per task (plus the final one)."""

    def __init__(self, interval: float = 1.0) -> None:
        self.interval = interval
        self._last: dict[int, float] = {}

    def due(self, task_id: int, done: int, total: int) -> bool:
        now = time.monotonic()
        if done >= total or now - self._last.get(task_id, 0.0) >= self.interval:
            self._last[task_id] = now
            return True
        return False


def run_guarded(
    key: str,
    upstream: Any,
    leases: Any,
    stage: Stage,
    fn: Callable[[Any, Any], T],
    log: Any = None,
) -> tuple[T | Skipped, StepReport]:
    """Run ``fn(work, upstream)`` for one version under its lease; never raises for that version's failure.

    ``leases`` is the run's LeaseResource. Returns the step's value or ``Skipped``.
    """
    report = StepReport()
    if isinstance(upstream, Skipped):
        report.outcome = "skipped"
        return upstream, report
    work = leases.acquire([key])[key]
    if work is None:
        report.outcome = "skipped"
        return Skipped(leases.why_skipped(key) or "not leased by this run"), report
    started = time.perf_counter()
    try:
        leases.check(key)
        leases.queue.progress(work.lease, stage, 0, 1)
        value = fn(work, upstream)
        report.seconds = time.perf_counter() - started
        return value, report
    except FenceRejected as exc:
        leases.lost(key, exc)
        report.outcome = "lease_lost"
        if log:
            log.warning(f"{key}: {exc.code} during {stage.value}; writing nothing more for it")
        return Skipped(f"{exc.code}: {exc.message}", exc.code), report
    except Exception as exc:  # noqa: BLE001 - every failure of one version is classified, never swallowed
        err: KbindexError = classify(exc)
        report.outcome = "failed"
        report.seconds = time.perf_counter() - started
        if log:
            log.error(f"{key}: {err.code} during {stage.value}: {err.message}")
        try:
            status = leases.queue.fail(work.lease, err.code, err.message)
            report.details = {"task_status": str(status)}
        except FenceRejected as fence:  # lost the lease meanwhile: the failure is not ours to record
            leases.lost(key, fence)
        except KbindexError as db_error:  # database down: the lease expires and the task is retried (backstop)
            if log:
                log.error(f"{key}: could not record {err.code} ({db_error.code}); lease expiry will retry the task")
        leases.release(key)
        return Skipped(f"{err.code}: {err.message}", err.code), report
