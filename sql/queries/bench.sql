-- Statements used only by benchmarks (bench/), never by the product.

-- name: bench_shadow_profile
-- Benchmark only: a profile being built beside the active one.
INSERT INTO index_profile (name, model, dimension, chunk_tokens, chunk_overlap, building)
VALUES ('bench-shadow', 'fake-384', 384, 128, 16, true)
ON CONFLICT (name) DO NOTHING;

-- name: bench_reindex_backlog
-- Benchmark only: a PENDING REINDEX task under the shadow profile for every version from %(first)s on.
INSERT INTO index_task (tenant_id, document_id, version_number, task_type, profile)
SELECT tenant_id, document_id, version_number, 'REINDEX', 'bench-shadow'
FROM document_version
WHERE version_number >= %(first)s
ON CONFLICT DO NOTHING;

-- name: abuse_bench_finish_tasks
-- Benchmark only (bench/abuse): mark a bulk-loaded slice SUCCEEDED with a spread of publish-to-searchable
-- times, so /metrics' histogram has a million rows to count.
UPDATE index_task t
SET status = 'SUCCEEDED', finished_at = t.created_at + make_interval(secs => mod(t.task_id, 600)::float8),
    updated_at = now()
WHERE t.tenant_id = %(tenant)s AND t.status = 'PENDING';
