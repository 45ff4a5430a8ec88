"""``python -m bench.scale.search``: filtered dense search at enterprise size, latency and recall vs exact.

Usage (from the checkout)::

    python -m bench.scale.search [--chunks 1000000] [--queries 100] [--m 24] [--ef-construction 100]

Uses KBINDEX_DATABASE_URL if set (a scratch database ``kbindex_bench_search`` is created and dropped
next to it), otherwise its own embedded PostgreSQL under a temporary folder.

Seeding (timed): synthetic unit vectors with cluster structure (documents share topics across
tenants; a document's chunks sit near each other; a superseded version is a near-duplicate of the
current one), five tenants of very different sizes, ~30% of the chunks in superseded versions no
pointer names, and a second profile (a migration a third done) beside the active one. Rows are built
in numpy and streamed as one binary COPY per slice into an unlogged staging table, then turned into
documents, versions, SUCCEEDED tasks, pointers and chunks by set-based INSERTs; the HNSW graph is
built once at the end with the parameters under test.

Measuring: for each tenant and each search setting, the product's own statements in the product's
order (``search_settings``, ``search_hits``, the ``search_hits_exact`` fallback when fewer than k
rows come back, one transaction) for ``--queries`` query vectors near the tenant's current chunks;
p50/p95 of the client-side latency and recall@10 against the exact answer (``search_hits_exact``:
the same filters, exhaustive distance, no index).
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
import psycopg

from bench import server_url
from bench.queue.__main__ import scratch_database
from resources.database import Database
from resources.search import DEFAULT_MAX_SCAN_TUPLES, ef_search_for
from sql import queries

DIM = 384
K = 10
CHUNKS_PER_VERSION = 8
PROFILES = ["minilm-v1", "bench-shadow"]  # index 0 is the active profile (migration 0001)
TENANTS = {"t-huge": 0.55, "t-large": 0.25, "t-mid": 0.145, "t-small": 0.05, "t-tiny": 0.005}
P_TWO_VERSIONS = 0.6  # -> ~30% of all chunks are superseded
P_SHADOW = 1 / 3  # share of documents whose current version is also indexed under the shadow profile
CLUSTERS = 2000
SUPER_TOPICS = 40
DOCS_PER_SLICE = 8000
MEASURED_TENANTS = ("t-huge", "t-mid", "t-small", "t-tiny")


@dataclass(frozen=True)
class Setting:
    """One search configuration: HNSW candidate list, iterative scan mode, scan budget."""

    label: str
    ef_search: int
    iterative_scan: str
    max_scan_tuples: int


def settings_grid() -> list[Setting]:
    """The product default first, then the alternatives side by side."""
    product = Setting("product", ef_search_for(K), "relaxed_order", DEFAULT_MAX_SCAN_TUPLES)
    return [
        product,
        Setting("ef40 relaxed", 40, "relaxed_order", DEFAULT_MAX_SCAN_TUPLES),
        Setting("ef100 relaxed", 100, "relaxed_order", DEFAULT_MAX_SCAN_TUPLES),
        Setting("ef200 relaxed", 200, "relaxed_order", DEFAULT_MAX_SCAN_TUPLES),
        Setting("ef400 relaxed", 400, "relaxed_order", DEFAULT_MAX_SCAN_TUPLES),
        Setting(f"ef{product.ef_search} strict", product.ef_search, "strict_order", DEFAULT_MAX_SCAN_TUPLES),
        Setting(f"ef{product.ef_search} no iter", product.ef_search, "off", DEFAULT_MAX_SCAN_TUPLES),
        Setting(f"ef{product.ef_search} scan 5k", product.ef_search, "relaxed_order", 5_000),
    ]


# ---------------------------------------------------------------- seeding


def doc_layout(chunks: int, rng: np.random.Generator) -> dict[str, np.ndarray]:
    """Per document: tenant, number of versions (1-2), and whether the shadow profile covers it."""
    per_doc = CHUNKS_PER_VERSION * (1 + P_TWO_VERSIONS + P_SHADOW)
    docs = max(len(TENANTS), int(round(chunks / per_doc)))
    shares = np.array(list(TENANTS.values()))
    return {
        "tenant": rng.choice(len(TENANTS), size=docs, p=shares / shares.sum()).astype(np.int16),
        "versions": np.where(rng.random(docs) < P_TWO_VERSIONS, 2, 1).astype(np.int16),
        "shadow": rng.random(docs) < P_SHADOW,
        "cluster": rng.integers(0, CLUSTERS, size=docs),
    }


def _unit(x: np.ndarray) -> np.ndarray:
    return (x / np.linalg.norm(x, axis=-1, keepdims=True)).astype(np.float32)


def _noise(rng: np.random.Generator, shape: tuple[int, ...], scale: float) -> np.ndarray:
    """Gaussian noise whose expected norm is ``scale`` in DIM dimensions."""
    return rng.standard_normal(shape, dtype=np.float32) * np.float32(scale / np.sqrt(DIM))


ROW = np.dtype(
    [
        ("fields", ">i2"),
        ("l_tenant", ">i4"), ("tenant", ">i2"),
        ("l_doc", ">i4"), ("doc", ">i4"),
        ("l_version", ">i4"), ("version", ">i2"),
        ("l_profile", ">i4"), ("profile", ">i2"),
        ("l_ordinal", ">i4"), ("ordinal", ">i2"),
        ("l_vector", ">i4"), ("dim", ">i2"), ("unused", ">i2"), ("vector", ">f4", (DIM,)),
    ]
)
COPY_HEADER = b"PGCOPY\n\xff\r\n\x00" + b"\x00\x00\x00\x00" + b"\x00\x00\x00\x00"
COPY_TRAILER = b"\xff\xff"


def slice_rows(layout: dict[str, np.ndarray], first: int, last: int, centers: np.ndarray,
               rng: np.random.Generator) -> np.ndarray:
    """Binary COPY rows (fixed width, so one numpy record array) for documents ``first..last-1``."""
    n = last - first
    doc_ids = np.arange(first, last)
    tenant, versions = layout["tenant"][first:last], layout["versions"][first:last]
    shadow, cluster = layout["shadow"][first:last], layout["cluster"][first:last]
    o = CHUNKS_PER_VERSION
    doc_center = centers[cluster] + _noise(rng, (n, DIM), 0.7)
    current = _unit(doc_center[:, None, :] + _noise(rng, (n, o, DIM), 0.6))  # (n, o, DIM)
    parts = []  # (doc index within slice, version, profile, vectors (n_sel, o, DIM))
    two = np.flatnonzero(versions == 2)
    parts.append((np.arange(n), versions, 0, current))  # the current version, active profile
    parts.append((two, np.ones(len(two), np.int16), 0, _unit(current[two] + _noise(rng, (len(two), o, DIM), 0.25))))
    sh = np.flatnonzero(shadow)  # another model: same topics, independent placement
    shadow_vecs = _unit(doc_center[sh][:, None, :] + _noise(rng, (len(sh), o, DIM), 0.6))
    parts.append((sh, versions[sh], 1, shadow_vecs))
    total = sum(len(idx) * o for idx, *_ in parts)
    rows = np.zeros(total, dtype=ROW)
    rows["fields"], rows["l_tenant"], rows["l_doc"], rows["l_version"] = 6, 2, 4, 2
    rows["l_profile"], rows["l_ordinal"], rows["l_vector"], rows["dim"] = 2, 2, 4 + 4 * DIM, DIM
    at = 0
    for idx, version, profile, vecs in parts:
        count = len(idx) * o
        block = rows[at : at + count]
        block["tenant"] = np.repeat(tenant[idx], o)
        block["doc"] = np.repeat(doc_ids[idx], o)
        block["version"] = np.repeat(version, o)
        block["profile"] = profile
        block["ordinal"] = np.tile(np.arange(o, dtype=np.int16), len(idx))
        block["vector"] = vecs.reshape(count, DIM)
        at += count
    return rows


def topic_centers(structure: str, rng: np.random.Generator) -> np.ndarray:
    """CLUSTERS topic directions. ``flat``: mutually orthogonal (a worst case: the graph walk has no
    gradient between topics). ``hierarchical``: topics grouped under SUPER_TOPICS broader ones, all
    sharing a common component, as sentence embeddings do (unrelated texts are not orthogonal)."""
    if structure == "flat":
        return _unit(rng.standard_normal((CLUSTERS, DIM), dtype=np.float32))
    common = _unit(rng.standard_normal(DIM, dtype=np.float32))
    broad = _unit(rng.standard_normal((SUPER_TOPICS, DIM), dtype=np.float32))
    topics = broad[np.arange(CLUSTERS) % SUPER_TOPICS] + _noise(rng, (CLUSTERS, DIM), 0.8)
    return _unit(_unit(topics) + np.float32(0.4) * common)


def seed(url: str, chunks: int, m: int, ef_construction: int, workers: int, out: Callable[[str], None],
         rng: np.random.Generator, structure: str = "hierarchical") -> dict[str, float]:
    """Load the synthetic corpus and build the graph; returns the seconds each phase took."""
    timings: dict[str, float] = {}
    layout = doc_layout(chunks, rng)
    centers = topic_centers(structure, rng)
    names = {"tenants": list(TENANTS), "profiles": PROFILES}
    started = time.perf_counter()
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute(queries["bench_search_shadow_profile"])
        conn.execute(queries["bench_search_drop_hnsw"])
        conn.execute(queries["bench_search_stage_create"])
        docs, loaded = len(layout["tenant"]), 0
        with conn.cursor() as cur, cur.copy(queries["bench_search_stage_copy"]) as copy:
            copy.write(COPY_HEADER)
            for first in range(0, docs, DOCS_PER_SLICE):
                rows = slice_rows(layout, first, min(docs, first + DOCS_PER_SLICE), centers, rng)
                copy.write(rows.tobytes())
                loaded += len(rows)
                out(f"  staged {loaded:>9,} chunks ({time.perf_counter() - started:6.1f} s)")
            copy.write(COPY_TRAILER)
        timings["generate + COPY"] = time.perf_counter() - started
        phase = time.perf_counter()
        fills = ("bench_search_fill_documents", "bench_search_fill_versions", "bench_search_fill_tasks",
                 "bench_search_fill_pointers", "bench_search_fill_chunks")
        for name in fills:
            with conn.transaction():
                conn.execute(queries[name], names)
            out(f"  {name.rpartition('_')[2]} filled ({time.perf_counter() - phase:6.1f} s)")
        conn.execute(queries["bench_search_stage_drop"])
        timings["rows from staging"] = time.perf_counter() - phase
        phase = time.perf_counter()
        conn.execute(queries["bench_search_build_settings"], {"maintenance_work_mem": "4GB", "workers": workers})
        build = {"m": int(m), "ef_construction": int(ef_construction)}  # DDL: bound client-side, as literals
        psycopg.ClientCursor(conn).execute(queries["bench_search_build_hnsw"], build)
        timings["HNSW build"] = time.perf_counter() - phase
        out(f"  HNSW built ({timings['HNSW build']:6.1f} s)")
        phase = time.perf_counter()
        conn.execute(queries["bench_search_analyze"])
        timings["ANALYZE"] = time.perf_counter() - phase
    timings["total"] = time.perf_counter() - started
    return timings


# ---------------------------------------------------------------- measuring


def query_vectors(db: Database, tenant: str, count: int, rng: np.random.Generator) -> list[np.ndarray]:
    """Points near random current chunks of the tenant (a question about its content, not a copy of it)."""
    rows = db.fetch_all("bench_search_tenant_queries", {"tenant_id": tenant, "profile": PROFILES[0], "seed": "q",
                                                         "count": count})
    return [_unit(np.asarray(r["embedding"].to_numpy(), np.float32) + _noise(rng, (DIM,), 0.8)) for r in rows]


def product_search(db: Database, vector: np.ndarray, tenant: str, setting: Setting) -> tuple[list[str], bool]:
    """The statements of resources.search.search, in its order, in one transaction; (chunk ids, fell back)."""
    params = {"query": vector, "tenant_id": tenant, "profile": PROFILES[0], "k": K}
    with db.transaction() as tx:
        tx.fetch_one("search_settings", {"ef_search": setting.ef_search, "max_scan_tuples": setting.max_scan_tuples})
        if setting.iterative_scan != "relaxed_order":
            tx.fetch_one("bench_search_iterative_scan", {"mode": setting.iterative_scan})
        rows = tx.fetch_all("search_hits", params)
        fell_back = len(rows) < K
        if fell_back:
            rows = tx.fetch_all("search_hits_exact", params)
    return [r["chunk_id"] for r in rows], fell_back


def exact_search(db: Database, vector: np.ndarray, tenant: str) -> list[str]:
    """Brute force with the same filters: exhaustive distance over the tenant's current chunks."""
    params = {"query": vector, "tenant_id": tenant, "profile": PROFILES[0], "k": K}
    return [r["chunk_id"] for r in db.fetch_all("search_hits_exact", params)]


def plan_uses_hnsw(db: Database, vector: np.ndarray, tenant: str, setting: Setting) -> bool:
    """Whether the planner walks the graph under this setting (small tenants are rightly read exhaustively)."""
    params = {"query": vector, "tenant_id": tenant, "profile": PROFILES[0], "k": K}
    with db.transaction() as tx:
        tx.fetch_one("search_settings", {"ef_search": setting.ef_search, "max_scan_tuples": setting.max_scan_tuples})
        tx.fetch_one("bench_search_iterative_scan", {"mode": setting.iterative_scan})
        plan = tx.conn.execute("EXPLAIN (FORMAT JSON) " + queries["search_hits"], params).fetchone()[0]
    return "chunk_embedding_hnsw_idx" in json.dumps(plan)


def percentile(values: list[float], q: float) -> float:
    return float(np.percentile(np.asarray(values), q))


def measure(url: str, queries_per_tenant: int, out: Callable[[str], None], rng: np.random.Generator) -> list[dict]:
    """One result row per (tenant, setting): p50/p95 ms, recall@10 vs exact, fallback share, plan."""
    results = []
    with Database(url, max_size=2) as db:
        for tenant in MEASURED_TENANTS:
            current = db.fetch_one("bench_search_tenant_current", {"tenant_id": tenant, "profile": PROFILES[0]})
            vectors = query_vectors(db, tenant, queries_per_tenant, rng)
            if not vectors:
                continue
            started = time.perf_counter()
            exact = [exact_search(db, v, tenant) for v in vectors]
            exact_ms = (time.perf_counter() - started) * 1000 / len(vectors)
            grid = settings_grid()
            for setting in grid:  # warm the cache for every setting
                for v in vectors[: min(10, len(vectors))]:
                    product_search(db, v, tenant, setting)
            samples: dict[str, list[tuple[float, float, bool]]] = {s.label: [] for s in grid}
            for i, (v, truth) in enumerate(zip(vectors, exact)):
                # Settings interleaved per query, in a rotating order: load noise and the cost of being
                # the first to touch the query's pages fall on every setting alike.
                for setting in grid[i % len(grid):] + grid[: i % len(grid)]:
                    t0 = time.perf_counter()
                    got, fell_back = product_search(db, v, tenant, setting)
                    recall = len(set(got) & set(truth)) / max(1, min(K, len(truth)))
                    samples[setting.label].append(((time.perf_counter() - t0) * 1000, recall, fell_back))
            for setting in grid:
                latencies = [ms for ms, _, _ in samples[setting.label]]
                recalls = [r for _, r, _ in samples[setting.label]]
                row = {
                    "tenant": tenant, "current_chunks": current["current_chunks"],
                    "plan": "hnsw" if plan_uses_hnsw(db, vectors[0], tenant, setting) else "exact",
                    "setting": setting.label, "p50_ms": statistics.median(latencies),
                    "p95_ms": percentile(latencies, 95), "recall_at_10": float(np.mean(recalls)),
                    "min_recall": float(np.min(recalls)),
                    "fallback_share": sum(f for _, _, f in samples[setting.label]) / len(vectors),
                    "exact_ms": exact_ms,
                }
                results.append(row)
                out(format_row(row))
    return results


HEADER = (f"{'tenant':<8} {'current':>9} {'plan':>5}  {'setting':<18} {'p50 ms':>7} {'p95 ms':>7} "
          f"{'recall@10':>9} {'min':>5} {'fallback':>8} {'exact ms':>8}")


def format_row(r: dict) -> str:
    return (f"{r['tenant']:<8} {r['current_chunks']:>9,} {r['plan']:>5}  {r['setting']:<18} {r['p50_ms']:>7.2f} "
            f"{r['p95_ms']:>7.2f} {r['recall_at_10']:>9.3f} {r['min_recall']:>5.2f} {r['fallback_share']:>8.0%} "
            f"{r['exact_ms']:>8.1f}")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.scale.search", description=__doc__.split("\n")[0])
    parser.add_argument("--chunks", type=int, default=1_000_000)
    parser.add_argument("--queries", type=int, default=100, help="query vectors per tenant")
    parser.add_argument("--m", type=int, default=24, help="HNSW m (links per node); the product uses 24")
    parser.add_argument("--ef-construction", type=int, default=100, help="the product uses 100")
    parser.add_argument("--workers", type=int, default=1, help="parallel maintenance workers for the build")
    parser.add_argument("--structure", choices=("hierarchical", "flat"), default="hierarchical",
                        help="topic layout of the synthetic vectors (flat: orthogonal topics, a worst case)")
    parser.add_argument("--json", dest="json_path", help="also write the results here")
    args = parser.parse_args(argv)

    def out(line: str) -> None:
        print(line, flush=True)

    rng = np.random.default_rng(14)
    with server_url() as admin_url, scratch_database(admin_url, "kbindex_bench_search") as url:
        out(f"seeding {args.chunks:,} chunks ({args.structure} topics, m={args.m}, "
            f"ef_construction={args.ef_construction})")
        timings = seed(url, args.chunks, args.m, args.ef_construction, args.workers, out, rng, args.structure)
        with Database(url, max_size=1) as db:
            sizes = db.fetch_one("bench_search_sizes")
        out("seeding: " + ", ".join(f"{k} {v:.1f} s" for k, v in timings.items()))
        out(f"loaded {sizes['chunks']:,} chunks, {sizes['current_chunks']:,} current "
            f"({1 - sizes['current_chunks'] / sizes['chunks']:.0%} superseded or other profile); "
            f"table {sizes['table_bytes'] / 2**30:.2f} GiB, HNSW {sizes['hnsw_bytes'] / 2**30:.2f} GiB")
        out(HEADER)
        results = measure(url, args.queries, out, rng)
    if args.json_path:
        with open(args.json_path, "w", encoding="utf-8") as fh:
            json.dump({"chunks": args.chunks, "structure": args.structure, "m": args.m, "ef_construction": args.ef_construction,
                       "seeding_s": timings, "sizes": sizes, "results": results}, fh, indent=2)
    product = [r for r in results if r["setting"] == "product"]
    worst_p95 = max(r["p95_ms"] for r in product)
    worst_recall = min(r["recall_at_10"] for r in product)
    out(f"product setting: worst p95 {worst_p95:.1f} ms (target <= 30), worst recall@10 {worst_recall:.3f} "
        f"(target >= 0.95)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
