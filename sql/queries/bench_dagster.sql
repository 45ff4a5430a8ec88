-- Statements used only by benchmarks (bench/), never by the product, that read Dagster's own storage (its runs,
-- run_tags, job_ticks, event_logs and dynamic_partitions tables, in the Dagster database, not kbindex's). Their
-- columns are Dagster's, not kbindex's: a Dagster upgrade that reshapes them breaks these first.

-- name: bench_dagster_live_runs
-- Benchmark only (Dagster's storage; bench/chaos live_runs): the unfinished runs, oldest first, with the warm
-- launcher's pid and start-time tags of their run process, for a round that timed out.
SELECT r.run_id, r.status, r.create_timestamp, r.update_timestamp, p.value, s.value
FROM runs r
LEFT JOIN run_tags p ON p.run_id = r.run_id AND p.key = %(pid_tag)s
LEFT JOIN run_tags s ON s.run_id = r.run_id AND s.key = %(start_tag)s
WHERE r.status NOT IN ('SUCCESS', 'FAILURE', 'CANCELED')
ORDER BY r.create_timestamp;

-- name: bench_dagster_started_pids
-- Benchmark only (Dagster's storage; bench/chaos): the engine events logged after event %(after)s, each with the
-- pid of its "Started process for run (pid: N)." message (NULL for other engine events), in id order.
SELECT id, run_id, substring(event from 'Started process for run \(pid: ([0-9]+)\)')
FROM event_logs
WHERE id > %(after)s AND dagster_event_type = 'ENGINE_EVENT'
ORDER BY id;

-- name: bench_dagster_run_is_backfill
-- Benchmark only (Dagster's storage; bench/chaos): a row when the backfill daemon launched the run (a UI backfill).
SELECT 1 FROM run_tags WHERE run_id = %(run_id)s AND key = 'dagster/backfill';

-- name: bench_dagster_ticks_like
-- Benchmark only (Dagster's storage; bench/chaos): the sensor ticks whose body matches a LIKE pattern (a sensor's
-- name, a source's name in its log lines), with their status; each body carries the tick's start time.
SELECT status, tick_body FROM job_ticks WHERE tick_body LIKE %(pattern)s;

-- name: bench_dagster_run_rejections
-- Benchmark only (Dagster's storage; bench/chaos report): the fencing rejections the runs logged, by code.
SELECT substring(event from '(LEASE_LOST|TASK_CANCELLED) during'), count(*)
FROM event_logs
WHERE dagster_event_type IS NULL AND event ~ '(LEASE_LOST|TASK_CANCELLED) during'
GROUP BY 1;

-- name: bench_dagster_log_lines_like
-- Benchmark only (Dagster's storage; bench/chaos report): the runs' own log lines (no Dagster event type) that
-- match a LIKE pattern (the shared-window embedding fallbacks).
SELECT event FROM event_logs WHERE dagster_event_type IS NULL AND event LIKE %(pattern)s;

-- name: bench_dagster_runs_by_job_and_status
-- Benchmark only (Dagster's storage; bench/chaos report): how many runs of each job ended in each status.
SELECT pipeline_name, status, count(*) FROM runs GROUP BY 1, 2 ORDER BY 1, 2;

-- name: bench_dagster_known_partitions
-- Benchmark only (Dagster's storage; bench/chaos/migration.py): which of these keys a dynamic partitions
-- definition already has.
SELECT partition FROM dynamic_partitions WHERE partitions_def_name = %(definition)s AND partition = ANY(%(keys)s);

-- name: bench_dagster_runs_in_status
-- Benchmark only (Dagster's storage; bench/chaos/network.py): the runs in one of these statuses.
SELECT run_id FROM runs WHERE status = ANY(%(statuses)s);

-- name: bench_dagster_runs_of_in_status
-- Benchmark only (Dagster's storage; bench/chaos/network.py): which of these runs are in one of these statuses.
SELECT run_id FROM runs WHERE run_id = ANY(%(run_ids)s) AND status = ANY(%(statuses)s);

-- name: bench_dagster_count_runs_of_in_status
-- Benchmark only (Dagster's storage; bench/chaos/network.py): how many of these runs are in one of these statuses.
SELECT count(*) FROM runs WHERE run_id = ANY(%(run_ids)s) AND status = ANY(%(statuses)s);

-- name: bench_dagster_job_runs_by_status
-- Benchmark only (Dagster's storage; bench/handover): one job's runs, counted by status.
SELECT status, count(*) FROM runs WHERE pipeline_name = %(job)s GROUP BY 1;

-- name: bench_dagster_job_runs_live
-- Benchmark only (Dagster's storage; bench/handover): how many of one job's runs are queued, starting or started.
SELECT count(*)
FROM runs
WHERE pipeline_name = %(job)s AND status IN ('QUEUED', 'NOT_STARTED', 'STARTING', 'STARTED', 'CANCELING');

-- name: bench_dagster_count_runs_in_status
-- Benchmark only (Dagster's storage; bench/delete): how many runs are in one of these statuses (still in progress).
SELECT count(*) FROM runs WHERE status = ANY(%(statuses)s);

-- name: bench_dagster_version_materialization
-- Benchmark only (Dagster's storage; bench/delete): the newest materialization of one version's partition of the
-- assets whose key matches a LIKE pattern (what a run recorded for it).
SELECT event
FROM event_logs
WHERE dagster_event_type = 'ASSET_MATERIALIZATION' AND partition = %(partition)s AND asset_key LIKE %(asset_key)s
ORDER BY id DESC
LIMIT 1;

-- name: bench_dagster_run_event_types
-- Benchmark only (Dagster's storage; bench/per_version.py): one run's events by type (NULL: log lines).
SELECT dagster_event_type, count(*) FROM event_logs WHERE run_id = %(run_id)s GROUP BY 1;

-- name: bench_dagster_run_event_bytes
-- Benchmark only (Dagster's storage; bench/per_version.py): the bytes of one run's serialized events.
SELECT coalesce(sum(length(event)), 0) FROM event_logs WHERE run_id = %(run_id)s;

-- name: bench_dagster_run_asset_event_tags
-- Benchmark only (Dagster's storage; bench/per_version.py): the asset event tag rows one run's events wrote.
SELECT count(*) FROM asset_event_tags t JOIN event_logs e ON e.id = t.event_id WHERE e.run_id = %(run_id)s;

-- name: bench_dagster_runs_in_order
-- Benchmark only (Dagster's storage; bench/pipeline): every run with its status and times, oldest first.
SELECT run_id, status, start_time, end_time FROM runs ORDER BY id;

-- name: bench_dagster_runs_by_sensor
-- Benchmark only (Dagster's storage; bench/pipeline): how many of these runs each sensor requested.
SELECT value, count(*)
FROM run_tags
WHERE key = 'dagster/sensor_name' AND run_id = ANY(%(run_ids)s)
GROUP BY value
ORDER BY value;

-- name: bench_dagster_step_events
-- Benchmark only (Dagster's storage; bench/pipeline): the step start and end events of these runs, in order.
SELECT run_id, step_key, dagster_event_type, timestamp
FROM event_logs
WHERE run_id = ANY(%(run_ids)s) AND dagster_event_type IN ('STEP_START', 'STEP_SUCCESS', 'STEP_FAILURE')
ORDER BY id;

-- name: bench_dagster_materializations_of_runs
-- Benchmark only (Dagster's storage; bench/pipeline): these runs' materializations of the assets whose key matches
-- a LIKE pattern (the chunk_embeddings counts in their metadata).
SELECT event
FROM event_logs
WHERE run_id = ANY(%(run_ids)s) AND dagster_event_type = 'ASSET_MATERIALIZATION' AND asset_key LIKE %(asset_key)s;

-- name: bench_dagster_tags_named
-- Benchmark only (Dagster's storage; bench/pipeline): every run's tags named %(key)s or matching %(key_like)s (the
-- lease tags, split over several keys when long).
SELECT run_id, key, value FROM run_tags WHERE key = %(key)s OR key LIKE %(key_like)s;

-- name: bench_dagster_count_job_runs_in_status
-- Benchmark only (Dagster's storage; bench/scale/runs_daemon.py): how many of one job's runs are in one of these
-- statuses.
SELECT count(*) FROM runs WHERE pipeline_name = %(job)s AND status = ANY(%(statuses)s);

-- name: bench_dagster_runs_since
-- Benchmark only (Dagster's storage; bench/scale/runs_daemon.py): the runs created after row %(after)s, with the
-- creation time in epoch seconds (create_timestamp: CURRENT_TIMESTAMP into a timestamp without time zone, so in
-- the session's zone) and their start and end times.
SELECT id, run_id, pipeline_name, status,
       extract(epoch FROM create_timestamp AT TIME ZONE current_setting('TimeZone'))::float8, start_time, end_time
FROM runs
WHERE id > %(after)s
ORDER BY id;

-- name: bench_dagster_tags_of_runs
-- Benchmark only (Dagster's storage; bench/scale/runs_daemon.py): every tag of these runs.
SELECT run_id, key, value FROM run_tags WHERE run_id = ANY(%(run_ids)s);

-- name: bench_dagster_run_queue_events
-- Benchmark only (Dagster's storage; bench/scale/runs_daemon.py): when each of these runs was enqueued and began
-- starting (event_logs.timestamp: naive UTC, as Dagster writes it), in epoch seconds.
SELECT run_id, dagster_event_type, min(extract(epoch FROM timestamp))::float8
FROM event_logs
WHERE run_id = ANY(%(run_ids)s) AND dagster_event_type IN ('PIPELINE_ENQUEUED', 'PIPELINE_STARTING')
GROUP BY 1, 2;
