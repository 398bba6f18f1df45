-- 009_job_faults: what the control loop needs to tell a poison array from
-- bad luck (docs/scheduling.md, "Fault classes").  A worker lost while it
-- trains a job is an infrastructure fault and costs the job none of its
-- max_restarts; but an array that kills every worker it lands on, without
-- progress in between, would take the cluster down worker by worker.  So
-- each job keeps the streak of such losses: the workers (by name) on which
-- its arrays were lost since its last progress, and the highest step it had
-- reached at the latest of them.  A loss after progress (the job reported a
-- step past lost_step) starts the streak again.  Kept in the database so
-- that a restart of fuseboxd does not reset it.
ALTER TABLE jobs
    ADD COLUMN lost_workers text[] NOT NULL DEFAULT '{}',
    ADD COLUMN lost_step    bigint CHECK (lost_step IS NULL OR lost_step >= 0);
