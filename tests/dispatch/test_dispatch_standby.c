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
 * 3. A is killed (SIGKILL): its session ends, B takes the lock (its /readyz
 *    is polled until it says "active", a liveness bound only), binds the
 *    worker address, the worker registers with it, and a new job submitted
 *    to B completes;
 * 4. A started again is a standby while B lives, and stops cleanly.
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
    if (fbt_http(s->port, "GET", "/readyz", NULL, NULL, 0, &r) == 0 && r.status == 200) {
        r.json = json_loads(r.body, 0, NULL);
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
                                    " AND granted"));
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

    /* 3. A dies: B takes over */
    CHECK_INT_EQ(e2e_kill(a.pid, SIGKILL), 128 + SIGKILL);
    T.s = b;
    T.s.sql = a.sql; /* the test's own connection, which e2e_finish uses */
    wait_role(&T.s, "active", "after A's death");
    CHECK(log_has(b.log_path, "control loop: active"));
    CHECK(log_has(b.log_path, "listening for workers"));
    CHECK_INT_EQ(control_lock_holders(), 1);
    char second_job[64];
    snprintf(second_job, sizeof second_job, "%s",
             submit(&T.s, e2e_spec("after", 0.01, 30, 10)));
    e2e_wait_state(&T, T.key, second_job, "completed", WAIT_S);
    /* the first job's worker is the one the new loop dispatched to */
    CHECK_STR_EQ(e2e_job_field(&T, T.key, first_job, "state"), "completed");

    /* 4. A again: a standby while B lives */
    a.pid = 0;
    fbt_server_start(&a, peer_flags(a.data_dir, false));
    CHECK_STR_EQ(role(&a), "standby");
    CHECK_STR_EQ(role(&T.s), "active");
    CHECK_INT_EQ(control_lock_holders(), 1);
    CHECK_INT_EQ(fbt_server_stop(&a), 0);

    e2e_kill(w, SIGTERM);
    e2e_finish(&T);
    printf("ok: a standby served HTTP, took the control lock when the active fuseboxd died, "
           "and dispatched\n");
    return 0;
}
