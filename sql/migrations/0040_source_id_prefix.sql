-- Sources of one tenant must not name the same document (the collision of two sources whose files share a
-- relative path: one source's file overwrote, or its vanishing deleted, the other's document).
--
-- id_prefix: what a source puts before each file's relative path to make its document id ('' keeps the plain
-- relative path, as before). `kbindex source add` refuses a source whose ids could meet another source's of the
-- same tenant (SOURCE_OVERLAP); a pass also refuses to publish a new file, or delete a vanished one, whose
-- document another source's ledger names (sources added before this check). That look-up goes by document id.
ALTER TABLE source ADD COLUMN id_prefix text NOT NULL DEFAULT '' CHECK (length(id_prefix) <= 200);

CREATE INDEX source_file_document_idx ON source_file (document_id);
