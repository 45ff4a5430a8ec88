-- Statements used only by bench/scale/search.py (filtered dense search at 1M chunks), never by the product.

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

-- name: bench_search_shadow_profile
-- Benchmark only: the second profile (a migration under way), beside the active minilm-v1.
INSERT INTO index_profile (name, model, dimension, chunk_tokens, chunk_overlap, building)
VALUES ('bench-shadow', 'fake-384', 384, 128, 16, true)
ON CONFLICT (name) DO NOTHING;

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
-- Benchmark only: one document_version per staged (tenant, doc, version).
INSERT INTO document_version (tenant_id, document_id, version_number, content_hash, byte_size, filename,
                              media_type, partition_key)
SELECT DISTINCT (%(tenants)s::text[])[tenant + 1], 'doc-' || doc, version, md5(tenant || '/' || doc || '/' || version),
       0, 'doc-' || doc || '.txt', 'text/plain', (%(tenants)s::text[])[tenant + 1] || '/doc-' || doc || '/v' || version
FROM bench_search_stage;

-- name: bench_search_fill_tasks
-- Benchmark only: a SUCCEEDED task per staged (tenant, doc, version, profile).
INSERT INTO index_task (tenant_id, document_id, version_number, task_type, profile, status, attempts, finished_at)
SELECT DISTINCT (%(tenants)s::text[])[tenant + 1], 'doc-' || doc, version,
       CASE WHEN profile = 0 THEN 'INDEX' ELSE 'REINDEX' END, (%(profiles)s::text[])[profile + 1], 'SUCCEEDED', 1, now()
FROM bench_search_stage;

-- name: bench_search_fill_pointers
-- Benchmark only: each (document, profile) points at its newest version; older ones are superseded.
INSERT INTO search_pointer (tenant_id, document_id, profile, version_number, task_id, chunk_count)
SELECT DISTINCT ON (t.tenant_id, t.document_id, t.profile) t.tenant_id, t.document_id, t.profile,
       t.version_number, t.task_id, 8
FROM index_task t
ORDER BY t.tenant_id, t.document_id, t.profile, t.version_number DESC;

-- name: bench_search_fill_chunks
-- Benchmark only: the chunk rows, with stable-looking ids and short texts (the vectors are what matter).
INSERT INTO chunk (chunk_id, tenant_id, document_id, version_number, profile, ordinal, text, token_count,
                   content_digest, embedding)
SELECT md5(tenant || '/' || doc || '/' || version || '/' || profile || '/' || ordinal),
       (%(tenants)s::text[])[tenant + 1], 'doc-' || doc, version, (%(profiles)s::text[])[profile + 1], ordinal,
       'synthetic chunk ' || ordinal || ' of doc-' || doc, 10, md5(doc || '/' || ordinal), embedding
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
-- Benchmark only: fresh statistics after the bulk load.
ANALYZE;

-- name: bench_search_sizes
-- Benchmark only: what was loaded and how big it is on disk.
SELECT (SELECT count(*) FROM chunk) AS chunks,
       (SELECT count(*) FROM chunk c JOIN search_pointer p USING (tenant_id, document_id, profile, version_number))
           AS current_chunks,
       pg_total_relation_size('chunk') - pg_relation_size('chunk_embedding_hnsw_idx') AS table_bytes,
       pg_relation_size('chunk_embedding_hnsw_idx') AS hnsw_bytes;

-- name: bench_search_tenant_queries
-- Benchmark only: random current chunks of the active profile in one tenant, to perturb into queries.
SELECT c.embedding
FROM chunk c
JOIN search_pointer p
  ON p.tenant_id = c.tenant_id AND p.document_id = c.document_id
 AND p.profile = c.profile AND p.version_number = c.version_number
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
