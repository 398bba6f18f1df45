/*
 * Rounds of SIGKILL on a random worker during a running sweep, end to end
 * on real processes.  Two workers train two sweeps of two trials each (two
 * arrays: the sweeps differ in data_seed, so they never fuse); each round kills
 * one of the workers holding an array, at random, once every job has
 * checkpointed again since the round before, checks that the arrays it
 * held return to the queue within the heartbeat timeout, and starts a
 * replacement worker (the scheduler tends to put requeued arrays on the
 * surviving worker, so most rounds kill the worker that holds both).  The
 * jobs are of a fixed size: the workers' step hook holds each one three
 * checkpoints past the step it last resumed from, so the kill lands anywhere
 * between its next checkpoint and that hold, and no job can finish before
 * the rounds are over, however fast or loaded the machine.
 * Counted: jobs lost (every job must complete, restarts unused), requeues
 * (exactly one "worker lost" per array a kill hit; the only other requeue a
 * job may see is the fair share's migration off a shared device once a
 * replacement worker stands idle), the work each kill made a job redo
 * (the step it had reported minus the step it resumed from: at most
 * checkpoint_every), and each model's distance to an uninterrupted
 * fusebox-train run of the same specs (within the tolerance of a member
 * that resumed outside its original array: Adam amplifies the rounding of
 * other GEMM shapes to a few 1e-3).  Short mode 3 rounds, long mode 20.
 */
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "check.h"
#include "rel.h"

#define N_SWEEPS 2
#define N_TRIALS 2
#define N_JOBS (N_SWEEPS * N_TRIALS)
#define EVERY 500 /* checkpoint_every */
#define AHEAD 3   /* checkpoints between the step a job resumed from and its hold */
#define TOLERANCE 1e-2
#define HIDDEN 512

static e2e T;
static char ids[N_JOBS][64], names[N_JOBS][64];

typedef struct live_worker {
    char name[32];
    pid_t pid;
} live_worker;

static live_worker workers[2];
static int n_started;

static void start_worker(live_worker *w)
{
    snprintf(w->name, sizeof w->name, "w%d", n_started++);
    w->pid = e2e_worker(&T, w->name);
}

static const char *id_list(void)
{
    static char buf[400];
    snprintf(buf, sizeof buf, "'%s', '%s', '%s', '%s'", ids[0], ids[1], ids[2], ids[3]);
    return buf;
}

static long long job_ll(int j, const char *column)
{
    char sql[256];
    snprintf(sql, sizeof sql, "SELECT %s FROM jobs WHERE id = '%s'", column, ids[j]);
    return rel_sql_ll(&T, sql);
}

/* Job j's requeued events whose message starts with why: "worker lost" for
 * a kill; "left its array (" for a member that left on the server's request,
 * as when the fair share migrates an array off a device two arrays share
 * (a replacement worker comes up idle). */
static long long requeues_for(int j, const char *why)
{
    char sql[320];
    snprintf(sql, sizeof sql,
             "SELECT count(*) FROM job_events WHERE job_id = '%s' AND kind = 'requeued'"
             " AND starts_with(message, '%s')",
             ids[j], why);
    return rel_sql_ll(&T, sql);
}

static long long requeues(int j)
{
    return requeues_for(j, "worker lost");
}

/* Whether job j trains in an array assigned to the worker named name. */
static bool runs_on(int j, const char *name)
{
    char sql[512];
    snprintf(sql, sizeof sql,
             "SELECT count(*) FROM jobs j JOIN groups g ON g.id = j.group_id JOIN workers w ON"
             " w.id = g.worker_id WHERE j.id = '%s' AND j.in_group AND w.name = '%s'",
             ids[j], name);
    return rel_sql_ll(&T, sql) > 0;
}

int main(int argc, char **argv)
{
    setvbuf(stdout, NULL, _IONBF, 0); /* the numbers reach the log even when a check aborts */
    int rounds = rel_rounds(argc, argv, 3, 20);
    const char *seed_env = getenv("FUSEBOX_RELIABILITY_SEED");
    unsigned seed = seed_env ? (unsigned)strtoul(seed_env, NULL, 10) : (unsigned)time(NULL);
    printf("%d rounds, seed %u (FUSEBOX_RELIABILITY_SEED repeats a run)\n", rounds, seed);
    srand(seed);
    e2e_start(&T, NULL);
    /* Fixed sizes, whatever the machine's speed: a hold keeps every job short of the end
     * until the rounds are over (at most AHEAD * EVERY past the step it resumed from in each
     * round), so the sweep certainly outlasts them. */
    int every = EVERY, steps = EVERY * AHEAD * (rounds + 1);
    printf("%d steps, a checkpoint every %d\n", steps, every);
    for (int i = 0; i < 2; i++)
        start_worker(&workers[i]);
    /* each trial's first hold is set by name before it is submitted: no array passes it */
    for (int s = 0; s < N_SWEEPS; s++)
        for (int t = 0; t < N_TRIALS; t++) {
            char trial[40];
            snprintf(trial, sizeof trial, "kill%d-%d", s, t);
            e2e_hold(&T, trial, AHEAD * every);
        }
    for (int s = 0; s < N_SWEEPS; s++) {
        char name[32];
        snprintf(name, sizeof name, "kill%d", s);
        rel_sweep(&T, name, HIDDEN, 128, s, steps, every, "[0.002, 0.01]", N_TRIALS,
                  ids + s * N_TRIALS, names + s * N_TRIALS);
    }
    for (int j = 0; j < N_JOBS; j++) {
        char trial[40];
        snprintf(trial, sizeof trial, "kill%d-%d", j / N_TRIALS, j % N_TRIALS);
        CHECK_STR_EQ(names[j], trial);
    }

    long long resume_floor[N_JOBS] = {0}, want_requeues[N_JOBS] = {0};
    long long worst_redone = 0, hits = 0;
    double worst_requeue_ms = 0;
    char sql[1024];
    for (int r = 0; r < rounds; r++) {
        /* every job has checkpointed again since the last round, and trains */
        char cond[600] = "";
        size_t len = 0;
        for (int j = 0; j < N_JOBS; j++)
            len += (size_t)snprintf(cond + len, sizeof cond - len,
                                    "%s(id = '%s' AND resume_step >= %lld)", j ? " OR " : "",
                                    ids[j], resume_floor[j] + every);
        snprintf(sql, sizeof sql,
                 "SELECT count(*) FILTER (WHERE state = 'running' AND (%s)) = %d FROM jobs"
                 " WHERE id IN (%s)",
                 cond, N_JOBS, id_list());
        e2e_wait_sql(&T, sql, 120, "every job running past a new checkpoint");
        snprintf(sql, sizeof sql, "SELECT bool_or(state = 'completed') FROM jobs WHERE id IN (%s)",
                 id_list());
        CHECK_STR_EQ(fbt_sql_value(&T.s, sql), "f"); /* the holds keep every job short of it */

        /* a random one of the workers that hold an array (both, when the
         * scheduler spread them): a kill of an idle worker proves nothing */
        int holders[2], n_holders = 0;
        for (int i = 0; i < 2; i++) {
            bool holds = false;
            for (int j = 0; j < N_JOBS; j++)
                holds = holds || runs_on(j, workers[i].name);
            if (holds) holders[n_holders++] = i;
        }
        CHECK(n_holders > 0);
        live_worker *w = &workers[holders[rand() % n_holders]];
        bool hit[N_JOBS];
        /* how far each job had trained, as far as the server knows: the
         * step of its last progress report or of its last checkpoint,
         * whichever arrived later */
        long long step_at_kill[N_JOBS], resume_at_kill[N_JOBS];
        for (int j = 0; j < N_JOBS; j++) {
            hit[j] = runs_on(j, w->name);
            resume_at_kill[j] = job_ll(j, "resume_step");
            step_at_kill[j] = job_ll(j, "step");
            if (step_at_kill[j] < resume_at_kill[j]) step_at_kill[j] = resume_at_kill[j];
        }
        CHECK_INT_EQ(e2e_kill(w->pid, SIGKILL), 128 + SIGKILL);
        double t0 = fbt_now_ms();
        int n_hit = 0;
        for (int j = 0; j < N_JOBS; j++) {
            if (!hit[j]) continue;
            n_hit++;
            want_requeues[j]++;
            while (requeues(j) < want_requeues[j]) {
                if (fbt_now_ms() - t0 > 20000) {
                    fprintf(stderr, "job %d was not requeued after its worker died\n", j);
                    e2e_dump(&T);
                    CHECK(0);
                }
                rel_sleep_ms(50);
            }
        }
        double requeue_ms = n_hit ? fbt_now_ms() - t0 : 0;
        if (requeue_ms > worst_requeue_ms) worst_requeue_ms = requeue_ms;
        for (int j = 0; j < N_JOBS; j++) {
            long long resume = job_ll(j, "resume_step");
            if (hit[j]) {
                long long redone = step_at_kill[j] - resume;
                if (redone > worst_redone) worst_redone = redone;
                printf("round %d: job %d was at step %lld, resumes from %lld (redoes %lld)\n", r, j,
                       step_at_kill[j], resume, redone > 0 ? redone : 0);
                CHECK(redone <= every);
                CHECK(resume >= resume_at_kill[j]); /* no recorded checkpoint was lost */
            }
            resume_floor[j] = resume;
            /* the next round's hold: AHEAD checkpoints on, wherever the job
             * trains (a requeued one from its resume step, on whichever worker) */
            CHECK_INT_EQ(resume % every, 0);
            e2e_hold(&T, names[j], resume + AHEAD * every);
        }
        hits += n_hit > 0;
        printf("round %d: killed %s (%d jobs on it), requeued within %.0f ms\n", r, w->name, n_hit,
               requeue_ms);
        /* decided by the 1500 ms heartbeat timeout on the real clock: the exact decision is
         * test_dispatch_flood's and test_dispatch_lifecycle's, on a manual clock; here the
         * time is printed and bounded only for liveness, at ten times the timeout */
        CHECK(n_hit > 0 && requeue_ms < 10 * 1500);
        start_worker(w);
    }

    for (int j = 0; j < N_JOBS; j++) {
        CHECK(resume_floor[j] + AHEAD * every <= steps);
        e2e_release(&T, names[j]);
    }
    for (int j = 0; j < N_JOBS; j++)
        e2e_wait_state(&T, T.key, ids[j], "completed", 300);
    int lost = 0;
    long long migrations = 0;
    for (int j = 0; j < N_JOBS; j++) {
        lost += strcmp(e2e_job_field(&T, T.key, ids[j], "state"), "completed") != 0;
        CHECK_STR_EQ(e2e_job_field(&T, T.key, ids[j], "restarts"), "0");
        CHECK_INT_EQ(requeues(j), want_requeues[j]);
        long long moved = requeues_for(j, "left its array (");
        migrations += moved;
        /* and no requeue of another cause */
        snprintf(sql, sizeof sql,
                 "SELECT count(*) FROM job_events WHERE job_id = '%s' AND kind = 'requeued'",
                 ids[j]);
        CHECK_INT_EQ(rel_sql_ll(&T, sql), want_requeues[j] + moved);
        snprintf(sql, sizeof sql,
                 "SELECT count(*) FROM job_events WHERE job_id = '%s' AND kind = 'started'",
                 ids[j]);
        CHECK_INT_EQ(rel_sql_ll(&T, sql), want_requeues[j] + moved + 1);
        CHECK_INT_EQ(job_ll(j, "step"), steps);
    }
    double worst_diff = 0;
    for (int s = 0; s < N_SWEEPS; s++) {
        char tag[16];
        snprintf(tag, sizeof tag, "sweep%d", s);
        double d =
            rel_max_diff_to_reference(&T, ids + s * N_TRIALS, names + s * N_TRIALS, N_TRIALS, tag);
        if (d > worst_diff) worst_diff = d;
    }
    CHECK(worst_diff <= TOLERANCE);
    long long total_requeues = 0;
    for (int j = 0; j < N_JOBS; j++)
        total_requeues += want_requeues[j];
    printf("result: worker-sigkill rounds=%d hits=%lld jobs=%d lost=%d requeues=%lld"
           " migrations=%lld max_redone_steps=%lld checkpoint_every=%d max_requeue_ms=%.0f"
           " max_model_diff=%g\n",
           rounds, hits, N_JOBS, lost, total_requeues, migrations, worst_redone, every,
           worst_requeue_ms, worst_diff);
    CHECK_INT_EQ(lost, 0);
    for (int i = 0; i < 2; i++)
        CHECK_INT_EQ(e2e_kill(workers[i].pid, SIGTERM), 0);
    e2e_finish(&T);
    printf("ok\n");
    return 0;
}
