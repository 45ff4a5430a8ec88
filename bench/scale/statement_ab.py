"""``python -m bench.scale.statement_ab``: the product's search paths with named statements as they are in this
checkout beside the same statements at another git revision, interleaved query by query on one seeded database.

Usage (from a git checkout; KBINDEX_DATABASE_URL names a server that outlives the runs)::

    python -m bench.scale.search --chunks 200000 --keep          # once: seeds kbindex_bench_search
    python -m bench.scale.statement_ab --against REV \\
        [--statements lexical_hits_all_pointers,search_hits_exact] [--queries 60] [--tenants t-huge,t-mid]
    python -m bench.scale.statement_ab --against REV --statements lexical_hits_pruned=lexical_hits

For a change to the SQL of a search path: both sides run the same code (bench.scale.search's runners: the dense
settings, filtered dense, permissions, hybrid and lexical) on the same database and questions; only the named
statements' texts differ, swapped in before each call (``sql.queries``), and the side that goes first alternates
per query. Each row prints both sides' p50 / p95 ms and recall@10 against the runner's exact answers, the p95
ratio (this checkout / REV) and how many answers differ; a statement that is the same at REV, or missing there, is refused by name.
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import time
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager

import numpy as np
import psycopg

import sql
from bench import exit_on_sigterm, server_url
from bench.scale.search import (LEXICAL_SEED, MEASURED_TENANTS, MODES, QUERY_SEED, SCRATCH, bench_database,
                                percentile, recall, tenant_queries, tenant_runners)
from resources.database import Database
from resources.local_postgres import with_database

SIDES = ("now", "then")


def statements_at(revision: str, names: list[str]) -> dict[str, str]:
    """The named statements' texts at ``revision``, each changed since (``pick``)."""
    return pick(all_statements_at(revision), names, sql.queries, revision)


def all_statements_at(revision: str) -> dict[str, str]:
    """Every named statement at ``revision`` (``git show`` of each sql/queries file)."""
    listing = subprocess.run(["git", "ls-tree", "--name-only", f"{revision}:sql/queries"], capture_output=True,
                             text=True, check=True, cwd=sql.SQL_DIR.parent).stdout.split()
    found: dict[str, str] = {}
    for name in (f for f in listing if f.endswith(".sql")):
        text = subprocess.run(["git", "show", f"{revision}:sql/queries/{name}"], capture_output=True, text=True,
                              check=True, cwd=sql.SQL_DIR.parent).stdout
        found.update(sql._parse(text, name))
    return found


def pick(then: Mapping[str, str], names: list[str], now: Mapping[str, str], revision: str) -> dict[str, str]:
    """``names`` out of ``then``; refused by name when one is missing there, or has the same text ``now``.
    ``new=old`` takes REV's ``old`` as the baseline of ``new``, a statement added since that stands in
    for it (the same parameters and rows)."""
    pairs = {here: there or here for here, _, there in (n.partition("=") for n in names)}
    missing = [n for n, there in pairs.items() if there not in then or n not in now]
    if missing:
        raise SystemExit(f"not at {revision} or not here: {', '.join(missing)}")
    same = [n for n, there in pairs.items() if then[there] == now[n]]
    if same:
        raise SystemExit(f"the same at {revision} as here: {', '.join(same)}; name statements that changed")
    return {n: then[there] for n, there in pairs.items()}


@contextmanager
def statements(texts: dict[str, str]) -> Iterator[None]:
    """These texts in ``sql.queries`` for the length of the block (every caller looks statements up by name)."""
    before = {n: sql.queries[n] for n in texts}
    sql.queries.update(texts)  # type: ignore[arg-type]
    try:
        yield
    finally:
        sql.queries.update(before)


def measure_tenant(db: Database, tenant: str, queries: int, sides: dict[str, dict[str, str]],
                   out: Callable[[str], None]) -> None:
    questions = tenant_queries(db, tenant, queries, np.random.default_rng(QUERY_SEED),
                               np.random.default_rng(LEXICAL_SEED + 2))
    if not questions:
        return
    runners = tenant_runners(db, tenant, questions, MODES)
    for runner in runners:  # warm the cache for every configuration, both sides
        for side in SIDES:
            with statements(sides[side]):
                for i in range(min(10, len(questions))):
                    runner.run(i)
    for runner in runners:
        samples: dict[str, list[float]] = {side: [] for side in SIDES}
        answers: dict[str, list[list[str]]] = {side: [] for side in SIDES}
        for i in range(len(questions)):
            for side in (SIDES if i % 2 == 0 else SIDES[::-1]):
                with statements(sides[side]):
                    t0 = time.perf_counter()
                    got, _ = runner.run(i)
                    samples[side].append((time.perf_counter() - t0) * 1000)
                answers[side].append(got)
        now, then = samples["now"], samples["then"]
        differ = sum(a != b for a, b in zip(answers["now"], answers["then"]))
        recalls = {side: sum(recall(got, runner.truth[i]) for i, got in enumerate(answers[side])) / len(questions)
                   for side in SIDES}
        out(f"{tenant:<8} {runner.mode:<7} {runner.setting:<18} {runner.scope:<29} "
            f"{statistics.median(then):>8.2f} {percentile(then, 95):>8.2f} {recalls['then']:>6.3f} | "
            f"{statistics.median(now):>8.2f} {percentile(now, 95):>8.2f} {recalls['now']:>6.3f} | "
            f"{percentile(now, 95) / max(1e-9, percentile(then, 95)):>5.2f} {differ:>4}")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.scale.statement_ab", description=__doc__.split("\n")[0])
    parser.add_argument("--against", required=True, help="the git revision whose statements are the baseline")
    parser.add_argument("--statements", default="lexical_hits_all_pointers,search_hits_exact",
                        help="comma-separated statement names to swap; NEW=OLD measures a statement added "
                             "since REV against REV's OLD, which it stands in for")
    parser.add_argument("--queries", type=int, default=60, help="query vectors per tenant")
    parser.add_argument("--tenants", default=",".join(MEASURED_TENANTS), help="comma-separated tenants")
    args = parser.parse_args(argv)

    def out(line: str) -> None:
        print(line, flush=True)

    exit_on_sigterm()
    wanted = args.statements.split(",")
    names = [n.partition("=")[0] for n in wanted]
    sides = {"now": {n: sql.queries[n] for n in names}, "then": statements_at(args.against, wanted)}
    out(f"{', '.join(names)}: this checkout ('now') against {args.against} ('then'), on {SCRATCH}; "
        f"{args.queries} queries per tenant, interleaved")
    out(f"{'tenant':<8} {'mode':<7} {'setting':<18} {'scope':<29} {'then p50':>8} {'p95':>8} {'recall':>6} | "
        f"{'now p50':>8} {'p95':>8} {'recall':>6} | {'ratio':>5} {'diff':>4}")
    with server_url() as admin_url:
        try:
            psycopg.connect(with_database(admin_url, SCRATCH), connect_timeout=10).close()
        except psycopg.OperationalError as exc:
            raise SystemExit(f"no {SCRATCH} database to measure ({type(exc).__name__}): seed one first with "
                             "KBINDEX_DATABASE_URL set, python -m bench.scale.search --chunks 200000 --keep") from exc
        with bench_database(admin_url, True, True) as url, Database(url, max_size=2) as db:
            for tenant in args.tenants.split(","):
                measure_tenant(db, tenant, args.queries, sides, out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
