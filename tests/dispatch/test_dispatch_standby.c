/*
 * One control loop per database (docs/deploy.md, "One control loop"), with
 * two real fuseboxd processes on one database:
 *
 * 1. fuseboxd A starts first and holds the control lock: /readyz says
 *    "active"; fuseboxd B, started on the same database, worker address,
 *    server key, allow-list and artifacts, says "standby", and the lock has
 *    exactly one holder in pg_locks;
 * 2. a job submitted to the standby B is dispatched by A to a real worker
 *    and completes (the standby serves HTTP, the active loop dispatches);
 * 3. A is killed (SIGKILL) while the worker trains an array A placed (held
 *    at a step by the worker's test step hook): its session ends, B takes
 *    the lock (its /readyz is polled until it says "active", a liveness
 *    bound only), binds the worker address, the worker registers with it,
 *    the array goes on under B's loop and completes, and a new job
 *    submitted to B completes;
 * 4. A started again is a standby while B lives;
 * 5. B's lock session is ended while B lives (as when PostgreSQL drops one
 *    connection) and the test takes the lock itself before B's loop is back:
 *    B steps down (both are standbys, nothing dispatches); when the test
 *    lets the lock go, one of A and B takes over, and a job completes; both
 *    stop cleanly.
 *
 * Every wait is a condition with a generous overall limit; nothing depends
 * on how fast the machine is.
 */
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "check.h"
#include "e2e.h"

#define POLL_MS "100" /* --control-lock-poll-ms of both servers */
#define WAIT_S 120    /* liveness bound of every wait */

static e2e T;

/* Advisory locks belong to one database, and other tests' fuseboxd hold theirs on the same
 * PostgreSQL server: every look at pg_locks keeps to the test's own database. */
#define THIS_DATABASE                                                                              \
    "database = (SELECT oid FROM pg_database WHERE datname = current_database())"

static void sleep_ms(int ms)
{
    struct timespec ts = {ms / 1000, (long)(ms % 1000) * 1000000L};
    nanosleep(&ts, NULL);
}

/* The control_loop field of s's /readyz (static buffer), "" when it did not answer 200. */
static const char *role(fbt_server *s)
{
    static char out[32];
    out[0] = '\0';
    fbt_resp r;
    /* fbt_http parses the body into r.json */
    if (fbt_http(s->port, "GET", "/readyz", NULL, NULL, 0, &r) == 0 && r.status == 200) {
        const char *v = json_string_value(json_object_get(r.json, "control_loop"));
        snprintf(out, sizeof out, "%s", v ? v : "(missing)");
    }
    fbt_resp_free(&r);
    return out;
}

static void wait_role(fbt_server *s, const char *want, const char *what)
{
    double start = fbt_now_ms();
    while (strcmp(role(s), want) != 0) {
        if (fbt_now_ms() - start > WAIT_S * 1000.0) {
            fprintf(stderr, "%s: /readyz never said control_loop \"%s\" (last: \"%s\")\n", what,
                    want, role(s));
            fbt_server_dump_log(s);
            e2e_dump(&T);
            CHECK(0);
        }
        sleep_ms(20);
    }
}

/* Whether the file at path holds text. */
static bool log_has(const char *path, const char *text)
{
    FILE *f = fopen(path, "r");
    if (!f) return false;
    char line[8192];
    bool found = false;
    while (!found && fgets(line, sizeof line, f)) found = strstr(line, text) != NULL;
    fclose(f);
    return found;
}

/* Prints the lines of the log at path that hold text (what the roles were, for the record). */
static void print_lines(const char *who, const char *path, const char *text)
{
    FILE *f = fopen(path, "r");
    if (!f) return;
    char line[8192];
    while (fgets(line, sizeof line, f))
        if (strstr(line, text)) printf("%s: %s", who, line);
    fclose(f);
}

/* The flags of a second fuseboxd beside T's: the same worker address, heartbeats and tick
 * as e2e_start gives the first, and what the two must share (a standby that takes over
 * is reached by the same workers and finds the same files). */
static const char *const *peer_flags(const char *first_data_dir, bool share)
{
    static char listen[64], tick[16], hb[16], hbt[16], key[400], keys[400], art[400];
    static const char *f[40];
    snprintf(listen, sizeof listen, "tcp://127.0.0.1:%d", T.worker_port);
    snprintf(tick, sizeof tick, "%d", E2E_TICK_MS);
    snprintf(hb, sizeof hb, "%d", E2E_HEARTBEAT_MS);
    snprintf(hbt, sizeof hbt, "%d", E2E_HEARTBEAT_TIMEOUT_MS);
    snprintf(key, sizeof key, "%s/server.key", first_data_dir);
    snprintf(keys, sizeof keys, "%s/worker-keys", first_data_dir);
    snprintf(art, sizeof art, "%s/artifacts", first_data_dir);
    int n = 0;
    const char *base[] = {"--worker-listen",        listen,  "--tick-ms",        tick,
                          "--heartbeat-ms",         hb,      "--heartbeat-timeout-ms", hbt,
                          "--datasets-dir",         T.data_dir, "--public-datasets", "synth",
                          "--control-lock-poll-ms", POLL_MS, NULL};
    for (int i = 0; base[i]; i++) f[n++] = base[i];
    if (share) {
        const char *more[] = {"--server-key", key, "--worker-keys", keys, "--artifacts-dir",
                              art, NULL};
        for (int i = 0; more[i]; i++) f[n++] = more[i];
    }
    f[n] = NULL;
    return f;
}

static const char *submit(fbt_server *s, const char *spec)
{
    static char id[64];
    fbt_resp r = fbt_call(s, "POST", "/v1/jobs", T.key, spec);
    fbt_expect(&r, 201, NULL, "submit a job");
    snprintf(id, sizeof id, "%s", json_string_value(json_object_get(r.json, "id")));
    fbt_resp_free(&r);
    return id;
}

static int control_lock_holders(void)
{
    return atoi(fbt_sql_value(&T.s, "SELECT count(*) FROM pg_locks WHERE locktype = 'advisory'"
                                    " AND classid = 746029052 AND objid = 1 AND objsubid = 2"
                                    " AND granted AND " THIS_DATABASE));
}

/* Ends the session that holds the control lock and takes the lock on the test's own
 * connection; should the holder's process have taken it again on a new session first,
 * ends that one too (a condition wait, bounded by WAIT_S). */
static void steal_lock(fbt_server *s)
{
    double start = fbt_now_ms();
    for (;;) {
        PQclear(fbt_sql(s, "SELECT pg_terminate_backend(pid) FROM pg_locks WHERE"
                           " locktype = 'advisory' AND classid = 746029052 AND objid = 1"
                           " AND objsubid = 2 AND granted AND pid <> pg_backend_pid() AND "
                           THIS_DATABASE));
        if (strcmp(fbt_sql_value(s, "SELECT pg_try_advisory_lock(746029052, 1)"), "t") == 0)
            return;
        CHECK(fbt_now_ms() - start < WAIT_S * 1000.0);
        sleep_ms(5);
    }
}

int main(void)
{
    const char *const first[] = {"--control-lock-poll-ms", POLL_MS, NULL};
    e2e_start(&T, first);
    fbt_server a = T.s;

    /* 1. A active, B standby; one holder of the lock */
    CHECK_STR_EQ(role(&a), "active");
    fbt_server b;
    memset(&b, 0, sizeof b);
    snprintf(b.db_url, sizeof b.db_url, "%s", a.db_url);
    snprintf(b.dbname, sizeof b.dbname, "%s", a.dbname);
    snprintf(b.data_dir, sizeof b.data_dir, "%s/server-b", T.root);
    CHECK(mkdir(b.data_dir, 0700) == 0);
    /* the admin key of the deployment, which only the first start writes */
    char cmd[1200];
    snprintf(cmd, sizeof cmd, "cp '%s/admin.key' '%s/admin.key'", a.data_dir, b.data_dir);
    CHECK(system(cmd) == 0);
    fbt_server_start(&b, peer_flags(a.data_dir, true));
    CHECK_STR_EQ(role(&b), "standby");
    CHECK_STR_EQ(role(&a), "active");
    CHECK(log_has(b.log_path, "control loop: standby"));
    CHECK(!log_has(b.log_path, "listening for workers"));
    CHECK_INT_EQ(control_lock_holders(), 1);

    /* 2. submitted to the standby, dispatched by A */
    pid_t w = e2e_worker(&T, "w1");
    char first_job[64];
    snprintf(first_job, sizeof first_job, "%s", submit(&b, e2e_spec("before", 0.01, 30, 10)));
    e2e_wait_state(&T, T.key, first_job, "completed", WAIT_S);
    CHECK_STR_EQ(role(&b), "standby");

    /* an array in training when A dies: held by the worker's step hook at step 10 */
    e2e_hold(&T, "during", 10);
    char during_job[64];
    snprintf(during_job, sizeof during_job, "%s", submit(&b, e2e_spec("during", 0.01, 40, 5)));
    CHECK_INT_EQ(e2e_wait_held(&T, "during", WAIT_S), 10);

    /* 3. A dies: B takes over */
    double killed = fbt_now_ms();
    CHECK_INT_EQ(e2e_kill(a.pid, SIGKILL), 128 + SIGKILL);
    T.s = b;
    T.s.sql = a.sql; /* the test's own connection, which e2e_finish uses */
    wait_role(&T.s, "active", "after A's death");
    /* for the record (docs/deploy.md), not asserted: the machine's speed decides it */
    printf("takeover: B active %.0f ms after A's SIGKILL (--control-lock-poll-ms %s)\n",
           fbt_now_ms() - killed, POLL_MS);
    CHECK(log_has(b.log_path, "control loop: active"));
    CHECK(log_has(b.log_path, "listening for workers"));
    CHECK_INT_EQ(control_lock_holders(), 1);
    /* the array A had placed goes on under B's loop and completes */
    e2e_release(&T, "during");
    e2e_wait_state(&T, T.key, during_job, "completed", WAIT_S);
    char second_job[64];
    snprintf(second_job, sizeof second_job, "%s",
             submit(&T.s, e2e_spec("after", 0.01, 30, 10)));
    e2e_wait_state(&T, T.key, second_job, "completed", WAIT_S);
    CHECK_STR_EQ(e2e_job_field(&T, T.key, first_job, "state"), "completed");

    /* 4. A again: a standby while B lives */
    a.pid = 0;
    fbt_server_start(&a, peer_flags(a.data_dir, false));
    CHECK_STR_EQ(role(&a), "standby");
    CHECK_STR_EQ(role(&T.s), "active");
    CHECK_INT_EQ(control_lock_holders(), 1);
    /* both answers, recorded for the check against api/openapi.yaml */
    fbt_resp r = fbt_call(&a, "GET", "/readyz", NULL, NULL);
    fbt_expect(&r, 200, NULL, "a standby's /readyz");
    fbt_resp_free(&r);
    r = fbt_call(&T.s, "GET", "/readyz", NULL, NULL);
    fbt_expect(&r, 200, NULL, "the active one's /readyz");
    fbt_resp_free(&r);

    /* 5. B's lock session dies while B lives, and the test's own session takes the lock
     * before B's loop reconnects: B steps down, both are standbys; once the test lets go,
     * one of them takes over and dispatches */
    steal_lock(&T.s);
    wait_role(&T.s, "standby", "B after its lock was taken");
    CHECK(log_has(b.log_path, "another fuseboxd holds the control lock; stepping down"));
    /* A too (should it have taken the lock on the way, its loop steps down as B's did) */
    wait_role(&a, "standby", "A while the test holds the lock");
    CHECK_STR_EQ(fbt_sql_value(&T.s, "SELECT pg_advisory_unlock(746029052, 1)"), "t");
    double start = fbt_now_ms();
    while (strcmp(role(&a), "active") != 0 && strcmp(role(&T.s), "active") != 0) {
        CHECK(fbt_now_ms() - start < WAIT_S * 1000.0);
        sleep_ms(20);
    }
    CHECK_INT_EQ(control_lock_holders(), 1);
    CHECK(strcmp(role(&a), "active") == 0 || strcmp(role(&T.s), "active") == 0);
    CHECK(strcmp(role(&a), "standby") == 0 || strcmp(role(&T.s), "standby") == 0);
    char third_job[64];
    snprintf(third_job, sizeof third_job, "%s", submit(&T.s, e2e_spec("third", 0.01, 30, 10)));
    e2e_wait_state(&T, T.key, third_job, "completed", WAIT_S);
    CHECK_INT_EQ(fbt_server_stop(&a), 0);

    print_lines("A", a.log_path, "control loop:");
    print_lines("B", b.log_path, "control loop:");
    e2e_kill(w, SIGTERM);
    e2e_finish(&T);
    /* the responses, /readyz's control_loop among them, against api/openapi.yaml */
    int v = fbt_validate_recorded();
    CHECK(v == 0 || v == 77);
    printf("ok: a standby served HTTP, took the control lock when the active fuseboxd died, "
           "and dispatched\n");
    return 0;
}
