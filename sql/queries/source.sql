-- Sources (migration 0030): a named fsspec location synced into a tenant's documents, and its file ledger.

-- name: source_tenant_lock
-- Serialize `source add` per tenant for the rest of the transaction, so two adds cannot both pass the overlap
-- check (each reads the tenant's sources, then inserts).
SELECT pg_advisory_xact_lock(hashtextextended('kbindex.source-tenant:' || %(tenant_id)s, 0));

-- name: source_list_tenant
-- The sources of one tenant: whose document ids a new source's must not meet (migration 0040).
SELECT name, url, glob, id_prefix
FROM source
WHERE tenant_id = %(tenant_id)s
ORDER BY name;

-- name: source_insert
-- Register a source; an existing name returns nothing (the caller says it exists rather than changing it).
INSERT INTO source (name, tenant_id, url, glob, max_delete_share, id_prefix)
VALUES (%(name)s, %(tenant_id)s, %(url)s, %(glob)s, %(max_delete_share)s, %(id_prefix)s)
ON CONFLICT (name) DO NOTHING
RETURNING name, tenant_id, url, glob, id_prefix, max_delete_share, created_at, passes, last_pass_at, last_pass;

-- name: source_get
-- One source by name, with its ledger size and how many of its files fail (by code).
SELECT name, tenant_id, url, glob, id_prefix, max_delete_share, created_at, passes, last_pass_at, last_pass,
       (SELECT count(*) FROM source_file f WHERE f.source_name = s.name) AS files,
       (SELECT count(*) FROM source_file f WHERE f.source_name = s.name AND f.error_code IS NOT NULL) AS failing,
       (SELECT coalesce(jsonb_object_agg(c.error_code, c.n), '{}'::jsonb)
        FROM (SELECT f.error_code, count(*) AS n FROM source_file f
              WHERE f.source_name = s.name AND f.error_code IS NOT NULL GROUP BY f.error_code) c) AS failing_codes
FROM source s
WHERE name = %(name)s;

-- name: source_list
-- Every source with the size of its ledger and how many of its files fail (by code), by name.
SELECT name, tenant_id, url, glob, id_prefix, max_delete_share, created_at, passes, last_pass_at, last_pass,
       (SELECT count(*) FROM source_file f WHERE f.source_name = s.name) AS files,
       (SELECT count(*) FROM source_file f WHERE f.source_name = s.name AND f.error_code IS NOT NULL) AS failing,
       (SELECT coalesce(jsonb_object_agg(c.error_code, c.n), '{}'::jsonb)
        FROM (SELECT f.error_code, count(*) AS n FROM source_file f
              WHERE f.source_name = s.name AND f.error_code IS NOT NULL GROUP BY f.error_code) c) AS failing_codes
FROM source s
ORDER BY name;

-- name: source_delete
-- Forget a source and its ledger (its documents stay: removing a source is not a delete of what it published).
DELETE FROM source WHERE name = %(name)s;

-- name: source_pass_lock
-- One pass per source at a time, across processes (CLI and sensor): a session advisory lock, released by
-- source_pass_unlock or when the connection ends (a crashed pass frees it).
SELECT pg_try_advisory_lock(hashtextextended('kbindex.source:' || %(name)s, 0)) AS locked;

-- name: source_pass_lock_alive
-- Asked on the connection holding the pass lock, about once a second during a pass: an answer means the
-- session, and so its lock, is still there; an error means the connection ended and the lock went with it.
SELECT true AS alive;

-- name: source_pass_unlock
-- Release the pass lock taken by source_pass_lock on this connection.
SELECT pg_advisory_unlock(hashtextextended('kbindex.source:' || %(name)s, 0)) AS unlocked;

-- name: source_pass_start
-- Number a new pass of the source (ledger rows written by it carry the number).
UPDATE source SET passes = passes + 1
WHERE name = %(name)s
RETURNING passes;

-- name: source_pass_finish
-- Record the finished pass's report (counts, and why deletes were held back if they were).
UPDATE source SET last_pass_at = now(), last_pass = %(report)s::jsonb
WHERE name = %(name)s;

-- name: source_file_ledger
-- The whole ledger of a source: what each file last published (compared with a listing without reading bytes).
SELECT path, document_id, byte_size, stamp, content_hash, pass, error_code
FROM source_file
WHERE source_name = %(name)s;

-- name: source_file_upsert
-- Record a file: inside its publish's transaction (the row commits with the version or not at all), or alone
-- for a new stamp on unchanged bytes. Clears a failure recorded by an earlier attempt.
INSERT INTO source_file (source_name, path, document_id, byte_size, stamp, content_hash, pass)
VALUES (%(name)s, %(path)s, %(document_id)s, %(byte_size)s, %(stamp)s, %(content_hash)s, %(pass)s)
ON CONFLICT (source_name, path) DO UPDATE
SET document_id = EXCLUDED.document_id, byte_size = EXCLUDED.byte_size, stamp = EXCLUDED.stamp,
    content_hash = EXCLUDED.content_hash, pass = EXCLUDED.pass, error_code = NULL, failed_at = NULL;

-- name: source_file_fail
-- Record a file that failed to publish, at the size and stamp it failed at, with the stable code: a pass leaves
-- it alone until either moves. A file that published before keeps its document id and the hash it published
-- (its document still serves that version); a new one gets a row without a hash (migration 0041).
INSERT INTO source_file (source_name, path, document_id, byte_size, stamp, content_hash, pass, error_code, failed_at)
VALUES (%(name)s, %(path)s, %(document_id)s, %(byte_size)s, %(stamp)s, NULL, %(pass)s, %(error_code)s, now())
ON CONFLICT (source_name, path) DO UPDATE
SET byte_size = EXCLUDED.byte_size, stamp = EXCLUDED.stamp, pass = EXCLUDED.pass,
    error_code = EXCLUDED.error_code, failed_at = EXCLUDED.failed_at;

-- name: source_file_forget
-- Drop a vanished file's row after its document's delete committed (a crash before: the delete is repeated,
-- and a delete is idempotent).
DELETE FROM source_file WHERE source_name = %(name)s AND path = %(path)s;

-- name: source_file_owner
-- Another source of the same tenant whose ledger names this document (sources added before `source add`
-- refused overlapping ones): a pass neither publishes over it nor deletes it. A row without a hash published
-- nothing, so it names no document. Uses source_file_document_idx.
SELECT f.source_name, f.path
FROM source_file f
JOIN source s ON s.name = f.source_name
WHERE f.document_id = %(document_id)s AND s.tenant_id = %(tenant_id)s AND f.source_name <> %(name)s
  AND f.content_hash IS NOT NULL
LIMIT 1;
