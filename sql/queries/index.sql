-- Statements of the fenced publish transaction (resources/index_sink.py, DESIGN.md invariants 3-5).
-- They run inside one transaction that first locks the task row with task_lock_fenced.

-- name: search_pointer_advance
-- Point search at this version unless a newer one is already pointed (forward only; same version: refresh).
-- The ON CONFLICT row lock serializes concurrent publishes of one document; no row back = superseded.
INSERT INTO search_pointer AS p (tenant_id, document_id, profile, version_number, task_id, chunk_count, updated_at)
VALUES (%(tenant_id)s, %(document_id)s, %(profile)s, %(version_number)s, %(task_id)s, %(chunk_count)s, now())
ON CONFLICT (tenant_id, document_id, profile) DO UPDATE
SET version_number = EXCLUDED.version_number,
    task_id        = EXCLUDED.task_id,
    chunk_count    = EXCLUDED.chunk_count,
    updated_at     = EXCLUDED.updated_at
WHERE p.version_number <= EXCLUDED.version_number
RETURNING p.version_number;

-- name: search_pointer_get
-- The version search currently reads for one document under one profile (none: never published).
SELECT tenant_id, document_id, profile, version_number, task_id, chunk_count, updated_at
FROM search_pointer
WHERE tenant_id = %(tenant_id)s AND document_id = %(document_id)s AND profile = %(profile)s;

-- name: chunk_delete_stale
-- Drop rows of this version + profile that the new chunk set does not contain (a re-run with a changed chunker).
DELETE FROM chunk
WHERE tenant_id = %(tenant_id)s
  AND document_id = %(document_id)s
  AND profile = %(profile)s
  AND version_number = %(version_number)s
  AND chunk_id <> ALL (%(chunk_ids)s::text[]);

-- name: chunk_upsert
-- Write a batch of chunks in one statement (parallel arrays, unnested). Stable ids make a re-run
-- rewrite nothing: an existing row is updated only if something in it differs. embed_digest is the
-- sha256 of the text the vector was computed from (NULL if the caller did not say): embedding reuse.
-- heading_paths are JSON arrays of strings, one per chunk (text[] cannot be ragged).
INSERT INTO chunk AS c (chunk_id, tenant_id, document_id, version_number, profile, ordinal,
                        heading_path, page, text, token_count, content_digest, embed_digest, embedding)
SELECT r.chunk_id, %(tenant_id)s, %(document_id)s, %(version_number)s, %(profile)s, r.ordinal,
       ARRAY(SELECT jsonb_array_elements_text(r.heading_path)), r.page, r.text, r.token_count,
       r.content_digest, r.embed_digest, r.embedding
FROM unnest(%(chunk_ids)s::text[], %(ordinals)s::integer[], %(heading_paths)s::jsonb[], %(pages)s::integer[],
            %(texts)s::text[], %(token_counts)s::integer[], %(content_digests)s::text[], %(embed_digests)s::text[],
            %(embeddings)b::vector[])
     AS r (chunk_id, ordinal, heading_path, page, text, token_count, content_digest, embed_digest, embedding)
ON CONFLICT (chunk_id) DO UPDATE
SET ordinal        = EXCLUDED.ordinal,
    heading_path   = EXCLUDED.heading_path,
    page           = EXCLUDED.page,
    text           = EXCLUDED.text,
    token_count    = EXCLUDED.token_count,
    content_digest = EXCLUDED.content_digest,
    embed_digest   = EXCLUDED.embed_digest,
    embedding      = EXCLUDED.embedding
WHERE (c.tenant_id, c.document_id, c.version_number, c.profile) =
      (EXCLUDED.tenant_id, EXCLUDED.document_id, EXCLUDED.version_number, EXCLUDED.profile)
  AND (c.ordinal, c.heading_path, c.page, c.text, c.token_count, c.content_digest, c.embed_digest, c.embedding)
      IS DISTINCT FROM
      (EXCLUDED.ordinal, EXCLUDED.heading_path, EXCLUDED.page, EXCLUDED.text, EXCLUDED.token_count,
       EXCLUDED.content_digest, EXCLUDED.embed_digest, EXCLUDED.embedding);

-- name: chunk_count_version
-- How many chunk rows one version has under one profile.
SELECT count(*)::integer AS n
FROM chunk
WHERE tenant_id = %(tenant_id)s AND document_id = %(document_id)s
  AND profile = %(profile)s AND version_number = %(version_number)s;

-- name: task_event_superseded
-- Note on the task's history that its version was not written because a newer one is already searchable.
INSERT INTO task_event (task_id, kind, attempt, from_status, to_status, stage, lease_owner, message)
VALUES (%(task_id)s, 'progress', %(attempt)s, 'RUNNING', 'RUNNING', 'publish', %(owner)s, %(message)s);
