"""What deleting the runs of pruned keys costs, and what it buys the partitions tab (issue #33).

``python -m bench.scale.history [--versions 130000] [--live-keys 30000] [--history 99996] [--run-size 12]``
starts a throwaway PostgreSQL and ``dagster dev`` as bench.scale.ui does, gives the newest ``--live-keys``
versions their key and one materialization per asset, then writes what ``--history`` versions indexed earlier
and pruned leave in Dagster's storage when their runs stay: runs of ``--run-size`` versions, each a copy of
one real index run (the four assets materialized in process with the fake model: run record and tags, step
events, planned and done materializations) with its run id, partition keys and lease tags replaced, and the
adoption event each run leaves in kbindex's task_event. It times each partitions tab after one new key
(bench.scale.ui's round: the first request rebuilds the status cache from the asset's whole history), deletes
those runs as prune_lineage_keys does (``delete_runs_of``, in batches of 5,000 keys like a prune run), and
times the tabs again. The CI-sized round is tests/acceptance/test_bench_scale_history.py.
"""

from __future__ import annotations

import argparse
import re
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

from bench.scale.corpus import TENANT, corpus_keys, document_text, open_round, seed_corpus
from bench.scale.ui import ALL_ASSETS, WINDOW_SECONDS, Round, add_keys, measure_round

TEMPLATE_TENANT = "template"
OWNER = "bench-history"
PRUNE_BATCH = 5000  # keys per prune run (PruneConfig.batch)


@dataclass
class Deletion:
    runs: int
    kept: int
    events_before: int  # of the history's runs
    events_after: int
    runs_after: int  # of the history's runs left in Dagster's run storage
    seconds: float
    by_storage: dict[str, tuple[int, int, float]]
    """storage -> (keys, runs deleted, seconds): the prune batches alternate between the two."""


def template_run(instance, db, blob_url: str, size: int):
    """One real index run of ``size`` new documents, in process with the active (fake) model: (run, its keys)."""
    import dagster as dg

    from pipelines.assets import indexing_assets
    from pipelines.partitions import VERSIONS_PARTITIONS_NAME
    from resources.blob_store import BlobStore
    from pipelines.sensors import run_tags
    from resources.dagster_resources import default_resources
    from resources.publisher import Publisher
    from resources.task_queue import TaskQueue

    publisher, queue = Publisher(db, BlobStore(blob_url)), TaskQueue(db, lease_seconds=600)
    for i in range(size):
        publisher.publish(TEMPLATE_TENANT, f"template-{i}", document_text(i), f"template-{i}.txt")
    claimed = queue.claim(OWNER, limit=size)
    assert len(claimed) == size, "only the template documents may be due"
    tasks = [t.lease.task_id for t in claimed]
    keys = [r["partition_key"] for r in db.fetch_all("document_version_partition_keys", {"task_ids": tasks})]
    instance.add_dynamic_partitions(VERSIONS_PARTITIONS_NAME, keys)
    tags = run_tags([(t.lease.task_id, t.lease.attempt) for t in claimed], keys, OWNER, TEMPLATE_TENANT)
    result = dg.materialize(indexing_assets, resources=default_resources(), instance=instance, tags=tags)
    assert result.success
    return instance.get_run_by_id(result.run_id), keys


def copy_runs(instance, db, dagster_db, template, template_keys: list[str], keys: list[str],
              out=print) -> list[str]:
    """Runs of ``len(template_keys)`` versions over ``keys``, each a copy of ``template`` (its record, tags and
    events, run id and keys replaced), and their adoption events in task_event; returns their run ids.

    Materializations go through Dagster's batch writer, one batch per asset for many runs (as
    bench.scale.ui's history); the other events straight into its event log (``bench_history_copy_events``)."""
    import dagster as dg
    from dagster._core.events import DagsterEventType
    from dagster._core.events.log import EventLogEntry
    from dagster._core.utils import make_new_run_id

    from pipelines.sensors import run_tags

    size = len(template_keys)
    assert len(keys) % size == 0, "whole runs only"
    entries = [r.event_log_entry for r in instance.get_records_for_run(template.run_id, limit=1_000_000).records]
    texts = [dg.serialize_value(entry) for entry in entries]

    def is_materialization(entry) -> bool:
        return entry.is_dagster_event and entry.dagster_event_type == DagsterEventType.ASSET_MATERIALIZATION

    def columns(entry) -> tuple:
        event = entry.dagster_event if entry.is_dagster_event else None
        asset = event.asset_key.to_string() if event is not None and event.asset_key else None
        partition = event.partition if event is not None and asset else None
        return (event.event_type_value if event else None, entry.timestamp, entry.step_key, asset, partition)

    tasks = {r["partition_key"]: r["task_id"] for r in db.fetch_all("bench_history_tasks_of_keys",
                                                                   {"partition_keys": keys})}
    started, run_ids, plain, materialized = time.perf_counter(), [], [], {}
    for start in range(0, len(keys), size):
        group = keys[start:start + size]
        run_id = make_new_run_id()
        run_ids.append(run_id)
        swap = {template.run_id: run_id, **dict(zip(template_keys, group))}
        pattern = re.compile("|".join(re.escape(k) for k in sorted(swap, key=len, reverse=True)))
        pairs = [(tasks[k], 1) for k in group]
        tags = run_tags(pairs, group, OWNER, TENANT)  # as the sensor tags a run of these versions
        instance.add_run(dg.DagsterRun(job_name=template.job_name, run_id=run_id,
                                       status=dg.DagsterRunStatus.SUCCESS, tags=tags))
        for text, entry in zip(texts, entries):
            copied = pattern.sub(lambda m: swap[m.group(0)], text)
            if is_materialization(entry):
                materialized.setdefault(entry.dagster_event.asset_key, []).append(
                    dg.deserialize_value(copied, EventLogEntry))
            else:
                event_type, ts, step_key, asset, partition = columns(entry)
                plain.append((run_id, copied, event_type, ts, step_key, asset, swap.get(partition, partition)))
        db.execute("bench_history_seed_run_owners", {"task_ids": [t for t, _ in pairs], "run_ids": [run_id] * size})
        written = len(run_ids)
        if written % 200 == 0 or start + size == len(keys):
            for batch in materialized.values():
                instance.event_log_storage.store_event_batch(batch)
            names = ("run_ids", "events", "event_types", "timestamps", "step_keys", "asset_keys", "partitions")
            dagster_db.execute("bench_history_copy_events", dict(zip(names, map(list, zip(*plain)))))
            plain, materialized = [], {}
        if written % 2000 == 0 or start + size == len(keys):
            out(f"  history: {written:,} runs of {size} versions, {written * len(entries):,} events "
                f"({time.perf_counter() - started:.0f} s)")
    return run_ids


def delete_history(instances: dict, dagster_db, kb_url: str, keys: list[str], run_ids: list[str],
                   batch_keys: int = PRUNE_BATCH, out=print) -> Deletion:
    """The runs of ``keys`` deleted as prune_lineage_keys deletes them, a prune batch at a time, the batches
    alternating between ``instances`` (name -> instance on the same storage, configured differently)."""
    from pipelines.lineage_job import delete_runs_of
    from resources.dagster_resources import DatabaseResource

    database = DatabaseResource(url=kb_url)
    before = dagster_db.fetch_one("bench_history_dagster_events", {"run_ids": run_ids})
    by_storage = {name: (0, 0, 0.0) for name in instances}
    started, runs, kept = time.perf_counter(), 0, 0
    for n, start in enumerate(range(0, len(keys), batch_keys)):
        name = list(instances)[n % len(instances)]
        batch = keys[start:start + batch_keys]
        t0 = time.perf_counter()
        deleted, left = delete_runs_of(instances[name], database, batch)
        done_keys, done_runs, seconds = by_storage[name]
        by_storage[name] = (done_keys + len(batch), done_runs + deleted, seconds + time.perf_counter() - t0)
        runs, kept = runs + deleted, kept + left
        out(f"  deleted the runs of {min(len(keys), start + batch_keys):,} keys: {runs:,} runs "
            f"({time.perf_counter() - started:.0f} s; this batch through {name})")
    seconds = time.perf_counter() - started
    after = dagster_db.fetch_one("bench_history_dagster_events", {"run_ids": run_ids})
    return Deletion(runs, kept, int(before["events"]), int(after["events"]), int(after["runs"]), seconds, by_storage)


def run(admin_url: str, workdir: Path, versions: int, live: int, history: int, run_size: int,
        repeat: int, batch_keys: int = PRUNE_BATCH) -> tuple[Round, Round, Deletion, int]:
    """(round before, round after the deletion, the deletion, events per run)."""
    from pipelines.partitions import VERSIONS_PARTITIONS_NAME
    from resources.database import Database

    assert live + history <= versions, "--versions must cover the live and history keys"
    assert history % run_size == 0, "--history must be a multiple of --run-size"
    db, kb_url, dagster_url, ui = open_round(admin_url, workdir, "history")
    dagster_db = Database(dagster_url)
    try:
        print(f"seeding {versions:,} indexed versions ...", flush=True)
        print(f"  {seed_corpus(db, versions, progress=versions >= 200_000):.0f} s", flush=True)
        db.execute("bench_corpus_set_active_model", {"model": "fake-384"})
        instance = ui.open_instance()
        template, template_keys = template_run(instance, db, str(workdir / "blobs"), run_size)
        per_run = len(instance.get_records_for_run(template.run_id, limit=1_000_000).records)
        print(f"template: one real index run of {run_size} versions wrote {per_run} events", flush=True)
        history_keys = corpus_keys(db, 1, history)
        print(f"history: {history:,} pruned versions' runs ...", flush=True)
        run_ids = copy_runs(instance, db, dagster_db, template, template_keys, history_keys,
                            out=lambda line: print(line, flush=True))
        instance.delete_run(template.run_id)  # the template is no version of the corpus
        for key in template_keys:
            instance.delete_dynamic_partition(VERSIONS_PARTITIONS_NAME, key)
        print(f"dagster dev answered in {ui.start():.1f} s", flush=True)
        assert ui.stop_sensor("prune_lineage_keys_when_due") == "STOPPED"
        nodes = ui.post(ALL_ASSETS)[0]["assetNodes"]
        every = [n["assetKey"]["path"] for n in nodes]
        partitioned = [n["assetKey"]["path"] for n in nodes if n["partitionDefinition"]]
        add_keys(instance, db, corpus_keys(db, versions - live + 1, live), partitioned, age_seconds=0,
                 spread_seconds=WINDOW_SECONDS * 0.9)
        print(f"round: {live:,} live keys, the runs of {history:,} pruned keys behind them ...", flush=True)
        before = measure_round(ui, instance, live, partitioned, every, repeat)
        print("deleting the history's runs as prune_lineage_keys does ...", flush=True)
        storages = {"kbindex storage": ui.product_instance(), "dagster_postgres": instance}
        deletion = delete_history(storages, dagster_db, kb_url, history_keys, run_ids, batch_keys,
                                  out=lambda line: print(line, flush=True))
        print(f"round: {live:,} live keys, their runs deleted ...", flush=True)
        after = measure_round(ui, instance, live, partitioned, every, repeat)
        return before, after, deletion, per_run
    finally:
        db.close()
        dagster_db.close()
        ui.stop()


def report(live: int, history: int, run_size: int, before: Round, after: Round, deletion: Deletion,
           per_run: int) -> None:
    runs = history // run_size
    print(f"\n{live:,} live keys; history: {history:,} pruned versions in {runs:,} runs of {run_size} "
          f"({per_run} events each)")
    print(f"{'':<38}{'runs kept':>16}{'runs deleted':>16}")
    for asset in before.after_new_key:
        print(f"{'  tab after a new key ' + asset:<38}" + "".join(
            f"{'{:.2f} / {:.2f}'.format(*r.after_new_key[asset]):>16}" for r in (before, after)))
    print(f"{'slowest after a new key, first/next':<38}"  # the README's table row
          + "".join(f"{'{:.2f} / {:.2f}'.format(*r.worst_after_new_key):>16}" for r in (before, after)))
    print(f"{'slowest query, first / warm s':<38}"
          + "".join(f"{f'{r.worst_first:.2f} / {r.worst:.2f}':>16}" for r in (before, after)))
    print(f"deleted {deletion.runs:,} runs ({deletion.kept:,} kept) and "
          f"{deletion.events_before - deletion.events_after:,} events in {deletion.seconds:.1f} s "
          f"({deletion.runs_after:,} runs and {deletion.events_after:,} events of the history left), the prune "
          f"batches ({PRUNE_BATCH:,} keys) alternating between two configurations of the same storage:")
    for name, (keys, runs, seconds) in deletion.by_storage.items():
        print(f"  {name + ':':<18} {runs:,} runs in {seconds:.1f} s: {1000 * seconds / max(1, runs):.1f} ms per run, "
              f"{1000 * seconds / max(1, keys):.2f} ms per pruned key; a prune run's {PRUNE_BATCH:,} keys add "
              f"~{seconds / max(1, keys) * PRUNE_BATCH:.0f} s")
    print("(kbindex storage: the project's dagster.yaml, as the prune run has it: pooled connections, schema checks "
          "remembered; dagster_postgres: plain, a new connection per call)")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--versions", type=int, default=130_000, help="indexed versions in the corpus")
    parser.add_argument("--live-keys", type=int, default=30_000, help="live partition keys (the cap)")
    parser.add_argument("--history", type=int, default=99_996, help="pruned versions whose runs stay "
                        "(a multiple of --run-size)")
    parser.add_argument("--run-size", type=int, default=12, help="versions per history run (BATCH_MIN: 12)")
    parser.add_argument("--repeat", type=int, default=2, help="warm requests per query after the first")
    args = parser.parse_args(argv)
    from resources.local_postgres import temporary_server

    with temporary_server("kbindex-bench-history-", external_env="KBINDEX_BENCH_DATABASE_URL") as admin_url, \
            tempfile.TemporaryDirectory(prefix="kb-scale-history-") as tmp:
        before, after, deletion, per_run = run(admin_url, Path(tmp), args.versions, args.live_keys, args.history,
                                               args.run_size, args.repeat)
        report(args.live_keys, args.history, args.run_size, before, after, deletion, per_run)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
