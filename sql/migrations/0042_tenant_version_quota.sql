-- Issue #31 finding 8: a byte quota alone let 1-byte documents create unlimited versions (rows, tasks,
-- partition keys, runs). tenant_storage.live_versions counts a tenant's versions that still hold their
-- place: charged by each new version (content or tombstone) in the publish transaction, in the same row
-- update as stored_bytes (O(1) per publish, no count over the tenant), given back when retention or an
-- erase releases a content version's bytes (bytes_released_at). Tombstones stay counted.
ALTER TABLE tenant_storage ADD COLUMN live_versions bigint NOT NULL DEFAULT 0;

INSERT INTO tenant_storage AS s (tenant_id, live_versions)
SELECT tenant_id, count(*)
FROM document_version
WHERE bytes_released_at IS NULL
GROUP BY tenant_id
ON CONFLICT (tenant_id) DO UPDATE SET live_versions = EXCLUDED.live_versions;
