-- Hybrid fusion per profile (issue 35): the weighted score sum of migration 0022 or reciprocal rank fusion,
-- with RRF's rank constant. Query-time only: no chunk, vector or lexical row depends on it, so changing it
-- re-indexes nothing (`kbindex profile fusion`); the quality gate scores each profile's own choice.
ALTER TABLE index_profile
    ADD COLUMN fusion text NOT NULL DEFAULT 'weighted' CHECK (fusion IN ('weighted', 'rrf')),
    ADD COLUMN rrf_k  integer NOT NULL DEFAULT 60 CHECK (rrf_k BETWEEN 1 AND 100000);

-- The fusion a gate result scored the shadow profile with: activation requires the latest gate to have
-- scored the profile's current fusion (a change after the gate makes it stale). Rows from before this
-- migration are NULL: they scored the weighted sum, and count as stale once the profile's fusion is rrf.
ALTER TABLE profile_gate
    ADD COLUMN fusion         text CHECK (fusion IN ('weighted', 'rrf')),
    ADD COLUMN rrf_k          integer,
    ADD COLUMN lexical_weight double precision;

-- A fusion change is part of a profile's history, like its creation and activation.
ALTER TABLE index_profile_event DROP CONSTRAINT index_profile_event_action_check;
ALTER TABLE index_profile_event
    ADD CONSTRAINT index_profile_event_action_check CHECK (action IN ('create', 'activate', 'rollback', 'fusion'));
