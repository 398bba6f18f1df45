/*
 * Faults, end to end on real processes:
 *
 * 1. A worker killed with SIGKILL mid-training, held by the test step hook
 *    right after a checkpoint step (e2e_hold): once it has been silent past
 *    the heartbeat timeout (fuseboxd's log says how long), its jobs return
 *    to the queue with that checkpoint (restarts not counted), resume
 *    together at the step after it on another worker, in the same
 *    composition, and finish bit-identical to an uninterrupted fusebox-train
 *    run.
 * 2. fuseboxd killed with SIGKILL and restarted: the worker keeps training,
 *    re-registers its array (held at a later step, so that it still runs when
 *    fuseboxd is back, however fast this machine is), progress continues, no
 *    array runs twice, and the results are again bit-identical to the
 *    uninterrupted run.
 * 3. A member that diverges fails alone with a clear error; the rest of its
 *    array finishes.
 */
#include <signal.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "check.h"
#include "e2e.h"

static e2e T;

static void sleep_ms(int ms)
{
    struct timespec ts = {ms / 1000, (long)(ms % 1000) * 1000000L};
    nanosleep(&ts, NULL);
}

/* A sweep of n trials over lr of an MLP 16-hidden-4 (batch 128); ids and names [n] (n <= 4),
 * the trials named name-0, name-1, ... */
static void submit_sweep(const char *name, const char *extra_base, const char *optimizer,
                         const char *lrs, int n, int hidden, int steps, int checkpoint_every,
                         char (*ids)[64], char (*names)[64])
{
    char body[2048];
    snprintf(body, sizeof body,
             "{\"name\": \"%s\", \"base\": {\"dataset\": \"synth\", \"model\": {\"input\": [16],"
             " \"layers\": [{\"type\": \"linear\", \"out\": %d}, {\"type\": \"relu\"},"
             " {\"type\": \"linear\", \"out\": 4}]}, \"batch_size\": 128, \"steps\": %d,"
             " \"eval_every\": 200, \"checkpoint_every\": %d, \"seed\": 5,"
             " \"optimizer\": {\"type\": \"%s\", \"lr\": 0.001}%s},"
             " \"search\": {\"type\": \"grid\", \"params\": {\"optimizer.lr\": {\"values\": [%s]}}}}",
             name, hidden, steps, checkpoint_every, optimizer, extra_base, lrs);
    /* trials in submission order, as the array holds them */
    e2e_submit_sweep(&T, T.key, body, n, ids, names);
}

/* Each job's model must equal fusebox-train's for the same specs as one array: bit for bit
 * (tol 0) when the jobs trained in that composition throughout, else within tol. */
static void check_against_reference(char (*ids)[64], char (*names)[64], int n, const char *tag,
                                    double tol)
{
    char files[4][400], ref[400], path[128];
    const char *fp[4];
    for (int i = 0; i < n; i++) {
        snprintf(path, sizeof path, "/v1/jobs/%s", ids[i]);
        fbt_resp r = fbt_call(&T.s, "GET", path, T.key, NULL);
        fbt_expect(&r, 200, NULL, "get a job");
        char *spec = json_dumps(json_object_get(r.json, "spec"), JSON_COMPACT);
        snprintf(files[i], sizeof files[i], "%s/%s-%d.json", T.root, tag, i);
        e2e_write(files[i], spec);
        free(spec);
        fbt_resp_free(&r);
        fp[i] = files[i];
    }
    snprintf(ref, sizeof ref, "%s/ref-%s", T.root, tag);
    e2e_train_reference(&T, fp, n, ref);
    for (int i = 0; i < n; i++) {
        char got[400], want[600];
        snprintf(got, sizeof got, "%s/%s-model-%d.safetensors", T.root, tag, i);
        e2e_download_model(&T, T.key, ids[i], got);
        snprintf(want, sizeof want, "%s/%s.safetensors", ref, names[i]);
        double d = e2e_max_diff(got, want);
        printf("%s: job %d: max |model - uninterrupted fusebox-train| = %g\n", tag, i, d);
        CHECK(d >= 0 && d <= tol);
    }
}

/* silent_ms of the one "worker lost: no heartbeat" line of worker name in fuseboxd's log
 * (fails the test unless there is exactly one). */
static long long lost_silent_ms(const char *name)
{
    FILE *f = fopen(T.s.log_path, "r");
    CHECK(f != NULL);
    char line[8192];
    long long silent = -1;
    int n = 0;
    while (fgets(line, sizeof line, f)) {
        if (!strstr(line, "worker lost: no heartbeat")) continue;
        json_t *j = json_loads(line, 0, NULL);
        const char *w = json_string_value(json_object_get(j, "worker"));
        if (w && strcmp(w, name) == 0) {
            silent = (long long)json_integer_value(json_object_get(j, "silent_ms"));
            n++;
        }
        json_decref(j);
    }
    fclose(f);
    CHECK_INT_EQ(n, 1);
    return silent;
}

static void worker_killed(pid_t *worker)
{
    char ids[2][64], names[2][64], sql[512];
    /* the array stops right after its checkpoint of step 200 (held before it exists, by
     * its first trial's name), so the kill lands there on any machine */
    e2e_hold(&T, "kill-0", 200);
    submit_sweep("kill", "", "adam", "0.002, 0.01", 2, 256, 900, 100, ids, names);
    CHECK_INT_EQ(e2e_wait_held(&T, "kill-0", 120), 200);
    snprintf(sql, sizeof sql,
             "SELECT min(resume_step) = 200 AND max(resume_step) = 200 FROM jobs"
             " WHERE id IN ('%s', '%s')",
             ids[0], ids[1]);
    e2e_wait_sql(&T, sql, 60, "both checkpoints of step 200 recorded");
    CHECK_INT_EQ(e2e_kill(*worker, SIGKILL), 128 + SIGKILL);
    double t0 = fbt_now_ms();
    snprintf(sql, sizeof sql,
             "SELECT bool_and(state = 'queued') FROM jobs WHERE id IN ('%s', '%s')", ids[0],
             ids[1]);
    e2e_wait_sql(&T, sql, 20, "the lost worker's jobs to return to the queue");
    /* the decision, not how long it took on this machine (test_dispatch_flood asserts its
     * exact tick on a manual clock): w1 was judged lost once, silent longer than the
     * heartbeat timeout, and its jobs went back to the queue for that reason */
    long long silent = lost_silent_ms("w1");
    printf("jobs re-queued %.0f ms after the worker was killed; judged lost %lld ms after its"
           " last message (heartbeat timeout %d ms)\n",
           fbt_now_ms() - t0, silent, E2E_HEARTBEAT_TIMEOUT_MS);
    CHECK(silent > E2E_HEARTBEAT_TIMEOUT_MS);
    for (int i = 0; i < 2; i++) {
        snprintf(sql, sizeof sql,
                 "SELECT message FROM job_events WHERE job_id = '%s' AND kind = 'requeued'",
                 ids[i]);
        const char *why = fbt_sql_value(&T.s, sql);
        if (!strstr(why, "worker lost")) fprintf(stderr, "requeued: %s\n", why);
        CHECK(strstr(why, "worker lost") != NULL);
    }
    e2e_release(&T, "kill-0"); /* or the resumed array would stop at step 200 again */
    *worker = e2e_worker(&T, "w2");
    for (int i = 0; i < 2; i++) e2e_wait_state(&T, T.key, ids[i], "completed", 240);
    for (int i = 0; i < 2; i++) {
        CHECK_STR_EQ(e2e_job_field(&T, T.key, ids[i], "restarts"), "0");
        snprintf(sql, sizeof sql,
                 "SELECT count(*) FROM job_events WHERE job_id = '%s' AND kind = 'requeued'",
                 ids[i]);
        CHECK_STR_EQ(fbt_sql_value(&T.s, sql), "1");
        /* it resumed from its checkpoint, it did not start over: the second array's first
         * step is the one after it (a start reports the first step it trains) */
        snprintf(sql, sizeof sql,
                 "SELECT max((data->>'step')::bigint) FROM job_events WHERE job_id = '%s'"
                 " AND kind = 'started'",
                 ids[i]);
        CHECK_STR_EQ(fbt_sql_value(&T.s, sql), "201");
    }
    /* both left at the same checkpoint, so they resume together, in one array, and match
     * the uninterrupted run bit for bit */
    snprintf(sql, sizeof sql,
             "SELECT count(DISTINCT group_id) = 1 FROM jobs WHERE id IN ('%s', '%s')", ids[0],
             ids[1]);
    CHECK_STR_EQ(fbt_sql_value(&T.s, sql), "t");
    check_against_reference(ids, names, 2, "kill", 0);
}

static void server_killed(void)
{
    char ids[2][64], names[2][64], sql[512];
    /* held at step 500 for the kill, then at 3500: the array trains on while fuseboxd is
     * away and still runs, held, when it is back */
    e2e_hold(&T, "restart-0", 500);
    submit_sweep("restart", "", "adam", "0.003, 0.02", 2, 256, 6000, 1000, ids, names);
    CHECK_INT_EQ(e2e_wait_held(&T, "restart-0", 120), 500);
    snprintf(sql, sizeof sql,
             "SELECT bool_and(step = 500 AND state = 'running') FROM jobs"
             " WHERE id IN ('%s', '%s')",
             ids[0], ids[1]);
    e2e_wait_sql(&T, sql, 60, "training under way, at the held step");
    char group[64];
    snprintf(group, sizeof group, "%s", e2e_job_field(&T, T.key, ids[0], "group_id"));
    kill(T.s.pid, SIGKILL);
    int st;
    CHECK(waitpid(T.s.pid, &st, 0) == T.s.pid);
    e2e_hold(&T, "restart-0", 3500);
    sleep_ms(800); /* the worker trains on meanwhile */
    e2e_restart_server(&T);
    CHECK_INT_EQ(e2e_wait_held(&T, "restart-0", 120), 3500);
    /* the array re-registered and its progress followed: fuseboxd was down from step 500 */
    snprintf(sql, sizeof sql,
             "SELECT bool_and(step = 3500 AND state = 'running' AND group_id = '%s') FROM jobs"
             " WHERE id IN ('%s', '%s')",
             group, ids[0], ids[1]);
    e2e_wait_sql(&T, sql, 60, "progress of the re-registered array after the restart");
    e2e_release(&T, "restart-0");
    for (int i = 0; i < 2; i++) e2e_wait_state(&T, T.key, ids[i], "completed", 240);
    for (int i = 0; i < 2; i++) {
        /* the same array all along: re-registered, not re-fused */
        CHECK_STR_EQ(e2e_job_field(&T, T.key, ids[i], "group_id"), group);
        snprintf(sql, sizeof sql,
                 "SELECT count(*) FROM job_events WHERE job_id = '%s'"
                 " AND kind IN ('started', 'requeued')",
                 ids[i]);
        CHECK_STR_EQ(fbt_sql_value(&T.s, sql), "1");
        snprintf(sql, sizeof sql,
                 "SELECT count(*) FROM checkpoints WHERE job_id = '%s' AND kind = 'state'",
                 ids[i]);
        CHECK_STR_EQ(fbt_sql_value(&T.s, sql), "5"); /* 1000 .. 5000: none lost */
    }
    snprintf(sql, sizeof sql, "SELECT generation FROM groups WHERE id = '%s'", group);
    CHECK_STR_EQ(fbt_sql_value(&T.s, sql), "1");
    check_against_reference(ids, names, 2, "restart", 0);
}

static void member_diverges(void)
{
    char ids[2][64], names[2][64];
    submit_sweep("diverge", ", \"loss\": \"mse\"", "sgd", "0.05, 100", 2, 32, 400, 0, ids, names);
    /* grid order: lr 0.05 first */
    e2e_wait_state(&T, T.key, ids[1], "failed", 120);
    e2e_wait_state(&T, T.key, ids[0], "completed", 120);
    const char *error = e2e_job_field(&T, T.key, ids[1], "error");
    printf("the diverging member failed with: %s\n", error);
    CHECK(strstr(error, "NaN") || strstr(error, "finite") || strstr(error, "inf"));
    CHECK_STR_EQ(e2e_job_field(&T, T.key, ids[0], "group_id"),
                 e2e_job_field(&T, T.key, ids[1], "group_id"));
}

int main(void)
{
    setvbuf(stdout, NULL, _IONBF, 0); /* the numbers reach the log even when a check aborts */
    e2e_start(&T, NULL);
    pid_t worker = e2e_worker(&T, "w1");
    worker_killed(&worker);
    printf("ok: a killed worker's jobs resume elsewhere and finish identically\n");
    server_killed();
    printf("ok: fuseboxd killed and restarted loses nothing and runs nothing twice\n");
    member_diverges();
    printf("ok: a diverging member fails alone\n");
    CHECK_INT_EQ(e2e_kill(worker, SIGTERM), 0);
    e2e_finish(&T);
    return 0;
}
