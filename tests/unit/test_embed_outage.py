"""A run's memory of a silent embedder (resources/embed_outage.py): two outage failures in a row trip a model for
the run; an answer between them, a rate limit or an invalid answer does not."""

from __future__ import annotations

import pytest

from pipelines.domain.errors import EmbeddingInvalidResponse, EmbeddingRateLimited, EmbeddingUnavailable
from resources.embed_outage import EmbedOutage


def test_two_outage_failures_in_a_row_trip_the_model_for_the_run():
    outage = EmbedOutage()
    assert outage.failed("m", TimeoutError("no answer in 6 s"))  # classified EMBEDDING_TIMEOUT
    outage.check("m")  # one failure alone trips nothing
    assert outage.failed("m", EmbeddingUnavailable("connection refused"))
    assert outage.tripped("m") and not outage.tripped("other")
    with pytest.raises(EmbeddingUnavailable, match="2 calls in a row.*EMBEDDING_UNAVAILABLE: connection refused"):
        outage.check("m")
    outage.answered("m")  # tripped stays tripped for the rest of the run
    assert outage.tripped("m")
    outage.check("other")


def test_an_answer_between_two_failures_starts_the_count_again():
    outage = EmbedOutage()
    outage.failed("m", TimeoutError())
    outage.answered("m")
    outage.failed("m", TimeoutError())
    assert not outage.tripped("m")


def test_rate_limits_and_invalid_answers_are_not_outages():
    outage = EmbedOutage()
    for exc in (EmbeddingRateLimited("429"), EmbeddingInvalidResponse("wrong dimension"), ValueError("x")) * 2:
        assert not outage.failed("m", exc)
    assert not outage.tripped("m")
