/*
 * fusebox-sim: a discrete-event simulator of a fusebox cluster that drives
 * the server's own planner and scheduler (server/planner.h) and fair-share
 * controller (server/fairshare.h) against simulated workers, so that
 * policies can be compared on slowdown, completion times and utilization
 * without devices and without training anything.
 *
 * A scenario (sim/README.md has the format) names devices with speeds,
 * tenants with weights, job profiles (a step-time model per model family)
 * and jobs, listed one by one (a trace) or drawn by a generator (Poisson
 * arrivals of sweeps from a mix).  The engine advances every running group
 * at a rate given by the step-time model between events (arrivals, member
 * completions, planner runs, rebalance periods) instead of simulating
 * single steps, so a 20,000-job scenario runs in seconds.
 *
 * Step-time model.  A profile's step_s is the step time of one model alone
 * on its `data` devices of speed 1 with an even split.  A group of B members
 * does step_s * data * (1 + alpha * (B - 1)) device-seconds of work per step
 * (fusion is sub-linear in B); shard i does the part split[i] / batch of it.
 * On a device hosting several groups the groups take turns (the workers'
 * stride scheduler): a group gets a fraction of the device in proportion to
 * its time share, the device loses switch_overhead of its speed to context
 * switches (and switch_overhead_step more for each group beyond two), and time a group leaves unused (a shard waiting for its
 * group's slowest shard) goes to the other groups there.  A group's step
 * time is its slowest shard's.
 *
 * Costs around the steps, each 0 unless a scenario sets it (so that a
 * scenario without them runs as before).  The planner acts dispatch_s after
 * the submission or the group's end that calls for it; a placed array of B
 * members steps only start_s + start_member_s * (B - 1) later (the worker
 * loads the data and builds the array; it holds its devices' slots meanwhile
 * but not their time); a member is finished end_s after its last step (final
 * evaluation, model export and its record), and an array whose last members
 * finish keeps its slots, idle, until then.  Devices may share a host of c
 * cores: while k of its devices are busy, each steps g(k) = (1 + interference
 * * (min(k, c) - 1)) * max(1, k / c) times slower than alone (memory, caches
 * and the host's other processes; beyond c busy devices, also turns on the
 * cores).  A profile's isolated_s, when set, is the step time alone the
 * fair-share controller is told in place of the true one, as fuseboxd's
 * controller acts on the profile it stored.  bench/fairshare measures all of
 * them on a real cluster.
 */
#ifndef FB_SIM_SIM_H
#define FB_SIM_SIM_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#include "fairshare.h"
#include "planner.h"

#define SIM_NAME_MAX 64

typedef struct sim_profile {
    char name[SIM_NAME_MAX + 1];
    double step_s; /* one model alone on its data devices of speed 1, even split */
    double alpha;  /* fusion cost: B members step in step_s * (1 + alpha * (B - 1)) */
    int64_t batch; /* global batch, samples */
    int data;      /* data-parallel shards (devices) */
    int kind;      /* FB_PLAN_CUDA or FB_PLAN_CPU */
    int64_t member_bytes, shared_bytes;
    bool public_dataset;
    double start_s;        /* an array's start: placement to its first step, B = 1 */
    double start_member_s; /* what each further member adds to the start */
    double end_s;          /* a member's end: its last step to its recorded finish */
    double isolated_s;     /* the step time alone the controller is told (fuseboxd's profiles
                              table, B = 1); 0: the true one, step_s */
} sim_profile;

/* A host: devices on it slow one another down while they are busy. */
typedef struct sim_host {
    char name[SIM_NAME_MAX + 1];
    int cores;           /* c: a busy device keeps one core busy */
    double interference; /* step-time inflation per further busy device, up to c */
} sim_host;

typedef struct sim_device {
    int worker;
    int host; /* index into the scenario's hosts; -1: alone on its host */
    int kind;
    double speed;
    int64_t memory_bytes;
} sim_device;

typedef struct sim_tenant {
    char name[SIM_NAME_MAX + 1];
    double weight;
    bool share_arrays;
    int max_devices;
} sim_tenant;

typedef struct sim_job {
    double at; /* submission time, s */
    int tenant, profile, key, priority;
    int64_t steps;
} sim_job;

typedef struct sim_config {
    double period_s;   /* rebalance period */
    double plan_gap_s; /* the planner runs at most once per this much simulated time */
    int max_b;         /* 1 = no fusion */
    int max_groups_per_device;
    double switch_overhead; /* fraction of a shared device's speed lost to switching */
    /* and the further fraction lost for each group beyond two (0: the loss does not grow) */
    double switch_overhead_step;
    bool rebalance;         /* run the fair-share controller every period */
    bool migrate;           /* act on its migration suggestions */
    double migrate_cost_s;  /* a migrated group resumes this long after it is placed again */
    double dispatch_s;      /* the planner acts this long after what calls for it */
    fb_fair_params fair;
} sim_config;

/* A `devices` record: count devices, per_worker of them to a worker. */
typedef struct sim_devspec {
    int count, per_worker, kind;
    int host; /* -1: none */
    double speed;
    /* n_speeds = per_worker: device i of each worker has speeds[i] (a worker
     * of unlike GPUs); 0: every device has speed */
    int n_speeds;
    double speeds[FB_PLAN_MAX_GROUP_DEVICES];
    int64_t memory_bytes;
} sim_devspec;

/* A `mix` record: one kind of submission the generator draws. */
typedef struct sim_mix {
    int profile;
    double weight;
    int sweep_min, sweep_max;     /* jobs per submission (a sweep shares one fusion key) */
    int64_t steps_min, steps_max; /* steps of the submission's jobs, uniform */
    int priority;
    int n_tenants; /* 0: any tenant */
    int *tenants;
} sim_mix;

/* The `generate` record. */
typedef struct sim_generator {
    bool on;
    int jobs;          /* jobs to draw */
    double rate_per_s; /* submissions per second (Poisson) */
    double start_s;
    uint64_t seed;
} sim_generator;

typedef struct sim_scenario {
    char name[SIM_NAME_MAX + 1];
    sim_config cfg;
    sim_profile *profiles;
    int n_profiles;
    sim_device *devices;
    int n_devices;
    sim_tenant *tenants;
    int n_tenants;
    sim_host *hosts;
    int n_hosts;
    sim_job *jobs; /* by submission time (ties in the order listed) */
    int n_jobs;
    char **keys; /* fusion key names; a key belongs to one profile */
    int *key_profile;
    int n_keys;
    /* what the records say, before sim_scenario_finish expands it */
    sim_devspec *devspecs;
    int n_devspecs;
    sim_mix *mixes;
    int n_mixes;
    sim_generator gen;
    bool finished;
} sim_scenario;

/* The outcome of one run.  Times are simulated seconds. */
typedef struct sim_result {
    int n_jobs, n_done; /* jobs that never finished could not be placed */
    double makespan_s;  /* last completion (the first submission is at 0 or later) */
    double jct_mean, jct_p50, jct_p95, jct_max; /* completion time: finish - submission */
    double wait_mean;                           /* submission to first placement */
    double slow_mean, slow_p95, slow_max;       /* completion time over the job's exclusive run
                                                   time (steps * step_s) */
    double utilization;                         /* useful device time over devices x makespan */
    double jain; /* Jain's index of 1 / slowdown over finished jobs */
    int64_t n_plans, n_periods, n_split_changes, n_share_changes, n_migrations, n_profiles;
    double *placed;   /* [n_jobs] first placement, -1 when never placed */
    double *finish;   /* [n_jobs] finish time, -1 when it did not finish */
    double *slowdown; /* [n_jobs] 0 when it did not finish */
} sim_result;

/* Defaults of the `sim` record (README). */
sim_config sim_config_default(void);

/*
 * Adds the records of a scenario file (JSON lines) to *sc, which must be
 * zeroed or hold records of earlier files (later files may use names
 * defined in earlier ones).  Returns 0, or a negative fb_err with msg saying
 * "path:line: what" (the scenario is then left as it was before the bad
 * record, and the caller frees it).
 */
int sim_scenario_read(sim_scenario *sc, const char *path, char *msg, size_t msg_cap);

/* The same from text held in memory; name stands for the path in messages. */
int sim_scenario_read_text(sim_scenario *sc, const char *text, const char *name, char *msg,
                           size_t msg_cap);

/*
 * Expands the generator records read so far into jobs and sorts the jobs by
 * submission time.  Call once, after the last file.  scale in (0, 1] shrinks
 * the scenario: device counts, generated jobs and the submission rate are
 * multiplied by it (a smaller cluster under the same load).  Returns 0 or a
 * negative fb_err with msg filled.
 */
int sim_scenario_finish(sim_scenario *sc, double scale, char *msg, size_t msg_cap);

/* Releases everything *sc holds and zeroes it; accepts NULL. */
void sim_scenario_free(sim_scenario *sc);

/*
 * Runs the scenario under cfg (the scenario's own, or a variant of it).
 * Returns 0 with *out filled (release with sim_result_free), or a negative
 * fb_err with msg filled (out of memory, or a policy refused its snapshot,
 * which is a bug).
 */
int sim_run(const sim_scenario *sc, const sim_config *cfg, sim_result *out, char *msg,
            size_t msg_cap);

/* Releases what sim_run allocated; accepts NULL. */
void sim_result_free(sim_result *r);

/* One labelled run, for the reports. */
typedef struct sim_variant {
    const char *label;
    const sim_result *r;
    double wall_s;
} sim_variant;

/* Prints the variants side by side, with each one's ratio to the first. */
void sim_report_table(FILE *f, const sim_scenario *sc, const sim_variant *v, int n);

/* The same as one JSON object. */
void sim_report_json(FILE *f, const sim_scenario *sc, const sim_variant *v, int n);

/* One line per job of a run: submission, placement, finish, slowdown. */
void sim_report_jobs(FILE *f, const sim_scenario *sc, const sim_result *r);

#endif
