"""What one claiming tick and one indexing run cost on the Dagster side, as the partition key set grows.

``python -m bench.scale.runs [--keys 1000,100000] [--versions 30] [--repeats 3] [--warmup 1] [--seed 0]``
starts a throwaway PostgreSQL, a Dagster instance stored in it (as in production), and for each key count:
adds that many dynamic partition keys (older versions of a large corpus), publishes ``--versions`` fresh
documents, runs one claiming-sensor tick and then the run it requested in process (fake embedder: this
measures the Dagster and kbindex overhead, not the model). Each round is on fresh databases.

``--warmup`` rounds at the smallest key count run first and are discarded (imports, first connections,
Dagster's first instance: the first round of a process paid them, and it was the 1k baseline). Then each
key count runs ``--repeats`` times in a shuffled order (``--seed``), so neither size always runs first or
on a warmer process. It prints every sample, and per key count the median, min and max of the tick and run
seconds and the ratio of medians to the smallest key count. A flat ratio (~1.0) is the target: nothing per
tick or per run may grow with the corpus (issue #14); a ratio inside the spread of the samples is noise.
Runs are in process (``dg.materialize``), not launched by a daemon: ``--daemon [--batches 5]`` measures
daemon-created, daemon-launched runs instead (bench/scale/runs_daemon.py). The small-size round runs in the
suite (tests/integration/test_bench_scale_runs.py).
"""

from __future__ import annotations

import argparse
import os
import random
import statistics
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path


ADD_BATCH = 10_000


@dataclass
class Round:
    keys: int
    seed_seconds: float
    tick_seconds: float
    run_seconds: float
    succeeded: int


def seed_partition_keys(instance, keys: int) -> float:
    """Add ``keys`` partition keys (the older versions of a large corpus) to Dagster's storage; returns seconds."""
    from pipelines.partitions import VERSIONS_PARTITIONS_NAME

    started = time.perf_counter()
    for start in range(0, keys, ADD_BATCH):
        batch = [f"old/doc-{i}/v1" for i in range(start, min(keys, start + ADD_BATCH))]
        instance.add_dynamic_partitions(VERSIONS_PARTITIONS_NAME, batch)
    return time.perf_counter() - started


def measure(admin_url: str, keys: int, versions: int, workdir: Path, tag: str = "") -> Round:
    """One round on fresh databases: ``keys`` existing partition keys, ``versions`` fresh publishes; ``tag``
    tells repeated rounds' databases and folders apart."""
    import dagster as dg

    from bench import fresh_fake_model_databases
    from pipelines import sensors
    from pipelines.assets import indexing_assets
    from pipelines.partitions import VERSIONS_PARTITIONS_NAME
    from resources.blob_store import BlobStore
    from resources.dagster_resources import DatabaseResource, default_resources
    from resources.database import Database
    from resources.publisher import Publisher

    kb_url, dagster_url = fresh_fake_model_databases(admin_url, f"kb_{keys}{tag}", f"dg_{keys}{tag}", workdir,
                                                     f"{keys}{tag}")
    overrides = {"storage": {"postgres": {"postgres_url": dagster_url}}}
    with dg.instance_for_test(overrides=overrides) as instance:
        seed_seconds = seed_partition_keys(instance, keys)
        db = Database(kb_url)
        try:
            publisher = Publisher(db, BlobStore(os.environ["KBINDEX_BLOB_URL"]))
            for i in range(versions):
                body = "\n\n".join(f"Doc {i} paragraph {p}: refunds, travel and invoices." for p in range(6))
                publisher.publish("acme", f"fresh-{i}.txt", body.encode(), f"fresh-{i}.txt")
            started = time.perf_counter()
            with dg.build_sensor_context(instance=instance,
                                         resources={"database": DatabaseResource(url=kb_url)}) as ctx:
                result = sensors.claim_index_tasks(ctx)
            for request in result.dynamic_partitions_requests:
                instance.add_dynamic_partitions(VERSIONS_PARTITIONS_NAME, list(request.partition_keys))
            tick_seconds = time.perf_counter() - started
            started = time.perf_counter()
            for request in result.run_requests:
                dg.materialize(indexing_assets, resources=default_resources(), instance=instance,
                               tags=dict(request.tags), partition_key=request.partition_key, raise_on_error=False)
            run_seconds = time.perf_counter() - started
            succeeded = db.fetch_one("task_stats", {"now": None})["succeeded"]
        finally:
            db.close()
    return Round(keys, seed_seconds, tick_seconds, run_seconds, int(succeeded))


def schedule(counts: list[int], repeats: int, warmup: int, seed: int) -> list[tuple[str, int]]:
    """(label, keys) of every round in the order run: the warm-up rounds at the smallest count, then each
    count ``repeats`` times, shuffled."""
    measured = [(f"r{rep}", keys) for keys in counts for rep in range(repeats)]
    random.Random(seed).shuffle(measured)
    return [(f"w{i}", min(counts)) for i in range(warmup)] + measured


def summary(rounds: list[tuple[str, Round]], counts: list[int]) -> list[str]:
    """Every sample, then per key count the median [min..max] of tick and run seconds and the ratio of medians
    to the smallest count's; warm-up rounds (labels starting with w) are listed but not counted."""
    lines = [f"{'round':>6} {'keys':>10} {'seed s':>8} {'tick s':>8} {'run s':>8} {'ok':>4}"]
    for label, r in rounds:
        lines.append(f"{label:>6} {r.keys:>10,} {r.seed_seconds:>8.2f} {r.tick_seconds:>8.2f} {r.run_seconds:>8.2f} "
                     f"{r.succeeded:>4}{'  (warm-up, not counted)' if label.startswith('w') else ''}")
    measured = [r for label, r in rounds if not label.startswith("w")]
    by_keys = {k: [r for r in measured if r.keys == k] for k in counts}
    base = min(counts)
    med = {k: (statistics.median(r.tick_seconds for r in rs), statistics.median(r.run_seconds for r in rs))
           for k, rs in by_keys.items() if rs}
    lines.append(f"\n{'keys':>10} {'n':>2} {'tick s median [min..max]':>26} {'run s median [min..max]':>26} "
                 f"{'tick x':>7} {'run x':>7}")
    for k, rs in by_keys.items():
        if not rs:
            continue
        ticks, runs = [r.tick_seconds for r in rs], [r.run_seconds for r in rs]
        lines.append(f"{k:>10,} {len(rs):>2} {med[k][0]:>8.2f} [{min(ticks):5.2f}..{max(ticks):5.2f}]    "
                     f"{med[k][1]:>8.2f} [{min(runs):5.2f}..{max(runs):5.2f}]    "
                     f"{med[k][0] / med[base][0]:>7.2f} {med[k][1] / med[base][1]:>7.2f}")
    return lines


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--keys", default="1000,100000", help="comma-separated existing partition key counts")
    parser.add_argument("--versions", type=int, default=30, help="fresh versions per round (one tick, its runs)")
    parser.add_argument("--repeats", type=int, default=3, help="measured rounds per key count")
    parser.add_argument("--warmup", type=int, default=1, help="discarded rounds at the smallest key count, first")
    parser.add_argument("--seed", type=int, default=0, help="seed of the shuffled round order")
    parser.add_argument("--daemon", action="store_true",
                        help="runs created and launched by a real dagster dev's daemon (bench/scale/runs_daemon.py)")
    parser.add_argument("--batches", type=int, default=5, help="--daemon: measured batches per key count")
    parser.add_argument("--claim-grace", type=float, default=1.0,
                        help="--daemon: KBINDEX_CLAIM_WAKE_GRACE_SECONDS, so one tick claims a whole batch")
    parser.add_argument("--timeout", type=float, default=300.0, help="--daemon: seconds a batch may take at most")
    args = parser.parse_args(argv)
    counts = [int(k) for k in args.keys.split(",")]
    if args.daemon:
        from bench.scale.runs_daemon import main_daemon

        return main_daemon(counts, args.versions, args.batches, args.warmup, args.seed, args.claim_grace, args.timeout)
    from resources.local_postgres import temporary_server

    plan = schedule(counts, args.repeats, args.warmup, args.seed)
    print("order: " + ", ".join(f"{label}:{keys:,}" for label, keys in plan), flush=True)
    rounds: list[tuple[str, Round]] = []
    with temporary_server("kbindex-bench-scale-", external_env="KBINDEX_BENCH_DATABASE_URL") as admin_url, \
            tempfile.TemporaryDirectory(prefix="kb-scale-") as tmp:
        for label, keys in plan:
            print(f"round {label}: {keys:,} existing keys ...", flush=True)
            rounds.append((label, measure(admin_url, keys, args.versions, Path(tmp), tag=f"_{label}")))
    print("\n".join(summary(rounds, counts)))
    return 0 if all(r.succeeded == args.versions for _, r in rounds) else 1


if __name__ == "__main__":
    raise SystemExit(main())
