"""A model migration of 100k versions launched from the Dagster UI, against plain indexing on the same setup.

``python -m bench.scale.migration [--versions 100000] [--plain 3000] [--minutes 4]`` starts a throwaway
PostgreSQL, bulk-loads ``--versions`` indexed versions (bench/scale/corpus.py; their bytes in the blob
store, the active profile on the fake model ``fake-384``) and publishes ``--plain`` fresh documents of
the same kind. Then ``dagster dev`` (webserver, daemon, claiming sensor; dagster.yaml's run slots)
starts and indexes them: **plain indexing**, tasks/s from the first run's start to the last task's end.
Then, as an operator would:

1. ``create_profile`` (what ``kbindex profile create`` calls) makes a shadow profile on ``fake-shadow``
   (a fake salted by its name: other vectors, same cost) and one REINDEX task per current version, in
   one statement: timed;
2. the ``backfill_profile`` job is launched with the UI's own ``LaunchPipelineExecution`` mutation (the
   launchpad): the round trip is timed (target <= 10 s);
3. the time from the mutation to the first indexing run STARTED is measured (target <= 60 s);
4. REINDEX tasks/s over the ``--minutes`` that follow that start, against plain indexing (target >= 0.9).
   Both rates run from the first run's start to the end of the last task finished (for REINDEX, within
   the window). The ratio that holds the target compares like with like: plain indexing's ``--plain``
   versions against the migration's first ``--plain`` versions. Both insert into an HNSW graph that holds
   the seeded corpus's chunks (random vectors), each model's vectors starting a neighbourhood of their
   own; an insert costs more as its neighbourhood fills (publish ~1.7 s -> ~5 s per 320 versions over a
   migration's first 15,000 of these near-identical synthetic documents), so the window's rate is lower
   than the first versions' and is printed beside it.

The CI-sized round is tests/acceptance/test_bench_scale_migration.py.
"""

from __future__ import annotations

import argparse
import json
import os
import tempfile
import time
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path

from bench.dagster_dev import LAUNCH_RUN
from bench.scale.corpus import (
    TENANT,
    DagsterUI,
    create_databases,
    document_text,
    seed_chunks,
    seed_corpus,
    write_blobs,
)

SHADOW = "shadow"
SHADOW_MODEL = "fake-shadow"
BACKFILL_JOB = "backfill_profile"
INDEX_JOB = "index_versions"
TARGETS = {"launch_seconds": 10.0, "first_run_seconds": 60.0, "ratio": 0.9}


@dataclass
class Result:
    versions: int
    plain_tasks: int
    plain_seconds: float
    create_seconds: float
    reindex_tasks: int
    launch_seconds: float
    first_run_seconds: float
    window_seconds: float
    reindex_done: int
    reindex_first_seconds: float | None
    """From the first run's start to the end of the migration's ``plain_tasks``-th task (None: not reached)."""
    backfill_run_status: str
    index_runs: int
    plain_runs: dict[str, int]
    retried: dict[str, int]
    """Tasks that took more than one attempt, by task type (lease expiries under load show up here)."""

    @property
    def plain_rate(self) -> float:
        return self.plain_tasks / self.plain_seconds

    @property
    def reindex_rate(self) -> float:
        return self.reindex_done / self.window_seconds

    @property
    def window_ratio(self) -> float:
        return self.reindex_rate / self.plain_rate

    @property
    def ratio(self) -> float:
        """The same number of versions, from the same state of the graph, as plain indexing."""
        if not self.reindex_first_seconds:
            return 0.0
        return (self.plain_tasks / self.reindex_first_seconds) / self.plain_rate

    def holds(self) -> dict[str, bool]:
        return {"launch_seconds": self.launch_seconds <= TARGETS["launch_seconds"],
                "first_run_seconds": self.first_run_seconds <= TARGETS["first_run_seconds"],
                "ratio": self.ratio >= TARGETS["ratio"]}


def _sql_one(url: str, statement: str, params: list | None = None):
    import psycopg

    with psycopg.connect(url, autocommit=True) as conn:
        return conn.execute(statement, params).fetchone()


def _wait(predicate, timeout: float, what: str, ui: DagsterUI, interval: float = 0.5):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        ui.dev.check_alive()
        time.sleep(interval)
    raise TimeoutError(f"timed out after {timeout:.0f} s waiting for {what}\n{ui.dev.log_tail()}")


def _first_start(instance, after: datetime) -> float | None:
    """Start time (epoch s) of the first indexing run created after ``after`` that has started."""
    import dagster as dg

    records = instance.get_run_records(dg.RunsFilter(job_name=INDEX_JOB, created_after=after))
    starts = [r.start_time for r in records if r.start_time]
    return min(starts) if starts else None


def launch_backfill_job(ui: DagsterUI, profile: str) -> tuple[str, float]:
    """The launchpad of ``backfill_profile``: the UI's LaunchPipelineExecution mutation; (run id, seconds)."""
    params = {
        "mode": "default",
        "executionMetadata": {"tags": []},
        "runConfigData": json.dumps({"ops": {"request_profile_backfill": {"config": {"profile": profile}}}}),
        "selector": {**ui.repository_selector(), "pipelineName": BACKFILL_JOB},
    }
    data, _, seconds = ui.post(LAUNCH_RUN, {"executionParams": params})
    out = data["launchPipelineExecution"]
    if out["__typename"] != "LaunchRunSuccess":
        raise RuntimeError(f"launch failed: {out}")
    return out["run"]["id"], seconds


def run(admin_url: str, workdir: Path, versions: int, plain: int, minutes: float, log_to: Path | None = None,
        lease_seconds: float = 300) -> Result:
    import dagster as dg

    from resources.blob_store import BlobStore
    from resources.database import Database
    from resources.local_postgres import with_database
    from resources.migrations import migrate
    from resources.profiles import create_profile
    from resources.publisher import Publisher

    kb, dg_db = "mig_kb", "mig_dg"
    create_databases(admin_url, kb, dg_db)
    kb_url = with_database(admin_url, kb)
    migrate(kb_url)
    blobs = str(workdir / "blobs")
    env = {"KBINDEX_DATABASE_URL": kb_url, "KBINDEX_HOME": str(workdir / "home"), "KBINDEX_BLOB_URL": blobs,
           "KBINDEX_ARTIFACTS": str(workdir / "artifacts"), "KBINDEX_LEASE_SECONDS": str(lease_seconds)}
    os.environ.update(env)
    db = Database(kb_url)
    ui = DagsterUI(workdir, with_database(admin_url, dg_db), env)
    try:
        db.execute("bench_corpus_set_active_model", {"model": "fake-384"})
        print(f"seeding {versions:,} indexed versions and their blobs ...", flush=True)
        seeded = seed_corpus(db, versions, progress=versions >= 200_000)
        chunked = seed_chunks(kb_url, versions)
        written = write_blobs(blobs, 1, versions)
        print(f"  {seeded:.0f} s (SQL), {chunked:.0f} s (a chunk each and the HNSW graph), {written:.0f} s (blobs)",
              flush=True)
        publisher = Publisher(db, BlobStore(blobs))
        for i in range(versions + 1, versions + plain + 1):  # the same kind of document, fresh
            publisher.publish(TENANT, f"fresh-{i}", document_text(i), f"fresh-{i}.txt")
        instance = ui.open_instance()
        began = datetime.now(UTC)
        print(f"dagster dev answered in {ui.start():.1f} s; plain indexing of {plain:,} fresh publishes ...", flush=True)
        _wait(lambda: _sql_one(kb_url, "SELECT count(*) = 0 FROM index_task WHERE status <> 'SUCCEEDED'")[0],
              3600, "plain indexing", ui)
        first = _first_start(instance, began)
        last = _sql_one(kb_url, "SELECT extract(epoch FROM max(finished_at)) FROM index_task"
                                " WHERE document_id ^@ 'fresh-'")[0]
        plain_seconds = float(last) - first
        # A run records its success a moment after its last task: count the plain runs once they are done.
        unfinished = dg.RunsFilter(job_name=INDEX_JOB, statuses=[dg.DagsterRunStatus.QUEUED,
                                   dg.DagsterRunStatus.NOT_STARTED, dg.DagsterRunStatus.STARTING,
                                   dg.DagsterRunStatus.STARTED])
        _wait(lambda: not instance.get_run_records(unfinished, limit=1), 120, "the plain runs to finish", ui)
        plain_runs: dict[str, int] = {}
        for record in instance.get_run_records(dg.RunsFilter(job_name=INDEX_JOB)):
            plain_runs[record.dagster_run.status.value] = plain_runs.get(record.dagster_run.status.value, 0) + 1

        started = time.perf_counter()
        created = create_profile(db, SHADOW, model=SHADOW_MODEL, chunk_tokens=200, overlap=32)
        create_seconds = time.perf_counter() - started
        print(f"create_profile: {created['reindex_tasks']:,} REINDEX tasks in {create_seconds:.2f} s", flush=True)

        launched_at = datetime.now(UTC)
        run_id, launch_seconds = launch_backfill_job(ui, SHADOW)
        first_start = _wait(lambda: _first_start(instance, launched_at), 600, "the first backfill run to start",
                            ui, interval=0.2)
        first_run_seconds = first_start - launched_at.timestamp()
        print(f"launched in {launch_seconds:.2f} s; first indexing run started after {first_run_seconds:.1f} s; "
              f"measuring {minutes:g} min ...", flush=True)
        time.sleep(max(0.0, first_start + minutes * 60 - time.time()))
        # Measured like plain indexing: from the first run's start to the end of the last task finished
        # (here, within the window), so the runs cut off by the window's end count neither their tasks
        # nor their time.
        done, last = _sql_one(kb_url, "SELECT count(*), extract(epoch FROM max(finished_at)) FROM index_task"
                                      " WHERE profile = %s AND task_type = 'REINDEX' AND status = 'SUCCEEDED'"
                                      " AND finished_at <= to_timestamp(%s)", [SHADOW, first_start + minutes * 60])
        window = float(last) - first_start if last is not None else minutes * 60
        nth = _sql_one(kb_url, "SELECT extract(epoch FROM finished_at) FROM index_task WHERE profile = %s"
                               " AND task_type = 'REINDEX' AND status = 'SUCCEEDED' ORDER BY finished_at"
                               " OFFSET %s LIMIT 1", [SHADOW, plain - 1])
        first_seconds = float(nth[0]) - first_start if nth else None
        backfill_run = instance.get_run_by_id(run_id)
        runs = instance.get_run_records(dg.RunsFilter(job_name=INDEX_JOB, created_after=launched_at))
        retried = {r["task_type"]: int(r["tasks"]) for r in db.fetch_all("bench_corpus_retried")}
        return Result(versions, plain, plain_seconds, create_seconds, int(created["reindex_tasks"]),
                      launch_seconds, first_run_seconds, window, int(done), first_seconds,
                      backfill_run.status.value if backfill_run else "missing", len(runs), plain_runs, retried)
    finally:
        db.close()
        if log_to is not None and ui.dev.log_path.exists():
            log_to.write_bytes(ui.dev.log_path.read_bytes())
        ui.stop()


def report(r: Result) -> bool:
    holds = r.holds()

    def mark(key: str) -> str:
        return "ok" if holds[key] else "MISSED"

    print(f"\nmigration of {r.reindex_tasks:,} versions ({r.versions:,} seeded + {r.plain_tasks:,} fresh), "
          f"fake models, dagster.yaml run slots")
    print(f"  create_profile (REINDEX tasks, one statement)   {r.create_seconds:8.2f} s")
    print(f"  launch mutation round trip                     {r.launch_seconds:8.2f} s   target <= 10 s  {mark('launch_seconds')}")
    print(f"  mutation -> first indexing run STARTED         {r.first_run_seconds:8.1f} s   target <= 60 s  {mark('first_run_seconds')}")
    print(f"  plain indexing ({r.plain_tasks:,} fresh publishes)        {r.plain_rate:8.1f} tasks/s over {r.plain_seconds:.0f} s")
    first = f"{r.plain_tasks / r.reindex_first_seconds:8.1f} tasks/s" if r.reindex_first_seconds else "     not reached"
    print(f"  REINDEX, its first {r.plain_tasks:,} versions              {first}")
    print(f"  ratio, the same number of versions             {r.ratio:8.2f}     target >= 0.9   {mark('ratio')}")
    print(f"  REINDEX, first {r.window_seconds:.0f} s                         {r.reindex_rate:8.1f} tasks/s "
          f"({r.reindex_done:,} done, {r.index_runs} runs): {r.window_ratio:.2f} of plain")
    print(f"  backfill_profile run: {r.backfill_run_status}; plain runs by status: {r.plain_runs}; "
          f"tasks retried (attempts > 1): {r.retried or 'none'}")
    return all(holds.values())


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--versions", type=int, default=100_000, help="indexed versions to migrate")
    parser.add_argument("--plain", type=int, default=3000, help="fresh publishes for the plain-indexing rate")
    parser.add_argument("--minutes", type=float, default=4.0, help="REINDEX throughput window after the first run starts")
    parser.add_argument("--lease-seconds", type=float, default=300,
                        help="KBINDEX_LEASE_SECONDS for both phases: on a loaded machine runs can take longer than "
                             "the default 60 s to start, and then lose their leases (measured here: load 15-22 on 2 cores)")
    parser.add_argument("--log", type=Path, help="keep a copy of the dagster dev log here")
    args = parser.parse_args(argv)
    from resources.local_postgres import temporary_server

    with temporary_server("kbindex-bench-migration-", external_env="KBINDEX_BENCH_DATABASE_URL") as admin_url, \
            tempfile.TemporaryDirectory(prefix="kb-scale-mig-") as tmp:
        result = run(admin_url, Path(tmp), args.versions, args.plain, args.minutes, args.log, args.lease_seconds)
        ok = report(result)  # before the clean-up: deleting 10^5 blobs takes minutes on a loaded machine
    return 0 if ok else 1


if __name__ == "__main__":
    raise SystemExit(main())
