-- Reads of the HTTP API (pipelines/api). Every statement that touches tenant data takes %(tenant_id)s.

-- name: api_token_tenant
-- The tenant of a live (not revoked) API token, looked up by the token's SHA-256 hex.
SELECT tenant_id
FROM api_token
WHERE token_sha256 = %(token_sha256)s AND revoked_at IS NULL;

-- name: api_document_status
-- Per document of one tenant (or just %(document_id)s): its latest version, that version's INDEX task
-- under the active profile, and the version search serves (search_pointer). Newest publish first.
SELECT d.tenant_id, d.document_id, d.latest_version,
       v.filename, v.media_type, v.byte_size, v.published_at,
       p.name AS profile,
       t.task_id, t.status AS task_status, t.stage, t.completed, t.total, t.attempts, t.max_attempts,
       t.error_code, t.error_message, t.created_at AS task_created_at, t.finished_at AS task_finished_at,
       sp.version_number AS searchable_version, sp.chunk_count AS searchable_chunks,
       sp.updated_at AS searchable_since
FROM document d
JOIN document_version v
  ON v.tenant_id = d.tenant_id AND v.document_id = d.document_id AND v.version_number = d.latest_version
LEFT JOIN index_profile p ON p.is_active
LEFT JOIN index_task t
  ON t.tenant_id = d.tenant_id AND t.document_id = d.document_id AND t.version_number = d.latest_version
 AND t.task_type = 'INDEX' AND t.profile = p.name
LEFT JOIN search_pointer sp
  ON sp.tenant_id = d.tenant_id AND sp.document_id = d.document_id AND sp.profile = p.name
WHERE d.tenant_id = %(tenant_id)s
  AND (%(document_id)s::text IS NULL OR d.document_id = %(document_id)s::text)
ORDER BY v.published_at DESC, d.document_id
LIMIT %(limit)s;

-- name: api_task_failures_by_code
-- Failures ever recorded, by error code (each fenced fail or crash that moved a task to RETRY_WAIT or DEAD).
SELECT e.error_code AS code, count(*)::bigint AS n
FROM task_event e
WHERE e.error_code IS NOT NULL AND e.to_status IN ('RETRY_WAIT', 'DEAD')
GROUP BY e.error_code
ORDER BY e.error_code;

-- name: api_publish_latency_histogram
-- Publish -> searchable seconds of every SUCCEEDED task (created_at -> finished_at), as cumulative counts
-- per upper bound in %(bounds)s (float8[]), plus the total count and sum: a Prometheus histogram.
WITH lat AS (
    SELECT extract(epoch FROM (t.finished_at - t.created_at))::float8 AS s
    FROM index_task t
    WHERE t.status = 'SUCCEEDED' AND t.finished_at IS NOT NULL
)
SELECT ARRAY(SELECT (SELECT count(*) FROM lat WHERE lat.s <= b)::bigint
             FROM unnest(%(bounds)s::float8[]) WITH ORDINALITY AS u(b, i) ORDER BY u.i) AS cumulative,
       (SELECT count(*) FROM lat)::bigint AS n,
       (SELECT coalesce(sum(lat.s), 0) FROM lat)::float8 AS total_seconds;

-- name: api_listen_task_event
-- Subscribe this connection to the task_event trigger's wake-ups (the payload is the newest event id).
LISTEN kbindex_task_event;
