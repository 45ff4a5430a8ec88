-- Stored document bytes per tenant (quota) and garbage collection of unreferenced blobs (resources/blob_gc.py).

-- name: tenant_storage_charge
-- Add a new version's bytes and the version itself to its tenant's totals, in the publish transaction; the
-- caller compares the returned totals with the quotas and rolls the publish back when one is passed. The row
-- lock serializes one tenant's concurrent publishes for the rest of their (short) transactions, so the quotas
-- hold exactly.
INSERT INTO tenant_storage AS s (tenant_id, stored_bytes, live_versions)
VALUES (%(tenant_id)s, %(byte_size)s, 1)
ON CONFLICT (tenant_id) DO UPDATE SET stored_bytes = s.stored_bytes + EXCLUDED.stored_bytes,
                                      live_versions = s.live_versions + 1
RETURNING s.stored_bytes, s.live_versions;

-- name: publish_refusals
-- A single publish's last statement before COMMIT, sent with it: raises SQLSTATE KB001 (kbindex_refuse, migration
-- 0054) if no profile is active or being built (so the version got no task: NO_ACTIVE_PROFILE) or, when the
-- publish charged the tenant (%(charged)s), if the charged totals pass a quota (QUOTA_BYTES, QUOTA_VERSIONS; a
-- NULL quota is none). The totals row is locked by the charge, so they are exact.
SELECT kbindex_refuse(
    CASE
        WHEN NOT EXISTS (SELECT 1 FROM index_profile WHERE is_active OR building) THEN 'NO_ACTIVE_PROFILE'
        WHEN %(charged)s AND s.stored_bytes > %(quota_bytes)s::bigint THEN 'QUOTA_BYTES'
        WHEN %(charged)s AND s.live_versions > %(quota_versions)s::bigint THEN 'QUOTA_VERSIONS'
    END,
    coalesce(s.stored_bytes, 0), coalesce(s.live_versions, 0)) AS accepted
FROM (SELECT 1) AS one
LEFT JOIN tenant_storage s ON s.tenant_id = %(tenant_id)s;

-- name: tenant_storage_lock
-- A publish_many batch locks its tenant's totals once, after its documents (the order every publish takes
-- them in), and returns them: it admits each document against them itself, then adds its sum once
-- (tenant_storage_add). A thousand updates of one row in one transaction would each walk the row's
-- versions written before it (0.7 ms a document at 1,000, against 0.1 ms for one).
INSERT INTO tenant_storage AS s (tenant_id, stored_bytes, live_versions)
VALUES (%(tenant_id)s, 0, 0)
ON CONFLICT (tenant_id) DO UPDATE SET stored_bytes = s.stored_bytes
RETURNING s.stored_bytes, s.live_versions;

-- name: tenant_storage_add
-- A batch's new versions and their bytes, added to its tenant's totals (locked by tenant_storage_lock).
UPDATE tenant_storage
SET stored_bytes = stored_bytes + %(byte_size)s, live_versions = live_versions + %(versions)s
WHERE tenant_id = %(tenant_id)s;

-- name: tenant_storage_get
SELECT coalesce(max(stored_bytes), 0)::bigint AS stored_bytes, coalesce(max(live_versions), 0)::bigint AS live_versions
FROM tenant_storage
WHERE tenant_id = %(tenant_id)s;

-- name: blob_live_hashes
-- Of the listed content hashes, those some version still needs: its document's latest version, a version a
-- search pointer names, one with an open task or a task changed within the window, one published within
-- the window. Any other blob (no version at all: a publish that failed after storing its bytes; or only
-- long-superseded versions) may be deleted.
SELECT DISTINCT v.content_hash
FROM document_version v
JOIN document d ON d.tenant_id = v.tenant_id AND d.document_id = v.document_id
WHERE v.content_hash = ANY(%(hashes)s::text[])
  AND v.bytes_released_at IS NULL
  AND (d.latest_version = v.version_number
       OR v.published_at > coalesce(%(now)s::timestamptz, now()) - make_interval(secs => %(window_seconds)s::float8)
       OR EXISTS (SELECT 1 FROM search_pointer p
                  WHERE p.tenant_id = v.tenant_id AND p.document_id = v.document_id
                    AND p.version_number = v.version_number)
       OR EXISTS (SELECT 1 FROM index_task t
                  WHERE t.tenant_id = v.tenant_id AND t.document_id = v.document_id
                    AND t.version_number = v.version_number
                    AND (t.status IN ('PENDING', 'RUNNING', 'RETRY_WAIT')
                         OR t.updated_at > coalesce(%(now)s::timestamptz, now())
                                           - make_interval(secs => %(window_seconds)s::float8))));

-- name: blob_release_versions
-- Mark every version of these (no longer needed) hashes as having lost its bytes and give the bytes back
-- to each tenant's total (and the versions to its live_versions), in one statement. Marked once: running it
-- again changes nothing.
WITH released AS (
    UPDATE document_version v
    SET bytes_released_at = coalesce(%(now)s::timestamptz, now())
    WHERE v.content_hash = ANY(%(hashes)s::text[]) AND v.bytes_released_at IS NULL
    RETURNING v.tenant_id, v.byte_size
),
per_tenant AS (
    SELECT tenant_id, sum(byte_size)::bigint AS bytes, count(*)::bigint AS versions FROM released GROUP BY tenant_id
)
UPDATE tenant_storage s
SET stored_bytes = greatest(s.stored_bytes - p.bytes, 0),
    live_versions = greatest(s.live_versions - p.versions, 0)
FROM per_tenant p
WHERE s.tenant_id = p.tenant_id
RETURNING s.tenant_id, p.bytes AS released_bytes;

-- name: blob_hold
-- A publish holds its content hash, shared, from before it stores the bytes until its version commits: blob
-- garbage collection (blob_collect_lock, exclusive) cannot delete the file in between. Shared: publishes of
-- the same bytes do not wait for each other.
SELECT pg_advisory_xact_lock_shared(hashtextextended('kbindex.blob:' || %(content_hash)s, 0));

-- name: blob_collect_lock
-- Garbage collection takes one hash, exclusive, for its re-check and its delete (a session lock: the release
-- of the versions commits first, the file goes after, the lock spans both). Not granted while a publish of
-- those bytes is between storing them and committing: the blob is left for the next pass.
SELECT pg_try_advisory_lock(hashtextextended('kbindex.blob:' || %(content_hash)s, 0)) AS locked;

-- name: blob_collect_unlock
SELECT pg_advisory_unlock(hashtextextended('kbindex.blob:' || %(content_hash)s, 0)) AS unlocked;
