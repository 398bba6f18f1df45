-- 012_worker_keys: the workers' allow-list in the database.  Until now the
-- only way to let a worker connect was a line in the worker-keys file beside
-- fuseboxd, copied there by a person.  An administrator now registers a
-- worker's public CURVE key through POST /v1/workers/keys (a batch job does
-- it from the node where it generated the key) and revokes it through
-- DELETE /v1/workers/keys/{id}; the control loop lets in the keys of the file
-- and the keys registered here that are not revoked.  A revoked row stays, so
-- that the list says who was let in and until when.
CREATE TABLE worker_keys (
    id          uuid PRIMARY KEY DEFAULT gen_random_uuid(),
    public_key  text NOT NULL CHECK (length(public_key) = 40),
    name        text NOT NULL DEFAULT '',
    created_at  timestamptz NOT NULL DEFAULT now(),
    revoked_at  timestamptz
);
-- one live row per key: registering a key again finds the row it has
CREATE UNIQUE INDEX worker_keys_live ON worker_keys (public_key) WHERE revoked_at IS NULL;
CREATE INDEX worker_keys_created ON worker_keys (created_at, id);
