"""How fast the lineage keys over the window drain with the prune sensor running, as a deployment runs it.

``python -m bench.scale.prune_drain [--old 10000] [--live 1000] [--minutes 15]`` starts a throwaway
PostgreSQL and ``dagster dev`` (daemon included, every sensor at its default) over ``--old + --live``
indexed versions whose keys the claiming sensor would have added: ``--old`` finished past the 7-day lineage
window, ``--live`` inside it. It then follows the recorded keys every few seconds until only the live ones
are left or ``--minutes`` pass, and prints each prune_lineage_keys run (when it started after dagster dev
answered, how long it took) and the drain rate. The sensor looks every 10 minutes and a run deletes up to
5,000 keys, so 10,000 old keys take two runs ten minutes apart. What a model migration adds is in the
README (bench.scale.migration). The CI-sized round is tests/acceptance/test_bench_prune_drain.py.
"""

from __future__ import annotations

import argparse
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

from bench import exit_on_sigterm
from bench.scale.corpus import corpus_keys, open_round, seed_corpus
from bench.scale.ui import WINDOW_SECONDS, add_keys

PRUNE_JOB = "prune_lineage_keys"


@dataclass
class PruneRun:
    started_after: float  # seconds after dagster dev answered
    seconds: float | None  # None: not finished when the bench stopped
    status: str


@dataclass
class Drain:
    old: int
    live: int
    left: int  # recorded keys at the end
    dagster_left: int  # Dagster's partition keys at the end (counted once: a listing of every key)
    seconds: float  # from dagster dev answering to the last old key gone (or the bench's end)
    runs: list[PruneRun]

    @property
    def drained(self) -> int:
        return self.old + self.live - self.left

    @property
    def keys_per_hour(self) -> float:
        return 3600 * self.drained / max(self.seconds, 1e-9)


def run(admin_url: str, workdir: Path, old: int, live: int, minutes: float, out=print) -> Drain:
    import dagster as dg

    db, _, _, ui = open_round(admin_url, workdir, "drain")
    try:
        seed_corpus(db, old + live)
        instance = ui.open_instance()
        from pipelines.assets import indexing_assets

        paths = [list(key.path) for asset in indexing_assets for key in asset.keys]  # the four per-version assets
        out(f"adding {old:,} keys past the lineage window and {live:,} inside it ...")
        add_keys(instance, db, corpus_keys(db, 1, old), paths, age_seconds=WINDOW_SECONDS + 3600, spread_seconds=3600)
        add_keys(instance, db, corpus_keys(db, old + 1, live), paths, age_seconds=0, spread_seconds=3600)
        ready_seconds = ui.start()
        ready = time.time()
        out(f"dagster dev answered in {ready_seconds:.1f} s; following the keys for up to {minutes:g} min ...")
        deadline = time.monotonic() + minutes * 60
        left = old + live
        while time.monotonic() < deadline:
            ui.dev.check_alive()
            left = int(db.fetch_one("bench_corpus_recorded_keys")["keys"])
            if left <= live:
                break
            out(f"  {time.time() - ready:6.0f} s: {left:,} keys recorded ({left - live:,} past the window)")
            time.sleep(5 if minutes > 2 else 1)
        seconds = time.time() - ready
        runs = []
        for record in reversed(instance.get_run_records(dg.RunsFilter(job_name=PRUNE_JOB))):
            start, end = record.start_time, record.end_time
            runs.append(PruneRun(round(start - ready, 1) if start else float("nan"),
                                 round(end - start, 1) if start and end else None, record.dagster_run.status.value))
        from pipelines.partitions import VERSIONS_PARTITIONS_NAME

        dagster_left = len(instance.get_dynamic_partitions(VERSIONS_PARTITIONS_NAME))
        return Drain(old, live, left, dagster_left, seconds, runs)
    finally:
        db.close()
        ui.stop()


def report(d: Drain) -> None:
    for i, r in enumerate(d.runs, 1):
        took = f"{r.seconds:.1f} s" if r.seconds is not None else "not finished"
        print(f"prune run {i}: started {r.started_after:.0f} s after dagster dev answered, {took}, {r.status}")
    from pipelines.lineage_job import PruneConfig

    batch = PruneConfig.model_fields["batch"].default  # what the sensor's runs delete at most, each
    starts = [r.started_after for r in d.runs]
    if len(starts) >= 2 and d.drained >= batch * (len(starts) - 1):  # full runs: the steady rate
        gaps = [b - a for a, b in zip(starts, starts[1:], strict=False)]
        print(f"runs started {', '.join(f'{g:.0f}' for g in gaps)} s apart: {batch:,} keys per "
              f"{max(gaps):.0f} s is {3600 * batch / max(gaps):,.0f} keys/hour while keys are due")
    print(f"{d.drained:,} of {d.old:,} keys past the window deleted in {d.seconds:.0f} s "
          f"({d.keys_per_hour:,.0f} keys/hour); {d.left:,} keys left ({d.live:,} inside the window; "
          f"{d.dagster_left:,} in Dagster)")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--old", type=int, default=10_000, help="keys past the lineage window")
    parser.add_argument("--live", type=int, default=1_000, help="keys inside it")
    parser.add_argument("--minutes", type=float, default=15.0, help="give up after this long")
    args = parser.parse_args(argv)
    exit_on_sigterm()
    from resources.local_postgres import temporary_server

    with temporary_server("kbindex-bench-drain-", external_env="KBINDEX_BENCH_DATABASE_URL") as admin_url, \
            tempfile.TemporaryDirectory(prefix="kb-prune-drain-") as tmp:
        drain = run(admin_url, Path(tmp), args.old, args.live, args.minutes,
                    out=lambda line: print(line, flush=True))
    report(drain)
    return 0 if drain.left == drain.live else 1


if __name__ == "__main__":
    raise SystemExit(main())
