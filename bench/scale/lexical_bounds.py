"""``python -m bench.scale.lexical_bounds``: how much would a tighter per-term bound let MaxScore pruning skip?

Usage (on the database a ``python -m bench.scale.search --chunks N --keep`` run seeded; KBINDEX_DATABASE_URL
names its server)::

    python -m bench.scale.lexical_bounds [--tenant t-huge] [--queries 30] [--min-postings 5000]

For each of bench.scale.search's lexical queries (the same generator, so the same questions) that reads at least
``--min-postings`` postings, it reads every posting of the query's terms, scores them with BM25 as the product
does, and models what ``lexical_hits_pruned`` would read (postings walked, plus PROBE_COST per chunk probed by id
when that is cheaper than walking the lazy terms) under four choices of lazy terms and bounds:

- ``product``: the terms ``lazy_terms`` picks, under the bound the statistics keep per term (its largest tf and
  smallest length / tf, migration 0052: both only ever widen, so the bound stays a bound as versions come and go);
- ``idf``: the cheapest run of commonest terms under idf x (k1 + 1) (the product's bound before migration 0052);
- ``stored``: the cheapest run under the kept bound computed from these postings (the statistics' own when no
  version has left);
- ``exact``: the cheapest run under each term's exact largest contribution (no index can keep this one).

It reads postings and times nothing: the figures are postings, the statement's unit of work. A model is not a
clock, so ``--time-ratios 4,1.5,1`` also times the statement the product would run for each of the tenant's
questions with ``lazy_terms`` under each LAZY_RATIO (more terms left lazy, as a looser ratio or a tighter bound
would), interleaved per question, the first pass discarded as warm-up, and checks that the answers agree.

A tighter bound also keeps fewer chunks within reach of the cut for the same lazy terms, which no ratio shows.
``--time-bounds`` times that: the product statement with the kept bounds against the same statement given
idf x (k1 + 1) per term (``candidate_bounds``), each side's lazy terms chosen by ``lazy_terms`` with its bounds.
Before publish kept the bound (d3d4177), this bench computed it from the postings and timed t-huge lexical p95
56.0 -> 42.7 ms; it now reads what the statistics keep.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from collections import defaultdict
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from bench import exit_on_sigterm, server_url
from bench.scale.search import (K, LEXICAL_SEED, PROFILES, QUERY_SEED, SCRATCH, TERM_IDS, bench_database, percentile,
                                query_text, tenant_queries)
from pipelines.domain.lexical import PROBE_COST, LexicalParams, bm25_term, lazy_terms, term_bound
from pipelines.domain.metadata import EVERYTHING
from resources.database import Database
from resources.lexical import hits_query, max_pointer_probes, query_weights
from resources.search import DEFAULT_MAX_SCAN_TUPLES, ef_search_for, hybrid_depth

KINDS = ("product", "idf", "stored", "exact")


@dataclass(frozen=True)
class Cost:
    postings: int  # what the statement reads: walked postings + PROBE_COST x chunks probed
    lazy: int  # how many terms were left to probe
    kept: int  # chunks the walk left within reach of the cut


def modelled_cost(contributions: Mapping[int, Mapping[str, float]], lazy: Sequence[int], bounds: Mapping[int, float],
                  cut: int, probe_cost: int = PROBE_COST) -> Cost | None:
    """What lexical_hits_pruned reads with ``lazy`` probed: the other terms walked, their sums' ``cut``-th best
    (theta), the chunks whose sum plus the lazy terms' bounds still reach theta probed by id when that costs
    less than walking them. None when the bounds reach theta (the statement would walk everything)."""
    walked = [t for t in contributions if t not in lazy]
    partial: dict[str, float] = defaultdict(float)
    for term in walked:
        for chunk, score in contributions[term].items():
            partial[chunk] += score
    ranked = sorted(partial.values(), reverse=True)
    theta = ranked[cut - 1] if len(ranked) >= cut else 0.0
    reach = sum(bounds[t] for t in lazy)
    if lazy and reach >= theta:
        return None
    kept = sum(1 for s in ranked if s + reach >= theta - 1e-6)
    walked_postings = sum(len(contributions[t]) for t in walked)
    lazy_postings = sum(len(contributions[t]) for t in lazy)
    return Cost(walked_postings + min(lazy_postings, probe_cost * kept), len(lazy), kept)


def cheapest(contributions: Mapping[int, Mapping[str, float]], bounds: Mapping[int, float], cut: int) -> Cost:
    """The cheapest run of commonest terms to leave lazy (none at all included)."""
    commonest = sorted(contributions, key=lambda t: (-len(contributions[t]), t))
    costs = [modelled_cost(contributions, commonest[:n], bounds, cut) for n in range(len(commonest))]
    return min((c for c in costs if c is not None), key=lambda c: c.postings)


def bm25_bounds(idfs: Mapping[int, float], postings: Sequence[tuple[int, str, int, int]], avg_length: float,
                params: LexicalParams) -> tuple[dict[int, dict[str, float]], dict[str, dict[int, float]]]:
    """Each term's BM25 contribution per chunk, and each term's bound of each kind but ``product``."""
    k1, b = params.bm25_k1, params.bm25_b
    contributions: dict[int, dict[str, float]] = {t: {} for t in idfs}
    max_tf: dict[int, int] = defaultdict(int)
    min_length_per_tf: dict[int, float] = {}
    for term, chunk, tf, length in postings:
        contributions[term][chunk] = bm25_term(tf, length, avg_length, idfs[term], k1, b)
        max_tf[term] = max(max_tf[term], tf)
        min_length_per_tf[term] = min(min_length_per_tf.get(term, float("inf")), length / tf)
    stored = {t: term_bound(idfs[t], k1, b, avg_length, max_tf[t], min_length_per_tf[t]) if max_tf[t] else 0.0
              for t in idfs}
    bounds = {"idf": {t: idfs[t] * (k1 + 1) for t in idfs}, "stored": stored,
              "exact": {t: max(contributions[t].values(), default=0.0) for t in idfs}}
    return contributions, bounds


def measure(db: Database, tenant: str, queries: int, min_postings: int, out=print) -> dict[str, int]:
    params = LexicalParams.of(db.fetch_one("index_profile_active") or {})
    cut = max_pointer_probes(hybrid_depth(K))  # the walk's cut of the statement time_ratios times (400)
    rng, term_rng = np.random.default_rng(QUERY_SEED), np.random.default_rng(LEXICAL_SEED + 2)
    totals: dict[str, int] = defaultdict(int)
    for query in tenant_queries(db, tenant, queries, rng, term_rng):
        weights = query_weights(db, TERM_IDS, query_text(query), tenant_id=tenant, profile=PROFILES[0])
        if not weights:
            continue
        terms = weights["candidates"]
        idfs = dict(zip(terms, weights["candidate_idfs"]))
        rows = db.fetch_all("bench_search_term_postings", {"tenant_id": tenant, "profile": PROFILES[0], "terms": terms})
        if len(rows) < min_postings:
            continue
        postings = [(r["term"], r["chunk_id"], r["tf"], r["length"]) for r in rows]
        contributions, bounds = bm25_bounds(idfs, postings, weights["avg_length"], params)
        product = hits_query(weights, params, tenant_id=tenant, profile=PROFILES[0], k=K, read=EVERYTHING.params(),
                             query_vector=None, max_probes=cut)
        kept = dict(zip(terms, product["candidate_bounds"]))
        costs = {"product": modelled_cost(contributions, product["lazy_terms"], kept, cut)
                 or modelled_cost(contributions, [], kept, cut)}
        costs.update({kind: cheapest(contributions, bounds[kind], cut) for kind in ("idf", "stored", "exact")})
        totals["queries"] += 1
        totals["walk"] += len(postings)
        for kind, cost in costs.items():
            totals[kind] += cost.postings
        out(f"postings {len(postings):7,} | " + " | ".join(
            f"{kind} lazy {costs[kind].lazy} kept {costs[kind].kept:6,} reads {costs[kind].postings:7,}" for kind in KINDS))
    return dict(totals)


Side = tuple[list[int], dict[str, Any]]
"""How one side runs a question: its lazy terms and the statement parameters it changes."""


def time_sides(db: Database, tenant: str, queries: int, labels: Sequence[str],
               side: Callable[[str, dict[str, Any], dict[int, int], dict[int, float]], Side], out=print,
               ) -> dict[str, list[float]]:
    """ms of the statement lexical_search runs unfiltered (hybrid's depth) for each question on each side
    (``side(label, params, dfs, idfs)``), the order rotating per question; two passes over the questions, the
    first discarded. Raises if two sides' answers differ (a side may only change the work). Prints each side's
    p50 / p95 / mean and its time on the questions whose lazy terms differ between sides."""
    params = LexicalParams.of(db.fetch_one("index_profile_active") or {})
    k = hybrid_depth(K)
    rng, term_rng = np.random.default_rng(QUERY_SEED), np.random.default_rng(LEXICAL_SEED + 2)
    asked = tenant_queries(db, tenant, queries, rng, term_rng)
    times: dict[str, list[float]] = {label: [] for label in labels}
    changed: dict[str, list[float]] = {label: [] for label in labels}  # ms of the questions whose lazy terms differ
    for i, query in enumerate(asked * 2):
        weights = query_weights(db, TERM_IDS, query_text(query), tenant_id=tenant, profile=PROFILES[0])
        if not weights:
            continue
        base = hits_query(weights, params, tenant_id=tenant, profile=PROFILES[0], k=k, read=EVERYTHING.params(),
                          query_vector=query.vector, max_probes=max_pointer_probes(k))
        dfs = dict(zip(weights["candidates"], weights["candidate_dfs"]))
        idfs = dict(zip(weights["candidates"], weights["candidate_idfs"]))
        runs = {label: side(label, base, dfs, idfs) for label in labels}
        answers = {}
        for label in list(labels[i % len(labels):]) + list(labels[:i % len(labels)]):
            lazy, extra = runs[label]
            with db.transaction() as tx:
                tx.fetch_one("search_settings", {"ef_search": ef_search_for(k), "max_scan_tuples": DEFAULT_MAX_SCAN_TUPLES})
                started = time.perf_counter()
                rows = tx.fetch_all("lexical_hits_pruned" if lazy else "lexical_hits", {**base, **extra, "lazy_terms": lazy})
                elapsed = time.perf_counter() - started
            answers[label] = [(row["chunk_id"], round(row["bm25"], 9)) for row in rows]
            if i >= len(asked):
                times[label].append(elapsed * 1000)
        if len({tuple(a) for a in answers.values()}) > 1:
            raise AssertionError(f"the sides' answers differ for question {i % len(asked)}: {answers}")
        if i >= len(asked) and len({tuple(run[0]) for run in runs.values()}) > 1:
            for label in labels:
                changed[label].append(times[label][-1])
    for label in labels:
        v = times[label]
        out(f"{label}: p50 {statistics.median(v):.1f} ms, p95 {percentile(v, 95):.1f}, mean {statistics.mean(v):.2f}"
            f" ({len(v)} questions); the {len(changed[label])} whose lazy terms differ: {sum(changed[label]):.1f} ms in all")
    out("answers equal on every side")
    return times


def time_ratios(db: Database, tenant: str, queries: int, ratios: Sequence[float], out=print) -> dict[str, list[float]]:
    """time_sides with ``lazy_terms`` under each LAZY_RATIO, the kept bounds."""
    k1 = LexicalParams.of(db.fetch_one("index_profile_active") or {}).bm25_k1

    def side(label: str, base: dict[str, Any], dfs: dict[int, int], idfs: dict[int, float]) -> Side:
        bounds = dict(zip(base["candidates"], base["candidate_bounds"]))
        return lazy_terms(dfs, idfs, base["max_probes"], k1, ratio=float(label.split()[-1]), bounds=bounds), {}

    return time_sides(db, tenant, queries, [f"LAZY_RATIO {r:g}" for r in ratios], side, out)


def time_bounds(db: Database, tenant: str, queries: int, out=print) -> dict[str, list[float]]:
    """time_sides with idf x (k1 + 1) per term (the lazy terms chosen with it) against the kept bounds (the
    product's parameters as they are)."""
    k1 = LexicalParams.of(db.fetch_one("index_profile_active") or {}).bm25_k1

    def side(label: str, base: dict[str, Any], dfs: dict[int, int], idfs: dict[int, float]) -> Side:
        if label == "kept bound":
            return base["lazy_terms"], {}
        return (lazy_terms(dfs, idfs, base["max_probes"], k1),
                {"candidate_bounds": [idfs[t] * (k1 + 1) for t in base["candidates"]]})

    return time_sides(db, tenant, queries, ["idf bound", "kept bound"], side, out)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.scale.lexical_bounds", description=__doc__.split("\n")[0])
    parser.add_argument("--tenant", default="t-huge")
    parser.add_argument("--queries", type=int, default=30, help="bench.scale.search's first N questions of the tenant")
    parser.add_argument("--min-postings", type=int, default=5_000, help="model only queries reading at least this many")
    parser.add_argument("--time-ratios", default="", help="also time the statement under these LAZY_RATIOs (e.g. 4,1.5,1)")
    parser.add_argument("--time-bounds", action="store_true",
                        help="also time the statement with idf x (k1 + 1) per term against the kept bound")
    args = parser.parse_args(argv)
    exit_on_sigterm()
    with server_url() as admin_url, bench_database(admin_url, keep=True, seeded=True) as url, \
            Database(url, max_size=1) as db:
        print(f"modelling {args.tenant}'s lexical queries on the {SCRATCH} database (postings read, nothing timed)")
        totals = measure(db, args.tenant, args.queries, args.min_postings)
        if "walk" not in totals:
            print(f"no query of {args.tenant} reads {args.min_postings:,} postings or more")
            return 0
        walk = totals["walk"]
        print(f"postings read over those {totals['queries']} queries: walk {walk:,}; "
              + "; ".join(f"{kind} {totals[kind]:,} ({totals[kind] / walk:.2f})" for kind in KINDS))
        if args.time_ratios:
            print(f"timing all {args.queries} questions of {args.tenant} under LAZY_RATIO {args.time_ratios}")
            time_ratios(db, args.tenant, args.queries, [float(r) for r in args.time_ratios.split(",")])
        if args.time_bounds:
            print(f"timing all {args.queries} questions of {args.tenant}: idf x (k1 + 1) against the kept bound")
            time_bounds(db, args.tenant, args.queries)
    return 0


if __name__ == "__main__":
    sys.exit(main())
