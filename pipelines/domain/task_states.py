"""The index-task state machine of DESIGN.md, as data: statuses, stages, legal transitions, backoff.

The database enforces every transition in the WHERE clause of its statement (sql/queries/);
this module is the readable statement of the same rules, used by the CLI/API to explain a
refusal and by the model-based tests as the reference.
"""

from __future__ import annotations

import random
from enum import StrEnum


class TaskStatus(StrEnum):
    PENDING = "PENDING"
    """Waiting to be claimed. In: publish (new, or the same bytes again re-queueing a CANCELLED task),
    manual retry. Out: claim (RUNNING), cancel."""
    RUNNING = "RUNNING"
    """Leased to one run. In: claim. Out: fenced publish (SUCCEEDED), fenced fail (RETRY_WAIT/DEAD),
    cancel, or a claim after the lease expired (RUNNING again with attempts + 1, or DEAD)."""
    RETRY_WAIT = "RETRY_WAIT"
    """Failed with a retryable code; due again at ``next_attempt_at``. Out: claim, cancel."""
    SUCCEEDED = "SUCCEEDED"
    """Chunks written and the search pointer moved, in one transaction. Terminal."""
    DEAD = "DEAD"
    """Failed permanently or out of attempts, with a stable error code. Out: manual retry."""
    CANCELLED = "CANCELLED"
    """Stopped by a person. Out: manual retry, or a publish of the same bytes (both back to PENDING,
    attempts kept): a cancel is never a dead end."""


class Stage(StrEnum):
    PARSE = "parse"
    CHUNK = "chunk"
    EMBED = "embed"
    PUBLISH = "publish"


# Finished: nothing moves these on by itself (DEAD and CANCELLED wait for a person: retry or publish again).
TERMINAL = frozenset({TaskStatus.SUCCEEDED, TaskStatus.DEAD, TaskStatus.CANCELLED})
CLAIMABLE = frozenset({TaskStatus.PENDING, TaskStatus.RETRY_WAIT})
CANCELLABLE = frozenset({TaskStatus.PENDING, TaskStatus.RETRY_WAIT, TaskStatus.RUNNING})
RETRYABLE_BY_HAND = frozenset({TaskStatus.DEAD, TaskStatus.CANCELLED})

# (from, to) -> the verb that performs it. Anything else is illegal.
TRANSITIONS: dict[tuple[TaskStatus | None, TaskStatus], str] = {
    (None, TaskStatus.PENDING): "publish",
    (TaskStatus.PENDING, TaskStatus.RUNNING): "claim",
    (TaskStatus.RETRY_WAIT, TaskStatus.RUNNING): "claim",
    (TaskStatus.RUNNING, TaskStatus.RUNNING): "claim (lease expired: taken over)",
    (TaskStatus.RUNNING, TaskStatus.DEAD): "claim (attempts exhausted) or fenced fail",
    (TaskStatus.RUNNING, TaskStatus.SUCCEEDED): "fenced publish",
    (TaskStatus.RUNNING, TaskStatus.RETRY_WAIT): "fenced fail",
    (TaskStatus.PENDING, TaskStatus.CANCELLED): "cancel",
    (TaskStatus.RETRY_WAIT, TaskStatus.CANCELLED): "cancel",
    (TaskStatus.RUNNING, TaskStatus.CANCELLED): "cancel",
    (TaskStatus.DEAD, TaskStatus.PENDING): "manual retry",
    (TaskStatus.CANCELLED, TaskStatus.PENDING): "manual retry or publish of the same bytes",
}


def is_legal(from_status: TaskStatus | None, to_status: TaskStatus) -> bool:
    return (from_status, to_status) in TRANSITIONS


def why_cannot_cancel(status: TaskStatus) -> str | None:
    """None when cancel is allowed, otherwise a sentence for the person who asked."""
    if status in CANCELLABLE:
        return None
    if status == TaskStatus.CANCELLED:
        return "the task is already cancelled"
    return f"the task is {status.value}; only PENDING, RETRY_WAIT or RUNNING tasks can be cancelled"


def why_cannot_retry(status: TaskStatus) -> str | None:
    """None when a manual retry is allowed, otherwise a sentence for the person who asked."""
    if status in RETRYABLE_BY_HAND:
        return None
    return f"the task is {status.value}; only DEAD or CANCELLED tasks can be retried by hand"


def backoff_seconds(
    attempt: int,
    *,
    base: float = 2.0,
    cap: float = 300.0,
    rng: random.Random | None = None,
) -> float:
    """Full-jitter exponential backoff: uniform(0, min(cap, base * 2**(attempt-1))).

    ``attempt`` is the lease attempt that just failed (1 for the first try).
    """
    ceiling = min(cap, base * (2 ** max(0, attempt - 1)))
    return (rng or random).uniform(0.0, ceiling)


# Weights of the stages in the overall percent shown to people (sum 1.0).
STAGE_WEIGHTS: dict[Stage, float] = {
    Stage.PARSE: 0.10,
    Stage.CHUNK: 0.05,
    Stage.EMBED: 0.75,
    Stage.PUBLISH: 0.10,
}
_STAGE_ORDER = [Stage.PARSE, Stage.CHUNK, Stage.EMBED, Stage.PUBLISH]


def overall_percent(status: TaskStatus, stage: Stage | None, completed: int, total: int) -> float:
    """Weighted percent for people: 100 only once SUCCEEDED, never above 99 before."""
    if status == TaskStatus.SUCCEEDED:
        return 100.0
    if stage is None:
        return 0.0
    done = sum(STAGE_WEIGHTS[s] for s in _STAGE_ORDER[: _STAGE_ORDER.index(stage)])
    fraction = (completed / total) if total > 0 else 0.0
    percent = 100.0 * (done + STAGE_WEIGHTS[stage] * min(1.0, max(0.0, fraction)))
    return min(99.0, round(percent, 1))
