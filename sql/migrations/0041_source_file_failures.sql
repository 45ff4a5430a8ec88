-- A source's file that fails to publish (unreadable, too large, not a valid document id, over the tenant's quota,
-- another source's document) was read again on every pass, at full cost, forever, and its failure lived only in
-- that pass's summary. The ledger now records it: the size and stamp it failed at, and the stable code. A pass
-- leaves such a file alone until its size or stamp moves (or `--retry-failed`, `--rehash`, a rehash slice);
-- `kbindex source list` counts them.
--
-- content_hash NULL: the file never published anything (every attempt so far failed). Such a row names no
-- document of this source: when its file vanishes the row is dropped, no document is deleted.
ALTER TABLE source_file ALTER COLUMN content_hash DROP NOT NULL;
ALTER TABLE source_file ADD COLUMN error_code text CHECK (error_code ~ '^[A-Z][A-Z0-9_]{0,63}$');
ALTER TABLE source_file ADD COLUMN failed_at timestamptz;

-- `source list` counts the failing files of every source; they are few, so the index is small.
CREATE INDEX source_file_failing_idx ON source_file (source_name, error_code) WHERE error_code IS NOT NULL;
