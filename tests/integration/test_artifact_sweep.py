"""The artifact sweep on real PostgreSQL: files of ended or vanished tasks go, open tasks' and young files stay
(issue #28, defect 5)."""

from __future__ import annotations

import hashlib
import os
import time

from resources.artifact_store import ArtifactStore
from resources.artifact_sweep import sweep_artifacts
from resources.run_state import STAGES

HOUR = 3600.0


def _age(store: ArtifactStore, task_id: int, seconds: float) -> None:
    then = time.time() - seconds
    for path in store.task_folder(task_id).iterdir():
        os.utime(path, (then, then))


def test_the_sweep_deletes_artifacts_of_ended_and_vanished_tasks_only(db, publish_task, make_queue, tmp_path,
                                                                      monkeypatch):
    queue = make_queue()
    ids = {name: publish_task().task_id for name in
           ("running", "retry_wait", "succeeded", "dead", "cancelled", "cancelled_young")}
    leases = {t.lease.task_id: t.lease for t in queue.claim("w1", limit=10)}
    ids["pending"] = publish_task().task_id  # published after the claim: never claimed
    name_of = {task_id: name for name, task_id in ids.items()}
    for task_id, lease in leases.items():
        name = name_of[task_id]
        if name == "retry_wait":
            queue.fail(lease, "EMBEDDING_TIMEOUT", "slow provider")
        elif name == "succeeded":
            queue.complete(lease, chunk_count=0)
        elif name == "dead":
            queue.fail(lease, "PARSE_ERROR", "not a document")
    queue.cancel(ids["cancelled"])
    queue.cancel(ids["cancelled_young"])
    statuses = {name: queue.get(task_id)["status"] for name, task_id in ids.items()}
    assert statuses == {"pending": "PENDING", "running": "RUNNING", "retry_wait": "RETRY_WAIT",
                        "succeeded": "SUCCEEDED", "dead": "DEAD", "cancelled": "CANCELLED",
                        "cancelled_young": "CANCELLED"}

    store = ArtifactStore(tmp_path / "artifacts")
    vanished = max(ids.values()) + 1000  # a task that no longer exists (or never did in this database)
    for task_id in [*ids.values(), vanished]:
        for stage in STAGES:
            store.put(stage, task_id, {"fingerprint": None, "value": "document text"})
        if task_id != ids["cancelled_young"]:
            _age(store, task_id, 2 * HOUR)
    legacy = store.root / (hashlib.sha256(b"parsed_document").hexdigest()[:8] + "-parsed_document")
    digest = hashlib.sha256(b"acme/doc/v1").hexdigest()
    (legacy / digest[:2]).mkdir(parents=True)
    old_file = legacy / digest[:2] / f"{digest}.pickle"
    old_file.write_bytes(b"old layout")
    os.utime(old_file, (time.time() - 2 * HOUR,) * 2)

    statements = []
    fetch_all = db.fetch_all
    monkeypatch.setattr(db, "fetch_all", lambda name, params=None: statements.append(name) or fetch_all(name, params))
    report = sweep_artifacts(db, store, grace_seconds=HOUR, batch=3)

    left = sorted(store.task_ids())
    assert left == sorted([ids["pending"], ids["running"], ids["retry_wait"], ids["cancelled_young"]])
    for task_id in left:
        assert sorted(p.name for p in store.task_folder(task_id).iterdir()) == sorted(f"{s}.pickle" for s in STAGES)
    assert not legacy.exists()
    assert statements == ["artifact_tasks_ended"] * 3  # 8 folders in batches of 3: one statement per batch
    assert report.tasks_checked == 8
    assert report.tasks_ended == 5  # succeeded, dead, cancelled, cancelled_young (kept: young), vanished
    assert report.files_deleted == 4 * len(STAGES)
    assert report.legacy_files_deleted == 1

    # Once the young files have aged past the grace period, the next pass takes them.
    _age(store, ids["cancelled_young"], 2 * HOUR)
    again = sweep_artifacts(db, store, grace_seconds=HOUR)
    assert again.files_deleted == len(STAGES)
    assert sorted(store.task_ids()) == sorted([ids["pending"], ids["running"], ids["retry_wait"]])


def test_the_sweep_of_a_missing_folder_does_nothing(db, tmp_path):
    report = sweep_artifacts(db, ArtifactStore(tmp_path / "never-created"))
    assert (report.tasks_checked, report.files_deleted, report.legacy_files_deleted) == (0, 0, 0)
