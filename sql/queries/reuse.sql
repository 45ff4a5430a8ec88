-- Statements of resources/embedding_reuse.py: reuse stored vectors for chunks whose embedded text did not change.

-- name: chunk_reuse_lookup
-- One stored vector per embed digest (the newest row) of this tenant under this profile, and only while
-- the profile still names the model and dimension the task embeds with (invariant 6). One probe of
-- chunk_embed_digest_newest_idx per distinct digest, LIMIT 1 in the index's own order (migration 0028):
-- shared boilerplate stored in thousands of versions costs one row, not one per stored copy.
SELECT d.embed_digest, newest.embedding
FROM index_profile ip
CROSS JOIN (SELECT DISTINCT unnest(%(digests)s::text[]) AS embed_digest) d
CROSS JOIN LATERAL (
    SELECT c.embedding
    FROM chunk c
    WHERE c.profile = %(profile)s
      AND c.tenant_id = %(tenant_id)s
      AND c.embed_digest = d.embed_digest
    ORDER BY c.created_at DESC, c.chunk_id
    LIMIT 1
) newest
WHERE ip.name = %(profile)s
  AND ip.model = %(model)s
  AND ip.dimension = %(dimension)s
ORDER BY d.embed_digest;
