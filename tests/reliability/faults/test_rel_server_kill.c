/*
 * Rounds of SIGKILL on fuseboxd under a steady submission load, end to end
 * on real processes.  Two client threads submit jobs without pause, each
 * with an Idempotency-Key of its own, and retry a key (same key, same body)
 * on a broken connection, a 5xx or a 429 until it is answered 201 (created)
 * or 200 (replayed: an earlier attempt was committed but its answer was
 * lost with the server).  Meanwhile the main thread kills fuseboxd with
 * SIGKILL at a random moment, restarts it on the same database and
 * measures the time from the kill to /readyz answering 200.  A worker trains
 * an array throughout, so the control loop dies mid-work too.  Counted:
 * acknowledged jobs missing from the database (every 201 and 200 must be
 * there, under the id the client was given), duplicates (jobs per key
 * beyond one), jobs the clients never heard of, and the recovery times.
 * Short mode 3 rounds, long mode 10.
 */
#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "check.h"
#include "rel.h"

#define N_CLIENTS 2
#define MAX_KEYS 20000 /* per client */

static e2e T;
static char tenant[40], key[128];
static pthread_mutex_t port_lock = PTHREAD_MUTEX_INITIALIZER;
static int port; /* fuseboxd's HTTP port: it changes with every restart */
static atomic_bool stop;

typedef struct submitted {
    char id[40];
    int status; /* 201 or 200 */
} submitted;

typedef struct client {
    int index;
    submitted *keys; /* [MAX_KEYS] */
    int n_keys;      /* keys answered */
    int retries;     /* attempts beyond the first */
} client;

static client clients[N_CLIENTS];

static int current_port(void)
{
    pthread_mutex_lock(&port_lock);
    int p = port;
    pthread_mutex_unlock(&port_lock);
    return p;
}

static void key_name(char *buf, size_t cap, int c, int k) { snprintf(buf, cap, "c%d-%05d", c, k); }

/* Submits key k of client c until it is answered 201 or 200. */
static void submit_key(client *c, int k)
{
    char auth[200], idem[80], name[32];
    key_name(name, sizeof name, c->index, k);
    snprintf(auth, sizeof auth, "Authorization: Bearer %s", key);
    snprintf(idem, sizeof idem, "Idempotency-Key: %s", name);
    const char *h[] = {auth, "Content-Type: application/json", idem, NULL};
    const char *body = e2e_spec(name, 0.001, 10, 0);
    for (int attempt = 0;; attempt++) {
        CHECK(attempt < 2000); /* 2000 attempts 10 ms apart: fuseboxd stayed away 20 s */
        if (attempt) c->retries++;
        fbt_resp r;
        int rc = fbt_http(current_port(), "POST", "/v1/jobs", h, body, strlen(body), &r);
        if (rc == 0 && (r.status == 201 || r.status == 200)) {
            const char *id = json_string_value(json_object_get(r.json, "id"));
            CHECK(id != NULL);
            snprintf(c->keys[k].id, sizeof c->keys[k].id, "%s", id);
            c->keys[k].status = r.status;
            fbt_resp_free(&r);
            return;
        }
        /* anything else but a restart's symptoms is a failure */
        if (rc == 0 && r.status != 0 && r.status != 429 && r.status < 500) {
            fprintf(stderr, "%s: unexpected %d: %s\n", name, r.status, r.body ? r.body : "");
            CHECK(0);
        }
        if (rc == 0) fbt_resp_free(&r);
        rel_sleep_ms(10);
    }
}

static void *client_main(void *arg)
{
    client *c = arg;
    while (!atomic_load(&stop) && c->n_keys < MAX_KEYS) {
        submit_key(c, c->n_keys);
        c->n_keys++;
    }
    return NULL;
}

/* A PostgreSQL array literal of the clients' keys (what = 0) or ids (1). */
static char *array_literal(int what)
{
    size_t cap = 16, len = 0;
    for (int c = 0; c < N_CLIENTS; c++) cap += (size_t)clients[c].n_keys * 48;
    char *s = malloc(cap);
    CHECK(s != NULL);
    len += (size_t)snprintf(s + len, cap - len, "{");
    for (int c = 0; c < N_CLIENTS; c++)
        for (int k = 0; k < clients[c].n_keys; k++) {
            char name[32];
            key_name(name, sizeof name, c, k);
            len += (size_t)snprintf(s + len, cap - len, "%s%s", len > 1 ? "," : "",
                                    what ? clients[c].keys[k].id : name);
        }
    snprintf(s + len, cap - len, "}");
    return s;
}

int main(int argc, char **argv)
{
    setvbuf(stdout, NULL, _IONBF, 0); /* the numbers reach the log even when a check aborts */
    int rounds = rel_rounds(argc, argv, 3, 10);
    const char *seed_env = getenv("FUSEBOX_RELIABILITY_SEED");
    unsigned seed = seed_env ? (unsigned)strtoul(seed_env, NULL, 10) : (unsigned)time(NULL);
    printf("%d rounds, seed %u (FUSEBOX_RELIABILITY_SEED repeats a run)\n", rounds, seed);
    srand(seed);
    e2e_start(&T, NULL);
    /* the load would hit the default queue quota and rate limit within seconds */
    fbt_tenant(&T.s, "load",
               "\"quotas\": {\"max_queued_jobs\": 1000000}, \"rate_limit\":"
               " {\"requests_per_second\": 100000, \"burst\": 100000}",
               tenant, sizeof tenant, key, sizeof key);
    pid_t worker = e2e_worker(&T, "w0");
    char ids[2][64], names[2][64];
    rel_sweep(&T, "busy", 256, 128, 0, 100000000, 1000, "[0.002, 0.01]", 2, ids, names);
    e2e_wait_state(&T, T.key, ids[0], "running", 60);

    port = T.s.port;
    pthread_t th[N_CLIENTS];
    for (int c = 0; c < N_CLIENTS; c++) {
        clients[c].index = c;
        clients[c].keys = calloc(MAX_KEYS, sizeof *clients[c].keys);
        CHECK(clients[c].keys != NULL);
        CHECK(pthread_create(&th[c], NULL, client_main, &clients[c]) == 0);
    }
    double worst_ms = 0, sum_ms = 0;
    for (int r = 0; r < rounds; r++) {
        rel_sleep_ms(300 + rand() % 1000);
        int before = clients[0].n_keys + clients[1].n_keys;
        double t0 = fbt_now_ms();
        kill(T.s.pid, SIGKILL);
        int st;
        CHECK(waitpid(T.s.pid, &st, 0) == T.s.pid);
        CHECK(WIFSIGNALED(st) && WTERMSIG(st) == SIGKILL); /* it was running until the kill */
        e2e_restart_server(&T); /* returns when /readyz answers 200 */
        double ms = fbt_now_ms() - t0;
        pthread_mutex_lock(&port_lock);
        port = T.s.port;
        pthread_mutex_unlock(&port_lock);
        if (ms > worst_ms) worst_ms = ms;
        sum_ms += ms;
        printf("round %d: fuseboxd killed after %d acknowledged submissions, ready again in"
               " %.0f ms\n",
               r, before, ms);
    }
    rel_sleep_ms(300); /* some submissions after the last restart too */
    atomic_store(&stop, true);
    for (int c = 0; c < N_CLIENTS; c++) CHECK(pthread_join(th[c], NULL) == 0);

    int acked = 0, created = 0, replayed = 0, retries = 0;
    for (int c = 0; c < N_CLIENTS; c++) {
        acked += clients[c].n_keys;
        retries += clients[c].retries;
        for (int k = 0; k < clients[c].n_keys; k++) {
            created += clients[c].keys[k].status == 201;
            replayed += clients[c].keys[k].status == 200;
        }
    }
    char *keys = array_literal(0), *idl = array_literal(1);
    size_t cap = strlen(keys) + strlen(idl) + 1024;
    char *sql = malloc(cap);
    CHECK(sql != NULL);
    /* acknowledged and present under the id the client was given */
    snprintf(sql, cap,
             "SELECT count(*) FROM unnest('%s'::text[], '%s'::uuid[]) AS x(k, i) JOIN jobs j ON"
             " j.id = x.i AND j.idempotency_key = x.k AND j.tenant_id = '%s'",
             keys, idl, tenant);
    long long present = rel_sql_ll(&T, sql);
    snprintf(sql, cap,
             "SELECT count(*) - count(DISTINCT idempotency_key) FROM jobs WHERE tenant_id = '%s'",
             tenant);
    long long duplicates = rel_sql_ll(&T, sql);
    snprintf(sql, cap, "SELECT count(*) FROM jobs WHERE tenant_id = '%s'", tenant);
    long long in_db = rel_sql_ll(&T, sql);
    free(sql);
    free(keys);
    free(idl);
    long long lost = acked - present;
    long long unknown = in_db - present;
    printf("result: server-sigkill rounds=%d acknowledged=%d (201: %d, replayed 200: %d)"
           " retries=%d lost=%lld duplicates=%lld unknown=%lld ready_ms_mean=%.0f"
           " ready_ms_max=%.0f\n",
           rounds, acked, created, replayed, retries, lost, duplicates, unknown,
           sum_ms / rounds, worst_ms);
    CHECK(acked > 0);
    CHECK_INT_EQ(lost, 0);
    CHECK_INT_EQ(duplicates, 0);
    CHECK_INT_EQ(unknown, 0);
    /* the array survived the restarts: still running, never sent back to the queue */
    CHECK_STR_EQ(e2e_job_field(&T, T.key, ids[0], "state"), "running");
    char q[256];
    snprintf(q, sizeof q,
             "SELECT count(*) FROM job_events WHERE job_id = '%s' AND kind = 'requeued'", ids[0]);
    CHECK_INT_EQ(rel_sql_ll(&T, q), 0);
    for (int c = 0; c < N_CLIENTS; c++) free(clients[c].keys);
    CHECK_INT_EQ(e2e_kill(worker, SIGKILL), 128 + SIGKILL);
    e2e_finish(&T);
    printf("ok\n");
    return 0;
}
