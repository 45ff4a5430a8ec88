-- Context in chunks per profile (issue 35): when true, what the profile embeds for a chunk is the document's
-- title (the parser's, else the lone top heading, else the file name) + its heading path + its text; the text
-- stored and shown stays the chunk text. Fixed at creation (`kbindex profile create --context`): every vector of
-- the profile was computed with it, so changing it would mix two kinds of vector in one index.
ALTER TABLE index_profile
    ADD COLUMN embed_context boolean NOT NULL DEFAULT false;

CREATE FUNCTION index_profile_embed_context_fixed() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
    RAISE EXCEPTION 'index_profile.embed_context is fixed at creation (profile %): create another profile',
        OLD.name USING ERRCODE = 'check_violation';
END;
$$;

CREATE TRIGGER index_profile_embed_context_fixed
    BEFORE UPDATE OF embed_context ON index_profile
    FOR EACH ROW WHEN (OLD.embed_context IS DISTINCT FROM NEW.embed_context)
    EXECUTE FUNCTION index_profile_embed_context_fixed();
