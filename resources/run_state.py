"""A run's intermediate outputs (parsed document, chunks, vectors), kept per index task.

Keyed by task id, never by partition key alone: the active and a building profile share one
partition key per version, and two runs may work on that key at once under different profiles
(issue #12, defect 1). Each stored value carries the fingerprint of what produced it (task,
profile, model, chunker parameters, document bytes); a value whose fingerprint does not match the
task asking for it is treated as missing and recomputed, so no run can pick up another profile's
chunks or vectors. Values live in memory for the run and in the artifact store for re-execution
from failure (which then does not redo finished steps).

A task's stored outputs are deleted when the task ends in this run (``discard``: published, or its
failure recorded); a task that only lost its lease keeps them (``forget``), since the run that takes
it over may reuse them. What ends elsewhere is left to resources/artifact_sweep.py (issue #28).
"""

from __future__ import annotations

import logging
from collections.abc import Hashable
from typing import Any

from resources.artifact_store import ArtifactStore, artifact_key

__all__ = ["STAGES", "RunState", "artifact_key"]  # artifact_key: benches read chunks back by it

log = logging.getLogger(__name__)

STAGES = ("parsed_document", "document_chunks", "chunk_embeddings")


class RunState:
    """Per-task outputs of one run, in memory and (if a store is given) on disk."""

    def __init__(self, store: ArtifactStore | None = None) -> None:
        self.store = store
        self._memory: dict[tuple[str, int], tuple[Hashable, Any]] = {}

    def put(self, stage: str, task_id: int, fingerprint: Hashable, value: Any, *, keep: bool = True) -> None:
        """Hold the value for the run; ``keep``: also store it for re-execution (False: cheaper to recompute)."""
        assert stage in STAGES, stage
        self._memory[(stage, task_id)] = (fingerprint, value)
        if self.store is not None and keep:
            self.store.put(stage, artifact_key(task_id), {"fingerprint": fingerprint, "value": value})

    def get(self, stage: str, task_id: int, fingerprint: Hashable) -> Any:
        """The value this task's ``stage`` produced under ``fingerprint``; KeyError if none matches."""
        held = self._memory.get((stage, task_id))
        if held is None and self.store is not None:
            try:
                stored = self.store.get(stage, artifact_key(task_id))
            except KeyError:
                stored = None
            if isinstance(stored, dict) and "fingerprint" in stored:
                held = (stored["fingerprint"], stored["value"])
        if held is None or held[0] != fingerprint:
            raise KeyError(f"no {stage} of task {task_id} for this profile and document")
        self._memory[(stage, task_id)] = held
        return held[1]

    def forget(self, task_id: int) -> None:
        """Drop a task's outputs from memory (a 160-version run keeps only what is in flight); the
        stored copies stay for whoever runs the task next."""
        for stage in STAGES:
            self._memory.pop((stage, task_id), None)

    def discard(self, task_id: int) -> None:
        """The task ended here (published, or its failure recorded): drop its outputs from memory and
        delete its stored ones, every stage. Never raises for the disk: the task's outcome is already
        recorded, and the sweep deletes what is left."""
        self.forget(task_id)
        if self.store is not None:
            try:
                self.store.delete_task(task_id)
            except OSError as exc:
                log.warning("task %s: could not delete its artifacts (%s); the sweep will", task_id, exc)
