/*
 * bench_planner: the time fb_plan_run takes on the budget snapshot (10,000
 * queued jobs over 200 fusion keys and 1,000 tenants, 64 workers x 4
 * devices, 100 running groups), result allocation included, against the
 * control loop's budget of 50 ms per plan and, side by side, against one
 * qsort of the same queue by (priority, seq): the least any planner that
 * orders the queue must spend.  Single-threaded; prints medians and p99 of
 * the runs.
 *
 *   bench_planner [runs]     (default 50)
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "planner.h"
#include "workload.h"

#define BUDGET_MS 50.0

static double now_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec * 1e3 + (double)ts.tv_nsec / 1e6;
}

static int cmp_double(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

typedef struct qkey {
    int prio;
    int64_t seq;
} qkey;

static int cmp_qkey(const void *a, const void *b)
{
    const qkey *x = a, *y = b;
    if (x->prio != y->prio) return x->prio > y->prio ? -1 : 1;
    return (x->seq > y->seq) - (x->seq < y->seq);
}

/* The p-quantile of sorted v[n] (nearest rank). */
static double quantile(const double *v, int n, double p)
{
    int i = (int)(p * n + 0.999999) - 1;
    if (i < 0) i = 0;
    if (i >= n) i = n - 1;
    return v[i];
}

int main(int argc, char **argv)
{
    int runs = argc > 1 ? atoi(argv[1]) : 50;
    if (runs < 1 || runs > 100000) {
        fprintf(stderr, "usage: bench_planner [runs 1..100000]\n");
        return 2;
    }
    workload_shape shape = workload_budget_shape();
    workload w;
    if (workload_make(&w, &shape) != 0) {
        fprintf(stderr, "bench_planner: out of memory building the snapshot\n");
        return 1;
    }
    int n = w.snap.n_jobs;
    double *t_plan = calloc((size_t)runs, sizeof *t_plan);
    double *t_sort = calloc((size_t)runs, sizeof *t_sort);
    qkey *q = calloc((size_t)n, sizeof *q);
    if (!t_plan || !t_sort || !q) {
        fprintf(stderr, "bench_planner: out of memory\n");
        return 1;
    }
    char msg[256];
    fb_plan_result r;
    int64_t placed = 0, groups = 0, shares = 0, reasons[FB_PLAN_REASON_COUNT] = {0};
    for (int i = -1; i < runs; i++) { /* run -1 warms the caches and is not counted */
        double t0 = now_ms();
        int rc = fb_plan_run(&w.snap, w.batch, &r, msg, sizeof msg);
        double t1 = now_ms();
        if (rc != FB_OK) {
            fprintf(stderr, "bench_planner: fb_plan_run: %s\n", msg);
            return 1;
        }
        if (i == 0) {
            groups = r.n_groups;
            shares = r.n_shares;
            for (int j = 0; j < n; j++) {
                reasons[r.reason[j]]++;
                placed += r.reason[j] == FB_PLAN_PLACED;
            }
        }
        fb_plan_result_free(&r);
        for (int j = 0; j < n; j++) q[j] = (qkey){w.jobs[j].priority, w.jobs[j].seq};
        double t2 = now_ms();
        qsort(q, (size_t)n, sizeof *q, cmp_qkey);
        double t3 = now_ms();
        if (i >= 0) {
            t_plan[i] = t1 - t0;
            t_sort[i] = t3 - t2;
        }
    }
    qsort(t_plan, (size_t)runs, sizeof *t_plan, cmp_double);
    qsort(t_sort, (size_t)runs, sizeof *t_sort, cmp_double);
    double pm = quantile(t_plan, runs, 0.5), p99 = quantile(t_plan, runs, 0.99);
    double sm = quantile(t_sort, runs, 0.5), s99 = quantile(t_sort, runs, 0.99);

    printf("planner on %d jobs, %d keys, %d tenants, %d devices (%d workers), %d running groups, "
           "max_b %d, max_groups_per_device %d; %d runs\n",
           n, shape.n_keys, shape.n_tenants, w.snap.n_devices, shape.n_workers, w.snap.n_running,
           shape.max_b, shape.max_groups_per_device, runs);
    printf("plan: %lld groups, %lld jobs placed, waiting: %lld devices, %lld quota, "
           "%lld workers, %lld too large; %lld running shares changed\n",
           (long long)groups, (long long)placed, (long long)reasons[FB_PLAN_WAIT_DEVICES],
           (long long)reasons[FB_PLAN_QUOTA], (long long)reasons[FB_PLAN_NO_WORKERS],
           (long long)reasons[FB_PLAN_TOO_LARGE], (long long)shares);
    printf("\n%-34s %10s %10s %12s %12s\n", "", "median ms", "p99 ms", "median/50ms",
           "median/sort");
    printf("%-34s %10.3f %10.3f %12.3f %12.1f\n", "fb_plan_run (incl. allocation)", pm, p99,
           pm / BUDGET_MS, sm > 0 ? pm / sm : 0.0);
    printf("%-34s %10.3f %10.3f %12.3f %12.1f\n", "qsort of the queue (reference)", sm, s99,
           sm / BUDGET_MS, 1.0);
    printf("\np99 / budget: %.3f (%s)\n", p99 / BUDGET_MS, p99 <= BUDGET_MS ? "within" : "OVER");
    free(t_plan);
    free(t_sort);
    free(q);
    workload_free(&w);
    return 0;
}
