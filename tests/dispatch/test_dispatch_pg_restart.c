/*
 * PostgreSQL restarted under a training array, end to end on real processes:
 * fuseboxd keeps the progress reports and events of its workers in memory
 * while the database is away and writes them when it is back, and it
 * acknowledges an event to the worker only after its COMMIT, so nothing is
 * lost.  The test runs its own PostgreSQL cluster (pgctl.h; the shared test
 * server must never be restarted), starts fuseboxd and one worker on it, and
 * submits a sweep of two trials, which train as one array.
 *
 * Where the outage falls in the run is placed with the workers' test step
 * hook (e2e_hold), not sized from the machine's speed: the array is held at
 * step HOLD_BEFORE (a checkpoint step) until that checkpoint and progress are
 * in the database; PostgreSQL is stopped like a crash (immediate); the hold
 * then moves checkpoint by checkpoint to OUTAGE_CHECKPOINTS more, each one
 * waited for, so that those checkpoints and the progress reports of those
 * steps were certainly taken while PostgreSQL was down; the array stays held
 * at the last of them until the outage has lasted OUTAGE_MS, and after
 * PostgreSQL is back until fuseboxd has written what it kept.  Then the array
 * is released and finishes.
 *
 * Afterwards: both jobs completed; job_metrics holds a row of every step the
 * array was held at during the outage (trained and reported while PostgreSQL
 * was down), and nothing past the first hold was written before the stop;
 * every state checkpoint is recorded once, including those of the outage;
 * fuseboxd never exited and is ready again; the array was never lost (no
 * 'requeued' event, one 'started') and the worker's events were all
 * acknowledged.  Skipped where the PostgreSQL server programs are missing.
 *
 * "--outage-ms N" makes the outage N ms long (1000 to 60000): the reliability
 * suite (tests/reliability/faults) runs it with a 10 s outage and reads the
 * "result:" line it prints.  The array is held meanwhile, so the run is the
 * same whatever N is.
 */
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "check.h"
#include "e2e.h"
#include "pgctl.h"

/* The array: two MLPs 16-HIDDEN-4 at batch 128, STEPS steps with a checkpoint every
 * CHECKPOINT_EVERY.  It is held at HOLD_BEFORE when PostgreSQL stops, then at each of the
 * OUTAGE_CHECKPOINTS checkpoints after it while PostgreSQL is down. */
#define HIDDEN 64
#define CHECKPOINT_EVERY 20
#define HOLD_BEFORE (3 * CHECKPOINT_EVERY)
#define OUTAGE_CHECKPOINTS 5
#define HOLD_LAST (HOLD_BEFORE + OUTAGE_CHECKPOINTS * CHECKPOINT_EVERY)
#define STEPS (HOLD_LAST + 2 * CHECKPOINT_EVERY)
/* the trial that e2e_hold names (sweep "pgrestart", its first trial) */
#define HOLD_KEY "pgrestart-0"
#define OUTAGE_MS 2500
#define MAX_OUTAGE_MS 60000
/* liveness bounds in seconds (no decision depends on them) */
#define WAIT_S 120

static fbt_pg PG;
static e2e T;
static pid_t worker;
static int outage_ms = OUTAGE_MS; /* --outage-ms */

static void cleanup(void)
{
    fbt_pg_destroy(&PG);
}

static void sleep_ms(int ms)
{
    struct timespec ts = {ms / 1000, (long)(ms % 1000) * 1000000L};
    nanosleep(&ts, NULL);
}

/* Fails the test when fuseboxd or the worker has exited (a zombie counts). */
static void check_alive(const char *when)
{
    int st;
    if (waitpid(T.s.pid, &st, WNOHANG) != 0) {
        fprintf(stderr, "fuseboxd exited %s (status %d)\n", when, st);
        e2e_dump(&T);
        CHECK(0);
    }
    if (waitpid(worker, &st, WNOHANG) != 0) {
        fprintf(stderr, "the worker exited %s (status %d)\n", when, st);
        e2e_dump(&T);
        CHECK(0);
    }
}

static int http_status(const char *path)
{
    fbt_resp r = fbt_call(&T.s, "GET", path, NULL, NULL);
    int st = r.status;
    fbt_resp_free(&r);
    return st;
}

/* A sweep of two trials over lr, one array; ids in submission order. */
static void submit_sweep(char (*ids)[64])
{
    char body[2048];
    snprintf(body, sizeof body,
             "{\"name\": \"pgrestart\", \"base\": {\"dataset\": \"synth\", \"model\": {\"input\":"
             " [16], \"layers\": [{\"type\": \"linear\", \"out\": %d}, {\"type\": \"relu\"},"
             " {\"type\": \"linear\", \"out\": 4}]}, \"batch_size\": 128, \"steps\": %d,"
             " \"eval_every\": 0, \"checkpoint_every\": %d, \"seed\": 5, \"optimizer\":"
             " {\"type\": \"adam\", \"lr\": 0.001}}, \"search\": {\"type\": \"grid\", \"params\":"
             " {\"optimizer.lr\": {\"values\": [0.002, 0.01]}}}}",
             HIDDEN, STEPS, CHECKPOINT_EVERY);
    char names[2][64];
    e2e_submit_sweep(&T, T.key, body, 2, ids, names);
    CHECK_STR_EQ(names[0], HOLD_KEY);
}

static long long sql_ll(const char *sql)
{
    const char *v = fbt_sql_value(&T.s, sql);
    CHECK(v[0] != '\0'); /* NULL: no such rows */
    return atoll(v);
}

/* Moves the hold to step and waits for the array to be held there. */
static void hold_at(long long step)
{
    e2e_hold(&T, HOLD_KEY, step);
    CHECK_INT_EQ(e2e_wait_held(&T, HOLD_KEY, WAIT_S), step);
}

/* Waits until both jobs are running at step, with its checkpoint (and everything
 * before it) recorded. */
static void wait_recorded(const char (*ids)[64], long long step, const char *what)
{
    char sql[512];
    snprintf(sql, sizeof sql,
             "SELECT bool_and(state = 'running' AND step = %lld AND resume_step = %lld) FROM jobs"
             " WHERE id IN ('%s', '%s')",
             step, step, ids[0], ids[1]);
    e2e_wait_sql(&T, sql, WAIT_S, what);
}

/* Progress rows of job id (with a loss) at steps in (lo, hi]. */
static long long progress_rows(const char *id, long long lo, long long hi)
{
    char sql[512];
    snprintf(sql, sizeof sql,
             "SELECT count(*) FROM job_metrics WHERE job_id = '%s' AND loss IS NOT NULL"
             " AND step > %lld AND step <= %lld",
             id, lo, hi);
    return sql_ll(sql);
}

/*
 * What fuseboxd kept of job id while PostgreSQL was down, written now that it is back
 * and the array is still held at HOLD_LAST: a progress row of every step it was held at
 * during the outage (each hold sends one report before the test sees it held, so it was
 * trained and reported while PostgreSQL was down), and the state checkpoints of those
 * steps.  Returns the progress rows trained during the outage.
 */
static long long check_outage_rows(const char *id)
{
    char sql[512];
    for (int k = 1; k <= OUTAGE_CHECKPOINTS; k++) {
        long long step = HOLD_BEFORE + (long long)k * CHECKPOINT_EVERY;
        snprintf(sql, sizeof sql,
                 "SELECT count(*) FROM job_metrics WHERE job_id = '%s' AND loss IS NOT NULL"
                 " AND step = %lld",
                 id, step);
        CHECK_INT_EQ(sql_ll(sql), 1);
    }
    snprintf(sql, sizeof sql,
             "SELECT count(*) || ' ' || count(DISTINCT step) FROM checkpoints WHERE job_id = '%s'"
             " AND kind = 'state' AND step > %d AND step <= %d",
             id, HOLD_BEFORE, HOLD_LAST);
    char want[32];
    snprintf(want, sizeof want, "%d %d", OUTAGE_CHECKPOINTS, OUTAGE_CHECKPOINTS);
    CHECK_STR_EQ(fbt_sql_value(&T.s, sql), want);
    /* nothing was trained past the hold yet */
    CHECK_INT_EQ(progress_rows(id, HOLD_LAST, STEPS), 0);
    long long n = progress_rows(id, HOLD_BEFORE, HOLD_LAST);
    printf("job %s: %lld progress rows of steps %d to %d, trained during the outage and"
           " written after it; %d state checkpoints of those steps\n",
           id, n, HOLD_BEFORE + 1, HOLD_LAST, OUTAGE_CHECKPOINTS);
    CHECK(n >= OUTAGE_CHECKPOINTS);
    return n;
}

static void check_checkpoints(const char *id)
{
    char sql[512];
    long long want = (STEPS - 1) / CHECKPOINT_EVERY; /* the last step ends with the model */
    snprintf(sql, sizeof sql,
             "SELECT count(*) || ' ' || count(DISTINCT step) || ' ' || coalesce(min(step), -1)"
             " || ' ' || coalesce(max(step), -1) || ' ' || count(*) FILTER (WHERE step %% %d <> 0)"
             " FROM checkpoints WHERE job_id = '%s' AND kind = 'state'",
             CHECKPOINT_EVERY, id);
    char expect[128];
    snprintf(expect, sizeof expect, "%lld %lld %d %lld 0", want, want, CHECKPOINT_EVERY,
             want * CHECKPOINT_EVERY);
    /* count, distinct steps, first, last, off-cadence: every one there, none twice */
    CHECK_STR_EQ(fbt_sql_value(&T.s, sql), expect);
    snprintf(sql, sizeof sql,
             "SELECT count(*) FROM job_events WHERE job_id = '%s' AND kind = 'checkpointed'", id);
    CHECK_INT_EQ(sql_ll(sql), want);
    snprintf(sql, sizeof sql,
             "SELECT count(*) FROM checkpoints WHERE job_id = '%s' AND kind = 'model'"
             " AND is_final AND step = %d",
             id, STEPS);
    CHECK_INT_EQ(sql_ll(sql), 1);
}

/* PostgreSQL goes down with the array held at HOLD_BEFORE; the array trains on to
 * HOLD_LAST, held at every checkpoint; the outage lasts outage_ms.  Returns its length. */
static double outage(void)
{
    fbt_pg_stop(&PG, "immediate");
    double down_at = fbt_now_ms();
    check_alive("once PostgreSQL was down");
    CHECK_INT_EQ(http_status("/readyz"), 503);
    CHECK_INT_EQ(http_status("/healthz"), 200);
    for (int k = 1; k <= OUTAGE_CHECKPOINTS; k++) {
        hold_at(HOLD_BEFORE + (long long)k * CHECKPOINT_EVERY);
        check_alive("while PostgreSQL was down");
    }
    printf("held at step %d, %d checkpoints after the stop, %.0f ms into the outage\n", HOLD_LAST,
           OUTAGE_CHECKPOINTS, fbt_now_ms() - down_at);
    /* the outage's length is what the test is asked for, not a wait for anything */
    while (fbt_now_ms() - down_at < outage_ms) {
        check_alive("while PostgreSQL was down");
        sleep_ms(100);
    }
    CHECK_INT_EQ(http_status("/readyz"), 503);
    fbt_pg_start(&PG);
    double down_ms = fbt_now_ms() - down_at;
    printf("PostgreSQL was down for %.0f ms\n", down_ms);
    return down_ms;
}

/* Waits for /readyz to answer 200 again; returns how long that took, in ms. */
static double wait_ready(void)
{
    double up_at = fbt_now_ms();
    while (http_status("/readyz") != 200) {
        check_alive("after PostgreSQL came back");
        if (fbt_now_ms() - up_at > WAIT_S * 1000.0) {
            fprintf(stderr, "/readyz not 200 within %d s of the restart\n", WAIT_S);
            e2e_dump(&T);
            CHECK(0);
        }
        sleep_ms(20);
    }
    double ready_ms = fbt_now_ms() - up_at;
    printf("/readyz 200 again %.0f ms after the restart\n", ready_ms);
    /* the test's own connection went down with the server */
    PQreset(T.s.sql);
    CHECK(PQstatus(T.s.sql) == CONNECTION_OK);
    return ready_ms;
}

int main(int argc, char **argv)
{
    setvbuf(stdout, NULL, _IONBF, 0); /* the numbers reach the log even when a check aborts */
    for (int i = 1; i < argc; i += 2) {
        char *end = NULL;
        long v = i + 1 < argc ? strtol(argv[i + 1], &end, 10) : 0;
        if (strcmp(argv[i], "--outage-ms") != 0 || !end || *end || v < 1000 || v > MAX_OUTAGE_MS) {
            fprintf(stderr, "usage: %s [--outage-ms N (1000..%d)]\n", argv[0], MAX_OUTAGE_MS);
            return 2;
        }
        outage_ms = (int)v;
    }
    if (!getenv("FB_BINARY_DIR")) {
        printf("SKIPPED: run through ctest\n");
        return 77;
    }
    fbt_pg_create(&PG);
    atexit(cleanup);
    const char *flags[] = {"--db-wait-ms", "500", "--request-timeout-ms", "2000", NULL};
    e2e_start_on(&T, PG.url, flags);
    printf("%d steps, a checkpoint every %d; PostgreSQL stops at the hold at step %d and the"
           " array is held at each checkpoint to step %d while it is down\n",
           STEPS, CHECKPOINT_EVERY, HOLD_BEFORE, HOLD_LAST);
    /* held by name before the sweep exists, so that no array passes the step first */
    e2e_hold(&T, HOLD_KEY, HOLD_BEFORE);
    worker = e2e_worker(&T, "w1");
    char ids[2][64], sql[512];
    submit_sweep(ids);
    double t0 = fbt_now_ms();
    CHECK_INT_EQ(e2e_wait_held(&T, HOLD_KEY, WAIT_S), HOLD_BEFORE);
    /* one array, at the held step, its checkpoints written the ordinary way */
    wait_recorded(ids, HOLD_BEFORE, "both jobs at the first hold, its checkpoint recorded");
    snprintf(sql, sizeof sql, "SELECT count(DISTINCT group_id) FROM jobs WHERE id IN ('%s', '%s')",
             ids[0], ids[1]);
    CHECK_INT_EQ(sql_ll(sql), 1);
    for (int i = 0; i < 2; i++)
        CHECK_INT_EQ(progress_rows(ids[i], HOLD_BEFORE, STEPS), 0);
    check_alive("before the outage");

    double down_ms = outage();
    double ready_ms = wait_ready();
    /* still held at HOLD_LAST: what fuseboxd kept through the outage reaches the database */
    wait_recorded(ids, HOLD_LAST, "the progress and checkpoints of the outage written");
    long long kept = 0;
    for (int i = 0; i < 2; i++)
        kept += check_outage_rows(ids[i]);
    e2e_release(&T, HOLD_KEY);

    for (int i = 0; i < 2; i++)
        e2e_wait_state(&T, T.key, ids[i], "completed", WAIT_S);
    printf("both jobs completed %.0f ms after submission\n", fbt_now_ms() - t0);
    check_alive("after training");
    CHECK_INT_EQ(http_status("/readyz"), 200);

    for (int i = 0; i < 2; i++) {
        check_checkpoints(ids[i]);
        char want[24];
        snprintf(want, sizeof want, "%d", STEPS);
        CHECK_STR_EQ(e2e_job_field(&T, T.key, ids[i], "step"), want);
        /* the array was never lost: trained once, never sent back to the queue */
        snprintf(sql, sizeof sql,
                 "SELECT count(*) FILTER (WHERE kind = 'requeued') || ' ' ||"
                 " count(*) FILTER (WHERE kind = 'started') FROM job_events WHERE job_id = '%s'",
                 ids[i]);
        CHECK_STR_EQ(fbt_sql_value(&T.s, sql), "0 1");
        CHECK_STR_EQ(e2e_job_field(&T, T.key, ids[i], "restarts"), "0");
    }
    /* every event the worker sent was acknowledged, hence committed */
    CHECK_INT_EQ(e2e_kill(worker, SIGTERM), 0);
    char log[400], cmd[600];
    snprintf(log, sizeof log, "%s/worker-w1.log", T.root);
    snprintf(cmd, sizeof cmd, "grep -q 'drained; every event acknowledged' '%s'", log);
    if (fbt_run(cmd) != 0) e2e_dump(&T);
    CHECK_INT_EQ(fbt_run(cmd), 0);
    CHECK(waitpid(T.s.pid, NULL, WNOHANG) == 0);
    /* the checks above passed, so every count of loss here is zero */
    printf("result: pg-outage outage_ms=%.0f jobs=2 lost_checkpoints=0 lost_events=0"
           " progress_rows_held_in_memory=%lld fuseboxd_exits=0 ready_ms_after_restart=%.0f\n",
           down_ms, kept, ready_ms);
    e2e_finish(&T);
    printf("ok\n");
    return 0;
}
