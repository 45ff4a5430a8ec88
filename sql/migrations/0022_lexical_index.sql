-- Hybrid retrieval (issue 13): a BM25 lexical index per profile, written in the fenced publish transaction
-- beside the chunks, and the fusion parameters on the profile (pipelines/domain/lexical.py).

-- How search ranks under this profile by default, and its BM25 / fusion parameters. A migration can change
-- them; `kbindex profile gate` scores the profile in its own search_mode with its own parameters.
ALTER TABLE index_profile
    ADD COLUMN search_mode    text NOT NULL DEFAULT 'hybrid' CHECK (search_mode IN ('hybrid', 'dense', 'lexical')),
    ADD COLUMN lexical_weight double precision NOT NULL DEFAULT 0.5 CHECK (lexical_weight BETWEEN 0 AND 1),
    ADD COLUMN bm25_k1        double precision NOT NULL DEFAULT 1.2 CHECK (bm25_k1 >= 0),
    ADD COLUMN bm25_b         double precision NOT NULL DEFAULT 0.75 CHECK (bm25_b BETWEEN 0 AND 1);

-- Which mode a gate result scored (search_mode of each profile at the time).
ALTER TABLE profile_gate
    ADD COLUMN mode          text NOT NULL DEFAULT 'dense' CHECK (mode IN ('hybrid', 'dense', 'lexical')),
    ADD COLUMN baseline_mode text NOT NULL DEFAULT 'dense' CHECK (baseline_mode IN ('hybrid', 'dense', 'lexical'));

-- One row per chunk: its distinct terms (sorted) with their frequencies, and its length in terms. It lives
-- and dies with its chunk row: written by the same publish transaction, deleted by the same statements
-- (chunk_delete_stale, retention) through the cascade. content_digest is the chunk's at write time.
CREATE TABLE lexical_chunk (
    chunk_id       text PRIMARY KEY REFERENCES chunk (chunk_id) ON DELETE CASCADE,
    tenant_id      text NOT NULL,
    document_id    text NOT NULL,
    profile        text NOT NULL,
    version_number integer NOT NULL,
    content_digest text NOT NULL,
    terms          integer[] NOT NULL,
    tfs            integer[] NOT NULL,
    length         integer NOT NULL CHECK (length >= 0),
    CHECK (cardinality(terms) = cardinality(tfs))
);
CREATE INDEX lexical_chunk_version_idx ON lexical_chunk (tenant_id, profile, document_id, version_number);

-- The inverted index: one posting per (chunk, term), written from the lexical_chunk rows in the same
-- statement batch, deleted with them (cascade). A query reads only its terms' postings of one tenant and
-- profile, from the covering index (an index-only walk per term). Measured against a GIN index on
-- lexical_chunk.terms that unnests each candidate's whole term list: that costs candidates x terms per
-- chunk (xquad-en p50 17 ms under load), postings cost the query terms' document frequencies.
CREATE TABLE lexical_posting (
    chunk_id       text NOT NULL REFERENCES lexical_chunk (chunk_id) ON DELETE CASCADE,
    term           integer NOT NULL,
    tenant_id      text NOT NULL,
    profile        text NOT NULL,
    document_id    text NOT NULL,
    version_number integer NOT NULL,
    tf             integer NOT NULL CHECK (tf > 0),
    length         integer NOT NULL,
    PRIMARY KEY (chunk_id, term)
);
CREATE INDEX lexical_posting_term_idx ON lexical_posting (tenant_id, profile, term)
    INCLUDE (chunk_id, tf, length, document_id, version_number);

-- BM25 corpus statistics of the CURRENT versions (those a search pointer names) of one tenant under one
-- profile: df per term, and two reserved terms, -1 = number of chunks, -2 = total length in terms.
-- Kept by lexical_stats_reconcile in the publish transaction, so they move with the pointer.
CREATE TABLE lexical_term_stats (
    tenant_id text NOT NULL,
    profile   text NOT NULL REFERENCES index_profile (name),
    term      integer NOT NULL,
    df        bigint NOT NULL,
    PRIMARY KEY (tenant_id, profile, term)
);

-- What each document's counted version contributes to lexical_term_stats (so a pointer move or a re-run
-- subtracts exactly what was added, even when the version's own rows were rewritten meanwhile).
CREATE TABLE lexical_document (
    tenant_id      text NOT NULL,
    document_id    text NOT NULL,
    profile        text NOT NULL REFERENCES index_profile (name),
    version_number integer,
    terms          integer[] NOT NULL,   -- distinct terms, sorted; -1 and -2 carry chunks and length
    dfs            bigint[] NOT NULL,
    PRIMARY KEY (tenant_id, document_id, profile)
);

-- Chunks written before this migration have no lexical rows yet: `migrate` (resources/migrations.py) fills
-- them in batches after applying this file, walking chunk ids upward from `after_chunk_id`, and deletes this
-- row when done. A crash midway leaves the row, so the next `migrate` resumes where it stopped.
CREATE TABLE lexical_backfill (
    singleton      boolean PRIMARY KEY DEFAULT true CHECK (singleton),
    after_chunk_id text NOT NULL DEFAULT ''
);
INSERT INTO lexical_backfill (singleton) SELECT true WHERE EXISTS (SELECT 1 FROM chunk);
