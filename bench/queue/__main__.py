"""``python -m bench.queue``: claim + complete throughput at several queue depths (see bench/queue/__init__.py)."""

from __future__ import annotations

import argparse
import multiprocessing
import sys
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager

import psycopg
from psycopg import sql as pgsql

from resources.database import Database
from bench import exit_on_sigterm, server_url
from resources.local_postgres import with_database
from resources.migrations import migrate
from resources.task_queue import TaskQueue

LOAD_SLICE = 100_000


@contextmanager
def scratch_database(admin_url: str, name: str) -> Iterator[str]:
    """A fresh migrated database, dropped afterwards."""
    with psycopg.connect(admin_url, autocommit=True) as conn:
        conn.execute(pgsql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(pgsql.Identifier(name)))
        conn.execute(pgsql.SQL("CREATE DATABASE {}").format(pgsql.Identifier(name)))
    url = with_database(admin_url, name)
    try:
        migrate(url)
        yield url
    finally:
        with psycopg.connect(admin_url, autocommit=True) as conn:
            conn.execute(pgsql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(pgsql.Identifier(name)))


def load(url: str, size: int, out: Callable[[str], None]) -> float:
    """Bulk-load ``size`` PENDING tasks in slices; returns seconds taken."""
    started = time.perf_counter()
    with Database(url, max_size=1) as db:
        first = 1
        while first <= size:
            count = min(LOAD_SLICE, size - first + 1)
            where = {"tenant": "bench", "document": "doc", "first": first, "count": count}
            db.execute("task_bench_load_versions", where)
            # Without fresh statistics the foreign-key check of each task row seq-scans the versions.
            db.execute("task_bench_analyze")
            db.execute("task_bench_load_tasks", {**where, "profile": "minilm-v1", "now": None})
            first += count
            out(f"  loaded {first - 1:>9,} / {size:,} tasks ({time.perf_counter() - started:5.1f} s)")
        db.execute("task_bench_vacuum")
    return time.perf_counter() - started


def work(url: str, owner: str, seconds: float, batch: int, complete: str, start: threading.Event | None = None,
         db: Database | None = None) -> int:
    """One worker: claim -> complete -> requeue until the time is up; returns tasks completed.

    The worker keeps one autocommit connection for its loop, as a long-running worker would.
    """
    own = db is None
    db = db or Database(url, min_size=1, max_size=1)
    queue = TaskQueue(db, lease_seconds=60.0)
    done = 0
    try:
        with db.session() as s:
            if start is not None:
                start.wait()
            deadline = time.perf_counter() + seconds
            while time.perf_counter() < deadline:
                claimed = queue.claim(owner, limit=batch, session=s)
                if not claimed:
                    continue
                leases = [c.lease for c in claimed]
                # The requeue is the bench's stand-in for new publishes; it rides in the completing
                # transaction so that its commit is not counted against the queue.
                with s.conn.transaction():
                    if complete == "many":
                        lost = queue.complete_many(leases, session=s)
                    else:
                        lost = []
                        for lease in leases:
                            queue.complete(lease, session=s)
                    s.execute("task_bench_requeue", {"task_ids": [lease.task_id for lease in leases]})
                done += len(leases) - len(lost)
    finally:
        if own:
            db.close()
    return done


def _process_worker(url: str, owner: str, seconds: float, batch: int, complete: str, start, results) -> None:
    results.put(work(url, owner, seconds, batch, complete, start))


def with_sync_commit(url: str, sync_commit: str) -> str:
    """The URL with the workers' ``synchronous_commit`` set (``off`` measures statements, not the disk's fsync)."""
    if sync_commit == "on":
        return url
    return url + ("&" if "?" in url else "?") + f"options=-c%20synchronous_commit%3D{sync_commit}"


def measure(url: str, workers: int, seconds: float, batch: int, complete: str, mode: str) -> float:
    """Run ``workers`` concurrent workers for ``seconds``; returns completed tasks per second."""
    if mode == "processes":
        ctx = multiprocessing.get_context("spawn")
        start, results = ctx.Event(), ctx.Queue()
        procs = [
            ctx.Process(target=_process_worker, args=(url, f"bench-{i}", seconds, batch, complete, start, results))
            for i in range(workers)
        ]
        for p in procs:
            p.start()
        time.sleep(1.5)  # let every process import and connect before the clock starts
        start.set()
        total = sum(results.get(timeout=seconds + 120) for _ in procs)
        for p in procs:
            p.join(30)
        return total / seconds
    counts = [0] * workers
    start_event = threading.Event()
    with Database(url, min_size=workers, max_size=workers) as db:

        def run(i: int) -> None:
            counts[i] = work(url, f"bench-{i}", seconds, batch, complete, start_event, db)

        threads = [threading.Thread(target=run, args=(i,)) for i in range(workers)]
        for t in threads:
            t.start()
        time.sleep(0.3)
        start_event.set()
        for t in threads:
            t.join()
    return sum(counts) / seconds


def run(
    sizes: list[int],
    workers: list[int],
    seconds: float,
    *,
    batch: int = 10,
    complete: str = "many",
    mode: str = "threads",
    sync_commit: str = "on",
    out: Callable[[str], None] = print,
) -> dict[tuple[int, int], float]:
    """Measure every (size, workers) pair; prints progress and the table; returns claims/s by pair."""
    results: dict[tuple[int, int], float] = {}
    with server_url() as admin_url:
        for size in sizes:
            with scratch_database(admin_url, f"kbindex_bench_{size}") as url:
                out(f"size {size:,}: loading")
                took = load(url, size, out)
                out(f"size {size:,}: loaded in {took:.1f} s")
                for w in workers:
                    rate = measure(with_sync_commit(url, sync_commit), w, seconds, batch, complete, mode)
                    results[(size, w)] = rate
                    out(f"size {size:,} workers {w}: {rate:,.0f} claims/s")
    out(table(results, sizes, workers, mode=mode, complete=complete, batch=batch, seconds=seconds,
              synchronous_commit=sync_commit))
    return results


def table(results: dict[tuple[int, int], float], sizes: list[int], workers: list[int], **setup: object) -> str:
    """The size x workers table of claim+complete per second, plus largest/smallest ratios."""
    head = f"{'queued':>10} | " + " | ".join(f"{w} worker{'s' if w > 1 else ''}".rjust(10) for w in workers)
    lines = [
        "claim+complete per second (" + ", ".join(f"{k}={v}" for k, v in setup.items()) + ")",
        head,
        "-" * len(head),
    ]
    for size in sizes:
        lines.append(f"{size:>10,} | " + " | ".join(f"{results[(size, w)]:>10,.0f}" for w in workers))
    if len(sizes) > 1:
        lo, hi = min(sizes), max(sizes)
        ratios = " | ".join(f"{results[(hi, w)] / results[(lo, w)]:>10.2f}" for w in workers)
        lines.append(f"{f'{hi:,}/{lo:,}':>10} | " + ratios)
    return "\n".join(lines)


def _ints(text: str) -> list[int]:
    return [int(part.replace("_", "")) for part in text.split(",") if part.strip()]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.queue", description=__doc__)
    parser.add_argument("--sizes", type=_ints, default=_ints("1000,100000,1000000"))
    parser.add_argument("--workers", type=_ints, default=_ints("1,4,8"))
    parser.add_argument("--seconds", type=float, default=10.0)
    parser.add_argument("--batch", type=int, default=10, help="claim limit per round")
    parser.add_argument("--complete", choices=["many", "one"], default="many",
                        help="complete a round's leases in one statement or one statement each")
    parser.add_argument("--mode", choices=["threads", "processes"], default="threads")
    parser.add_argument("--sync-commit", choices=["on", "off"], default="on",
                        help="synchronous_commit of the workers' sessions (on: every commit waits for fsync)")
    args = parser.parse_args(argv)
    # SIGTERM (e.g. from `timeout`) unwinds like Ctrl-C, so the embedded server is stopped and deleted.
    exit_on_sigterm()
    run(args.sizes, args.workers, args.seconds, batch=args.batch, complete=args.complete, mode=args.mode,
        sync_commit=args.sync_commit, out=lambda line: print(line, flush=True))
    return 0


if __name__ == "__main__":
    sys.exit(main())
