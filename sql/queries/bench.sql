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

-- name: bench_set_active_model
-- Benchmark only: the active profile embeds with this model (a fake one, e.g. fake-384: the bench measures the
-- pipeline, not a model; or the model a round names).
UPDATE index_profile SET model = %(model)s WHERE is_active;

-- name: bench_active_model
-- Benchmark only: the model the active profile embeds with.
SELECT model FROM index_profile WHERE is_active;

-- name: bench_client_sessions
-- Benchmark only (bench/abuse, PostgreSQL's own view): how many client sessions the server holds now.
SELECT count(*) FROM pg_stat_activity WHERE backend_type = 'client backend';

-- name: bench_max_connections
-- Benchmark only (bench/abuse): the server's connection limit.
SHOW max_connections;

-- name: bench_backend_pid
-- Benchmark only (bench/cpu.py): this connection's server process, whose parent is the postmaster.
SELECT pg_backend_pid();

-- name: bench_delete_task_phases
-- Benchmark only (bench/delete): where a task's time went, in seconds: its commit to the claim that made it
-- RUNNING, and that claim to finished.
SELECT extract(epoch FROM min(e.created_at) - t.created_at)::float8,
       extract(epoch FROM t.finished_at - min(e.created_at))::float8
FROM index_task t
JOIN task_event e ON e.task_id = t.task_id AND e.to_status = 'RUNNING'
WHERE t.task_id = %(task_id)s
GROUP BY t.created_at, t.finished_at;

-- name: bench_http_remote_tasks
-- Benchmark only (bench/http_provider): the tasks of the profile that embeds through the fake provider.
SELECT task_id FROM index_task WHERE profile = 'remote';

-- name: bench_http_partition_keys
-- Benchmark only (bench/http_provider): every version's partition key, in order.
SELECT partition_key FROM document_version ORDER BY 1;

-- name: bench_http_remote_digests
-- Benchmark only (bench/http_provider): the embed digest of every chunk the remote profile stored.
SELECT embed_digest FROM chunk WHERE profile = 'remote';

-- name: bench_http_remote_states
-- Benchmark only (bench/http_provider): the remote profile's tasks by status.
SELECT status, count(*) FROM index_task WHERE profile = 'remote' GROUP BY 1;

-- name: bench_idle_old_task_event_notify
-- Benchmark only (bench/idle.py, the comparison windows only): migration 0001's trigger function, which notified
-- even for a statement that inserted no task event; migration 0050 replaced it.
CREATE OR REPLACE FUNCTION task_event_notify() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    PERFORM pg_notify('kbindex_task_event', (SELECT coalesce(max(event_id), 0)::text FROM new_events));
    RETURN NULL;
END $$;

-- name: bench_task_events_by_kind
-- Benchmark only (bench/per_version.py): task events by kind (taken before and after a run, the difference counts).
SELECT kind, count(*) FROM task_event GROUP BY kind;

-- name: bench_tenant_succeeded_count
-- Benchmark only (bench/per_version.py): how many of a tenant's tasks SUCCEEDED.
SELECT count(*) FROM index_task WHERE tenant_id = %(tenant)s AND status = 'SUCCEEDED';

-- name: bench_runs_daemon_task_states
-- Benchmark only (bench/scale/runs_daemon.py): these tasks by status.
SELECT status, count(*) FROM index_task WHERE task_id = ANY(%(task_ids)s) GROUP BY 1;

-- name: bench_runs_daemon_last_success
-- Benchmark only (bench/scale/runs_daemon.py): when (epoch seconds) the last of these tasks SUCCEEDED.
SELECT max(extract(epoch FROM created_at))::float8
FROM task_event
WHERE task_id = ANY(%(task_ids)s) AND kind = 'transition' AND to_status = 'SUCCEEDED';

-- name: bench_runs_daemon_claims
-- Benchmark only (bench/scale/runs_daemon.py): every claim of these tasks (task, attempt, epoch seconds).
SELECT task_id, attempt, extract(epoch FROM created_at)::float8
FROM task_event
WHERE task_id = ANY(%(task_ids)s) AND kind = 'transition' AND to_status = 'RUNNING';
