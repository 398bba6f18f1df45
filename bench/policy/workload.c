/*
 * The synthetic snapshot of workload.h.  A fusion key stands for one sweep:
 * most of its jobs belong to the tenant that launched it, a few to others
 * (the same public benchmark submitted by several tenants), so the planner
 * meets both single-tenant arrays and cross-tenant ones.
 */
#include "workload.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define GIB (INT64_C(1) << 30)

/* splitmix64: small, seedable, the same on every platform */
static uint64_t next_u64(uint64_t *state)
{
    uint64_t z = (*state += UINT64_C(0x9E3779B97F4A7C15));
    z = (z ^ (z >> 30)) * UINT64_C(0xBF58476D1CE4E5B9);
    z = (z ^ (z >> 27)) * UINT64_C(0x94D049BB133111EB);
    return z ^ (z >> 31);
}

static int below(uint64_t *state, int n)
{
    return (int)(next_u64(state) % (uint64_t)n);
}

workload_shape workload_budget_shape(void)
{
    return (workload_shape){.n_jobs = 10000, .n_keys = 200, .n_tenants = 1000, .n_workers = 64,
                            .devices_per_worker = 4, .n_running = 100, .max_b = 8,
                            .max_groups_per_device = 2, .seed = 42};
}

int workload_make(workload *w, const workload_shape *sh)
{
    memset(w, 0, sizeof *w);
    if (sh->n_jobs < 0 || sh->n_keys < 1 || sh->n_tenants < 1 || sh->n_workers < 0 ||
        sh->devices_per_worker < 0 || sh->n_running < 0)
        return -1;
    int n_dev = sh->n_workers * sh->devices_per_worker;
    uint64_t rng = sh->seed;
    w->jobs = calloc((size_t)sh->n_jobs + 1, sizeof *w->jobs);
    w->batch = calloc((size_t)sh->n_jobs + 1, sizeof *w->batch);
    w->tenants = calloc((size_t)sh->n_tenants, sizeof *w->tenants);
    w->devices = calloc((size_t)n_dev + 1, sizeof *w->devices);
    w->running = calloc((size_t)sh->n_running + 1, sizeof *w->running);
    w->running_tenants = calloc((size_t)sh->n_running + 1, sizeof *w->running_tenants);
    w->keys = calloc((size_t)sh->n_keys, FB_FUSION_KEY_HEX + 1);
    int *key_tenant = calloc((size_t)sh->n_keys, sizeof *key_tenant);
    int64_t *key_batch = calloc((size_t)sh->n_keys, sizeof *key_batch);
    int64_t *key_mem = calloc((size_t)sh->n_keys, sizeof *key_mem);
    int *key_par = calloc((size_t)sh->n_keys, sizeof *key_par);
    bool *key_public = calloc((size_t)sh->n_keys, sizeof *key_public);
    int *dev_groups = calloc((size_t)n_dev + 1, sizeof *dev_groups);
    int64_t *dev_used = calloc((size_t)n_dev + 1, sizeof *dev_used);
    int rc = -1;
    if (!w->jobs || !w->batch || !w->tenants || !w->devices || !w->running ||
        !w->running_tenants || !w->keys || !key_tenant || !key_batch || !key_mem || !key_par ||
        !key_public || !dev_groups || !dev_used)
        goto fail;

    for (int t = 0; t < sh->n_tenants; t++)
        w->tenants[t] = (fb_plan_tenant){.weight = 1.0 + below(&rng, 4),
                                         .share_arrays = below(&rng, 2) == 0,
                                         .max_devices = 8 + below(&rng, 57)};
    for (int d = 0; d < n_dev; d++)
        w->devices[d] = (fb_plan_device){.worker = d / sh->devices_per_worker,
                                         .idx = d % sh->devices_per_worker,
                                         .kind = FB_PLAN_CUDA,
                                         .memory_bytes = 80 * GIB,
                                         .ready = below(&rng, 32) != 0};
    static const int64_t batches[] = {32, 64, 128, 256};
    for (int k = 0; k < sh->n_keys; k++) {
        snprintf(w->keys + (size_t)k * (FB_FUSION_KEY_HEX + 1), FB_FUSION_KEY_HEX + 1,
                 "%016llx%016llx", (unsigned long long)next_u64(&rng), (unsigned long long)k);
        key_tenant[k] = below(&rng, sh->n_tenants);
        key_batch[k] = batches[below(&rng, 4)];
        key_mem[k] = GIB / 2 + (int64_t)below(&rng, 8) * GIB / 2;
        int r = below(&rng, 100);
        key_par[k] = r < 90 ? 1 : r < 97 ? 2 : 4; /* devices: 1x1, 2x1, 2x2 */
        key_public[k] = below(&rng, 2) == 0;
    }
    for (int j = 0; j < sh->n_jobs; j++) {
        int k = below(&rng, sh->n_keys);
        int r = below(&rng, 100);
        fb_plan_job *J = &w->jobs[j];
        *J = (fb_plan_job){.seq = 1000 + (int64_t)j * 3,
                           .tenant = below(&rng, 10) < 7 ? key_tenant[k]
                                                          : below(&rng, sh->n_tenants),
                           .fusion_key = w->keys + (size_t)k * (FB_FUSION_KEY_HEX + 1),
                           .start_step = below(&rng, 10) == 0 ? 500 : 0,
                           .priority = r < 80 ? 50 : r < 95 ? 10 : 90,
                           .mem_member_bytes = key_mem[k],
                           .mem_shared_bytes = GIB / 8,
                           .parallel_data = key_par[k] == 1 ? 1 : 2,
                           .parallel_pipeline = key_par[k] == 4 ? 2 : 1,
                           .public_dataset = key_public[k],
                           .device_kind = below(&rng, 10) == 0 ? FB_PLAN_CUDA : 0};
        w->batch[j] = key_batch[k];
    }
    /* running groups: one or two devices of one worker, within the limits */
    int n_run = 0;
    for (int g = 0; g < sh->n_running && n_dev > 0; g++) {
        int64_t mem = (int64_t)(10 + below(&rng, 21)) * GIB;
        int want = below(&rng, 5) == 0 && sh->devices_per_worker >= 2 ? 2 : 1;
        int first = below(&rng, sh->n_workers) * sh->devices_per_worker +
                    below(&rng, sh->devices_per_worker - want + 1);
        bool fits = true;
        for (int i = 0; i < want; i++)
            fits = fits && dev_groups[first + i] < sh->max_groups_per_device &&
                   dev_used[first + i] + mem <= w->devices[first + i].memory_bytes;
        if (!fits) continue;
        fb_plan_running *R = &w->running[n_run];
        R->n_devices = want;
        for (int i = 0; i < want; i++) {
            R->devices[i] = first + i;
            dev_groups[first + i]++;
            dev_used[first + i] += mem;
        }
        R->mem_per_device = mem;
        w->running_tenants[n_run] = below(&rng, sh->n_tenants);
        R->n_tenants = 1;
        R->tenants = &w->running_tenants[n_run];
        n_run++;
    }
    w->snap = (fb_plan_snapshot){.jobs = w->jobs, .n_jobs = sh->n_jobs, .tenants = w->tenants,
                                 .n_tenants = sh->n_tenants, .devices = w->devices,
                                 .n_devices = n_dev, .running = w->running, .n_running = n_run,
                                 .max_b = sh->max_b,
                                 .max_groups_per_device = sh->max_groups_per_device};
    rc = 0;
fail:
    free(key_tenant);
    free(key_batch);
    free(key_mem);
    free(key_par);
    free(key_public);
    free(dev_groups);
    free(dev_used);
    if (rc) workload_free(w);
    return rc;
}

void workload_free(workload *w)
{
    if (!w) return;
    free(w->jobs);
    free(w->batch);
    free(w->tenants);
    free(w->devices);
    free(w->running);
    free(w->running_tenants);
    free(w->keys);
    memset(w, 0, sizeof *w);
}
