-- Statements of resources/profiles.py: model migration (create a shadow profile, backfill it, gate it,
-- switch search to it in one transaction, roll back). A "current version" is document.latest_version.

-- name: index_profile_insert
-- A new shadow profile: building (publishes index under it too), not active, with its search mode and
-- BM25/fusion parameters (a migration may change them; the gate scores them) and whether chunks are embedded
-- with their document title and heading path (fixed at creation, migration 0046). No row back: the name is taken.
INSERT INTO index_profile (name, model, dimension, chunk_tokens, chunk_overlap, is_active, building,
                           search_mode, lexical_weight, bm25_k1, bm25_b, fusion, rrf_k, lexical_analyzer,
                           embed_context)
VALUES (%(name)s, %(model)s, %(dimension)s, %(chunk_tokens)s, %(chunk_overlap)s, false, true,
        %(search_mode)s, %(lexical_weight)s, %(bm25_k1)s, %(bm25_b)s, %(fusion)s, %(rrf_k)s, %(analyzer)s,
        %(embed_context)s)
ON CONFLICT (name) DO NOTHING
RETURNING name, model, dimension, chunk_tokens, chunk_overlap, is_active, building, created_at,
          search_mode, lexical_weight, bm25_k1, bm25_b, fusion, rrf_k, lexical_analyzer,
          embed_context;

-- name: document_table_lock
-- Wait for in-flight publishes and hold new ones until commit, so a version published meanwhile is
-- either seen by the bulk REINDEX below or sees the new profile in index_task_ensure (no gap).
LOCK TABLE document IN SHARE MODE;

-- name: index_task_reindex_profile
-- One REINDEX task under the profile for every current document version, in one statement; new tasks get
-- their PENDING event in the same statement. Idempotent on the business key.
WITH current_version AS (
    SELECT d.tenant_id, d.document_id, d.latest_version AS version_number
    FROM document d
    WHERE d.latest_version >= 1
),
inserted AS (
    INSERT INTO index_task (tenant_id, document_id, version_number, task_type, profile, max_attempts)
    SELECT c.tenant_id, c.document_id, c.version_number, 'REINDEX', %(profile)s, %(max_attempts)s
    FROM current_version c
    ON CONFLICT (tenant_id, document_id, version_number, task_type, profile) DO NOTHING
    RETURNING task_id
),
created_event AS (
    INSERT INTO task_event (task_id, attempt, from_status, to_status, message)
    SELECT task_id, 0, NULL, 'PENDING', 'created for a model migration'
    FROM inserted
)
SELECT count(*)::integer AS created FROM inserted;

-- name: index_task_catch_up_profile
-- After a rollback: an INDEX task (the sensor claims those) for each current version the restored profile
-- has neither indexed nor a task for (published while it was not a target), with PENDING events.
WITH current_version AS (
    SELECT d.tenant_id, d.document_id, d.latest_version AS version_number
    FROM document d
    WHERE d.latest_version >= 1
),
missing AS (
    SELECT c.* FROM current_version c
    WHERE NOT EXISTS (
              SELECT 1 FROM search_pointer p
              WHERE p.tenant_id = c.tenant_id AND p.document_id = c.document_id
                AND p.profile = %(profile)s AND p.version_number = c.version_number)
      AND NOT EXISTS (
              SELECT 1 FROM index_task t
              WHERE t.tenant_id = c.tenant_id AND t.document_id = c.document_id
                AND t.version_number = c.version_number AND t.profile = %(profile)s)
),
inserted AS (
    INSERT INTO index_task (tenant_id, document_id, version_number, task_type, profile, max_attempts)
    SELECT m.tenant_id, m.document_id, m.version_number, 'INDEX', %(profile)s, %(max_attempts)s
    FROM missing m
    ON CONFLICT (tenant_id, document_id, version_number, task_type, profile) DO NOTHING
    RETURNING task_id
),
created_event AS (
    INSERT INTO task_event (task_id, attempt, from_status, to_status, message)
    SELECT task_id, 0, NULL, 'PENDING', 'created to catch up after a rollback'
    FROM inserted
)
SELECT count(*)::integer AS created FROM inserted;

-- name: index_profile_lock_all
-- Every profile, rows locked for this transaction (activation and rollback serialize on them).
-- NO KEY UPDATE, not UPDATE: publishes' foreign-key checks (KEY SHARE on these rows) are not blocked.
SELECT name, model, dimension, chunk_tokens, chunk_overlap, is_active, building, activated_at,
       previous_active, created_at
FROM index_profile
ORDER BY name
FOR NO KEY UPDATE;

-- name: index_profile_deactivate
-- The active profile stops being active (first half of a switch; the second runs in the same transaction).
UPDATE index_profile SET is_active = false, building = false
WHERE is_active
RETURNING name;

-- name: index_profile_activate
-- The profile becomes the one search reads; it remembers which profile it replaced (for rollback).
UPDATE index_profile
SET is_active = true, building = false, previous_active = %(previous_active)s, activated_at = now()
WHERE name = %(name)s
RETURNING name, model, dimension, chunk_tokens, chunk_overlap, is_active, building, activated_at, previous_active;

-- name: index_profile_restore
-- Rollback: the previous profile is active again; its own previous_active is kept (rollback walks history).
UPDATE index_profile
SET is_active = true, building = false, activated_at = now()
WHERE name = %(name)s
RETURNING name, model, dimension, chunk_tokens, chunk_overlap, is_active, building, activated_at, previous_active;

-- name: index_profile_event_insert
-- Append one line of profile history (create, activate, rollback).
INSERT INTO index_profile_event (profile, action, from_profile, forced, detail)
VALUES (%(profile)s, %(action)s, %(from_profile)s, %(forced)s, %(detail)s::jsonb);

-- name: index_profile_events
-- A profile's history, oldest first.
SELECT event_id, profile, action, from_profile, forced, detail, created_at
FROM index_profile_event
WHERE profile = %(profile)s
ORDER BY event_id;

-- name: index_profile_list
-- Every profile with its coverage (current versions its pointers name / current versions) and latest gate.
WITH current_version AS (
    SELECT d.tenant_id, d.document_id, d.latest_version AS version_number
    FROM document d
    WHERE d.latest_version >= 1
),
covered AS (
    SELECT p.profile, count(*)::integer AS n
    FROM search_pointer p
    JOIN current_version c
      ON c.tenant_id = p.tenant_id AND c.document_id = p.document_id AND c.version_number = p.version_number
    GROUP BY p.profile
),
latest_gate AS (
    SELECT DISTINCT ON (g.profile) g.*
    FROM profile_gate g
    ORDER BY g.profile, g.gate_id DESC
)
SELECT ip.name, ip.model, ip.dimension, ip.chunk_tokens, ip.chunk_overlap, ip.is_active, ip.building,
       ip.activated_at, ip.previous_active, ip.created_at, ip.search_mode, ip.lexical_weight, ip.bm25_k1, ip.bm25_b,
       ip.fusion, ip.rrf_k, ip.lexical_analyzer,
       ip.embed_context, ip.rerank_url, ip.rerank_model, ip.rerank_key_env, ip.rerank_candidates,
       (SELECT count(*) FROM current_version)::integer AS current_versions,
       coalesce(cv.n, 0) AS covered_versions,
       g.gate_id, g.passed AS gate_passed, g.baseline_profile AS gate_baseline, g.eval_set AS gate_eval_set,
       g.shadow_ndcg AS gate_ndcg, g.shadow_recall AS gate_recall, g.active_ndcg AS gate_baseline_ndcg,
       g.active_recall AS gate_baseline_recall, g.tolerance AS gate_tolerance, g.created_at AS gate_at,
       g.lexical_analyzer AS gate_lexical_analyzer
FROM index_profile ip
LEFT JOIN covered cv ON cv.profile = ip.name
LEFT JOIN latest_gate g ON g.profile = ip.name
ORDER BY ip.is_active DESC, ip.building DESC, ip.created_at, ip.name;

-- name: index_profile_coverage
-- How many current versions the profile's pointers name, and why the others are missing (their task's
-- status under the profile, DEAD ones with the error code; NO_TASK when it has none).
WITH current_version AS (
    SELECT d.tenant_id, d.document_id, d.latest_version AS version_number
    FROM document d
    WHERE d.latest_version >= 1
),
missing AS (
    SELECT c.* FROM current_version c
    WHERE NOT EXISTS (
        SELECT 1 FROM search_pointer p
        WHERE p.tenant_id = c.tenant_id AND p.document_id = c.document_id
          AND p.profile = %(profile)s AND p.version_number = c.version_number)
),
why AS (
    SELECT coalesce(t.status, 'NO_TASK')
           || CASE WHEN t.status = 'DEAD' THEN ' ' || coalesce(t.error_code, 'UNKNOWN') ELSE '' END AS reason
    FROM missing m
    LEFT JOIN LATERAL (
        SELECT t.status, t.error_code
        FROM index_task t
        WHERE t.tenant_id = m.tenant_id AND t.document_id = m.document_id
          AND t.version_number = m.version_number AND t.profile = %(profile)s
        ORDER BY t.task_type          -- INDEX before REINDEX
        LIMIT 1
    ) t ON true
)
SELECT (SELECT count(*) FROM current_version)::integer AS current_versions,
       (SELECT count(*) FROM missing)::integer AS missing_versions,
       (SELECT coalesce(jsonb_object_agg(w.reason, w.n), '{}'::jsonb)
          FROM (SELECT reason, count(*)::integer AS n FROM why GROUP BY reason) w) AS missing_by_reason;

-- name: index_profile_migration_progress
-- Each building profile's backfill: current versions done (pointer at the current version) of all, its
-- tasks for current versions by status, DEAD and RETRY_WAIT ones by error code, and SUCCEEDED in the
-- last five minutes (the rate). %(tenant_id)s NULL: every tenant (the operator's CLI); else that tenant's
-- documents and tasks only (the API: one tenant never sees another's counts or failures).
WITH clock AS (
    SELECT coalesce(%(now)s::timestamptz, now()) AS now
),
current_version AS (
    SELECT d.tenant_id, d.document_id, d.latest_version AS version_number
    FROM document d
    WHERE d.latest_version >= 1
      AND (%(tenant_id)s::text IS NULL OR d.tenant_id = %(tenant_id)s::text)
),
building AS (
    SELECT name, model, chunk_tokens, chunk_overlap, created_at
    FROM index_profile
    WHERE building
),
task AS (
    SELECT t.profile, t.status, t.error_code
    FROM index_task t
    JOIN current_version c
      ON c.tenant_id = t.tenant_id AND c.document_id = t.document_id AND c.version_number = t.version_number
    WHERE t.profile IN (SELECT name FROM building)
)
SELECT b.name AS profile, b.model, b.chunk_tokens, b.chunk_overlap, b.created_at,
       (SELECT count(*) FROM current_version)::integer AS total,
       (SELECT count(*) FROM search_pointer p
          JOIN current_version c
            ON c.tenant_id = p.tenant_id AND c.document_id = p.document_id AND c.version_number = p.version_number
         WHERE p.profile = b.name)::integer AS done,
       (SELECT count(*) FROM task WHERE task.profile = b.name AND task.status = 'PENDING')::integer AS pending,
       (SELECT count(*) FROM task WHERE task.profile = b.name AND task.status = 'RUNNING')::integer AS running,
       (SELECT count(*) FROM task WHERE task.profile = b.name AND task.status = 'RETRY_WAIT')::integer AS retry_wait,
       (SELECT count(*) FROM task WHERE task.profile = b.name AND task.status = 'DEAD')::integer AS dead,
       (SELECT count(*) FROM task WHERE task.profile = b.name AND task.status = 'CANCELLED')::integer AS cancelled,
       (SELECT coalesce(jsonb_object_agg(f.code, f.n), '{}'::jsonb)
          FROM (SELECT coalesce(task.error_code, 'UNKNOWN') AS code, count(*)::integer AS n
                  FROM task WHERE task.profile = b.name AND task.status = 'DEAD' GROUP BY 1) f) AS failures_by_code,
       (SELECT coalesce(jsonb_object_agg(f.code, f.n), '{}'::jsonb)
          FROM (SELECT coalesce(task.error_code, 'UNKNOWN') AS code, count(*)::integer AS n
                  FROM task WHERE task.profile = b.name AND task.status = 'RETRY_WAIT' GROUP BY 1) f) AS retrying_by_code,
       (SELECT count(*) FROM index_task t
         WHERE t.profile = b.name AND t.status = 'SUCCEEDED'
           AND (%(tenant_id)s::text IS NULL OR t.tenant_id = %(tenant_id)s::text)
           AND t.finished_at > (SELECT now FROM clock) - interval '5 minutes'
           AND t.finished_at <= (SELECT now FROM clock))::integer AS succeeded_last_5m
FROM building b
ORDER BY b.created_at, b.name;

-- name: profile_gate_insert
-- Record one quality-gate evaluation.
INSERT INTO profile_gate (profile, baseline_profile, eval_set, eval_digest, documents, queries, k,
                          shadow_ndcg, shadow_recall, active_ndcg, active_recall, tolerance, passed, seconds,
                          mode, baseline_mode, fusion, rrf_k, lexical_weight, lexical_analyzer,
                          baseline_lexical_analyzer, rerank_url, rerank_model, rerank_candidates)
VALUES (%(profile)s, %(baseline_profile)s, %(eval_set)s, %(eval_digest)s, %(documents)s, %(queries)s, %(k)s,
        %(shadow_ndcg)s, %(shadow_recall)s, %(active_ndcg)s, %(active_recall)s, %(tolerance)s, %(passed)s,
        %(seconds)s, %(mode)s, %(baseline_mode)s, %(fusion)s, %(rrf_k)s, %(lexical_weight)s,
        %(lexical_analyzer)s, %(baseline_lexical_analyzer)s, %(rerank_url)s, %(rerank_model)s, %(rerank_candidates)s)
RETURNING gate_id, profile, baseline_profile, eval_set, eval_digest, documents, queries, k, shadow_ndcg,
          shadow_recall, active_ndcg, active_recall, tolerance, passed, seconds, created_at, mode, baseline_mode,
          fusion, rrf_k, lexical_weight, lexical_analyzer, baseline_lexical_analyzer, rerank_url, rerank_model,
          rerank_candidates;

-- name: profile_gate_latest
-- The profile's latest gate result (activation requires it to have passed against the active profile).
SELECT gate_id, profile, baseline_profile, eval_set, eval_digest, documents, queries, k, shadow_ndcg,
       shadow_recall, active_ndcg, active_recall, tolerance, passed, seconds, created_at, fusion, rrf_k, lexical_weight,
       lexical_analyzer, baseline_lexical_analyzer, rerank_url, rerank_model, rerank_candidates
FROM profile_gate
WHERE profile = %(profile)s
ORDER BY gate_id DESC
LIMIT 1;

-- name: index_profile_fusion_set
-- Change how a profile fuses hybrid search (query-time only: nothing is re-indexed). No row back: no such profile.
UPDATE index_profile
   SET fusion = %(fusion)s, rrf_k = %(rrf_k)s, lexical_weight = %(lexical_weight)s
 WHERE name = %(name)s
RETURNING name, model, dimension, chunk_tokens, chunk_overlap, is_active, building, created_at,
          search_mode, lexical_weight, bm25_k1, bm25_b, fusion, rrf_k, lexical_analyzer;

-- name: index_profile_rerank_set
-- Set or clear (all NULL) a profile's HTTP reranker (query-time only: nothing is re-indexed). No row back: no such profile.
UPDATE index_profile
   SET rerank_url = %(rerank_url)s, rerank_model = %(rerank_model)s, rerank_key_env = %(rerank_key_env)s,
       rerank_candidates = %(rerank_candidates)s
 WHERE name = %(name)s
RETURNING name, model, is_active, building, rerank_url, rerank_model, rerank_key_env, rerank_candidates;
