-- A tighter MaxScore bound per term (issue #35). lexical_hits_pruned leaves a query's common terms out of the
-- walk while their summed most cannot lift a chunk over the walk's cut. The most a term adds to a chunk's BM25,
-- idf x tf x (k1 + 1) / (tf + k1 x (1 - b + b x length / avglen)), grows with tf and shrinks with length / tf,
-- so the largest tf and the smallest length / tf among the term's postings bound it more tightly than
-- idf x (k1 + 1), the limit as tf grows without end (pipelines/domain/lexical.py term_bound). Measured before
-- building (python -m bench.scale.lexical_bounds --time-bounds, 200k chunks): t-huge lexical p95 56.0 -> 42.7 ms,
-- same answers.
--
-- lexical_stats_reconcile keeps both in the publish transaction, from the versions it counts (those the pointers
-- name), and only ever widens them: a version that leaves keeps its term's bound loose, never wrong. A bound
-- that a superseded version's posting exceeds can only drop that version's chunk from the walk's best, and
-- search never returns a superseded chunk (lexical_hits_pruned's comment). NULL: no bound kept (the reserved
-- terms -1 and -2; a term with no posting when this migration ran and none counted since): idf x (k1 + 1) applies.
ALTER TABLE lexical_term_stats
    ADD COLUMN max_tf            integer,
    ADD COLUMN min_length_per_tf double precision;

-- Widen each term's bound to cover every posting there is now (current or not: a superset of what the reconcile
-- keeps, so still a bound). One pass over the posting index, grouped as it is ordered. Only widens (GREATEST and
-- LEAST ignore NULL), so a publish that widens a row meanwhile is never undone. The migration runs it once; the
-- search bench runs it after seeding postings without publishing them (bench_search_widen_lexical_term_bounds).
CREATE FUNCTION kbindex_lexical_term_bounds_widen() RETURNS bigint LANGUAGE sql AS $$
    WITH seen AS (
        SELECT tenant_id, profile, term, max(tf) AS max_tf, min(length::float8 / tf) AS min_length_per_tf
        FROM lexical_posting
        GROUP BY tenant_id, profile, term
    ),
    widened AS (
        UPDATE lexical_term_stats s
        SET max_tf = GREATEST(s.max_tf, w.max_tf), min_length_per_tf = LEAST(s.min_length_per_tf, w.min_length_per_tf)
        FROM seen w
        WHERE s.tenant_id = w.tenant_id AND s.profile = w.profile AND s.term = w.term
          AND (s.max_tf IS NULL OR s.max_tf < w.max_tf
               OR s.min_length_per_tf IS NULL OR s.min_length_per_tf > w.min_length_per_tf)
        RETURNING 1
    )
    SELECT count(*) FROM widened
$$;

SELECT kbindex_lexical_term_bounds_widen();
