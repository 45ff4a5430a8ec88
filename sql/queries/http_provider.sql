-- Statements of resources/http_embedder.py and the HTTP-provider part of resources/profiles.py.

-- name: index_profile_provider_set
-- Give a just-inserted profile its HTTP provider (same transaction as index_profile_insert).
UPDATE index_profile
SET provider_url = %(provider_url)s, provider_model = %(provider_model)s, api_key_env = %(api_key_env)s,
    requests_per_minute = %(requests_per_minute)s, tokens_per_minute = %(tokens_per_minute)s,
    max_batch = %(max_batch)s
WHERE name = %(name)s
RETURNING provider_url, provider_model, api_key_env, requests_per_minute, tokens_per_minute, max_batch;

-- name: index_profile_provider_by_model
-- The provider recipe behind an 'http:' model (the newest profile naming it), for embedder_for_model.
SELECT name, model, dimension, provider_url, provider_model, api_key_env, requests_per_minute,
       tokens_per_minute, max_batch
FROM index_profile
WHERE model = %(model)s AND provider_url IS NOT NULL
ORDER BY created_at DESC, name
LIMIT 1;
