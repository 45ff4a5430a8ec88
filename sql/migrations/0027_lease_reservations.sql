-- The claim-to-run handover (issue 28). A lease the claiming sensor grants for a run that has yet to start
-- is a *reservation*: it lasts the longest expected queue wait instead of one lease, needs no heartbeat from
-- the sensor (nothing can write under the claim owner), and the run adopts it when its resources are set up.
-- The column that marked it is renamed to say so. A reservation that ends without any run starting it (it
-- ran out, or its run died before starting) gives its attempt back, at most a bounded number of times
-- (reservation_givebacks): then the task ends DEAD with RUN_NEVER_STARTED instead of cycling forever.
ALTER TABLE index_task RENAME COLUMN lease_unstarted TO lease_reserved;
ALTER TABLE index_task ADD COLUMN reservation_givebacks integer NOT NULL DEFAULT 0;
-- The claiming sensor looks up reservations whose run never appeared (the tick died after its claim) by
-- their owner; reservations are few (the runs waiting to start), so this index stays small.
CREATE INDEX index_task_reserved_idx ON index_task (lease_owner, started_at)
    WHERE status = 'RUNNING' AND lease_reserved;
