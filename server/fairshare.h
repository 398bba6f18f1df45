/*
 * The fair-share controller: a pure policy (no I/O, no clock, no globals)
 * that fuseboxd's control loop runs once per rebalance period over a
 * snapshot of the running groups, and the simulator (sim/) runs over
 * simulated ones.  Same snapshot in, same decisions out.
 *
 * It does three things, each with hysteresis so that decisions settle:
 *
 * 1. Inside a group: the global batch is re-split across the group's
 *    data-parallel shards in proportion to each shard's measured throughput,
 *    so that no shard waits for a slower one.  The proportional split is
 *    applied at once when it shortens the predicted step time by more than
 *    split_hysteresis, and a smaller gain only once it has pointed the same
 *    way (the same shards to gain samples) for split_patience periods in a
 *    row and the gains predicted over those periods add up to more than
 *    split_hysteresis: a steady gap is closed exactly, while noise in the
 *    measured rates, which points one way one period and another the next,
 *    starts the count again and moves nothing.  A smaller gain that would
 *    give samples to a shard on a device shared with other groups is not
 *    taken: that shard would take from its neighbours the turns it leaves
 *    them now while it waits for its group (fairshare.c says more).
 * 2. Across groups sharing a device: each tenant present on the device gets
 *    weight / (sum of the present tenants' weights) of the device's time
 *    (weighted fair share between tenants); inside a tenant's part, the
 *    groups' time shares are set so that their predicted slowdowns become
 *    equal, which gives more time to the groups with the highest slowdown.
 *    No group gets less than min_share of an even split of its tenant's
 *    part (no starvation).  Shares move toward these targets by at most
 *    max_share_step per period, and only when the targets would change what
 *    the worker runs by share_hysteresis or more: on some device, a group's
 *    fraction under the target shares (its target over the sum of the
 *    targets there) differs from its fraction now by that much.  A move
 *    that would stop closer to the target than that stops share_hysteresis
 *    short instead, so that the next period can finish the approach.
 * 3. Across devices: a device that keeps hosting migrate_gap or more groups
 *    more than the least loaded ready device of its kind for
 *    migrate_patience periods gets a suggestion to migrate its group with
 *    the highest slowdown (checkpoint, resume elsewhere); the caller may act
 *    on it or not.  New placements already prefer the least loaded devices
 *    (planner.h).
 *
 * Slowdown (docs/architecture.md, "Slowdown"): job j of group g has
 *     S_j = (elapsed_j + remaining_steps_j * step_time_g)
 *           / (total_steps_j * isolated_step_time_g),
 * and a group's slowdown is the largest of its members': a time share is
 * given to a whole group, and the member that has suffered most is the one
 * fair share is about (the maximum is what the controller drives down; a
 * mean would let a long-queued member hide behind fresh ones).  A group
 * whose isolated step time is unknown (0) counts every member's slowdown as
 * 1, is asked to be profiled (needs_profile), and keeps an even part of its
 * tenant's device time until it is.
 *
 * Smoothing: the caller smooths the measured values it puts in the
 * snapshot (step times and shard throughputs), with fb_fair_ewma and the
 * params' smoothing weight, so that the server and the simulator smooth
 * alike.  The policy keeps no state between periods: what it needs from the
 * last period (current splits and shares, each device's count of imbalanced
 * periods, and each group's split_periods, split_toward and split_gain,
 * which the result hands back: fb_fair_memory and fb_fair_device_memory keep them
 * for the caller) comes in the snapshot.  A caller that hands
 * back no split memory (zeroes) gets only the re-splits that pass
 * split_hysteresis.
 */
#ifndef FB_SERVER_FAIRSHARE_H
#define FB_SERVER_FAIRSHARE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "planner.h"

/* A group's data-parallel shards at most (pipeline stages are not counted). */
#define FB_FAIR_MAX_SHARDS FB_PLAN_MAX_GROUP_DEVICES

/* Bounds that keep every sum, product and quotient the policy forms finite:
 * a batch has at most 2^40 samples, a job at most 2^50 steps, and a time or
 * rate that is not 0 lies in 1e-9..1e12 (seconds, samples per second). */
#define FB_FAIR_MAX_BATCH (INT64_C(1) << 40)
#define FB_FAIR_MAX_STEPS (INT64_C(1) << 50)
#define FB_FAIR_MIN_VALUE 1e-9
#define FB_FAIR_MAX_VALUE 1e12

typedef struct fb_fair_device {
    int kind;               /* FB_PLAN_CPU or FB_PLAN_CUDA; speeds are not known, only measured */
    bool ready;             /* may receive a migrated group (its worker is not draining) */
    int imbalanced_periods; /* >= 0: the value the last result gave for this device, else 0 */
} fb_fair_device;

typedef struct fb_fair_tenant {
    double weight; /* fair-share weight, finite and > 0 */
} fb_fair_tenant;

typedef struct fb_fair_job {
    int tenant;          /* index into the snapshot's tenants */
    double elapsed_s;    /* since submission, queueing included; >= 0 */
    int64_t steps_done;  /* 0..total_steps */
    int64_t total_steps; /* 1..FB_FAIR_MAX_STEPS */
} fb_fair_job;

/* A running group.  Its device time is charged to the tenant of jobs[0], as
 * the planner charges it. */
typedef struct fb_fair_group {
    int n_shards;                          /* data-parallel shards, 1..FB_FAIR_MAX_SHARDS */
    int devices[FB_FAIR_MAX_SHARDS];       /* device of each shard, distinct, in range */
    int64_t split[FB_FAIR_MAX_SHARDS];     /* samples per shard now, each >= 1; the sum is the
                                              global batch, at most FB_FAIR_MAX_BATCH */
    double shard_rate[FB_FAIR_MAX_SHARDS]; /* measured samples per second of each shard while it
                                              computes (waiting for the others excluded),
                                              smoothed; 0 = not measured yet */
    double time_share;                     /* its share now, in (0, 1] */
    double step_time_s;                    /* measured step time under sharing, smoothed;
                                              0 = not measured yet */
    double isolated_step_s;                /* step time alone (the profile); 0 = unknown */
    int n_jobs;                            /* members, >= 1 */
    const fb_fair_job *jobs;
    /* the split's memory: the values the last result gave for this group, else 0 */
    int split_periods;     /* >= 0 */
    uint64_t split_toward; /* no bit at or above n_shards */
    double split_gain;     /* 0..FB_FAIR_MAX_VALUE */
} fb_fair_group;

typedef struct fb_fair_snapshot {
    const fb_fair_device *devices;
    int n_devices;
    const fb_fair_tenant *tenants;
    int n_tenants;
    const fb_fair_group *groups;
    int n_groups;
} fb_fair_snapshot;

typedef struct fb_fair_params {
    double period_s;         /* the caller's rebalance cadence, > 0 (default 5 s); the policy
                                reads no clock, patience below is counted in periods */
    double smoothing;        /* weight of a new sample in fb_fair_ewma, (0, 1] (default 0.3) */
    double split_hysteresis; /* re-split at once when the predicted step time shrinks by more
                                than this fraction, [0, 1) (default 0.05) */
    int split_patience;      /* periods a smaller gain must point the same way (and the
                                gains add up past split_hysteresis) before the split is
                                changed, >= 1 (default 10) */
    double share_hysteresis; /* move shares only when on some device a group's fraction under
                                the target shares differs from its fraction now by at least
                                this much, [0, 1) (default 0.02) */
    double max_share_step;   /* the largest change of a share in one period, (0, 1]
                                (default 0.1) */
    double min_share;        /* floor: a group keeps at least this fraction of an even split
                                of its tenant's part of a device, (0, 1] (default 0.25) */
    int migrate_gap;         /* groups more than the least loaded ready device of the same
                                kind that make a device imbalanced, >= 1 (default 2) */
    int migrate_patience;    /* periods a device must stay imbalanced before a migration is
                                suggested, >= 1 (default 6) */
} fb_fair_params;

/* What the policy decides for one group. */
typedef struct fb_fair_decision {
    double slowdown;                   /* the largest of its members' */
    double *job_slowdown;              /* [n_jobs of the group], in the snapshot's order */
    bool needs_profile;                /* isolated_step_s is 0: measure it alone */
    bool split_changed;                /* split[] differs from the snapshot's */
    int64_t split[FB_FAIR_MAX_SHARDS]; /* [n_shards] the split to use: sum unchanged, each >= 1 */
    int split_periods;                 /* periods in a row the proportional split has pointed
                                          the way split_toward says without being applied;
                                          give the three back in the next snapshot */
    uint64_t split_toward;             /* bit i: shard i would gain samples (0: no gap) */
    double split_gain;                 /* the predicted gains of those periods, summed */
    bool share_changed;                /* time_share differs from the snapshot's */
    double time_share;                 /* the share to use, in (0, 1] */
    double target_share;               /* where the share is heading (diagnostics) */
} fb_fair_decision;

/* A suggestion: move group off device (checkpoint it and resume it where
 * the planner places it next). */
typedef struct fb_fair_migration {
    int group;  /* index into the snapshot's groups */
    int device; /* the imbalanced device it is on */
} fb_fair_migration;

typedef struct fb_fair_result {
    int n_groups;
    fb_fair_decision *groups; /* [n_groups], in the snapshot's order */
    int n_devices;
    int *imbalanced_periods; /* [n_devices]: give back in the next snapshot */
    int n_migrations;
    fb_fair_migration *migrations;
    double max_slowdown; /* over all jobs (1 where unknown); 0 without jobs */
    double mean_slowdown;
} fb_fair_result;

/*
 * The controller's memory of one group between periods: the gap between its split and
 * the proportional one that has pointed the same way without being applied (a
 * decision's split_periods, split_toward and split_gain).  The policy keeps no state:
 * the caller keeps one per running group, empty for a new group (fb_fair_memory_init),
 * puts it into each period's snapshot (fb_fair_memory_restore) and takes the period's
 * back from the group's decision (fb_fair_memory_save).  A device's memory, its count of
 * imbalanced periods in a row, is kept the same way (fb_fair_device_memory).  The
 * snapshot's fields stay what fb_fair_run validates.
 */
typedef struct fb_fair_memory {
    int split_periods;
    uint64_t split_toward;
    double split_gain;
} fb_fair_memory;

typedef struct fb_fair_device_memory {
    int imbalanced_periods;
} fb_fair_device_memory;

/* Empties *mem: a new group, or a device the controller has not seen. */
void fb_fair_memory_init(fb_fair_memory *mem);
void fb_fair_device_memory_init(fb_fair_device_memory *mem);

/*
 * Puts a group's memory into its snapshot G, whose n_shards must be set: memory kept
 * while the group had another shape (a split_toward naming a shard it does not have)
 * means nothing now, and G gets none.
 */
void fb_fair_memory_restore(const fb_fair_memory *mem, fb_fair_group *G);
/* Takes a group's memory back from its decision of the period. */
void fb_fair_memory_save(fb_fair_memory *mem, const fb_fair_decision *dec);

/* Puts a device's memory into its snapshot D (a negative count, which no result gives,
 * as none); takes it back from the result of the period for snapshot device `device`. */
void fb_fair_device_memory_restore(const fb_fair_device_memory *mem, fb_fair_device *D);
void fb_fair_device_memory_save(fb_fair_device_memory *mem, const fb_fair_result *res,
                                int device);

/* The defaults listed in fb_fair_params. */
fb_fair_params fb_fair_params_default(void);

/*
 * Runs one rebalance period over the snapshot.  p may be NULL (defaults).
 * Returns FB_OK with *out filled (release with fb_fair_result_free), or
 * FB_ERR_OUT_OF_RANGE for a malformed snapshot or params, FB_ERR_NOMEM when
 * memory runs out; msg then says what was wrong and *out is untouched.
 *
 * A snapshot is malformed when a count is negative or its array is NULL
 * with a count above 0; a device has an unknown kind or a negative
 * imbalanced_periods; a tenant's weight is not finite and positive; a group
 * has n_shards outside 1..FB_FAIR_MAX_SHARDS, a device out of range or named
 * twice, a split entry below 1 or a batch above FB_FAIR_MAX_BATCH, a
 * negative split_periods, a split_toward naming a shard it does not have, a
 * split_gain outside 0..FB_FAIR_MAX_VALUE (NaN included), a time
 * share outside (0, 1], a shard rate, step time or isolated step time that
 * is neither 0 nor within FB_FAIR_MIN_VALUE..FB_FAIR_MAX_VALUE, or no jobs
 * (NULL jobs or n_jobs below 1); a job has
 * a tenant out of range, elapsed_s outside 0..FB_FAIR_MAX_VALUE (NaN
 * included), total_steps outside 1..FB_FAIR_MAX_STEPS or steps_done
 * outside 0..total_steps.
 *
 * Shares: the current share of a group on a device is its time_share over
 * the sum of those of the groups on that device (the workers' stride
 * scheduler uses shares as weights, so only these ratios matter).  A group
 * on several devices gets the smallest of its per-device targets, so the
 * shares on a device sum to 1 when its groups live on it alone, and to at
 * most 1 otherwise.  Shares of groups that share devices, directly or
 * through other groups, move together by one common fraction of the way to
 * their targets, which keeps each device's sum.  Where a device's targets
 * sum below 1, the worker runs each of them as target / (that sum): the
 * dead band compares that with the fraction now, so shares already at
 * their targets are not written again.
 */
int fb_fair_run(const fb_fair_snapshot *s, const fb_fair_params *p, fb_fair_result *out, char *msg,
                size_t msg_cap);

/* Releases what fb_fair_run allocated in *r and zeroes it; accepts NULL. */
void fb_fair_result_free(fb_fair_result *r);

/*
 * Exponentially weighted moving average: prev moved toward sample by the
 * weight w in (0, 1]; a prev of 0 (nothing measured yet) yields sample.
 */
double fb_fair_ewma(double prev, double sample, double w);

#endif
