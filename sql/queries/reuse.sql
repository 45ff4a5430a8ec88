-- Statements of resources/embedding_reuse.py: reuse stored vectors for chunks whose embedded text did not change.

-- name: chunk_reuse_lookup
-- One stored vector per embed digest (the newest row) of this tenant under this profile, and only while
-- the profile still names the model and dimension the task embeds with (invariant 6); walks chunk_embed_digest_idx.
SELECT DISTINCT ON (c.embed_digest) c.embed_digest, c.embedding
FROM chunk c
JOIN index_profile ip ON ip.name = c.profile
WHERE c.profile = %(profile)s
  AND c.tenant_id = %(tenant_id)s
  AND c.embed_digest = ANY (%(digests)s::text[])
  AND ip.model = %(model)s
  AND ip.dimension = %(dimension)s
ORDER BY c.embed_digest, c.created_at DESC, c.chunk_id;
