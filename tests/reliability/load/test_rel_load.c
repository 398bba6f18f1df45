/*
 * Load: 10,000 queued jobs and 100 running arrays (20 in ctest), against
 * the real fuseboxd on the test database.  The arrays run on fake workers
 * (fakeworker.h) that speak the wire protocol, heartbeat and report
 * progress every second (fusebox-worker's defaults), so the control loop
 * writes progress, heartbeats and the queue's plan all the while.  One
 * tenant's jobs fill the cluster: its quota is exactly the fake workers'
 * devices but one (--max-array 2, --max-groups-per-device 1), so two jobs
 * per array run and the rest stay queued.  The queue is inserted with one
 * SQL statement from a job submitted over HTTP (submitting 10,000 jobs one
 * by one would take most of the test's time and measure nothing this test
 * is about).
 *
 * Measured, sequentially, each request on a new connection as curl makes
 * them: the list endpoint (newest first, by state queued and running) and
 * the detail endpoint of random queued and running jobs; p50, p99 and max.
 * And the control loop's decision time: from inside, fuseboxd's histogram
 * of its plans (fusebox_control_loop_seconds, phase "plan", in /metrics:
 * reading the 10,000-job queue, planning, writing the groups, sending them);
 * and from outside, a job of a second tenant is submitted while the one
 * spare device is free, and the time from sending the POST until the ASSIGN
 * reaches a fake worker is taken (the decision plus the NOTIFY wake-up and
 * whatever the loop was busy with when the job came); then the job is
 * cancelled, its array detached, and the next probe goes.  The HTTP p99s
 * and the plan's p99 must be under 50 ms (four times that in a sanitizer
 * build, which slows fuseboxd as much) in the long mode or with "--strict";
 * ctest's short mode runs 20 arrays, holds the HTTP p99s to 20 times the
 * budget and requires every probe to be placed within 10 s.
 * "--long" runs 100 arrays with 1000 samples per endpoint and 50 probes
 * instead of 200 and 15; "--queued N" and "--arrays N" change the scale.
 */
#include <math.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "check.h"
#include "e2e.h"
#include "fakeworker.h"

#define BUDGET_MS 50.0
/* a probe not assigned by then counts as a miss, at this latency */
#define PROBE_WAIT_MS 10000.0

#if defined(__SANITIZE_ADDRESS__)
#define SANITIZED 1
#elif defined(__has_feature)
#if __has_feature(address_sanitizer)
#define SANITIZED 1
#endif
#endif
#ifndef SANITIZED
#define SANITIZED 0
#endif

static e2e T;
static char bulk_tenant[40], bulk_key[128], probe_tenant[40], probe_key[128];

static void sleep_ms(int ms)
{
    struct timespec ts = {ms / 1000, (long)(ms % 1000) * 1000000L};
    nanosleep(&ts, NULL);
}

static int cmp_double(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

typedef struct stats {
    double p50, p99, max;
} stats;

static stats summarize(double *ms, int n)
{
    qsort(ms, (size_t)n, sizeof *ms, cmp_double);
    int i99 = (int)(0.99 * (n - 1) + 0.5);
    return (stats){ms[(n - 1) / 2], ms[i99], ms[n - 1]};
}

/* GETs path n times with key; every answer must be 200. */
static stats time_get(const char *const *paths, int n_paths, const char *key, int n)
{
    double *ms = malloc((size_t)n * sizeof *ms);
    CHECK(ms != NULL);
    char auth[200];
    snprintf(auth, sizeof auth, "Authorization: Bearer %s", key);
    const char *h[] = {auth, NULL};
    for (int i = 0; i < n; i++) {
        const char *path = paths[i % n_paths];
        fbt_resp r;
        double t0 = fbt_now_ms();
        int rc = fbt_http(T.s.port, "GET", path, h, NULL, 0, &r);
        ms[i] = fbt_now_ms() - t0;
        if (rc != 0 || r.status != 200) {
            fprintf(stderr, "GET %s: %d %s\n", path, rc ? 0 : r.status, rc ? "" : r.body);
            CHECK(0);
        }
        fbt_resp_free(&r);
    }
    stats s = summarize(ms, n);
    free(ms);
    return s;
}

/* Paths of the detail endpoint for n random jobs of the bulk tenant in state. */
static char **detail_paths(const char *state, int n)
{
    char sql[256];
    snprintf(sql, sizeof sql,
             "SELECT id FROM jobs WHERE tenant_id = '%s' AND state = '%s' ORDER BY random()"
             " LIMIT %d",
             bulk_tenant, state, n);
    PGresult *r = fbt_sql(&T.s, sql);
    CHECK_INT_EQ(PQntuples(r), n);
    char **paths = calloc((size_t)n, sizeof *paths);
    CHECK(paths != NULL);
    for (int i = 0; i < n; i++) {
        paths[i] = malloc(64);
        CHECK(paths[i] != NULL);
        snprintf(paths[i], 64, "/v1/jobs/%s", PQgetvalue(r, i, 0));
    }
    PQclear(r);
    return paths;
}

static void free_paths(char **p, int n)
{
    for (int i = 0; p && i < n; i++) free(p[i]);
    free(p);
}

static int64_t total_assigned(fw_pool *p, int n, double *last_ms)
{
    int64_t sum = 0;
    double last = 0;
    for (int i = 0; i < n; i++) {
        double t = 0;
        sum += fw_assigned(p, i, &t);
        if (t > last) last = t;
    }
    *last_ms = last;
    return sum;
}

static void wait_for(bool (*cond)(void *), void *arg, int timeout_s, const char *what)
{
    double t0 = fbt_now_ms();
    while (!cond(arg)) {
        if (fbt_now_ms() - t0 > timeout_s * 1000.0) {
            fprintf(stderr, "timed out waiting for %s\n", what);
            e2e_dump(&T);
            CHECK(0);
        }
        sleep_ms(20);
    }
}

typedef struct arrays_arg {
    fw_pool *p;
    int want;
} arrays_arg;

static bool arrays_are(void *arg)
{
    arrays_arg *a = arg;
    return fw_arrays(a->p) == a->want;
}

static int parse_int(int argc, char **argv, int *i)
{
    char *end = NULL;
    long v = *i + 1 < argc ? strtol(argv[*i + 1], &end, 10) : 0;
    if (!end || *end || v < 1 || v > 1000000) {
        fprintf(stderr, "%s: expected a number from 1 to 1000000\n", argv[*i]);
        CHECK(0);
    }
    (*i)++;
    return (int)v;
}

/*
 * The control loop's own decision time: from fuseboxd's histogram
 * fusebox_control_loop_seconds{phase="plan"} in /metrics, the upper bound of
 * the bucket that holds the 99th percentile (and the count and mean).
 */
typedef struct plan_time {
    long long count;
    double mean_ms, p99_le_ms; /* p99_le_ms: INFINITY when beyond the last bound */
} plan_time;

static plan_time read_plan_time(void)
{
    fbt_resp r = fbt_call(&T.s, "GET", "/metrics", NULL, NULL);
    CHECK(r.status == 200 && r.body != NULL);
    double le[64];
    long long cum[64];
    int n = 0;
    double sum = 0;
    long long count = 0;
    for (const char *line = r.body, *nl; line && *line; line = nl ? nl + 1 : NULL) {
        nl = strchr(line, '\n');
        static const char bucket[] = "fusebox_control_loop_seconds_bucket{phase=\"plan\",le=\"";
        static const char sum_k[] = "fusebox_control_loop_seconds_sum{phase=\"plan\"} ";
        static const char count_k[] = "fusebox_control_loop_seconds_count{phase=\"plan\"} ";
        if (strncmp(line, bucket, sizeof bucket - 1) == 0 && n < 64) {
            const char *v = line + sizeof bucket - 1;
            le[n] = strncmp(v, "+Inf", 4) == 0 ? INFINITY : strtod(v, NULL);
            const char *c = strchr(v, '}');
            CHECK(c != NULL);
            cum[n++] = strtoll(c + 1, NULL, 10);
        } else if (strncmp(line, sum_k, sizeof sum_k - 1) == 0) {
            sum = strtod(line + sizeof sum_k - 1, NULL);
        } else if (strncmp(line, count_k, sizeof count_k - 1) == 0) {
            count = strtoll(line + sizeof count_k - 1, NULL, 10);
        }
    }
    fbt_resp_free(&r);
    CHECK(n > 0 && count > 0 && cum[n - 1] == count);
    plan_time pt = {.count = count, .mean_ms = 1e3 * sum / (double)count, .p99_le_ms = INFINITY};
    for (int i = 0; i < n; i++)
        if ((double)cum[i] >= 0.99 * (double)count) {
            pt.p99_le_ms = 1e3 * le[i];
            break;
        }
    return pt;
}

/* The plans fuseboxd logged as slow, with where their time went (up to 8 of them). */
static void print_slow_plans(const char *log_path)
{
    FILE *f = fopen(log_path, "r");
    if (!f) return;
    char line[4096];
    int n = 0;
    while (fgets(line, sizeof line, f))
        if (strstr(line, "\"a slow plan\"") && n++ < 8) printf("slow plan: %s", line);
    fclose(f);
    printf("plans logged as slow (over 100 ms): %d\n", n);
}

int main(int argc, char **argv)
{
    setvbuf(stdout, NULL, _IONBF, 0); /* the numbers reach the log even when a check aborts */
    int queued = 10000, arrays = 20, samples = 200, probes = 15;
    bool strict = false;
    const char *long_env = getenv("FUSEBOX_RELIABILITY_LONG");
    bool long_mode = long_env && strcmp(long_env, "1") == 0;
    for (int i = 1; i < argc; i++) {
        if (strcmp(argv[i], "--long") == 0) {
            long_mode = true;
        } else if (strcmp(argv[i], "--strict") == 0) {
            strict = true;
        } else if (strcmp(argv[i], "--queued") == 0) {
            queued = parse_int(argc, argv, &i);
        } else if (strcmp(argv[i], "--arrays") == 0) {
            arrays = parse_int(argc, argv, &i);
        } else {
            fprintf(stderr, "usage: %s [--long] [--strict] [--queued N] [--arrays N]\n",
                    argv[0]);
            CHECK(0);
        }
    }
    if (long_mode) {
        samples = 1000;
        probes = 50;
        strict = true;
        bool arrays_given = false;
        for (int i = 1; i < argc; i++) arrays_given = arrays_given || !strcmp(argv[i], "--arrays");
        if (!arrays_given) arrays = 100;
    }
    double bound = SANITIZED ? 4 * BUDGET_MS : BUDGET_MS;
    /* CI shares two cores with builds and other suites: there the test holds
     * fuseboxd to 20 times the budget and reports the ratio; the long mode
     * (and --strict) holds it to the budget itself */
    double limit = strict ? bound : 20 * bound;
    /* fuseboxd's and fusebox-worker's default cadences (the e2e helpers'
     * faster ones are for tests of a few processes) */
    const char *flags[] = {"--max-array",    "2",    "--max-groups-per-device", "1",
                           "--heartbeat-ms", "1000", "--heartbeat-timeout-ms",  "5000",
                           "--tick-ms",      "500",  NULL};
    e2e_start(&T, flags);
    /* no quota or rate limit of the defaults may cut the load short */
    char extra[256];
    snprintf(extra, sizeof extra,
             "\"quotas\": {\"max_queued_jobs\": 1000000, \"max_devices\": %d}, \"rate_limit\":"
             " {\"requests_per_second\": 100000, \"burst\": 100000}",
             arrays);
    fbt_tenant(&T.s, "bulk", extra, bulk_tenant, sizeof bulk_tenant, bulk_key, sizeof bulk_key);
    fbt_tenant(&T.s, "probe",
               "\"rate_limit\": {\"requests_per_second\": 100000, \"burst\": 100000}",
               probe_tenant, sizeof probe_tenant, probe_key, sizeof probe_key);

    /* the queue: one job over HTTP, the rest copies of its row */
    char id[64], sql[1024];
    snprintf(id, sizeof id, "%s", e2e_submit(&T, bulk_key, e2e_spec("bulk", 0.001, 1000000, 0)));
    double t0 = fbt_now_ms();
    snprintf(sql, sizeof sql,
             "INSERT INTO jobs (tenant_id, name, spec, fusion_key, dataset, n_params,"
             " flops_per_sample, priority, steps, epochs, max_restarts)"
             " SELECT tenant_id, name || '-' || g, spec, fusion_key, dataset, n_params,"
             " flops_per_sample, priority, steps, epochs, max_restarts FROM jobs,"
             " generate_series(1, %d) g WHERE id = '%s'",
             queued + 2 * arrays - 1, id);
    PQclear(fbt_sql(&T.s, sql));
    printf("%d jobs inserted in %.0f ms\n", queued + 2 * arrays, fbt_now_ms() - t0);

    char endpoint[64];
    snprintf(endpoint, sizeof endpoint, "tcp://127.0.0.1:%d", T.worker_port);
    int n_fake = arrays + 1;
    t0 = fbt_now_ms();
    fw_pool *pool = fw_start(endpoint, T.server_pub, T.worker_key, "fake", n_fake, 1000, 1000);
    arrays_arg aa = {pool, arrays};
    wait_for(arrays_are, &aa, 180, "the arrays on the fake workers");
    snprintf(sql, sizeof sql,
             "SELECT count(*) FILTER (WHERE state = 'running') = %d AND count(*) FILTER"
             " (WHERE state = 'queued') = %d FROM jobs WHERE tenant_id = '%s'",
             2 * arrays, queued, bulk_tenant);
    e2e_wait_sql(&T, sql, 120, "the arrays' jobs running and the rest queued");
    printf("%d arrays running on %d fake workers, %d jobs queued, after %.0f ms\n", arrays, n_fake,
           queued, fbt_now_ms() - t0);
    /* a few progress reports of every array first */
    sleep_ms(1500);

    const char *lists[] = {"/v1/jobs?limit=50", "/v1/jobs?state=queued&limit=50",
                           "/v1/jobs?state=running&limit=50", "/v1/jobs?state=queued&limit=200"};
    stats list = time_get(lists, 4, bulk_key, samples);
    int n_q = queued < 100 ? queued : 100;
    char **qd = detail_paths("queued", n_q), **rd = detail_paths("running", 2 * arrays);
    stats dq = time_get((const char *const *)qd, n_q, bulk_key, samples);
    stats dr = time_get((const char *const *)rd, 2 * arrays, bulk_key, samples);
    free_paths(qd, n_q);
    free_paths(rd, 2 * arrays);

    /* decisions: a probe job on the one spare device, then cancelled */
    int missed = 0;
    double *decide = malloc((size_t)probes * sizeof *decide);
    CHECK(decide != NULL);
    for (int k = 0; k < probes; k++) {
        double last;
        int64_t before = total_assigned(pool, n_fake, &last);
        char name[32];
        snprintf(name, sizeof name, "probe-%d", k);
        const char *spec = e2e_spec(name, 0.001, 1000000, 0);
        double sent = fbt_now_ms();
        char pid[64];
        snprintf(pid, sizeof pid, "%s", e2e_submit(&T, probe_key, spec));
        bool placed = true;
        while (total_assigned(pool, n_fake, &last) == before) {
            if (fbt_now_ms() - sent > PROBE_WAIT_MS) {
                placed = false;
                break;
            }
            sleep_ms(1);
        }
        decide[k] = placed ? last - sent : PROBE_WAIT_MS;
        missed += !placed;
        printf("probe %d: %s %.1f ms\n", k, placed ? "assigned after" : "NOT assigned within",
               decide[k]);
        char path[128];
        snprintf(path, sizeof path, "/v1/jobs/%s/cancel", pid);
        fbt_resp r = fbt_call(&T.s, "POST", path, probe_key, NULL);
        CHECK(r.status == 200 || r.status == 202);
        fbt_resp_free(&r);
        if (placed) wait_for(arrays_are, &aa, 30, "the probe's array to be detached");
        /* its device is free again once its array is finished */
        snprintf(sql, sizeof sql,
                 "SELECT (SELECT count(*) = 0 FROM jobs WHERE tenant_id = '%s' AND (in_group OR"
                 " state <> 'cancelled')) AND (SELECT count(*) = %d FROM groups"
                 " WHERE state <> 'finished')",
                 probe_tenant, arrays);
        e2e_wait_sql(&T, sql, 30, "the probe's array to finish");
    }
    stats dec = summarize(decide, probes);
    free(decide);

    printf("| endpoint | samples | p50 ms | p99 ms | max ms | p99 / %.0f ms budget |\n", bound);
    printf("|---|---|---|---|---|---|\n");
    printf("| GET /v1/jobs (4 list queries) | %d | %.1f | %.1f | %.1f | %.2f |\n", samples,
           list.p50, list.p99, list.max, list.p99 / bound);
    printf("| GET /v1/jobs/{id} queued | %d | %.1f | %.1f | %.1f | %.2f |\n", samples, dq.p50,
           dq.p99, dq.max, dq.p99 / bound);
    printf("| GET /v1/jobs/{id} running | %d | %.1f | %.1f | %.1f | %.2f |\n", samples, dr.p50,
           dr.p99, dr.max, dr.p99 / bound);
    printf("| submit to ASSIGN (decision) | %d | %.1f | %.1f | %.1f | %.2f |\n", probes, dec.p50,
           dec.p99, dec.max, dec.p99 / bound);
    plan_time pt = read_plan_time();
    printf("| control loop: one plan (fusebox_control_loop_seconds, phase plan) | %lld | mean %.1f"
           " | <= %.0f | | %.2f |\n",
           pt.count, pt.mean_ms, pt.p99_le_ms, pt.p99_le_ms / bound);
    int64_t bad = fw_bad_messages(pool), stale = fw_stale_arrays(pool);
    printf("result: load queued=%d arrays=%d list_p99_ms=%.1f detail_p99_ms=%.1f"
           " decision_p99_ms=%.1f decisions_missed=%d arrays_taken_from_live_workers=%lld"
           " bound_ms=%.0f bad_wire_messages=%lld plans=%lld plan_p99_le_ms=%.0f\n",
           queued, arrays, list.p99, dq.p99 > dr.p99 ? dq.p99 : dr.p99, dec.p99, missed,
           (long long)stale, bound, (long long)bad, pt.count, pt.p99_le_ms);
    CHECK_INT_EQ(bad, 0);
    CHECK_INT_EQ(missed, 0);
    CHECK_INT_EQ(stale, 0);
    printf("held to p99 < %.0f ms (%s)\n", limit,
           strict ? "strict" : "CI: HTTP to 20 x the budget, decisions only to arrive within 10 s");
    CHECK(list.p99 < limit);
    CHECK(dq.p99 < limit);
    CHECK(dr.p99 < limit);
    /* the decision itself, timed inside the control loop, is held to the budget in
     * the strict mode; submit to ASSIGN also waits for whatever the loop was doing
     * when the job came (a progress flush, a fair-share period): it need only come
     * (missed above), docs/RELIABILITY.md has its numbers */
    print_slow_plans(T.s.log_path);
    if (strict) CHECK(pt.p99_le_ms <= limit);
    fw_stop(pool);
    e2e_finish(&T);
    printf("ok\n");
    return 0;
}
