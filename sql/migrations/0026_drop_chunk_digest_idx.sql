-- chunk_digest_idx (profile, tenant_id, content_digest) serves no statement (embedding reuse looks vectors up
-- by embed_digest, through chunk_embed_digest_idx), yet every chunk a publish writes pays for its entry, and
-- it was a trap for the planner: while a profile's statistics are stale (a migration's new profile, a table
-- that grew faster than autoanalyze), a lookup of one version's chunks could walk it by (profile, tenant)
-- and filter every chunk of the tenant, per version (issue 14: in a replay of 320-version runs the publish's
-- chunk count grew from 0.02 s to 1.04 s until autoanalyze ran; tests/integration/test_publish_plans.py).
DROP INDEX IF EXISTS chunk_digest_idx;
