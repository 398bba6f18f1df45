-- 010_init_artifacts: where a job's initial weights come from.  A spec's
-- "init" names one of the tenant's own artifacts ({"job": id, "checkpoint":
-- "final" | "latest" | step}); fuseboxd resolves it when the job is
-- submitted and keeps here the artifact's path relative to the artifacts
-- directory (it lies under the tenant's own directory, <tenant id>/...).  The
-- control loop reads that file and sends its bytes with the job's ASSIGN, so
-- no worker ever opens a path a tenant wrote.  NULL: the job starts from its
-- seeded initialisation.
ALTER TABLE jobs ADD COLUMN init_path text;
