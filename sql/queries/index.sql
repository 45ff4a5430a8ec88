-- Statements of the fenced publish transaction (resources/index_sink.py, DESIGN.md invariants 3-5).
-- They run inside one transaction that first locks the task row with task_lock_fenced.

-- name: search_pointer_advance
-- Point search at each of these versions unless a newer one is already pointed (forward only; same version:
-- refresh). Parallel arrays, one row per version, at most one per (tenant, document, profile). The pointer
-- takes the version's metadata and allow list with it, in this statement: what search may read changes at
-- the instant of the flip (DESIGN.md invariant 8). Rows are taken in key order, so two publishes lock
-- pointer rows in the same order; the ON CONFLICT row lock serializes concurrent publishes of one document.
-- Returns the task ids that moved their pointer: a version missing from the rows is superseded. The publish
-- itself uses search_pointer_advance_fenced (keys from the locked task rows); this one, keys given, is the bench's
-- bare system's (bench/pipeline/bare_system.py), which writes the same rows with no queue.
INSERT INTO search_pointer AS p (tenant_id, document_id, profile, version_number, task_id, chunk_count, metadata,
                                 allow_principals, updated_at)
SELECT r.tenant_id, r.document_id, r.profile, r.version_number, r.task_id, r.chunk_count, v.metadata,
       v.allow_principals, now()
FROM unnest(%(tenant_ids)s::text[], %(document_ids)s::text[], %(profiles)s::text[], %(version_numbers)s::integer[],
            %(task_ids)s::bigint[], %(chunk_counts)s::integer[])
     AS r (tenant_id, document_id, profile, version_number, task_id, chunk_count)
JOIN document_version v
  ON v.tenant_id = r.tenant_id AND v.document_id = r.document_id AND v.version_number = r.version_number
ORDER BY r.tenant_id, r.document_id, r.profile
ON CONFLICT (tenant_id, document_id, profile) DO UPDATE
SET version_number   = EXCLUDED.version_number,
    task_id          = EXCLUDED.task_id,
    chunk_count      = EXCLUDED.chunk_count,
    metadata         = EXCLUDED.metadata,
    allow_principals = EXCLUDED.allow_principals,
    updated_at       = EXCLUDED.updated_at
WHERE p.version_number <= EXCLUDED.version_number
RETURNING p.task_id;

-- name: search_pointer_advance_fenced
-- search_pointer_advance for the publish transaction's leases, sent right after task_lock_fenced without waiting
-- for it: each version's key (tenant, document, profile, version) is read from its task row, and only where the
-- fence holds (RUNNING, this owner and attempt, lease unexpired: the rows task_lock_fenced just locked), so a lost
-- lease moves nothing and the caller's idea of the version is never trusted. Otherwise as search_pointer_advance:
-- forward only, the version's metadata and allow list with it, rows in key order. Returns each moved pointer's
-- task id.
INSERT INTO search_pointer AS p (tenant_id, document_id, profile, version_number, task_id, chunk_count, metadata,
                                 allow_principals, updated_at)
SELECT t.tenant_id, t.document_id, t.profile, t.version_number, t.task_id, l.chunk_count, v.metadata,
       v.allow_principals, now()
FROM unnest(%(task_ids)s::bigint[], %(attempts)s::integer[], %(chunk_counts)s::integer[])
     AS l (task_id, attempt, chunk_count)
JOIN index_task t ON t.task_id = l.task_id AND t.attempts = l.attempt
JOIN document_version v
  ON v.tenant_id = t.tenant_id AND v.document_id = t.document_id AND v.version_number = t.version_number
WHERE t.status = 'RUNNING'
  AND t.lease_owner = %(owner)s
  AND t.lease_until > coalesce(%(now)s::timestamptz, now())
ORDER BY t.tenant_id, t.document_id, t.profile
ON CONFLICT (tenant_id, document_id, profile) DO UPDATE
SET version_number   = EXCLUDED.version_number,
    task_id          = EXCLUDED.task_id,
    chunk_count      = EXCLUDED.chunk_count,
    metadata         = EXCLUDED.metadata,
    allow_principals = EXCLUDED.allow_principals,
    updated_at       = EXCLUDED.updated_at
WHERE p.version_number <= EXCLUDED.version_number
RETURNING p.task_id;

-- name: search_pointer_get
-- The version search currently reads for one document under one profile (none: never published).
SELECT tenant_id, document_id, profile, version_number, task_id, chunk_count, updated_at
FROM search_pointer
WHERE tenant_id = %(tenant_id)s AND document_id = %(document_id)s AND profile = %(profile)s;

-- name: chunk_delete_stale
-- Drop rows of these versions (parallel arrays, one row per version + profile) that the new chunk sets do
-- not contain (a re-run with a changed chunker); ``chunk_ids`` is every new chunk id of all of them (ids
-- are unique across versions).
DELETE FROM chunk c
USING unnest(%(tenant_ids)s::text[], %(document_ids)s::text[], %(profiles)s::text[], %(version_numbers)s::integer[])
      AS v (tenant_id, document_id, profile, version_number)
WHERE c.tenant_id = v.tenant_id
  AND c.document_id = v.document_id
  AND c.profile = v.profile
  AND c.version_number = v.version_number
  AND c.chunk_id <> ALL (%(chunk_ids)s::text[]);

-- name: chunk_upsert
-- Write a batch of chunks, of one version or several, in one statement (parallel arrays, unnested; each
-- row names its version). Stable ids make a re-run rewrite nothing: an existing row is updated only if
-- something in it differs, and never one of another version. embed_digest is the sha256 of the text the
-- vector was computed from (NULL if the caller did not say): embedding reuse. heading_paths are JSON
-- arrays of strings, one per chunk (text[] cannot be ragged). context_title: the document title a context
-- profile embedded and lexically indexed with the chunk (NULL without context, migration 0049).
INSERT INTO chunk AS c (chunk_id, tenant_id, document_id, version_number, profile, ordinal,
                        heading_path, page, text, token_count, content_digest, embed_digest, embedding,
                        context_title)
SELECT r.chunk_id, r.tenant_id, r.document_id, r.version_number, r.profile, r.ordinal,
       ARRAY(SELECT jsonb_array_elements_text(r.heading_path)), r.page, r.text, r.token_count,
       r.content_digest, r.embed_digest, r.embedding, r.context_title
FROM unnest(%(chunk_ids)s::text[], %(tenant_ids)s::text[], %(document_ids)s::text[], %(version_numbers)s::integer[],
            %(profiles)s::text[], %(ordinals)s::integer[], %(heading_paths)s::jsonb[], %(pages)s::integer[],
            %(texts)s::text[], %(token_counts)s::integer[], %(content_digests)s::text[], %(embed_digests)s::text[],
            %(embeddings)b::vector[], %(context_titles)s::text[])
     AS r (chunk_id, tenant_id, document_id, version_number, profile, ordinal, heading_path, page, text,
           token_count, content_digest, embed_digest, embedding, context_title)
ON CONFLICT (chunk_id) DO UPDATE
SET ordinal        = EXCLUDED.ordinal,
    heading_path   = EXCLUDED.heading_path,
    page           = EXCLUDED.page,
    text           = EXCLUDED.text,
    token_count    = EXCLUDED.token_count,
    content_digest = EXCLUDED.content_digest,
    embed_digest   = EXCLUDED.embed_digest,
    embedding      = EXCLUDED.embedding,
    context_title  = EXCLUDED.context_title
WHERE (c.tenant_id, c.document_id, c.version_number, c.profile) =
      (EXCLUDED.tenant_id, EXCLUDED.document_id, EXCLUDED.version_number, EXCLUDED.profile)
  AND (c.ordinal, c.heading_path, c.page, c.text, c.token_count, c.content_digest, c.embed_digest, c.embedding,
       c.context_title)
      IS DISTINCT FROM
      (EXCLUDED.ordinal, EXCLUDED.heading_path, EXCLUDED.page, EXCLUDED.text, EXCLUDED.token_count,
       EXCLUDED.content_digest, EXCLUDED.embed_digest, EXCLUDED.embedding, EXCLUDED.context_title);

-- name: index_rows_check
-- The publish's count check, sent with COMMIT (waits for nothing): each version must have as many chunk rows and
-- lexical rows under its profile as the publish wrote (%(expected)s), else the server raises SQLSTATE KB002
-- CHUNK_ID_CLASH (kbindex_publish_abort, migration 0055; detail: task id, chunk rows, lexical rows, expected) and
-- the transaction aborts: a chunk id already held by another version or profile, refused rather than published
-- with a gap.
SELECT bool_and(kbindex_publish_abort(
           CASE WHEN n.chunks <> n.expected OR n.lexical <> n.expected THEN 'CHUNK_ID_CLASH' END,
           n.task_id, n.chunks || ' ' || n.lexical || ' ' || n.expected)) AS ok
FROM (
    SELECT v.task_id, v.expected,
           (SELECT count(*) FROM chunk c
            WHERE c.tenant_id = v.tenant_id AND c.document_id = v.document_id
              AND c.profile = v.profile AND c.version_number = v.version_number)::integer AS chunks,
           (SELECT count(*) FROM lexical_chunk l
            WHERE l.tenant_id = v.tenant_id AND l.document_id = v.document_id
              AND l.profile = v.profile AND l.version_number = v.version_number)::integer AS lexical
    FROM unnest(%(task_ids)s::bigint[], %(tenant_ids)s::text[], %(document_ids)s::text[], %(profiles)s::text[],
                %(version_numbers)s::integer[], %(expected)s::integer[])
         AS v (task_id, tenant_id, document_id, profile, version_number, expected)
) n;

-- name: task_event_superseded
-- Note on the task's history that its version was not written because a newer one is already searchable.
INSERT INTO task_event (task_id, kind, attempt, from_status, to_status, stage, lease_owner, message)
VALUES (%(task_id)s, 'progress', %(attempt)s, 'RUNNING', 'RUNNING', 'publish', %(owner)s, %(message)s);
