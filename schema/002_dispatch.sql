-- 002_dispatch: what the control loop needs to fuse, place, dispatch and
-- recover jobs: worker identity and backend, group generations and
-- placements (several groups may share a device), each job's resume point,
-- the kind of each checkpoint file, a tenant's consent to share arrays, and a
-- notification that wakes the control loop when jobs are submitted or
-- cancelled.

-- A worker's name is its ZeroMQ routing id: one row per name.
ALTER TABLE workers
    ADD COLUMN backend text NOT NULL DEFAULT 'cpu' CHECK (backend IN ('cpu', 'cuda')),
    ADD COLUMN version text NOT NULL DEFAULT '',
    ADD CONSTRAINT workers_name_unique UNIQUE (name);

-- Whether this tenant's jobs may train in one array with another tenant's
-- (only ever on a public dataset).
ALTER TABLE tenants ADD COLUMN share_arrays boolean NOT NULL DEFAULT true;

-- generation grows with every assignment of the group; messages of another
-- generation are stale.  placement: [{"worker": name, "device": idx}, ...]
-- data-major; split: samples per data-parallel shard.
ALTER TABLE groups
    ADD COLUMN generation bigint NOT NULL DEFAULT 1 CHECK (generation >= 1),
    ADD COLUMN tenant_ids uuid[] NOT NULL DEFAULT '{}',
    ADD COLUMN start_step bigint NOT NULL DEFAULT 0 CHECK (start_step >= 0),
    ADD COLUMN parallel_data integer NOT NULL DEFAULT 1 CHECK (parallel_data >= 1),
    ADD COLUMN parallel_pipeline integer NOT NULL DEFAULT 1 CHECK (parallel_pipeline >= 1),
    ADD COLUMN device_idx integer[] NOT NULL DEFAULT '{}',
    ADD COLUMN split bigint[] NOT NULL DEFAULT '{}',
    ADD COLUMN mem_per_device bigint NOT NULL DEFAULT 0,
    ADD COLUMN time_share double precision NOT NULL DEFAULT 1
        CHECK (time_share > 0 AND time_share <= 1),
    ADD COLUMN samples_per_s double precision,
    ADD COLUMN breakdown jsonb,
    ADD COLUMN finished_at timestamptz;

-- Where a job resumes: the step and artifact path of its latest full-state
-- checkpoint (0 and NULL: from the start).  in_group is true while a worker
-- trains the job as a member of group_id; it turns false when the member
-- leaves (finished, failed, detached), so group_id keeps the history of
-- which array the job last trained in.
ALTER TABLE jobs
    ADD COLUMN resume_step bigint NOT NULL DEFAULT 0 CHECK (resume_step >= 0),
    ADD COLUMN resume_path text,
    ADD COLUMN in_group boolean NOT NULL DEFAULT false;
CREATE INDEX jobs_in_group ON jobs (group_id) WHERE in_group;
CREATE INDEX jobs_cancelled_in_group ON jobs (group_id) WHERE in_group AND state = 'cancelled';

-- 'state' files hold a member's full training state (resumable), 'model'
-- files its parameters only (what PyTorch loads).
ALTER TABLE checkpoints
    ADD COLUMN kind text NOT NULL DEFAULT 'model' CHECK (kind IN ('state', 'model'));
CREATE UNIQUE INDEX checkpoints_unique ON checkpoints (job_id, kind, step, is_final);

-- One notification per statement that submits or cancels jobs wakes the
-- control loop (LISTEN fusebox_jobs); it also runs on a tick without it.
CREATE FUNCTION fb_notify_jobs() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    PERFORM pg_notify('fusebox_jobs', '');
    RETURN NULL;
END;
$$;

CREATE TRIGGER jobs_notify_insert AFTER INSERT ON jobs
    FOR EACH STATEMENT EXECUTE FUNCTION fb_notify_jobs();
CREATE TRIGGER jobs_notify_state AFTER UPDATE OF state ON jobs
    FOR EACH STATEMENT EXECUTE FUNCTION fb_notify_jobs();
