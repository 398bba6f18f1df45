/*
 * 200 concurrent job submissions, each with its own Idempotency-Key and
 * each retried (once unconditionally, as a client would after a lost
 * response, and again on 429/503 or a broken connection), plus 50 more
 * threads racing the first 50 keys at the same moment.  Afterwards there
 * are exactly 200 jobs, one per key, every client holds the id stored for
 * its key, and exactly one request per key got 201.
 */
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "check.h"
#include "harness.h"

#define N_KEYS 200
#define N_RACERS 50
#define N_THREADS (N_KEYS + N_RACERS)

static fbt_server S;
static char tenant_id[64], key[128];
static pthread_barrier_t start;

typedef struct client {
    int key_index;
    char ids[2][64]; /* first submission, deliberate retry */
    int created;     /* 201 answers */
    int attempts;
} client;

static client clients[N_THREADS];

/* Sends one submission until it gets an answer that is not a retry signal. */
static void submit(client *c, char *id_out)
{
    char auth[200], idem[64], name[32];
    snprintf(auth, sizeof auth, "Authorization: Bearer %s", key);
    snprintf(idem, sizeof idem, "Idempotency-Key: conc-%03d", c->key_index);
    snprintf(name, sizeof name, "conc-%03d", c->key_index);
    const char *h[] = {auth, "Content-Type: application/json", idem, NULL};
    const char *body = fbt_spec(name, 0.001 * (c->key_index + 1));
    int backoff = 10;
    for (int attempt = 0; attempt < 100; attempt++) {
        c->attempts++;
        fbt_resp r;
        int rc = fbt_http(S.port, "POST", "/v1/jobs", h, body, strlen(body), &r);
        if (rc == 0) fbt_record("POST", "/v1/jobs", &r);
        if (rc == 0 && (r.status == 201 || r.status == 200)) {
            if (r.status == 201) c->created++;
            snprintf(id_out, 64, "%s", json_string_value(json_object_get(r.json, "id")));
            fbt_resp_free(&r);
            return;
        }
        if (rc == 0 && r.status != 503 && r.status != 429) {
            fprintf(stderr, "key %d: unexpected %d %s\n", c->key_index, r.status, r.body);
            abort();
        }
        fbt_resp_free(&r);
        usleep((useconds_t)backoff * 1000);
        if (backoff < 500) backoff *= 2;
    }
    fprintf(stderr, "key %d: no answer after 100 attempts\n", c->key_index);
    abort();
}

static void *run(void *arg)
{
    client *c = arg;
    pthread_barrier_wait(&start);
    submit(c, c->ids[0]);
    submit(c, c->ids[1]);
    return NULL;
}

int main(void)
{
    fbt_require_database();
    fbt_db_create(&S);
    const char *args[] = {"--threads", "8", "--db-pool", "8", "--log-level", "warn", NULL};
    fbt_server_start(&S, args);
    fbt_tenant(&S, "busy",
               "\"rate_limit\": {\"requests_per_second\": 100000, \"burst\": 100000},"
               " \"quotas\": {\"max_queued_jobs\": 100000}",
               tenant_id, sizeof tenant_id, key, sizeof key);

    pthread_barrier_init(&start, NULL, N_THREADS);
    pthread_t th[N_THREADS];
    pthread_attr_t attr;
    pthread_attr_init(&attr);
    pthread_attr_setstacksize(&attr, 256 * 1024);
    double t0 = fbt_now_ms();
    for (int i = 0; i < N_THREADS; i++) {
        clients[i].key_index = i < N_KEYS ? i : i - N_KEYS;
        CHECK(pthread_create(&th[i], &attr, run, &clients[i]) == 0);
    }
    for (int i = 0; i < N_THREADS; i++)
        pthread_join(th[i], NULL);
    double ms = fbt_now_ms() - t0;
    pthread_attr_destroy(&attr);
    pthread_barrier_destroy(&start);

    int attempts = 0, created[N_KEYS] = {0};
    for (int i = 0; i < N_THREADS; i++) {
        client *c = &clients[i];
        attempts += c->attempts;
        created[c->key_index] += c->created;
        CHECK_STR_EQ(c->ids[0], c->ids[1]);
        /* everyone with this key holds the same id */
        CHECK_STR_EQ(c->ids[0], clients[c->key_index].ids[0]);
    }
    for (int k = 0; k < N_KEYS; k++)
        CHECK_INT_EQ(created[k], 1);

    char sql[512];
    snprintf(sql, sizeof sql, "SELECT count(*) FROM jobs WHERE tenant_id = '%s'", tenant_id);
    CHECK_STR_EQ(fbt_sql_value(&S, sql), "200");
    snprintf(sql, sizeof sql,
             "SELECT count(DISTINCT idempotency_key) FROM jobs WHERE tenant_id = '%s'", tenant_id);
    CHECK_STR_EQ(fbt_sql_value(&S, sql), "200");
    for (int k = 0; k < N_KEYS; k++) {
        snprintf(sql, sizeof sql,
                 "SELECT id FROM jobs WHERE tenant_id = '%s' AND idempotency_key = 'conc-%03d'"
                 " AND name = 'conc-%03d'",
                 tenant_id, k, k);
        CHECK_STR_EQ(fbt_sql_value(&S, sql), clients[k].ids[0]);
    }
    /* every job counts once against the queue quota */
    snprintf(sql, sizeof sql, "SELECT sum(n) FROM tenant_queued_counts WHERE tenant_id = '%s'",
             tenant_id);
    CHECK_STR_EQ(fbt_sql_value(&S, sql), "200");
    printf("%d threads, %d keys, %d requests in %.0f ms: 200 jobs, no duplicates, none lost\n",
           N_THREADS, N_KEYS, attempts, ms);
    CHECK_INT_EQ(fbt_server_stop(&S), 0);
    fbt_db_drop(&S);
    int v = fbt_validate_recorded();
    CHECK(v == 0 || v == 77);
    printf("ok\n");
    return 0;
}
