-- 006_device_breakdown: the latest step time breakdown of every device of an
-- array, from its last progress report that had one.  One JSON array per
-- group, one object per device in the group's device order (shard-major: data
-- shard d, pipeline stage p is entry d * P + p):
--   {"device": worker's device index, "shard": d, "stage": p,
--    "compute_ms", "comm_ms", "io_ms", "idle_ms": per step,
--    "samples_per_step": the samples it trained on per step,
--    "samples_per_s": its speed, samples per second of its training passes}
-- NULL until the array reports one.  The fair-share controller splits the
-- batch by the devices' speeds; GET /v1/cluster, GET /v1/jobs/{id} and
-- /metrics serve the breakdown.

ALTER TABLE groups ADD COLUMN device_breakdown jsonb
    CHECK (device_breakdown IS NULL OR jsonb_typeof(device_breakdown) = 'array');
