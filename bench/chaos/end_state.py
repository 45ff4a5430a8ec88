"""The chaos soak's end checks on documents: pointers at the newest version, and what search shows.

``pointers``: for every document and every profile its newest version has a task in, the newest version
(content or tombstone) is what the pointer names when that task SUCCEEDED; when it did not (DEAD with a code:
a wrong-dimension answer, attempts exhausted by kills), the newest version is reported by kind and code, and the
soak's other check (pointer = newest SUCCEEDED version) holds the pointer to the last one that did.

``ledger``: the bench's own record of what it published and deleted: every document's newest version in the
database is the one the bench was last acknowledged, a tombstone exactly when its last operation was a delete.

``search_sweep``: per tenant, one search per mode (dense, lexical, hybrid) with k = MAX_K, after quiescence.
When the tenant's current chunks number at most MAX_K, dense and hybrid return every current chunk (the dense
walk comes back short, and the exhaustive query answers), so the sweep is complete: a document whose pointer
names a tombstone must be in none of the three, a document whose pointer names a content version with chunks in
all three (lexical: when the query's words are in every chunk, as in the generated documents), and every hit's
version must be its pointer's.
"""

from __future__ import annotations

from collections import Counter
from typing import Any

MODES = ("dense", "lexical", "hybrid")
EXAMPLES = 5


def _sql(url: str, name: str, params: dict[str, Any] | None = None) -> list[tuple[Any, ...]]:
    from bench.chaos import _sql as run

    return run(url, name, params)


def newest_versions(url: str) -> dict[tuple[str, str], tuple[int, str]]:
    """(tenant, document) -> (newest version number, its kind)."""
    return {(t, d): (v, k) for t, d, v, k in _sql(url, "bench_chaos_newest_versions")}


def pointers(url: str) -> dict[str, Any]:
    rows = _sql(url, "bench_chaos_newest_version_pointers")
    wrong: list[dict[str, Any]] = []
    not_succeeded: Counter = Counter()
    at_newest: Counter = Counter()
    for tenant, doc, version, kind, profile, succeeded, status, code, pointer in rows:
        if succeeded:
            if pointer != version:
                wrong.append({"tenant": tenant, "document": doc, "profile": profile, "newest": version,
                              "kind": kind, "pointer": pointer})
            else:
                at_newest[kind] += 1
        else:
            not_succeeded[f"{kind} {status} {code or ''}".strip()] += 1
    return {"documents_at_newest_version_by_kind": dict(at_newest), "pointer_not_at_newest_succeeded": len(wrong),
            "newest_version_not_succeeded": dict(not_succeeded), "examples": wrong[:EXAMPLES]}


def ledger(newest: dict[tuple[str, str], tuple[int, str]], expected: dict[tuple[str, str], tuple[int, bool]]) -> dict[str, Any]:
    """The bench's acknowledged (version, deleted) per document against the database's newest version."""
    wrong = []
    for key, (version, deleted) in expected.items():
        got = newest.get(key)
        if got != (version, "tombstone" if deleted else "content"):
            wrong.append({"tenant": key[0], "document": key[1], "acknowledged": version, "deleted": deleted, "newest": got})
    return {"documents": len(expected), "deleted_at_end": sum(1 for _, d in expected.values() if d),
            "newest_not_acknowledged": len(wrong), "examples": wrong[:EXAMPLES]}


def search_sweep(url: str, model: str, tenants: list[str], lexical_query: str, lexical_complete: bool) -> dict[str, Any]:
    """One search per tenant and mode over everything current; see the module docstring."""
    from resources.database import Database
    from resources.embedder import FakeEmbedder
    from resources.search import MAX_K, search

    pointed: dict[str, dict[str, tuple[int, str, int]]] = {t: {} for t in tenants}
    for tenant, doc, version, kind, chunks in _sql(url, "bench_chaos_pointed_versions", {"tenants": tenants}):
        pointed[tenant][doc] = (version, kind, chunks)
    embedder = FakeEmbedder(model_name=model)
    db = Database(url, max_size=1)
    figures: Counter = Counter()
    found: dict[tuple[str, str], set[str]] = {}
    examples: list[dict[str, Any]] = []
    incomplete: list[str] = []
    try:
        for tenant in tenants:
            docs = pointed[tenant]
            gone = {d for d, (_, kind, _) in docs.items() if kind == "tombstone"}
            current = {d for d, (_, kind, n) in docs.items() if kind == "content" and n > 0}
            chunks = sum(n for _, kind, n in docs.values() if kind == "content")
            complete = chunks <= MAX_K
            if not complete:
                incomplete.append(f"{tenant}: {chunks} current chunks > k {MAX_K}")
            figures["deleted_documents"] += len(gone)
            figures["current_documents"] += len(current)
            for mode in MODES:
                hits = search(db, embedder, lexical_query, tenant_id=tenant, k=MAX_K, mode=mode)
                figures["searches"] += 1
                figures["hits"] += len(hits)
                seen = {h.document_id for h in hits}
                for h in hits:
                    found.setdefault((tenant, h.document_id), set()).add(mode)
                    if h.version_number != docs.get(h.document_id, (None,))[0]:
                        figures["hits_not_at_pointer"] += 1
                        if len(examples) < EXAMPLES:
                            examples.append({"kind": "hit not at its pointer", "tenant": tenant, "mode": mode,
                                             "document": h.document_id, "hit": h.version_number,
                                             "pointer": docs.get(h.document_id, (None,))[0]})
                for doc in sorted(seen & gone):
                    figures["deleted_documents_shown"] += 1
                    if len(examples) < EXAMPLES:
                        examples.append({"kind": "deleted document shown", "tenant": tenant, "mode": mode, "document": doc})
                if complete and (mode != "lexical" or lexical_complete):
                    for doc in sorted(current - seen):
                        figures["current_documents_missing"] += 1
                        if len(examples) < EXAMPLES:
                            examples.append({"kind": "current document missing", "tenant": tenant, "mode": mode,
                                             "document": doc})
    finally:
        db.close()
    return {"figures": {k: figures[k] for k in ("searches", "hits", "current_documents", "deleted_documents",
                                                  "deleted_documents_shown", "current_documents_missing",
                                                  "hits_not_at_pointer")},
            "complete": not incomplete, "incomplete": incomplete, "lexical_presence_checked": lexical_complete,
            "examples": examples, "found": found}


__all__ = ["MODES", "ledger", "newest_versions", "pointers", "search_sweep"]
