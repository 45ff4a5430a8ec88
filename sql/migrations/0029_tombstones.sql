-- Documents leave (issue 29, item 1): a delete is a new version of the document, a tombstone.
--
-- A tombstone has no bytes: no content hash (so no publish of real bytes can ever equal it, and blob GC,
-- which matches versions by hash, never sees it) and a byte size of 0 (so quota, run sizing and storage
-- release count nothing for it). It gets index tasks like any version (same business key, same claim, same
-- fenced publish); its publish writes no chunks and moves the search pointer onto it, which takes the
-- document out of every search mode at once. Versions published before this migration are content.
ALTER TABLE document_version
    ADD COLUMN kind text NOT NULL DEFAULT 'content' CHECK (kind IN ('content', 'tombstone')),
    ALTER COLUMN content_hash DROP NOT NULL,
    ADD CONSTRAINT document_version_bytes_by_kind
        CHECK (CASE kind WHEN 'content' THEN content_hash IS NOT NULL
                         ELSE content_hash IS NULL AND byte_size = 0 END);
