-- 001_core: tenants and their API keys, jobs, sweeps, groups, workers and
-- devices, per-job metrics, events and checkpoints, datasets, and the
-- isolated-step-time profiles the fair-share controller reuses.
--
-- fuseboxd applies this file inside one transaction and records it in
-- schema_migrations; it is never edited once applied (add 002_*.sql instead).
-- Public ids are UUIDs; jobs and events also carry a bigint sequence that
-- orders lists and backs the API's opaque cursors.  Every list and filter the
-- API offers has an index whose leading column is the tenant.

CREATE TABLE tenants (
    id                 uuid PRIMARY KEY DEFAULT gen_random_uuid(),
    name               text NOT NULL UNIQUE CHECK (name ~ '^[a-z0-9][a-z0-9_-]{0,62}$'),
    is_admin           boolean NOT NULL DEFAULT false,
    weight             double precision NOT NULL DEFAULT 1 CHECK (weight > 0 AND weight <= 1000),
    max_queued_jobs    integer NOT NULL DEFAULT 1000 CHECK (max_queued_jobs >= 0),
    max_devices        integer NOT NULL DEFAULT 8 CHECK (max_devices >= 0),
    max_dataset_bytes  bigint NOT NULL DEFAULT 10737418240 CHECK (max_dataset_bytes >= 0),
    rate_limit_rps     double precision NOT NULL DEFAULT 50 CHECK (rate_limit_rps > 0),
    rate_limit_burst   integer NOT NULL DEFAULT 100 CHECK (rate_limit_burst >= 1),
    created_at         timestamptz NOT NULL DEFAULT now(),
    updated_at         timestamptz NOT NULL DEFAULT now()
);
CREATE INDEX tenants_created ON tenants (created_at, id);

-- Only a hash of each key's secret is stored; key_id is the public half of
-- the key and the lookup handle.
CREATE TABLE api_keys (
    key_id      text PRIMARY KEY CHECK (key_id ~ '^[0-9a-f]{16}$'),
    tenant_id   uuid NOT NULL REFERENCES tenants (id) ON DELETE CASCADE,
    name        text NOT NULL DEFAULT '',
    secret_hash bytea NOT NULL CHECK (length(secret_hash) = 32),
    created_at  timestamptz NOT NULL DEFAULT now(),
    revoked_at  timestamptz
);
CREATE INDEX api_keys_tenant ON api_keys (tenant_id, created_at);

CREATE TABLE workers (
    id            uuid PRIMARY KEY DEFAULT gen_random_uuid(),
    name          text NOT NULL,
    state         text NOT NULL DEFAULT 'ready'
                  CHECK (state IN ('ready', 'draining', 'lost')),
    address       text NOT NULL DEFAULT '',
    registered_at timestamptz NOT NULL DEFAULT now(),
    last_seen_at  timestamptz NOT NULL DEFAULT now()
);
CREATE INDEX workers_state ON workers (state, name);

-- A fused training array: jobs with one fusion key trained as one.
CREATE TABLE groups (
    id          uuid PRIMARY KEY DEFAULT gen_random_uuid(),
    fusion_key  text NOT NULL,
    state       text NOT NULL DEFAULT 'scheduled'
                CHECK (state IN ('scheduled', 'running', 'finished')),
    worker_id   uuid REFERENCES workers (id) ON DELETE SET NULL,
    n_members   integer NOT NULL DEFAULT 0,
    created_at  timestamptz NOT NULL DEFAULT now(),
    updated_at  timestamptz NOT NULL DEFAULT now()
);
CREATE INDEX groups_state ON groups (state, created_at);
CREATE INDEX groups_worker ON groups (worker_id);

CREATE TABLE devices (
    worker_id    uuid NOT NULL REFERENCES workers (id) ON DELETE CASCADE,
    idx          integer NOT NULL CHECK (idx >= 0),
    kind         text NOT NULL CHECK (kind IN ('cpu', 'cuda')),
    name         text NOT NULL DEFAULT '',
    memory_bytes bigint NOT NULL DEFAULT 0,
    utilization  double precision NOT NULL DEFAULT 0 CHECK (utilization >= 0 AND utilization <= 1),
    group_id     uuid REFERENCES groups (id) ON DELETE SET NULL,
    tenant_id    uuid REFERENCES tenants (id) ON DELETE SET NULL,
    PRIMARY KEY (worker_id, idx)
);
CREATE INDEX devices_group ON devices (group_id);
CREATE INDEX devices_tenant ON devices (tenant_id);

CREATE TABLE sweeps (
    id                uuid PRIMARY KEY DEFAULT gen_random_uuid(),
    seq               bigint GENERATED ALWAYS AS IDENTITY UNIQUE,
    tenant_id         uuid NOT NULL REFERENCES tenants (id) ON DELETE CASCADE,
    name              text NOT NULL,
    state             text NOT NULL DEFAULT 'active' CHECK (state IN ('active', 'cancelled')),
    spec              jsonb NOT NULL,
    n_trials          integer NOT NULL CHECK (n_trials >= 1),
    metric            text NOT NULL,
    metric_mode       text NOT NULL CHECK (metric_mode IN ('min', 'max')),
    idempotency_key   text,
    request_hash      bytea,
    created_at        timestamptz NOT NULL DEFAULT now(),
    updated_at        timestamptz NOT NULL DEFAULT now()
);
CREATE INDEX sweeps_tenant ON sweeps (tenant_id, seq);
CREATE UNIQUE INDEX sweeps_idempotency ON sweeps (tenant_id, idempotency_key)
    WHERE idempotency_key IS NOT NULL;

CREATE TABLE jobs (
    id              uuid PRIMARY KEY DEFAULT gen_random_uuid(),
    seq             bigint GENERATED ALWAYS AS IDENTITY UNIQUE,
    tenant_id       uuid NOT NULL REFERENCES tenants (id) ON DELETE CASCADE,
    name            text NOT NULL,
    state           text NOT NULL DEFAULT 'queued'
                    CHECK (state IN ('queued', 'scheduled', 'running', 'completed', 'failed',
                                     'cancelled')),
    queue_reason    text,
    spec            jsonb NOT NULL,
    fusion_key      text NOT NULL,
    dataset         text NOT NULL,
    n_params        bigint NOT NULL,
    flops_per_sample double precision NOT NULL,
    priority        integer NOT NULL CHECK (priority BETWEEN 0 AND 100),
    steps           bigint NOT NULL,
    epochs          bigint NOT NULL,
    step            bigint NOT NULL DEFAULT 0,
    restarts        integer NOT NULL DEFAULT 0,
    max_restarts    integer NOT NULL,
    slowdown        double precision,
    latest_metrics  jsonb,
    sweep_id        uuid REFERENCES sweeps (id) ON DELETE CASCADE,
    trial_index     integer,
    trial_params    jsonb,
    group_id        uuid REFERENCES groups (id) ON DELETE SET NULL,
    error           text,
    idempotency_key text,
    request_hash    bytea,
    created_at      timestamptz NOT NULL DEFAULT now(),
    scheduled_at    timestamptz,
    started_at      timestamptz,
    finished_at     timestamptz,
    updated_at      timestamptz NOT NULL DEFAULT now()
);
-- GET /v1/jobs and its filters, newest first
CREATE INDEX jobs_tenant ON jobs (tenant_id, seq);
CREATE INDEX jobs_tenant_state ON jobs (tenant_id, state, seq);
CREATE INDEX jobs_tenant_name ON jobs (tenant_id, name, seq);
CREATE INDEX jobs_sweep ON jobs (sweep_id, trial_index) WHERE sweep_id IS NOT NULL;
CREATE INDEX jobs_group ON jobs (group_id) WHERE group_id IS NOT NULL;
CREATE INDEX jobs_dataset ON jobs (tenant_id, dataset) WHERE state IN ('queued', 'scheduled', 'running');
-- queue order (priority first, then submission) for queue positions and the planner
CREATE INDEX jobs_queue ON jobs (priority, seq) WHERE state = 'queued';
CREATE INDEX jobs_queue_fusion ON jobs (fusion_key, seq) WHERE state = 'queued';
CREATE INDEX jobs_active ON jobs (state) WHERE state IN ('scheduled', 'running');
CREATE UNIQUE INDEX jobs_idempotency ON jobs (tenant_id, idempotency_key)
    WHERE idempotency_key IS NOT NULL;

-- Queued jobs per tenant, kept by a trigger so that the max_queued_jobs check
-- costs a handful of rows, not a count over the queue.  The count is split
-- into stripes chosen by backend, so concurrent submissions of one tenant
-- seldom wait on one another's row lock; the sum of a tenant's stripes is exact.
CREATE TABLE tenant_queued_counts (
    tenant_id uuid NOT NULL REFERENCES tenants (id) ON DELETE CASCADE,
    stripe    integer NOT NULL,
    n         bigint NOT NULL DEFAULT 0,
    PRIMARY KEY (tenant_id, stripe)
);

CREATE FUNCTION fb_count_queued() RETURNS trigger LANGUAGE plpgsql AS $$
DECLARE
    delta integer := 0;
    t uuid;
BEGIN
    IF TG_OP = 'INSERT' THEN
        IF NEW.state = 'queued' THEN delta := 1; END IF;
        t := NEW.tenant_id;
    ELSIF TG_OP = 'DELETE' THEN
        IF OLD.state = 'queued' THEN delta := -1; END IF;
        t := OLD.tenant_id;
    ELSE
        IF OLD.state = 'queued' AND NEW.state <> 'queued' THEN delta := -1;
        ELSIF OLD.state <> 'queued' AND NEW.state = 'queued' THEN delta := 1;
        END IF;
        t := NEW.tenant_id;
    END IF;
    IF delta <> 0 THEN
        INSERT INTO tenant_queued_counts AS c (tenant_id, stripe, n)
        VALUES (t, pg_backend_pid() % 16, delta)
        ON CONFLICT (tenant_id, stripe) DO UPDATE SET n = c.n + EXCLUDED.n;
    END IF;
    RETURN NULL;
END;
$$;

CREATE TRIGGER jobs_count_queued AFTER INSERT OR DELETE OR UPDATE OF state ON jobs
    FOR EACH ROW EXECUTE FUNCTION fb_count_queued();

-- One row per reported step; every measure is optional.
CREATE TABLE job_metrics (
    job_id        uuid NOT NULL REFERENCES jobs (id) ON DELETE CASCADE,
    step          bigint NOT NULL CHECK (step >= 0),
    recorded_at   timestamptz NOT NULL DEFAULT now(),
    loss          double precision,
    accuracy      double precision,
    eval_loss     double precision,
    eval_accuracy double precision,
    samples_per_s double precision,
    slowdown      double precision,
    compute_ms    double precision,
    comm_ms       double precision,
    io_ms         double precision,
    wait_ms       double precision,
    PRIMARY KEY (job_id, step)
);

CREATE TABLE job_events (
    id          bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    job_id      uuid NOT NULL REFERENCES jobs (id) ON DELETE CASCADE,
    kind        text NOT NULL,
    message     text NOT NULL DEFAULT '',
    data        jsonb,
    recorded_at timestamptz NOT NULL DEFAULT now()
);
CREATE INDEX job_events_job ON job_events (job_id, id);

-- path is relative to fuseboxd's artifacts directory.
CREATE TABLE checkpoints (
    id          bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    job_id      uuid NOT NULL REFERENCES jobs (id) ON DELETE CASCADE,
    step        bigint NOT NULL CHECK (step >= 0),
    path        text NOT NULL,
    bytes       bigint NOT NULL CHECK (bytes >= 0),
    sha256      text NOT NULL DEFAULT '',
    is_final    boolean NOT NULL DEFAULT false,
    created_at  timestamptz NOT NULL DEFAULT now()
);
CREATE INDEX checkpoints_job ON checkpoints (job_id, step);

CREATE TABLE datasets (
    id          uuid PRIMARY KEY DEFAULT gen_random_uuid(),
    tenant_id   uuid NOT NULL REFERENCES tenants (id) ON DELETE CASCADE,
    name        text NOT NULL CHECK (name ~ '^[a-z0-9][a-z0-9._-]{0,63}$'),
    source      text NOT NULL CHECK (source IN ('builtin', 'import', 'upload')),
    state       text NOT NULL DEFAULT 'ready' CHECK (state IN ('importing', 'ready', 'failed')),
    bytes       bigint NOT NULL DEFAULT 0 CHECK (bytes >= 0),
    manifest    jsonb,
    created_at  timestamptz NOT NULL DEFAULT now(),
    UNIQUE (tenant_id, name)
);
CREATE INDEX datasets_tenant ON datasets (tenant_id, created_at);

-- Step time of a fusion key's array when it holds its devices alone,
-- measured once per (fusion key, B, device kind) and reused for slowdown.
CREATE TABLE profiles (
    fusion_key        text NOT NULL,
    n_models          integer NOT NULL CHECK (n_models >= 1),
    device_kind       text NOT NULL CHECK (device_kind IN ('cpu', 'cuda')),
    isolated_step_ms  double precision NOT NULL CHECK (isolated_step_ms > 0),
    measured_at       timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (fusion_key, n_models, device_kind)
);
