-- kbindex schema, first version. Each migration runs in one transaction (see resources/migrations.py).

CREATE EXTENSION IF NOT EXISTS vector;

-- A named recipe: model, dimension, chunker parameters. Exactly one is active for search.
CREATE TABLE index_profile (
    name            text PRIMARY KEY CHECK (name ~ '^[a-z0-9][a-z0-9_.-]{0,62}$'),
    model           text NOT NULL,
    dimension       integer NOT NULL CHECK (dimension = 384),  -- chunk.embedding is vector(384)
    chunk_tokens    integer NOT NULL CHECK (chunk_tokens BETWEEN 16 AND 512),
    chunk_overlap   integer NOT NULL CHECK (chunk_overlap >= 0 AND chunk_overlap < chunk_tokens),
    is_active       boolean NOT NULL DEFAULT false,
    building        boolean NOT NULL DEFAULT false,   -- a shadow profile being built: publishes index under it too
    activated_at    timestamptz,
    previous_active text REFERENCES index_profile (name),
    created_at      timestamptz NOT NULL DEFAULT now()
);
-- At most one active profile, enforced by the database.
CREATE UNIQUE INDEX index_profile_one_active ON index_profile ((true)) WHERE is_active;

INSERT INTO index_profile (name, model, dimension, chunk_tokens, chunk_overlap, is_active, activated_at)
VALUES ('minilm-v1', 'all-MiniLM-L6-v2', 384, 200, 32, true, now());

CREATE TABLE document (
    tenant_id      text NOT NULL CHECK (length(tenant_id) BETWEEN 1 AND 200),
    document_id    text NOT NULL CHECK (length(document_id) BETWEEN 1 AND 1000),
    latest_version integer NOT NULL DEFAULT 0,
    created_at     timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (tenant_id, document_id)
);

-- Immutable: bytes live in the blob store under content_hash.
CREATE TABLE document_version (
    tenant_id      text NOT NULL,
    document_id    text NOT NULL,
    version_number integer NOT NULL CHECK (version_number >= 1),
    content_hash   text NOT NULL,
    byte_size      bigint NOT NULL CHECK (byte_size >= 0),
    filename       text NOT NULL,
    media_type     text NOT NULL,
    partition_key  text NOT NULL UNIQUE,   -- the Dagster dynamic partition key of this version
    published_at   timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (tenant_id, document_id, version_number),
    FOREIGN KEY (tenant_id, document_id) REFERENCES document (tenant_id, document_id)
);
CREATE INDEX document_version_hash_idx ON document_version (tenant_id, document_id, content_hash);

CREATE TABLE index_task (
    task_id         bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    tenant_id       text NOT NULL,
    document_id     text NOT NULL,
    version_number  integer NOT NULL,
    task_type       text NOT NULL DEFAULT 'INDEX' CHECK (task_type IN ('INDEX', 'REINDEX')),
    profile         text NOT NULL REFERENCES index_profile (name),
    status          text NOT NULL DEFAULT 'PENDING'
                    CHECK (status IN ('PENDING', 'RUNNING', 'RETRY_WAIT', 'SUCCEEDED', 'DEAD', 'CANCELLED')),
    attempts        integer NOT NULL DEFAULT 0 CHECK (attempts >= 0),
    max_attempts    integer NOT NULL DEFAULT 5 CHECK (max_attempts >= 1),
    lease_owner     text,
    lease_until     timestamptz,
    next_attempt_at timestamptz NOT NULL DEFAULT now(),
    stage           text CHECK (stage IN ('parse', 'chunk', 'embed', 'publish')),
    completed       integer NOT NULL DEFAULT 0,
    total           integer NOT NULL DEFAULT 0,
    error_code      text,
    error_message   text,
    chunk_count     integer,
    created_at      timestamptz NOT NULL DEFAULT now(),
    updated_at      timestamptz NOT NULL DEFAULT now(),
    started_at      timestamptz,
    finished_at     timestamptz,
    -- The business key: publishing the same version twice yields the same task.
    UNIQUE (tenant_id, document_id, version_number, task_type, profile),
    FOREIGN KEY (tenant_id, document_id, version_number)
        REFERENCES document_version (tenant_id, document_id, version_number),
    CHECK (status <> 'RUNNING' OR (lease_owner IS NOT NULL AND lease_until IS NOT NULL))
);
-- Claim paths: each is an index-ordered walk that stops after LIMIT rows, so a claim costs the
-- same with a million queued tasks as with a thousand (see task_claim and bench/queue).
CREATE INDEX index_task_due_idx ON index_task (next_attempt_at) WHERE status IN ('PENDING', 'RETRY_WAIT');
CREATE INDEX index_task_lease_idx ON index_task (lease_until) WHERE status = 'RUNNING';
CREATE INDEX index_task_tenant_status_idx ON index_task (tenant_id, status);
CREATE INDEX index_task_status_idx ON index_task (status);

-- Append-only history of every transition (and throttled progress), fed to SSE listeners.
CREATE TABLE task_event (
    event_id    bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    task_id     bigint NOT NULL REFERENCES index_task (task_id),
    kind        text NOT NULL DEFAULT 'transition' CHECK (kind IN ('transition', 'progress')),
    attempt     integer NOT NULL,
    from_status text,
    to_status   text NOT NULL,
    stage       text,
    completed   integer,
    total       integer,
    lease_owner text,
    error_code  text,
    message     text,
    created_at  timestamptz NOT NULL DEFAULT clock_timestamp()
);
CREATE INDEX task_event_task_idx ON task_event (task_id, event_id);

CREATE FUNCTION task_event_refuse_change() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    RAISE EXCEPTION 'task_event is append-only';
END $$;
CREATE TRIGGER task_event_append_only BEFORE UPDATE OR DELETE ON task_event
    FOR EACH ROW EXECUTE FUNCTION task_event_refuse_change();

-- One wake-up per statement, not per row: listeners re-read the table (the source of truth).
CREATE FUNCTION task_event_notify() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    PERFORM pg_notify('kbindex_task_event', (SELECT coalesce(max(event_id), 0)::text FROM new_events));
    RETURN NULL;
END $$;
CREATE TRIGGER task_event_notify AFTER INSERT ON task_event
    REFERENCING NEW TABLE AS new_events
    FOR EACH STATEMENT EXECUTE FUNCTION task_event_notify();

-- Chunks of one version under one profile. chunk_id is deterministic (invariant 5).
CREATE TABLE chunk (
    chunk_id       text PRIMARY KEY,
    tenant_id      text NOT NULL,
    document_id    text NOT NULL,
    version_number integer NOT NULL,
    profile        text NOT NULL REFERENCES index_profile (name),
    ordinal        integer NOT NULL,
    heading_path   text[] NOT NULL DEFAULT '{}',
    page           integer,
    text           text NOT NULL,
    token_count    integer NOT NULL,
    content_digest text NOT NULL,
    embedding      vector(384) NOT NULL,
    created_at     timestamptz NOT NULL DEFAULT now(),
    UNIQUE (tenant_id, document_id, profile, version_number, ordinal)
);
CREATE INDEX chunk_embedding_hnsw_idx ON chunk USING hnsw (embedding vector_cosine_ops);
CREATE INDEX chunk_digest_idx ON chunk (profile, tenant_id, content_digest);

-- Which version search reads, per document and profile (invariant 4).
CREATE TABLE search_pointer (
    tenant_id      text NOT NULL,
    document_id    text NOT NULL,
    profile        text NOT NULL REFERENCES index_profile (name),
    version_number integer NOT NULL,
    task_id        bigint NOT NULL REFERENCES index_task (task_id),
    chunk_count    integer NOT NULL,
    updated_at     timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (tenant_id, document_id, profile)
);
