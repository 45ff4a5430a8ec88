-- Migrations at enterprise size (issue #14). An operator asks for a profile's backfill once (the
-- backfill_profile job in the Dagster UI, or `kbindex profile backfill`); from then on the claiming
-- sensor fills the run capacity that live indexing leaves free with that profile's never-attempted
-- REINDEX tasks, in ordinary bounded runs under the per-tenant run slots. No backfill record lists
-- every partition, no run covers 100k versions, and live work always goes first.
ALTER TABLE index_profile ADD COLUMN backfill_requested_at timestamptz;
CREATE INDEX index_task_reindex_backlog_idx ON index_task (profile, task_id)
    WHERE task_type = 'REINDEX' AND status = 'PENDING' AND attempts = 0;

-- Dagster partition keys kbindex has added, and when (last) added. The live key set is bounded by
-- churn: prune_partition_keys deletes the keys of versions with nothing in flight once they are
-- older than the lineage window; their history stays in task_event (with the Dagster run ids).
CREATE TABLE dagster_partition_key (
    partition_key text PRIMARY KEY,
    added_at      timestamptz NOT NULL DEFAULT now()
);
CREATE INDEX dagster_partition_key_added_idx ON dagster_partition_key (added_at);
