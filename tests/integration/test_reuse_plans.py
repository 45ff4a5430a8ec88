"""The reuse lookup costs one index probe per distinct digest of a version, however often a text is stored (#28).

Shared boilerplate (a disclaimer, a footer) is the same paragraph in thousands of versions, so one embed
digest may have thousands of stored copies under a (tenant, profile). ``chunk_reuse_lookup`` wants only the
newest copy's vector; read with ``DISTINCT ON ... ORDER BY created_at DESC`` over an index without
``created_at`` it fetched every copy, vector included, for every version that repeats the paragraph. Here one
version's lookup is replayed under EXPLAIN (ANALYZE, BUFFERS) with 3 and with 5,000 stored copies of its
boilerplate: the chunk rows it reads and the buffers it touches must not grow with the copies.
"""

from __future__ import annotations

import json

import numpy as np
import psycopg
import pytest

from resources.embedding_reuse import embed_digest, stored_vectors
from sql import queries

TENANT, PROFILE, DIM = "acme", "minilm-v1", 384
BOILERPLATE = "This message and its attachments are confidential and intended for the addressee only."
OWN = [f"Refunds of class {i} are paid within {i % 7 + 3} days." for i in range(20)]
FEW, MANY = 3, 5_000


def unit(seed: int) -> list[float]:
    vector = np.random.default_rng(seed).standard_normal(DIM).astype(np.float32)
    return (vector / np.linalg.norm(vector)).tolist()


def add_copies(db_url: str, text: str, first: int, n: int, *, seconds_ago: int, tenant: str = TENANT) -> None:
    """``n`` stored copies of ``text`` in documents first..first+n-1, created ``seconds_ago`` and a second apart."""
    with psycopg.connect(db_url) as conn:
        conn.execute(
            "INSERT INTO chunk (chunk_id, tenant_id, document_id, version_number, profile, ordinal, text, token_count,"
            " content_digest, embed_digest, embedding, created_at)"
            " SELECT %(t)s || '-copy-' || i, %(t)s, 'doc-' || i, 1, %(p)s, 0, %(text)s, 12, md5(%(text)s), %(digest)s,"
            " %(vector)s::vector, now() - make_interval(secs => %(ago)s + %(first)s + %(n)s - i)"
            " FROM generate_series(%(first)s, %(first)s + %(n)s - 1) AS i",
            {"t": tenant, "p": PROFILE, "text": text, "digest": embed_digest(text), "vector": str(unit(1)),
             "ago": seconds_ago, "first": first, "n": n})


def lookup_params(db_url: str) -> dict:
    with psycopg.connect(db_url) as conn:
        (model,) = conn.execute("SELECT model FROM index_profile WHERE name = %s", (PROFILE,)).fetchone()
    return {"tenant_id": TENANT, "profile": PROFILE, "model": model, "dimension": DIM,
            "digests": sorted({embed_digest(t) for t in [BOILERPLATE, *OWN]})}


def replay(db_url: str, params: dict) -> tuple[int, int, set[str]]:
    """(chunk rows read, shared buffers touched, indexes used) of one lookup, under EXPLAIN ANALYZE."""
    with psycopg.connect(db_url) as conn:
        (plan,) = conn.execute("EXPLAIN (ANALYZE, BUFFERS, FORMAT JSON) " + queries["chunk_reuse_lookup"],
                               params).fetchone()
    top = (plan if isinstance(plan, list) else json.loads(plan))[0]["Plan"]

    def rows_read(node: dict) -> int:
        own = 0
        if node.get("Relation Name") == "chunk" or node.get("Index Name", "").startswith("chunk_"):
            own = (node["Actual Rows"] + node.get("Rows Removed by Filter", 0)
                   + node.get("Rows Removed by Index Recheck", 0)) * node["Actual Loops"]
        return own + sum(rows_read(child) for child in node.get("Plans", []))

    def indexes(node: dict) -> set[str]:
        return {node.get("Index Name", "")} - {""} | {i for child in node.get("Plans", []) for i in indexes(child)}

    return round(rows_read(top)), top["Shared Hit Blocks"] + top["Shared Read Blocks"], indexes(top)


@pytest.fixture
def seeded(db_url):
    """The version's own texts stored once each, the boilerplate FEW times (one newest copy with its own vector),
    beside another tenant's 2,000 chunks (a table too small for an index is read whole, whatever the query)."""
    with psycopg.connect(db_url, autocommit=True) as conn:
        conn.execute("DROP INDEX chunk_embedding_hnsw_idx")  # no statement here reads it; inserts stay fast
    add_copies(db_url, BOILERPLATE, first=1, n=2_000, seconds_ago=0, tenant="other")
    for i, text in enumerate(OWN):
        add_copies(db_url, text, first=100_000 + 10 * i, n=1, seconds_ago=50)
    add_copies(db_url, BOILERPLATE, first=1, n=FEW, seconds_ago=20)
    with psycopg.connect(db_url) as conn:  # the newest copy of the boilerplate, with a vector of its own
        conn.execute("UPDATE chunk SET embedding = %s::vector, created_at = now() WHERE chunk_id = 'acme-copy-2'",
                     (str(unit(2)),))
    with psycopg.connect(db_url, autocommit=True) as conn:
        conn.execute("ANALYZE chunk")
    return db_url


@pytest.mark.timeout(300)
def test_the_lookup_does_not_read_every_stored_copy_of_a_digest(seeded, db):
    params = lookup_params(seeded)
    few_rows, few_buffers, _ = replay(seeded, params)
    add_copies(seeded, BOILERPLATE, first=10_000, n=MANY, seconds_ago=3_600)  # older copies, as history piles up
    with psycopg.connect(seeded, autocommit=True) as conn:
        conn.execute("ANALYZE chunk")
    many_rows, many_buffers, used = replay(seeded, params)
    print(f"chunk_reuse_lookup, 21 digests: {FEW} copies -> {few_rows} rows, {few_buffers} buffers;"
          f" {MANY + FEW:,} copies -> {many_rows} rows, {many_buffers} buffers")
    assert many_rows <= len(params["digests"]) + 5, (few_rows, many_rows)
    assert many_buffers <= 2 * few_buffers + 30, (few_buffers, many_buffers)
    assert "chunk_embed_digest_newest_idx" in used, used

    # the answer is the same as before: the newest stored copy's vector, one per digest
    found = stored_vectors(db, tenant_id=TENANT, profile=PROFILE, model=params["model"], dimension=DIM,
                           digests=params["digests"])
    assert set(found) == set(params["digests"])
    assert found[embed_digest(BOILERPLATE)].tobytes() == np.asarray(unit(2), dtype=np.float32).tobytes()
