-- Planning the Dagster runs of index tasks (pipelines/sensors.py). Crashed and hung runs: lease.sql.

-- name: run_plan_inputs
-- What the claiming sensor needs to batch the tasks given, in the order given: partition key, byte
-- size (runs are balanced by bytes) and the crash-bisection cap on the task's run size (NULL: none).
SELECT t.task_id, v.partition_key, v.byte_size, t.run_size_cap
FROM unnest(%(task_ids)s::bigint[]) WITH ORDINALITY AS ids(task_id, ord)
JOIN index_task t ON t.task_id = ids.task_id
JOIN document_version v
  ON v.tenant_id = t.tenant_id AND v.document_id = t.document_id AND v.version_number = t.version_number
ORDER BY ids.ord;
