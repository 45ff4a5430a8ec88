"""The Dagster UI's partitions tab and asset graph with a 1M-version corpus, and one prune of the lineage keys.

``python -m bench.scale.ui [--versions 1000000] [--live-keys 10000,70000] [--prune 5000]`` starts a
throwaway PostgreSQL, bulk-loads ``--versions`` indexed versions into kbindex (bench/scale/corpus.py)
and starts ``dagster dev`` on a Dagster instance in the same server. The live partition keys are what
prune_lineage_keys leaves: the versions of the lineage window (7 days), so their number is the churn
(10k versions/day for 7 days = 70k keys), not the corpus. For each ``--live-keys`` count, ascending, the
newest versions get their key, as the sensor adds it, and one materialization of each of the four
partitioned assets; then the bench sends the UI's own queries to the webserver, copied from the
dagster-webserver 1.13.27 bundle (its source map, ui-core/src):

- ``PartitionHealthQuery`` (assets/usePartitionHealthData.tsx): the asset's Partitions tab, per asset;
- ``AssetGraphLiveQuery`` (asset-data/AssetBaseDataProvider.tsx): the asset graph's live data, for
  every asset of the code location in one request (the UI batches the visible nodes).

Each is timed on its first request after the keys were added (the status cache catches up) and as
the median of ``--repeat`` later ones, with its response size; then each partitions tab again, first
and next request, after one more key was added, as the sensor adds one for each new version (Dagster keys
its status cache by a hash of all the keys, so the first of those rebuilds it from the asset's whole
materialization history: with continuous indexing that, not the warm median, is what an operator
opening the tab waits). Then ``--prune`` keys older than the
window are added and the ``prune_lineage_keys`` job runs once in process over the whole corpus: its
time must follow the keys it deletes, not the corpus. The CI-sized round is
tests/acceptance/test_bench_scale_ui.py.

``--history N`` (issue #33) first writes what N versions indexed and pruned earlier leave in Dagster's
storage: one materialization of each partitioned asset per pruned key (pruning deletes keys, not events),
so the partitions tab and the asset graph are measured with that history behind them. Runless events, as
the live keys get: no run records or step events are seeded.
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

from bench.scale.corpus import DagsterUI, corpus_keys, open_round, seed_corpus

TARGET_SECONDS = 2.0
WINDOW_SECONDS = 7 * 24 * 3600.0
EVENT_BATCH = 2_000

PARTITION_HEALTH_QUERY = """
query PartitionHealthQuery($assetKey: AssetKeyInput!) {
  assetNodeOrError(assetKey: $assetKey) {
    ... on AssetNode {
      id
      partitionKeysByDimension { name type partitionKeys }
      assetPartitionStatuses {
        ... on TimePartitionStatuses { ranges { status startTime endTime startKey endKey } }
        ... on DefaultPartitionStatuses { materializedPartitions materializingPartitions failedPartitions }
        ... on MultiPartitionStatuses {
          primaryDimensionName
          ranges {
            primaryDimStartKey primaryDimEndKey primaryDimStartTime primaryDimEndTime
            secondaryDim {
              ... on TimePartitionStatuses { ranges { status startTime endTime startKey endKey } }
              ... on DefaultPartitionStatuses { materializedPartitions materializingPartitions failedPartitions }
            }
          }
        }
      }
    }
  }
}"""

ASSET_GRAPH_LIVE_QUERY = """
query AssetGraphLiveQuery($assetKeys: [AssetKeyInput!]!) {
  assetNodes(assetKeys: $assetKeys, loadMaterializations: true) { id ...AssetNodeLiveFragment }
  assetsLatestInfo(assetKeys: $assetKeys) { id ...AssetLatestInfoFragment }
}
fragment AssetLatestInfoFragment on AssetLatestInfo {
  id assetKey { path } unstartedRunIds inProgressRunIds latestRun { id ...AssetLatestInfoRun }
}
fragment AssetLatestInfoRun on Run { status startTime endTime id }
fragment AssetNodeLiveFragment on AssetNode {
  id opNames repository { id } assetKey { path }
  assetMaterializations(limit: 1) { ...AssetNodeLiveMaterialization }
  assetObservations(limit: 1) { ...AssetNodeLiveObservation }
  assetChecksOrError { ... on AssetChecks { checks { ...AssetCheckLiveFragment } } }
  partitionStats { numMaterialized numMaterializing numPartitions numFailed }
}
fragment AssetNodeLiveMaterialization on MaterializationEvent { timestamp runId stepKey }
fragment AssetNodeLiveObservation on ObservationEvent { timestamp runId stepKey }
fragment AssetCheckLiveFragment on AssetCheck {
  name canExecuteIndividually
  executionForLatestMaterialization { id runId status timestamp stepKey evaluation { severity } }
  partitionDefinition { name description }
  partitionStatuses {
    ... on AssetCheckDefaultPartitionStatuses {
      succeededPartitions failedPartitions inProgressPartitions skippedPartitions executionFailedPartitions
    }
    ... on AssetCheckTimePartitionStatuses { ranges { startKey endKey status } }
  }
}"""

ALL_ASSETS = "query { assetNodes { assetKey { path } partitionDefinition { name } } }"


@dataclass
class Timing:
    first_seconds: float
    warm_seconds: float
    response_bytes: int
    cpu_seconds: float = 0.0
    """The webserver process's CPU time for one warm request (median): the wall time on an idle machine,
    less PostgreSQL's share. On a loaded machine the wall time is mostly waiting for a core."""


@dataclass
class Round:
    live_keys: int
    health: dict[str, Timing] = field(default_factory=dict)
    graph: Timing | None = None
    numbers: dict[str, int] = field(default_factory=dict)  # asset -> partitions the graph query reported
    materialized: dict[str, int] = field(default_factory=dict)  # asset -> materialized keys, partitions tab
    after_new_key: dict[str, tuple[float, float]] = field(default_factory=dict)
    """asset -> the partitions tab's first and next request after one more key was added, as the sensor adds
    one per new version: Dagster's status cache is keyed by a hash of every partition key, so a new key
    invalidates it and the next request rebuilds it from the asset's whole materialization history."""

    @property
    def worst(self) -> float:
        values = [t.warm_seconds for t in self.health.values()] + ([self.graph.warm_seconds] if self.graph else [])
        return max(values)

    @property
    def worst_first(self) -> float:
        return max([t.first_seconds for t in self.health.values()] + ([self.graph.first_seconds] if self.graph else []))

    @property
    def worst_after_new_key(self) -> tuple[float, float]:
        return (max(t[0] for t in self.after_new_key.values()), max(t[1] for t in self.after_new_key.values()))

    @property
    def worst_cpu(self) -> float:
        return max([t.cpu_seconds for t in self.health.values()] + ([self.graph.cpu_seconds] if self.graph else []))


@dataclass
class Prune:
    deleted: int
    seconds: float
    select_seconds: float
    keys_left: int
    recorded_left: int
    by_storage: dict[str, tuple[int, float]] = field(default_factory=dict)
    """storage -> (keys deleted, seconds): the prune runs alternate between the project's storage, as a prune
    run has it, and the plain dagster_postgres storage the bench writes through."""


def add_keys(instance, db, keys: list[str], assets: list[list[str]], *, age_seconds: float,
             spread_seconds: float) -> None:
    """Add ``keys`` as the sensor does (Dagster keys + kbindex's record) and materialize each asset for each."""
    from pipelines.partitions import VERSIONS_PARTITIONS_NAME

    for start in range(0, len(keys), EVENT_BATCH):
        batch = keys[start : start + EVENT_BATCH]
        instance.add_dynamic_partitions(VERSIONS_PARTITIONS_NAME, batch)
        materialize(instance, batch, assets)
    db.execute("bench_corpus_record_keys", {"partition_keys": keys, "age_seconds": age_seconds,
                                            "spread_seconds": spread_seconds})


def add_history(instance, keys: list[str], assets: list[list[str]], out=print) -> float:
    """The materializations that pruned keys leave behind (issue #33): each asset materialized once for each
    of ``keys``, which are not (any longer) partition keys: prune_lineage_keys deletes keys, not events.
    Runless events, as ``add_keys`` writes them (no run records or step events). Returns seconds."""
    started = time.perf_counter()
    for start in range(0, len(keys), EVENT_BATCH):
        materialize(instance, keys[start : start + EVENT_BATCH], assets)
        done = min(len(keys), start + EVENT_BATCH)
        if done % 100_000 < EVENT_BATCH or done == len(keys):
            out(f"  history: {done:,} of {len(keys):,} pruned keys' materializations "
                f"({time.perf_counter() - started:.0f} s)")
    return time.perf_counter() - started


def materialize(instance, keys: list[str], assets: list[list[str]]) -> None:
    """One runless ASSET_MATERIALIZATION event per asset and key, written in one batch per asset."""
    import dagster as dg
    from dagster._core.events import (
        DagsterEvent,
        DagsterEventType,
        StepMaterializationData,
    )
    from dagster._core.events.log import EventLogEntry
    from dagster._core.instance.utils import RUNLESS_JOB_NAME, RUNLESS_RUN_ID

    for path in assets:
        events = [
            EventLogEntry(
                user_message="", level=20, job_name=RUNLESS_JOB_NAME, run_id=RUNLESS_RUN_ID, error_info=None,
                timestamp=time.time(), step_key=None,
                dagster_event=DagsterEvent(
                    event_type_value=DagsterEventType.ASSET_MATERIALIZATION.value, job_name=RUNLESS_JOB_NAME,
                    event_specific_data=StepMaterializationData(dg.AssetMaterialization(path, partition=key)),
                ),
            )
            for key in keys
        ]
        instance.event_log_storage.store_event_batch(events)


def webserver_process(ui: DagsterUI):
    for p in ui.dev.children():
        if "dagster_webserver" in " ".join(p.cmdline()):
            return p
    raise RuntimeError("no dagster_webserver process under dagster dev")


def timed(ui: DagsterUI, query: str, variables: dict, repeat: int) -> tuple[Timing, dict]:
    server = webserver_process(ui)

    def cpu() -> float:
        times = server.cpu_times()
        return times.user + times.system

    data, size, first = ui.post(query, variables)
    warm, cpus = [], []
    for _ in range(repeat):
        before = cpu()
        warm.append(ui.post(query, variables)[2])
        cpus.append(cpu() - before)
    return Timing(first, statistics.median(warm) if warm else first, size,
                  statistics.median(cpus) if cpus else 0.0), data


def measure_round(ui: DagsterUI, instance, live: int, partitioned: list[list[str]], every: list[list[str]],
                  repeat: int) -> Round:
    from pipelines.partitions import VERSIONS_PARTITIONS_NAME

    out = Round(live)
    for path in partitioned:
        out.health[path[-1]], data = timed(ui, PARTITION_HEALTH_QUERY, {"assetKey": {"path": path}}, repeat)
        dims = data["assetNodeOrError"]["partitionKeysByDimension"]
        assert len(dims[0]["partitionKeys"]) == live, (path, len(dims[0]["partitionKeys"]), live)
        statuses = data["assetNodeOrError"]["assetPartitionStatuses"]
        out.materialized[path[-1]] = len(statuses.get("materializedPartitions") or [])
    out.graph, data = timed(ui, ASSET_GRAPH_LIVE_QUERY, {"assetKeys": [{"path": p} for p in every]}, repeat)
    for node in data["assetNodes"]:
        if node["partitionStats"]:
            out.numbers[node["assetKey"]["path"][-1]] = node["partitionStats"]["numPartitions"]
    # One more key, as the sensor adds one for each new version, then each partitions tab twice: the
    # first request pays whatever the key change costs, the next shows the cache again. The key goes
    # away after (it is no version of the corpus); the next round's first request pays that change.
    probe = f"probe-{live}"
    instance.add_dynamic_partitions(VERSIONS_PARTITIONS_NAME, [probe])
    for path in partitioned:
        data, _, first = ui.post(PARTITION_HEALTH_QUERY, {"assetKey": {"path": path}})
        assert len(data["assetNodeOrError"]["partitionKeysByDimension"][0]["partitionKeys"]) == live + 1, path
        out.after_new_key[path[-1]] = (first, ui.post(PARTITION_HEALTH_QUERY, {"assetKey": {"path": path}})[2])
    instance.delete_dynamic_partition(VERSIONS_PARTITIONS_NAME, probe)
    return out


PRUNE_PARTS = 4
"""The prune's keys go in this many prune_lineage_keys runs, alternating between the two storages."""


def prune_once(instances: dict, db, kb_url: str, batch: int) -> Prune:
    """Prune ``batch`` keys with the prune_lineage_keys job, in process, against the instance the UI serves, in
    ``PRUNE_PARTS`` runs that alternate between ``instances`` (name -> instance on the same storage).

    Until 871422a one run went through the bench's reader instance only (plain dagster_postgres: a new
    connection per storage call), 9-13 ms a key, where prune runs under dagster dev took ~1 ms."""
    from pipelines.lineage_job import prune_lineage_keys_job
    from pipelines.partitions import VERSIONS_PARTITIONS_NAME
    from resources.dagster_resources import DatabaseResource
    from resources.partition_keys import prunable

    started = time.perf_counter()
    candidates = prunable(db, window_seconds=WINDOW_SECONDS, limit=batch)
    select_seconds = time.perf_counter() - started
    names = list(instances)
    by_storage = {name: (0, 0.0) for name in names}
    for part in range(PRUNE_PARTS):
        name = names[part % len(names)]
        share = batch // PRUNE_PARTS + (1 if part < batch % PRUNE_PARTS else 0)
        config = {"window_seconds": WINDOW_SECONDS, "batch": share}
        started = time.perf_counter()
        result = prune_lineage_keys_job.execute_in_process(
            run_config={"ops": {"prune_partition_keys": {"config": config}}}, instance=instances[name],
            resources={"database": DatabaseResource(url=kb_url)})
        seconds = time.perf_counter() - started
        assert result.success
        (output,) = [e for e in result.all_events if e.event_type_value == "STEP_OUTPUT"]
        deleted = int(output.step_output_data.metadata["partition_keys_deleted"].value)
        keys, total = by_storage[name]
        by_storage[name] = (keys + deleted, total + seconds)
    instance = instances[names[0]]
    left = len(instance.get_dynamic_partitions(VERSIONS_PARTITIONS_NAME))
    recorded = db.fetch_one("bench_corpus_recorded_keys")["keys"]
    assert sum(k for k, _ in by_storage.values()) == len(candidates), (by_storage, len(candidates))
    return Prune(len(candidates), sum(s for _, s in by_storage.values()), select_seconds, left, int(recorded),
                 by_storage)


def run(admin_url: str, workdir: Path, versions: int, live_counts: list[int], prune: int, repeat: int,
        history: int = 0) -> tuple[list[Round], Prune | None]:
    live_counts = sorted(live_counts)
    assert live_counts[-1] + prune + history <= versions, "--versions must cover the live, prunable and history keys"
    db, kb_url, _, ui = open_round(admin_url, workdir, "ui")
    rounds: list[Round] = []
    try:
        print(f"seeding {versions:,} indexed versions ...", flush=True)
        seconds = seed_corpus(db, versions, progress=versions >= 200_000)
        print(f"  {seconds:.0f} s", flush=True)
        instance = ui.open_instance()
        print(f"dagster dev answered in {ui.start():.1f} s", flush=True)
        # Its sensor would prune the keys over the cap (--live-keys above 30,000) in the middle of a round.
        assert ui.stop_sensor("prune_lineage_keys_when_due") == "STOPPED"
        nodes = ui.post(ALL_ASSETS)[0]["assetNodes"]
        every = [n["assetKey"]["path"] for n in nodes]
        partitioned = [n["assetKey"]["path"] for n in nodes if n["partitionDefinition"]]
        if history:  # versions after the prunable ones, before the live ones: indexed, then pruned
            print(f"history: {history:,} pruned keys' materializations of {len(partitioned)} assets ...", flush=True)
            add_history(instance, corpus_keys(db, prune + 1, history), partitioned,
                        out=lambda line: print(line, flush=True))
        added = 0
        for live in live_counts:  # the newest versions hold the live keys, spread over the lineage window
            started = time.perf_counter()
            keys = corpus_keys(db, versions - live + 1, live - added)
            add_keys(instance, db, keys, partitioned, age_seconds=0, spread_seconds=WINDOW_SECONDS * 0.9)
            added = live
            print(f"round: {live:,} live keys ({time.perf_counter() - started:.0f} s to add them and "
                  f"{live * len(partitioned):,} materializations in all) ...", flush=True)
            rounds.append(measure_round(ui, instance, live, partitioned, every, repeat))
            print(f"  slowest warm query {rounds[-1].worst:.2f} s", flush=True)
        pruned = None
        if prune:
            ui.dev.stop()  # nothing of the daemon's must race the measured run
            keys = corpus_keys(db, 1, prune)
            add_keys(instance, db, keys, partitioned, age_seconds=WINDOW_SECONDS + 3600, spread_seconds=3600)
            print(f"prune: {prune:,} keys past the window among {live_counts[-1] + prune:,} ...", flush=True)
            storages = {"kbindex storage": ui.product_instance(), "dagster_postgres": instance}
            pruned = prune_once(storages, db, kb_url, batch=prune)
            assert pruned.keys_left == live_counts[-1], pruned
        return rounds, pruned
    finally:
        db.close()
        ui.stop()


def report(versions: int, rounds: list[Round], pruned: Prune | None) -> bool:
    print(f"\ncorpus: {versions:,} indexed versions; target <= {TARGET_SECONDS:.0f} s per query (warm median)")
    header = f"{'query':<34}" + "".join(f"{f'{r.live_keys:,} keys':>28}" for r in rounds)
    print(header + "\n" + f"{'':<34}" + "".join(f"{'first / warm / cpu s / KB':>28}" for _ in rounds))

    def cell(t: Timing) -> str:
        return (f"{t.first_seconds:.2f} / {t.warm_seconds:.2f} / {t.cpu_seconds:.2f} / "
                f"{t.response_bytes / 1024:,.0f}")

    for asset in rounds[0].health:
        print(f"{'PartitionHealthQuery ' + asset:<34}" + "".join(f"{cell(r.health[asset]):>28}" for r in rounds))
    print(f"{'AssetGraphLiveQuery (all assets)':<34}" + "".join(f"{cell(r.graph):>28}" for r in rounds))
    print(f"{'slowest query, first / warm s':<34}"  # the README's table row
          + "".join(f"{f'{r.worst_first:.2f} / {r.worst:.2f}':>28}" for r in rounds))
    if all(r.after_new_key for r in rounds):
        print(f"{'partitions tab after a new key':<34}" + "".join(f"{'first / next s':>28}" for _ in rounds))
        for asset in rounds[0].after_new_key:
            print(f"{'  ' + asset:<34}" + "".join(f"{'{:.2f} / {:.2f}'.format(*r.after_new_key[asset]):>28}"
                                                  for r in rounds))
        print(f"{'slowest after a new key, first/next':<34}"  # the README's table row
              + "".join(f"{'{:.2f} / {:.2f}'.format(*r.worst_after_new_key):>28}" for r in rounds))
    ok = all(r.worst <= TARGET_SECONDS for r in rounds)
    if len(rounds) >= 2:  # the slowest query is linear in the live keys: where does it cross the target?
        a, b = rounds[0], rounds[-1]
        for label, worst in (("wall", lambda r: r.worst), ("webserver CPU", lambda r: r.worst_cpu)):
            slope = (worst(b) - worst(a)) / max(1, b.live_keys - a.live_keys)
            if slope > 0:
                limit = b.live_keys + (TARGET_SECONDS - worst(b)) / slope
                print(f"slowest query by {label} time reaches {TARGET_SECONDS:.0f} s at about {limit:,.0f} live keys: "
                      f"a churn of {limit / 7:,.0f} new versions/day with the 7-day lineage window (linear fit)")
    print(f"every query <= {TARGET_SECONDS:.0f} s (warm): {'yes' if ok else 'NO'}")
    if pruned is not None:
        per_key = 1000 * pruned.seconds / max(1, pruned.deleted)
        print(f"prune_lineage_keys over {versions:,} versions: {pruned.deleted:,} keys deleted in "
              f"{pruned.seconds:.1f} s ({per_key:.1f} ms/key; selecting them {pruned.select_seconds:.2f} s); "
              f"{pruned.keys_left:,} live keys left")
        for name, (keys, seconds) in pruned.by_storage.items():
            print(f"  through {name + ':':<18} {keys:,} keys in {seconds:.1f} s "
                  f"({1000 * seconds / max(1, keys):.1f} ms/key)")
        print(f"  ({PRUNE_PARTS} runs alternating; kbindex storage: the project's dagster.yaml, as a prune run has it; "
              "dagster_postgres: plain, a new connection per call)")
    return ok


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--versions", type=int, default=1_000_000, help="indexed versions in the corpus")
    parser.add_argument("--live-keys", default="10000,70000", help="comma-separated live partition key counts")
    parser.add_argument("--prune", type=int, default=5000, help="keys past the lineage window to prune once (0: skip)")
    parser.add_argument("--repeat", type=int, default=3, help="warm requests per query after the first")
    parser.add_argument("--history", type=int, default=0,
                        help="pruned keys whose materializations stay in Dagster's event log (issue #33)")
    args = parser.parse_args(argv)
    from resources.local_postgres import temporary_server

    with temporary_server("kbindex-bench-ui-", external_env="KBINDEX_BENCH_DATABASE_URL") as admin_url, \
            tempfile.TemporaryDirectory(prefix="kb-scale-ui-") as tmp:
        rounds, pruned = run(admin_url, Path(tmp), args.versions, [int(k) for k in args.live_keys.split(",")],
                             args.prune, args.repeat, args.history)
        if args.history:
            print(f"\nwith the materializations of {args.history:,} pruned keys in Dagster's event log")
        ok = report(args.versions, rounds, pruned)  # before the clean-up of a 10^6-version database
    return 0 if ok else 1


if __name__ == "__main__":
    raise SystemExit(main())
