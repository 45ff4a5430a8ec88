-- name: index_profile_get
-- One profile's recipe (model, dimension, chunker parameters, OCR, search fusion, lexical analyzer, context in chunks).
SELECT name, model, dimension, chunk_tokens, chunk_overlap, is_active, building, activated_at, created_at,
       ocr, search_mode, lexical_weight, bm25_k1, bm25_b, fusion, rrf_k, lexical_analyzer,
       embed_context, rerank_url, rerank_model, rerank_key_env, rerank_candidates
FROM index_profile
WHERE name = %(name)s;

-- name: index_profile_of_tasks
-- The profiles of these tasks, as index_profile_get gives them: the fenced publish sends it with its lock of the
-- task rows, so checking each version against its profile costs no wait of its own.
SELECT name, model, dimension, chunk_tokens, chunk_overlap, is_active, building, activated_at, created_at,
       ocr, search_mode, lexical_weight, bm25_k1, bm25_b, fusion, rrf_k, lexical_analyzer,
       embed_context, rerank_url, rerank_model, rerank_key_env, rerank_candidates
FROM index_profile
WHERE name IN (SELECT profile FROM index_task WHERE task_id = ANY(%(task_ids)s::bigint[]));

-- name: index_profile_active
-- The profile search reads.
SELECT name, model, dimension, chunk_tokens, chunk_overlap, is_active, building, activated_at, created_at,
       search_mode, lexical_weight, bm25_k1, bm25_b, fusion, rrf_k, lexical_analyzer,
       embed_context, rerank_url, rerank_model, rerank_key_env, rerank_candidates
FROM index_profile
WHERE is_active;

-- name: index_profile_building
-- Shadow profiles being built beside the active one.
SELECT name, model, dimension, chunk_tokens, chunk_overlap, is_active, building, activated_at, created_at,
       search_mode, lexical_weight, bm25_k1, bm25_b, fusion, rrf_k, lexical_analyzer,
       embed_context, rerank_url, rerank_model, rerank_key_env, rerank_candidates
FROM index_profile
WHERE building
ORDER BY created_at;
