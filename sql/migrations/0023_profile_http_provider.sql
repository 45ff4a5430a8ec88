-- HTTP embedding providers (issue 15): a profile can embed through an OpenAI-compatible /v1/embeddings
-- endpoint (resources/http_embedder.py). The key itself is never stored: api_key_env names the environment
-- variable that holds it. Limits are the provider account's; NULL means "not limited by us" (the provider's
-- 429s and Retry-After still apply). Such a profile's model is 'http:<provider_model>@<host>', so stored
-- vectors (looked up by profile and model) never mix providers.
ALTER TABLE index_profile
    ADD COLUMN provider_url        text,
    ADD COLUMN provider_model      text,
    ADD COLUMN api_key_env         text,
    ADD COLUMN requests_per_minute integer CHECK (requests_per_minute > 0),
    ADD COLUMN tokens_per_minute   integer CHECK (tokens_per_minute > 0),
    ADD COLUMN max_batch           integer CHECK (max_batch BETWEEN 1 AND 2048),
    ADD CONSTRAINT index_profile_provider_complete CHECK (
        (provider_url IS NULL AND provider_model IS NULL AND api_key_env IS NULL
         AND requests_per_minute IS NULL AND tokens_per_minute IS NULL AND max_batch IS NULL)
        OR (provider_url ~ '^https?://[^\s]+$' AND length(provider_model) BETWEEN 1 AND 200
            AND model = 'http:' || provider_model || '@' || substring(provider_url from '^https?://([^/?#]+)'))
    ),
    ADD CONSTRAINT index_profile_api_key_env_name CHECK (api_key_env ~ '^[A-Za-z_][A-Za-z0-9_]{0,127}$');
