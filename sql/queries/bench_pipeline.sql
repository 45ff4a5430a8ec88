-- Statements used only by bench/pipeline (the pipeline bench, and the benches built on its Bench: bench/scale
-- small_docs.py, burst.py), never by the product: its progress, timings and end state on the kbindex database
-- (Dagster's storage: bench_dagster.sql).

-- name: bench_pipeline_tenant_states
-- Benchmark only (bench/pipeline): a tenant's tasks by status (progress, quiescence).
SELECT status, count(*) FROM index_task WHERE tenant_id = %(tenant)s GROUP BY status;

-- name: bench_pipeline_tenant_chunks
-- Benchmark only (bench/pipeline): the chunks a tenant's SUCCEEDED tasks wrote so far (the progress line).
SELECT coalesce(sum(chunk_count), 0) FROM index_task WHERE tenant_id = %(tenant)s AND status = 'SUCCEEDED';

-- name: bench_pipeline_tenant_throughput
-- Benchmark only (bench/pipeline): seconds from a tenant's first task created to its last finished (database
-- clock), and the chunks and versions that SUCCEEDED.
SELECT extract(epoch FROM max(coalesce(finished_at, updated_at)) - min(created_at))::float8,
       coalesce(sum(chunk_count) FILTER (WHERE status = 'SUCCEEDED'), 0)::int,
       count(*) FILTER (WHERE status = 'SUCCEEDED')::int
FROM index_task
WHERE tenant_id = %(tenant)s;

-- name: bench_pipeline_pointer_version
-- Benchmark only (bench/pipeline latency): the version a document's pointer names (searchable once it is the new one).
SELECT version_number FROM search_pointer WHERE tenant_id = %(tenant)s AND document_id = %(document_id)s;

-- name: bench_pipeline_task_status
-- Benchmark only (bench/pipeline latency): one task's status and code (a sample that ended DEAD stops the bench).
SELECT status, error_code FROM index_task WHERE task_id = %(task_id)s;

-- name: bench_pipeline_task_events
-- Benchmark only (bench/pipeline): one task's events in order, to time its phases.
SELECT kind, to_status, stage, created_at FROM task_event WHERE task_id = %(task_id)s ORDER BY event_id;

-- name: bench_pipeline_task_times
-- Benchmark only (bench/pipeline): when one task was created and finished.
SELECT created_at, finished_at FROM index_task WHERE task_id = %(task_id)s;

-- name: bench_pipeline_tenant_succeeded_ids
-- Benchmark only (bench/pipeline): a tenant's SUCCEEDED tasks.
SELECT task_id FROM index_task WHERE tenant_id = %(tenant)s AND status = 'SUCCEEDED';

-- name: bench_pipeline_tenant_final_states
-- Benchmark only (bench/pipeline): a tenant's tasks by status and code (STATUS or STATUS:CODE).
SELECT status || coalesce(':' || error_code, ''), count(*)
FROM index_task
WHERE tenant_id = %(tenant)s
GROUP BY 1
ORDER BY 1;

-- name: bench_pipeline_tenant_task_ids
-- Benchmark only (bench/pipeline): every task of a tenant (to find the runs that carried them).
SELECT task_id FROM index_task WHERE tenant_id = %(tenant)s;

-- name: bench_pipeline_embedded_versions
-- Benchmark only (bench/pipeline): a tenant's SUCCEEDED versions with what parsing and chunking them again needs
-- (stored bytes, file name and type, the profile's model and chunking), in task order.
SELECT t.document_id, t.version_number, t.profile, v.content_hash, v.filename, v.media_type,
       p.model, p.chunk_tokens, p.chunk_overlap, p.ocr
FROM index_task t
JOIN document_version v USING (tenant_id, document_id, version_number)
JOIN index_profile p ON p.name = t.profile
WHERE t.tenant_id = %(tenant)s AND t.status = 'SUCCEEDED'
ORDER BY t.task_id;

-- name: bench_bare_set_model
-- Benchmark only (bench/pipeline/bare_system.py): the active profile embeds with the bare system's model (no
-- write when it already does).
UPDATE index_profile SET model = %(model)s WHERE is_active AND model <> %(model)s;

-- name: bench_bare_active_profile
-- Benchmark only (bench/pipeline/bare_system.py): the active profile's model and chunking, which the bare system
-- applies as the pipeline would.
SELECT name, model, chunk_tokens, chunk_overlap, ocr, lexical_analyzer FROM index_profile WHERE is_active;
