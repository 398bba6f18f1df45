/*
 * PostgreSQL goes away under load.  The test runs its own PostgreSQL 15
 * cluster (pgctl.h: so it can kill it), starts fuseboxd on it and submits
 * jobs with Idempotency-Keys from a client thread while the database is stopped
 * abruptly (immediate shutdown, like a crash) and started again.  Meanwhile
 * fuseboxd answers 503 with Retry-After (and /readyz 503) and does not
 * crash; afterwards every submission the client saw acknowledged is in the
 * database exactly once.  Skipped where the PostgreSQL server binaries are
 * missing.
 */
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "check.h"
#include "harness.h"
#include "pgctl.h"

#define N_JOBS 60

static fbt_pg PG;
static fbt_server S;
static char key[128];
static volatile int writer_done;

typedef struct writer_state {
    char ids[N_JOBS][64];
    int unavailable; /* 503 answers */
    int broken;      /* connections without an answer */
} writer_state;
static writer_state W;

static void *writer(void *arg)
{
    (void)arg;
    char auth[200];
    snprintf(auth, sizeof auth, "Authorization: Bearer %s", key);
    for (int i = 0; i < N_JOBS; i++) {
        char idem[64], name[32];
        snprintf(idem, sizeof idem, "Idempotency-Key: restart-%02d", i);
        snprintf(name, sizeof name, "restart-%02d", i);
        const char *h[] = {auth, "Content-Type: application/json", idem, NULL};
        const char *body = fbt_spec(name, 0.1);
        double give_up = fbt_now_ms() + 90000;
        for (;;) {
            fbt_resp r;
            int rc = fbt_http(S.port, "POST", "/v1/jobs", h, body, strlen(body), &r);
            if (rc == 0) fbt_record("POST", "/v1/jobs", &r);
            if (rc == 0 && (r.status == 201 || r.status == 200)) {
                snprintf(W.ids[i], sizeof W.ids[i], "%s",
                         json_string_value(json_object_get(r.json, "id")));
                fbt_resp_free(&r);
                break;
            }
            if (rc != 0) {
                W.broken++;
            } else if (r.status == 503) {
                W.unavailable++;
                CHECK(fbt_header(&r, "Retry-After") != NULL);
            } else {
                fprintf(stderr, "job %d: unexpected %d %s\n", i, r.status, r.body);
                abort();
            }
            fbt_resp_free(&r);
            CHECK(fbt_now_ms() < give_up);
            usleep(50 * 1000);
        }
        usleep(20 * 1000);
    }
    writer_done = 1;
    return NULL;
}

static void cleanup(void) { fbt_pg_destroy(&PG); }

int main(void)
{
    if (!getenv("FB_BINARY_DIR")) {
        printf("SKIPPED: run through ctest\n");
        return 77;
    }
    fbt_pg_create(&PG);
    atexit(cleanup);
    snprintf(S.db_url, sizeof S.db_url, "%s", PG.url);
    snprintf(S.dbname, sizeof S.dbname, "postgres");
    const char *args[] = {
        "--db-wait-ms", "500", "--request-timeout-ms", "2000", "--db-pool", "4", NULL};
    fbt_server_start(&S, args);
    char tenant[64];
    fbt_tenant(&S, "writer", "\"rate_limit\": {\"requests_per_second\": 100000, \"burst\": 100000}",
               tenant, sizeof tenant, key, sizeof key);

    pthread_t th;
    CHECK(pthread_create(&th, NULL, writer, NULL) == 0);
    usleep(300 * 1000);
    fbt_pg_stop(&PG, "immediate");
    /* while the database is down: no crash, 503 with Retry-After */
    usleep(300 * 1000);
    CHECK(kill(S.pid, 0) == 0);
    fbt_resp r = fbt_call(&S, "GET", "/readyz", NULL, NULL);
    fbt_expect(&r, 503, "unavailable", "readyz while PostgreSQL is down");
    fbt_resp_free(&r);
    r = fbt_call(&S, "GET", "/v1/jobs/00000000-0000-4000-8000-000000000000", key, NULL);
    if (r.status != 503) fbt_expect(&r, 404, NULL, "cached key, database down"); /* never 500 */
    fbt_resp_free(&r);
    r = fbt_call(&S, "GET", "/healthz", NULL, NULL);
    fbt_expect(&r, 200, NULL, "healthz while PostgreSQL is down");
    fbt_resp_free(&r);
    usleep(700 * 1000);
    fbt_pg_start(&PG);
    double t0 = fbt_now_ms();
    for (;;) {
        r = fbt_call(&S, "GET", "/readyz", NULL, NULL);
        int st = r.status;
        fbt_resp_free(&r);
        if (st == 200) break;
        CHECK(fbt_now_ms() - t0 < 30000);
        usleep(50 * 1000);
    }
    /* a second, gentler restart in the middle of the remaining writes */
    usleep(200 * 1000);
    fbt_pg_stop(&PG, "fast");
    usleep(300 * 1000);
    fbt_pg_start(&PG);
    pthread_join(th, NULL);
    CHECK(writer_done);
    CHECK(kill(S.pid, 0) == 0);

    S.sql = PQconnectdb(S.db_url);
    CHECK_INT_EQ(PQstatus(S.sql), CONNECTION_OK);
    CHECK_STR_EQ(fbt_sql_value(&S, "SELECT count(*) FROM jobs"), "60");
    CHECK_STR_EQ(fbt_sql_value(&S, "SELECT count(DISTINCT idempotency_key) FROM jobs"), "60");
    for (int i = 0; i < N_JOBS; i++) {
        char sql[256];
        snprintf(
            sql, sizeof sql,
            "SELECT id FROM jobs WHERE idempotency_key = 'restart-%02d' AND name = 'restart-%02d'",
            i, i);
        CHECK_STR_EQ(fbt_sql_value(&S, sql), W.ids[i]);
    }
    printf("%d jobs acknowledged and stored once each; %d answers were 503, %d connections broke\n",
           N_JOBS, W.unavailable, W.broken);
    CHECK(W.unavailable + W.broken > 0);
    r = fbt_call(&S, "GET", "/v1/jobs?limit=1", key, NULL);
    fbt_expect(&r, 200, NULL, "serving again");
    fbt_resp_free(&r);
    PQfinish(S.sql);
    S.sql = NULL;
    CHECK_INT_EQ(fbt_server_stop(&S), 0);
    fbt_remove_data_dir(&S);
    int v = fbt_validate_recorded();
    CHECK(v == 0 || v == 77);
    printf("ok\n");
    return 0;
}
