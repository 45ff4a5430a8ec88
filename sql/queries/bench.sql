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

-- name: bench_bare_records
-- Benchmark only (bench/pipeline/bare_system.py): the rows the bare system's pointers and chunks refer to, for
-- a batch of first versions of one tenant, in one statement: documents, their versions and each version's
-- INDEX task already SUCCEEDED (no queue, no events). The foreign keys are checked at the end of the
-- statement, so the three inserts may run as sibling parts of one WITH. Returns each version's task id.
WITH r AS (
    SELECT * FROM unnest(%(document_ids)s::text[], %(content_hashes)s::text[], %(byte_sizes)s::bigint[],
                         %(media_types)s::text[], %(partition_keys)s::text[], %(chunk_counts)s::integer[])
         AS r (document_id, content_hash, byte_size, media_type, partition_key, chunk_count)
),
docs AS (
    INSERT INTO document (tenant_id, document_id, latest_version)
    SELECT %(tenant_id)s, r.document_id, 1 FROM r
),
versions AS (
    INSERT INTO document_version (tenant_id, document_id, version_number, content_hash, byte_size, filename,
                                  media_type, partition_key)
    SELECT %(tenant_id)s, r.document_id, 1, r.content_hash, r.byte_size, r.document_id, r.media_type,
           r.partition_key
    FROM r
)
INSERT INTO index_task (tenant_id, document_id, version_number, profile, status, chunk_count, finished_at)
SELECT %(tenant_id)s, r.document_id, 1, %(profile)s, 'SUCCEEDED', r.chunk_count, now()
FROM r
RETURNING task_id, document_id;

-- name: bench_rows_of_tenant
-- Benchmark only: how many chunk rows, lexical rows and search pointers a tenant has (the bare system and the
-- pipeline must end with the same counts: equal work on both sides).
SELECT (SELECT count(*) FROM chunk WHERE tenant_id = %(tenant_id)s)::integer AS chunks,
       (SELECT count(*) FROM lexical_chunk WHERE tenant_id = %(tenant_id)s)::integer AS lexical,
       (SELECT count(*) FROM lexical_posting WHERE tenant_id = %(tenant_id)s)::integer AS postings,
       (SELECT count(*) FROM search_pointer WHERE tenant_id = %(tenant_id)s)::integer AS pointers;

-- name: bench_chaos_open_tasks
-- Benchmark only (bench/chaos/network.py): unfinished tasks to open event streams on before the API host is cut
-- off, the newest first: the last to be claimed, so still open when the cut begins and indexed during it (the
-- RUNNING and oldest due ones, taken first before, were often done before the cut with three claiming sensors).
SELECT task_id, tenant_id, status
FROM index_task
WHERE status IN ('PENDING', 'RUNNING', 'RETRY_WAIT') AND task_type = 'INDEX'
ORDER BY task_id DESC
LIMIT %(n)s;

-- name: bench_chaos_event_watermark
-- Benchmark only (bench/chaos/network.py): the newest task event so far, to count what a fault caused after it.
SELECT coalesce(max(event_id), 0) AS event_id FROM task_event;

-- name: bench_chaos_failures_after
-- Benchmark only (bench/chaos/network.py): runs' failures (RUNNING to RETRY_WAIT or DEAD) by code since an event.
SELECT error_code, count(*) AS n
FROM task_event
WHERE event_id > %(after)s AND kind = 'transition' AND from_status = 'RUNNING'
  AND to_status IN ('RETRY_WAIT', 'DEAD') AND error_code IS NOT NULL
GROUP BY error_code
ORDER BY error_code;

-- name: bench_chaos_task_outcomes
-- Benchmark only (bench/chaos/network.py): where the tasks a fault hit ended, by status and code.
SELECT status, coalesce(error_code, '') AS error_code, count(*) AS n
FROM index_task
WHERE task_id = ANY(%(task_ids)s::bigint[])
GROUP BY 1, 2
ORDER BY 1, 2;

-- name: bench_chaos_mid_embed
-- Benchmark only (bench/chaos/network.py): RUNNING tasks in their embed step with texts still to embed.
SELECT task_id, completed, total
FROM index_task
WHERE status = 'RUNNING' AND stage = 'embed' AND completed < total;

-- name: bench_data_directory
-- Benchmark only (bench/idle.py census): where the bench's own server keeps its data and its log file.
SHOW data_directory;

-- name: bench_log_every_statement
-- Benchmark only (bench/idle.py census): log every statement, on the bench's own server.
ALTER SYSTEM SET log_min_duration_statement = 0;

-- name: bench_log_prefix_with_application
-- Benchmark only (bench/idle.py census): each logged line names its database and application_name
-- (time, pid, database, application; percent signs doubled: run with a parameter mapping, even empty).
ALTER SYSTEM SET log_line_prefix = '%%m [%%p] %%d <%%a> ';

-- name: bench_log_statements_reset
-- Benchmark only (bench/idle.py census): statement logging back to the server's default.
ALTER SYSTEM RESET log_min_duration_statement;

-- name: bench_log_prefix_reset
-- Benchmark only (bench/idle.py census): the log line prefix back to the server's default.
ALTER SYSTEM RESET log_line_prefix;

-- name: bench_reload_config
-- Benchmark only (bench/idle.py census): apply ALTER SYSTEM to every session.
SELECT pg_reload_conf();

-- name: bench_publish_burst
-- Benchmark only (bench/publish.py): a tenant's versions and the writing transactions that made them (xmin);
-- how many carry metadata, and how many distinct allow lists they hold (NULL: none).
SELECT count(*)::int AS versions, count(DISTINCT xmin::text)::int AS transactions,
       count(*) FILTER (WHERE metadata <> '{}'::jsonb)::int AS with_metadata,
       count(DISTINCT allow_principals)::int AS distinct_allow
FROM document_version
WHERE tenant_id = %(tenant_id)s;
