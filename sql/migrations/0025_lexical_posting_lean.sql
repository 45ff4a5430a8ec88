-- Postings cost a third of what they did to write (issue 15: the publish transaction's PostgreSQL CPU
-- competes with the model for the same cores). A posting used to pay for three structures: the primary
-- key (chunk_id, term), the covering term index and a foreign-key check per row. Measured on 740k
-- postings of 7,000 chunks, written 500 chunks per statement as publish does: 10.2 s with all three,
-- 6.9 s without the foreign key, 3.8 s with one index (0.6 s for the rows alone).
--
-- Now one unique index does every job: (tenant_id, profile, term, chunk_id) is unique exactly when
-- (chunk_id, term) is, since a chunk id names its tenant and profile. Search walks it per term as before
-- (same leading columns, same covered columns); a posting of one chunk and term is one probe; the
-- publish upserts on it. Postings go with their lexical row through a statement trigger that deletes
-- exactly the row's terms (the cascade the foreign key did), and lexical_posting_prune drops the terms a
-- rewritten row loses before the row is rewritten.
CREATE UNIQUE INDEX lexical_posting_term_chunk_idx ON lexical_posting (tenant_id, profile, term, chunk_id)
    INCLUDE (tf, length, document_id, version_number);
ALTER TABLE lexical_posting DROP CONSTRAINT lexical_posting_chunk_id_fkey,
                            DROP CONSTRAINT lexical_posting_pkey;
DROP INDEX lexical_posting_term_idx;
ALTER INDEX lexical_posting_term_chunk_idx RENAME TO lexical_posting_term_idx;

CREATE FUNCTION lexical_posting_delete_with_rows() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    DELETE FROM lexical_posting x
    USING gone g, unnest(g.terms) AS t (term)
    WHERE x.tenant_id = g.tenant_id AND x.profile = g.profile AND x.term = t.term AND x.chunk_id = g.chunk_id;
    RETURN NULL;
END $$;

CREATE TRIGGER lexical_chunk_delete_postings AFTER DELETE ON lexical_chunk
    REFERENCING OLD TABLE AS gone
    FOR EACH STATEMENT EXECUTE FUNCTION lexical_posting_delete_with_rows();
