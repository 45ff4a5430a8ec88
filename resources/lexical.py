"""The lexical (BM25) index in PostgreSQL: its rows for the publish transaction, its search, its backfill.

- ``lexical_rows``: the ``lexical_chunk_upsert`` parameters of a batch of chunks (terms of heading path +
  text, pipelines/domain/lexical.py; under a context profile the document title first: ``lexical_text``),
  written by IndexSink.publish in the fenced transaction right after the chunk rows;
  ``lexical_stats_reconcile`` then makes the tenant's BM25 statistics count the pointed version. Chunk
  deletions (stale rows of a re-run, retention) cascade to the lexical rows. Retention only removes versions no
  pointer names, and a profile rollback only changes which profile's (separately kept)
  statistics are read, so neither touches the statistics.
- ``lexical_search``: BM25 over the tenant's current chunks. Statistics come from ``lexical_term_stats``
  (one index probe per query term), scores from ``lexical_posting`` (the inverted index: a covering-index
  walk per term) for the query's rarest terms up to a postings budget (``scoring_terms``: 2 x the tenant's chunks, at
  most 50,000), so the cost follows the query's terms, not the tenant's size. A query whose commonest terms
  hold most of those postings (``lazy_terms``) runs ``lexical_hits_pruned``: MaxScore pruning, the same answer
  with those terms read only for the chunks that can still rank, each term's most bounded by the largest tf
  and smallest length / tf the statistics keep for it (migration 0052).
- ``backfill_lexical_index``: lexical rows for chunks written before migration 0022 (run by ``migrate``).
- ``analyzer_for``: a profile's term analysis (its ``lexical_analyzer``: ``wordpiece`` over its model's tokenizer,
  or ``english``), the one thing every caller above uses: publish rows, query terms, backfill, quality gate.

Statistics are maintained rather than counted at query time: counting df over the pointed versions costs
one GIN posting walk plus a pointer join per query term (all of a tenant's chunks for a common term), while
the maintained row is one index probe; measured in the issue #13 report.
"""

from __future__ import annotations

import threading
from collections import Counter
from collections.abc import Callable, Mapping, Sequence
from functools import lru_cache, partial
from typing import Any

from pipelines.domain.lexical import (
    PROBE_COST,
    LexicalParams,
    check_analyzer,
    english_term_counts,
    idf,
    lazy_terms,
    scoring_terms,
    term_bound,
    term_counts,
)
from pipelines.domain.metadata import NO_FILTERS
from resources.database import Database, Session

N_CHUNKS, TOTAL_LENGTH = -1, -2
BACKFILL_BATCH = 500
PROBES_PER_HIT = 8
PROBES_AT_LEAST = 400


@lru_cache(maxsize=8)
def tokenizer_for(model: str) -> Any:
    """The profile model's WordPiece tokenizer (loaded once per process)."""
    from resources.embedder import tokenizer_for_model

    return tokenizer_for_model(model)


Analyzer = Callable[[str], Counter[int]]
"""Text -> term id -> frequency (pipelines/domain/lexical.py)."""

_stemmers = threading.local()


def _stem_words(words: list[str]) -> list[str]:
    """Snowball English stems of ``words``; one PyStemmer object per thread (they keep a cache and are not
    thread-safe)."""
    stemmer = getattr(_stemmers, "english", None)
    if stemmer is None:
        import Stemmer

        stemmer = _stemmers.english = Stemmer.Stemmer("english")
    return stemmer.stemWords(words)


@lru_cache(maxsize=16)
def analyzer_for(model: str, analyzer: str) -> Analyzer:
    """The term analysis of a profile with ``model`` and ``lexical_analyzer`` ``analyzer`` (ValueError for an
    unknown analyzer; the CHECK of migration 0045 keeps them out of the table)."""
    if check_analyzer(analyzer) == "english":
        return partial(english_term_counts, stem_words=_stem_words)
    return partial(term_counts, tokenizer=tokenizer_for(model))


def profile_analyzer(profile: Mapping[str, Any]) -> Analyzer:
    """``analyzer_for`` a profile row (one from before migration 0045: ``wordpiece``)."""
    return analyzer_for(profile["model"], LexicalParams.of(profile).analyzer)


def lexical_text(heading_path: Sequence[str], text: str, title: str | None = None) -> str:
    """What the lexical index reads of a chunk: its heading path, then its text; under a context profile its
    document ``title`` first (the chunk's ``context_title``), as the vector was computed from it, with a heading
    path that starts with the title not repeating it (chunking._context_prefix). Without a title: exactly what
    every profile read before issue #35."""
    title = " ".join(title.split()) if title else ""
    if title:
        path = list(heading_path)
        if path and " ".join(path[0].split()).casefold() == title.casefold():
            path = path[1:]  # the lone top heading the title was taken from
        return "\n".join([title, *path, text])
    return "\n".join([*heading_path, text]) if heading_path else text


def lexical_rows(chunks: Sequence[Any], analyze: Analyzer) -> dict[str, list[Any]]:
    """``lexical_chunk_upsert`` arrays for chunks (anything with chunk_id, heading_path, text, content_digest,
    and optionally ``context_title``: set only by a context profile's chunker, or read back from its chunk rows)."""
    out: dict[str, list[Any]] = {"chunk_ids": [], "content_digests": [], "terms": [], "tfs": [], "lengths": []}
    for c in chunks:
        counts = analyze(lexical_text(tuple(c.heading_path), c.text, getattr(c, "context_title", None)))
        terms = sorted(counts)
        out["chunk_ids"].append(c.chunk_id)
        out["content_digests"].append(c.content_digest)
        out["terms"].append("{" + ",".join(map(str, terms)) + "}")
        out["tfs"].append("{" + ",".join(str(counts[t]) for t in terms) + "}")
        out["lengths"].append(sum(counts.values()))
    return out


def write_lexical(tx: Session, keys: Sequence[Mapping[str, Any]], chunks: Sequence[Any], analyze: Analyzer) -> None:
    """Upsert the lexical rows and postings of a batch of chunks (inside the publish transaction); ``keys[i]``
    is the version (tenant_id, document_id, profile, version_number) of ``chunks[i]``, ``analyze`` that
    profile's analysis (``analyzer_for``)."""
    rows = {**lexical_rows(chunks, analyze), **version_columns(keys)}
    tx.execute("lexical_posting_prune", rows)  # before the upsert: the old rows say which terms go
    tx.execute("lexical_chunk_upsert", rows)
    tx.execute("lexical_posting_write", {"chunk_ids": rows["chunk_ids"]})


def version_columns(keys: Sequence[Mapping[str, Any]]) -> dict[str, list[Any]]:
    """The per-row version arrays of a batch statement (``tenant_ids``, ``document_ids``, ``profiles``,
    ``version_numbers``), one entry per key."""
    return {"tenant_ids": [k["tenant_id"] for k in keys], "document_ids": [k["document_id"] for k in keys],
            "profiles": [k["profile"] for k in keys], "version_numbers": [k["version_number"] for k in keys]}


def query_weights(
    session: Session | Database, analyze: Analyzer, query: str, *, tenant_id: str, profile: str
) -> dict[str, Any] | None:
    """The scoring terms (the query's rarest that occur, within the postings budget) with their idf, df and
    kept bound (largest tf, smallest length / tf; None: not kept), and the average length; None when no query
    term occurs (nothing can score). ``analyze``: the profile's analysis, the one its rows were written with."""
    terms = sorted(analyze(query))
    rows = session.fetch_all(
        "lexical_stats_get", {"tenant_id": tenant_id, "profile": profile, "terms": [N_CHUNKS, TOTAL_LENGTH, *terms]}
    )
    stats = {r["term"]: r for r in rows}
    n = int(stats.pop(N_CHUNKS, {}).get("df", 0))
    total = int(stats.pop(TOTAL_LENGTH, {}).get("df", 0))
    dfs = {t: int(r["df"]) for t, r in stats.items() if r["df"] > 0}
    if n <= 0 or not dfs:
        return None
    chosen = scoring_terms(dfs, n)
    return {
        "candidates": chosen,
        "candidate_idfs": [idf(n, dfs[t]) for t in chosen],
        "candidate_dfs": [dfs[t] for t in chosen],
        "candidate_max_tfs": [stats[t]["max_tf"] for t in chosen],
        "candidate_min_length_per_tfs": [stats[t]["min_length_per_tf"] for t in chosen],
        "avg_length": total / n if total > 0 else 1.0,
    }


def lexical_search(tx: Session, weights: Mapping[str, Any], params: LexicalParams,
                   **where: Any) -> list[dict[str, Any]]:
    """The ``k`` best current chunks in the reader's scope by BM25 (rows with chunk fields, ``metadata``, ``bm25``
    and, given a query vector, the cosine ``distance``); ``where``: ``send_lexical_search``'s keyword arguments
    (``tenant_id``, ``profile``, ``k``, ``read``: ``ReadScope.params()``, ``query_vector``).

    ``lexical_hits`` probes the pointers of the best-scoring chunks only; a query with common terms
    (``lazy_terms``) runs ``lexical_hits_pruned``, the same answer with MaxScore pruning. Under metadata
    filters, or when an allow list leaves its probes short, ``lexical_hits_all_pointers`` reads the tenant's
    pointers in scope instead (same answer): under a filter keeping 10% of a 10k-pointer tenant
    (bench.scale.search's 300k-chunk database), probing first cost p95 93 ms against 35 ms."""
    return send_lexical_search(tx, weights, params, **where)() or []


def send_lexical_search(
    tx: Session,
    weights: Mapping[str, Any],
    params: LexicalParams,
    *,
    tenant_id: str,
    profile: str,
    k: int,
    read: Mapping[str, Any],
    query_vector: Any | None = None,
    exhaustive: bool = False,
    settle: bool = True,
) -> Callable[[], list[dict[str, Any]] | None]:
    """``lexical_search`` in two halves: send its statement now (``Session.submit``), read its rows when the
    returned function is called. In a pipelined search another statement sent between the two (hybrid's dense
    side) shares the wait: one round trip for both over a slow link, not two.

    ``settle``: the function is called inside the transaction and reads the tenant's pointers itself when the
    probes came back short; otherwise it may be called after COMMIT and returns None then. ``exhaustive``: read
    the pointers at once (``lexical_hits_all_pointers``, the same answer)."""
    query = hits_query(weights, params, tenant_id=tenant_id, profile=profile, k=k, read=read,
                       query_vector=query_vector, max_probes=max_pointer_probes(k))
    if exhaustive or read["filters"] != NO_FILTERS:  # a filter keeps a share of the tenant: its pointers are few
        return tx.submit("lexical_hits_all_pointers", query).fetchall
    sent = tx.submit("lexical_hits_pruned" if query["lazy_terms"] else "lexical_hits", query)

    def rows() -> list[dict[str, Any]] | None:
        walked = sent.fetchall()
        hits = [r for r in walked if r["chunk_id"] is not None]
        if len(hits) < k and walked[0]["walked"] >= query["max_probes"]:
            return tx.fetch_all("lexical_hits_all_pointers", query) if settle else None
        return hits

    return rows


def hits_query(
    weights: Mapping[str, Any], params: LexicalParams, *, tenant_id: str, profile: str, k: int,
    read: Mapping[str, Any], query_vector: Any | None, max_probes: int,
) -> dict[str, Any]:
    """The parameters of lexical_search's statements (``weights``: query_weights'), with the walk's cut
    ``max_probes``, the most each term adds to a chunk (``candidate_bounds``: ``term_bound`` of its kept
    bound) and the terms lexical_hits_pruned may probe (``lazy_terms``)."""
    terms = weights["candidates"]
    dfs = dict(zip(terms, weights["candidate_dfs"]))
    idfs = dict(zip(terms, weights["candidate_idfs"]))
    bounds = [term_bound(i, params.bm25_k1, params.bm25_b, weights["avg_length"], tf, lt)
              for i, tf, lt in zip(weights["candidate_idfs"], weights["candidate_max_tfs"],
                                   weights["candidate_min_length_per_tfs"])]
    return {**read, **weights, "k1": params.bm25_k1, "b": params.bm25_b, "tenant_id": tenant_id,
            "profile": profile, "k": k, "query": query_vector, "max_probes": max_probes, "candidate_bounds": bounds,
            "lazy_terms": lazy_terms(dfs, idfs, max_probes, params.bm25_k1, bounds=dict(zip(terms, bounds))),
            "probe_cost": PROBE_COST}


def max_pointer_probes(k: int) -> int:
    """How many of the walk's best chunks ``lexical_hits`` checks against their pointers (two index probes
    each, ~30 us) before the caller reads every pointer instead: enough for superseded versions (~30% of
    chunks in bench.scale.search) and a permission or filter that keeps an eighth of the tenant."""
    return max(PROBES_AT_LEAST, PROBES_PER_HIT * k)


def lexical_scores(
    tx: Session, weights: Mapping[str, Any], params: LexicalParams, chunk_ids: Sequence[str], *, tenant_id: str,
    profile: str, read: Mapping[str, Any],
) -> dict[str, float]:
    """BM25 of the given current chunks in the reader's scope (absent: no query term in it, or out of scope)."""
    return send_lexical_scores(tx, weights, params, chunk_ids, tenant_id=tenant_id, profile=profile, read=read)()


def send_lexical_scores(
    tx: Session, weights: Mapping[str, Any], params: LexicalParams, chunk_ids: Sequence[str], *, tenant_id: str,
    profile: str, read: Mapping[str, Any],
) -> Callable[[], dict[str, float]]:
    """``lexical_scores`` sent now, read when the returned function is called (in a pipelined search, after COMMIT:
    the rows come back with it)."""
    if not chunk_ids:
        return dict
    sent = tx.submit(
        "lexical_scores_of",
        {
            **read,
            **weights,
            "k1": params.bm25_k1,
            "b": params.bm25_b,
            "chunk_ids": list(chunk_ids),
            "tenant_id": tenant_id,
            "profile": profile,
        },
    )
    return lambda: {r["chunk_id"]: float(r["bm25"]) for r in sent.fetchall()}


def backfill_lexical_index(
    db: Database, *, batch: int = BACKFILL_BATCH, on_batch: Callable[[int], None] | None = None
) -> int:
    """Write the lexical rows of chunks that have none (indexed before migration 0022) and reconcile their
    documents' statistics; returns how many rows were written.

    Runs only while migration 0022's ``lexical_backfill`` row exists, walks chunk ids upward from where it
    stands (each batch is one transaction that also records its position, so a crash resumes exactly) and
    deletes the row at the end. ``on_batch`` gets the running total after each batch.
    """
    written = 0
    while (position := db.fetch_one("lexical_backfill_position", {})) is not None:
        after = position["after_chunk_id"]
        rows = db.fetch_all("lexical_chunks_missing", {"after_chunk_id": after, "limit": batch})
        with db.transaction() as tx:
            if not rows:
                tx.execute("lexical_backfill_finish", {})
                break
            groups: dict[tuple[str, str, str, int, str, str], list[Any]] = {}
            for r in rows:
                key = (r["tenant_id"], r["document_id"], r["profile"], r["version_number"], r["model"],
                       r["lexical_analyzer"])
                groups.setdefault(key, []).append(_Row(r))
            for (tenant, document, profile, version, model, analyzer), chunks in groups.items():
                key = {"tenant_id": tenant, "document_id": document, "profile": profile, "version_number": version}
                write_lexical(tx, [key] * len(chunks), chunks, analyzer_for(model, analyzer))
            documents: dict[tuple[str, str], set[str]] = {}
            for tenant, document, profile, *_ in groups:
                documents.setdefault((tenant, profile), set()).add(document)
            for (tenant, profile), names in sorted(documents.items()):
                tx.fetch_one("lexical_stats_reconcile",
                             {"tenant_id": tenant, "profile": profile, "document_ids": sorted(names)})
            tx.execute("lexical_backfill_advance", {"after_chunk_id": rows[-1]["chunk_id"]})
        written += len(rows)
        if on_batch is not None:
            on_batch(written)
    return written


class _Row:
    """A chunk row read back from the database, shaped like a chunk for ``lexical_rows``."""

    def __init__(self, row: Mapping[str, Any]) -> None:
        self.chunk_id = row["chunk_id"]
        self.heading_path = tuple(row["heading_path"] or ())
        self.text = row["text"]
        self.content_digest = row["content_digest"]
        self.context_title = row.get("context_title")  # NULL unless the profile embeds context


__all__ = ["analyzer_for", "backfill_lexical_index", "hits_query", "lexical_scores", "lexical_search", "profile_analyzer",
           "query_weights", "write_lexical"]
