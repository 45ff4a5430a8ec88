-- Erase (issue 29, item 2; resources/eraser.py): after the tombstone, purge every stored copy of every version of
-- one document in ONE transaction. The statements run in this order, after document_lock_existing:
-- erase_index_task_lock, task_cancel (the document's open content tasks), erase_search_pointer_delete,
-- lexical_stats_reconcile (per profile), then the deletes and strips below, then document_erasure_insert.

-- name: erase_index_task_lock
-- Lock every task of the document, in task-id order (the publish transaction locks task rows first too): a
-- publish of one of them either committed before this statement, and its rows are purged below, or waits and
-- then finds its task CANCELLED (its fence fails, it writes nothing). With each task, its version's kind.
SELECT t.task_id, t.status, t.version_number, t.profile, v.kind
FROM index_task t
JOIN document_version v
  ON v.tenant_id = t.tenant_id AND v.document_id = t.document_id AND v.version_number = t.version_number
WHERE t.tenant_id = %(tenant_id)s AND t.document_id = %(document_id)s
ORDER BY t.task_id
FOR UPDATE OF t;

-- name: erase_search_pointer_delete
-- Drop the document's pointers that name a content version (a pointer already on a tombstone names no content
-- and stays): search returns nothing of the document from this commit on, without waiting for the tombstone's
-- run, whose publish later inserts the pointer on the tombstone (forward only). The pointer's trigger records
-- superseded_version rows, which erase_superseded_version_delete removes.
DELETE FROM search_pointer p
USING document_version v
WHERE p.tenant_id = %(tenant_id)s AND p.document_id = %(document_id)s
  AND v.tenant_id = p.tenant_id AND v.document_id = p.document_id AND v.version_number = p.version_number
  AND v.kind = 'content'
RETURNING p.profile, p.version_number;

-- name: erase_lexical_document_profiles
-- The profiles whose BM25 statistics count (or counted) something of the document: each is reconciled.
SELECT profile FROM lexical_document
WHERE tenant_id = %(tenant_id)s AND document_id = %(document_id)s
ORDER BY profile;

-- name: erase_lexical_document_delete
-- The document's BM25 ledger rows, once reconciled (they then count nothing): term ids derived from its text.
DELETE FROM lexical_document
WHERE tenant_id = %(tenant_id)s AND document_id = %(document_id)s;

-- name: erase_lexical_posting_delete
-- Every posting of the document's lexical rows, every version and profile (one probe of the unique index per
-- term of each row); counted here, since the rows' delete trigger would remove them uncounted.
DELETE FROM lexical_posting x
USING lexical_chunk l, unnest(l.terms) AS t (term)
WHERE l.tenant_id = %(tenant_id)s AND l.document_id = %(document_id)s
  AND x.tenant_id = l.tenant_id AND x.profile = l.profile AND x.term = t.term AND x.chunk_id = l.chunk_id;

-- name: erase_lexical_chunk_delete
-- The document's lexical rows, every version and profile (its (tenant, profile, document, version) index).
DELETE FROM lexical_chunk l
USING (SELECT name FROM index_profile) AS ip (profile)
WHERE l.tenant_id = %(tenant_id)s AND l.profile = ip.profile AND l.document_id = %(document_id)s;

-- name: erase_chunk_delete
-- The document's chunk rows: text, headings and vectors, every version and profile. Embedding reuse reads its
-- vectors only from these rows (chunk_reuse_lookup), so nothing of the document can be reused after this.
DELETE FROM chunk
WHERE tenant_id = %(tenant_id)s AND document_id = %(document_id)s;

-- name: erase_superseded_version_delete
-- Retention's bookkeeping of the document's superseded versions: their chunks are gone already.
DELETE FROM superseded_version
WHERE tenant_id = %(tenant_id)s AND document_id = %(document_id)s;

-- name: erase_document_version_strip
-- Strip every not yet erased version of the document (the tombstone too): no content hash, filename 'erased'
-- and no metadata (a filename or a metadata value can be user data; the allow list stays, so the erased
-- versions' tasks stay hidden from who could not read them), erased_at set; bytes not yet released go back to the tenant's quota. Returns
-- each stripped version with the hash it had, so the caller can delete the blobs no one else references.
WITH clock AS (
    SELECT coalesce(%(now)s::timestamptz, now()) AS now
),
old AS (
    SELECT v.version_number, v.kind, v.content_hash, v.byte_size, v.bytes_released_at
    FROM document_version v
    WHERE v.tenant_id = %(tenant_id)s AND v.document_id = %(document_id)s AND v.erased_at IS NULL
    FOR UPDATE
),
stripped AS (
    UPDATE document_version v
    SET content_hash      = NULL,
        filename          = 'erased',
        metadata          = '{}'::jsonb,
        erased_at         = (SELECT now FROM clock),
        bytes_released_at = CASE WHEN v.kind = 'content' THEN coalesce(v.bytes_released_at, (SELECT now FROM clock)) END
    FROM old o
    WHERE v.tenant_id = %(tenant_id)s AND v.document_id = %(document_id)s AND v.version_number = o.version_number
    RETURNING v.version_number
),
released AS (
    UPDATE tenant_storage s
    SET stored_bytes = greatest(s.stored_bytes - r.bytes, 0),
        live_versions = greatest(s.live_versions - r.versions, 0)
    FROM (SELECT coalesce(sum(o.byte_size), 0)::bigint AS bytes, count(*)::bigint AS versions FROM old o
          WHERE o.kind = 'content' AND o.bytes_released_at IS NULL) AS r
    WHERE s.tenant_id = %(tenant_id)s AND r.versions > 0
    RETURNING r.bytes
)
SELECT o.version_number, o.kind, o.content_hash, o.byte_size,
       (SELECT count(*) FROM stripped)::integer AS stripped,
       coalesce((SELECT bytes FROM released), 0)::bigint AS released_bytes
FROM old o
ORDER BY o.version_number;

-- name: erase_blob_hashes_referenced
-- Of these content hashes, those another version still names (another document's, in any tenant: blobs are
-- content-addressed and shared): their blob stays, only this document's reference went.
SELECT DISTINCT content_hash
FROM document_version
WHERE content_hash = ANY (%(hashes)s::text[]);

-- name: erase_index_task_strip
-- The document's tasks keep their rows (history, the state machine, the business key) but not their stored
-- error messages: short and sanitized, yet a parser's message may quote the document. The codes stay.
UPDATE index_task
SET error_message = NULL
WHERE tenant_id = %(tenant_id)s AND document_id = %(document_id)s AND error_message IS NOT NULL;

-- name: document_erasure_insert
-- Record the erase in its transaction: counts of what the database purge removed, no content.
INSERT INTO document_erasure (tenant_id, document_id, tombstone_version, removed, started_at)
VALUES (%(tenant_id)s, %(document_id)s, %(tombstone_version)s, %(removed)s::jsonb, coalesce(%(now)s::timestamptz, now()))
RETURNING erasure_id, started_at;

-- name: document_erasure_finish
-- Complete the record once the files are purged: every count, and what could not be removed and why.
UPDATE document_erasure
SET removed = %(removed)s::jsonb, not_removed = %(not_removed)s::jsonb, finished_at = clock_timestamp()
WHERE erasure_id = %(erasure_id)s
RETURNING finished_at;

-- name: erase_vacuum
-- Opt-in after an erase (``kbindex erase --vacuum``): reclaim the dead row versions the purge left in the tables
-- it touched, so their space is reused sooner. Outside any transaction (autocommit); it reads each whole table.
VACUUM (ANALYZE) chunk, lexical_chunk, lexical_posting, lexical_document, search_pointer, superseded_version,
    document_version, index_task;
