-- Metadata, filtered search and permissions (issue 30).
--
-- A version carries canonical metadata (pipelines/domain/metadata.py) and an optional allow list of
-- principals; both are part of what the version is (the same bytes with new ones are a new version).
-- NULL allow_principals: the whole tenant may read it.
ALTER TABLE document_version
    ADD COLUMN metadata jsonb NOT NULL DEFAULT '{}'::jsonb CHECK (jsonb_typeof(metadata) = 'object'),
    ADD COLUMN allow_principals text[] CHECK (cardinality(allow_principals) > 0);

-- The search pointer carries the pointed version's metadata and allow list, written in the same statement
-- that moves it (search_pointer_advance): what search may read changes at exactly the instant of the flip,
-- and every search mode checks both on the row it already joins to find current chunks.
ALTER TABLE search_pointer
    ADD COLUMN metadata jsonb NOT NULL DEFAULT '{}'::jsonb,
    ADD COLUMN allow_principals text[];

-- Tokens that stand for principals rather than the whole tenant: an end user's token (fixed principals)
-- or a service token that may name the principals it acts for (search_as).
ALTER TABLE api_token
    ADD COLUMN principals text[],
    ADD COLUMN search_as boolean NOT NULL DEFAULT false;

-- Equality of a stored value with any wanted one: a list-valued key contains the (string) value; booleans
-- equal only booleans; numbers compare numerically (1 = 1.0); strings and dates exactly.
CREATE FUNCTION kbindex_metadata_equal_any(stored jsonb, wanted jsonb) RETURNS boolean
LANGUAGE sql IMMUTABLE PARALLEL SAFE AS $$
    SELECT stored IS NOT NULL AND EXISTS (
        SELECT 1 FROM jsonb_array_elements(wanted) AS w
        WHERE CASE WHEN jsonb_typeof(stored) = 'array'
                   THEN jsonb_typeof(w) = 'string' AND stored @> jsonb_build_array(w)
                   ELSE stored = w END)
$$;

-- A range condition: numbers against numbers, dates (YYYY-MM-DD strings, ordered as text) against dates;
-- any other stored type (or none) never matches.
CREATE FUNCTION kbindex_metadata_compare(stored jsonb, op text, kind text, bound jsonb) RETURNS boolean
LANGUAGE sql IMMUTABLE PARALLEL SAFE AS $$
    SELECT CASE
        WHEN stored IS NULL THEN false
        WHEN kind = 'date' THEN
            jsonb_typeof(stored) = 'string' AND (stored #>> '{}') ~ '^[0-9]{4}-[0-9]{2}-[0-9]{2}$'
            AND CASE op WHEN 'gt' THEN (stored #>> '{}') COLLATE "C" > (bound #>> '{}') COLLATE "C"
                        WHEN 'ge' THEN (stored #>> '{}') COLLATE "C" >= (bound #>> '{}') COLLATE "C"
                        WHEN 'lt' THEN (stored #>> '{}') COLLATE "C" < (bound #>> '{}') COLLATE "C"
                        WHEN 'le' THEN (stored #>> '{}') COLLATE "C" <= (bound #>> '{}') COLLATE "C"
                        ELSE false END
        WHEN kind = 'number' THEN
            jsonb_typeof(stored) = 'number'
            AND CASE op WHEN 'gt' THEN stored::numeric > bound::numeric
                        WHEN 'ge' THEN stored::numeric >= bound::numeric
                        WHEN 'lt' THEN stored::numeric < bound::numeric
                        WHEN 'le' THEN stored::numeric <= bound::numeric
                        ELSE false END
        ELSE false
    END
$$;

-- Whether metadata passes every condition of a filter list (JSON built by pipelines.domain.metadata.filters_json):
-- the SQL side of Filter.matches, which the property tests hold it to. Conditions travel as data, so no
-- SQL is ever assembled from a user's filter.
CREATE FUNCTION kbindex_metadata_match(metadata jsonb, filters jsonb) RETURNS boolean
LANGUAGE sql IMMUTABLE PARALLEL SAFE AS $$
    SELECT coalesce(bool_and(
        CASE f->>'op'
            WHEN 'exists' THEN metadata ? (f->>'key')
            WHEN 'missing' THEN NOT metadata ? (f->>'key')
            WHEN 'eq' THEN coalesce(kbindex_metadata_equal_any(metadata->(f->>'key'), f->'values'), false)
            WHEN 'ne' THEN NOT coalesce(kbindex_metadata_equal_any(metadata->(f->>'key'), f->'values'), false)
            ELSE kbindex_metadata_compare(metadata->(f->>'key'), f->>'op', f->>'kind', f->'values'->0)
        END), true)
    FROM jsonb_array_elements(filters) AS f
$$;
