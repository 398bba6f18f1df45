/*
 * A synthetic planner snapshot the size of a busy cluster: thousands of
 * queued jobs from sweeps of many tenants over a few hundred fusion keys,
 * workers with several devices each, and groups already running.  The
 * planner benchmark times fb_plan_run on it; the scale test checks the plan
 * it gets.  Same arguments and seed, same snapshot.
 */
#ifndef FB_BENCH_POLICY_WORKLOAD_H
#define FB_BENCH_POLICY_WORKLOAD_H

#include <stdint.h>

#include "planner.h"

typedef struct workload_shape {
    int n_jobs, n_keys, n_tenants;
    int n_workers, devices_per_worker;
    int n_running;
    int max_b, max_groups_per_device;
    uint64_t seed;
} workload_shape;

/* A snapshot and the arrays it points into (owned). */
typedef struct workload {
    fb_plan_snapshot snap;
    int64_t *batch;
    fb_plan_job *jobs;
    fb_plan_tenant *tenants;
    fb_plan_device *devices;
    fb_plan_running *running;
    int *running_tenants;
    char *keys; /* n_keys strings of FB_FUSION_KEY_HEX + 1 bytes */
} workload;

/* The shape of the budget: 10,000 jobs, 200 keys, 1,000 tenants, 64 workers
 * x 4 devices, 100 running groups. */
workload_shape workload_budget_shape(void);

/*
 * Fills *w with a snapshot of the given shape.  Running groups are placed
 * within memory and max_groups_per_device, as a real cluster's would be.
 * Returns 0, or -1 when memory runs out or the shape has a negative count
 * (then *w is zeroed).
 */
int workload_make(workload *w, const workload_shape *shape);

/* Releases what workload_make allocated; accepts NULL. */
void workload_free(workload *w);

#endif
