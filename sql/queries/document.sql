-- name: document_lock
-- Create the document if new and lock its row for this transaction: serializes publishes of one document.
INSERT INTO document (tenant_id, document_id)
VALUES (%(tenant_id)s, %(document_id)s)
ON CONFLICT (tenant_id, document_id) DO UPDATE SET latest_version = document.latest_version
RETURNING latest_version;

-- name: document_version_latest
-- The newest version of a document (its bytes, metadata and allow list decide whether a publish is a duplicate;
-- a tombstone has no bytes, so a publish after a delete is always a new version).
SELECT version_number, content_hash, kind, filename, media_type, metadata, allow_principals
FROM document_version
WHERE tenant_id = %(tenant_id)s AND document_id = %(document_id)s
ORDER BY version_number DESC
LIMIT 1;

-- name: document_version_latest_many
-- document_version_latest for each of a batch's documents (publish_many), in one statement: one backward
-- primary-key step per document, as the single statement takes; a document without versions has no row.
SELECT ids.document_id, v.version_number, v.content_hash, v.kind, v.filename, v.media_type, v.metadata,
       v.allow_principals
FROM unnest(%(document_ids)s::text[]) AS ids(document_id)
CROSS JOIN LATERAL (
    SELECT version_number, content_hash, kind, filename, media_type, metadata, allow_principals
    FROM document_version
    WHERE tenant_id = %(tenant_id)s AND document_id = ids.document_id
    ORDER BY version_number DESC
    LIMIT 1
) v;

-- name: document_version_insert
-- Record a new immutable version (%(kind)s: content, or a tombstone without bytes) with its canonical metadata
-- (JSON) and allow list (NULL: the whole tenant), and move the document's latest_version to it.
WITH v AS (
    INSERT INTO document_version
        (tenant_id, document_id, version_number, kind, content_hash, byte_size, filename, media_type, partition_key,
         metadata, allow_principals)
    VALUES (%(tenant_id)s, %(document_id)s, %(version)s, %(kind)s, %(content_hash)s, %(byte_size)s, %(filename)s,
            %(media_type)s, %(partition_key)s, %(metadata)s::jsonb, %(allow_principals)s::text[])
    RETURNING tenant_id, document_id, version_number
)
UPDATE document d SET latest_version = v.version_number
FROM v
WHERE d.tenant_id = v.tenant_id AND d.document_id = v.document_id;

-- name: document_lock_existing
-- Lock an existing document's row for this transaction (a delete serializes with publishes of it like they do
-- with each other); no row: the document was never published, and nothing is created for it.
SELECT latest_version
FROM document
WHERE tenant_id = %(tenant_id)s AND document_id = %(document_id)s
FOR UPDATE;

-- name: index_task_ensure
-- One INDEX task per target profile (the active one and any being built) for a version, idempotent on
-- the business key; new tasks get their PENDING event in the same statement (the event trigger NOTIFYs).
-- An existing CANCELLED task is re-queued (the owner asked again, DESIGN.md): same row, attempts kept,
-- %(max_attempts)s more granted, CANCELLED -> PENDING event. Other existing tasks are returned unchanged. Each row carries
-- its profile's dimension (the fast path's empty or copied vectors need it: no lookup of its own) and its attempts
-- (the fast path claims the task in its publish transaction, fenced on the attempt that claim grants: attempts + 1).
WITH targets AS (
    SELECT name FROM index_profile WHERE is_active OR building
),
inserted AS (
    INSERT INTO index_task (tenant_id, document_id, version_number, task_type, profile, max_attempts)
    SELECT %(tenant_id)s, %(document_id)s, %(version)s, 'INDEX', targets.name, %(max_attempts)s
    FROM targets
    ON CONFLICT (tenant_id, document_id, version_number, task_type, profile) DO NOTHING
    RETURNING task_id, profile, status
),
published_event AS (
    INSERT INTO task_event (task_id, attempt, from_status, to_status, message)
    SELECT task_id, 0, NULL, 'PENDING', 'published'
    FROM inserted
),
-- The guard re-checks CANCELLED after any row lock wait, so a task moved meanwhile is left alone.
requeued AS (
    UPDATE index_task t
    SET status          = 'PENDING',
        max_attempts    = t.attempts + %(max_attempts)s,
        next_attempt_at = now(),
        finished_at     = NULL,
        updated_at      = now()
    FROM targets
    WHERE t.profile = targets.name
      AND t.tenant_id = %(tenant_id)s AND t.document_id = %(document_id)s
      AND t.version_number = %(version)s AND t.task_type = 'INDEX'
      AND t.status = 'CANCELLED'
    RETURNING t.task_id, t.attempts, t.status
),
requeued_event AS (
    INSERT INTO task_event (task_id, attempt, from_status, to_status, message)
    SELECT task_id, attempts, 'CANCELLED', 'PENDING', 'published again'
    FROM requeued
)
SELECT i.task_id, i.profile, i.status, 0 AS attempts, true AS created, false AS requeued, p.is_active, p.dimension
FROM inserted i JOIN index_profile p ON p.name = i.profile
UNION ALL
-- Rows inserted or updated above are invisible to this part of the same statement (it reads the
-- statement's snapshot): these are the existing tasks, with the status a re-queue gave them.
SELECT t.task_id, t.profile, coalesce(r.status, t.status), t.attempts, false AS created,
       r.task_id IS NOT NULL AS requeued,
       p.is_active, p.dimension
FROM index_task t
JOIN targets ON targets.name = t.profile
JOIN index_profile p ON p.name = t.profile
LEFT JOIN requeued r ON r.task_id = t.task_id
WHERE t.tenant_id = %(tenant_id)s AND t.document_id = %(document_id)s
  AND t.version_number = %(version)s AND t.task_type = 'INDEX';

-- name: document_version_get
-- One version's stored facts (where its bytes are, what it is called).
SELECT tenant_id, document_id, version_number, kind, content_hash, byte_size, filename, media_type, partition_key,
       published_at, metadata, allow_principals
FROM document_version
WHERE tenant_id = %(tenant_id)s AND document_id = %(document_id)s AND version_number = %(version)s;

-- name: document_versions_by_partition_keys
-- The versions these Dagster partition keys name (looked up, never parsed), in one statement for a run's
-- keys; unknown keys have no row.
SELECT tenant_id, document_id, version_number, kind, content_hash, byte_size, filename, media_type, partition_key,
       published_at, metadata, allow_principals
FROM document_version
WHERE partition_key = ANY(%(partition_keys)s::text[]);

-- name: document_version_partition_keys
-- Partition keys (and byte sizes) of the task ids given, in the order given (the claiming sensor
-- batches runs by key and balances them by size).
SELECT t.task_id, v.partition_key, v.byte_size
FROM unnest(%(task_ids)s::bigint[]) WITH ORDINALITY AS ids(task_id, ord)
JOIN index_task t ON t.task_id = ids.task_id
JOIN document_version v
  ON v.tenant_id = t.tenant_id AND v.document_id = t.document_id AND v.version_number = t.version_number
ORDER BY ids.ord;

-- name: index_task_tenant_summary
-- Task counts by status for one tenant (kbindex dev reports when the sample corpus is indexed).
SELECT status, count(*)::int AS n
FROM index_task
WHERE tenant_id = %(tenant_id)s
GROUP BY status;
