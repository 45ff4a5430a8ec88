"""Sweep of run artifacts whose task ended outside the run that wrote them (issue #28, defect 5).

A run deletes a task's artifacts itself when the task ends there (RunState.discard). Tasks also end
elsewhere: cancelled by an operator, DEAD by lease exhaustion in the claim, failed by the crashed-run
sensor, or in a run killed before it could clean up; and a task that lost its lease keeps its files
for the run that takes it over. This sweep lists the store's task folders in bounded batches, asks the
database in one statement per batch which of those tasks ended or no longer exist
(``artifact_tasks_ended``), and deletes their files. Folders of the layout before issue #28 go too:
nothing reads them any more.

A file younger than ``grace_seconds`` is never deleted: a run may be writing it (a retried or
re-queued task of the same id, or a run that has not yet noticed its task was cancelled).
"""

from __future__ import annotations

import itertools
import time
from dataclasses import dataclass
from pathlib import Path

from resources.artifact_store import ArtifactStore
from resources.database import Database
from resources.settings import Settings

DEFAULT_GRACE_SECONDS = 3600.0
BATCH = 500


def artifact_root(env: dict[str, str] | None = None) -> Path:
    """Where runs keep their artifacts: KBINDEX_ARTIFACTS, else KBINDEX_HOME/artifacts (``Settings``, the one
    rule IndexingRunResource and erase use too)."""
    folder = Settings.from_env(env).artifacts_dir
    assert folder is not None  # from_env always sets it
    return folder


@dataclass(frozen=True)
class ArtifactSweepReport:
    tasks_checked: int = 0
    tasks_ended: int = 0
    files_deleted: int = 0
    legacy_files_deleted: int = 0

    def to_metadata(self) -> dict[str, int]:
        return {
            "artifact_tasks_checked": self.tasks_checked,
            "artifact_tasks_ended": self.tasks_ended,
            "artifact_files_deleted": self.files_deleted,
            "artifact_legacy_files_deleted": self.legacy_files_deleted,
        }


def sweep_artifacts(
    db: Database,
    store: ArtifactStore,
    *,
    grace_seconds: float = DEFAULT_GRACE_SECONDS,
    batch: int = BATCH,
    now: float | None = None,
) -> ArtifactSweepReport:
    """Delete the artifacts of tasks that ended or are gone, and old-layout files (see the module
    docstring); ``now`` is a ``time.time()`` value (tests pin it). Returns what was done."""
    modified_before = (time.time() if now is None else now) - grace_seconds
    checked = ended = deleted = 0
    task_ids = store.task_ids()
    while chunk := list(itertools.islice(task_ids, batch)):
        checked += len(chunk)
        for row in db.fetch_all("artifact_tasks_ended", {"task_ids": chunk}):
            ended += 1
            deleted += store.delete_task(int(row["task_id"]), modified_before=modified_before)
    legacy = sum(store.delete_legacy(folder, modified_before=modified_before) for folder in store.legacy_folders())
    return ArtifactSweepReport(checked, ended, deleted, legacy)
