-- Model migration (issue 7): quality-gate results, a history of profile switches, and an index for
-- per-profile progress. The switch itself needs no new column: index_profile already has is_active
-- (one at most, by index_profile_one_active), building, previous_active and activated_at.

-- One evaluation of a profile's recipe against the active profile's on a BEIR-layout eval set.
-- Activation requires the profile's latest row to have passed, against the profile active now.
CREATE TABLE profile_gate (
    gate_id          bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    profile          text NOT NULL REFERENCES index_profile (name),
    baseline_profile text NOT NULL REFERENCES index_profile (name),  -- the active profile it was compared with
    eval_set         text NOT NULL,                                  -- the eval folder's name
    eval_digest      text NOT NULL,                                  -- sha256 over corpus, queries and qrels
    documents        integer NOT NULL CHECK (documents > 0),
    queries          integer NOT NULL CHECK (queries > 0),
    k                integer NOT NULL DEFAULT 10 CHECK (k > 0),
    shadow_ndcg      double precision NOT NULL CHECK (shadow_ndcg BETWEEN 0 AND 1),
    shadow_recall    double precision NOT NULL CHECK (shadow_recall BETWEEN 0 AND 1),
    active_ndcg      double precision NOT NULL CHECK (active_ndcg BETWEEN 0 AND 1),
    active_recall    double precision NOT NULL CHECK (active_recall BETWEEN 0 AND 1),
    tolerance        double precision NOT NULL CHECK (tolerance BETWEEN 0 AND 1),
    passed           boolean NOT NULL,
    seconds          double precision NOT NULL DEFAULT 0,
    created_at       timestamptz NOT NULL DEFAULT now()
);
CREATE INDEX profile_gate_latest_idx ON profile_gate (profile, gate_id DESC);

-- Append-only history of profile creation, activation (forced or not) and rollback.
CREATE TABLE index_profile_event (
    event_id     bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    profile      text NOT NULL REFERENCES index_profile (name),
    action       text NOT NULL CHECK (action IN ('create', 'activate', 'rollback')),
    from_profile text REFERENCES index_profile (name),
    forced       boolean NOT NULL DEFAULT false,
    detail       jsonb NOT NULL DEFAULT '{}'::jsonb,
    created_at   timestamptz NOT NULL DEFAULT now()
);
CREATE INDEX index_profile_event_profile_idx ON index_profile_event (profile, event_id);

-- Migration progress and coverage read one profile's tasks: by status, and SUCCEEDED by finish time.
CREATE INDEX index_task_profile_status_idx ON index_task (profile, status, finished_at);
