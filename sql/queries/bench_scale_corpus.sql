-- Benchmark only (bench/scale/ui.py, bench/scale/migration.py): an indexed corpus built set-based.
-- Document i's text is the formula in bench_corpus_seed_versions (bench/scale/corpus.py writes the same
-- bytes to the blob store), so content_hash is the real SHA-256 and a REINDEX run can re-parse it.

-- name: bench_corpus_seed_documents
-- Benchmark only: documents corpus-FIRST..corpus-(FIRST+COUNT-1) of one tenant, one version each.
INSERT INTO document (tenant_id, document_id, latest_version)
SELECT %(tenant)s, 'corpus-' || i, 1 FROM generate_series(%(first)s, %(first)s + %(count)s - 1) AS i;

-- name: bench_corpus_seed_versions
-- Benchmark only: their versions, keyed as the publisher keys them, with the text's real hash and size.
INSERT INTO document_version (tenant_id, document_id, version_number, content_hash, byte_size, filename,
                              media_type, partition_key, published_at)
SELECT %(tenant)s, 'corpus-' || i, 1, encode(sha256(b.body), 'hex'), octet_length(b.body), 'corpus-' || i || '.txt',
       'text/plain', %(tenant)s || '/corpus-' || i || '/v1', now() - interval '30 days'
FROM generate_series(%(first)s, %(first)s + %(count)s - 1) AS i
CROSS JOIN LATERAL (SELECT convert_to(
    'Policy ' || i || ': claims of class ' || i %% 7 || ' are reviewed by team ' || i %% 13 || ' within '
    || i %% 9 + 2 || E' working days.\n\nRefunds above ' || i %% 500 || ' euros need a second approval, case '
    || i || E'.\n\nTravel booked for case ' || i || ' is reimbursed in ' || i %% 4 + 1 || ' weeks.', 'UTF8') AS body) b;

-- name: bench_corpus_seed_tasks
-- Benchmark only: a SUCCEEDED INDEX task per seeded version under the active profile, as a finished run leaves it.
INSERT INTO index_task (tenant_id, document_id, version_number, task_type, profile, status, attempts,
                        chunk_count, created_at, updated_at, started_at, finished_at)
SELECT v.tenant_id, v.document_id, 1, 'INDEX', p.name, 'SUCCEEDED', 1, 1,
       v.published_at, v.published_at, v.published_at, v.published_at
FROM generate_series(%(first)s, %(first)s + %(count)s - 1) AS i
JOIN document_version v ON v.tenant_id = %(tenant)s AND v.document_id = 'corpus-' || i AND v.version_number = 1
CROSS JOIN index_profile p WHERE p.is_active;

-- name: bench_corpus_seed_pointers
-- Benchmark only: search reads every seeded version.
INSERT INTO search_pointer (tenant_id, document_id, profile, version_number, task_id, chunk_count)
SELECT t.tenant_id, t.document_id, t.profile, 1, t.task_id, 1
FROM generate_series(%(first)s, %(first)s + %(count)s - 1) AS i
JOIN index_task t ON t.tenant_id = %(tenant)s AND t.document_id = 'corpus-' || i AND t.version_number = 1
                 AND t.task_type = 'INDEX'
JOIN index_profile p ON p.name = t.profile AND p.is_active;

-- name: bench_corpus_record_keys
-- Benchmark only: the sensor's record of keys it added, AGE_SECONDS ago spread evenly over SPREAD_SECONDS.
INSERT INTO dagster_partition_key (partition_key, added_at)
SELECT k, now() - make_interval(secs => %(age_seconds)s + %(spread_seconds)s * (o - 1) / greatest(1, c.n))
FROM unnest(%(partition_keys)s::text[]) WITH ORDINALITY AS u(k, o), (SELECT cardinality(%(partition_keys)s::text[]) AS n) c
ON CONFLICT (partition_key) DO UPDATE SET added_at = EXCLUDED.added_at;

-- name: bench_corpus_keys
-- Benchmark only: the partition keys of seeded documents FIRST..FIRST+COUNT-1.
SELECT 'corpus-' || i AS document_id, %(tenant)s || '/corpus-' || i || '/v1' AS partition_key
FROM generate_series(%(first)s, %(first)s + %(count)s - 1) AS i ORDER BY i;

-- name: bench_corpus_seed_chunks
-- Benchmark only: one chunk with a random vector per seeded version of documents FIRST..FIRST+COUNT-1, under
-- the active profile, so the product's HNSW graph has the size of the indexed corpus (bench/scale/corpus.py
-- seed_chunks says what random vectors do and do not stand for).
INSERT INTO chunk (chunk_id, tenant_id, document_id, version_number, profile, ordinal, text, token_count,
                   content_digest, embed_digest, embedding)
SELECT md5(t.document_id || '/0'), t.tenant_id, t.document_id, 1, t.profile, 0,
       'synthetic chunk of ' || t.document_id, 12, md5(t.document_id || '/0'),
       encode(sha256(convert_to(t.document_id || '/0', 'UTF8')), 'hex'),
       ARRAY(SELECT random() - 0.5 + 0 * t.task_id FROM generate_series(1, 384))::vector
FROM generate_series(%(first)s, %(first)s + %(count)s - 1) AS i
JOIN index_task t ON t.tenant_id = %(tenant)s AND t.document_id = 'corpus-' || i AND t.version_number = 1
                 AND t.task_type = 'INDEX';

-- name: bench_corpus_analyze
-- Benchmark only: fresh statistics after the bulk load.
ANALYZE;

-- name: bench_corpus_set_active_model
-- Benchmark only: the active profile embeds with this model (a fake one: the Dagster side is measured).
UPDATE index_profile SET model = %(model)s WHERE is_active;

-- name: bench_corpus_retried
-- Benchmark only: tasks that needed more than one attempt, by type (lease expiries under load).
SELECT task_type, count(*) AS tasks FROM index_task WHERE attempts > 1 GROUP BY task_type;

-- name: bench_corpus_recorded_keys
-- Benchmark only: how many partition keys kbindex remembers having added (dagster_partition_key).
SELECT count(*) AS keys FROM dagster_partition_key;

-- name: bench_migration_finished_tasks
-- Benchmark only: the SUCCEEDED tasks of one phase (profile, task type, document id prefix; finished by
-- ``until``) in the order they finished: when (epoch seconds), the run that published their last attempt
-- (the lease owner of its publish progress event) and the seconds from that run's publish announcement to
-- the task's finish (a run publishes its versions in batches: its longest is its publish step).
SELECT extract(epoch FROM t.finished_at)::float8 AS finished, p.owner,
       extract(epoch FROM t.finished_at - p.at)::float8 AS publish_seconds
FROM index_task t
LEFT JOIN LATERAL (SELECT min(e.created_at) AS at, min(e.lease_owner) AS owner FROM task_event e
                   WHERE e.task_id = t.task_id AND e.kind = 'progress' AND e.stage = 'publish'
                     AND e.attempt = t.attempts) p ON true
WHERE t.profile = %(profile)s AND t.task_type = %(task_type)s AND t.status = 'SUCCEEDED'
  AND t.document_id ^@ %(prefix)s AND t.finished_at <= to_timestamp(%(until)s)
ORDER BY t.finished_at, t.task_id;

-- name: bench_migration_profile_unfinished
-- Benchmark only: whether any task of the profile is not yet SUCCEEDED (the REINDEX window ends early
-- once a migration is done).
SELECT EXISTS (SELECT 1 FROM index_task WHERE profile = %(profile)s AND status <> 'SUCCEEDED') AS unfinished;

-- name: bench_migration_all_succeeded
-- Benchmark only: whether every task has SUCCEEDED (the plain phase is done).
SELECT NOT EXISTS (SELECT 1 FROM index_task WHERE status <> 'SUCCEEDED') AS done;

-- name: bench_migration_last_finished
-- Benchmark only: when (epoch seconds) the last task of the documents whose id starts with %(prefix)s finished.
SELECT extract(epoch FROM max(finished_at))::float8 AS last FROM index_task WHERE document_id ^@ %(prefix)s;

-- name: bench_migration_window_done
-- Benchmark only: the REINDEX tasks of a profile that SUCCEEDED by %(until)s (epoch seconds), and when the last
-- of them finished.
SELECT count(*) AS done, extract(epoch FROM max(finished_at))::float8 AS last
FROM index_task
WHERE profile = %(profile)s AND task_type = 'REINDEX' AND status = 'SUCCEEDED'
  AND finished_at <= to_timestamp(%(until)s);

-- name: bench_migration_nth_finished
-- Benchmark only: when (epoch seconds) the profile's REINDEX task number %(n)s (1-based, in finishing order)
-- finished; no row when fewer have.
SELECT extract(epoch FROM finished_at)::float8 AS finished
FROM index_task
WHERE profile = %(profile)s AND task_type = 'REINDEX' AND status = 'SUCCEEDED'
ORDER BY finished_at
OFFSET %(n)s - 1 LIMIT 1;

-- name: bench_history_tasks_of_keys
-- Benchmark only: the INDEX task of each seeded version with these keys.
SELECT v.partition_key, t.task_id
FROM document_version v
JOIN index_task t
  ON t.tenant_id = v.tenant_id AND t.document_id = v.document_id AND t.version_number = v.version_number
WHERE v.partition_key = ANY(%(partition_keys)s::text[]) AND t.task_type = 'INDEX';

-- name: bench_history_seed_run_owners
-- Benchmark only: the adoption event a run leaves in each task it indexed (lease owner run-<run id>).
INSERT INTO task_event (task_id, kind, attempt, from_status, to_status, lease_owner)
SELECT x.task_id, 'run', 1, 'RUNNING', 'RUNNING', 'run-' || x.run_id
FROM unnest(%(task_ids)s::bigint[], %(run_ids)s::text[]) AS x(task_id, run_id);

-- name: bench_history_dagster_events
-- Benchmark only (Dagster's storage): the event log rows and run records of these runs.
SELECT (SELECT count(*) FROM event_logs WHERE run_id = ANY(%(run_ids)s::text[])) AS events,
       (SELECT count(*) FROM runs WHERE run_id = ANY(%(run_ids)s::text[])) AS runs;

-- name: bench_history_copy_events
-- Benchmark only (Dagster's storage): the events of copied runs other than materializations (step and run
-- events, planned materializations, log lines), in the columns Dagster's store_event fills; it takes ~10 ms
-- an event, and its batch writer takes materializations only.
INSERT INTO event_logs (run_id, event, dagster_event_type, timestamp, step_key, asset_key, partition)
SELECT x.run_id, x.event, x.event_type, to_timestamp(x.ts) AT TIME ZONE 'UTC', x.step_key, x.asset_key, x.partition
FROM unnest(%(run_ids)s::text[], %(events)s::text[], %(event_types)s::text[], %(timestamps)s::float8[],
            %(step_keys)s::text[], %(asset_keys)s::text[], %(partitions)s::text[])
     AS x(run_id, event, event_type, ts, step_key, asset_key, partition);

-- name: bench_migration_reflect_vectors
-- Benchmark only (the real-model round, between its phases): store the profile's vectors reflected through the
-- origin (v -> -v: the same distances among them, far from their originals). A REINDEX on the same model embeds
-- the same texts to the same vectors, and pgvector's HNSW insert adds a vector equal to a graph element's as one
-- more heap TID of that element, skipping the neighbour updates a new element needs: half the work of a plain
-- insert (measured, 3,000 paragraphs: 4.7 s against 10.1 s for the same 3,216 chunk rows). Reflected, the old
-- vectors sit apart as an old model's would. Run with the graph dropped, rebuilt afterwards.
UPDATE chunk SET embedding = embedding * array_fill(-1::real, ARRAY[vector_dims(embedding)])::vector
WHERE profile = %(profile)s;

-- name: bench_migration_equal_vectors
-- Benchmark only: the profile's chunks whose vector equals the same version's same chunk in another profile (the
-- HNSW insert's duplicate path; 0 when both phases inserted new graph elements).
SELECT count(*) AS equal
FROM chunk s
JOIN chunk o ON o.tenant_id = s.tenant_id AND o.document_id = s.document_id
            AND o.version_number = s.version_number AND o.ordinal = s.ordinal AND o.profile <> s.profile
WHERE s.profile = %(profile)s AND o.embedding = s.embedding;
