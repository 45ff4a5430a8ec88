"""A run's parse, chunk and embed work done ahead of its Dagster steps, so embedding overlaps the rest.

Dagster runs a run's four steps one after the other. Done that way, the model idles while the run
parses and chunks every version, and parse and chunk idle while it embeds (issue #15: ~35 s of a
150-version run before the first text reached the model). The parse step starts a ``RunAhead``:

- a *prepare* thread parses and chunks the run's tasks in run order, storing each output exactly
  where the steps keep theirs (``RunState``), or the error that stopped the task;
- an *embed* thread takes tasks as they are chunked and embeds what they need in groups of at least
  ``group_texts`` texts, each sorted longest first (``IndexingRun.embed_group``: stored vectors
  reused, validated batches, tasks whose lease is gone dropped, the tasks' embed progress written
  every PASS_PROGRESS_SECONDS, which is also where a lost lease shows).

The steps stay the boundaries of record: the parse step waits for each task's parse and reports
it (re-raising its error there, to be classified and recorded under the task's lease), the chunk
step likewise, and the embed step waits for the embed thread and then embeds whatever it left
(a skipped invalid batch, transient trouble) the usual way. Nothing is written to the index
before the publish step. Lost leases stop a task here as anywhere: it is skipped from then on.
"""

from __future__ import annotations

import logging
import queue
import threading
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from resources.indexing_run import IndexingRun, SharedVectors, TaskWork

log = logging.getLogger("kbindex.run")

GROUP_TEXTS = 256
"""Texts gathered before the embed thread sends a group (4 batches of 64): long enough to sort
well, short enough for the model to start a few documents into the run."""


class RunAhead:
    """The prepare and embed threads of one run; see the module docstring."""

    def __init__(self, run: IndexingRun, works: list[TaskWork], shared: SharedVectors, *,
                 group_texts: int | None = None) -> None:
        self.run, self.works, self.shared = run, works, shared
        self.group_texts = group_texts or GROUP_TEXTS
        self._prepared = {w.task_id: threading.Event() for w in works}
        self._errors: dict[tuple[str, int], Exception] = {}
        self._chunked: queue.SimpleQueue[TaskWork | None] = queue.SimpleQueue()
        self._stop = threading.Event()
        self._threads = [threading.Thread(target=self._prepare_all, name="kbindex-prepare", daemon=True),
                         threading.Thread(target=self._embed_all, name="kbindex-embed-ahead", daemon=True)]

    def start(self) -> RunAhead:
        for thread in self._threads:
            thread.start()
        return self

    def stop(self) -> None:
        """Ask both threads to stop after what they are doing (the run is ending)."""
        self._stop.set()

    # -- what the steps ask -------------------------------------------------------------------
    def covers(self, work: TaskWork) -> bool:
        return work.task_id in self._prepared

    def prepared(self, work: TaskWork, stage: str) -> None:
        """Wait until the task is parsed and chunked (or stopped); raise the error its ``stage`` met."""
        self._prepared[work.task_id].wait()
        error = self._errors.get((stage, work.task_id))
        if error is not None:
            raise error

    def wait_embedded(self, timeout: float | None = None) -> bool:
        """True once the embed thread is done (after ``timeout`` seconds: whether it is)."""
        self._threads[1].join(timeout)
        return not self._threads[1].is_alive()

    # -- the threads ----------------------------------------------------------------------------
    def _prepare_all(self) -> None:
        try:
            for work in self.works:
                if self._stop.is_set():
                    break
                try:
                    if self.run.alive(work):
                        self._prepare(work)
                finally:
                    self._prepared[work.task_id].set()
        finally:
            for event in self._prepared.values():  # stopped early: nobody waits forever
                event.set()
            self._chunked.put(None)

    def _prepare(self, work: TaskWork) -> None:
        try:
            self.run.parse_ahead(work)
        except Exception as exc:  # noqa: BLE001 - raised again, and classified, by the parse step
            self._errors[("parse", work.task_id)] = exc
            return
        try:
            chunks = self.run.chunk_ahead(work)
        except Exception as exc:  # noqa: BLE001 - raised again, and classified, by the chunk step
            self._errors[("chunk", work.task_id)] = exc
            return
        if chunks:
            self._chunked.put(work)

    def _embed_all(self) -> None:
        waiting: list[TaskWork] = []
        texts = 0
        done = False
        try:
            while not done and not self._stop.is_set():
                work = self._chunked.get()
                if work is None:
                    done = True
                elif self.run.alive(work):
                    waiting.append(work)
                    texts += len(self.run.chunks_of(work))
                if waiting and (done or texts >= self.group_texts):
                    if not self._embed(waiting):
                        break
                    waiting, texts = [], 0
        except Exception as exc:  # noqa: BLE001 - the embed step embeds what is left, and classifies errors
            log.warning("embedding ahead stopped (%s); the embed step embeds what is left", type(exc).__name__)

    def _embed(self, works: list[TaskWork]) -> bool:
        """One group, per model; False stops embedding ahead (the embed step does the rest)."""
        chunks_of = {w.task_id: self.run.chunks_of(w) for w in works}
        by_model: dict[tuple[str, int], list[Any]] = {}
        for work in works:
            if self.run.alive(work):
                by_model.setdefault((work.model, work.dimension), []).append(work)
        for (model, dimension), members in by_model.items():
            if not self.run.embed_group(model, dimension, members, chunks_of, self.shared, report=True):
                log.info("embedding ahead stopped; the embed step embeds what is left")
                return False
        return True
