-- Benchmark only (bench/scale/burst.py): an index that already holds many versions, built set-based.

-- name: bench_scale_seed_documents
-- Benchmark only: documents seed-1..seed-N of one tenant, each with one version.
INSERT INTO document (tenant_id, document_id, latest_version)
SELECT %(tenant)s, 'seed-' || i, 1 FROM generate_series(1, %(versions)s) AS i;

-- name: bench_scale_seed_versions
-- Benchmark only: the versions of the seeded documents, keyed as the publisher keys them.
INSERT INTO document_version (tenant_id, document_id, version_number, content_hash, byte_size, filename,
                              media_type, partition_key, published_at)
SELECT d.tenant_id, d.document_id, 1, md5(d.document_id), 1500, d.document_id || '.txt', 'text/plain',
       d.tenant_id || '/' || d.document_id || '/v1', now() - interval '30 days'
FROM document d WHERE d.tenant_id = %(tenant)s AND d.document_id ^@ 'seed-';

-- name: bench_scale_seed_tasks
-- Benchmark only: a SUCCEEDED INDEX task per seeded version, under the active profile.
INSERT INTO index_task (tenant_id, document_id, version_number, task_type, profile, status, attempts,
                        chunk_count, created_at, updated_at, started_at, finished_at)
SELECT v.tenant_id, v.document_id, 1, 'INDEX', p.name, 'SUCCEEDED', 1, %(chunks)s,
       v.published_at, v.published_at, v.published_at, v.published_at
FROM document_version v CROSS JOIN index_profile p
WHERE p.is_active AND v.tenant_id = %(tenant)s AND v.document_id ^@ 'seed-';

-- name: bench_scale_seed_events
-- Benchmark only: each seeded task's last transition, as a finished run leaves it.
INSERT INTO task_event (task_id, attempt, from_status, to_status, lease_owner, message, created_at)
SELECT t.task_id, 1, 'RUNNING', 'SUCCEEDED', 'run-seeded', 'seeded', t.finished_at
FROM index_task t WHERE t.tenant_id = %(tenant)s AND t.document_id ^@ 'seed-';

-- name: bench_scale_seed_pointers
-- Benchmark only: search reads every seeded version.
INSERT INTO search_pointer (tenant_id, document_id, profile, version_number, task_id, chunk_count)
SELECT t.tenant_id, t.document_id, t.profile, 1, t.task_id, t.chunk_count
FROM index_task t WHERE t.tenant_id = %(tenant)s AND t.document_id ^@ 'seed-';

-- name: bench_scale_drop_hnsw
-- Benchmark only: bulk-load without the graph, build it once afterwards (as migration 0021 builds it).
DROP INDEX IF EXISTS chunk_embedding_hnsw_idx;

-- name: bench_scale_seed_chunks
-- Benchmark only: the seeded versions' chunks with random vectors (the subquery names t, so it runs per row).
INSERT INTO chunk (chunk_id, tenant_id, document_id, version_number, profile, ordinal, text, token_count,
                   content_digest, embed_digest, embedding)
SELECT md5(t.document_id || '/' || o), t.tenant_id, t.document_id, 1, t.profile, o,
       'synthetic chunk ' || o || ' of ' || t.document_id, 12, md5(t.document_id || '/' || o),
       encode(sha256(convert_to(t.document_id || '/' || o, 'UTF8')), 'hex'),
       ARRAY(SELECT random() - 0.5 + 0 * t.task_id FROM generate_series(1, 384))::vector
FROM index_task t CROSS JOIN generate_series(0, %(chunks)s - 1) AS o
WHERE t.tenant_id = %(tenant)s AND t.document_id ^@ 'seed-';

-- name: bench_scale_build_hnsw
-- Benchmark only: the product's graph, as migration 0021 leaves it (name, operator class, m, ef_construction).
CREATE INDEX chunk_embedding_hnsw_idx ON chunk USING hnsw (embedding vector_cosine_ops)
    WITH (m = 24, ef_construction = 100);

-- name: bench_scale_build_memory
-- Benchmark only: let the graph build in memory (1M vectors of m = 24 take ~2 GB; at 1 GB the build spills to
-- disk and took over 40 min instead of ~10).
SELECT set_config('maintenance_work_mem', '4GB', false) AS maintenance_work_mem;

-- name: bench_scale_live_keys
-- Benchmark only: the newest seeded versions' partition keys (those still inside the lineage window).
SELECT partition_key FROM document_version
WHERE tenant_id = %(tenant)s AND document_id ^@ 'seed-'
ORDER BY length(document_id) DESC, document_id DESC LIMIT %(count)s;

-- name: bench_scale_analyze
-- Benchmark only: fresh statistics and visibility after the bulk load, so that autovacuum does not wake up
-- for the freshly inserted rows (and their HNSW graph) during the measured burst, which a corpus that grew
-- over months would not see. Run outside a transaction.
VACUUM (ANALYZE);

-- name: bench_scale_checkpoint
-- Benchmark only: write the bulk load's dirty pages out before the burst is measured (needs a superuser or
-- pg_checkpoint, as the bench's own embedded server has).
CHECKPOINT;

-- name: bench_scale_index_counts
-- Benchmark only: what a round left in the index for one tenant (the rounds' work must match: the same
-- versions pointed, the same chunks and lexical rows), and how many of its tasks did not succeed.
SELECT (SELECT count(*) FROM search_pointer WHERE tenant_id = %(tenant)s)::integer AS pointers,
       (SELECT count(*) FROM chunk WHERE tenant_id = %(tenant)s)::integer AS chunks,
       (SELECT count(*) FROM lexical_chunk WHERE tenant_id = %(tenant)s)::integer AS lexical_chunks,
       (SELECT count(*) FROM index_task WHERE tenant_id = %(tenant)s AND status <> 'SUCCEEDED')::integer AS unfinished;
