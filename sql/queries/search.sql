-- Statements of resources/search.py: filtered nearest-neighbour search over current versions only.

-- name: search_snapshot
-- First statement of a search's transaction: every statement of it (dense, lexical, the BM25 of dense
-- candidates) reads one snapshot, so a pointer flip between them cannot mix two versions' scopes in one answer.
SET TRANSACTION ISOLATION LEVEL REPEATABLE READ, READ ONLY;

-- name: search_settings
-- Per-transaction HNSW settings: iterative scans keep walking the graph until k rows pass the filters
-- (tenant, active profile, current version), bounded by max_scan_tuples (pgvector >= 0.8).
-- force_custom_plan: psycopg prepares a statement after 5 runs on a connection, and PostgreSQL then
-- switches to a generic plan that knows neither the tenant nor k and sorts the whole table exhaustively
-- (~45 ms at 20k chunks, seconds at 1M; bench/scale/search.py); a custom plan per search keeps the graph.
SELECT set_config('plan_cache_mode', 'force_custom_plan', true) AS plan_cache_mode,
       set_config('hnsw.iterative_scan', 'relaxed_order', true) AS iterative_scan,
       set_config('hnsw.ef_search', %(ef_search)s::text, true) AS ef_search,
       set_config('hnsw.max_scan_tuples', %(max_scan_tuples)s::text, true) AS max_scan_tuples;

-- name: search_hits
-- The tenant's k nearest chunks of the versions its search pointers name (HNSW, iterative, relaxed order),
-- re-ordered exactly by distance outside the materialized scan. Only versions the reader may see and whose
-- metadata passes the filters qualify (the pointer row carries both): the graph walk goes on until k rows
-- pass, so a chunk outside the scope is never a candidate (DESIGN.md invariant 8). %(see_all)s is the
-- explicit operator override; otherwise a version with an allow list needs one of %(principals)s.
WITH relaxed AS MATERIALIZED (
    SELECT c.chunk_id, c.document_id, c.version_number, c.heading_path, c.page, c.text, p.metadata,
           c.embedding <=> %(query)s::vector AS distance
    FROM chunk c
    JOIN search_pointer p
      ON p.tenant_id = c.tenant_id
     AND p.document_id = c.document_id
     AND p.profile = c.profile
     AND p.version_number = c.version_number
    WHERE c.tenant_id = %(tenant_id)s
      AND c.profile = %(profile)s
      AND (%(see_all)s OR p.allow_principals IS NULL OR p.allow_principals && %(principals)s::text[])
      -- No filters: the planner folds this to true. Otherwise it counts the opaque function as keeping a third
      -- of the rows and, with an allow-list check beside it, priced the walk above an exhaustive sort: at 20k
      -- chunks (bench.scale.search) searches as group:finance read a 5,560-chunk tenant exhaustively, p50
      -- 61 ms against 12 ms for the same answers with EVERYTHING.
      AND (%(filters)s::jsonb = '[]'::jsonb OR kbindex_metadata_match(p.metadata, %(filters)s::jsonb))
    ORDER BY c.embedding <=> %(query)s::vector
    LIMIT %(k)s
)
SELECT chunk_id, document_id, version_number, heading_path, page, text, metadata, distance
FROM relaxed
ORDER BY distance + 0, chunk_id;

-- name: search_tenant_size
-- How many current chunks the tenant has under the profile (lexical_term_stats' chunk count, term -1, which every
-- publish keeps) and how many rows the chunk table holds (ANALYZE's estimate; NULL before the first ANALYZE):
-- the share of the graph's nodes a walk for this tenant can keep.
SELECT (SELECT df FROM lexical_term_stats
        WHERE tenant_id = %(tenant_id)s AND profile = %(profile)s AND term = -1) AS tenant_chunks,
       (SELECT nullif(greatest(reltuples, 0), 0) FROM pg_class WHERE oid = 'chunk'::regclass)::bigint AS index_rows;

-- name: search_sort_enabled
-- Sorts forbidden ('off') for search_hits alone, then allowed again ('on'): the planner then walks the graph in
-- index order instead of measuring the tenant exhaustively (resources/search.py WALK_MIN_SHARE says when).
SELECT set_config('enable_sort', %(enable_sort)s, true) AS enable_sort;

-- name: search_hits_exact
-- The same answer by exhaustive distance over the tenant's current chunks in scope (no index order: "+ 0"):
-- used when the graph walk ran out of max_scan_tuples before finding k rows (a small tenant among big ones,
-- or a selective filter). The pointers in scope are found first, then only their chunks are measured, so
-- a filter that keeps a hundredth of the tenant measures a hundredth of its chunks (its equality conditions
-- found through the metadata index, as in search_hits_scoped).
WITH visible AS MATERIALIZED (
    SELECT p.document_id, p.version_number, p.metadata
    FROM search_pointer p
    WHERE p.tenant_id = %(tenant_id)s
      AND p.profile = %(profile)s
      AND (%(see_all)s OR p.allow_principals IS NULL OR p.allow_principals && %(principals)s::text[])
      AND (%(metadata_path)s::jsonpath IS NULL OR p.metadata @? %(metadata_path)s::jsonpath)
      AND kbindex_metadata_match(p.metadata, %(filters)s::jsonb)
)
SELECT c.chunk_id, c.document_id, c.version_number, c.heading_path, c.page, c.text, v.metadata,
       c.embedding <=> %(query)s::vector AS distance
FROM visible v
JOIN chunk c
  ON c.tenant_id = %(tenant_id)s
 AND c.document_id = v.document_id
 AND c.profile = %(profile)s
 AND c.version_number = v.version_number
ORDER BY (c.embedding <=> %(query)s::vector) + 0, c.chunk_id
LIMIT %(k)s;

-- name: search_hits_scoped
-- A filtered search's first statement: when the filters keep few documents, the exact answer over them costs
-- less than a graph walk that must pass ~k / selectivity chunks to find k in scope (bench.scale.search:
-- 1M chunks, dept=legal keeping a hundredth of a 285k-chunk tenant). The pointers in scope are read up to
-- %(max_scope_pointers)s + 1 (so a broad filter stops early); if they are at most %(max_scope_pointers)s
-- holding at most %(max_scope_chunks)s chunks, their chunks are measured exhaustively, exactly as
-- search_hits_exact does. One row per hit, best first, each with the scope's size and exact = true; or a
-- single row with exact = false and no hit (too wide: walk the graph with search_hits), or with exact = true
-- and no hit (nothing in scope).
WITH visible AS MATERIALIZED (
    SELECT p.document_id, p.version_number, p.metadata, p.chunk_count
    FROM search_pointer p
    WHERE p.tenant_id = %(tenant_id)s
      AND p.profile = %(profile)s
      AND (%(see_all)s OR p.allow_principals IS NULL OR p.allow_principals && %(principals)s::text[])
      -- The equality conditions as a jsonpath the metadata index answers (migration 0034; NULL: none).
      AND (%(metadata_path)s::jsonpath IS NULL OR p.metadata @? %(metadata_path)s::jsonpath)
      AND kbindex_metadata_match(p.metadata, %(filters)s::jsonb)
    LIMIT %(max_scope_pointers)s + 1
),
scope AS (
    SELECT count(*) AS pointers, coalesce(sum(chunk_count), 0) AS chunks,
           count(*) <= %(max_scope_pointers)s AND coalesce(sum(chunk_count), 0) <= %(max_scope_chunks)s AS exact
    FROM visible
),
hits AS (
    SELECT c.chunk_id, c.document_id, c.version_number, c.heading_path, c.page, c.text, v.metadata,
           c.embedding <=> %(query)s::vector AS distance
    FROM visible v
    JOIN chunk c
      ON c.tenant_id = %(tenant_id)s
     AND c.document_id = v.document_id
     AND c.profile = %(profile)s
     AND c.version_number = v.version_number
    WHERE (SELECT exact FROM scope)
    ORDER BY (c.embedding <=> %(query)s::vector) + 0, c.chunk_id
    LIMIT %(k)s
)
SELECT s.exact, s.pointers AS scope_pointers, s.chunks AS scope_chunks,
       h.chunk_id, h.document_id, h.version_number, h.heading_path, h.page, h.text, h.metadata, h.distance
FROM scope s
LEFT JOIN hits h ON true
ORDER BY h.distance, h.chunk_id;
