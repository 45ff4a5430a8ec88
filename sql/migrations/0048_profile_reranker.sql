-- An HTTP reranker per profile (issue 35): search sends the top rerank_candidates chunks it found (after fusion
-- and after every permission and metadata filter) to POST {rerank_url}/rerank and returns them in the
-- provider's order; on any provider failure it returns the unreranked order and says so. All NULL: no
-- reranking. Query-time only (`kbindex profile rerank`): no chunk, vector or lexical row depends on it.
-- rerank_key_env is the NAME of the environment variable holding the key, never the key.
ALTER TABLE index_profile
    ADD COLUMN rerank_url        text,
    ADD COLUMN rerank_model      text,
    ADD COLUMN rerank_key_env    text,
    ADD COLUMN rerank_candidates integer CHECK (rerank_candidates BETWEEN 1 AND 200),
    ADD CONSTRAINT index_profile_rerank_whole CHECK (
        (rerank_url IS NULL AND rerank_model IS NULL AND rerank_key_env IS NULL AND rerank_candidates IS NULL)
        OR (rerank_url IS NOT NULL AND rerank_model IS NOT NULL AND rerank_candidates IS NOT NULL));

-- The reranker a gate result scored the shadow profile with (NULL: none, as every gate before this migration):
-- activation requires the latest gate to have scored the profile's current reranker.
ALTER TABLE profile_gate
    ADD COLUMN rerank_url        text,
    ADD COLUMN rerank_model      text,
    ADD COLUMN rerank_candidates integer;

ALTER TABLE index_profile_event DROP CONSTRAINT index_profile_event_action_check;
ALTER TABLE index_profile_event
    ADD CONSTRAINT index_profile_event_action_check
    CHECK (action IN ('create', 'activate', 'rollback', 'fusion', 'rerank'));
