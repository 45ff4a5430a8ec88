"""``python -m bench.scale.vector_placement``: search with chunk vectors out of line (pgvector's STORAGE external,
before migration 0051) beside search with them in their rows (0051's STORAGE main), side by side in one run.

Usage (from the checkout)::

    python -m bench.scale.vector_placement [--chunks 200000] [--text-chars 1000] [--queries 100] [--no-lexical]

Two scratch databases on one server (KBINDEX_DATABASE_URL's, or an embedded one), migrated alike; the first has
the chunk vectors' storage set back to external before seeding. Both get the same corpus from the same seeds
(bench.scale.search's: five tenants, superseded versions, a shadow profile, metadata, allow lists, lexical rows),
with chunk texts of ``--text-chars`` characters (a chunk of 254 word pieces is ~1,100 characters of English), so
the databases differ only in where PostgreSQL keeps the vectors. For each measured tenant the product's search
paths (bench.scale.search's runners: the dense settings, filtered dense, permissions, hybrid and lexical) run
against both, interleaved query by query with the side that goes first alternating, and each row prints both
sides' p50 / p95, the ratio of the p95s (out of line / inline) and both recalls against the exact answers. The
HNSW graphs are built separately (pgvector draws levels at random), so walk answers may differ a little between
the two; the exact paths must return the same chunks, and the report counts any that do not.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time

import numpy as np

from bench import exit_on_sigterm, server_url
from bench.queue.__main__ import scratch_database
from bench.scale.search import (LEXICAL_SEED, MEASURED_TENANTS, QUERY_SEED, Runner, percentile, recall,
                                seed, tenant_queries, tenant_runners)
from resources.database import Database

DATABASES = {"out of line": "kbindex_bench_vectors_out", "inline": "kbindex_bench_vectors_in"}
SEED = 14  # bench.scale.search's corpus seed: both databases are seeded from a fresh generator with it


def placement(db: Database) -> dict:
    """How many chunk vectors sit out of line, the average text length, and the heap and TOAST sizes."""
    return dict(db.fetch_one("bench_search_vector_placement"))


def measure_tenant(dbs: dict[str, Database], tenant: str, queries: int, modes: tuple[str, ...]) -> list[dict]:
    """One row per search configuration: both sides' latencies and recalls over the same questions."""
    first = next(iter(dbs.values()))
    questions = tenant_queries(first, tenant, queries, np.random.default_rng(QUERY_SEED),
                               np.random.default_rng(LEXICAL_SEED + 2))
    if not questions:
        return []
    runners: dict[str, list[Runner]] = {side: tenant_runners(db, tenant, questions, modes) for side, db in dbs.items()}
    sides = list(runners)
    count = len(runners[sides[0]])
    assert all(len(r) == count for r in runners.values()), "both databases must offer the same configurations"
    for side in sides:  # warm each side's cache for every configuration
        for runner in runners[side]:
            for i in range(min(10, len(questions))):
                runner.run(i)
    samples = {side: {j: [] for j in range(count)} for side in sides}
    answers = {side: {j: [] for j in range(count)} for side in sides}
    for i in range(len(questions)):
        for j in list(range(count))[i % count:] + list(range(count))[: i % count]:
            for side in (sides if (i + j) % 2 == 0 else sides[::-1]):
                runner = runners[side][j]
                t0 = time.perf_counter()
                got, _ = runner.run(i)
                samples[side][j].append((time.perf_counter() - t0) * 1000)
                answers[side][j].append((got, recall(got, runner.truth[i])))
    rows = []
    for j in range(count):
        base = runners[sides[0]][j]
        row = {"tenant": tenant, "mode": base.mode, "setting": base.setting, "scope": base.scope,
               "plans": {side: runners[side][j].plan for side in sides}}
        for side in sides:
            latencies = samples[side][j]
            row[side] = {"p50_ms": statistics.median(latencies), "p95_ms": percentile(latencies, 95),
                         "recall_at_10": float(np.mean([r for _, r in answers[side][j]]))}
        exact = base.plan == "exact" or base.mode == "lexical"
        row["answers_differ"] = sum(a != b for (a, _), (b, _) in zip(answers[sides[0]][j], answers[sides[1]][j]))
        row["exact_path"] = exact
        row["p95_ratio"] = row[sides[0]]["p95_ms"] / max(1e-9, row[sides[1]]["p95_ms"])
        rows.append(row)
    return rows


def format_row(r: dict) -> str:
    out, inline = r["out of line"], r["inline"]
    return (f"{r['tenant']:<8} {r['mode']:<7} {r['plans']['inline']:>5} {r['setting']:<18} {r['scope']:<29} "
            f"{out['p50_ms']:>7.2f} {out['p95_ms']:>7.2f} {out['recall_at_10']:>6.3f} | "
            f"{inline['p50_ms']:>7.2f} {inline['p95_ms']:>7.2f} {inline['recall_at_10']:>6.3f} | "
            f"{r['p95_ratio']:>5.2f} {r['answers_differ']:>4}")


HEADER = (f"{'tenant':<8} {'mode':<7} {'plan':>5} {'setting':<18} {'scope':<29} "
          f"{'out p50':>7} {'p95':>7} {'recall':>6} | {'in p50':>7} {'p95':>7} {'recall':>6} | {'ratio':>5} {'diff':>4}")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.scale.vector_placement", description=__doc__.split("\n")[0])
    parser.add_argument("--chunks", type=int, default=200_000)
    parser.add_argument("--text-chars", type=int, default=1000, help="each chunk's text length (0: a short label)")
    parser.add_argument("--queries", type=int, default=100, help="query vectors per tenant")
    parser.add_argument("--lexical", action=argparse.BooleanOptionalAction, default=True,
                        help="also seed the lexical index and measure hybrid and lexical search (default: on)")
    parser.add_argument("--tenants", default=",".join(MEASURED_TENANTS), help="comma-separated tenants to measure")
    parser.add_argument("--json", dest="json_path", help="also write the results here")
    args = parser.parse_args(argv)

    def out(line: str) -> None:
        print(line, flush=True)

    exit_on_sigterm()  # killed with SIGTERM, still drop the scratch databases and stop the server
    modes = ("dense", "hybrid", "lexical") if args.lexical else ("dense",)
    results: list[dict] = []
    layout: dict[str, dict] = {}
    with server_url() as admin_url, scratch_database(admin_url, DATABASES["out of line"]) as out_url, \
            scratch_database(admin_url, DATABASES["inline"]) as in_url:
        urls = {"out of line": out_url, "inline": in_url}
        for side, url in urls.items():
            with Database(url, max_size=1) as db:
                if side == "out of line":
                    db.execute("bench_search_vector_storage_external")
            texts = f"{args.text_chars}-character texts" if args.text_chars else "short-label texts"
            out(f"seeding {args.chunks:,} chunks with {texts}, vectors {side}")
            timings = seed(url, args.chunks, 24, 100, 1, out, np.random.default_rng(SEED),
                           lexical=args.lexical, text_chars=args.text_chars)
            with Database(url, max_size=1) as db:
                layout[side] = placement(db)
            p = layout[side]
            out(f"  {side}: {p['out_of_line']:,} of {p['chunks']:,} vectors out of line, text {p['avg_text_chars']} "
                f"characters on average; heap {p['heap_bytes'] / 2**20:.0f} MiB, TOAST {p['toast_bytes'] / 2**20:.0f} MiB "
                f"(seeded in {timings['total']:.0f} s)")
        out(HEADER)
        with Database(out_url, max_size=2) as out_db, Database(in_url, max_size=2) as in_db:
            dbs = {"out of line": out_db, "inline": in_db}
            for tenant in args.tenants.split(","):
                for row in measure_tenant(dbs, tenant, args.queries, modes):
                    results.append(row)
                    out(format_row(row))
    for line in summary(results):
        out(line)
    if args.json_path:
        with open(args.json_path, "w", encoding="utf-8") as fh:
            json.dump({"chunks": args.chunks, "text_chars": args.text_chars, "placement": layout, "results": results},
                      fh, indent=2, default=str)
    return 0


def summary(results: list[dict]) -> list[str]:
    """The product setting's rows per mode (unfiltered), and how many exact-path answers differed."""
    lines = ["p95 out of line / inline, the product's search, whole tenant:"]
    for r in results:
        if r["setting"] == "product" and r["scope"] == "all":
            lines.append(f"  {r['tenant']:<8} {r['mode']:<7} ({r['plans']['inline']}) {r['out of line']['p95_ms']:7.2f} / "
                         f"{r['inline']['p95_ms']:7.2f} ms = {r['p95_ratio']:.2f}")
    differ = sum(r["answers_differ"] for r in results if r["exact_path"])
    lines.append(f"exact-path answers that differ between the two databases: {differ}")
    return lines


if __name__ == "__main__":
    raise SystemExit(main())
