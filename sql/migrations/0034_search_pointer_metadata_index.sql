-- A GIN index on the metadata search pointers carry (issue 30, filtered search).
--
-- A filtered search first reads the pointers in scope (search_hits_scoped): with only the primary key that means
-- every pointer of the tenant, each through kbindex_metadata_match. At 1M chunks (bench.scale.search) the
-- biggest tenant has 35,636 pointers: 50 ms of a 63 ms search with dept=legal, which keeps 344 of them. Equality
-- conditions also travel as a jsonpath (pipelines/domain/metadata.py ReadScope.params, metadata_path) that this
-- index answers; the function still decides every row the index returns.
CREATE INDEX search_pointer_metadata_idx ON search_pointer USING gin (metadata jsonb_path_ops);
