"""Search: a tenant's best chunks under the ACTIVE profile, over CURRENT versions only (invariant 4).

Three modes (``mode``; default: the profile's ``search_mode``, hybrid): dense (cosine, below), lexical
(BM25 over the lexical index, resources/lexical.py) and hybrid (both sides' candidates fused as the
profile's ``fusion`` says: the weighted sum of both scores with ``lexical_weight``, or reciprocal rank fusion
with ``rrf_k``; pipelines/domain/lexical.py). The lexical side joins the same search pointer and
filters the same tenant and profile as the vectors.

Only chunks whose (tenant, document, profile, version) is named by a search pointer can match, so a
half-written or superseded version is never returned and a failed new version leaves the old one in
place. Filtering and HNSW do not mix by default (the graph walk returns ef_search candidates, and the
filter may drop them all), so search runs in a transaction with pgvector 0.8 iterative scans
(``relaxed_order``) and re-orders the hits exactly by distance. If the walk stops at
``max_scan_tuples`` with fewer than k hits (a small tenant among big ones), an exhaustive query over the
tenant's current chunks gives the exact answer, which is cheap precisely because the tenant is small.

A profile with an HTTP reranker (migration 0048, resources/http_reranker.py) has the ``rerank_candidates`` best
chunks of that answer (fused, and already within the caller's permissions and filters: nothing else is sent)
reordered by the reranker before the k best are returned. A reranker that fails (timeout, rate limit, 5xx after
its retries, an answer that fails the checks) costs the search nothing but the order: the unreranked hits come
back with ``rerank_error`` set to the stable code.
"""

from __future__ import annotations

import dataclasses
import logging
import os
import threading
import time
import weakref
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from typing import Any

import httpx

from pipelines.domain.errors import (EmbeddingInvalidResponse, EmbeddingUnavailable, InternalError, InvalidRequest,
                                     KbindexError)
from pipelines.domain.identifiers import validate_tenant
from pipelines.domain.lexical import MODES, LexicalParams, check_params, fuse, fuse_rrf
from pipelines.domain.metadata import NO_FILTERS, ReadScope
from resources.database import Database, Session
from resources.embedder import Embedder, ProfileEmbedders, checked_embed
from resources.lexical import query_weights, send_lexical_scores, send_lexical_search
from resources.lexical import profile_analyzer

MAX_K = 1000
DEFAULT_MAX_SCAN_TUPLES = 20_000
EXACT_SCOPE_POINTERS = 1_000
EXACT_SCOPE_CHUNKS = 5_000
"""A filtered search whose filters keep at most this many documents and chunks of the tenant measures them
exhaustively instead of walking the graph (``search_hits_scoped``): the walk must pass ~k / selectivity chunks
of the whole index to find k in scope. bench/scale/search.py at 20k chunks (10 queries, a loaded 2-core
machine), dept=legal keeping 67 of the biggest tenant's 5,560 current chunks: walk p50 35 ms, p95 231 ms;
exhaustive p50 11 ms, p95 22 ms (recall@10 1.0 both). At 1M chunks (100 queries), 2,752 of 285,088: walk
p50 90 ms, p95 161 ms, recall@10 0.944; exhaustive (with the metadata index of migration 0034) p50 11 ms,
p95 16 ms, recall 1.0. A filter keeping a tenth of that tenant (28.5k chunks) walks: the probe costs it
p50 11 vs 5 ms."""
WALK_MIN_SHARE = 0.01
WALK_MIN_CHUNKS = EXACT_SCOPE_CHUNKS
"""An unfiltered dense search walks the graph, whatever the planner prefers, when the tenant's current chunks are at
least this share of the chunk table's rows and at least this many. The planner underestimates how many of a
tenant's rows a search pointer names (its join estimate at 1M: 1,028 of t-small's 25,552 current chunks), so it
expects the walk to pass ~25x the tuples it does and reads the tenant exhaustively. ``python -m bench.scale.search
--chunks 1000000 --modes dense --no-lexical --text-chars 1000`` (its "planner alone" row is the rule switched off,
side by side): t-small's 25,552 current chunks (2.55% of the rows) p50 3.2 ms, p95 7.3 ms, recall@10 0.973
walking against 28.2 / 36.0 ms, 1.0 exhaustive. t-tiny's 2,760 (0.28%) stays exhaustive (p50 4.1 ms); walked, it
took p50 25.5 ms (one-off script: the walk passes ~k / share tuples). 1% lies between the two measured sizes and is
not measured itself. A walk that comes back short still ends in the exact fallback."""
WIDE_SCOPE_SECONDS = float(os.environ.get("KBINDEX_WIDE_SCOPE_SECONDS", "60"))
"""How long this process remembers that a filtered scope (tenant, profile, filters, reader) was too wide for the
exact path: its next searches walk the graph at once instead of probing it again. The probe (``search_hits_scoped``)
reads up to EXACT_SCOPE_POINTERS + 1 pointers in scope before it can say so (a date range, which the metadata index
cannot answer, reads the tenant's pointers until then). At 1M chunks (``python -m bench.scale.search --chunks 1000000
--modes dense --no-lexical --text-chars 1000``, its "product" and "product, again" rows side by side), the biggest
tenant with a 10% date range: p50 69.0 ms probing, 6.5 ms remembered (the walk alone 6.1); dept=hr 15.8 and 7.1 ms.
A scope that shrinks meanwhile is walked until the verdict expires, and a walk that comes back short still ends in
the exact fallback; 0 turns the memory off."""
MAX_QUERY_CHARS = 10_000
PROFILE_TRIES = 3
"""A search whose profile changed under it starts over (``ActiveProfiles``) at most this many times in all."""
log = logging.getLogger("kbindex")


@dataclass(frozen=True)
class SearchHit:
    """One chunk of a current version with its score: cosine similarity (dense), BM25 (lexical) or fused (hybrid)."""

    document_id: str
    version_number: int
    heading_path: tuple[str, ...]
    text: str
    score: float
    chunk_id: str
    page: int | None
    metadata: dict[str, Any] = field(default_factory=dict)
    """The version's metadata."""

    def to_dict(self) -> dict[str, Any]:
        out = asdict(self)
        out["heading_path"] = list(self.heading_path)
        return out


class SearchHits(list[SearchHit]):
    """The hits, best first, and what the rerank stage did: ``reranked`` None (the profile has no reranker), True
    (the order is the reranker's) or False (it failed: the unreranked order, ``rerank_error`` its stable code)."""

    reranked: bool | None = None
    rerank_error: str | None = None

    def status(self) -> dict[str, Any]:
        """What the API and the CLI show besides the hits."""
        return {"reranked": self.reranked, "rerank_error": self.rerank_error}


class WideScopes:
    """Filtered scopes found too wide for the exact path, each until WIDE_SCOPE_SECONDS after its probe said so
    (per process, at most ``size`` remembered; thread-safe)."""

    def __init__(self, seconds: float, size: int = 4096) -> None:
        self.seconds, self.size = seconds, size
        self._until: dict[tuple[Any, ...], float] = {}
        self._lock = threading.Lock()

    def known(self, key: tuple[Any, ...]) -> bool:
        until = self._until.get(key)
        return until is not None and until > time.monotonic()

    def remember(self, key: tuple[Any, ...]) -> None:
        if self.seconds <= 0:
            return
        with self._lock:
            now = time.monotonic()
            if len(self._until) >= self.size:  # expired verdicts go first; if none expired, all of them
                self._until = {k: u for k, u in self._until.items() if u > now}
                if len(self._until) >= self.size:
                    self._until.clear()
            self._until[key] = now + self.seconds


WIDE_SCOPES = WideScopes(WIDE_SCOPE_SECONDS)


def scope_key(db: Database, scope: dict[str, Any], visible: dict[str, Any]) -> tuple[Any, ...]:
    """What a filtered scope's verdict is remembered under: the database, tenant, profile, filters and reader."""
    return (db.url, scope["tenant_id"], scope["profile"], visible["filters"], visible["see_all"],
            tuple(sorted(visible["principals"])))


def ef_search_for(k: int) -> int:
    """Initial candidate list: comfortably above k (recall), within pgvector's 1..1000.

    200 at least: at 1M chunks (bench/scale/search.py, the m = 24 graph of migration 0021) a tenant
    holding 285k current chunks got recall@10 0.933 of exact at 100 and 0.953 at 200 (p95 6.8 vs 9.0 ms;
    400: 0.973 at p95 15 ms); a 75k-chunk tenant 0.969 at 100 and 0.985 at 200.
    """
    return max(200, min(1000, 2 * k))


def search(
    db: Database,
    embedder: Embedder | ProfileEmbedders,
    query: str,
    *,
    tenant_id: str,
    k: int = 10,
    mode: str | None = None,
    max_scan_tuples: int = DEFAULT_MAX_SCAN_TUPLES,
    read: ReadScope | None = None,
    fusion: str | None = None,
    reranker: Any = None,
) -> SearchHits:
    """The ``k`` best chunks of ``tenant_id``'s current versions for ``query``, best first.

    ``mode``: ``dense`` (cosine), ``lexical`` (BM25) or ``hybrid`` (both, fused as pipelines/domain/lexical.py
    says, with the profile's parameters); None = the active profile's ``search_mode`` (hybrid unless a
    migration says otherwise). Each hit's ``score`` is that mode's: cosine, BM25 or the fused score.
    The query is embedded through ``checked_embed`` with the active profile's model and dimension, so
    an embedder that does not match the index is refused (EmbeddingInvalidResponse) rather than
    producing meaningless scores. InvalidRequest for a bad tenant, k, mode or empty query, or no active profile;
    InternalError if the active profile changed under each of its PROFILE_TRIES tries (``ActiveProfiles``).
    An HTTP provider embeds the query within its short query budget (HttpEmbedder.for_queries,
    $KBINDEX_SEARCH_EMBED_SECONDS): a provider that is down or rate limiting fails the search in seconds with
    its typed error (EMBEDDING_RATE_LIMITED, EMBEDDING_TIMEOUT, EMBEDDING_UNAVAILABLE).

    ``read``: on whose behalf, with which metadata filters (pipelines/domain/metadata.py ``ReadScope``). The
    default sees only versions without an allow list (fail-closed); ``EVERYTHING`` is the operator override.
    Scope and filters are applied inside each mode's SQL, before k (DESIGN.md invariant 8).

    ``fusion``: ``weighted`` or ``rrf`` for this query instead of the profile's (``python -m bench.retrieval``
    compares both on one index); None = the profile's ``fusion``.

    ``reranker``: overrides the profile's HTTP reranker (an object with ``rerank(query, texts)``); the profile
    decides whether and over how many candidates to rerank. Returns SearchHits (a list, with the rerank status).
    """
    validate_tenant(tenant_id)
    if not isinstance(k, int) or not 1 <= k <= MAX_K:
        raise InvalidRequest(f"k must be between 1 and {MAX_K}")
    if not query or not query.strip():
        raise InvalidRequest("the query is empty")
    if len(query) > MAX_QUERY_CHARS:
        raise InvalidRequest(f"the query is longer than {MAX_QUERY_CHARS} characters")
    if mode is not None and mode not in MODES:
        raise InvalidRequest(f"mode must be one of {', '.join(MODES)}")
    profile = ACTIVE_PROFILES.get(db)
    fresh = profile is None  # read just now, not remembered
    if profile is None:
        profile = active_profile(db)
    for _ in range(PROFILE_TRIES):
        try:
            hits, active = _search_under(db, embedder, profile, query, tenant_id, k, mode, max_scan_tuples, read,
                                         fusion, reranker)
        except EmbeddingInvalidResponse:
            if fresh:
                raise
            # The caller's embedder may be for a profile activated since this process last read one: read it now.
            profile, fresh = active_profile(db), True
            continue
        if active == profile:
            return hits
        ACTIVE_PROFILES.put(db, active)  # activated or changed since this process last read it: start over
        profile, fresh = active or active_profile(db), True
    raise InternalError(f"the active profile changed during each of {PROFILE_TRIES} tries of this search: "
                        "search again")


class ActiveProfiles:
    """The active profile this process last read, per Database object. A search starts from it and reads the profile
    again inside its own transaction, with its first statements (no wait of its own); if it changed there, the search
    starts over under the new one. So a search never answers under a profile that was not active at its snapshot,
    and, once this process has seen the profile, reading it costs no round trip of its own (one of the ~4.3 a dense
    search paid over a slow link: ``python -m bench.search_link``). Held weakly: a Database (or a stand-in such as
    bench.chaos's per-search snapshot reader) takes its entry with it when it goes."""

    def __init__(self) -> None:
        self._by_db: weakref.WeakKeyDictionary[Any, dict[str, Any]] = weakref.WeakKeyDictionary()

    def get(self, db: Database) -> dict[str, Any] | None:
        return self._by_db.get(db)

    def put(self, db: Database, profile: dict[str, Any] | None) -> None:
        if profile is None:
            self._by_db.pop(db, None)
        else:
            self._by_db[db] = profile


ACTIVE_PROFILES = ActiveProfiles()


class TenantSizes:
    """Each tenant's ``search_tenant_size`` row as this process last read it, per Database object (at most ``size``
    tenants each, the least recently read going first; thread-safe). A dense search chooses its plan from it and
    reads the size again with COMMIT, for the next search, so the size costs no wait of its own: one of the ~2.2 a
    dense search paid over a slow link (``python -m bench.search_link``). The size only chooses a plan, never the
    answer: a remembered size too small runs the exhaustive statement, which is exact anyway; one too big walks the
    graph, and a walk that comes back short runs the exhaustive statement again (``_search_under``)."""

    def __init__(self, size: int = 4096) -> None:
        self.size = size
        self._by_db: weakref.WeakKeyDictionary[Any, OrderedDict[tuple[str, str], dict[str, Any]]] = \
            weakref.WeakKeyDictionary()
        self._lock = threading.Lock()

    def get(self, db: Database, scope: dict[str, Any]) -> dict[str, Any] | None:
        with self._lock:
            return self._by_db.get(db, {}).get((scope["tenant_id"], scope["profile"]))

    def put(self, db: Database, scope: dict[str, Any], row: dict[str, Any]) -> None:
        with self._lock:
            sizes = self._by_db.setdefault(db, OrderedDict())
            sizes[(scope["tenant_id"], scope["profile"])] = row
            sizes.move_to_end((scope["tenant_id"], scope["profile"]))
            while len(sizes) > self.size:
                sizes.popitem(last=False)


TENANT_SIZES = TenantSizes()


class _SentSize:
    """``search_tenant_size``'s cursor, sent with a search's first statements; its row is read once, where the
    search first needs it (inside the transaction) or after COMMIT (to remember it)."""

    def __init__(self, cursor: Any) -> None:
        self._cursor, self._row, self._read = cursor, None, False

    def fetchone(self) -> dict[str, Any] | None:
        if not self._read:
            self._row, self._read = self._cursor.fetchone(), True
        return self._row


def active_profile(db: Database) -> dict[str, Any]:
    """The active profile, read now and remembered for this process's next searches (InvalidRequest if none is)."""
    profile = db.fetch_one("index_profile_active")
    if profile is None:
        raise InvalidRequest("no active index profile: activate one with `kbindex profile activate NAME`")
    ACTIVE_PROFILES.put(db, profile)
    return profile


def _search_under(
    db: Database, embedder: Embedder | ProfileEmbedders, profile: dict[str, Any], query: str, tenant_id: str, k: int,
    mode: str | None, max_scan_tuples: int, read: ReadScope | None, fusion: str | None, reranker: Any,
) -> tuple[SearchHits, dict[str, Any] | None]:
    """``search`` under ``profile``, and the profile active at the search's snapshot (None: none is)."""
    params = LexicalParams.of(profile)
    if fusion is not None:
        try:
            params = check_params(dataclasses.replace(params, fusion=fusion))
        except ValueError as exc:
            raise InvalidRequest(str(exc)) from exc
    mode = mode or params.search_mode
    candidates = int(profile.get("rerank_candidates") or 0) if profile.get("rerank_url") else 0
    fetch = max(k, candidates)  # the rerank stage picks from the candidates, then k are returned
    vector = None
    if mode != "lexical":
        if isinstance(embedder, ProfileEmbedders):  # a long-lived caller: whichever profile is active now
            embedder = embedder.for_profile(profile)
        for_queries = getattr(embedder, "for_queries", None)
        if callable(for_queries):  # a remote provider: a query waits seconds at most, not indexing's minutes
            embedder = for_queries()
        vector = checked_embed(
            embedder, [query], expected_model=profile["model"], expected_dim=profile["dimension"], batch_size=1
        )[0]
    scope = {"tenant_id": tenant_id, "profile": profile["name"]}
    visible = (read or ReadScope()).params()
    visible_key = scope_key(db, scope, visible) if visible["filters"] != NO_FILTERS else None
    analyze = profile_analyzer(profile) if mode != "dense" else None  # the analysis its lexical rows were made with
    # Pipelined: BEGIN, the snapshot and the settings wait for nothing; the first fetch waits for them all. Dense and
    # lexical send their last statement and read it after COMMIT, which it comes back with: one wait less. Should it
    # come back short (the graph walk, or the lexical probes under an allow list), the search runs once more, in a
    # snapshot of its own, with the exhaustive statement, as the transaction would have run next.
    for exhaustive in (False, True):
        with db.transaction(pipelined=True) as tx:
            tx.submit("search_snapshot")
            # Before any other statement of the transaction, so each is planned for its own parameters: without it
            # lexical_stats_get ran psycopg's prepared generic plan 30 times in 35
            # (tests/integration/test_search_plan_cache.py).
            depth = fetch if mode != "hybrid" else hybrid_depth(fetch)
            tx.submit("search_settings", {"ef_search": ef_search_for(depth),
                                          "max_scan_tuples": max(1, int(max_scan_tuples))})
            active = tx.submit("index_profile_active")  # read with the first wait; compared by the caller
            # Sent now: a hybrid reads it with its lexical statistics' wait, a dense search after COMMIT (it plans from
            # the size the last search read); never a wait of its own.
            sized = _SentSize(tx.submit("search_tenant_size", scope)) \
                if mode != "lexical" and visible["filters"] == NO_FILTERS and not exhaustive else None
            # A dense search plans from the size this process last read (the hybrid's waits for its statistics
            # anyway): no wait before its last statement, which comes back with COMMIT.
            known = TENANT_SIZES.get(db, scope) if sized is not None and mode == "dense" else None
            weights = query_weights(tx, analyze, query, **scope) if analyze is not None else None
            if mode == "dense":
                read_rows = _exact_rows(tx, vector, scope, visible, fetch) if exhaustive else \
                    _dense_rows(tx, vector, scope, visible, fetch, visible_key, sized, settle=False, known=known)
            elif mode == "lexical":
                read_rows = send_lexical_search(tx, weights, params, k=fetch, read=visible, exhaustive=exhaustive,
                                                settle=False, **scope) if weights else list
            else:
                fuse_rows = _hybrid_rows(tx, vector, weights, params, scope, visible, fetch, visible_key, sized)
        active_now = active.fetchone()  # with the COMMIT at the latest
        if sized is not None:  # read now, or with the first statements: the next search plans from it
            TENANT_SIZES.put(db, scope, sized.fetchone() or {})
        if mode == "hybrid":
            rows, scores = fuse_rows()  # the cross-scores came with the COMMIT
            break
        got = read_rows()
        if got is not None:
            rows = got
            scores = {r["chunk_id"]: 1.0 - float(r["distance"]) if mode == "dense" else float(r["bm25"])
                      for r in rows}
            break
    hits = [
        SearchHit(
            document_id=r["document_id"],
            version_number=r["version_number"],
            heading_path=tuple(r["heading_path"] or ()),
            text=r["text"],
            score=scores[r["chunk_id"]],
            chunk_id=r["chunk_id"],
            page=r["page"],
            metadata=dict(r["metadata"] or {}),
        )
        for r in rows
    ]
    hits.sort(key=lambda h: (-h.score, h.chunk_id))
    out = SearchHits(hits[:k])
    if active_now != profile:  # the caller starts over: no reranker call for an answer it throws away
        return out, active_now
    if candidates and hits:
        if reranker is None:
            from resources.http_reranker import reranker_for_profile

            reranker = reranker_for_profile(profile)
        out = _rerank(reranker, query, hits[:candidates], hits[candidates:], k)
    return out, active_now


def _rerank(reranker: Any, query: str, candidates: list[SearchHit], rest: list[SearchHit], k: int) -> SearchHits:
    """The candidates in the reranker's order (any it left out after, in their order), then the rest, k of them;
    each hit keeps its retrieval score. On a reranker failure the unreranked order with its stable code."""
    try:
        try:
            ranked = reranker.rerank(query, [h.text for h in candidates])
        except httpx.HTTPError as exc:  # what the transport does not map itself (a malformed URL, say)
            raise EmbeddingUnavailable(f"the reranker could not be asked ({type(exc).__name__})") from exc
    except KbindexError as exc:
        log.warning("rerank failed (%s): returning the unreranked order", exc.code)
        out = SearchHits((candidates + rest)[:k])
        out.reranked, out.rerank_error = False, exc.code
        return out
    order = [i for i, _ in ranked]
    ranked_ids = set(order)
    order += [i for i in range(len(candidates)) if i not in ranked_ids]
    out = SearchHits(([candidates[i] for i in order] + rest)[:k])
    out.reranked = True
    return out


def _dense_rows(tx: Session, vector: Any, scope: dict[str, Any], visible: dict[str, Any], k: int,
                visible_key: tuple[Any, ...] | None = None, sized: Any = None, *,
                settle: bool = True, known: dict[str, Any] | None = None) -> Callable[[], list[dict[str, Any]] | None]:
    """The k nearest current chunks in scope: exhaustive over the scope when filters keep only a few documents,
    otherwise HNSW, iterative (exhaustive when the walk came back short). ``search_settings`` must have run in
    ``tx``. ``visible_key``: the filtered scope's key in WIDE_SCOPES (None: probe whatever was remembered).
    ``sized``: the cursor of a ``search_tenant_size`` already sent (None: tenant_size asks).

    The last statement is sent, not read: the returned function reads its rows. ``settle``: it is called inside
    the transaction and runs the exhaustive search itself when the walk came back short; otherwise it may be
    called after COMMIT (the rows came with it) and returns None when the walk came back short. ``known``: the
    tenant's size as last read (TENANT_SIZES), to plan from instead of waiting for ``sized``."""
    params = {"query": vector, "k": k, **scope, **visible}
    if visible["filters"] != NO_FILTERS and not (visible_key and WIDE_SCOPES.known(visible_key)):
        scoped = tx.fetch_all("search_hits_scoped", {**params, "max_scope_pointers": EXACT_SCOPE_POINTERS,
                                                     "max_scope_chunks": EXACT_SCOPE_CHUNKS})
        if scoped and scoped[0]["exact"]:
            return lambda: [r for r in scoped if r["chunk_id"] is not None]
        if visible_key:
            WIDE_SCOPES.remember(visible_key)
    size = None if visible["filters"] != NO_FILTERS else known if known is not None else tenant_size(tx, scope, sized)
    if size is not None and size.get("tenant_chunks") is not None and size["tenant_chunks"] < k:
        return _exact_rows(tx, vector, scope, visible, k)  # fewer than k in all: a walk would come back short
    walked = send_walk(tx, params, walk=size is not None and prefers_walk(size))

    def rows() -> list[dict[str, Any]] | None:
        got = walked.fetchall()
        if len(got) >= k:
            return got
        return tx.fetch_all("search_hits_exact", params) if settle else None

    return rows


def _exact_rows(tx: Session, vector: Any, scope: dict[str, Any], visible: dict[str, Any],
                k: int) -> Callable[[], list[dict[str, Any]]]:
    """The exhaustive search ``_dense_rows`` falls back to, sent on its own (a search whose walk came back short
    after COMMIT runs again with it); the returned function reads its rows."""
    return tx.submit("search_hits_exact", {"query": vector, "k": k, **scope, **visible}).fetchall


def walk_preferred(tx: Session, scope: dict[str, Any], sized: Any = None) -> bool:
    """Whether the tenant is big enough a share of the graph that walking it beats measuring it (WALK_MIN_SHARE).
    ``sized``: the cursor of a ``search_tenant_size`` already sent for ``scope`` (None: asked now)."""
    return prefers_walk(tenant_size(tx, scope, sized))


def tenant_size(tx: Session, scope: dict[str, Any], sized: Any = None) -> dict[str, Any]:
    """``search_tenant_size``'s row: read from ``sized`` (its cursor, already sent) or asked now."""
    return (sized.fetchone() if sized is not None else tx.fetch_one("search_tenant_size", scope)) or {}


def prefers_walk(size: dict[str, Any]) -> bool:
    """``walk_preferred`` of a ``search_tenant_size`` row."""
    chunks, rows = size.get("tenant_chunks"), size.get("index_rows")
    return bool(chunks and rows and chunks >= WALK_MIN_CHUNKS and chunks >= WALK_MIN_SHARE * rows)


def walk_rows(tx: Session, params: dict[str, Any], *, walk: bool) -> list[dict[str, Any]]:
    """``search_hits``: the planner's plan, or (``walk``) with sorts forbidden for it alone, so it walks the graph."""
    return send_walk(tx, params, walk=walk).fetchall()


def send_walk(tx: Session, params: dict[str, Any], *, walk: bool) -> Any:
    """``walk_rows`` sent without reading it: its cursor (sorts allowed again behind it, in the same wait)."""
    if not walk:
        return tx.submit("search_hits", params)
    tx.submit("search_sort_enabled", {"enable_sort": "off"})
    sent = tx.submit("search_hits", params)
    tx.submit("search_sort_enabled", {"enable_sort": "on"})
    return sent


def hybrid_depth(k: int) -> int:
    """Candidates each side brings to the fusion: at least 50, and k. Measured on cmrc2018-dev at k=50
    (bench/retrieval): a depth of 2k widens the dense graph walk, hybrid p50 +17.8 ms over dense; depth k
    +6.7 ms (p95 +7.4 ms); nDCG@10 0.9667 both."""
    return min(MAX_K, max(50, k))


def _hybrid_rows(
    tx: Session, vector: Any, weights: dict[str, Any] | None, params: LexicalParams, scope: dict[str, Any],
    visible: dict[str, Any], k: int, visible_key: tuple[Any, ...] | None = None, sized: Any = None,
) -> Callable[[], tuple[list[dict[str, Any]], dict[str, float]]]:
    """Both sides' candidates fused by the profile's ``fusion``: the same scores the quality gate computes
    in memory. ``weighted``: each candidate scored by BOTH measures (the lexical rows carry their cosine,
    the dense ones get their BM25 by primary key). ``rrf``: each side's own ranking of its own candidates.
    The lexical statement is sent before the dense side runs, so in a pipelined search both share one wait; the
    dense candidates' BM25 is sent, not read: the returned function reads it (after COMMIT, in a pipelined
    search) and returns the fused rows and scores."""
    depth = hybrid_depth(k)
    lexical_rows = send_lexical_search(tx, weights, params, k=depth, read=visible, query_vector=vector,
                                       **scope) if weights else list
    dense = _dense_rows(tx, vector, scope, visible, depth, visible_key, sized)() or []
    lexical = lexical_rows() or []
    rows = {r["chunk_id"]: r for r in dense}
    rows.update({r["chunk_id"]: r for r in lexical if r["chunk_id"] not in rows})
    bm25 = {r["chunk_id"]: float(r["bm25"]) for r in lexical}
    if params.fusion == "rrf":  # ranks only: no cross-scoring query
        ranked = fuse_rrf({r["chunk_id"]: 1.0 - float(r["distance"]) for r in dense}, bm25, params.rrf_k,
                          params.lexical_weight)[:k]
        return lambda: ([rows[cid] for cid, _ in ranked], dict(ranked))
    cosines = {cid: 1.0 - float(r["distance"]) for cid, r in rows.items()}
    missing = [r["chunk_id"] for r in dense if r["chunk_id"] not in bm25] if weights else []
    cross = send_lexical_scores(tx, weights or {}, params, missing, read=visible, **scope)

    def fused() -> tuple[list[dict[str, Any]], dict[str, float]]:
        ranked = fuse(cosines, {**bm25, **cross()}, params.lexical_weight)[:k]
        return [rows[cid] for cid, _ in ranked], dict(ranked)

    return fused
