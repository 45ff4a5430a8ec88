-- Crash bisection (issue 12, defect 7). When a run of n > 1 tasks dies without recording an outcome,
-- the crash cannot be blamed on one document: each suspect gets its attempt back and remembers a cap
-- of n / 2 on the size of its next run, so a poison document is isolated in log2(n) halvings and ends
-- DEAD alone while its batch-mates succeed. NULL: no cap (the sensor's usual batching).
ALTER TABLE index_task ADD COLUMN run_size_cap integer CHECK (run_size_cap >= 1);
