-- Where prune_lineage_keys' walk over the runs that earlier prunes left behind stopped (issue 33). The walk
-- took the oldest 1,000 finished index runs created before the oldest live key was added; a run it keeps (it
-- also covers a key added again since) stays among the oldest, so 1,000 kept runs at the front stalled it for
-- good. Each walk now starts after the creation time of the last run the previous one looked at, and starts
-- from the oldest again once a walk reaches the end. One row: prune runs never overlap (their sensor starts
-- one only when none is in flight).
CREATE TABLE prune_run_walk (
    walk       boolean PRIMARY KEY DEFAULT true CHECK (walk),
    after      timestamptz,
    updated_at timestamptz NOT NULL DEFAULT now()
);
