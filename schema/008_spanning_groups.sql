-- 008_spanning_groups: fused arrays whose data-parallel ranks live on
-- several workers.  Such a group keeps its leader (the worker of rank 0) in
-- groups.worker_id and the leader's device indices in groups.device_idx, as
-- an array on one worker would; what the control loop must also remember
-- across a restart of fuseboxd is every worker of the group with its ranks
-- (group_workers, the leader included) and the port the leader listens on
-- for the others (groups.comm_port, NULL for a group on one worker).  The
-- workers list the group in their HELLO after the restart, and the loop
-- follows it again from these rows.

CREATE TABLE group_workers (
    group_id   uuid NOT NULL REFERENCES groups (id) ON DELETE CASCADE,
    worker_id  uuid NOT NULL REFERENCES workers (id) ON DELETE CASCADE,
    -- the worker's ranks are rank_base .. rank_base + n_ranks - 1 of the group's
    -- parallel_data, on its devices device_idx (one per rank, in rank order)
    rank_base  integer NOT NULL CHECK (rank_base >= 0),
    n_ranks    integer NOT NULL CHECK (n_ranks >= 1),
    device_idx integer[] NOT NULL CHECK (cardinality(device_idx) = n_ranks),
    PRIMARY KEY (group_id, worker_id),
    UNIQUE (group_id, rank_base)
);
CREATE INDEX group_workers_worker ON group_workers (worker_id);

ALTER TABLE groups
    ADD COLUMN comm_port integer CHECK (comm_port IS NULL OR comm_port BETWEEN 1 AND 65535);

-- Every (group, worker, device) a group occupies, whether it lives on one
-- worker or spans several: what the cluster view and the utilization of a
-- device read instead of groups.worker_id and groups.device_idx alone.
CREATE VIEW group_devices AS
    SELECT g.id AS group_id, g.worker_id, d.idx
    FROM groups g CROSS JOIN LATERAL unnest(g.device_idx) AS d(idx)
    WHERE g.comm_port IS NULL AND g.worker_id IS NOT NULL
    UNION ALL
    SELECT gw.group_id, gw.worker_id, d.idx
    FROM group_workers gw CROSS JOIN LATERAL unnest(gw.device_idx) AS d(idx);
