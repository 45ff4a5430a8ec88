-- Sources (issue 29, item 3): a named fsspec location whose files a sensor keeps a tenant's documents in step with.
--
-- The sync state lives here, not in a Dagster cursor, so a lost cursor (a reset sensor, a new Dagster storage)
-- costs one pass that finds nothing to do. source_file is the ledger of what a pass last published from each
-- file: a listing is compared with it by size and stamp (mtime or ETag) without reading a byte, and only the
-- files whose stamp moved are read and hashed. A row is written after the file's publish (or delete) commits,
-- so a crash mid-pass repeats only an idempotent publish. Unchanged files are not written by a pass: bumping a
-- "seen" counter on every row would make a pass over 100,000 unchanged files 100,000 row updates.
CREATE TABLE source (
    name             text PRIMARY KEY CHECK (name ~ '^[a-z0-9][a-z0-9_.-]{0,62}$'),
    tenant_id        text NOT NULL CHECK (length(tenant_id) BETWEEN 1 AND 200),
    url              text NOT NULL CHECK (length(url) BETWEEN 1 AND 2000),
    glob             text NOT NULL DEFAULT '**' CHECK (length(glob) BETWEEN 1 AND 500),
    -- A pass that would delete more than this share of the ledger deletes nothing (unless told to).
    max_delete_share real NOT NULL DEFAULT 0.2 CHECK (max_delete_share >= 0 AND max_delete_share <= 1),
    created_at       timestamptz NOT NULL DEFAULT now(),
    passes           bigint NOT NULL DEFAULT 0,         -- passes started; a ledger row names the pass that wrote it
    last_pass_at     timestamptz,
    last_pass        jsonb                               -- the last finished pass's counts and any refusal
);

CREATE TABLE source_file (
    source_name   text NOT NULL REFERENCES source (name) ON DELETE CASCADE,
    path          text NOT NULL,           -- relative to the source root, '/'-separated
    document_id   text NOT NULL,           -- the document it publishes (today: the path itself)
    byte_size     bigint NOT NULL CHECK (byte_size >= 0),
    stamp         text NOT NULL,           -- what the listing says about a change: ETag, else mtime
    content_hash  text NOT NULL,           -- sha256 of the bytes last published from it
    pass          bigint NOT NULL,         -- the pass that last wrote the row (published, or confirmed a new stamp)
    PRIMARY KEY (source_name, path)
);
