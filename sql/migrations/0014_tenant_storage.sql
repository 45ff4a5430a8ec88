-- Disk hardening (issue #17): per-tenant stored bytes for a quota, and garbage collection of blobs.
-- tenant_storage.stored_bytes is charged by each new version (in the publish transaction) and given back
-- when retention deletes the blob its versions shared (document_version.bytes_released_at).

CREATE TABLE tenant_storage (
    tenant_id    text PRIMARY KEY,
    stored_bytes bigint NOT NULL DEFAULT 0
);

ALTER TABLE document_version ADD COLUMN bytes_released_at timestamptz;

-- Blob garbage collection asks, for a batch of content hashes, which ones a version still needs.
CREATE INDEX document_version_content_hash_idx ON document_version (content_hash);

INSERT INTO tenant_storage (tenant_id, stored_bytes)
SELECT tenant_id, sum(byte_size)
FROM document_version
GROUP BY tenant_id;
