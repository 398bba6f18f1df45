/*
 * The planner and the scheduler: pure policies (no I/O, no clock, no
 * globals) that turn a snapshot of the queue and the cluster into
 * decisions.  fuseboxd's control loop feeds them from PostgreSQL and the
 * workers' reports; the simulator (sim/) feeds them from a trace; unit tests
 * feed them by hand.  Same snapshot in, same decisions out.
 *
 * Planner: queued jobs are grouped by compatibility (equal fusion key and
 * start step; jobs of different tenants only when both tenants allow
 * sharing and the dataset is public), in queue order (higher priority
 * first, then the tenant furthest below its fair share of devices, then
 * submission order).  Each group takes the largest B (at most max_b) whose
 * memory estimate fits the largest device that could hold it; the rest of a
 * compatible set forms further groups.
 *
 * Scheduler: groups are placed in queue order (a group's rank is that of its
 * first job, so an old small group is never passed over for a newer large
 * one) on parallel_data x parallel_pipeline devices of one ready worker,
 * preferring idle devices, then co-locating on a device when its free memory
 * allows and it hosts fewer than max_groups_per_device groups.  A group that
 * no single ready worker can take may span workers when it is purely data
 * parallel (parallel_data >= 2, pipeline 1) on devices of one kind (CPU or
 * CUDA, never mixed): its D replicas
 * go on the devices of the fewest workers that can take part (comm), each
 * worker's ranks contiguous, the worker of rank 0 leading.  Pipeline stages
 * never span workers, and a device holds at most one
 * spanning array (two could each hold one worker's device turn while they
 * wait in a sum for the other worker).  Tenant
 * device quotas are respected.  Every group on a device gets a time share:
 * its tenant's weight over the weights of the tenants present, split evenly
 * among that tenant's groups there (shares on a device sum to 1).  Jobs left
 * unplaced get a reason and their position in the queue.
 */
#ifndef FB_SERVER_PLANNER_H
#define FB_SERVER_PLANNER_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "jobspec.h"

#define FB_PLAN_MAX_GROUP_DEVICES 64

/* Device memory and a running group's mem_per_device may not exceed 64 PiB.
 * The bound keeps every sum the planner forms inside int64 and lets a job's
 * estimate saturate without ever looking like it fits. */
#define FB_PLAN_MAX_BYTES (INT64_C(1) << 56)

typedef struct fb_plan_job {
    int64_t seq;              /* submission order, unique */
    int tenant;               /* index into the snapshot's tenants */
    const char *fusion_key;   /* equal keys may fuse */
    int64_t start_step;       /* updates already done (resume); members of a group share it */
    int priority;             /* 0..100, higher first */
    int64_t mem_member_bytes; /* one member: parameters, gradients, optimizer state, activations */
    int64_t mem_shared_bytes; /* once per array: the minibatch and workspace */
    int parallel_data, parallel_pipeline;
    bool public_dataset;      /* the dataset may be shared between tenants */
    int device_kind;          /* 0 = any, else FB_PLAN_CPU or FB_PLAN_CUDA */
} fb_plan_job;

enum { FB_PLAN_CPU = 1, FB_PLAN_CUDA = 2 };

typedef struct fb_plan_tenant {
    double weight;     /* fair-share weight, > 0 */
    bool share_arrays; /* may its jobs share an array with another tenant's */
    int max_devices;   /* quota: devices its groups may hold at once */
} fb_plan_tenant;

typedef struct fb_plan_device {
    int worker;           /* index of its worker (devices of one worker are contiguous) */
    int idx;              /* the worker's device index */
    int kind;             /* FB_PLAN_CPU or FB_PLAN_CUDA */
    int64_t memory_bytes; /* total */
    bool ready;           /* its worker is registered and not draining */
    /* its worker can take part in arrays that span workers (it reported where the others
     * reach it); equal on all devices of a worker */
    bool comm;
} fb_plan_device;

/* A group already running (its memory and tenants occupy devices). */
typedef struct fb_plan_running {
    int n_devices;
    int devices[FB_PLAN_MAX_GROUP_DEVICES]; /* indices into the snapshot's devices */
    int64_t mem_per_device;                 /* bytes it holds on each */
    int n_tenants;
    const int *tenants;                     /* indices of the tenants of its members */
    /* its time share now, in (0, 1]; 0 = unknown (taken to be what the formula gives the
     * running groups alone).  Known shares let a plan with no new group still correct the
     * shares of groups whose neighbours finished. */
    double time_share;
} fb_plan_running;

typedef struct fb_plan_snapshot {
    const fb_plan_job *jobs;         /* the queue, in any order */
    int n_jobs;
    const fb_plan_tenant *tenants;
    int n_tenants;
    const fb_plan_device *devices;
    int n_devices;
    const fb_plan_running *running;
    int n_running;
    int max_b;                 /* members per array at most; 1 disables fusion */
    int max_groups_per_device; /* co-location bound, >= 1 */
    /* the running groups' shares belong to someone else (the fair-share
     * controller, fairshare.h): shares[] stays empty and a new group's share
     * is scaled to the running groups' known shares on its devices (see
     * fb_plan_run) */
    bool keep_running_shares;
} fb_plan_snapshot;

/* A new group: which jobs, where, and how. */
typedef struct fb_plan_group {
    int n_jobs;
    int *jobs; /* indices into the snapshot's jobs, in queue order */
    int n_devices;
    int devices[FB_PLAN_MAX_GROUP_DEVICES]; /* data-major: device of (d, p) at d * P + p */
    int parallel_data, parallel_pipeline;
    int64_t split[FB_PLAN_MAX_GROUP_DEVICES]; /* samples per data shard, sum = batch size */
    int64_t mem_per_device;
    double time_share; /* of its devices' time, (0, 1] */
    /* the workers its devices are on: 1, or more for an array that spans workers, whose
     * devices then come worker by worker (each worker's ranks contiguous) and whose leader
     * is the worker of devices[0] (rank 0) */
    int n_workers;
} fb_plan_group;

typedef enum fb_plan_reason {
    FB_PLAN_PLACED = 0,
    FB_PLAN_NO_WORKERS,    /* no ready device at all (of a kind the job can use) */
    FB_PLAN_WAIT_DEVICES,  /* devices exist but none is free enough now */
    FB_PLAN_QUOTA,         /* the tenant's groups would hold more than max_devices */
    FB_PLAN_TOO_LARGE,     /* no registered device could ever hold one member, or the
                              batch has fewer samples than parallel_data shards */
    FB_PLAN_REASON_COUNT
} fb_plan_reason;

/* A time share for a group already running, when co-location changed it. */
typedef struct fb_plan_share {
    int running;       /* index into the snapshot's running groups */
    double time_share;
} fb_plan_share;

typedef struct fb_plan_result {
    int n_groups;
    fb_plan_group *groups;
    fb_plan_reason *reason; /* [n_jobs]: FB_PLAN_PLACED or why the job waits */
    int64_t *position;      /* [n_jobs]: unplaced jobs ahead of it in the queue order as it
                               stands after this plan's placements (0 for placed jobs) */
    int n_shares;
    fb_plan_share *shares;  /* running groups whose share changed */
} fb_plan_result;

/*
 * Plans and places the snapshot's queue.  batch_size_of(job) is needed for
 * the split; it is passed as batch[] ([n_jobs], the job's batch size; equal
 * within a fusion key).  Returns FB_OK with *out filled (release with
 * fb_plan_result_free), or FB_ERR_NOMEM / FB_ERR_OUT_OF_RANGE (a malformed
 * snapshot: indices out of range, weights not positive) with msg filled.
 *
 * A snapshot is malformed when a count is negative or its array is NULL; a
 * job has a tenant out of range, a NULL fusion key, a negative start step,
 * a priority outside 0..100, negative memory, parallel_data or
 * parallel_pipeline below 1 or a product above FB_PLAN_MAX_GROUP_DEVICES, an
 * unknown device_kind, a batch below 1, or a seq another job has; a tenant
 * has a weight not finite and positive or max_devices below 0; a device has
 * a negative worker or idx, an unknown kind, memory outside
 * 0..FB_PLAN_MAX_BYTES, or its worker's devices are not contiguous or
 * disagree on comm; a
 * running group has 1..FB_PLAN_MAX_GROUP_DEVICES devices not all distinct
 * and in range, mem_per_device outside 0..FB_PLAN_MAX_BYTES, or no tenants
 * or one out of range; max_b or max_groups_per_device is below 1.  Then
 * *out is untouched.
 *
 * Within the contract of the paragraphs at the top: jobs are compatible only
 * with equal batch[] and parallel shape as well (the fusion key covers both;
 * the planner does not rely on it), and device kinds fuse when equal or when
 * one of them is 0 (the group then needs the other kind).  A group takes the
 * next compatible jobs until max_b, or until the next one would not fit the
 * largest ready device of the group's kind.  A group goes on one worker
 * whenever one can take it (the worker with the fewest groups on the chosen
 * devices, then the most free memory); only when none can, and the group is
 * data parallel with pipeline 1, does it span comm workers on devices of
 * its kind (kind 0: CPU devices, else CUDA devices): the fewest workers whose eligible
 * devices add up to D (the workers with the most eligible devices first,
 * then the fewest groups and most free memory on them), and on them the D
 * best devices in the device order of one worker, listed in snapshot order
 * (so by worker).  A job whose tenant's groups
 * would exceed max_devices with the group's devices waits with
 * FB_PLAN_QUOTA, and its jobs never join another tenant's group, so a tenant
 * at its quota does not hold back a shared array.  Running groups' shares
 * before this plan are taken to be the same formula over the running groups
 * alone; shares[] lists those that differ from it by more than 1e-9.
 *
 * With keep_running_shares, shares[] is always empty and a new group's
 * share is the formula's, scaled on each of its devices by the running
 * groups' known shares there over their formula shares (so that it stands
 * to them as the formula says), the smallest over its devices, at most 1.
 */
int fb_plan_run(const fb_plan_snapshot *s, const int64_t *batch, fb_plan_result *out, char *msg,
                size_t msg_cap);

/* Releases what fb_plan_run allocated in *r and zeroes it; accepts NULL. */
void fb_plan_result_free(fb_plan_result *r);

/* The human-readable reason stored in jobs.queue_reason ("unknown" for a
 * value outside the enum). */
const char *fb_plan_reason_text(fb_plan_reason r);

/*
 * Memory estimate of one member of spec trained at its batch size, in bytes:
 * parameters, gradients and optimizer state (fp32), plus the activations and
 * their gradients of every layer, a transformer block's inside included
 * (its layernorms, qkv, attention probabilities and MLP).  An array of B
 * members takes at most B times this plus *shared (tests/engine,
 * test_plan_memory, checks it against real arrays of every model kind).  *shared (may be NULL) receives what one
 * array needs once (the minibatch and labels).  Sums saturate at INT64_MAX.
 * Returns FB_ERR_OUT_OF_RANGE (negative) for a NULL spec, *shared untouched.
 */
int64_t fb_plan_member_bytes(const fb_job_spec *spec, int64_t *shared);

#endif
