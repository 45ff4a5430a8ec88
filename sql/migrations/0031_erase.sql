-- Erase (issue 29, item 2): a delete followed by the purge of every stored copy of the document's content.
--
-- The version and task rows stay (history, the task state machine, forward-only pointers and the business
-- key need them), but an erased version no longer names its bytes: erased_at is set, content_hash goes to
-- NULL (nothing can read or re-index the bytes again, and a retry of its task is refused) and filename
-- becomes 'erased' (a filename can be user data: "jane-doe-dismissal.pdf"). byte_size and media_type stay.
ALTER TABLE document_version
    ADD COLUMN erased_at timestamptz,
    DROP CONSTRAINT document_version_bytes_by_kind,
    ADD CONSTRAINT document_version_bytes_by_kind
        CHECK (CASE kind WHEN 'content' THEN content_hash IS NOT NULL OR erased_at IS NOT NULL
                         ELSE content_hash IS NULL AND byte_size = 0 END);

-- One row per erase: who was erased and what was removed, counts and times only, never content.
-- finished_at stays NULL if the process died between the database purge and the file purge (the receipt
-- then never reached the caller: erase again, it is idempotent).
CREATE TABLE document_erasure (
    erasure_id        bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    tenant_id         text NOT NULL,
    document_id       text NOT NULL,
    tombstone_version integer NOT NULL,
    removed           jsonb NOT NULL DEFAULT '{}',
    not_removed       jsonb NOT NULL DEFAULT '[]',
    started_at        timestamptz NOT NULL DEFAULT now(),
    finished_at       timestamptz,
    FOREIGN KEY (tenant_id, document_id) REFERENCES document (tenant_id, document_id)
);
CREATE INDEX document_erasure_document_idx ON document_erasure (tenant_id, document_id, erasure_id);
