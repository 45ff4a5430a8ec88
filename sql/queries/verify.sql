-- The invariant checker (resources/verifier.py, `kbindex verify`). Each check is one read-only
-- statement returning the offending rows, the first %(limit)s of them, each carrying
-- ``total`` = the number of offending rows in all (a window count taken before the LIMIT).
-- No rows back: the check holds. They run in one REPEATABLE READ READ ONLY transaction, so all
-- checks see one snapshot (a publish committing mid-check cannot make two checks disagree).

-- name: verify_snapshot
-- Make the surrounding transaction one read-only snapshot (must be its first statement).
SET TRANSACTION ISOLATION LEVEL REPEATABLE READ, READ ONLY;

-- name: verify_chunk_duplicate_ordinal
-- Two chunk rows at one (tenant, document, profile, version, ordinal): a version written twice (invariant 5).
WITH offending AS (
    SELECT c.tenant_id, c.document_id, c.profile, c.version_number, c.ordinal,
           count(*)::integer AS rows, array_agg(c.chunk_id ORDER BY c.chunk_id) AS chunk_ids
    FROM chunk c
    GROUP BY c.tenant_id, c.document_id, c.profile, c.version_number, c.ordinal
    HAVING count(*) > 1
)
SELECT o.*, count(*) OVER ()::integer AS total
FROM offending o
ORDER BY o.tenant_id, o.document_id, o.profile, o.version_number, o.ordinal
LIMIT %(limit)s;

-- name: verify_chunk_duplicate_content
-- The same text under one heading path and page in two chunk ids of one version (a warning: documents
-- do repeat passages, and chunk ids include the ordinal; a double write also shows as a count mismatch).
WITH offending AS (
    SELECT c.tenant_id, c.document_id, c.profile, c.version_number, c.content_digest,
           count(*)::integer AS rows, array_agg(c.ordinal ORDER BY c.ordinal) AS ordinals
    FROM chunk c
    GROUP BY c.tenant_id, c.document_id, c.profile, c.version_number, c.content_digest, c.heading_path, c.page
    HAVING count(*) > 1
)
SELECT o.*, count(*) OVER ()::integer AS total
FROM offending o
ORDER BY o.tenant_id, o.document_id, o.profile, o.version_number, o.content_digest
LIMIT %(limit)s;

-- name: verify_search_pointer_unsucceeded
-- A pointer naming a version with no SUCCEEDED task under its profile, or whose task_id (the task that
-- moved it) is not SUCCEEDED or belongs to another version/profile (invariants 3, 4).
WITH offending AS (
    SELECT p.tenant_id, p.document_id, p.profile, p.version_number, p.task_id,
           t.status AS task_status, t.tenant_id AS task_tenant, t.document_id AS task_document,
           t.version_number AS task_version, t.profile AS task_profile,
           EXISTS (
               SELECT 1 FROM index_task s
               WHERE s.tenant_id = p.tenant_id AND s.document_id = p.document_id
                 AND s.version_number = p.version_number AND s.profile = p.profile
                 AND s.status = 'SUCCEEDED'
           ) AS version_has_succeeded_task
    FROM search_pointer p
    LEFT JOIN index_task t ON t.task_id = p.task_id
)
SELECT o.*, count(*) OVER ()::integer AS total
FROM offending o
WHERE NOT o.version_has_succeeded_task
   OR o.task_status IS DISTINCT FROM 'SUCCEEDED'
   OR (o.task_tenant, o.task_document, o.task_version, o.task_profile)
      IS DISTINCT FROM (o.tenant_id, o.document_id, o.version_number, o.profile)
ORDER BY o.tenant_id, o.document_id, o.profile
LIMIT %(limit)s;

-- name: verify_search_pointer_chunk_count
-- A pointed version whose chunk rows differ in number from what its publish recorded (the pointer's
-- chunk_count, and the task's when set): search would show a version with missing or extra chunks.
WITH counted AS (
    SELECT p.tenant_id, p.document_id, p.profile, p.version_number, p.task_id,
           p.chunk_count AS pointer_chunk_count, t.chunk_count AS task_chunk_count,
           (SELECT count(*)::integer FROM chunk c
            WHERE c.tenant_id = p.tenant_id AND c.document_id = p.document_id
              AND c.profile = p.profile AND c.version_number = p.version_number) AS chunk_rows
    FROM search_pointer p
    LEFT JOIN index_task t ON t.task_id = p.task_id
)
SELECT o.*, count(*) OVER ()::integer AS total
FROM counted o
WHERE o.pointer_chunk_count <> o.chunk_rows
   OR (o.task_chunk_count IS NOT NULL AND o.task_chunk_count <> o.chunk_rows)
ORDER BY o.tenant_id, o.document_id, o.profile
LIMIT %(limit)s;

-- name: verify_chunk_unpointed
-- Chunk rows of a version newer than the one its pointer names, or of a document with no pointer under
-- that profile: written outside the publish transaction that moves the pointer (invariant 3).
WITH versions AS (
    SELECT c.tenant_id, c.document_id, c.profile, c.version_number, count(*)::integer AS chunk_rows
    FROM chunk c
    GROUP BY c.tenant_id, c.document_id, c.profile, c.version_number
),
offending AS (
    SELECT v.*, p.version_number AS pointer_version
    FROM versions v
    LEFT JOIN search_pointer p
      ON p.tenant_id = v.tenant_id AND p.document_id = v.document_id AND p.profile = v.profile
    WHERE p.version_number IS NULL OR v.version_number > p.version_number
)
SELECT o.*, count(*) OVER ()::integer AS total
FROM offending o
ORDER BY o.tenant_id, o.document_id, o.profile, o.version_number
LIMIT %(limit)s;

-- name: verify_search_pointer_tombstone_chunks
-- A pointer naming a tombstone (a deleted document's version, which has no bytes) that has chunk or lexical
-- rows, or whose publish recorded chunks: search would return a deleted document. A tombstone with 0 chunks
-- is how a deletion looks, and is valid.
WITH offending AS (
    SELECT p.tenant_id, p.document_id, p.profile, p.version_number, p.task_id, p.chunk_count AS recorded_chunks,
           (SELECT count(*) FROM chunk c
            WHERE c.tenant_id = p.tenant_id AND c.document_id = p.document_id
              AND c.profile = p.profile AND c.version_number = p.version_number)::integer AS chunk_rows,
           (SELECT count(*) FROM lexical_chunk l
            WHERE l.tenant_id = p.tenant_id AND l.document_id = p.document_id
              AND l.profile = p.profile AND l.version_number = p.version_number)::integer AS lexical_rows
    FROM search_pointer p
    JOIN document_version v
      ON v.tenant_id = p.tenant_id AND v.document_id = p.document_id AND v.version_number = p.version_number
    WHERE v.kind = 'tombstone'
)
SELECT o.*, count(*) OVER ()::integer AS total
FROM offending o
WHERE o.recorded_chunks <> 0 OR o.chunk_rows <> 0 OR o.lexical_rows <> 0
ORDER BY o.tenant_id, o.document_id, o.profile
LIMIT %(limit)s;

-- name: verify_search_pointer_scope_mismatch
-- A pointer whose metadata or allow list differs from its version's: search would filter on, or grant or
-- refuse reading by, something that was never published for that version (DESIGN.md invariant 8).
SELECT p.tenant_id, p.document_id, p.profile, p.version_number,
       p.metadata AS pointer_metadata, v.metadata AS version_metadata,
       p.allow_principals AS pointer_allow, v.allow_principals AS version_allow,
       count(*) OVER ()::integer AS total
FROM search_pointer p
JOIN document_version v
  ON v.tenant_id = p.tenant_id AND v.document_id = p.document_id AND v.version_number = p.version_number
WHERE p.metadata IS DISTINCT FROM v.metadata
   OR p.allow_principals IS DISTINCT FROM v.allow_principals
ORDER BY p.tenant_id, p.document_id, p.profile
LIMIT %(limit)s;

-- name: verify_chunk_retained
-- Chunk rows of versions older than the pointed one (superseded, kept for rollback; search never reads
-- them) whose ``past_window`` is %(past_window)s: search left them (superseded_version, recorded by the
-- pointer's trigger; else the pointer's last move) more than %(retention_seconds)s ago. NULL seconds: no
-- window, never past it. Past the window means retention (resources/retention.py) is not keeping up.
WITH versions AS (
    SELECT c.tenant_id, c.document_id, c.profile, c.version_number, count(*)::integer AS chunk_rows
    FROM chunk c
    GROUP BY c.tenant_id, c.document_id, c.profile, c.version_number
),
offending AS (
    SELECT v.*, p.version_number AS pointer_version,
           coalesce(s.superseded_at, p.updated_at) AS superseded_at,
           coalesce(coalesce(s.superseded_at, p.updated_at)
                    < now() - make_interval(secs => %(retention_seconds)s::float8), false) AS past_window
    FROM versions v
    JOIN search_pointer p
      ON p.tenant_id = v.tenant_id AND p.document_id = v.document_id AND p.profile = v.profile
    LEFT JOIN superseded_version s
      ON s.tenant_id = v.tenant_id AND s.document_id = v.document_id AND s.profile = v.profile
     AND s.version_number = v.version_number
    WHERE v.version_number < p.version_number
)
SELECT o.*, count(*) OVER ()::integer AS total
FROM offending o
WHERE o.past_window = %(past_window)s::boolean
ORDER BY o.tenant_id, o.document_id, o.profile, o.version_number
LIMIT %(limit)s;

-- name: verify_index_task_lease_stale
-- RUNNING tasks whose lease ran out more than one claim interval ago: nobody is taking them over (invariant 7).
WITH offending AS (
    SELECT t.task_id, t.tenant_id, t.document_id, t.version_number, t.profile, t.attempts,
           t.lease_owner, t.lease_until,
           extract(epoch FROM now() - t.lease_until)::float8 AS expired_seconds_ago
    FROM index_task t
    WHERE t.status = 'RUNNING'
      AND t.lease_until < now() - make_interval(secs => %(claim_interval)s::float8)
)
SELECT o.*, count(*) OVER ()::integer AS total
FROM offending o
ORDER BY o.lease_until, o.task_id
LIMIT %(limit)s;

-- name: verify_index_task_running_without_lease
-- RUNNING tasks with no lease owner or no lease end: no run can fence on them and no claim frees them.
WITH offending AS (
    SELECT t.task_id, t.tenant_id, t.document_id, t.version_number, t.profile, t.attempts,
           t.lease_owner, t.lease_until
    FROM index_task t
    WHERE t.status = 'RUNNING' AND (t.lease_owner IS NULL OR t.lease_until IS NULL)
)
SELECT o.*, count(*) OVER ()::integer AS total
FROM offending o
ORDER BY o.task_id
LIMIT %(limit)s;

-- name: verify_index_task_attempts_exhausted
-- Attempts above max_attempts without DEAD, or a RETRY_WAIT with no attempt left (the next claim
-- would run one attempt too many).
WITH offending AS (
    SELECT t.task_id, t.tenant_id, t.document_id, t.version_number, t.profile, t.status,
           t.attempts, t.max_attempts
    FROM index_task t
    WHERE (t.attempts > t.max_attempts AND t.status <> 'DEAD')
       OR (t.status = 'RETRY_WAIT' AND t.attempts >= t.max_attempts)
)
SELECT o.*, count(*) OVER ()::integer AS total
FROM offending o
ORDER BY o.task_id
LIMIT %(limit)s;

-- name: verify_index_task_dead_without_code
-- DEAD tasks whose error_code is missing or not one of the stable codes %(codes)s (invariant 7).
WITH offending AS (
    SELECT t.task_id, t.tenant_id, t.document_id, t.version_number, t.profile, t.error_code
    FROM index_task t
    WHERE t.status = 'DEAD'
      AND (t.error_code IS NULL OR t.error_code <> ALL (%(codes)s::text[]))
)
SELECT o.*, count(*) OVER ()::integer AS total
FROM offending o
ORDER BY o.task_id
LIMIT %(limit)s;

-- name: verify_task_event_status_mismatch
-- Tasks whose last transition event does not end in the task's status (or that have no transition event).
WITH last_event AS (
    SELECT DISTINCT ON (e.task_id) e.task_id, e.event_id, e.to_status
    FROM task_event e
    WHERE e.kind = 'transition'
    ORDER BY e.task_id, e.event_id DESC
),
offending AS (
    SELECT t.task_id, t.status, l.event_id AS last_event_id, l.to_status AS last_event_to_status
    FROM index_task t
    LEFT JOIN last_event l ON l.task_id = t.task_id
    WHERE l.to_status IS DISTINCT FROM t.status
)
SELECT o.*, count(*) OVER ()::integer AS total
FROM offending o
ORDER BY o.task_id
LIMIT %(limit)s;

-- name: verify_task_event_attempt_ahead
-- Events recording a higher attempt than the task has: attempts only ever grow.
WITH offending AS (
    SELECT t.task_id, t.attempts, max(e.attempt) AS max_event_attempt
    FROM index_task t
    JOIN task_event e ON e.task_id = t.task_id
    GROUP BY t.task_id, t.attempts
    HAVING max(e.attempt) > t.attempts
)
SELECT o.*, count(*) OVER ()::integer AS total
FROM offending o
ORDER BY o.task_id
LIMIT %(limit)s;

-- name: verify_task_event_illegal_transition
-- Transition events whose (from, to) is not in the state machine; the legal pairs come from
-- pipelines.domain.task_states.TRANSITIONS as %(legal_from)s / %(legal_to)s (NULL from = creation).
WITH legal AS (
    SELECT l.from_status, l.to_status
    FROM unnest(%(legal_from)s::text[], %(legal_to)s::text[]) AS l (from_status, to_status)
),
offending AS (
    SELECT e.event_id, e.task_id, e.attempt, e.from_status, e.to_status, e.created_at
    FROM task_event e
    WHERE e.kind = 'transition'
      AND NOT EXISTS (SELECT 1 FROM legal l
                      WHERE l.from_status IS NOT DISTINCT FROM e.from_status AND l.to_status = e.to_status)
)
SELECT o.*, count(*) OVER ()::integer AS total
FROM offending o
ORDER BY o.event_id
LIMIT %(limit)s;

-- name: verify_task_event_chain_broken
-- Transition events that do not start where the task's previous transition ended (a lost or forged event).
WITH chained AS (
    SELECT e.event_id, e.task_id, e.from_status, e.to_status,
           lag(e.to_status) OVER (PARTITION BY e.task_id ORDER BY e.event_id) AS previous_to_status,
           row_number() OVER (PARTITION BY e.task_id ORDER BY e.event_id) AS n
    FROM task_event e
    WHERE e.kind = 'transition'
),
offending AS (
    SELECT c.event_id, c.task_id, c.previous_to_status, c.from_status, c.to_status
    FROM chained c
    WHERE c.n > 1 AND c.from_status IS DISTINCT FROM c.previous_to_status
)
SELECT o.*, count(*) OVER ()::integer AS total
FROM offending o
ORDER BY o.event_id
LIMIT %(limit)s;

-- name: verify_document_version_without_task
-- Versions with no index task at all: a publish that was recorded but will never be indexed (invariant 7).
WITH offending AS (
    SELECT v.tenant_id, v.document_id, v.version_number, v.published_at
    FROM document_version v
    WHERE NOT EXISTS (SELECT 1 FROM index_task t
                      WHERE t.tenant_id = v.tenant_id AND t.document_id = v.document_id
                        AND t.version_number = v.version_number)
)
SELECT o.*, count(*) OVER ()::integer AS total
FROM offending o
ORDER BY o.tenant_id, o.document_id, o.version_number
LIMIT %(limit)s;

-- name: verify_index_profile_active_count
-- One row when the number of active profiles is not exactly one (DESIGN.md: exactly one is active).
SELECT count(*)::integer AS active_count,
       coalesce(array_agg(p.name ORDER BY p.name) FILTER (WHERE p.is_active), '{}') AS active_profiles,
       1 AS total
FROM index_profile p
WHERE p.is_active
HAVING count(*) <> 1;

-- name: verify_lexical_index_mismatch
-- A chunk whose lexical (BM25) row is missing, belongs to another version, was built from other content,
-- whose length is not the sum of its term frequencies, or whose postings differ from the row; or a posting
-- no lexical row lists (a stray: its chunk or term is gone): lexical search would disagree with the chunks.
-- The row's own postings are found by one probe each (the unique index leads with tenant, profile, term);
-- strays take one pass over all postings.
WITH by_row AS (
    SELECT c.chunk_id, c.tenant_id, c.document_id, c.profile, c.version_number,
           CASE WHEN l.chunk_id IS NULL THEN 'missing'
                WHEN (l.tenant_id, l.document_id, l.profile, l.version_number)
                     IS DISTINCT FROM (c.tenant_id, c.document_id, c.profile, c.version_number) THEN 'other version'
                WHEN l.content_digest <> c.content_digest THEN 'stale content'
                WHEN l.length <> (SELECT coalesce(sum(x), 0) FROM unnest(l.tfs) AS x) THEN 'length'
                ELSE 'postings' END AS problem
    FROM chunk c
    LEFT JOIN lexical_chunk l ON l.chunk_id = c.chunk_id
    WHERE l.chunk_id IS NULL
       OR (l.tenant_id, l.document_id, l.profile, l.version_number)
          IS DISTINCT FROM (c.tenant_id, c.document_id, c.profile, c.version_number)
       OR l.content_digest <> c.content_digest
       OR l.length <> (SELECT coalesce(sum(x), 0) FROM unnest(l.tfs) AS x)
       OR EXISTS (  -- each of the row's terms has its posting, with the row's tf, length and version
           (SELECT t.term, t.tf, l.length, l.document_id, l.version_number
            FROM unnest(l.terms, l.tfs) AS t (term, tf))
           EXCEPT ALL
           (SELECT x.term, x.tf, x.length, x.document_id, x.version_number
            FROM lexical_posting x
            WHERE x.tenant_id = l.tenant_id AND x.profile = l.profile AND x.term = ANY (l.terms)
              AND x.chunk_id = l.chunk_id))
),
strays AS (
    SELECT x.chunk_id, x.tenant_id, x.document_id, x.profile, x.version_number, 'stray posting' AS problem
    FROM lexical_posting x
    LEFT JOIN lexical_chunk l ON l.chunk_id = x.chunk_id
    WHERE l.chunk_id IS NULL OR x.term <> ALL (l.terms) OR (x.tenant_id, x.profile) <> (l.tenant_id, l.profile)
),
offending AS (
    SELECT DISTINCT ON (chunk_id) *
    FROM (SELECT * FROM by_row UNION ALL SELECT * FROM strays) AS found
    ORDER BY chunk_id, problem
)
SELECT o.*, count(*) OVER ()::integer AS total
FROM offending o
ORDER BY o.tenant_id, o.document_id, o.profile, o.version_number, o.chunk_id
LIMIT %(limit)s;

-- name: verify_lexical_stats_mismatch
-- BM25 statistics (lexical_term_stats: df per term, -1 chunks, -2 total length) that differ from a recount
-- over the lexical rows of the versions the search pointers name: scores would use a wrong corpus.
WITH pointed AS (
    SELECT l.tenant_id, l.profile, l.terms, l.length
    FROM lexical_chunk l
    JOIN search_pointer p
      ON p.tenant_id = l.tenant_id AND p.document_id = l.document_id
     AND p.profile = l.profile AND p.version_number = l.version_number
),
recount AS (
    SELECT tenant_id, profile, term, count(*)::bigint AS df FROM pointed, unnest(pointed.terms) AS term
    GROUP BY tenant_id, profile, term
    UNION ALL SELECT tenant_id, profile, -1, count(*)::bigint FROM pointed GROUP BY tenant_id, profile
    UNION ALL SELECT tenant_id, profile, -2, sum(length)::bigint FROM pointed GROUP BY tenant_id, profile
),
offending AS (
    SELECT coalesce(r.tenant_id, s.tenant_id) AS tenant_id, coalesce(r.profile, s.profile) AS profile,
           coalesce(r.term, s.term) AS term, coalesce(s.df, 0) AS stored_df, coalesce(r.df, 0) AS actual_df
    FROM recount r
    FULL JOIN (SELECT * FROM lexical_term_stats WHERE df <> 0) s
      ON s.tenant_id = r.tenant_id AND s.profile = r.profile AND s.term = r.term
    WHERE coalesce(s.df, 0) <> coalesce(r.df, 0)
)
SELECT o.*, count(*) OVER ()::integer AS total
FROM offending o
ORDER BY o.tenant_id, o.profile, o.term
LIMIT %(limit)s;

-- name: verify_lexical_bounds_short
-- A term's kept bound (lexical_term_stats max_tf, min_length_per_tf; migration 0052) that a posting of a pointed
-- version exceeds: MaxScore pruning (lexical_hits_pruned) could leave out a chunk that ranks. NULL is no bound
-- kept (search uses idf x (k1 + 1)), never short; a bound looser than the postings (a version left) is fine.
WITH pointed AS (
    SELECT l.tenant_id, l.profile, t.term, max(t.tf) AS max_tf, min(l.length::float8 / t.tf) AS min_length_per_tf
    FROM lexical_chunk l
    JOIN search_pointer p
      ON p.tenant_id = l.tenant_id AND p.document_id = l.document_id
     AND p.profile = l.profile AND p.version_number = l.version_number,
         unnest(l.terms, l.tfs) AS t (term, tf)
    GROUP BY l.tenant_id, l.profile, t.term
),
offending AS (
    SELECT w.tenant_id, w.profile, w.term, s.max_tf AS stored_max_tf, w.max_tf AS actual_max_tf,
           s.min_length_per_tf AS stored_min_length_per_tf, w.min_length_per_tf AS actual_min_length_per_tf
    FROM pointed w
    JOIN lexical_term_stats s ON s.tenant_id = w.tenant_id AND s.profile = w.profile AND s.term = w.term
    WHERE s.max_tf < w.max_tf OR s.min_length_per_tf > w.min_length_per_tf
)
SELECT o.*, count(*) OVER ()::integer AS total
FROM offending o
ORDER BY o.tenant_id, o.profile, o.term
LIMIT %(limit)s;
