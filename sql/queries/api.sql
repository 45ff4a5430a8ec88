-- Reads of the HTTP API (pipelines/api). Every statement that touches tenant data takes %(tenant_id)s.
--
-- Statements that return document data also take the caller's read scope (pipelines/domain/metadata.py
-- ReadScope.params): %(see_all)s (a whole-tenant token: every version) or %(principals)s. The rule is the one
-- search applies (DESIGN.md invariant 8), on two rows:
-- - the version's own row: a version whose allow list names none of the principals does not exist for them;
-- - the document's search pointer (active profile): while it names a version the principals may not read, no
--   version of the document exists for them. The pointer takes its allow list in the statement that flips it,
--   so a narrowed (or widened) allow list takes effect for these routes at the same instant as for search.
-- A document's "latest version" is the newest one the caller may read.

-- name: api_document_status
-- The listed documents of one tenant (%(document_ids)s) as the caller may see them: each one's newest version
-- the caller may read, that version's INDEX task under the active profile, and the version search serves
-- (search_pointer); a document whose pointer names a version the caller may not read has no row. Every part
-- is a primary-key or unique-key probe per listed document (LATERAL), never a join over the tenant's tasks.
SELECT d.tenant_id, d.document_id, v.version_number AS latest_version,
       v.kind AS latest_kind, v.filename, v.media_type, v.byte_size, v.published_at, v.metadata,
       v.allow_principals,
       p.name AS profile,
       t.task_id, t.status AS task_status, t.stage, t.completed, t.total, t.attempts, t.max_attempts,
       t.error_code, t.error_message, t.created_at AS task_created_at, t.finished_at AS task_finished_at,
       sp.version_number AS searchable_version, sp.chunk_count AS searchable_chunks,
       sp.updated_at AS searchable_since
FROM document d
JOIN LATERAL (
    SELECT v.* FROM document_version v
    WHERE v.tenant_id = d.tenant_id AND v.document_id = d.document_id
      AND (%(see_all)s OR v.allow_principals IS NULL OR v.allow_principals && %(principals)s::text[])
    ORDER BY v.version_number DESC
    LIMIT 1  -- the newest readable version (with see_all: d.latest_version), one backward primary-key step
) v ON true
LEFT JOIN index_profile p ON p.is_active
LEFT JOIN LATERAL (
    SELECT t.* FROM index_task t
    WHERE t.tenant_id = d.tenant_id AND t.document_id = d.document_id AND t.version_number = v.version_number
      AND t.task_type = 'INDEX' AND t.profile = p.name
    LIMIT 1  -- one row by the unique business key; LIMIT keeps the planner from flattening it into a join
) t ON true
LEFT JOIN LATERAL (
    SELECT sp.* FROM search_pointer sp
    WHERE sp.tenant_id = d.tenant_id AND sp.document_id = d.document_id AND sp.profile = p.name
    LIMIT 1
) sp ON true
WHERE d.tenant_id = %(tenant_id)s
  AND d.document_id = ANY(%(document_ids)s::text[])
  AND (%(see_all)s OR sp.allow_principals IS NULL OR sp.allow_principals && %(principals)s::text[]);

-- name: api_document_page_recent
-- One page of the tenant's documents the caller may see (see the top of this file), newest publish first,
-- strictly after the keyset
-- (%(before_published_at)s, %(before_document_id)s, %(before_version)s) ('infinity', '', 0 for the first
-- page), walking document_version_tenant_published_idx backwards. A document is listed at its newest version
-- the caller may read (with %(see_all)s: its latest), unless its search pointer excludes the caller.
-- The three page walks share one shape, a "loose index scan": the recursive CTE takes the next index entry
-- after the previous one (one index descent each, in index order) and the outer query keeps the entries of
-- documents' latest versions until it has %(limit)s. The recursion is pulled lazily, so it stops with the
-- page: the cost is the page plus the superseded entries skipped on the way, never the tenant's history,
-- and no planner estimate can turn it into a scan-and-sort of the tenant.
-- Skipped entries are bounded too: the walk takes at most %(scan_budget)s entries per page, and its last one
-- (depth = %(scan_budget)s) is returned whether or not it is kept (kept = false), so the caller can continue
-- from it. An end user who may read one document in a million gets short (even empty) pages with a next
-- cursor instead of one request that reads the tenant.
WITH RECURSIVE walk AS (
    (SELECT v.published_at, v.document_id, v.version_number, 1 AS depth
     FROM document_version v
     WHERE v.tenant_id = %(tenant_id)s
       AND (v.published_at, v.document_id, v.version_number)
           < (%(before_published_at)s::timestamptz, %(before_document_id)s::text, %(before_version)s::integer)
     ORDER BY v.published_at DESC, v.document_id DESC, v.version_number DESC
     LIMIT 1)
    UNION ALL
    (SELECT n.published_at, n.document_id, n.version_number, w.depth + 1
     FROM walk w
     CROSS JOIN LATERAL (
         SELECT v.published_at, v.document_id, v.version_number
         FROM document_version v
         WHERE v.tenant_id = %(tenant_id)s
           AND (v.published_at, v.document_id, v.version_number) < (w.published_at, w.document_id, w.version_number)
         ORDER BY v.published_at DESC, v.document_id DESC, v.version_number DESC
         LIMIT 1
     ) n
     WHERE w.depth < %(scan_budget)s)
)
SELECT w.document_id, w.published_at, w.version_number, w.depth, j.kept
FROM walk w
CROSS JOIN LATERAL (SELECT (
    w.version_number = (SELECT max(v.version_number) FROM document_version v
                        WHERE v.tenant_id = %(tenant_id)s AND v.document_id = w.document_id
                          AND (%(see_all)s OR v.allow_principals IS NULL
                               OR v.allow_principals && %(principals)s::text[]))
    AND (%(see_all)s OR NOT EXISTS (
        SELECT 1 FROM search_pointer sp
        WHERE sp.tenant_id = %(tenant_id)s AND sp.document_id = w.document_id
          AND sp.profile = (SELECT p.name FROM index_profile p WHERE p.is_active)
          AND sp.allow_principals IS NOT NULL AND NOT sp.allow_principals && %(principals)s::text[]))
) AS kept) j
WHERE j.kept OR w.depth = %(scan_budget)s
LIMIT %(limit)s;

-- name: api_document_page_by_task_status
-- One page of the tenant's documents whose latest version's INDEX task (active profile) is in
-- %(task_status)s, newest task first, task_id below %(before_task_id)s: walks
-- index_task_tenant_status_task_idx backwards, skipping superseded versions and other profiles. As in
-- api_document_page_recent, a document's latest version is its newest the caller may read, and its search
-- pointer must not exclude the caller.
WITH RECURSIVE walk AS (
    (SELECT t.task_id, 1 AS depth
     FROM index_task t
     WHERE t.tenant_id = %(tenant_id)s AND t.status = %(task_status)s::text AND t.task_id < %(before_task_id)s::bigint
     ORDER BY t.task_id DESC
     LIMIT 1)
    UNION ALL
    (SELECT n.task_id, w.depth + 1
     FROM walk w
     CROSS JOIN LATERAL (
         SELECT t.task_id
         FROM index_task t
         WHERE t.tenant_id = %(tenant_id)s AND t.status = %(task_status)s::text AND t.task_id < w.task_id
         ORDER BY t.task_id DESC
         LIMIT 1
     ) n
     WHERE w.depth < %(scan_budget)s)
)
SELECT t.document_id, t.task_id, w.depth, j.kept
FROM walk w
JOIN index_task t ON t.task_id = w.task_id
CROSS JOIN LATERAL (SELECT (
    t.task_type = 'INDEX'
    AND t.profile = (SELECT p.name FROM index_profile p WHERE p.is_active)
    AND t.version_number = (SELECT max(v.version_number) FROM document_version v
                            WHERE v.tenant_id = %(tenant_id)s AND v.document_id = t.document_id
                              AND (%(see_all)s OR v.allow_principals IS NULL
                                   OR v.allow_principals && %(principals)s::text[]))
    AND (%(see_all)s OR NOT EXISTS (
        SELECT 1 FROM search_pointer sp
        WHERE sp.tenant_id = %(tenant_id)s AND sp.document_id = t.document_id
          AND sp.profile = (SELECT p.name FROM index_profile p WHERE p.is_active)
          AND sp.allow_principals IS NOT NULL AND NOT sp.allow_principals && %(principals)s::text[]))
) AS kept) j
WHERE j.kept OR w.depth = %(scan_budget)s
LIMIT %(limit)s;

-- name: api_document_page_by_error_code
-- Like api_document_page_by_task_status, for the failures of one error code: latest versions whose task is
-- DEAD or RETRY_WAIT with %(error_code)s (and in %(task_status)s when given), walking
-- index_task_tenant_failure_idx backwards.
WITH RECURSIVE walk AS (
    (SELECT t.task_id, 1 AS depth
     FROM index_task t
     WHERE t.tenant_id = %(tenant_id)s AND t.status IN ('DEAD', 'RETRY_WAIT')
       AND t.error_code = %(error_code)s::text AND t.task_id < %(before_task_id)s::bigint
     ORDER BY t.task_id DESC
     LIMIT 1)
    UNION ALL
    (SELECT n.task_id, w.depth + 1
     FROM walk w
     CROSS JOIN LATERAL (
         SELECT t.task_id
         FROM index_task t
         WHERE t.tenant_id = %(tenant_id)s AND t.status IN ('DEAD', 'RETRY_WAIT')
           AND t.error_code = %(error_code)s::text AND t.task_id < w.task_id
         ORDER BY t.task_id DESC
         LIMIT 1
     ) n
     WHERE w.depth < %(scan_budget)s)
)
SELECT t.document_id, t.task_id, w.depth, j.kept
FROM walk w
JOIN index_task t ON t.task_id = w.task_id
CROSS JOIN LATERAL (SELECT (
    (%(task_status)s::text IS NULL OR t.status = %(task_status)s::text)
    AND t.task_type = 'INDEX'
    AND t.profile = (SELECT p.name FROM index_profile p WHERE p.is_active)
    AND t.version_number = (SELECT max(v.version_number) FROM document_version v
                            WHERE v.tenant_id = %(tenant_id)s AND v.document_id = t.document_id
                              AND (%(see_all)s OR v.allow_principals IS NULL
                                   OR v.allow_principals && %(principals)s::text[]))
    AND (%(see_all)s OR NOT EXISTS (
        SELECT 1 FROM search_pointer sp
        WHERE sp.tenant_id = %(tenant_id)s AND sp.document_id = t.document_id
          AND sp.profile = (SELECT p.name FROM index_profile p WHERE p.is_active)
          AND sp.allow_principals IS NOT NULL AND NOT sp.allow_principals && %(principals)s::text[]))
) AS kept) j
WHERE j.kept OR w.depth = %(scan_budget)s
LIMIT %(limit)s;

-- name: api_tenant_overview
-- The status page's header for one tenant, in one round trip, every part an index walk:
-- tasks by status and documents (index-only counts); the oldest open task (the first entry of each open
-- status); tasks finished since it was queued and SUCCEEDED in the rate window (range scans of
-- index_task_tenant_finished_idx). The rate window is the last %(window_seconds)s seconds, shortened to
-- the time since the oldest open task was queued but never below a minute.
WITH clock AS (
    SELECT coalesce(%(now)s::timestamptz, now()) AS now
),
by_status AS (
    SELECT t.status, count(*)::bigint AS n
    FROM index_task t
    WHERE t.tenant_id = %(tenant_id)s
    GROUP BY t.status
),
oldest_open AS (
    SELECT t.created_at
    FROM index_task t
    WHERE t.task_id = (
        SELECT min(first.task_id)
        FROM unnest(ARRAY['PENDING', 'RUNNING', 'RETRY_WAIT']) AS s(status)
        CROSS JOIN LATERAL (
            SELECT o.task_id FROM index_task o
            WHERE o.tenant_id = %(tenant_id)s AND o.status = s.status
            ORDER BY o.task_id
            LIMIT 1
        ) first
    )
),
rate_window AS (
    SELECT greatest(
               least(extract(epoch FROM (SELECT now FROM clock) - (SELECT created_at FROM oldest_open)),
                     %(window_seconds)s::float8),
               60.0)::float8 AS seconds
)
SELECT (SELECT coalesce(jsonb_object_agg(b.status, b.n), '{}'::jsonb) FROM by_status b) AS tasks_by_status,
       (SELECT count(*) FROM document d WHERE d.tenant_id = %(tenant_id)s)::bigint AS documents,
       (SELECT created_at FROM oldest_open) AS open_since,
       (SELECT count(*) FROM index_task t
         WHERE t.tenant_id = %(tenant_id)s AND t.status IN ('SUCCEEDED', 'DEAD', 'CANCELLED')
           AND t.finished_at >= (SELECT created_at FROM oldest_open))::bigint AS finished_since_open,
       (SELECT coalesce(w.seconds, %(window_seconds)s::float8) FROM rate_window w) AS window_seconds,
       (SELECT count(*) FROM index_task t
         WHERE t.tenant_id = %(tenant_id)s AND t.status = 'SUCCEEDED'
           AND t.finished_at > (SELECT now FROM clock)
                               - make_interval(secs => (SELECT coalesce(w.seconds, %(window_seconds)s::float8) FROM rate_window w))
           AND t.finished_at <= (SELECT now FROM clock))::bigint AS succeeded_in_window,
       (SELECT now FROM clock) AS as_of;

-- name: api_tenant_overview_scoped
-- api_tenant_overview for a caller who may not see every version (an end-user or service token): the same
-- figures over the tasks whose version the caller may read (the rule of api_task_get_visible), so the counts
-- say nothing of restricted documents. Which tasks a caller may read is not in any index, so the figures are
-- taken over the tenant's newest %(scan_tasks)s tasks (the newest of each status in %(statuses)s, index-only,
-- merged): a cost that does not grow with the tenant. tasks_read says how many were read; fewer than
-- %(scan_tasks)s means the figures cover every task.
WITH clock AS (
    SELECT coalesce(%(now)s::timestamptz, now()) AS now
),
recent AS MATERIALIZED (
    SELECT r.task_id
    FROM unnest(%(statuses)s::text[]) AS s(status)
    CROSS JOIN LATERAL (
        SELECT t.task_id FROM index_task t
        WHERE t.tenant_id = %(tenant_id)s AND t.status = s.status
        ORDER BY t.task_id DESC
        LIMIT %(scan_tasks)s
    ) r
    ORDER BY r.task_id DESC
    LIMIT %(scan_tasks)s
),
seen AS MATERIALIZED (
    SELECT t.document_id, t.status, t.created_at, t.finished_at
    FROM recent r
    CROSS JOIN LATERAL (SELECT * FROM index_task t WHERE t.task_id = r.task_id LIMIT 1) t  -- a lookup each, never a scan
    JOIN document_version v
      ON v.tenant_id = t.tenant_id AND v.document_id = t.document_id AND v.version_number = t.version_number
    WHERE (v.allow_principals IS NULL OR v.allow_principals && %(principals)s::text[])
      AND NOT EXISTS (
          SELECT 1 FROM search_pointer sp
          WHERE sp.tenant_id = t.tenant_id AND sp.document_id = t.document_id
            AND sp.profile = (SELECT p.name FROM index_profile p WHERE p.is_active)
            AND sp.allow_principals IS NOT NULL AND NOT sp.allow_principals && %(principals)s::text[])
),
by_status AS (
    SELECT s.status, count(*)::bigint AS n FROM seen s GROUP BY s.status
),
oldest_open AS (
    SELECT min(s.created_at) AS created_at FROM seen s WHERE s.status IN ('PENDING', 'RUNNING', 'RETRY_WAIT')
),
rate_window AS (
    SELECT greatest(
               least(extract(epoch FROM (SELECT now FROM clock) - (SELECT created_at FROM oldest_open)),
                     %(window_seconds)s::float8),
               60.0)::float8 AS seconds
)
SELECT (SELECT coalesce(jsonb_object_agg(b.status, b.n), '{}'::jsonb) FROM by_status b) AS tasks_by_status,
       (SELECT count(DISTINCT s.document_id) FROM seen s)::bigint AS documents,
       (SELECT created_at FROM oldest_open) AS open_since,
       (SELECT count(*) FROM seen s
         WHERE s.status IN ('SUCCEEDED', 'DEAD', 'CANCELLED')
           AND s.finished_at >= (SELECT created_at FROM oldest_open))::bigint AS finished_since_open,
       (SELECT coalesce(w.seconds, %(window_seconds)s::float8) FROM rate_window w) AS window_seconds,
       (SELECT count(*) FROM seen s
         WHERE s.status = 'SUCCEEDED'
           AND s.finished_at > (SELECT now FROM clock)
                               - make_interval(secs => (SELECT coalesce(w.seconds, %(window_seconds)s::float8) FROM rate_window w))
           AND s.finished_at <= (SELECT now FROM clock))::bigint AS succeeded_in_window,
       (SELECT count(*) FROM recent)::bigint AS tasks_read,
       (SELECT count(*) FROM recent) < %(scan_tasks)s AS tasks_complete,
       (SELECT now FROM clock) AS as_of;

-- name: api_tenant_failures_by_code
-- The tenant's documents whose latest version (the newest the caller may read, and not hidden by a search
-- pointer that excludes the caller) failed (DEAD) or waits for a retry after an error (RETRY_WAIT), by error
-- code, most first: what api_document_page_by_error_code lists for each code.
SELECT t.error_code AS code,
       count(*) FILTER (WHERE t.status = 'DEAD')::bigint AS dead,
       count(*) FILTER (WHERE t.status = 'RETRY_WAIT')::bigint AS retry_wait
FROM index_task t
JOIN index_profile p ON p.is_active AND p.name = t.profile
WHERE t.tenant_id = %(tenant_id)s
  AND t.status IN ('DEAD', 'RETRY_WAIT')
  AND t.error_code IS NOT NULL
  AND t.task_type = 'INDEX'
  AND t.version_number = (SELECT max(v.version_number) FROM document_version v
                          WHERE v.tenant_id = %(tenant_id)s AND v.document_id = t.document_id
                            AND (%(see_all)s OR v.allow_principals IS NULL
                                 OR v.allow_principals && %(principals)s::text[]))
  AND (%(see_all)s OR NOT EXISTS (
      SELECT 1 FROM search_pointer sp
      WHERE sp.tenant_id = %(tenant_id)s AND sp.document_id = t.document_id
        AND sp.profile = (SELECT p.name FROM index_profile p WHERE p.is_active)
        AND sp.allow_principals IS NOT NULL AND NOT sp.allow_principals && %(principals)s::text[]))
GROUP BY t.error_code
ORDER BY count(*) DESC, t.error_code;

-- name: api_task_failures_by_code
-- Failures ever recorded, by error code (each fenced fail or crash that moved a task to RETRY_WAIT or DEAD).
SELECT e.error_code AS code, count(*)::bigint AS n
FROM task_event e
WHERE e.error_code IS NOT NULL AND e.to_status IN ('RETRY_WAIT', 'DEAD')
GROUP BY e.error_code
ORDER BY e.error_code;

-- name: api_publish_latency_histogram
-- Publish -> searchable seconds of every SUCCEEDED task (created_at -> finished_at), as cumulative counts
-- per upper bound in %(bounds)s (float8[]), plus the total count and sum: a Prometheus histogram.
WITH lat AS (
    SELECT extract(epoch FROM (t.finished_at - t.created_at))::float8 AS s
    FROM index_task t
    WHERE t.status = 'SUCCEEDED' AND t.finished_at IS NOT NULL
)
SELECT ARRAY(SELECT (SELECT count(*) FROM lat WHERE lat.s <= b)::bigint
             FROM unnest(%(bounds)s::float8[]) WITH ORDINALITY AS u(b, i) ORDER BY u.i) AS cumulative,
       (SELECT count(*) FROM lat)::bigint AS n,
       (SELECT coalesce(sum(lat.s), 0) FROM lat)::float8 AS total_seconds;

-- name: api_task_event_heads
-- The newest event id of each listed task (one backward step of task_event_task_idx per task): the SSE
-- hub wakes only the streams whose task has an event newer than what they have sent.
SELECT t.task_id,
       (SELECT max(e.event_id) FROM task_event e WHERE e.task_id = t.task_id) AS event_id
FROM unnest(%(task_ids)s::bigint[]) AS t (task_id);

-- name: api_token_state
-- The api_token row of a token hash, revoked or not: a revocation here also revokes the same token in the
-- token file.
-- principals: an end-user token's fixed principals (NULL: none); search_as: a service token.
SELECT tenant_id, revoked_at IS NOT NULL AS revoked, principals, search_as
FROM api_token
WHERE token_sha256 = %(token_sha256)s;

-- name: api_task_get_visible
-- One task of %(tenant_id)s by id, with its version's kind, erase time, metadata and allow list, if the caller
-- may read its version (see the top of this file): no row answers 404 exactly as a missing task does.
SELECT t.*, v.kind AS version_kind, v.erased_at AS version_erased_at, v.metadata AS version_metadata,
       v.allow_principals AS version_allow
FROM index_task t
JOIN document_version v
  ON v.tenant_id = t.tenant_id AND v.document_id = t.document_id AND v.version_number = t.version_number
WHERE t.task_id = %(task_id)s
  AND t.tenant_id = %(tenant_id)s
  AND (%(see_all)s OR (
      (v.allow_principals IS NULL OR v.allow_principals && %(principals)s::text[])
      AND NOT EXISTS (
          SELECT 1 FROM search_pointer sp
          WHERE sp.tenant_id = t.tenant_id AND sp.document_id = t.document_id
            AND sp.profile = (SELECT p.name FROM index_profile p WHERE p.is_active)
            AND sp.allow_principals IS NOT NULL AND NOT sp.allow_principals && %(principals)s::text[])));

-- name: api_task_list_visible
-- The newest tasks of %(tenant_id)s (of status %(status)s when given) whose version the caller may read (the
-- rule of api_task_get_visible), with their version's kind, metadata and allow list. The candidates are the
-- tenant's newest %(scan_tasks)s tasks (the newest of each status, index-only, merged), so a caller who may
-- read few of them costs no more than one who may read all: such a caller sees the tasks it may read among
-- those.
WITH recent AS MATERIALIZED (
    SELECT r.task_id
    FROM unnest(CASE WHEN %(status)s::text IS NULL THEN %(statuses)s::text[] ELSE ARRAY[%(status)s::text] END)
         AS s(status)
    CROSS JOIN LATERAL (
        SELECT t.task_id FROM index_task t
        WHERE t.tenant_id = %(tenant_id)s AND t.status = s.status
        ORDER BY t.task_id DESC
        LIMIT %(scan_tasks)s
    ) r
    ORDER BY r.task_id DESC
    LIMIT %(scan_tasks)s
)
SELECT t.*, v.kind AS version_kind, v.metadata AS version_metadata, v.allow_principals AS version_allow
FROM recent r
CROSS JOIN LATERAL (SELECT * FROM index_task t WHERE t.task_id = r.task_id LIMIT 1) t  -- a lookup each, never a scan
JOIN document_version v
  ON v.tenant_id = t.tenant_id AND v.document_id = t.document_id AND v.version_number = t.version_number
WHERE %(see_all)s OR (
      (v.allow_principals IS NULL OR v.allow_principals && %(principals)s::text[])
      AND NOT EXISTS (
          SELECT 1 FROM search_pointer sp
          WHERE sp.tenant_id = t.tenant_id AND sp.document_id = t.document_id
            AND sp.profile = (SELECT p.name FROM index_profile p WHERE p.is_active)
            AND sp.allow_principals IS NOT NULL AND NOT sp.allow_principals && %(principals)s::text[]))
ORDER BY t.task_id DESC
LIMIT %(limit)s;

-- name: api_task_events_visible
-- A task's events after %(after_event_id)s, oldest first, in one snapshot with the check that the caller may
-- still read the task's version (the rule of api_task_get_visible; a pointer flip may have narrowed it while
-- the stream was open). Always at least one row: visible = false (and no event) when the caller may not;
-- visible = true with a NULL event_id when there is nothing newer.
WITH visible AS (
    SELECT EXISTS (
        SELECT 1
        FROM index_task t
        JOIN document_version v
          ON v.tenant_id = t.tenant_id AND v.document_id = t.document_id AND v.version_number = t.version_number
        WHERE t.task_id = %(task_id)s
          AND t.tenant_id = %(tenant_id)s
          AND (%(see_all)s OR (
              (v.allow_principals IS NULL OR v.allow_principals && %(principals)s::text[])
              AND NOT EXISTS (
                  SELECT 1 FROM search_pointer sp
                  WHERE sp.tenant_id = t.tenant_id AND sp.document_id = t.document_id
                    AND sp.profile = (SELECT p.name FROM index_profile p WHERE p.is_active)
                    AND sp.allow_principals IS NOT NULL AND NOT sp.allow_principals && %(principals)s::text[])))
    ) AS ok
)
SELECT visible.ok AS visible, e.*
FROM visible
LEFT JOIN task_event e
  ON visible.ok AND e.task_id = %(task_id)s AND e.event_id > %(after_event_id)s
ORDER BY e.event_id;
