"""A run's memory of a silent embedder (resources/embed_outage.py): two slow outage failures in a row trip a model
for the run; an answer between them, a quick failure, a rate limit or an invalid answer does not."""

from __future__ import annotations

import pytest

from pipelines.domain.errors import EmbeddingInvalidResponse, EmbeddingRateLimited, EmbeddingUnavailable
from resources.embed_outage import SLOW_FAILURE_S, EmbedOutage

SLOW = SLOW_FAILURE_S + 5.0  # a silent link: the client's bound


def test_two_slow_outage_failures_in_a_row_trip_the_model_for_the_run():
    outage = EmbedOutage()
    assert outage.failed("m", TimeoutError("no answer in 6 s"), SLOW)  # classified EMBEDDING_TIMEOUT
    outage.check("m")  # one failure alone trips nothing
    assert outage.failed("m", EmbeddingUnavailable("connection lost"), SLOW)
    assert outage.tripped("m") and not outage.tripped("other")
    with pytest.raises(EmbeddingUnavailable, match="2 slow calls in a row.*EMBEDDING_UNAVAILABLE: connection lost"):
        outage.check("m")
    outage.answered("m")  # tripped stays tripped for the rest of the run
    assert outage.tripped("m")
    outage.check("other")


def test_an_answer_between_two_failures_starts_the_count_again():
    outage = EmbedOutage()
    outage.failed("m", TimeoutError(), SLOW)
    outage.answered("m")
    outage.failed("m", TimeoutError(), SLOW)
    assert not outage.tripped("m")


def test_quick_failures_rate_limits_and_invalid_answers_are_not_outages():
    """A flaky provider's instant errors (the chaos rounds' injected timeouts are instant) must not fail a whole
    run's tasks: they cost the run nothing to meet again."""
    outage = EmbedOutage()
    for _ in range(5):
        assert not outage.failed("m", EmbeddingUnavailable("connection refused"), SLOW_FAILURE_S / 10)
        assert not outage.failed("m", TimeoutError(), 0.0)
    for exc in (EmbeddingRateLimited("429"), EmbeddingInvalidResponse("wrong dimension"), ValueError("x")) * 2:
        assert not outage.failed("m", exc, SLOW)
    assert not outage.tripped("m")
