-- kbindex_metadata_match (migration 0032) as PL/pgSQL, with the same results.
--
-- Search evaluates it on every pointer row it reads: once per document the HNSW walk meets, and on every
-- pointer of the tenant in the exhaustive fallback and the lexical side. As a SQL function with an aggregate
-- over jsonb_array_elements (and a second SQL function with an EXISTS per equality) it cannot be inlined, and
-- each call went through the SQL-function executor. Counting the 8,629 pointers that pass (bench.scale.search
-- corpus of 100k chunks, PostgreSQL 18, a 2-core machine under a load of ~14) took 481 ms with no filter at
-- all, 648 ms with dept=legal and 400 ms with an effective-date range (a bare count: 21 ms), i.e. 50-75 us a
-- row. This version walks the conditions with array subscripts and compares in plain expressions: 14, 20 and
-- 52 ms on the same rows.
--
-- Same rules: a condition that comes out NULL does not fail the list (bool_and ignored NULLs), an empty list
-- passes, equality with a list-valued key means "contains the string", otherwise jsonb equality (1 = 1.0,
-- booleans only equal booleans), ranges through kbindex_metadata_compare.
CREATE OR REPLACE FUNCTION kbindex_metadata_match(metadata jsonb, filters jsonb) RETURNS boolean
LANGUAGE plpgsql IMMUTABLE PARALLEL SAFE AS $$
DECLARE
    f jsonb;
    stored jsonb;
    wanted jsonb;
    hit boolean;
BEGIN
    FOR i IN 0 .. coalesce(jsonb_array_length(filters), 0) - 1 LOOP
        f := filters -> i;
        IF f->>'op' IN ('eq', 'ne') THEN
            stored := metadata -> (f->>'key');
            hit := false;
            IF stored IS NOT NULL THEN
                FOR j IN 0 .. coalesce(jsonb_array_length(f->'values'), 0) - 1 LOOP
                    wanted := f->'values'->j;
                    IF (CASE WHEN jsonb_typeof(stored) = 'array'
                             THEN jsonb_typeof(wanted) = 'string' AND stored @> jsonb_build_array(wanted)
                             ELSE stored = wanted END) THEN
                        hit := true;
                        EXIT;
                    END IF;
                END LOOP;
            END IF;
            IF hit <> (f->>'op' = 'eq') THEN
                RETURN false;
            END IF;
        ELSIF (CASE f->>'op'
                   WHEN 'exists' THEN metadata ? (f->>'key')
                   WHEN 'missing' THEN NOT metadata ? (f->>'key')
                   ELSE kbindex_metadata_compare(metadata->(f->>'key'), f->>'op', f->>'kind', f->'values'->0)
               END) IS FALSE THEN
            RETURN false;
        END IF;
    END LOOP;
    RETURN true;
END
$$;
