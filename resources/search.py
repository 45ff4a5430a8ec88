"""Search: a tenant's nearest chunks under the ACTIVE profile, over CURRENT versions only (invariant 4).

Only chunks whose (tenant, document, profile, version) is named by a search pointer can match, so a
half-written or superseded version is never returned and a failed new version leaves the old one in
place. Filtering and HNSW do not mix by default (the graph walk returns ef_search candidates, and the
filter may drop them all), so search runs in a transaction with pgvector 0.8 iterative scans
(``relaxed_order``) and re-orders the hits exactly by distance. If the walk stops at
``max_scan_tuples`` with fewer than k hits (a small tenant among big ones), an exhaustive query over the
tenant's current chunks gives the exact answer, which is cheap precisely because the tenant is small.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any

from pipelines.domain.errors import InvalidRequest
from pipelines.domain.identifiers import validate_tenant
from resources.database import Database
from resources.embedder import Embedder, ProfileEmbedders, checked_embed

MAX_K = 1000
DEFAULT_MAX_SCAN_TUPLES = 20_000
MAX_QUERY_CHARS = 10_000


@dataclass(frozen=True)
class SearchHit:
    """One chunk of a current version, with its cosine similarity to the query (1 = same direction)."""

    document_id: str
    version_number: int
    heading_path: tuple[str, ...]
    text: str
    score: float
    chunk_id: str
    page: int | None

    def to_dict(self) -> dict[str, Any]:
        out = asdict(self)
        out["heading_path"] = list(self.heading_path)
        return out


def ef_search_for(k: int) -> int:
    """Initial candidate list: comfortably above k (recall), within pgvector's 1..1000.

    100 at least: at 1M chunks it holds recall@10 >= 0.95 of exact for big and mid-sized tenants
    (64 gave 0.95-0.97) at p95 ~15 ms (bench/scale/search.py, with the m = 24 graph of migration 0021).
    """
    return max(100, min(1000, 2 * k))


def search(
    db: Database,
    embedder: Embedder | ProfileEmbedders,
    query: str,
    *,
    tenant_id: str,
    k: int = 10,
    max_scan_tuples: int = DEFAULT_MAX_SCAN_TUPLES,
) -> list[SearchHit]:
    """The ``k`` chunks of ``tenant_id``'s current versions nearest to ``query``, best first.

    The query is embedded through ``checked_embed`` with the active profile's model and dimension, so
    an embedder that does not match the index is refused (EmbeddingInvalidResponse) rather than
    producing meaningless scores. InvalidRequest for a bad tenant, k or empty query, or no active profile.
    """
    validate_tenant(tenant_id)
    if not isinstance(k, int) or not 1 <= k <= MAX_K:
        raise InvalidRequest(f"k must be between 1 and {MAX_K}")
    if not query or not query.strip():
        raise InvalidRequest("the query is empty")
    if len(query) > MAX_QUERY_CHARS:
        raise InvalidRequest(f"the query is longer than {MAX_QUERY_CHARS} characters")
    profile = db.fetch_one("index_profile_active")
    if profile is None:
        raise InvalidRequest("no active index profile: activate one with `kbindex profile activate NAME`")
    if isinstance(embedder, ProfileEmbedders):  # a long-lived caller: whichever profile is active now
        embedder = embedder.for_profile(profile)
    vector = checked_embed(
        embedder, [query], expected_model=profile["model"], expected_dim=profile["dimension"], batch_size=1
    )[0]
    params = {"query": vector, "tenant_id": tenant_id, "profile": profile["name"], "k": k}
    with db.transaction() as tx:
        tx.fetch_one(
            "search_settings", {"ef_search": ef_search_for(k), "max_scan_tuples": max(1, int(max_scan_tuples))}
        )
        rows = tx.fetch_all("search_hits", params)
        if len(rows) < k:
            rows = tx.fetch_all("search_hits_exact", params)
    hits = [
        SearchHit(
            document_id=r["document_id"],
            version_number=r["version_number"],
            heading_path=tuple(r["heading_path"] or ()),
            text=r["text"],
            score=1.0 - float(r["distance"]),
            chunk_id=r["chunk_id"],
            page=r["page"],
        )
        for r in rows
    ]
    hits.sort(key=lambda h: (-h.score, h.chunk_id))
    return hits
