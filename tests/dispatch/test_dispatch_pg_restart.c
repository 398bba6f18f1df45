/*
 * PostgreSQL restarted under a training array, end to end on real processes:
 * fuseboxd keeps the progress reports and events of its workers in memory
 * while the database is away and writes them when it is back, and it
 * acknowledges an event to the worker only after its COMMIT, so nothing is
 * lost.  The test runs its own PostgreSQL cluster (pgctl.h; the shared test
 * server must never be restarted), starts fuseboxd and one worker on it,
 * submits a sweep of two trials, and stops PostgreSQL like a crash
 * (immediate) for a few seconds while the array trains and checkpoints.
 * Afterwards: both jobs completed; job_metrics holds progress rows that were
 * trained while PostgreSQL was down; every state checkpoint is recorded,
 * including those taken during the outage; fuseboxd never exited and is
 * ready again; the array was never lost (no 'requeued' event, one 'started')
 * and the worker's events were all acknowledged.  Skipped where the
 * PostgreSQL server programs are missing.
 *
 * "--outage-ms N" makes the outage N ms long (1000 to 60000) and the run
 * longer by as much: the reliability suite (tests/reliability/faults) runs
 * it with a 10 s outage and reads the "result:" line it prints.
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

/*
 * The array: two MLPs 16-HIDDEN-4 at batch 128.  How fast it trains depends
 * on the build (sanitizers make it several times slower) and on what else
 * the machine runs, so the test measures it first with fusebox-train and
 * sizes the run from that: about TRAIN_S seconds of training with a
 * checkpoint every CHECKPOINT_S, so that the outage of OUTAGE_MS and
 * fuseboxd's reconnection after it fall well inside the run, and several
 * checkpoints inside the outage.
 */
#define HIDDEN 1024
#define CALIBRATION_EVERY 10
#define CALIBRATION_MS 1000
#define TRAIN_S 12.0
#define CHECKPOINT_S 0.4
#define OUTAGE_MS 2500
#define MAX_OUTAGE_MS 60000
/* the worker's --progress-ms (e2e_worker): reports are at least this far apart */
#define PROGRESS_MS 200

static fbt_pg PG;
static e2e T;
static pid_t worker;
static int steps, checkpoint_every; /* of the run, from the measured speed */
static int outage_ms = OUTAGE_MS;   /* --outage-ms */

static void cleanup(void) { fbt_pg_destroy(&PG); }

static void sleep_ms(int ms)
{
    struct timespec ts = {ms / 1000, (long)(ms % 1000) * 1000000L};
    nanosleep(&ts, NULL);
}

/* Wall-clock seconds: the clock PostgreSQL's now() reads. */
static double wall_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
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

/* The members' common spec fields (no braces), in buf. */
static void common_fields(char *buf, size_t cap, int n_steps, int every)
{
    snprintf(buf, cap,
             "\"dataset\": \"synth\", \"model\": {\"input\": [16], \"layers\": [{\"type\":"
             " \"linear\", \"out\": %d}, {\"type\": \"relu\"}, {\"type\": \"linear\", \"out\":"
             " 4}]}, \"batch_size\": 128, \"steps\": %d, \"eval_every\": 0,"
             " \"checkpoint_every\": %d, \"seed\": 5",
             HIDDEN, n_steps, every);
}

/*
 * Steps per second of the array here, by fusebox-train (the same training
 * runtime as the worker's, on one thread as there): it trains the array
 * with a step report every CALIBRATION_EVERY steps, which the test
 * timestamps as they come for CALIBRATION_MS after the first, then stops it.
 * Start-up and the first steps do not count.
 */
static double measure_speed(void)
{
    char common[1024], spec[1400], files[2][400];
    static const double lrs[2] = {0.002, 0.01};
    common_fields(common, sizeof common, 100000000, 0);
    for (int i = 0; i < 2; i++) {
        snprintf(spec, sizeof spec,
                 "{\"name\": \"calibrate-%d\", %s, \"optimizer\": {\"type\": \"adam\","
                 " \"lr\": %g}}",
                 i, common, lrs[i]);
        snprintf(files[i], sizeof files[i], "%s/calibrate-%d.json", T.root, i);
        e2e_write(files[i], spec);
    }
    const char *paths[2] = {files[0], files[1]};
    return e2e_train_speed(&T, paths, 2, "calibrate-0", CALIBRATION_EVERY, CALIBRATION_MS);
}

/* A sweep of two trials over lr (the array of measure_speed); ids in
 * submission order. */
static void submit_sweep(char (*ids)[64])
{
    char common[1024], body[2048];
    common_fields(common, sizeof common, steps, checkpoint_every);
    snprintf(body, sizeof body,
             "{\"name\": \"pgrestart\", \"base\": {%s, \"optimizer\": {\"type\": \"adam\","
             " \"lr\": 0.001}}, \"search\": {\"type\": \"grid\", \"params\":"
             " {\"optimizer.lr\": {\"values\": [0.002, 0.01]}}}}",
             common);
    e2e_submit_sweep(&T, T.key, body, 2, ids, NULL);
}

static long long sql_ll(const char *sql)
{
    const char *v = fbt_sql_value(&T.s, sql);
    CHECK(v[0] != '\0'); /* NULL: no such rows */
    return atoll(v);
}

static double sql_double(const char *sql)
{
    const char *v = fbt_sql_value(&T.s, sql);
    CHECK(v[0] != '\0');
    return atof(v);
}

/* How long after its first row the backlog may take to be written.  Reports that arrive
 * meanwhile count as edges (check_progress), so the width does not loosen the check. */
#define BACKLOG_WINDOW_MS 1500

/* How many reports, at least PROGRESS_MS apart, can arrive within seconds s. */
static int reports_within(double s)
{
    return s <= 0 ? 1 : (int)(s * 1000.0 / PROGRESS_MS) + 1;
}

/*
 * The progress rows of a job, split at the outage.  Every row is written by
 * a transaction that began (recorded_at, now()) after fuseboxd received the
 * report, and a report carries the step trained when it was sent, so a
 * row's step was trained by the time its report arrived.  Rows from before
 * the stop were written before t_down; the reports fuseboxd held in memory
 * were written by its first transactions after PostgreSQL was back (a flush
 * commits every few reports, and may yield to a plan): the backlog, every
 * row written within BACKLOG_WINDOW_MS of the first one (rows without a
 * loss, which other writers of job_metrics may commit first, do not count).
 * Of the backlog, some reports may have arrived just before the stop (after
 * the last transaction before it) or after the restart (before fuseboxd
 * reconnected, or while the backlog was written); at most reports_within()
 * of each such edge.  The rest were trained, reported and
 * kept while PostgreSQL was down, and there must be some.
 */
static long long check_progress(const char *id, double t_down, double t_up)
{
    char sql[2048], pre[256], backlog[1024];
    double t_mid = (t_down + t_up) / 2; /* nothing can commit while it is down */
    snprintf(pre, sizeof pre,
             "job_id = '%s' AND loss IS NOT NULL AND recorded_at < to_timestamp(%.6f)", id, t_mid);
    snprintf(backlog, sizeof backlog,
             "job_id = '%s' AND loss IS NOT NULL AND recorded_at BETWEEN (SELECT min(recorded_at)"
             " FROM job_metrics WHERE job_id = '%s' AND loss IS NOT NULL"
             " AND recorded_at >= to_timestamp(%.6f)) AND (SELECT min(recorded_at)"
             " FROM job_metrics WHERE job_id = '%s' AND loss IS NOT NULL"
             " AND recorded_at >= to_timestamp(%.6f)) + interval '%d ms'",
             id, id, t_mid, id, t_mid, BACKLOG_WINDOW_MS);
    snprintf(sql, sizeof sql, "SELECT max(step) FROM job_metrics WHERE %s", pre);
    long long lo = sql_ll(sql);
    snprintf(sql, sizeof sql,
             "SELECT %.6f - extract(epoch FROM max(recorded_at)) FROM job_metrics WHERE %s", t_down,
             pre);
    double before_stop = sql_double(sql);
    snprintf(sql, sizeof sql,
             "SELECT extract(epoch FROM max(recorded_at)) - %.6f FROM job_metrics WHERE %s", t_up,
             backlog);
    double after_restart = sql_double(sql);
    snprintf(sql, sizeof sql, "SELECT count(*) FROM job_metrics WHERE %s", backlog);
    long long n = sql_ll(sql);
    snprintf(sql, sizeof sql, "SELECT min(step) FROM job_metrics WHERE %s", backlog);
    long long first = sql_ll(sql);
    snprintf(sql, sizeof sql, "SELECT max(step) FROM job_metrics WHERE %s", backlog);
    long long last = sql_ll(sql);
    int edges = reports_within(before_stop) + reports_within(after_restart);
    printf("job %s: progress rows up to step %lld before the stop; the backlog written after the "
           "restart has %lld rows, steps %lld to %lld, at most %d of them from the edges "
           "(%.0f ms before the stop, %.0f ms from the restart to the backlog's commit)\n",
           id, lo, n, first, last, edges, before_stop * 1e3, after_restart * 1e3);
    CHECK(first > lo);
    CHECK(n >= edges + 2);
    /* checkpoints were taken inside the outage too (the sizing works here) */
    snprintf(sql, sizeof sql,
             "SELECT count(*) FROM checkpoints WHERE job_id = '%s' AND kind = 'state'"
             " AND step > %lld AND step <= %lld",
             id, lo, last);
    long long ck = sql_ll(sql);
    printf("job %s: %lld state checkpoints at steps %lld to %lld\n", id, ck, lo + 1, last);
    CHECK(ck >= 2);
    return n;
}

static void check_checkpoints(const char *id)
{
    char sql[512];
    long long want = (steps - 1) / checkpoint_every; /* the last step ends with the model */
    snprintf(sql, sizeof sql,
             "SELECT count(*) || ' ' || count(DISTINCT step) || ' ' || coalesce(min(step), -1)"
             " || ' ' || coalesce(max(step), -1) || ' ' || count(*) FILTER (WHERE step %% %d <> 0)"
             " FROM checkpoints WHERE job_id = '%s' AND kind = 'state'",
             checkpoint_every, id);
    char expect[128];
    snprintf(expect, sizeof expect, "%lld %lld %d %lld 0", want, want, checkpoint_every,
             want * checkpoint_every);
    /* count, distinct steps, first, last, off-cadence: every one there, none twice */
    CHECK_STR_EQ(fbt_sql_value(&T.s, sql), expect);
    snprintf(sql, sizeof sql,
             "SELECT count(*) FROM job_events WHERE job_id = '%s' AND kind = 'checkpointed'",
             id);
    CHECK_INT_EQ(sql_ll(sql), want);
    snprintf(sql, sizeof sql,
             "SELECT count(*) FROM checkpoints WHERE job_id = '%s' AND kind = 'model'"
             " AND is_final AND step = %d",
             id, steps);
    CHECK_INT_EQ(sql_ll(sql), 1);
}

int main(int argc, char **argv)
{
    setvbuf(stdout, NULL, _IONBF, 0); /* the numbers reach the log even when a check aborts */
    for (int i = 1; i < argc; i += 2) {
        char *end = NULL;
        long v = i + 1 < argc ? strtol(argv[i + 1], &end, 10) : 0;
        if (strcmp(argv[i], "--outage-ms") != 0 || !end || *end || v < 1000 ||
            v > MAX_OUTAGE_MS) {
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
    double speed = measure_speed();
    checkpoint_every = (int)(speed * CHECKPOINT_S) > 1 ? (int)(speed * CHECKPOINT_S) : 1;
    /* a longer outage, a longer run: the outage must still fall inside it */
    double train_s = TRAIN_S + (outage_ms - OUTAGE_MS) / 1000.0;
    steps = checkpoint_every * (int)(train_s / CHECKPOINT_S);
    printf("the array trains %.0f steps/s here: %d steps, a checkpoint every %d\n", speed, steps,
           checkpoint_every);
    worker = e2e_worker(&T, "w1");
    char ids[2][64], sql[512];
    submit_sweep(ids);
    double t0 = fbt_now_ms();
    /* well under way, with checkpoints written the ordinary way */
    snprintf(sql, sizeof sql,
             "SELECT bool_and(state = 'running' AND resume_step >= %d) FROM jobs"
             " WHERE id IN ('%s', '%s')",
             3 * checkpoint_every, ids[0], ids[1]);
    e2e_wait_sql(&T, sql, 60, "both jobs running past their third checkpoint");
    printf("both jobs running after %.0f ms\n", fbt_now_ms() - t0);
    check_alive("before the outage");

    double t_down = wall_s();
    fbt_pg_stop(&PG, "immediate");
    double down_at = fbt_now_ms();
    bool saw_unready = false;
    while (fbt_now_ms() - down_at < outage_ms) {
        check_alive("while PostgreSQL was down");
        if (!saw_unready) {
            CHECK_INT_EQ(http_status("/readyz"), 503);
            CHECK_INT_EQ(http_status("/healthz"), 200);
            saw_unready = true;
        }
        sleep_ms(100);
    }
    double t_up = wall_s();
    fbt_pg_start(&PG);
    double down_ms = fbt_now_ms() - down_at;
    printf("PostgreSQL was down for %.0f ms\n", down_ms);
    double up_at = fbt_now_ms();
    while (http_status("/readyz") != 200) {
        check_alive("after PostgreSQL came back");
        CHECK(fbt_now_ms() - up_at < 30000);
        sleep_ms(50);
    }
    double ready_ms = fbt_now_ms() - up_at;
    printf("/readyz 200 again %.0f ms after the restart\n", ready_ms);
    /* the test's own connection went down with the server */
    PQreset(T.s.sql);
    CHECK(PQstatus(T.s.sql) == CONNECTION_OK);

    for (int i = 0; i < 2; i++) e2e_wait_state(&T, T.key, ids[i], "completed", 60);
    printf("both jobs completed %.0f ms after submission\n", fbt_now_ms() - t0);
    check_alive("after training");
    CHECK_INT_EQ(http_status("/readyz"), 200);

    long long kept = 0;
    for (int i = 0; i < 2; i++) {
        kept += check_progress(ids[i], t_down, t_up);
        check_checkpoints(ids[i]);
        char want[24];
        snprintf(want, sizeof want, "%d", steps);
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
