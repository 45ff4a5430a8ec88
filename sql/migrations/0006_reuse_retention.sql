-- Embedding reuse across versions (resources/embedding_reuse.py) and retention of superseded versions
-- (resources/retention.py).

-- sha256 (hex) of the exact text the model embedded (chunk.embed_text: heading prefix + text). A new
-- version reuses the stored vector of a chunk with the same embed_digest under the same profile and
-- tenant instead of embedding it again. NULL: unknown, never reused.
ALTER TABLE chunk ADD COLUMN embed_digest text CHECK (embed_digest ~ '^[0-9a-f]{64}$');

-- Backfill only where the embedded text is known exactly: a chunk without headings embedded its text
-- as is. With headings the prefix may have been shortened to the chunker's budget (it depends on the
-- tokenizer), so those rows stay NULL until their document is indexed again.
UPDATE chunk SET embed_digest = encode(sha256(convert_to(text, 'UTF8')), 'hex')
WHERE heading_path = '{}';

CREATE INDEX chunk_embed_digest_idx ON chunk (profile, tenant_id, embed_digest) WHERE embed_digest IS NOT NULL;

-- When search stopped reading a version: one row per (document, profile, version) the pointer moved away
-- from (or whose pointer was deleted). Retention deletes the chunks of rows older than its window; a
-- row disappears when the pointer comes back to its version or when retention has removed its chunks.
CREATE TABLE superseded_version (
    tenant_id      text NOT NULL,
    document_id    text NOT NULL,
    profile        text NOT NULL REFERENCES index_profile (name),
    version_number integer NOT NULL,
    superseded_at  timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (tenant_id, document_id, profile, version_number)
);
CREATE INDEX superseded_version_due_idx ON superseded_version (superseded_at);

-- Kept by the database itself, so every way of moving a pointer (publish today, a rollback command
-- tomorrow) records it in the transaction that moves it.
CREATE FUNCTION search_pointer_track_superseded() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    IF TG_OP = 'DELETE' OR (TG_OP = 'UPDATE' AND OLD.version_number <> NEW.version_number) THEN
        INSERT INTO superseded_version (tenant_id, document_id, profile, version_number, superseded_at)
        VALUES (OLD.tenant_id, OLD.document_id, OLD.profile, OLD.version_number, now())
        ON CONFLICT (tenant_id, document_id, profile, version_number)
        DO UPDATE SET superseded_at = EXCLUDED.superseded_at;
    END IF;
    IF TG_OP IN ('INSERT', 'UPDATE') THEN
        DELETE FROM superseded_version
        WHERE tenant_id = NEW.tenant_id AND document_id = NEW.document_id
          AND profile = NEW.profile AND version_number = NEW.version_number;
    END IF;
    RETURN NULL;
END $$;
CREATE TRIGGER search_pointer_track_superseded AFTER INSERT OR UPDATE OR DELETE ON search_pointer
    FOR EACH ROW EXECUTE FUNCTION search_pointer_track_superseded();

-- Versions already superseded before this migration: the pointer's last move is a safe upper bound
-- of when it left them (never earlier than the truth, so no version loses its window).
INSERT INTO superseded_version (tenant_id, document_id, profile, version_number, superseded_at)
SELECT DISTINCT c.tenant_id, c.document_id, c.profile, c.version_number, coalesce(p.updated_at, now())
FROM chunk c
LEFT JOIN search_pointer p
  ON p.tenant_id = c.tenant_id AND p.document_id = c.document_id AND p.profile = c.profile
WHERE p.version_number IS DISTINCT FROM c.version_number;

-- Dagster partition keys retention asked the job to delete, and when the job confirmed it. A key whose
-- version sees task activity after that (a manual retry re-adds it) becomes a candidate again.
CREATE TABLE partition_key_release (
    partition_key text PRIMARY KEY REFERENCES document_version (partition_key) ON DELETE CASCADE,
    released_at   timestamptz NOT NULL DEFAULT now()
);

-- Reuse hands out a profile's stored vectors for its model (invariant 6): a profile's model and dimension
-- are therefore fixed once it has chunks. A new model is a new profile (kbindex profile create).
CREATE FUNCTION index_profile_refuse_model_change() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    IF (NEW.model, NEW.dimension) IS DISTINCT FROM (OLD.model, OLD.dimension)
       AND EXISTS (SELECT 1 FROM chunk WHERE profile = OLD.name) THEN
        RAISE EXCEPTION 'profile % has chunks: its model and dimension cannot change (create a new profile)', OLD.name
            USING ERRCODE = 'check_violation';
    END IF;
    RETURN NEW;
END $$;
CREATE TRIGGER index_profile_refuse_model_change BEFORE UPDATE OF model, dimension ON index_profile
    FOR EACH ROW EXECUTE FUNCTION index_profile_refuse_model_change();
