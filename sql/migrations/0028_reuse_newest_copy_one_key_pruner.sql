-- Costs that grew with the corpus (issue 28).
--
-- Embedding reuse wants the newest stored copy of each embed digest. chunk_embed_digest_idx (profile,
-- tenant_id, embed_digest) had no created_at, so chunk_reuse_lookup fetched and sorted every stored copy
-- of a digest, vector included: with boilerplate stored 5,003 times one 21-digest lookup read 5,023 rows
-- and 1,284 buffers (3 copies: 23 rows, 28 buffers). This index serves the lookup's order, so one LIMIT 1
-- probe per digest reads one row: 21 rows and 89 buffers at 5,003 copies, 21 and 68 at 3
-- (tests/integration/test_reuse_plans.py). It starts with the old index's columns, which it replaces.
-- CREATE INDEX takes a SHARE lock: searches go on, publishes wait for the build.
CREATE INDEX chunk_embed_digest_newest_idx ON chunk (profile, tenant_id, embed_digest, created_at DESC, chunk_id)
    WHERE embed_digest IS NOT NULL;
DROP INDEX chunk_embed_digest_idx;

-- One mechanism prunes Dagster partition keys: the lineage job (prune_lineage_keys, over
-- dagster_partition_key). Retention no longer deletes keys, and its hourly scan of every version ever
-- published (document_version_releasable) is gone with partition_key_release, its bookkeeping.
-- Keys added before migration 0020 were never recorded in dagster_partition_key and only retention
-- deleted them: record those of versions published before 0020 whose deletion retention has not
-- confirmed, as added when the version was published, so the lineage job prunes them (deleting a key
-- Dagster no longer has is harmless). A database created at 0020 or later has none.
INSERT INTO dagster_partition_key (partition_key, added_at)
SELECT v.partition_key, v.published_at
FROM document_version v
WHERE v.published_at < (SELECT applied_at FROM schema_migration
                        WHERE version = '0020_profile_backfill_and_lineage_keys')
  AND NOT EXISTS (SELECT 1 FROM partition_key_release r WHERE r.partition_key = v.partition_key)
ON CONFLICT (partition_key) DO NOTHING;

DROP TABLE partition_key_release;
