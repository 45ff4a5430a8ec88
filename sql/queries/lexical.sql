-- Statements of the lexical (BM25) index: written in the fenced publish transaction (resources/index_sink.py),
-- read by hybrid and lexical search (resources/lexical.py). Terms are pipelines/domain/lexical.py's ids.

-- name: lexical_chunk_upsert
-- Write the lexical rows of a batch of chunks, of one version or several (parallel arrays, each row names
-- its version; terms and tfs as integer[] literals, one per chunk). Like chunk_upsert: a re-run rewrites
-- nothing, and a row of another version is never taken over.
INSERT INTO lexical_chunk AS l (chunk_id, tenant_id, document_id, profile, version_number, content_digest,
                                terms, tfs, length)
SELECT r.chunk_id, r.tenant_id, r.document_id, r.profile, r.version_number, r.content_digest,
       r.terms::integer[], r.tfs::integer[], r.length
FROM unnest(%(chunk_ids)s::text[], %(tenant_ids)s::text[], %(document_ids)s::text[], %(profiles)s::text[],
            %(version_numbers)s::integer[], %(content_digests)s::text[], %(terms)s::text[], %(tfs)s::text[],
            %(lengths)s::integer[])
     AS r (chunk_id, tenant_id, document_id, profile, version_number, content_digest, terms, tfs, length)
ON CONFLICT (chunk_id) DO UPDATE
SET content_digest = EXCLUDED.content_digest,
    terms          = EXCLUDED.terms,
    tfs            = EXCLUDED.tfs,
    length         = EXCLUDED.length
WHERE (l.tenant_id, l.document_id, l.version_number, l.profile) =
      (EXCLUDED.tenant_id, EXCLUDED.document_id, EXCLUDED.version_number, EXCLUDED.profile)
  AND (l.content_digest, l.terms, l.tfs, l.length) IS DISTINCT FROM
      (EXCLUDED.content_digest, EXCLUDED.terms, EXCLUDED.tfs, EXCLUDED.length);

-- name: lexical_posting_write
-- Write the postings of a batch of chunks from their lexical rows (just upserted, same transaction): only
-- rows that differ, so a re-run rewrites nothing. Terms a rewritten row lost went in lexical_posting_prune.
-- The conflict target is the one unique index (tenant, profile, term, chunk): unique as (chunk, term) is.
INSERT INTO lexical_posting AS x (chunk_id, term, tenant_id, profile, document_id, version_number, tf, length)
SELECT l.chunk_id, t.term, l.tenant_id, l.profile, l.document_id, l.version_number, t.tf, l.length
FROM lexical_chunk l, unnest(l.terms, l.tfs) AS t (term, tf)
WHERE l.chunk_id = ANY (%(chunk_ids)s::text[])
ON CONFLICT (tenant_id, profile, term, chunk_id) DO UPDATE
SET document_id = EXCLUDED.document_id, version_number = EXCLUDED.version_number, tf = EXCLUDED.tf,
    length = EXCLUDED.length
WHERE (x.document_id, x.version_number, x.tf, x.length) IS DISTINCT FROM
      (EXCLUDED.document_id, EXCLUDED.version_number, EXCLUDED.tf, EXCLUDED.length);

-- name: lexical_posting_prune
-- Drop the postings of terms that a batch's lexical rows are about to lose (run BEFORE lexical_chunk_upsert,
-- while each old row still lists its terms; parallel arrays as that statement's, new terms as integer[]
-- literals). Only rows of the same version are touched, as the upsert takes over no other version's row.
-- Each posting is one probe of the unique index; a first write finds no old row and deletes nothing.
DELETE FROM lexical_posting x
USING lexical_chunk l
JOIN unnest(%(chunk_ids)s::text[], %(tenant_ids)s::text[], %(document_ids)s::text[], %(profiles)s::text[],
            %(version_numbers)s::integer[], %(terms)s::text[])
     AS r (chunk_id, tenant_id, document_id, profile, version_number, terms)
  ON r.chunk_id = l.chunk_id
 AND (r.tenant_id, r.document_id, r.profile, r.version_number) = (l.tenant_id, l.document_id, l.profile, l.version_number),
     unnest(l.terms) AS t (term)
WHERE t.term <> ALL (r.terms::integer[])
  AND x.tenant_id = l.tenant_id AND x.profile = l.profile AND x.term = t.term AND x.chunk_id = l.chunk_id;

-- name: lexical_stats_reconcile
-- Make lexical_term_stats count what these documents' pointed versions hold now (one tenant and profile):
-- subtract what the ledger (lexical_document) says was counted, add the pointed versions' rows, and widen each
-- of their terms' bound (largest tf, smallest length / tf: migration 0052) to cover their postings, in ONE
-- statement that touches the stats rows in term order (two publishes of one tenant lock them in the same
-- order: no deadlock). A row whose df and bound would not change is locked but not rewritten (a new version
-- changes the df of most of its terms anyway), and not counted in ``terms_changed``.
-- Run by the publish transaction after its rows are written, with the pointer rows locked. ``document_ids``
-- must be distinct.
WITH docs AS (
    SELECT unnest(%(document_ids)s::text[]) AS document_id
),
counted AS (
    SELECT d.document_id, t.term, t.df
    FROM lexical_document d
    JOIN docs USING (document_id), unnest(d.terms, d.dfs) AS t (term, df)
    -- All three key columns, so the ledger is probed per document, never walked per tenant and profile.
    WHERE d.tenant_id = %(tenant_id)s AND d.profile = %(profile)s AND d.document_id = ANY (%(document_ids)s::text[])
),
pointed AS (
    SELECT l.document_id, l.terms, l.tfs, l.length, l.version_number
    FROM lexical_chunk l
    JOIN search_pointer p
      ON p.tenant_id = l.tenant_id AND p.document_id = l.document_id
     AND p.profile = l.profile AND p.version_number = l.version_number
    WHERE l.tenant_id = %(tenant_id)s AND l.profile = %(profile)s
      AND l.document_id = ANY (%(document_ids)s::text[])
      -- The pointer's whole key too: with stale statistics the planner probed the pointers by tenant and
      -- profile only and filtered the tenant's every pointer once per document (34,000 buffers at 20,000
      -- documents, tests/integration/test_publish_plans.py).
      AND p.tenant_id = %(tenant_id)s AND p.profile = %(profile)s
      AND p.document_id = ANY (%(document_ids)s::text[])
),
now_counted AS (  -- with each term's largest tf and smallest length / tf in the document (NULL: -1 and -2)
    SELECT document_id, t.term, count(*)::bigint AS df, max(t.tf) AS max_tf,
           min(pointed.length::float8 / t.tf) AS min_length_per_tf
    FROM pointed, unnest(pointed.terms, pointed.tfs) AS t (term, tf)
    GROUP BY document_id, t.term
    UNION ALL SELECT document_id, -1, count(*)::bigint, NULL, NULL FROM pointed GROUP BY document_id
    UNION ALL SELECT document_id, -2, sum(length)::bigint, NULL, NULL FROM pointed GROUP BY document_id
),
delta AS (
    SELECT term, sum(df)::bigint AS df, max(max_tf) AS max_tf, min(min_length_per_tf) AS min_length_per_tf
    FROM (SELECT term, df, max_tf, min_length_per_tf FROM now_counted
          UNION ALL SELECT term, -df, NULL, NULL FROM counted) AS changes
    GROUP BY term
),
applied AS (
    INSERT INTO lexical_term_stats AS s (tenant_id, profile, term, df, max_tf, min_length_per_tf)
    SELECT %(tenant_id)s, %(profile)s, d.term, d.df, d.max_tf, d.min_length_per_tf
    FROM delta d
    WHERE d.df <> 0 OR d.max_tf IS NOT NULL
    ORDER BY d.term
    ON CONFLICT (tenant_id, profile, term) DO UPDATE
    SET df                = s.df + EXCLUDED.df,
        max_tf            = GREATEST(s.max_tf, EXCLUDED.max_tf),
        min_length_per_tf = LEAST(s.min_length_per_tf, EXCLUDED.min_length_per_tf)
    WHERE EXCLUDED.df <> 0 OR s.max_tf IS NULL OR s.min_length_per_tf IS NULL
       OR EXCLUDED.max_tf > s.max_tf OR EXCLUDED.min_length_per_tf < s.min_length_per_tf
    RETURNING s.term
),
ledger AS (
    INSERT INTO lexical_document AS d (tenant_id, document_id, profile, version_number, terms, dfs)
    SELECT %(tenant_id)s, docs.document_id, %(profile)s,
           (SELECT max(p.version_number) FROM pointed p WHERE p.document_id = docs.document_id),
           coalesce(array_agg(n.term ORDER BY n.term) FILTER (WHERE n.term IS NOT NULL), '{}'),
           coalesce(array_agg(n.df ORDER BY n.term) FILTER (WHERE n.term IS NOT NULL), '{}')
    FROM docs
    LEFT JOIN now_counted n USING (document_id)
    GROUP BY docs.document_id
    ON CONFLICT (tenant_id, document_id, profile) DO UPDATE
    SET version_number = EXCLUDED.version_number, terms = EXCLUDED.terms, dfs = EXCLUDED.dfs
    RETURNING d.document_id
)
SELECT (SELECT count(*) FROM applied)::integer AS terms_changed, (SELECT count(*) FROM ledger)::integer AS ledgers;

-- name: lexical_stats_get
-- The tenant's current-version statistics for some terms (-1: chunks, -2: total length), one index probe each,
-- with each term's bound (migration 0052; NULL: none kept).
SELECT term, df, max_tf, min_length_per_tf
FROM lexical_term_stats
WHERE tenant_id = %(tenant_id)s AND profile = %(profile)s AND term = ANY (%(terms)s::integer[]);

-- fragment: lexical_hits_tail
-- The end of lexical_hits and lexical_hits_pruned: the pointer probes of the walk's best chunks (``scored``),
-- the k best the reader may see, and how many chunks the walk ranked (``walked``).
hits AS (
    SELECT c.chunk_id, c.document_id, c.version_number, c.heading_path, c.page, c.text, p.metadata, s.bm25,
           c.embedding <=> %(query)s::vector AS distance
    FROM scored s
    JOIN chunk c ON c.chunk_id = s.chunk_id
    CROSS JOIN LATERAL (
        SELECT p.metadata FROM search_pointer p
        WHERE p.tenant_id = %(tenant_id)s AND p.document_id = c.document_id AND p.profile = %(profile)s
          AND p.version_number = c.version_number
          AND (%(see_all)s OR p.allow_principals IS NULL OR p.allow_principals && %(principals)s::text[])
          AND kbindex_metadata_match(p.metadata, %(filters)s::jsonb)
    ) p
    ORDER BY s.bm25 DESC, s.chunk_id
    LIMIT %(k)s
)
SELECT h.*, w.walked
FROM (SELECT count(*) AS walked FROM scored) w
LEFT JOIN hits h ON true
ORDER BY h.bm25 DESC, h.chunk_id;

-- name: lexical_hits
-- BM25 top k of the tenant's current chunks in the reader's scope (allow list and metadata filters on the
-- pointer rows, as in search_hits: a posting of a version out of scope never scores). The postings of the
-- query's terms (covering index, one walk per term) are summed per chunk first, best first; then each
-- chunk's row and pointer are probed in that order until k are current and in scope, at most
-- %(max_probes)s chunks. Terms are the query's rarest up to a postings budget (resources/lexical.py), so a
-- very common term does not walk half the tenant. It reads no pointer it does not need: reading the
-- tenant's pointers once (lexical_hits_all_pointers) cost ~15 ms at 10k pointers, most of a typical query
-- (bench.scale.search). Always one row at least: ``walked`` (how many chunks the walk scored, up to
-- max_probes) with NULL chunk fields when nothing is in scope; walked = max_probes with fewer than k hits
-- means the probes may have stopped short, and the caller asks lexical_hits_all_pointers. Both round a
-- chunk's sum to 1e-9: they add its postings in different orders, and a tie must break by chunk id in both.
-- The walk per term is a LATERAL subquery: as a plain join, on tables not yet analyzed the planner read every
-- posting of the tenant and kept the query's terms by a join filter (13,877 postings for 4,000 at 2,000
-- documents, 37.7 ms against 7.6 analyzed; tests/integration/test_search_unanalyzed.py).
WITH q AS (
    SELECT * FROM unnest(%(candidates)s::integer[], %(candidate_idfs)s::float8[]) AS q (term, idf)
),
scored AS MATERIALIZED (
    SELECT x.chunk_id,
           round(1e9::float8 * sum(q.idf * x.tf * (%(k1)s::float8 + 1)
               / (x.tf + %(k1)s::float8 * (1 - %(b)s::float8 + %(b)s::float8 * x.length / %(avg_length)s::float8))))
           / 1e9::float8 AS bm25
    FROM q
    CROSS JOIN LATERAL (  -- one index walk per term, whatever the statistics say (OFFSET 0: never pulled up)
        SELECT x.chunk_id, x.tf, x.length FROM lexical_posting x
        WHERE x.tenant_id = %(tenant_id)s AND x.profile = %(profile)s AND x.term = q.term
        OFFSET 0
    ) x
    GROUP BY x.chunk_id
    ORDER BY bm25 DESC, x.chunk_id
    LIMIT %(max_probes)s
),
-- include: lexical_hits_tail

-- name: lexical_hits_pruned
-- lexical_hits with MaxScore pruning, the same answer with less work when a query has common terms: the
-- caller (resources/lexical.py) runs it when pipelines/domain/lexical.py's lazy_terms names some, a run of
-- the commonest query terms with several times the postings of the rest. The rest are walked first, and
-- their sums rank max_probes chunks at ``theta`` or more (theta NULL: fewer, nothing is pruned). Lazy
-- terms then go commonest first into ``probed`` while their summed most (``reach``; each term's most is
-- %(candidate_bounds)s, pipelines/domain/lexical.py term_bound) stays below theta; the others are walked
-- like the rest. A chunk only probed terms could score stays below theta, so none is looked at for them
-- alone: the probed terms are read for the chunks whose sum so far plus reach still makes theta (``kept``),
-- in one index scan over their sorted ids, or, when kept holds more than 1/%(probe_cost)s of the chunks the
-- probed terms are in, walked after all (then chunks outside kept sum only their probed terms: below theta,
-- they never rank). The bounds hold for the current versions' postings (lexical_stats_reconcile); a
-- superseded chunk that exceeds one can only drop out of the walk's best, whose current chunks at theta or
-- more stay, in the same order, ahead of any chunk that takes its place: lexical_search answers the same.
-- From ``hits`` on, as lexical_hits.
WITH q AS (
    SELECT q.term, q.idf, q.df, q.term = ANY (%(lazy_terms)s::integer[]) AS lazy, q.bound
    FROM unnest(%(candidates)s::integer[], %(candidate_idfs)s::float8[], %(candidate_dfs)s::bigint[],
                %(candidate_bounds)s::float8[]) AS q (term, idf, df, bound)
),
eager AS MATERIALIZED (
    SELECT x.chunk_id,
           sum(q.idf * x.tf * (%(k1)s::float8 + 1)
               / (x.tf + %(k1)s::float8 * (1 - %(b)s::float8 + %(b)s::float8 * x.length / %(avg_length)s::float8)))
           AS partial
    FROM q
    CROSS JOIN LATERAL (  -- as in lexical_hits: one index walk per term
        SELECT x.chunk_id, x.tf, x.length FROM lexical_posting x
        WHERE x.tenant_id = %(tenant_id)s AND x.profile = %(profile)s AND x.term = q.term
        OFFSET 0
    ) x
    WHERE NOT q.lazy
    GROUP BY x.chunk_id
),
theta AS MATERIALIZED (
    SELECT (SELECT e.partial FROM eager e ORDER BY e.partial DESC OFFSET %(max_probes)s - 1 LIMIT 1) AS theta
),
lazy AS MATERIALIZED (
    SELECT l.term, l.idf, l.df, l.bound, coalesce(l.reach < t.theta - 1e-6, false) AS probed
    FROM (SELECT q.term, q.idf, q.df, q.bound, sum(q.bound) OVER (ORDER BY q.idf, q.term) AS reach
          FROM q WHERE q.lazy) l, theta t
),
reach AS MATERIALIZED (
    SELECT coalesce(sum(l.bound), 0) AS reach, coalesce(sum(l.df), 0) AS chunks
    FROM lazy l WHERE l.probed
),
walked AS MATERIALIZED (
    SELECT w.chunk_id, sum(w.part) AS partial
    FROM (SELECT e.chunk_id, e.partial AS part FROM eager e
          UNION ALL
          SELECT x.chunk_id, q.idf * x.tf * (%(k1)s::float8 + 1)
               / (x.tf + %(k1)s::float8 * (1 - %(b)s::float8 + %(b)s::float8 * x.length / %(avg_length)s::float8))
          FROM lazy q
          JOIN lexical_posting x ON x.tenant_id = %(tenant_id)s AND x.profile = %(profile)s AND x.term = q.term
          WHERE NOT q.probed) w
    GROUP BY w.chunk_id
),
kept AS MATERIALIZED (
    SELECT w.chunk_id, w.partial FROM walked w
    WHERE w.partial + (SELECT reach FROM reach) >= coalesce((SELECT theta FROM theta), 0) - 1e-6
),
by_id AS MATERIALIZED (
    SELECT (SELECT count(*) FROM kept) * %(probe_cost)s <= (SELECT chunks FROM reach) AS by_id
),
scored AS MATERIALIZED (
    SELECT p.chunk_id, round(1e9::float8 * sum(p.part)) / 1e9::float8 AS bm25
    FROM (SELECT k.chunk_id, k.partial AS part FROM kept k
          UNION ALL  -- the probed terms of the kept chunks, by id
          SELECT x.chunk_id, q.idf * x.tf * (%(k1)s::float8 + 1)
               / (x.tf + %(k1)s::float8 * (1 - %(b)s::float8 + %(b)s::float8 * x.length / %(avg_length)s::float8))
          FROM lazy q
          JOIN lexical_posting x ON x.tenant_id = %(tenant_id)s AND x.profile = %(profile)s AND x.term = q.term
           AND x.chunk_id = ANY ((SELECT array_agg(k.chunk_id) FROM kept k)::text[])
          WHERE q.probed AND (SELECT by_id FROM by_id)
          UNION ALL  -- or walked, when kept is too many for that
          SELECT x.chunk_id, q.idf * x.tf * (%(k1)s::float8 + 1)
               / (x.tf + %(k1)s::float8 * (1 - %(b)s::float8 + %(b)s::float8 * x.length / %(avg_length)s::float8))
          FROM lazy q
          JOIN lexical_posting x ON x.tenant_id = %(tenant_id)s AND x.profile = %(profile)s AND x.term = q.term
          WHERE q.probed AND NOT (SELECT by_id FROM by_id)) p
    GROUP BY p.chunk_id
    ORDER BY bm25 DESC, chunk_id
    LIMIT %(max_probes)s
),
-- include: lexical_hits_tail

-- name: lexical_hits_all_pointers
-- lexical_hits for a scope its probes could not fill (a narrow filter or allow list): the tenant's pointers
-- in scope are read once (MATERIALIZED) and hash-joined to the postings before they are summed. The planner
-- cannot know how many postings the query's terms have (~100 estimated, 10,000s at 100k chunks) and
-- otherwise probed the pointer index once per posting (measured: 67k probes, most of a 137 ms query;
-- bench.scale.search). A filter's equality conditions reach the metadata index as in search_hits_scoped.
WITH q AS (
    SELECT * FROM unnest(%(candidates)s::integer[], %(candidate_idfs)s::float8[]) AS q (term, idf)
),
pointed AS MATERIALIZED (
    SELECT p.document_id, p.version_number, p.metadata
    FROM search_pointer p
    WHERE p.tenant_id = %(tenant_id)s AND p.profile = %(profile)s
      AND (%(see_all)s OR p.allow_principals IS NULL OR p.allow_principals && %(principals)s::text[])
      AND (%(metadata_path)s::jsonpath IS NULL OR p.metadata @? %(metadata_path)s::jsonpath)
      AND kbindex_metadata_match(p.metadata, %(filters)s::jsonb)
),
scored AS (
    SELECT x.chunk_id,
           round(1e9::float8 * sum(q.idf * x.tf * (%(k1)s::float8 + 1)
               / (x.tf + %(k1)s::float8 * (1 - %(b)s::float8 + %(b)s::float8 * x.length / %(avg_length)s::float8))))
           / 1e9::float8 AS bm25
    FROM q
    JOIN lexical_posting x ON x.tenant_id = %(tenant_id)s AND x.profile = %(profile)s AND x.term = q.term
    JOIN pointed p ON p.document_id = x.document_id AND p.version_number = x.version_number
    GROUP BY x.chunk_id
    ORDER BY bm25 DESC, x.chunk_id
    LIMIT %(k)s
)
SELECT c.chunk_id, c.document_id, c.version_number, c.heading_path, c.page, c.text, p.metadata, s.bm25,
       c.embedding <=> %(query)s::vector AS distance
FROM scored s
JOIN chunk c ON c.chunk_id = s.chunk_id
JOIN pointed p ON p.document_id = c.document_id AND p.version_number = c.version_number
ORDER BY s.bm25 DESC, c.chunk_id;

-- name: lexical_scores_of
-- BM25 of given current chunks of the tenant in the reader's scope (the dense side's candidates that the
-- lexical side did not return), one probe of the posting primary key per (chunk, term): a chunk with no
-- query term is absent. LIMIT 1 (the key is unique) keeps each probe a probe: as a plain join the planner
-- walked every posting of the query's terms and hash-joined the ids (7,934 postings for 26 matches, up to
-- 16 ms at 1M chunks; bench.scale.search). Rounded as lexical_hits rounds, so a chunk scores alike on both.
-- The pointer check is a probe per posting row too (LIMIT 1: the key is unique, and the subquery is never pulled
-- up into a join the planner may turn around): as a plain join, on tables not yet analyzed it read every pointer
-- of the tenant and probed every posting once per pointer, 0.8 s at 2,000 documents (bench.search_link's index,
-- tests/integration/test_search_unanalyzed.py).
WITH q AS (
    SELECT * FROM unnest(%(candidates)s::integer[], %(candidate_idfs)s::float8[]) AS q (term, idf)
)
SELECT ids.chunk_id,
       round(1e9::float8 * sum(q.idf * x.tf * (%(k1)s::float8 + 1)
           / (x.tf + %(k1)s::float8 * (1 - %(b)s::float8 + %(b)s::float8 * x.length / %(avg_length)s::float8))))
       / 1e9::float8 AS bm25
FROM unnest(%(chunk_ids)s::text[]) AS ids (chunk_id)
CROSS JOIN q
CROSS JOIN LATERAL (
    SELECT x.tf, x.length, x.document_id, x.version_number
    FROM lexical_posting x
    WHERE x.chunk_id = ids.chunk_id AND x.term = q.term AND x.tenant_id = %(tenant_id)s AND x.profile = %(profile)s
    LIMIT 1
) x
CROSS JOIN LATERAL (
    SELECT 1
    FROM search_pointer p
    WHERE p.tenant_id = %(tenant_id)s AND p.document_id = x.document_id
      AND p.profile = %(profile)s AND p.version_number = x.version_number
      AND (%(see_all)s OR p.allow_principals IS NULL OR p.allow_principals && %(principals)s::text[])
      AND kbindex_metadata_match(p.metadata, %(filters)s::jsonb)
    LIMIT 1
) p
GROUP BY ids.chunk_id;

-- name: lexical_backfill_position
-- Where the lexical backfill of migration 0022 stands (no row: nothing left to backfill).
SELECT after_chunk_id FROM lexical_backfill;

-- name: lexical_backfill_advance
-- Record how far the backfill got (same transaction as the rows it wrote, so a crash resumes exactly).
UPDATE lexical_backfill SET after_chunk_id = %(after_chunk_id)s;

-- name: lexical_backfill_finish
-- The backfill walked every chunk id.
DELETE FROM lexical_backfill;

-- name: lexical_chunks_missing
-- The next chunks after %(after_chunk_id)s (chunk id order) without their lexical row, a batch at a time, for
-- resources/lexical.py backfill_lexical_index: a walk of the chunk primary key, O(chunks) over the whole
-- backfill however many batches it takes. context_title: the title a context profile indexes with the chunk
-- (migration 0049), read only where the profile embeds context.
SELECT c.chunk_id, c.tenant_id, c.document_id, c.profile, c.version_number, c.heading_path, c.text,
       c.content_digest, ip.model, ip.lexical_analyzer,
       CASE WHEN ip.embed_context THEN c.context_title END AS context_title
FROM chunk c
JOIN index_profile ip ON ip.name = c.profile
WHERE c.chunk_id > %(after_chunk_id)s
  AND NOT EXISTS (SELECT 1 FROM lexical_chunk l WHERE l.chunk_id = c.chunk_id)
ORDER BY c.chunk_id
LIMIT %(limit)s;
