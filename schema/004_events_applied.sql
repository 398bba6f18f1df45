-- 004_events_applied: which worker events the control loop has recorded, so
-- that an event a worker resends (its acknowledgement was lost after the
-- COMMIT) changes nothing the second time.  Within one group (a placement)
-- a member has at most one event of a kind at a step.

CREATE TABLE events_applied (
    group_id    uuid NOT NULL,
    job_id      uuid NOT NULL REFERENCES jobs (id) ON DELETE CASCADE,
    kind        text NOT NULL,
    step        bigint NOT NULL,
    recorded_at timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (group_id, job_id, kind, step)
);
