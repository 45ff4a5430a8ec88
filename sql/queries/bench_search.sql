-- Statements used only by bench/scale/search.py (filtered dense, hybrid and lexical search at 1M chunks),
-- never by the product.

-- name: bench_search_stage_create
-- Benchmark only: an unlogged staging table the generator COPYs binary rows into (ints + vector).
CREATE UNLOGGED TABLE IF NOT EXISTS bench_search_stage (
    tenant    smallint NOT NULL,
    doc       integer NOT NULL,
    version   smallint NOT NULL,
    profile   smallint NOT NULL,
    ordinal   smallint NOT NULL,
    embedding vector(384) NOT NULL
);

-- name: bench_search_stage_copy
-- Benchmark only: the generator streams preformatted binary COPY data (see bench/scale/search.py).
COPY bench_search_stage (tenant, doc, version, profile, ordinal, embedding) FROM STDIN (FORMAT BINARY);

-- name: bench_search_meta_stage_create
-- Benchmark only: each synthetic document's metadata and allow list (drawn by the generator), read by
-- bench_search_fill_versions.
CREATE UNLOGGED TABLE IF NOT EXISTS bench_search_meta_stage (
    doc              integer PRIMARY KEY,
    metadata         jsonb NOT NULL,
    allow_principals text[]
);

-- name: bench_search_meta_stage_fill
-- Benchmark only: parallel arrays, one entry per document: dept, effective date (YYYY-MM-DD), restricted or not
-- (a restricted document's allow list is %(restricted_to)s).
INSERT INTO bench_search_meta_stage (doc, metadata, allow_principals)
SELECT m.doc, jsonb_build_object('dept', m.dept, 'effective', m.effective),
       CASE WHEN m.restricted THEN %(restricted_to)s::text[] END
FROM unnest(%(docs)s::integer[], %(depts)s::text[], %(effectives)s::text[], %(restricted)s::boolean[])
     AS m (doc, dept, effective, restricted);

-- name: bench_search_meta_stage_drop
-- Benchmark only: the staged metadata is no longer needed once the versions carry it.
DROP TABLE IF EXISTS bench_search_meta_stage;

-- name: bench_search_scope_chunks
-- Benchmark only: how many current chunks of a tenant a read scope keeps (the pointers' chunk counts), to
-- report each filter's real selectivity beside its figures.
SELECT coalesce(sum(p.chunk_count), 0)::bigint AS chunks
FROM search_pointer p
WHERE p.tenant_id = %(tenant_id)s AND p.profile = %(profile)s
  AND (%(see_all)s OR p.allow_principals IS NULL OR p.allow_principals && %(principals)s::text[])
  AND kbindex_metadata_match(p.metadata, %(filters)s::jsonb);

-- name: bench_search_shadow_profile
-- Benchmark only: the second profile (a migration under way), beside the active minilm-v1.
INSERT INTO index_profile (name, model, dimension, chunk_tokens, chunk_overlap, building)
VALUES ('bench-shadow', 'fake-384', 384, 128, 16, true)
ON CONFLICT (name) DO NOTHING;

-- name: bench_search_vector_storage_external
-- Benchmark only (bench.scale.vector_placement): pgvector's own placement of chunk vectors, as before migration
-- 0051 (an install whose rows predate it keeps them this way until they are rewritten).
ALTER TABLE chunk ALTER COLUMN embedding SET STORAGE EXTERNAL;

-- name: bench_search_vector_placement
-- Benchmark only: where the chunk vectors are (out of line in the TOAST table or in their rows), and the sizes.
SELECT count(*) FILTER (WHERE pg_column_toast_chunk_id(embedding) IS NOT NULL) AS out_of_line,
       count(*) AS chunks,
       round(avg(octet_length(text)))::int AS avg_text_chars,
       pg_relation_size('chunk') AS heap_bytes,
       pg_table_size('chunk') - pg_relation_size('chunk') AS toast_bytes
FROM chunk;

-- name: bench_search_drop_hnsw
-- Benchmark only: bulk-load without the graph, build it once afterwards.
DROP INDEX IF EXISTS chunk_embedding_hnsw_idx;

-- name: bench_search_fill_documents
-- Benchmark only: documents, versions, SUCCEEDED tasks and chunks from the staged rows.
-- The tenants parameter names tenant i at index i + 1; the profiles parameter likewise.
INSERT INTO document (tenant_id, document_id, latest_version)
SELECT (%(tenants)s::text[])[tenant + 1], 'doc-' || doc, max(version)
FROM bench_search_stage GROUP BY tenant, doc;

-- name: bench_search_fill_versions
-- Benchmark only: one document_version per staged (tenant, doc, version), with its document's staged metadata
-- and allow list (every version of a document alike).
INSERT INTO document_version (tenant_id, document_id, version_number, content_hash, byte_size, filename,
                              media_type, partition_key, metadata, allow_principals)
SELECT (%(tenants)s::text[])[s.tenant + 1], 'doc-' || s.doc, s.version, md5(s.tenant || '/' || s.doc || '/' || s.version),
       0, 'doc-' || s.doc || '.txt', 'text/plain',
       (%(tenants)s::text[])[s.tenant + 1] || '/doc-' || s.doc || '/v' || s.version,
       coalesce(m.metadata, '{}'::jsonb), m.allow_principals
FROM (SELECT DISTINCT tenant, doc, version FROM bench_search_stage) AS s
LEFT JOIN bench_search_meta_stage m ON m.doc = s.doc;

-- name: bench_search_fill_tasks
-- Benchmark only: a SUCCEEDED task per staged (tenant, doc, version, profile).
INSERT INTO index_task (tenant_id, document_id, version_number, task_type, profile, status, attempts, finished_at)
SELECT DISTINCT (%(tenants)s::text[])[tenant + 1], 'doc-' || doc, version,
       CASE WHEN profile = 0 THEN 'INDEX' ELSE 'REINDEX' END, (%(profiles)s::text[])[profile + 1], 'SUCCEEDED', 1, now()
FROM bench_search_stage;

-- name: bench_search_fill_pointers
-- Benchmark only: each (document, profile) points at its newest version; older ones are superseded. The
-- pointer carries the pointed version's metadata and allow list, as search_pointer_advance leaves it.
INSERT INTO search_pointer (tenant_id, document_id, profile, version_number, task_id, chunk_count, metadata,
                            allow_principals)
SELECT DISTINCT ON (t.tenant_id, t.document_id, t.profile) t.tenant_id, t.document_id, t.profile,
       t.version_number, t.task_id, 8, v.metadata, v.allow_principals
FROM index_task t
JOIN document_version v
  ON v.tenant_id = t.tenant_id AND v.document_id = t.document_id AND v.version_number = t.version_number
ORDER BY t.tenant_id, t.document_id, t.profile, t.version_number DESC;

-- name: bench_search_fill_chunks
-- Benchmark only: the chunk rows, with stable-looking ids. Texts are short ("synthetic chunk 3 of doc-17") when
-- %(text_chars)s is 0, otherwise that many characters of the pseudo-English %(prose)s (ASCII) from an offset
-- hashed from the chunk's key: a chunk row of real size, which decides where PostgreSQL keeps the vector
-- (migration 0051).
INSERT INTO chunk (chunk_id, tenant_id, document_id, version_number, profile, ordinal, text, token_count,
                   content_digest, embedding)
SELECT md5(tenant || '/' || doc || '/' || version || '/' || profile || '/' || ordinal),
       (%(tenants)s::text[])[tenant + 1], 'doc-' || doc, version, (%(profiles)s::text[])[profile + 1], ordinal,
       CASE WHEN %(text_chars)s::int = 0 THEN 'synthetic chunk ' || ordinal || ' of doc-' || doc
            ELSE convert_from(substring(%(prose)s::bytea  -- ASCII: bytes are characters, and cut in O(1)
                                        FROM 1 + abs(hashtext(doc || '/' || version || '/' || ordinal)) %% %(prose_starts)s::int
                                        FOR %(text_chars)s::int), 'UTF8') END,
       10, md5(doc || '/' || ordinal), embedding
FROM bench_search_stage;

-- name: bench_search_stage_drop
-- Benchmark only: the staging table is no longer needed once the chunks are in.
DROP TABLE IF EXISTS bench_search_stage;

-- name: bench_search_build_hnsw
-- Benchmark only: the product's graph (same name and operator class), with the build parameters under test
-- (DDL takes no server-side parameters: the caller binds these two integers client-side).
CREATE INDEX chunk_embedding_hnsw_idx ON chunk USING hnsw (embedding vector_cosine_ops)
WITH (m = %(m)s, ef_construction = %(ef_construction)s);

-- name: bench_search_iterative_scan
-- Benchmark only: override the product's iterative scan mode inside the search transaction (off, strict_order).
SELECT set_config('hnsw.iterative_scan', %(mode)s, true) AS iterative_scan;

-- name: bench_search_build_settings
-- Benchmark only: enough memory for the graph to build in RAM, and one parallel worker per spare core.
SELECT set_config('maintenance_work_mem', %(maintenance_work_mem)s, false) AS maintenance_work_mem,
       set_config('max_parallel_maintenance_workers', %(workers)s::text, false) AS workers;

-- name: bench_search_analyze
-- Benchmark only: fresh statistics after the bulk load, and the visibility map autovacuum keeps in steady
-- state (the lexical side reads the postings' covering index: index-only only on all-visible pages).
VACUUM (ANALYZE);

-- name: bench_search_sizes
-- Benchmark only: what was loaded and how big it is on disk (the lexical tables are empty under --no-lexical).
SELECT (SELECT count(*) FROM chunk) AS chunks,
       (SELECT count(*) FROM chunk c JOIN search_pointer p USING (tenant_id, document_id, profile, version_number))
           AS current_chunks,
       pg_total_relation_size('chunk') - pg_relation_size('chunk_embedding_hnsw_idx') AS table_bytes,
       pg_relation_size('chunk_embedding_hnsw_idx') AS hnsw_bytes,
       (SELECT count(*) FROM lexical_chunk) AS lexical_chunks,
       (SELECT count(*) FROM lexical_posting) AS postings,
       pg_total_relation_size('lexical_chunk') + pg_total_relation_size('lexical_posting')
           + pg_total_relation_size('lexical_term_stats') + pg_total_relation_size('lexical_document') AS lexical_bytes;

-- name: bench_search_tenant_queries
-- Benchmark only: random current chunks of the active profile in one tenant, to perturb into queries (their
-- vectors, and their lexical terms to draw query terms from; NULL without lexical rows).
SELECT c.embedding, l.terms
FROM chunk c
JOIN search_pointer p
  ON p.tenant_id = c.tenant_id AND p.document_id = c.document_id
 AND p.profile = c.profile AND p.version_number = c.version_number
LEFT JOIN lexical_chunk l ON l.chunk_id = c.chunk_id
WHERE c.tenant_id = %(tenant_id)s AND c.profile = %(profile)s
ORDER BY md5(c.chunk_id || %(seed)s)
LIMIT %(count)s;

-- name: bench_search_tenant_current
-- Benchmark only: how many current chunks of the active profile a tenant has (what the filter keeps).
SELECT count(*) AS current_chunks
FROM chunk c
JOIN search_pointer p
  ON p.tenant_id = c.tenant_id AND p.document_id = c.document_id
 AND p.profile = c.profile AND p.version_number = c.version_number
WHERE c.tenant_id = %(tenant_id)s AND c.profile = %(profile)s;

-- name: bench_search_lexical_stage_create
-- Benchmark only: the synthetic postings (one row per distinct term of a staged chunk), COPYed binary beside
-- bench_search_stage; the chunk is named by the same (tenant, doc, version, profile, ordinal).
CREATE UNLOGGED TABLE IF NOT EXISTS bench_search_lexical_stage (
    tenant  smallint NOT NULL,
    doc     integer NOT NULL,
    version smallint NOT NULL,
    profile smallint NOT NULL,
    ordinal smallint NOT NULL,
    term    integer NOT NULL,
    tf      smallint NOT NULL
);

-- name: bench_search_lexical_stage_copy
-- Benchmark only: the generator streams preformatted binary COPY data (see bench/scale/search.py).
COPY bench_search_lexical_stage (tenant, doc, version, profile, ordinal, term, tf) FROM STDIN (FORMAT BINARY);

-- name: bench_search_fill_lexical_chunks
-- Benchmark only: one lexical_chunk row per staged chunk, as lexical_chunk_upsert writes it: the chunk's id,
-- version and content digest (same expressions as bench_search_fill_chunks), distinct terms sorted with
-- their tfs, length = sum of the tfs.
INSERT INTO lexical_chunk (chunk_id, tenant_id, document_id, profile, version_number, content_digest,
                           terms, tfs, length)
SELECT md5(tenant || '/' || doc || '/' || version || '/' || profile || '/' || ordinal),
       (%(tenants)s::text[])[tenant + 1], 'doc-' || doc, (%(profiles)s::text[])[profile + 1], version,
       md5(doc || '/' || ordinal), array_agg(term ORDER BY term), array_agg(tf::integer ORDER BY term), sum(tf)
FROM bench_search_lexical_stage
GROUP BY tenant, doc, version, profile, ordinal;

-- name: bench_search_lexical_posting_drop_term_index
-- Benchmark only: bulk-load the postings (45M at 1M chunks) without their one index;
-- bench_search_lexical_posting_term_index puts back migration 0025's definition (checked by
-- tests/integration/test_bench_scale_small.py against a freshly migrated database).
DROP INDEX lexical_posting_term_idx;

-- name: bench_search_fill_lexical_postings
-- Benchmark only: the postings from the lexical rows, the same SELECT as lexical_posting_write, for every row.
INSERT INTO lexical_posting (chunk_id, term, tenant_id, profile, document_id, version_number, tf, length)
SELECT l.chunk_id, t.term, l.tenant_id, l.profile, l.document_id, l.version_number, t.tf, l.length
FROM lexical_chunk l, unnest(l.terms, l.tfs) AS t (term, tf);

-- name: bench_search_lexical_posting_term_index
-- Benchmark only: migration 0025's unique covering term index, built once after the load.
CREATE UNIQUE INDEX lexical_posting_term_idx ON lexical_posting (tenant_id, profile, term, chunk_id)
    INCLUDE (tf, length, document_id, version_number);

-- name: bench_search_fill_lexical_documents
-- Benchmark only: the ledger lexical_stats_reconcile keeps, for every (tenant, document, profile) with a
-- pointer: what its pointed version counts (df per term, -1 = chunks, -2 = total length), terms sorted.
WITH pointed AS (
    SELECT l.tenant_id, l.document_id, l.profile, l.version_number, l.terms, l.length
    FROM lexical_chunk l
    JOIN search_pointer p
      ON p.tenant_id = l.tenant_id AND p.document_id = l.document_id
     AND p.profile = l.profile AND p.version_number = l.version_number
),
counted AS (
    SELECT tenant_id, document_id, profile, version_number, term, count(*)::bigint AS df
    FROM pointed, unnest(pointed.terms) AS term
    GROUP BY tenant_id, document_id, profile, version_number, term
    UNION ALL
    SELECT tenant_id, document_id, profile, version_number, -1, count(*)::bigint
    FROM pointed GROUP BY tenant_id, document_id, profile, version_number
    UNION ALL
    SELECT tenant_id, document_id, profile, version_number, -2, sum(length)::bigint
    FROM pointed GROUP BY tenant_id, document_id, profile, version_number
)
INSERT INTO lexical_document (tenant_id, document_id, profile, version_number, terms, dfs)
SELECT tenant_id, document_id, profile, version_number, array_agg(term ORDER BY term), array_agg(df ORDER BY term)
FROM counted
GROUP BY tenant_id, document_id, profile, version_number;

-- name: bench_search_fill_lexical_term_stats
-- Benchmark only: the BM25 statistics per tenant and profile, the sum of the ledger (current versions only).
INSERT INTO lexical_term_stats (tenant_id, profile, term, df)
SELECT d.tenant_id, d.profile, t.term, sum(t.df)::bigint
FROM lexical_document d, unnest(d.terms, d.dfs) AS t (term, df)
GROUP BY d.tenant_id, d.profile, t.term;

-- name: bench_search_widen_lexical_term_bounds
-- Benchmark only: each term's bound (largest tf, smallest length / tf) over the seeded postings, as the publish
-- transaction widens it (migration 0052's function, run after the statistics are in).
SELECT kbindex_lexical_term_bounds_widen() AS widened;

-- name: bench_search_fill_chunk_counts
-- Benchmark only (no lexical rows seeded): each tenant's current chunk count per profile, the statistic every
-- publish keeps beside the terms (term -1), which dense search reads to decide whether to walk the graph.
INSERT INTO lexical_term_stats (tenant_id, profile, term, df)
SELECT tenant_id, profile, -1, sum(chunk_count)::bigint
FROM search_pointer
GROUP BY tenant_id, profile;

-- name: bench_search_lexical_stage_drop
-- Benchmark only: the staged postings are no longer needed once the lexical rows are in.
DROP TABLE IF EXISTS bench_search_lexical_stage;

-- name: bench_search_custom_plan
-- Benchmark only: plan each exact reference for its own parameters (psycopg prepares a statement after five
-- runs, and a generic plan of bench_search_fused_exact can walk every posting of the tenant).
SELECT set_config('plan_cache_mode', 'force_custom_plan', true) AS plan_cache_mode;

-- name: bench_search_fused_exact
-- Benchmark only: the exact hybrid answer (the fusion of pipelines/domain/lexical.py fuse) over EVERY current
-- chunk of the tenant in the read scope (allow list and metadata filters, as the product's statements):
-- exhaustive cosine (no index order), BM25 of the given terms from all their postings, normalised by the best
-- BM25 in scope. lexical_weight 1 gives the exact BM25 ranking, 0 the exact dense one.
WITH q AS (
    SELECT * FROM unnest(%(candidates)s::integer[], %(candidate_idfs)s::float8[]) AS q (term, idf)
),
lexical AS (
    SELECT x.chunk_id,
           sum(q.idf * x.tf * (%(k1)s::float8 + 1)
               / (x.tf + %(k1)s::float8 * (1 - %(b)s::float8 + %(b)s::float8 * x.length / %(avg_length)s::float8))) AS bm25
    FROM q
    JOIN lexical_posting x ON x.tenant_id = %(tenant_id)s AND x.profile = %(profile)s AND x.term = q.term
    JOIN search_pointer p
      ON p.tenant_id = x.tenant_id AND p.document_id = x.document_id
     AND p.profile = x.profile AND p.version_number = x.version_number
    WHERE (%(see_all)s OR p.allow_principals IS NULL OR p.allow_principals && %(principals)s::text[])
      AND kbindex_metadata_match(p.metadata, %(filters)s::jsonb)
    GROUP BY x.chunk_id
),
top AS (
    SELECT max(bm25) AS bm25 FROM lexical
),
sides AS (  -- both sides' rows summed per chunk: a join of the two is planned as a nested loop from the ~6 rows
            -- estimated for the lexical side (thousands in fact: 20 s a query at a 34k-chunk tenant)
    SELECT c.chunk_id, greatest(1 - (c.embedding <=> %(query)s::vector), 0) AS cosine, 0::float8 AS bm25
    FROM chunk c
    JOIN search_pointer p
      ON p.tenant_id = c.tenant_id AND p.document_id = c.document_id
     AND p.profile = c.profile AND p.version_number = c.version_number
    WHERE c.tenant_id = %(tenant_id)s AND c.profile = %(profile)s
      AND (%(see_all)s OR p.allow_principals IS NULL OR p.allow_principals && %(principals)s::text[])
      AND kbindex_metadata_match(p.metadata, %(filters)s::jsonb)
    UNION ALL
    SELECT chunk_id, 0, bm25 FROM lexical
)
SELECT s.chunk_id,
       %(lexical_weight)s::float8 * coalesce(max(s.bm25) / nullif(top.bm25, 0), 0)
       + (1 - %(lexical_weight)s::float8) * max(s.cosine) AS score
FROM sides s
CROSS JOIN top
GROUP BY s.chunk_id, top.bm25
ORDER BY score DESC, s.chunk_id
LIMIT %(k)s;

-- name: bench_search_term_postings
-- Benchmark only (bench.scale.lexical_bounds): every posting of the given terms in one tenant and profile, every
-- version, as lexical_hits walks them.
SELECT term, chunk_id, tf, length, document_id, version_number
FROM lexical_posting
WHERE tenant_id = %(tenant_id)s AND profile = %(profile)s AND term = ANY(%(terms)s);
