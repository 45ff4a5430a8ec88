"""A run's memory that its embedder stopped answering, so one outage costs a run two bounds, not one per task.

Without it, a run whose embedding service went silent (a cut link, a dead host) met the client's bound once in
the pass embedding ahead, once in the embed step's shared pass, then once more for every task embedding on its
own: a run of 250 versions held its slot and leases for 250 x the bound (~6 s each with the network bounds)
before its last task was given back (issue #32).

Two slow failures of a model's calls in a row that say the embedder is unreachable or silent
(EMBEDDING_UNAVAILABLE, EMBEDDING_TIMEOUT after at least ``SLOW_FAILURE_S``), with no answer between them, *trip*
the model for the rest of the run: every later call fails at once with EMBEDDING_UNAVAILABLE (retryable), so each
remaining task is failed and retried by a later run, which asks the service again. One failure alone (a blip)
trips nothing: the next call is made as usual, and an answer clears the count. A quick failure (a refused
connection, a provider's instant error) costs the run little and never counts, so a flaky provider does not fail
a whole run's tasks; rate limits and invalid answers are not outages and never count either.
"""

from __future__ import annotations

import threading

from pipelines.domain.errors import EmbeddingUnavailable, classify

OUTAGE_CODES = frozenset({"EMBEDDING_UNAVAILABLE", "EMBEDDING_TIMEOUT"})
"""What an unreachable or silent embedder raises (classified)."""
TRIP_AFTER = 2
"""Slow failures in a row, with no answer between, that trip a model for the rest of the run."""
SLOW_FAILURE_S = 1.0
"""A failure that took this long counts: the client's bound on a silent link is seconds (~6 s with the network
bounds, 30 s by default), an instant refusal is not worth failing a run's tasks for."""


class EmbedOutage:
    """Per model: failures in a row, and whether the model is tripped for this run. Safe across threads (the
    pass embedding ahead and the steps share one)."""

    def __init__(self, trip_after: int = TRIP_AFTER, slow_s: float | None = None) -> None:
        self.trip_after = trip_after
        self.slow_s = SLOW_FAILURE_S if slow_s is None else slow_s
        self._lock = threading.Lock()
        self._in_a_row: dict[str, int] = {}
        self._last: dict[str, str] = {}

    def check(self, model: str) -> None:
        """Raise EmbeddingUnavailable if ``model`` is tripped for this run."""
        with self._lock:
            if self._in_a_row.get(model, 0) < self.trip_after:
                return
            last = self._last.get(model, "")
        raise EmbeddingUnavailable(
            f"the embedder of {model!r} failed {self.trip_after} slow calls in a row in this run (last: {last}); "
            "not called again by this run, the task is retried by a later one")

    def tripped(self, model: str) -> bool:
        with self._lock:
            return self._in_a_row.get(model, 0) >= self.trip_after

    def failed(self, model: str, exc: BaseException, seconds: float) -> bool:
        """Note a call that failed after ``seconds``; whether it counted as an outage (unreachable or silent
        embedder, slow to say so)."""
        err = classify(exc)
        if err.code not in OUTAGE_CODES or seconds < self.slow_s:
            return False
        with self._lock:
            self._in_a_row[model] = self._in_a_row.get(model, 0) + 1
            self._last[model] = f"{err.code}: {err.message}"
        return True

    def answered(self, model: str) -> None:
        """A call of ``model`` was answered: the count starts again (unless it already tripped)."""
        with self._lock:
            if self._in_a_row.get(model, 0) < self.trip_after:
                self._in_a_row[model] = 0
