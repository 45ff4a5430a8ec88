-- Statements of resources/chunk_copy.py: a version whose bytes an earlier version already had (a change of
-- metadata or allow list only) is indexed by copying that version's chunks and vectors, not by parsing
-- and embedding again.

-- name: chunk_copy_sources
-- For each task (parallel arrays), the newest earlier content version of its document, at most 16 back, with
-- the same bytes, filename and media type whose chunks exist under the task's profile; a task without one
-- has no row. One statement for a run's tasks (per-version round trips were most of a small document's
-- cost, issue #14); each probe walks one document's recent versions by primary key.
SELECT w.task_id, s.version_number AS copy_from
FROM unnest(%(task_ids)s::bigint[], %(tenant_ids)s::text[], %(document_ids)s::text[], %(profiles)s::text[],
            %(version_numbers)s::integer[])
     AS w (task_id, tenant_id, document_id, profile, version_number)
JOIN document_version me
  ON me.tenant_id = w.tenant_id AND me.document_id = w.document_id AND me.version_number = w.version_number
CROSS JOIN LATERAL (
    SELECT v.version_number
    FROM document_version v
    WHERE v.tenant_id = w.tenant_id AND v.document_id = w.document_id
      AND v.version_number < w.version_number AND v.version_number >= w.version_number - 16
      AND v.kind = 'content' AND v.erased_at IS NULL
      AND v.content_hash = me.content_hash AND v.filename = me.filename AND v.media_type = me.media_type
      AND EXISTS (SELECT 1 FROM chunk c
                  WHERE c.tenant_id = v.tenant_id AND c.document_id = v.document_id
                    AND c.profile = w.profile AND c.version_number = v.version_number)
    ORDER BY v.version_number DESC
    LIMIT 1
) s
WHERE me.kind = 'content' AND me.content_hash IS NOT NULL;

-- name: chunk_copy_rows
-- Every chunk of one version under one profile, in order, with its vector and the digest of the text the
-- vector was computed from (so the copy stays reusable by later versions), and the title a context profile
-- indexed it with (the copy's lexical rows read it: the copy does not parse again).
SELECT ordinal, heading_path, page, text, token_count, content_digest, embed_digest, embedding, context_title
FROM chunk
WHERE tenant_id = %(tenant_id)s AND document_id = %(document_id)s AND profile = %(profile)s
  AND version_number = %(version_number)s
ORDER BY ordinal;
