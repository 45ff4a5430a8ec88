-- A lease the claiming sensor grants for a run is "unstarted" until the run adopts it (task_adopt
-- hands it to the run: the run becomes the owner). An unstarted lease that expires was never worked
-- on: its takeover still grows the fencing token (attempts + 1) but grants one more attempt, so runs
-- that never start (a tick that died, a gRPC timeout, a run stuck in STARTING) cannot make a document
-- DEAD with LEASE_ATTEMPTS_EXHAUSTED. Task events of kind 'run' record which run started an attempt.
ALTER TABLE index_task ADD COLUMN lease_unstarted boolean NOT NULL DEFAULT false;
ALTER TABLE task_event DROP CONSTRAINT task_event_kind_check;
ALTER TABLE task_event ADD CONSTRAINT task_event_kind_check CHECK (kind IN ('transition', 'progress', 'run'));
