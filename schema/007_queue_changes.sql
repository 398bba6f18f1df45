-- 007_queue_changes: the control loop keeps the queue in memory and reads
-- only what changed since its last plan.  Reading all queued jobs for every
-- plan cost about 40 ms at 10,000 of them, most of a decision's budget.
--
-- Triggers record, in the same transaction as the change, the id of every
-- job that enters or leaves the queue or changes what the planner reads of a
-- queued job (priority, fusion key, resume point, dataset), and the tenant
-- and name of every dataset that is created, changed or removed.  The
-- control loop takes the rows with DELETE ... RETURNING and, in the same
-- statement's snapshot, reads again those jobs and the queued jobs of those
-- datasets, so no change is missed whatever order transactions commit in (a
-- job submitted while its dataset's transaction is still open is read again
-- when the dataset's row is taken).  queue_reason is written by the control
-- loop itself and is deliberately not a change.

CREATE TABLE queue_changes (
    job_id    uuid,
    tenant_id uuid,
    dataset   text,
    CHECK ((job_id IS NULL) <> (tenant_id IS NULL AND dataset IS NULL))
);

CREATE FUNCTION fb_queue_change_job() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    IF TG_OP = 'DELETE' THEN
        INSERT INTO queue_changes (job_id) VALUES (OLD.id);
    ELSIF TG_OP = 'INSERT' THEN
        INSERT INTO queue_changes (job_id) VALUES (NEW.id);
    ELSIF OLD.state IS DISTINCT FROM NEW.state
          OR OLD.priority IS DISTINCT FROM NEW.priority
          OR OLD.fusion_key IS DISTINCT FROM NEW.fusion_key
          OR OLD.resume_step IS DISTINCT FROM NEW.resume_step
          OR OLD.resume_path IS DISTINCT FROM NEW.resume_path
          OR OLD.dataset IS DISTINCT FROM NEW.dataset
          OR OLD.tenant_id IS DISTINCT FROM NEW.tenant_id THEN
        INSERT INTO queue_changes (job_id) VALUES (NEW.id);
    END IF;
    RETURN NULL;
END;
$$;

-- WHEN keeps the function off the hot path of running jobs' progress updates
CREATE TRIGGER jobs_queue_insert AFTER INSERT ON jobs
    FOR EACH ROW WHEN (NEW.state = 'queued') EXECUTE FUNCTION fb_queue_change_job();
CREATE TRIGGER jobs_queue_update AFTER UPDATE ON jobs
    FOR EACH ROW WHEN (OLD.state = 'queued' OR NEW.state = 'queued')
    EXECUTE FUNCTION fb_queue_change_job();
CREATE TRIGGER jobs_queue_delete AFTER DELETE ON jobs
    FOR EACH ROW WHEN (OLD.state = 'queued') EXECUTE FUNCTION fb_queue_change_job();

-- a dataset decides where a queued job reads its data (built-in or the tenant's own)
CREATE FUNCTION fb_queue_change_dataset() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    IF TG_OP <> 'INSERT' THEN
        INSERT INTO queue_changes (tenant_id, dataset) VALUES (OLD.tenant_id, OLD.name);
    END IF;
    IF TG_OP <> 'DELETE' THEN
        INSERT INTO queue_changes (tenant_id, dataset) VALUES (NEW.tenant_id, NEW.name);
    END IF;
    RETURN NULL;
END;
$$;

CREATE TRIGGER datasets_queue_change AFTER INSERT OR DELETE OR UPDATE OF tenant_id, name, source,
    manifest ON datasets FOR EACH ROW EXECUTE FUNCTION fb_queue_change_dataset();
