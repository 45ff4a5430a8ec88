-- name: database_exists
-- Whether a database of that name exists on the server.
SELECT 1 FROM pg_database WHERE datname = %(name)s;

-- name: migration_lock
-- Serialize migrators across processes (advisory lock held by this session).
SELECT pg_advisory_lock(7275180150);

-- name: migration_unlock
-- Release the migrators' advisory lock.
SELECT pg_advisory_unlock(7275180150);

-- name: migration_table_create
-- The record of applied migrations.
CREATE TABLE IF NOT EXISTS schema_migration (
    version    text PRIMARY KEY,
    applied_at timestamptz NOT NULL DEFAULT now()
);

-- name: migration_applied
-- Versions already applied.
SELECT version FROM schema_migration ORDER BY version;

-- name: migration_record
-- Mark one migration as applied (same transaction as the migration itself).
INSERT INTO schema_migration (version) VALUES (%(version)s);

-- name: lexical_backfill_exists
-- A row while migration 0022's lexical backfill is still to do (ask only once 0022 is applied).
SELECT 1 FROM lexical_backfill;

-- name: connection_test
-- A pooled Dagster storage connection that sat idle, tested before use (resources/dagster_storage.py ping_when_idle).
SELECT 1;

-- name: transaction_begin
-- Opens a pipelined transaction (resources/database.py): psycopg's own transaction block waits for the server
-- around itself in pipeline mode, these wait for nothing.
BEGIN;

-- name: transaction_commit
-- Ends a pipelined transaction; the pipeline's last sync waits for it.
COMMIT;
