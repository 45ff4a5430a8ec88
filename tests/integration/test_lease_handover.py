"""Leases belong to the run that starts them, not to a sensor tick (issue #12, defect 5).

- The claiming sensor's lease is handed to the run by one fenced statement (``task_adopt``); a
  re-execution that copied the run's tags cannot adopt the same attempt.
- A lease no run ever adopted (the tick died, the run never started) expires and is taken over with
  a new fencing token, but does not count as an attempt: it never makes a document DEAD.
"""

from __future__ import annotations

from resources.blob_store import BlobStore
from resources.indexing_run import IndexingRun
from resources.lease_keeper import LeaseKeeper
from resources.task_queue import Lease


def test_reservations_that_expire_unadopted_do_not_spend_attempts(publish_task, make_queue, clock):
    queue = make_queue(lease_seconds=30.0, reservation_seconds=30.0, giveback_limit=100)
    r = publish_task()
    for tick in range(8):  # more ticks than max_attempts (5): each claim's run never starts
        (claimed,) = queue.claim(f"batch-{tick}", limit=1, for_run=True)
        assert claimed.lease.attempt == tick + 1  # the fencing token still grows
        clock.advance(31)
    task = queue.get(r.task_id)
    assert task["status"] == "RUNNING" and task["max_attempts"] == 5 + 7
    # (bounded: tests/integration/test_reservations.py ends such a task DEAD RUN_NEVER_STARTED)


def test_adopted_leases_that_expire_count_and_end_dead(db, publish_task, make_queue, clock):
    queue = make_queue(lease_seconds=30.0)
    r = publish_task()
    for tick in range(5):
        (claimed,) = queue.claim(f"batch-{tick}", limit=1, for_run=True)
        (adopted,) = queue.adopt([claimed.lease], f"run-{tick}")
        assert (adopted.owner, adopted.attempt) == (f"run-{tick}", claimed.lease.attempt)
        clock.advance(31)  # the run started, then hung or died without a trace
    assert queue.claim("batch-last", limit=1, for_run=True) == []
    task = queue.get(r.task_id)
    assert (task["status"], task["error_code"], task["attempts"]) == ("DEAD", "LEASE_ATTEMPTS_EXHAUSTED", 5)
    runs = [e["message"] for e in queue.events(r.task_id) if e["kind"] == "run"]
    assert len(runs) == 5 and runs[0].startswith("started by run-0")


def test_a_reexecution_that_copied_the_tags_cannot_adopt_the_same_attempt(db, publish_task, make_queue, tmp_path):
    queue = make_queue(lease_seconds=60.0)
    r = publish_task()
    (claimed,) = queue.claim("batch-x", limit=1, for_run=True)
    pairs = [(claimed.lease.task_id, claimed.lease.attempt)]

    def run(owner: str) -> IndexingRun:
        return IndexingRun(db=db, queue=queue, keeper=LeaseKeeper(queue), owner=owner, granted_by="batch-x",
                           blobs=BlobStore(str(tmp_path)), embedder_for=lambda m: None, tagged=pairs)

    key = db.fetch_one("document_version_partition_keys", {"task_ids": [r.task_id]})["partition_key"]
    original, copy = run("run-original"), run("run-reexecution")
    assert [w.lease.owner for w in original.acquire([key])[key]] == ["run-original"]
    assert copy.acquire([key])[key] == []  # the hung original still owns the attempt
    task = queue.get(r.task_id)
    assert (task["lease_owner"], task["attempts"]) == ("run-original", claimed.lease.attempt)
    # And the sensor's own owner name no longer opens the fence either.
    assert queue.adopt([Lease(r.task_id, claimed.lease.attempt, "batch-x", None)], "run-late") == []


def test_a_run_that_crashes_before_adopting_its_lease_costs_no_attempt(publish_task, make_queue):
    queue = make_queue(lease_seconds=30.0)
    r = publish_task()
    (claimed,) = queue.claim("batch-c", limit=1, for_run=True)
    before = queue.get(r.task_id)["max_attempts"]
    queue.fail_crashed_run([(claimed.lease.task_id, claimed.lease.attempt)], "RUN_CRASHED", "the run died at start",
                           owner="batch-c", run_owner="run-c")
    task = queue.get(r.task_id)
    assert (task["status"], task["max_attempts"], task["error_code"]) == ("RETRY_WAIT", before + 1, None)


def test_kbindex_task_names_the_dagster_runs_that_worked_on_it(db, db_url, publish_task, make_queue, monkeypatch):
    """A version's history keeps its Dagster run ids (with UI links), even once its partition key is pruned."""
    import json

    from typer.testing import CliRunner

    from pipelines.cli import app

    queue = make_queue(lease_seconds=30.0)
    r = publish_task()
    (claimed,) = queue.claim("batch-y", limit=1, for_run=True)
    queue.adopt([claimed.lease], "run-0f3c2a")
    monkeypatch.setenv("KBINDEX_DATABASE_URL", db_url)
    monkeypatch.setenv("KBINDEX_DAGSTER_URL", "http://dagster.example:3000/")
    out = CliRunner().invoke(app, ["task", str(r.task_id), "--json"])
    assert out.exit_code == 0, out.output
    assert json.loads(out.output)["dagster_runs"] == [
        {"run_id": "0f3c2a", "attempt": 1, "url": "http://dagster.example:3000/runs/0f3c2a"}]
    text = CliRunner().invoke(app, ["task", str(r.task_id)], env={"COLUMNS": "100"})
    assert "http://dagster.example:3000/runs/0f3c2a" in text.output
