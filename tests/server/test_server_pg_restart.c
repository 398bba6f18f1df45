/*
 * PostgreSQL goes away under load.  The test runs its own PostgreSQL 15
 * cluster (so it can kill it), starts fuseboxd on it and submits jobs with
 * Idempotency-Keys from a client thread while the database is stopped
 * abruptly (immediate shutdown, like a crash) and started again.  Meanwhile
 * fuseboxd answers 503 with Retry-After (and /readyz 503) and does not
 * crash; afterwards every submission the client saw acknowledged is in the
 * database exactly once.  Skipped where the PostgreSQL server binaries are
 * missing.
 */
#include <arpa/inet.h>
#include <errno.h>
#include <netinet/in.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <unistd.h>

#include "check.h"
#include "harness.h"

#define N_JOBS 60

static char pg_bin[256] = "/usr/lib/postgresql/15/bin";
static char pg_dir[256];
static int pg_port;
static fbt_server S;
static char key[128];
static volatile int writer_done;

typedef struct writer_state {
    char ids[N_JOBS][64];
    int unavailable; /* 503 answers */
    int broken;      /* connections without an answer */
} writer_state;
static writer_state W;

static int run_cmd(const char *cmd)
{
    int rc = system(cmd);
    return WIFEXITED(rc) ? WEXITSTATUS(rc) : 128;
}

/* Runs a PostgreSQL program as the postgres user when we are root. */
static int pg_cmd(const char *args)
{
    char cmd[1024];
    if (geteuid() == 0)
        snprintf(cmd, sizeof cmd, "cd / && runuser -u postgres -- %s/%s", pg_bin, args);
    else
        snprintf(cmd, sizeof cmd, "cd / && %s/%s", pg_bin, args);
    return run_cmd(cmd);
}

static int free_port(void)
{
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    struct sockaddr_in a = {.sin_family = AF_INET};
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    CHECK(bind(fd, (struct sockaddr *)&a, sizeof a) == 0);
    socklen_t len = sizeof a;
    CHECK(getsockname(fd, (struct sockaddr *)&a, &len) == 0);
    close(fd);
    return ntohs(a.sin_port);
}

static void pg_start(void)
{
    char args[600];
    snprintf(args, sizeof args,
             "pg_ctl -D %s/data -l %s/server.log -w -t 60 -o \"-p %d\" start > /dev/null", pg_dir,
             pg_dir, pg_port);
    CHECK_INT_EQ(pg_cmd(args), 0);
}

static void pg_stop(const char *mode)
{
    char args[400];
    snprintf(args, sizeof args, "pg_ctl -D %s/data -m %s -w -t 60 stop > /dev/null", pg_dir, mode);
    CHECK_INT_EQ(pg_cmd(args), 0);
}

static void pg_create(void)
{
    char path[300];
    snprintf(path, sizeof path, "%s/initdb", pg_bin);
    if (access(path, X_OK) != 0) {
        printf("SKIPPED: %s not found\n", path);
        exit(77);
    }
    if (geteuid() == 0 && run_cmd("id postgres > /dev/null 2>&1") != 0) {
        printf("SKIPPED: running as root without a postgres user\n");
        exit(77);
    }
    snprintf(pg_dir, sizeof pg_dir, "/tmp/fbt-pg-XXXXXX");
    CHECK(mkdtemp(pg_dir) != NULL);
    char cmd[1024];
    if (geteuid() == 0) {
        snprintf(cmd, sizeof cmd, "chown postgres:postgres %s", pg_dir);
        CHECK_INT_EQ(run_cmd(cmd), 0);
    }
    snprintf(cmd, sizeof cmd,
             "initdb -D %s/data -U postgres -A trust -E UTF8 --no-locale > %s/initdb.log 2>&1",
             pg_dir, pg_dir);
    CHECK_INT_EQ(pg_cmd(cmd), 0);
    snprintf(path, sizeof path, "%s/data/postgresql.conf", pg_dir);
    FILE *f = fopen(path, "a");
    CHECK(f != NULL);
    /* synchronous_commit stays on: an acknowledged COMMIT must survive the crash */
    fprintf(f, "\nlisten_addresses = '127.0.0.1'\nunix_socket_directories = ''\n"
               "fsync = off\nmax_connections = 50\n");
    fclose(f);
    pg_port = free_port();
    pg_start();
    snprintf(S.db_url, sizeof S.db_url, "host=127.0.0.1 port=%d user=postgres dbname=postgres",
             pg_port);
    snprintf(S.dbname, sizeof S.dbname, "postgres");
}

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

static void cleanup(void)
{
    if (pg_dir[0]) {
        char args[400];
        snprintf(args, sizeof args, "pg_ctl -D %s/data -m immediate -w -t 30 stop > /dev/null 2>&1",
                 pg_dir);
        pg_cmd(args);
        char cmd[400];
        snprintf(cmd, sizeof cmd, "rm -rf %s", pg_dir);
        run_cmd(cmd);
    }
}

int main(void)
{
    if (!getenv("FB_BINARY_DIR")) {
        printf("SKIPPED: run through ctest\n");
        return 77;
    }
    pg_create();
    atexit(cleanup);
    const char *args[] = {
        "--db-wait-ms", "500", "--request-timeout-ms", "2000", "--db-pool", "4", NULL};
    fbt_server_start(&S, args);
    char tenant[64];
    fbt_tenant(&S, "writer", "\"rate_limit\": {\"requests_per_second\": 100000, \"burst\": 100000}",
               tenant, sizeof tenant, key, sizeof key);

    pthread_t th;
    CHECK(pthread_create(&th, NULL, writer, NULL) == 0);
    usleep(300 * 1000);
    pg_stop("immediate");
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
    pg_start();
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
    pg_stop("fast");
    usleep(300 * 1000);
    pg_start();
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
