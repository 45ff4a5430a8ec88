"""Live claim throughput with and without a migration backlog (see __init__ for what and why)."""

from __future__ import annotations

import argparse
import sys
import time

from bench import server_url
from bench.queue.__main__ import load, measure, scratch_database
from resources.database import Database


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.migration_load", description=__doc__)
    parser.add_argument("--live", type=int, default=1000, help="live INDEX tasks kept queued")
    parser.add_argument("--backlog", type=int, default=200_000, help="REINDEX tasks of the shadow profile")
    parser.add_argument("--seconds", type=float, default=5.0)
    parser.add_argument("--workers", type=int, default=1)
    args = parser.parse_args(argv)

    def out(line: str) -> None:
        print(line, file=sys.stderr, flush=True)

    with server_url() as admin, scratch_database(admin, "bench_migration") as url:
        load(url, args.live, out)
        before = measure(url, args.workers, args.seconds, 10, "many", "threads")
        started = time.perf_counter()
        with Database(url, max_size=1) as db:
            db.execute("bench_shadow_profile")
            first = args.live + 1
            while first <= args.live + args.backlog:
                count = min(100_000, args.live + args.backlog - first + 1)
                db.execute("task_bench_load_versions", {"tenant": "bench", "document": "doc", "first": first, "count": count})
                db.execute("task_bench_analyze")
                db.execute("bench_reindex_backlog", {"first": first})
                first += count
                out(f"  backlog {first - args.live - 1:>9,} / {args.backlog:,} REINDEX tasks")
            db.execute("task_bench_vacuum")
        out(f"  backlog loaded in {time.perf_counter() - started:.1f} s")
        after = measure(url, args.workers, args.seconds, 10, "many", "threads")
    print(f"live INDEX tasks queued:            {args.live:,}")
    print(f"REINDEX backlog (shadow profile):   {args.backlog:,}")
    print(f"live claim+complete/s, no backlog:  {before:,.0f}")
    print(f"live claim+complete/s, with backlog:{after:,.0f}")
    print(f"ratio with/without:                 {after / before:.2f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
