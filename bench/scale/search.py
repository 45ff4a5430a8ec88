"""``python -m bench.scale.search``: filtered dense, hybrid and lexical search at enterprise size, latency and
recall vs exact, side by side in one run.

Usage (from the checkout)::

    python -m bench.scale.search [--chunks 1000000] [--queries 100] [--m 24] [--ef-construction 100]
                                 [--no-lexical] [--modes dense] [--keep | --seeded]
                                 [--permission-rounds 5]

Uses KBINDEX_DATABASE_URL if set (a scratch database ``kbindex_bench_search`` is created and dropped
next to it), otherwise its own embedded PostgreSQL under a temporary folder.

Seeding (timed): synthetic unit vectors with cluster structure (documents share topics across
tenants; a document's chunks sit near each other; a superseded version is a near-duplicate of the
current one), five tenants of very different sizes, ~30% of the chunks in superseded versions no
pointer names, and a second profile (a migration a third done) beside the active one. Rows are built
in numpy and streamed as one binary COPY per slice into an unlogged staging table, then turned into
documents, versions, SUCCEEDED tasks, pointers and chunks by set-based INSERTs; the HNSW graph is
built once at the end with the parameters under test.

Lexical rows (unless ``--no-lexical``): each chunk gets 40-90 synthetic tokens, half from a Zipf-like
vocabulary of VOCABULARY term ids and half from its document's topic (TOPIC_TERMS ids of its cluster,
Zipf-weighted), i.e. ~45 distinct terms with their tfs. They are streamed as a second binary COPY (one
row per posting, separate generator seed, so the vectors are the same with or without them), then
turned into lexical_chunk, lexical_posting, the per-document ledger lexical_document and the
per-tenant statistics lexical_term_stats exactly as the publish path leaves them (statistics count only
the versions a pointer names; term -1 = chunks, -2 = total length).

Metadata and allow lists (their own generator, META_SEED): every document has ``dept`` legal (1%), hr (10%)
or eng, an ``effective`` date uniform over 2020-2026 (``effective>=RANGE_FROM`` keeps the last 10%), and 20%
of documents are restricted to group:finance (the rest have no allow list); every version of a document
alike, the pointer carrying its version's, as publish leaves them.

Measuring: for each tenant and each search setting, the product's own statements in the product's
order (``search_settings``, ``search_hits``, the ``search_hits_exact`` fallback when fewer than k
rows come back, one transaction) for ``--queries`` query vectors near the tenant's current chunks;
p50/p95 of the client-side latency and recall@10 against the exact answer (``search_hits_exact``:
the same filters, exhaustive distance, no index).

Filtered and permissions, beside those and interleaved with them: the product's dense path under each of
FILTERS (an operator's search with ``--filter``; "product": ``search_hits_scoped`` first, as resources.search does
for a scope's first search; "product, again": a scope the probe found too wide is walked at once by the next
queries, as resources.search does for WIDE_SCOPE_SECONDS; "walk only": the graph walk and its fallback without
the probe), recall@10 against ``search_hits_exact`` with the
same filter, and the share of the tenant each filter keeps; hybrid under HYBRID_FILTERS against the exact
fusion over the chunks in scope; dense and hybrid as group:finance (permissions on: it may read every
document, so the answers and exact references are the unfiltered ones) beside EVERYTHING (off).

Hybrid and lexical (with lexical rows): the product's code after embedding and tokenizing, i.e.
``query_weights`` (``lexical_stats_get``, the postings budget) fed the synthetic query's term ids through
a tokenizer stand-in, then ``resources.search._hybrid_rows`` (dense depth + ``lexical_hits`` +
``lexical_scores_of``, fused) or ``search_settings`` + ``lexical_search``. A query's terms are 3-8 of the
terms of the chunk its vector sits near. Recall@10 is against ``bench_search_fused_exact`` (the same
fusion over every current chunk of the tenant, exhaustive cosine): "exact" with the product's scoring
terms (what the candidate shortcuts cost), "all terms" with every query term (what the postings budget
costs as well). Lexical's "exact" is 1 by construction (its postings are complete), so only "all terms"
is informative there.
"""

from __future__ import annotations

import argparse
import json
import re
import statistics
import sys
import time
from collections.abc import Callable, Iterator
from contextlib import ExitStack, contextmanager
from functools import partial
from dataclasses import dataclass, replace

import numpy as np
import psycopg
from psycopg import sql as pgsql

from bench import exit_on_sigterm, server_url
from bench.queue.__main__ import scratch_database
from resources.local_postgres import with_database
from resources.migrations import migrate
from pipelines.domain.lexical import LexicalParams, idf, term_counts
from resources.database import Database
from resources.lexical import N_CHUNKS, TOTAL_LENGTH, lexical_search, query_weights
from pipelines.domain.metadata import EVERYTHING, ReadScope
from resources.search import (DEFAULT_MAX_SCAN_TUPLES, EXACT_SCOPE_CHUNKS, EXACT_SCOPE_POINTERS, WideScopes,
                              _hybrid_rows, ef_search_for, hybrid_depth, scope_key, walk_preferred, walk_rows)
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
VOCABULARY = 30_000  # term ids 1..VOCABULARY, id order = global frequency order (Zipf, s = 1)
TOPIC_TERMS = 40  # per topic cluster, drawn from below the head of the vocabulary
TOKENS_PER_CHUNK = (40, 90)  # -> ~45 distinct terms per chunk (23-75)
P_TOPIC_TOKEN = 0.5
QUERY_TERMS = (3, 8)
LEXICAL_SEED = 1414
LEXICAL_BLOCK = 16_384  # chunks per generation step (bounds the token matrices' memory)
QUERY_SEED = 15  # the query vectors' noise
META_SEED = 3030  # metadata and allow lists: their own generator, so vectors and terms do not depend on them
DEPTS = {"legal": 0.01, "hr": 0.10}  # share of documents per dept value; the rest are "eng"
EFFECTIVE_FROM, EFFECTIVE_DAYS = np.datetime64("2020-01-01"), 2557  # effective dates: uniform over 2020-2026
RANGE_FROM = str(EFFECTIVE_FROM + int(EFFECTIVE_DAYS * 0.9))  # effective>= this keeps the last ~10%
RESTRICTED_SHARE, RESTRICTED_TO = 0.2, "group:finance"  # the rest have no allow list (the whole tenant)
FILTERS = {  # label -> --filter expressions; the product's dense (and hybrid) search under each, as an operator
    "dept=legal (1%)": ("dept=legal",),
    "dept=hr (10%)": ("dept=hr",),
    f"effective>={RANGE_FROM} (10%)": (f"effective>={RANGE_FROM}",),
}
HYBRID_FILTERS = ("dept=legal (1%)", "dept=hr (10%)")
MODES = ("dense", "hybrid", "lexical")
PERMISSIONS = ReadScope.of([RESTRICTED_TO])  # may read every document: the same answers as EVERYTHING, checked


def pseudo_prose(words: int = 2000, length: int = 400_000, seed: int = 7) -> str:
    """Text of ``length`` characters: ``words`` random pseudo-words in random order, about as compressible as
    English prose. Chunk texts of ``--text-chars`` are windows of it."""
    rng = np.random.default_rng(seed)
    vocabulary = ["".join(rng.choice(list("etaoinshrdlucmfwypvbgk"), size=int(n)))
                  for n in rng.integers(2, 10, size=words)]
    return " ".join(vocabulary[i] for i in rng.integers(0, words, size=length // 5))[:length]


@dataclass(frozen=True)
class Setting:
    """One search configuration: HNSW candidate list, iterative scan mode, scan budget."""

    label: str
    ef_search: int
    iterative_scan: str
    max_scan_tuples: int
    scoped: bool = True
    """Whether a filtered search may answer exhaustively over a narrow scope (``search_hits_scoped``)."""
    walk_rule: bool = True
    """Whether an unfiltered search may force the graph walk for a big enough tenant (resources.search.WALK_MIN_SHARE);
    False: the planner's own choice, as before that rule."""
    remember_wide: bool = False
    """Whether a filtered scope the probe found too wide is walked at once by the next queries (resources.search
    WIDE_SCOPES, as the product does for WIDE_SCOPE_SECONDS); False: every query probes, as a scope's first does."""


WIDE = WideScopes(seconds=24 * 3600.0)  # the bench's memory of wide scopes: the run's length, not the product's 60 s


def settings_grid() -> list[Setting]:
    """The product default first, then the alternatives side by side."""
    product = Setting("product", ef_search_for(K), "relaxed_order", DEFAULT_MAX_SCAN_TUPLES)
    return [
        product,
        Setting("ef40 relaxed", 40, "relaxed_order", DEFAULT_MAX_SCAN_TUPLES),
        Setting("ef100 relaxed", 100, "relaxed_order", DEFAULT_MAX_SCAN_TUPLES),
        Setting("ef200 relaxed", 200, "relaxed_order", DEFAULT_MAX_SCAN_TUPLES),
        Setting("ef400 relaxed", 400, "relaxed_order", DEFAULT_MAX_SCAN_TUPLES),
        replace(product, label="planner alone", walk_rule=False),
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


def doc_metadata(docs: int, rng: np.random.Generator) -> dict[str, list]:
    """Per document, independent of tenant and topic: dept (legal 1%, hr 10%, else eng), an effective date
    uniform over EFFECTIVE_DAYS, and whether it is restricted to RESTRICTED_TO (RESTRICTED_SHARE of them)."""
    u = rng.random(docs)
    legal, hr = DEPTS["legal"], DEPTS["legal"] + DEPTS["hr"]
    depts = np.where(u < legal, "legal", np.where(u < hr, "hr", "eng"))
    effective = (EFFECTIVE_FROM + rng.integers(0, EFFECTIVE_DAYS, size=docs)).astype(str)
    return {"docs": list(range(docs)), "depts": depts.tolist(), "effectives": effective.tolist(),
            "restricted": (rng.random(docs) < RESTRICTED_SHARE).tolist(), "restricted_to": [RESTRICTED_TO]}


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


@dataclass(frozen=True)
class TermModel:
    """The synthetic vocabulary: global Zipf frequencies, and each topic cluster's own Zipf-weighted terms."""

    global_cdf: np.ndarray
    topic_terms: np.ndarray  # (CLUSTERS, TOPIC_TERMS) term ids
    topic_cdf: np.ndarray

    @classmethod
    def draw(cls, rng: np.random.Generator) -> TermModel:
        weights = 1.0 / np.arange(1, VOCABULARY + 1)
        topic = 1.0 / np.arange(1, TOPIC_TERMS + 1) ** 0.8
        return cls(np.cumsum(weights) / weights.sum(),
                   rng.integers(200, VOCABULARY, size=(CLUSTERS, TOPIC_TERMS)) + 1,
                   np.cumsum(topic) / topic.sum())

    def chunk_terms(self, clusters: np.ndarray, rng: np.random.Generator) -> tuple[np.ndarray, ...]:
        """(chunk index, term, tf) of each distinct term of chunks of these clusters, sorted by chunk, term."""
        n, most = len(clusters), TOKENS_PER_CHUNK[1]
        length = rng.integers(TOKENS_PER_CHUNK[0], most + 1, size=n)
        common = np.searchsorted(self.global_cdf, rng.random((n, most))) + 1
        topical = self.topic_terms[clusters[:, None], np.searchsorted(self.topic_cdf, rng.random((n, most)))]
        tokens = np.where(rng.random((n, most)) < P_TOPIC_TOKEN, topical, common)
        used = np.arange(most) < length[:, None]
        chunk = np.broadcast_to(np.arange(n)[:, None], (n, most))[used]
        keys, tf = np.unique(chunk.astype(np.int64) * (1 << 15) + tokens[used], return_counts=True)
        return keys >> 15, keys & ((1 << 15) - 1), tf


LEX_ROW = np.dtype(
    [
        ("fields", ">i2"),
        ("l_tenant", ">i4"), ("tenant", ">i2"),
        ("l_doc", ">i4"), ("doc", ">i4"),
        ("l_version", ">i4"), ("version", ">i2"),
        ("l_profile", ">i4"), ("profile", ">i2"),
        ("l_ordinal", ">i4"), ("ordinal", ">i2"),
        ("l_term", ">i4"), ("term", ">i4"),
        ("l_tf", ">i4"), ("tf", ">i2"),
    ]
)


def lexical_slice_rows(chunk_rows: np.ndarray, clusters: np.ndarray, model: TermModel,
                       rng: np.random.Generator) -> np.ndarray:
    """Binary COPY rows of the postings (one per distinct term) of staged chunk rows of these clusters."""
    parts = []
    for start in range(0, len(chunk_rows), LEXICAL_BLOCK):
        block = chunk_rows[start : start + LEXICAL_BLOCK]
        chunk, term, tf = model.chunk_terms(clusters[start : start + LEXICAL_BLOCK], rng)
        rows = np.zeros(len(term), dtype=LEX_ROW)
        rows["fields"], rows["l_tenant"], rows["l_doc"], rows["l_version"] = 7, 2, 4, 2
        rows["l_profile"], rows["l_ordinal"], rows["l_term"], rows["l_tf"] = 2, 2, 4, 2
        for key in ("tenant", "doc", "version", "profile", "ordinal"):
            rows[key] = block[key][chunk]
        rows["term"], rows["tf"] = term, tf
        parts.append(rows)
    # concatenate returns native byte order: cast back to COPY's big-endian layout
    return np.concatenate(parts).astype(LEX_ROW, copy=False) if parts else np.zeros(0, dtype=LEX_ROW)


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
         rng: np.random.Generator, structure: str = "hierarchical", lexical: bool = True,
         text_chars: int = 0) -> dict[str, float]:
    """Load the synthetic corpus (with its lexical index unless ``lexical`` is false) and build the graph;
    returns the seconds each phase took. ``text_chars``: each chunk's text length (0: a short label; the
    lexical rows are synthetic either way)."""
    timings: dict[str, float] = {}
    layout = doc_layout(chunks, rng)
    centers = topic_centers(structure, rng)
    terms = TermModel.draw(np.random.default_rng(LEXICAL_SEED)) if lexical else None
    term_rng = np.random.default_rng(LEXICAL_SEED + 1)
    prose = pseudo_prose().encode("ascii") if text_chars else b""
    names = {"tenants": list(TENANTS), "profiles": PROFILES, "text_chars": int(text_chars), "prose": prose,
             "prose_starts": max(1, len(prose) - int(text_chars))}
    started = time.perf_counter()
    with psycopg.connect(url, autocommit=True) as conn, ExitStack() as stack:
        conn.execute(queries["bench_search_shadow_profile"])
        conn.execute(queries["bench_search_drop_hnsw"])
        conn.execute(queries["bench_search_stage_create"])
        conn.execute(queries["bench_search_meta_stage_create"])
        conn.execute(queries["bench_search_meta_stage_fill"],
                     doc_metadata(len(layout["tenant"]), np.random.default_rng(META_SEED)))
        if terms is not None:
            conn.execute(queries["bench_search_lexical_stage_create"])
        copy = stack.enter_context(stack.enter_context(conn.cursor()).copy(queries["bench_search_stage_copy"]))
        copy.write(COPY_HEADER)
        lexical_copy = None
        if terms is not None:  # a second connection: its COPY streams beside the chunks'
            lexical_conn = stack.enter_context(psycopg.connect(url, autocommit=True))
            lexical_cur = stack.enter_context(lexical_conn.cursor())
            lexical_copy = stack.enter_context(lexical_cur.copy(queries["bench_search_lexical_stage_copy"]))
            lexical_copy.write(COPY_HEADER)
        docs, loaded, postings, lexical_s = len(layout["tenant"]), 0, 0, 0.0
        for first in range(0, docs, DOCS_PER_SLICE):
            rows = slice_rows(layout, first, min(docs, first + DOCS_PER_SLICE), centers, rng)
            copy.write(rows.tobytes())
            loaded += len(rows)
            if terms is not None and lexical_copy is not None:
                t0 = time.perf_counter()
                lexical_rows = lexical_slice_rows(rows, layout["cluster"][rows["doc"]], terms, term_rng)
                lexical_copy.write(lexical_rows.tobytes())
                postings += len(lexical_rows)
                lexical_s += time.perf_counter() - t0
            out(f"  staged {loaded:>9,} chunks, {postings:>11,} postings ({time.perf_counter() - started:6.1f} s)")
        copy.write(COPY_TRAILER)
        if lexical_copy is not None:
            lexical_copy.write(COPY_TRAILER)
        stack.close()  # ends both COPYs
        timings["generate + COPY"] = time.perf_counter() - started - lexical_s
        if terms is not None:
            timings["lexical generate + COPY"] = lexical_s
        phase = time.perf_counter()
        fills = ("bench_search_fill_documents", "bench_search_fill_versions", "bench_search_fill_tasks",
                 "bench_search_fill_pointers", "bench_search_fill_chunks")
        for name in fills:
            with conn.transaction():
                conn.execute(queries[name], names)
            out(f"  {name.rpartition('_')[2]} filled ({time.perf_counter() - phase:6.1f} s)")
        conn.execute(queries["bench_search_stage_drop"])
        conn.execute(queries["bench_search_meta_stage_drop"])
        timings["rows from staging"] = time.perf_counter() - phase
        conn.execute(queries["bench_search_build_settings"], {"maintenance_work_mem": "4GB", "workers": workers})
        if terms is not None:
            phase = time.perf_counter()
            for name in ("bench_search_lexical_posting_drop_term_index",
                         "bench_search_fill_lexical_chunks", "bench_search_fill_lexical_postings",
                         "bench_search_lexical_posting_term_index", "bench_search_fill_lexical_documents",
                         "bench_search_fill_lexical_term_stats", "bench_search_widen_lexical_term_bounds"):
                with conn.transaction():
                    conn.execute(queries[name], names if "fill" in name else None)
                out(f"  {name.removeprefix('bench_search_')} done ({time.perf_counter() - phase:6.1f} s)")
            conn.execute(queries["bench_search_lexical_stage_drop"])
            timings["lexical rows from staging"] = time.perf_counter() - phase
        else:  # publish keeps each tenant's chunk count with or without terms (dense search reads it)
            conn.execute(queries["bench_search_fill_chunk_counts"])
        phase = time.perf_counter()
        build = {"m": int(m), "ef_construction": int(ef_construction)}  # DDL: bound client-side, as literals
        psycopg.ClientCursor(conn).execute(queries["bench_search_build_hnsw"], build)
        timings["HNSW build"] = time.perf_counter() - phase
        out(f"  HNSW built ({timings['HNSW build']:6.1f} s)")
        phase = time.perf_counter()
        conn.execute(queries["bench_search_analyze"])
        timings["VACUUM ANALYZE"] = time.perf_counter() - phase
    timings["total"] = time.perf_counter() - started
    return timings


# ---------------------------------------------------------------- measuring


@dataclass(frozen=True)
class Query:
    """A synthetic question: a vector near one current chunk, and some of that chunk's terms (none without
    lexical rows)."""

    vector: np.ndarray
    terms: tuple[int, ...]


def tenant_queries(db: Database, tenant: str, count: int, rng: np.random.Generator,
                   term_rng: np.random.Generator) -> list[Query]:
    """Points near random current chunks of the tenant (a question about its content, not a copy of it),
    with QUERY_TERMS of the chunk's terms (their own generator: the vectors do not depend on them)."""
    rows = db.fetch_all("bench_search_tenant_queries", {"tenant_id": tenant, "profile": PROFILES[0], "seed": "q",
                                                         "count": count})
    out = []
    for r in rows:
        vector = _unit(np.asarray(r["embedding"].to_numpy(), np.float32) + _noise(rng, (DIM,), 0.8))
        terms: tuple[int, ...] = ()
        if r["terms"]:
            size = min(len(r["terms"]), int(term_rng.integers(QUERY_TERMS[0], QUERY_TERMS[1] + 1)))
            terms = tuple(sorted(int(t) for t in term_rng.choice(r["terms"], size=size, replace=False)))
        out.append(Query(vector, terms))
    return out


def product_search(db: Database, vector: np.ndarray, tenant: str, setting: Setting,
                   read: ReadScope = EVERYTHING) -> tuple[list[str], str]:
    """The statements of resources.search._dense_rows, in its order, in one transaction: with filters,
    ``search_hits_scoped`` first (exhaustive over a narrow scope), then ``search_hits`` and the
    ``search_hits_exact`` fallback; (chunk ids, the path that answered: scoped, walk or fallback)."""
    visible = read.params()
    params = {"query": vector, "tenant_id": tenant, "profile": PROFILES[0], "k": K, **visible}
    with db.transaction() as tx:
        tx.fetch_one("search_settings", {"ef_search": setting.ef_search, "max_scan_tuples": setting.max_scan_tuples})
        if setting.iterative_scan != "relaxed_order":
            tx.fetch_one("bench_search_iterative_scan", {"mode": setting.iterative_scan})
        scope = {"tenant_id": tenant, "profile": PROFILES[0]}
        key = scope_key(db, scope, visible) if read.filters else ()
        if read.filters and setting.scoped and not (setting.remember_wide and WIDE.known(key)):
            rows = tx.fetch_all("search_hits_scoped", {**params, "max_scope_pointers": EXACT_SCOPE_POINTERS,
                                                       "max_scope_chunks": EXACT_SCOPE_CHUNKS})
            if rows and rows[0]["exact"]:
                return [r["chunk_id"] for r in rows if r["chunk_id"] is not None], "scoped"
            if setting.remember_wide:
                WIDE.remember(key)
        walk = setting.walk_rule and not read.filters and walk_preferred(tx, scope)
        rows = walk_rows(tx, params, walk=walk)
        path = "walk"
        if len(rows) < K:
            rows, path = tx.fetch_all("search_hits_exact", params), "fallback"
    return [r["chunk_id"] for r in rows], path


class TermIdTokenizer:
    """Stands in for the profile's WordPiece tokenizer: the query text is its term ids, space-separated, so
    ``query_weights`` runs unchanged on the synthetic vocabulary."""

    def pieces(self, text: str) -> list[tuple[int, int, int]]:
        return [(int(m.group()), m.start(), m.end()) for m in re.finditer(r"\d+", text)]


TERM_IDS = partial(term_counts, tokenizer=TermIdTokenizer())
"""Stands in for the profile's analysis (``resources.lexical.analyzer_for``) on the synthetic vocabulary."""


def query_text(query: Query) -> str:
    return " ".join(map(str, query.terms))


def product_mode_search(db: Database, mode: str, query: Query, tenant: str, params: LexicalParams,
                        read: ReadScope = EVERYTHING) -> list[str]:
    """resources.search.search past embedding and tokenizing, in its order, in one transaction:
    ``search_settings``, ``query_weights``, then the hybrid fusion (``_hybrid_rows``) or ``lexical_search``;
    chunk ids, best first."""
    scope = {"tenant_id": tenant, "profile": PROFILES[0]}
    with db.transaction() as tx:
        depth = K if mode == "lexical" else hybrid_depth(K)
        tx.fetch_one("search_settings", {"ef_search": ef_search_for(depth), "max_scan_tuples": DEFAULT_MAX_SCAN_TUPLES})
        weights = query_weights(tx, TERM_IDS, query_text(query), **scope)
        if mode == "lexical":
            rows = lexical_search(tx, weights, params, k=K, read=read.params(), **scope) if weights else []
            scores = {r["chunk_id"]: float(r["bm25"]) for r in rows}
        else:
            _, scores = _hybrid_rows(tx, query.vector, weights, params, scope, read.params(), K)()
    return sorted(scores, key=lambda cid: (-scores[cid], cid))[:K]


def all_term_weights(db: Database, query: Query, tenant: str) -> dict | None:
    """``query_weights`` without the postings budget: every query term that occurs, with its idf."""
    rows = db.fetch_all("lexical_stats_get", {"tenant_id": tenant, "profile": PROFILES[0],
                                              "terms": [N_CHUNKS, TOTAL_LENGTH, *query.terms]})
    stats = {r["term"]: int(r["df"]) for r in rows}
    n, total = stats.pop(N_CHUNKS, 0), stats.pop(TOTAL_LENGTH, 0)
    dfs = {t: d for t, d in sorted(stats.items()) if d > 0}
    if n <= 0 or not dfs:
        return None
    return {"candidates": list(dfs), "candidate_idfs": [idf(n, d) for d in dfs.values()],
            "avg_length": total / n if total > 0 else 1.0}


def fused_exact(db: Database, query: Query, tenant: str, weights: dict | None, params: LexicalParams,
                lexical_weight: float, read: ReadScope = EVERYTHING) -> list[str]:
    """The exact top k of the fusion over every current chunk of the tenant in scope (``bench_search_fused_exact``)."""
    if weights is None and lexical_weight >= 1:
        return []  # nothing can score: the product's lexical search returns nothing either
    weights = weights or {"candidates": [], "candidate_idfs": [], "avg_length": 1.0}
    with db.transaction() as tx:
        tx.fetch_one("bench_search_custom_plan")
        rows = tx.fetch_all("bench_search_fused_exact", {
            **weights, "k1": params.bm25_k1, "b": params.bm25_b, "tenant_id": tenant, "profile": PROFILES[0],
            "query": query.vector, "lexical_weight": lexical_weight, "k": K, **read.params(),
        })
    return [r["chunk_id"] for r in rows if r["score"] > 0]  # score 0: no query term and no similarity


def exact_search(db: Database, vector: np.ndarray, tenant: str, read: ReadScope = EVERYTHING) -> list[str]:
    """Brute force with the same filters: exhaustive distance over the tenant's current chunks in scope."""
    params = {"query": vector, "tenant_id": tenant, "profile": PROFILES[0], "k": K, **read.params()}
    return [r["chunk_id"] for r in db.fetch_all("search_hits_exact", params)]


def plan_uses_hnsw(db: Database, vector: np.ndarray, tenant: str, setting: Setting, k: int = K,
                   read: ReadScope = EVERYTHING) -> bool:
    """Whether the planner walks the graph under this setting (small tenants are rightly read exhaustively)."""
    params = {"query": vector, "tenant_id": tenant, "profile": PROFILES[0], "k": k, **read.params()}
    with db.transaction() as tx:
        tx.fetch_one("search_settings", {"ef_search": setting.ef_search, "max_scan_tuples": setting.max_scan_tuples})
        tx.fetch_one("bench_search_iterative_scan", {"mode": setting.iterative_scan})
        if setting.walk_rule and not read.filters and walk_preferred(tx, {"tenant_id": tenant, "profile": PROFILES[0]}):
            tx.fetch_one("search_sort_enabled", {"enable_sort": "off"})  # as walk_rows plans it
        plan = tx.conn.execute("EXPLAIN (FORMAT JSON) " + queries["search_hits"], params).fetchone()[0]
    return "chunk_embedding_hnsw_idx" in json.dumps(plan)


def percentile(values: list[float], q: float) -> float:
    return float(np.percentile(np.asarray(values), q))


def recall(got: list[str], truth: list[str]) -> float:
    """Share of the exact top k found (an empty exact answer is matched by an empty one)."""
    if not truth:
        return 1.0 if not got else 0.0
    return len(set(got) & set(truth)) / min(K, len(truth))


@dataclass(frozen=True)
class Runner:
    """One measured configuration: a mode and setting, how to run a query, and the exact answers it is held to."""

    mode: str
    setting: str
    run: Callable[[int], tuple[list[str], str | None]]  # query index -> (chunk ids, dense path or None)
    truth: list[list[str]]
    truth_all_terms: list[list[str]] | None
    exact_ms: float
    plan: str
    scope: str = "all"
    """The read scope: "all" (EVERYTHING), a FILTERS label, or "as PRINCIPAL" (permissions on)."""
    read: ReadScope = EVERYTHING


def timed(fn: Callable[[int], list[str]], count: int) -> tuple[list[list[str]], float]:
    """Results of an exact reference for query indexes ``0..count-1`` and the mean ms per call."""
    started = time.perf_counter()
    out = [fn(i) for i in range(count)]
    return out, (time.perf_counter() - started) * 1000 / max(1, count)


def tenant_runners(db: Database, tenant: str, questions: list[Query], modes: tuple[str, ...] = MODES) -> list[Runner]:
    """The dense settings grid, then (with lexical rows) product hybrid and lexical, with their exact answers;
    then the product's dense search under each of FILTERS (and hybrid under HYBRID_FILTERS) against the exact
    filtered answers, and dense and hybrid with permissions on (PERMISSIONS) against the unfiltered ones."""
    n = len(questions)
    product = settings_grid()[0]
    dense_truth, dense_ms = timed(lambda i: exact_search(db, questions[i].vector, tenant), n)
    runners = []
    for setting in settings_grid():
        plan = "hnsw" if plan_uses_hnsw(db, questions[0].vector, tenant, setting) else "exact"
        runners.append(Runner("dense", setting.label,
                              lambda i, s=setting: product_search(db, questions[i].vector, tenant, s),
                              dense_truth, None, dense_ms, plan))
    scopes = {label: ReadScope.of(see_all=True, filters=exprs) for label, exprs in FILTERS.items()}
    walk = replace(product, label="walk only", scoped=False)  # the graph walk + fallback, never the scoped path
    repeated = replace(product, label="product, again", remember_wide=True)  # a scope searched before: its verdict
    for label, read in scopes.items():
        truth, ms = timed(lambda i, r=read: exact_search(db, questions[i].vector, tenant, r), n)
        plan = "hnsw" if plan_uses_hnsw(db, questions[0].vector, tenant, product, read=read) else "exact"
        for setting in (product, repeated, walk):
            runners.append(Runner("dense", setting.label,
                                  lambda i, r=read, s=setting: product_search(db, questions[i].vector, tenant, s, r),
                                  truth, None, ms, plan, label, read))
    # Permissions on: the principal may read every document (restricted ones name it), so the answers and the
    # exact references are the unfiltered ones and both sides do the same work but for the allow-list check.
    as_label = "as " + ", ".join(PERMISSIONS.principals)
    plan = "hnsw" if plan_uses_hnsw(db, questions[0].vector, tenant, product, read=PERMISSIONS) else "exact"
    runners.append(Runner("dense", product.label,
                          lambda i: product_search(db, questions[i].vector, tenant, product, PERMISSIONS),
                          dense_truth, None, dense_ms, plan, as_label, PERMISSIONS))
    if not all(q.terms for q in questions) or modes == ("dense",):
        return runners
    params = LexicalParams.of(db.fetch_one("index_profile_active") or {})
    scoped = [query_weights(db, TERM_IDS, query_text(q), tenant_id=tenant, profile=PROFILES[0]) for q in questions]
    every = [all_term_weights(db, q, tenant) for q in questions]
    depth_plan = plan_uses_hnsw(db, questions[0].vector, tenant, product, hybrid_depth(K))
    cases = [("hybrid", params.lexical_weight, "hnsw" if depth_plan else "exact", "all", EVERYTHING),
             ("lexical", 1.0, "post", "all", EVERYTHING)]
    for label in HYBRID_FILTERS:
        filtered_plan = plan_uses_hnsw(db, questions[0].vector, tenant, product, hybrid_depth(K), scopes[label])
        cases.append(("hybrid", params.lexical_weight, "hnsw" if filtered_plan else "exact", label, scopes[label]))
    hybrid_all = None
    for mode, weight, plan, label, read in cases:
        truth, ms = timed(lambda i, w=weight, r=read: fused_exact(db, questions[i], tenant, scoped[i], params, w, r), n)
        truth_all, _ = timed(lambda i, w=weight, r=read: fused_exact(db, questions[i], tenant, every[i], params, w, r), n)
        runners.append(Runner(mode, "product",
                              lambda i, m=mode, r=read: (product_mode_search(db, m, questions[i], tenant, params, r), None),
                              truth, truth_all, ms, plan, label, read))
        if mode == "hybrid" and label == "all":
            hybrid_all = runners[-1]
    assert hybrid_all is not None
    runners.append(Runner("hybrid", "product",
                          lambda i: (product_mode_search(db, "hybrid", questions[i], tenant, params, PERMISSIONS), None),
                          hybrid_all.truth, hybrid_all.truth_all_terms, hybrid_all.exact_ms, hybrid_all.plan,
                          as_label, PERMISSIONS))
    return runners


def measure(url: str, queries_per_tenant: int, out: Callable[[str], None], rng: np.random.Generator,
            modes: tuple[str, ...] = MODES) -> list[dict]:
    """One result row per (tenant, mode, setting): p50/p95 ms, recall@10 vs exact (and, for hybrid and lexical,
    vs exact with every query term), fallback share, plan."""
    results = []
    term_rng = np.random.default_rng(LEXICAL_SEED + 2)
    with Database(url, max_size=2) as db:
        for tenant in MEASURED_TENANTS:
            current = db.fetch_one("bench_search_tenant_current", {"tenant_id": tenant, "profile": PROFILES[0]})
            questions = tenant_queries(db, tenant, queries_per_tenant, rng, term_rng)
            if not questions:
                continue
            runners = tenant_runners(db, tenant, questions, modes)
            in_scope = {r.scope: db.fetch_one("bench_search_scope_chunks", {
                "tenant_id": tenant, "profile": PROFILES[0], **r.read.params()})["chunks"] for r in runners}
            for runner in runners:  # warm the cache for every configuration
                for i in range(min(10, len(questions))):
                    runner.run(i)
            samples: dict[int, list[tuple[float, float, float | None, bool | None]]] = {j: [] for j in range(len(runners))}
            order = list(range(len(runners)))
            for i in range(len(questions)):
                # Configurations interleaved per query, in a rotating order: load noise and the cost of being
                # the first to touch the query's pages fall on every configuration alike.
                for j in order[i % len(order):] + order[: i % len(order)]:
                    runner = runners[j]
                    t0 = time.perf_counter()
                    got, path = runner.run(i)
                    ms = (time.perf_counter() - t0) * 1000
                    all_terms = recall(got, runner.truth_all_terms[i]) if runner.truth_all_terms else None
                    samples[j].append((ms, recall(got, runner.truth[i]), all_terms, path))
            for j, runner in enumerate(runners):
                latencies = [ms for ms, *_ in samples[j]]
                recalls = [r for _, r, _, _ in samples[j]]
                all_terms = [a for _, _, a, _ in samples[j] if a is not None]
                paths = [f for *_, f in samples[j] if f is not None]
                row = {
                    "tenant": tenant, "current_chunks": current["current_chunks"], "mode": runner.mode,
                    "plan": runner.plan, "setting": runner.setting, "scope": runner.scope,
                    "in_scope": in_scope[runner.scope] / max(1, current["current_chunks"]), "p50_ms": statistics.median(latencies),
                    "p95_ms": percentile(latencies, 95), "recall_at_10": float(np.mean(recalls)),
                    "min_recall": float(np.min(recalls)),
                    "recall_all_terms": float(np.mean(all_terms)) if all_terms else None,
                    "fallback_share": paths.count("fallback") / len(paths) if paths else None,
                    "scoped_share": paths.count("scoped") / len(paths) if paths else None,
                    "exact_ms": runner.exact_ms,
                }
                results.append(row)
                out(format_row(row))
    return results


def permission_rounds(url: str, queries_per_tenant: int, rounds: int, out: Callable[[str], None],
                      rng: np.random.Generator) -> list[dict]:
    """Permissions on vs off, alone and repeated: the product's dense search as PERMISSIONS and as EVERYTHING,
    ``rounds`` times over the same ``queries_per_tenant`` queries per tenant, the two sides alternating which goes
    first on each query; per round, each side's p95 and their ratio. A p95 of a few ms over 100 queries is the
    5th-slowest sample, so one round's ratio swings with a single stall: the median round is the figure."""
    product = settings_grid()[0]
    rows = []
    with Database(url, max_size=2) as db:
        for tenant in MEASURED_TENANTS:
            current = db.fetch_one("bench_search_tenant_current", {"tenant_id": tenant, "profile": PROFILES[0]})
            questions = tenant_queries(db, tenant, queries_per_tenant, rng, np.random.default_rng(LEXICAL_SEED + 2))
            if not questions:
                continue
            sides = {"off": EVERYTHING, "on": PERMISSIONS}
            for i in range(min(10, len(questions))):  # warm both
                for read in sides.values():
                    product_search(db, questions[i].vector, tenant, product, read)
            per_round, differing = [], 0  # equal work: the principal may read everything, so the answers match
            for r in range(rounds):
                ms: dict[str, list[float]] = {"off": [], "on": []}
                for i, q in enumerate(questions):
                    order = ("off", "on") if (i + r) % 2 == 0 else ("on", "off")
                    got = {}
                    for side in order:
                        t0 = time.perf_counter()
                        got[side] = product_search(db, q.vector, tenant, product, sides[side])[0]
                        ms[side].append((time.perf_counter() - t0) * 1000)
                    differing += got["on"] != got["off"]
                p95 = {side: percentile(v, 95) for side, v in ms.items()}
                per_round.append({"on_p95_ms": p95["on"], "off_p95_ms": p95["off"], "ratio": p95["on"] / p95["off"],
                                  "on_p50_ms": statistics.median(ms["on"]), "off_p50_ms": statistics.median(ms["off"])})
                out(f"permissions {tenant:<8} round {r + 1}/{rounds}: p95 on/off {p95['on']:.2f}/{p95['off']:.2f} ms "
                    f"= {p95['on'] / p95['off']:.3f}")
            ratios = [x["ratio"] for x in per_round]
            rows.append({"tenant": tenant, "current_chunks": current["current_chunks"], "queries": len(questions),
                         "rounds": per_round, "answers_differing": differing, "median_ratio": statistics.median(ratios),
                         "min_ratio": min(ratios), "max_ratio": max(ratios)})
    return rows


def permission_summary(rows: list[dict]) -> list[str]:
    """Per tenant, the median round's p95 ratio (on / off) and the spread; the worst median against the target."""
    lines = []
    for r in rows:
        on = statistics.median(x["on_p95_ms"] for x in r["rounds"])
        off = statistics.median(x["off_p95_ms"] for x in r["rounds"])
        lines.append(f"permissions dense on/off, {r['tenant']} ({r['current_chunks']:,} current chunks, "
                     f"{r['queries']} queries x {len(r['rounds'])} rounds): median p95 {on:.2f}/{off:.2f} ms, "
                     f"median ratio {r['median_ratio']:.3f} (rounds {r['min_ratio']:.3f}-{r['max_ratio']:.3f}); "
                     f"queries answered differently: {r['answers_differing']}")
    if rows:
        worst = max(r["median_ratio"] for r in rows)
        verdict = "met" if worst <= 1.10 else "missed"
        lines.append(f"permissions dense on/off: worst median ratio {worst:.3f} (target: within 10%: {verdict})")
    return lines


HEADER = (f"{'tenant':<8} {'current':>9} {'mode':<7} {'plan':>5}  {'setting':<18} {'scope':<29} {'kept':>6} "
          f"{'p50 ms':>7} {'p95 ms':>7} "
          f"{'recall@10':>9} {'min':>5} {'all terms':>9} {'fallback':>8} {'scoped':>6} {'exact ms':>8}")


def format_row(r: dict) -> str:
    all_terms = "-" if r["recall_all_terms"] is None else f"{r['recall_all_terms']:.3f}"
    fallback = "-" if r["fallback_share"] is None else f"{r['fallback_share']:.0%}"
    scoped = "-" if r.get("scoped_share") is None else f"{r['scoped_share']:.0%}"
    return (f"{r['tenant']:<8} {r['current_chunks']:>9,} {r['mode']:<7} {r['plan']:>5}  {r['setting']:<18} "
            f"{r['scope']:<29} {r['in_scope']:>6.1%} {r['p50_ms']:>7.2f} {r['p95_ms']:>7.2f} {r['recall_at_10']:>9.3f} {r['min_recall']:>5.2f} "
            f"{all_terms:>9} {fallback:>8} {scoped:>6} {r['exact_ms']:>8.1f}")


SCRATCH = "kbindex_bench_search"


@contextmanager
def bench_database(admin_url: str, keep: bool, seeded: bool) -> Iterator[str]:
    """The scratch database: fresh and dropped afterwards; kept (``--keep``); or the one a kept run seeded
    (``--seeded``: migrated to the checkout's migrations, not re-seeded)."""
    if not (keep or seeded):
        with scratch_database(admin_url, SCRATCH) as url:
            yield url
        return
    url = with_database(admin_url, SCRATCH)
    if not seeded:
        with psycopg.connect(admin_url, autocommit=True) as conn:
            conn.execute(pgsql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(pgsql.Identifier(SCRATCH)))
            conn.execute(pgsql.SQL("CREATE DATABASE {}").format(pgsql.Identifier(SCRATCH)))
    migrate(url)
    yield url


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.scale.search", description=__doc__.split("\n")[0])
    parser.add_argument("--chunks", type=int, default=1_000_000)
    parser.add_argument("--queries", type=int, default=100, help="query vectors per tenant")
    parser.add_argument("--m", type=int, default=24, help="HNSW m (links per node); the product uses 24")
    parser.add_argument("--ef-construction", type=int, default=100, help="the product uses 100")
    parser.add_argument("--workers", type=int, default=1, help="parallel maintenance workers for the build")
    parser.add_argument("--structure", choices=("hierarchical", "flat"), default="hierarchical",
                        help="topic layout of the synthetic vectors (flat: orthogonal topics, a worst case)")
    parser.add_argument("--modes", choices=("dense",), help="measure dense search only (the exact hybrid and lexical "
                        "references cost the most at 1M)")
    parser.add_argument("--lexical", action=argparse.BooleanOptionalAction, default=True,
                        help="also seed the lexical index and measure hybrid and lexical search (default: on)")
    parser.add_argument("--text-chars", type=int, default=0,
                        help="each chunk's text length in characters (default 0: a short label, as every figure in the "
                             "README before migration 0051; ~1,000 is a real chunk's, see bench.scale.vector_placement)")
    parser.add_argument("--permission-rounds", type=int, metavar="N",
                        help="measure only permissions on vs off (dense), N rounds over --queries queries per tenant")
    parser.add_argument("--json", dest="json_path", help="also write the results here")
    parser.add_argument("--keep", action="store_true",
                        help=f"keep the seeded {SCRATCH} database (with KBINDEX_DATABASE_URL: a server that outlives the run)")
    parser.add_argument("--seeded", action="store_true",
                        help=f"measure the {SCRATCH} database a --keep run seeded, without seeding (--chunks etc. ignored)")
    args = parser.parse_args(argv)

    def out(line: str) -> None:
        print(line, flush=True)

    exit_on_sigterm()  # killed with SIGTERM, still drop the scratch databases and stop the server
    rng = np.random.default_rng(14)
    with server_url() as admin_url, bench_database(admin_url, args.keep, args.seeded) as url:
        if args.seeded:
            out(f"measuring the {SCRATCH} database seeded by an earlier --keep run")
            timings = {}
        else:
            out(f"seeding {args.chunks:,} chunks ({args.structure} topics, m={args.m}, "
                f"ef_construction={args.ef_construction}, lexical {'on' if args.lexical else 'off'})")
            timings = seed(url, args.chunks, args.m, args.ef_construction, args.workers, out, rng, args.structure,
                           lexical=args.lexical, text_chars=args.text_chars)
        with Database(url, max_size=1) as db:
            sizes = db.fetch_one("bench_search_sizes")
        out("seeding: " + ", ".join(f"{k} {v:.1f} s" for k, v in timings.items()))
        out(f"loaded {sizes['chunks']:,} chunks, {sizes['current_chunks']:,} current "
            f"({1 - sizes['current_chunks'] / sizes['chunks']:.0%} superseded or other profile); "
            f"table {sizes['table_bytes'] / 2**30:.2f} GiB, HNSW {sizes['hnsw_bytes'] / 2**30:.2f} GiB; "
            f"{sizes['lexical_chunks']:,} lexical rows, {sizes['postings']:,} postings, "
            f"{sizes['lexical_bytes'] / 2**30:.2f} GiB")
        if args.permission_rounds:
            rows = permission_rounds(url, args.queries, args.permission_rounds, out, np.random.default_rng(QUERY_SEED))
            for line in permission_summary(rows):
                out(line)
            if args.json_path:
                with open(args.json_path, "w", encoding="utf-8") as fh:
                    json.dump({"sizes": sizes, "seeding_s": timings, "permission_rounds": rows}, fh, indent=2)
            return 0
        out(HEADER)
        # Queries from their own generator: a --seeded run asks the same questions as the run that seeded.
        results = measure(url, args.queries, out, np.random.default_rng(QUERY_SEED), (args.modes,) if args.modes else MODES)
    if args.json_path:
        with open(args.json_path, "w", encoding="utf-8") as fh:
            json.dump({"chunks": args.chunks, "structure": args.structure, "m": args.m, "ef_construction": args.ef_construction,
                       "lexical": args.lexical, "seeding_s": timings, "sizes": sizes, "results": results}, fh, indent=2)
    for line in summary(results):
        out(line)
    return 0


def summary(results: list[dict]) -> list[str]:
    """Per mode, the product setting's worst p95 and recall over the tenants (the issue's targets are dense's);
    per filter, the same for filtered dense (and hybrid); permissions on vs off, p95 per tenant."""
    lines = []
    for mode in ("dense", "hybrid", "lexical"):
        product = [r for r in results if r["mode"] == mode and r["setting"] == "product" and r["scope"] == "all"]
        if not product:
            continue
        line = (f"product {mode}: worst p95 {max(r['p95_ms'] for r in product):.1f} ms, "
                f"worst recall@10 {min(r['recall_at_10'] for r in product):.3f}")
        if mode != "dense":
            line += f" (with every query term {min(r['recall_all_terms'] for r in product):.3f})"
        else:
            line += " (targets: p95 <= 30 ms, recall@10 >= 0.95)"
        lines.append(line)
    for mode in ("dense", "hybrid"):
        for label in FILTERS:
            rows = [r for r in results if r["mode"] == mode and r["setting"] == "product" and r["scope"] == label]
            if not rows:
                continue
            worst = max(rows, key=lambda r: r["p95_ms"])
            line = (f"filtered {mode} {label}: worst p95 {worst['p95_ms']:.1f} ms ({worst['tenant']}), worst recall@10 "
                    f"{min(r['recall_at_10'] for r in rows):.3f} vs exact filtered")
            if mode == "dense":
                line += (f", fallback up to {max(r['fallback_share'] or 0 for r in rows):.0%}, scoped up to "
                         f"{max(r.get('scoped_share') or 0 for r in rows):.0%}")
            if mode == "dense" and label.endswith("(1%)"):
                line += " (targets: p95 <= 50 ms, recall@10 >= 0.95)"
            lines.append(line)
    for mode in ("dense", "hybrid"):
        off = {r["tenant"]: r for r in results if r["mode"] == mode and r["setting"] == "product" and r["scope"] == "all"}
        on = {r["tenant"]: r for r in results
              if r["mode"] == mode and r["setting"] == "product" and r["scope"].startswith("as ")}
        pairs = [(t, on[t], off[t]) for t in off if t in on]
        if not pairs:
            continue
        ratios = ", ".join(f"{t} {a['p95_ms']:.1f}/{b['p95_ms']:.1f} ms" for t, a, b in pairs)
        worst = max(a["p95_ms"] / b["p95_ms"] for _, a, b in pairs)
        target = " (target: within 10%)" if mode == "dense" else ""
        lines.append(f"permissions {mode} on/off p95: {ratios}; worst ratio {worst:.2f}{target}")
    return lines


if __name__ == "__main__":
    sys.exit(main())
