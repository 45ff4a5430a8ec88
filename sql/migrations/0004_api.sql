-- HTTP API (pipelines/api): bearer tokens kept in the database, and an index for failure metrics.

-- A bearer token of the HTTP API, stored only as its SHA-256 (hex): the token itself is never kept.
-- Create one with:
--   INSERT INTO api_token (token_sha256, tenant_id, label)
--   VALUES (encode(sha256(convert_to('<token>', 'UTF8')), 'hex'), 'acme', 'ci uploader');
-- Revoke it with UPDATE api_token SET revoked_at = now() WHERE label = 'ci uploader'.
CREATE TABLE api_token (
    token_sha256 text PRIMARY KEY CHECK (token_sha256 ~ '^[0-9a-f]{64}$'),
    tenant_id    text NOT NULL CHECK (length(tenant_id) BETWEEN 1 AND 200),
    label        text NOT NULL DEFAULT '',
    created_at   timestamptz NOT NULL DEFAULT now(),
    revoked_at   timestamptz
);

-- /metrics counts failures by code at every scrape: read them from a small partial index.
CREATE INDEX task_event_failure_idx ON task_event (error_code)
    WHERE error_code IS NOT NULL AND to_status IN ('RETRY_WAIT', 'DEAD');
