"""The state machine as data: legal transitions, refusal messages, full-jitter backoff, progress percent."""

from __future__ import annotations

import random

import pytest

from pipelines.domain.errors import ALL_CODES, PERMANENT_CODES, TRANSIENT_CODES, is_retryable
from pipelines.domain.task_states import (
    CANCELLABLE,
    TERMINAL,
    TRANSITIONS,
    Stage,
    TaskStatus,
    backoff_seconds,
    is_legal,
    overall_percent,
    why_cannot_cancel,
    why_cannot_retry,
)


def test_only_the_designed_transitions_are_legal():
    legal = {(a, b) for a in [None, *TaskStatus] for b in TaskStatus if is_legal(a, b)}
    assert legal == set(TRANSITIONS)
    assert not any(is_legal(TaskStatus.SUCCEEDED, t) for t in TaskStatus)
    # DEAD and CANCELLED are never dead ends: a person sends them back to PENDING (DESIGN.md).
    for waiting_for_a_person in (TaskStatus.DEAD, TaskStatus.CANCELLED):
        assert {t for (s, t) in TRANSITIONS if s == waiting_for_a_person} == {TaskStatus.PENDING}


@pytest.mark.parametrize("status", list(TaskStatus))
def test_cancel_and_retry_refusals_explain_themselves(status):
    assert (why_cannot_cancel(status) is None) == (status in CANCELLABLE)
    assert (why_cannot_retry(status) is None) == (status in (TaskStatus.DEAD, TaskStatus.CANCELLED))
    for why in (why_cannot_cancel(status), why_cannot_retry(status)):
        assert why is None or status.value.lower() in why.lower()


def test_terminal_statuses_cannot_be_cancelled():
    assert all(why_cannot_cancel(s) for s in TERMINAL)


def test_backoff_grows_is_capped_and_jittered():
    rng = random.Random(3)
    for attempt in range(1, 15):
        ceiling = min(300.0, 2.0 * 2 ** (attempt - 1))
        samples = [backoff_seconds(attempt, rng=rng) for _ in range(200)]
        assert all(0.0 <= s <= ceiling for s in samples)
        assert len(set(samples)) == len(samples)  # jitter: no two alike
        assert max(samples) > 0.8 * ceiling  # full range used (uniform over [0, ceiling])
    means = [sum(backoff_seconds(a, rng=rng) for _ in range(400)) / 400 for a in (1, 2, 3, 4)]
    assert means == sorted(means)
    assert backoff_seconds(50, base=1.0, cap=7.5, rng=rng) <= 7.5
    assert backoff_seconds(0, rng=rng) <= 2.0


def test_backoff_is_reproducible_with_a_seeded_rng():
    a = [backoff_seconds(n, rng=random.Random(9)) for n in range(1, 6)]
    b = [backoff_seconds(n, rng=random.Random(9)) for n in range(1, 6)]
    assert a == b


def test_retry_policy_is_keyed_on_the_code():
    assert not any(is_retryable(c) for c in PERMANENT_CODES)
    assert all(is_retryable(c) for c in TRANSIENT_CODES)
    assert not is_retryable("LEASE_ATTEMPTS_EXHAUSTED")
    assert is_retryable("SOMETHING_NEW")  # unclassified: retried, bounded by max_attempts
    assert PERMANENT_CODES | TRANSIENT_CODES < ALL_CODES


def test_overall_percent_is_monotone_and_only_100_when_succeeded():
    points = [(s, c) for s in Stage for c in range(0, 11)]
    percents = [overall_percent(TaskStatus.RUNNING, s, c, 10) for s, c in points]
    assert percents == sorted(percents)
    assert max(percents) == 99.0
    assert overall_percent(TaskStatus.SUCCEEDED, None, 0, 0) == 100.0
    assert overall_percent(TaskStatus.RUNNING, None, 0, 0) == 0.0
