-- 003_asha: early stopping of sweep trials inside live arrays.  Each result
-- a trial reports at an ASHA rung, with the decision taken on it, and why a
-- job ended when it ended for a reason its state does not say.

-- One row per trial and rung, written by the control loop when the trial's
-- first evaluation at or past the rung's step arrives (server/asha.h).  seq
-- is the order the results arrived in: a decision weighs the results of
-- its rung with a smaller seq, so the order is part of the record.  metric
-- is the value of the sweep's early_stopping.metric at step; decision is
-- final ('stop': the member is detached from its array and ends).
CREATE TABLE asha_rungs (
    seq        bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    sweep_id   uuid NOT NULL REFERENCES sweeps (id) ON DELETE CASCADE,
    job_id     uuid NOT NULL REFERENCES jobs (id) ON DELETE CASCADE,
    rung       integer NOT NULL CHECK (rung >= 0 AND rung < 32),
    step       bigint NOT NULL CHECK (step >= 0),
    metric     double precision NOT NULL,
    decision   text NOT NULL CHECK (decision IN ('continue', 'stop')),
    decided_at timestamptz NOT NULL DEFAULT now(),
    UNIQUE (job_id, rung)
);
CREATE INDEX asha_rungs_sweep ON asha_rungs (sweep_id, rung, seq);

-- Why a finished job ended, where the state alone does not say it:
-- 'early_stopped' for a completed trial its sweep's ASHA rule stopped (its
-- checkpoints are kept; step is where it left its array).  NULL otherwise.
ALTER TABLE jobs ADD COLUMN end_reason text CHECK (end_reason IN ('early_stopped'));
