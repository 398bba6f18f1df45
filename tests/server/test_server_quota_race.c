/*
 * Every counted limit holds exactly under concurrency.  For each, at least 32
 * clients, each a thread with a connection of its own, are released together
 * by a barrier against a fuseboxd with 32 HTTP threads and 32 database
 * connections, so that the requests really run side by side; the test then
 * asserts exactly as many accepted as the limit leaves, every other one
 * refused with the documented code, and the database holding exactly what
 * was accepted.  Each race runs ROUNDS times on new tenants:
 *
 *   - max_queued_jobs, by job submissions (32 for a quota of 5);
 *   - max_queued_jobs, by sweeps of 2 trials (32 for a quota of 10);
 *   - max_queued_jobs, by jobs and sweeps together (16 + 16 for 9);
 *   - one Idempotency-Key submitted 32 times at once: one job;
 *   - the 100 active API keys of a tenant (40 creations with 90 held);
 *   - the rate limit's burst (32 requests for a burst of 7 at 0.001/s).
 */
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "check.h"
#include "harness.h"

#define N_CLIENTS 32
#define MAX_CLIENTS 64
#define ROUNDS 4

static fbt_server S;

typedef struct call {
    const char *method;
    char path[160];
    const char *key;
    const char *body;
    const char *header; /* an extra header line, or NULL */
    pthread_barrier_t *go;
    int status;
    char code[48];
} call;

static void *call_main(void *arg)
{
    call *c = arg;
    char auth[200];
    snprintf(auth, sizeof auth, "Authorization: Bearer %s", c->key);
    const char *h[4] = {auth, NULL, NULL, NULL};
    int n = 1;
    if (c->body) h[n++] = "Content-Type: application/json";
    if (c->header) h[n++] = c->header;
    fbt_resp r;
    pthread_barrier_wait(c->go);
    int rc = fbt_http(S.port, c->method, c->path, h, c->body, c->body ? strlen(c->body) : 0, &r);
    c->status = rc == 0 ? r.status : 0;
    json_t *e = json_object_get(r.json, "error");
    snprintf(c->code, sizeof c->code, "%s", e ? json_string_value(json_object_get(e, "code")) : "");
    if (rc == 0) fbt_record(c->method, c->path, &r);
    fbt_resp_free(&r);
    return NULL;
}

/* Runs the n calls at once and waits for all of them. */
static void race(call *calls, int n)
{
    pthread_t th[MAX_CLIENTS];
    pthread_barrier_t go;
    CHECK(n <= MAX_CLIENTS);
    pthread_barrier_init(&go, NULL, (unsigned)n);
    for (int i = 0; i < n; i++) {
        calls[i].go = &go;
        CHECK(pthread_create(&th[i], NULL, call_main, &calls[i]) == 0);
    }
    for (int i = 0; i < n; i++)
        pthread_join(th[i], NULL);
    pthread_barrier_destroy(&go);
}

/* How many of the calls answered status (and code, when not NULL). */
static int count(const call *calls, int n, int status, const char *code)
{
    int k = 0;
    for (int i = 0; i < n; i++)
        if (calls[i].status == status && (!code || strcmp(calls[i].code, code) == 0)) k++;
    return k;
}

/* Fails unless every call answered one of the two statuses; prints the tally. */
static void expect_split(const char *what, const call *calls, int n, int ok_status, int want_ok,
                         int refused_status, const char *refused_code)
{
    int ok = count(calls, n, ok_status, NULL);
    int refused = count(calls, n, refused_status, refused_code);
    printf("%s: %d answered %d, %d answered %d %s (want %d and %d)\n", what, ok, ok_status, refused,
           refused_status, refused_code ? refused_code : "", want_ok, n - want_ok);
    if (ok + refused != n) {
        for (int i = 0; i < n; i++)
            if (calls[i].status != ok_status && calls[i].status != refused_status)
                fprintf(stderr, "  client %d: %d %s\n", i, calls[i].status, calls[i].code);
    }
    CHECK_INT_EQ(ok + refused, n);
    CHECK_INT_EQ(ok, want_ok);
}

static long long sql_count(const char *fmt, const char *tenant)
{
    char sql[512];
    snprintf(sql, sizeof sql, fmt, tenant);
    return atoll(fbt_sql_value(&S, sql));
}

static const char sql_queued[] =
    "SELECT count(*) FROM jobs WHERE tenant_id = '%s' AND state = 'queued'";
static const char sql_counted[] =
    "SELECT coalesce(sum(n), 0) FROM tenant_queued_counts WHERE tenant_id = '%s'";

/* A sweep of two trials (named name). */
#define SWEEP2(name)                                                                               \
    "{\"base\": {\"name\": \"" name "\", \"dataset\": \"fashion-mnist\","                          \
    " \"model\": {\"input\": [1, 28, 28], \"layers\": [{\"type\": \"flatten\"},"                   \
    " {\"type\": \"linear\", \"out\": 10}]}, \"batch_size\": 32, \"steps\": 100,"                  \
    " \"optimizer\": {\"type\": \"sgd\", \"lr\": 0.01}},"                                          \
    " \"search\": {\"type\": \"grid\", \"params\": {\"seed\": {\"values\": [1, 2]}}}}"

static int round_no; /* tenants are new in every round */

static const char *quota_tenant(const char *name, int max_queued, char *id, size_t id_cap,
                                char *key, size_t key_cap)
{
    char extra[256], unique[64];
    snprintf(unique, sizeof unique, "%s-%d", name, round_no);
    snprintf(extra, sizeof extra,
             "\"quotas\": {\"max_queued_jobs\": %d},"
             " \"rate_limit\": {\"requests_per_second\": 1000, \"burst\": 1000}",
             max_queued);
    fbt_tenant(&S, unique, extra, id, id_cap, key, key_cap);
    return key;
}

static void test_jobs(void)
{
    char id[64], key[128];
    quota_tenant("jobs", 5, id, sizeof id, key, sizeof key);
    static char specs[N_CLIENTS][1024];
    call calls[N_CLIENTS];
    memset(calls, 0, sizeof calls);
    for (int i = 0; i < N_CLIENTS; i++) {
        char name[32];
        snprintf(name, sizeof name, "race-%d", i);
        snprintf(specs[i], sizeof specs[i], "%s", fbt_spec(name, 0.01));
        calls[i] = (call){.method = "POST", .path = "/v1/jobs", .key = key, .body = specs[i]};
    }
    race(calls, N_CLIENTS);
    expect_split("32 submissions, max_queued_jobs 5", calls, N_CLIENTS, 201, 5, 403,
                 "quota_exceeded");
    CHECK_INT_EQ(sql_count(sql_queued, id), 5);
    CHECK_INT_EQ(sql_count(sql_counted, id), 5);
    CHECK_INT_EQ(sql_count("SELECT count(*) FROM job_events e JOIN jobs j ON j.id = e.job_id"
                           " WHERE j.tenant_id = '%s' AND e.kind = 'submitted'",
                           id),
                 5);
}

static void test_sweeps(void)
{
    char id[64], key[128];
    quota_tenant("sweeps", 10, id, sizeof id, key, sizeof key);
    call calls[N_CLIENTS];
    memset(calls, 0, sizeof calls);
    for (int i = 0; i < N_CLIENTS; i++)
        calls[i] = (call){.method = "POST", .path = "/v1/sweeps", .key = key, .body = SWEEP2("s")};
    race(calls, N_CLIENTS);
    expect_split("32 sweeps of 2 trials, max_queued_jobs 10", calls, N_CLIENTS, 201, 5, 403,
                 "quota_exceeded");
    CHECK_INT_EQ(sql_count(sql_queued, id), 10);
    CHECK_INT_EQ(sql_count(sql_counted, id), 10);
    CHECK_INT_EQ(sql_count("SELECT count(*) FROM sweeps WHERE tenant_id = '%s'", id), 5);
}

static void test_jobs_and_sweeps(void)
{
    char id[64], key[128];
    quota_tenant("mixed", 9, id, sizeof id, key, sizeof key);
    static char specs[N_CLIENTS][1024];
    call calls[N_CLIENTS];
    memset(calls, 0, sizeof calls);
    for (int i = 0; i < N_CLIENTS; i++) {
        if (i % 2) {
            calls[i] =
                (call){.method = "POST", .path = "/v1/sweeps", .key = key, .body = SWEEP2("m")};
            continue;
        }
        char name[32];
        snprintf(name, sizeof name, "mixed-%d", i);
        snprintf(specs[i], sizeof specs[i], "%s", fbt_spec(name, 0.01));
        calls[i] = (call){.method = "POST", .path = "/v1/jobs", .key = key, .body = specs[i]};
    }
    race(calls, N_CLIENTS);
    int jobs = 0, sweeps = 0, refused_job = 0;
    for (int i = 0; i < N_CLIENTS; i++) {
        if (calls[i].status == 201) {
            if (i % 2)
                sweeps++;
            else
                jobs++;
        } else {
            if (calls[i].status != 403 || strcmp(calls[i].code, "quota_exceeded") != 0)
                fprintf(stderr, "  client %d: %d %s\n", i, calls[i].status, calls[i].code);
            CHECK_INT_EQ(calls[i].status, 403);
            CHECK_STR_EQ(calls[i].code, "quota_exceeded");
            if (!(i % 2)) refused_job++;
        }
    }
    long long queued = sql_count(sql_queued, id);
    printf("16 jobs and 16 sweeps of 2, max_queued_jobs 9: %d jobs and %d sweeps accepted, %lld "
           "queued\n",
           jobs, sweeps, queued);
    /* what was accepted is what is queued, never more than the quota, and a
     * job is refused only when not even one more fits */
    CHECK_INT_EQ(queued, jobs + 2 * sweeps);
    CHECK_INT_EQ(sql_count(sql_counted, id), queued);
    CHECK(queued <= 9 && queued >= 8);
    if (refused_job) CHECK_INT_EQ(queued, 9);
}

static void test_idempotency(void)
{
    char id[64], key[128];
    quota_tenant("idem", 5, id, sizeof id, key, sizeof key);
    call calls[N_CLIENTS];
    memset(calls, 0, sizeof calls);
    static char spec[1024];
    snprintf(spec, sizeof spec, "%s", fbt_spec("once", 0.01));
    for (int i = 0; i < N_CLIENTS; i++)
        calls[i] = (call){.method = "POST",
                          .path = "/v1/jobs",
                          .key = key,
                          .body = spec,
                          .header = "Idempotency-Key: race-once"};
    race(calls, N_CLIENTS);
    expect_split("one Idempotency-Key 32 times", calls, N_CLIENTS, 201, 1, 200, NULL);
    CHECK_INT_EQ(sql_count("SELECT count(*) FROM jobs WHERE tenant_id = '%s'", id), 1);
    CHECK_INT_EQ(sql_count(sql_counted, id), 1);
}

static void test_keys(void)
{
    char id[64], key[128];
    quota_tenant("keys", 1000, id, sizeof id, key, sizeof key);
    /* 89 more keys beside the one fbt_tenant made: 90 active, 10 left; a
     * revoked one does not count */
    char sql[512];
    snprintf(sql, sizeof sql,
             "INSERT INTO api_keys (key_id, tenant_id, secret_hash, revoked_at)"
             " SELECT 'e%d' || lpad(to_hex(g), 14, '0'), '%s', sha256(g::text::bytea),"
             " CASE WHEN g > 89 THEN now() END FROM generate_series(1, 95) g",
             round_no, id);
    PQclear(fbt_sql(&S, sql));
    enum { N = 40 };
    call calls[N];
    memset(calls, 0, sizeof calls);
    for (int i = 0; i < N; i++) {
        calls[i] = (call){.method = "POST", .key = key};
        snprintf(calls[i].path, sizeof calls[i].path, "/v1/tenants/%s/keys", id);
    }
    race(calls, N);
    expect_split("40 key creations, 90 of 100 active", calls, N, 201, 10, 403, "quota_exceeded");
    CHECK_INT_EQ(sql_count("SELECT count(*) FROM api_keys WHERE tenant_id = '%s'"
                           " AND revoked_at IS NULL",
                           id),
                 100);
}

static void test_rate(void)
{
    char id[64], key[128];
    /* 0.001 requests/s: the bucket refills one token in 1000 s, so only the
     * burst can pass within the test */
    char name[32];
    snprintf(name, sizeof name, "rate-%d", round_no);
    fbt_tenant(&S, name, "\"rate_limit\": {\"requests_per_second\": 0.001, \"burst\": 7}", id,
               sizeof id, key, sizeof key);
    call calls[N_CLIENTS];
    memset(calls, 0, sizeof calls);
    for (int i = 0; i < N_CLIENTS; i++)
        calls[i] = (call){.method = "GET", .path = "/v1/tenant", .key = key};
    race(calls, N_CLIENTS);
    expect_split("32 requests, burst 7", calls, N_CLIENTS, 200, 7, 429, "rate_limited");
}

static const struct {
    const char *name;
    void (*fn)(void);
} limits[] = {
    {"jobs", test_jobs},
    {"sweeps", test_sweeps},
    {"mixed", test_jobs_and_sweeps},
    {"idempotency", test_idempotency},
    {"keys", test_keys},
    {"rate", test_rate},
};

/* With an argument, runs only the limits of that name. */
int main(int argc, char **argv)
{
    setvbuf(stdout, NULL, _IOLBF, 0);
    fbt_require_database();
    fbt_db_create(&S);
    const char *args[] = {"--threads", "32", "--db-pool", "32", NULL};
    fbt_server_start(&S, args);
    /* a race is won or lost by timing: each is run several times, so that a
     * limit that does not hold is seen to fail, while one that holds passes
     * every round whatever the order */
    for (round_no = 0; round_no < ROUNDS; round_no++)
        for (size_t i = 0; i < sizeof limits / sizeof limits[0]; i++)
            if (argc < 2 || strcmp(argv[1], limits[i].name) == 0) limits[i].fn();
    CHECK_INT_EQ(fbt_server_stop(&S), 0);
    fbt_db_drop(&S);
    int v = fbt_validate_recorded();
    CHECK(v == 0 || v == 77);
    printf("ok: every limit held exactly\n");
    return 0;
}
