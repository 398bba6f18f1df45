/*
 * A worker cut off from the server without dying, end to end on real
 * processes.  The worker runs in a network namespace of the test's own,
 * joined to the host by a veth pair (made with ip(8) as root; skipped with
 * 77 where that is not permitted), and fuseboxd listens for workers on all
 * addresses.  Once its array of two jobs has checkpointed, the host end of
 * the pair goes down: the worker keeps training, but nothing reaches the
 * server.  The order of events is fixed by the workers' test step hook,
 * not by the machine's speed: the array is held right after its second
 * checkpoint (step HOLD_AT) until both jobs have it recorded, and only then
 * does the link go down.  Checked: after the heartbeat timeout the jobs
 * return to the queue (restarts unused) and a second worker, on loopback,
 * resumes them from their checkpoint in a new generation of the array.  The
 * hold is per job and both workers read it, so the stale worker's old
 * generation stays held, alive: the hold moves one step on, the stale
 * worker trains that step behind the cut and holds again, and the new
 * generation resumes from the checkpoint of HOLD_AT and holds at that step
 * too.  Then the link comes back while the stale worker still runs its old
 * generation: fuseboxd must reject its reports by generation number and
 * stop its array; only after that is the hold released and the new
 * generation trains to the end.  Counted: jobs lost,
 * stale reports rejected, and jobs that ran twice (a job completed twice, a
 * 'started' of the old generation after the requeue, a checkpoint step
 * recorded twice, or a model that differs from an uninterrupted
 * fusebox-train run at all: the members resume together from the held
 * checkpoint, where a kill that fell anywhere needed a 1e-2 tolerance).
 */
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "check.h"
#include "pgctl.h"
#include "ports.h"
#include "rel.h"

#define HIDDEN 512
/* fixed sizes: the step hook, not the job's length, keeps the array mid-run */
#define EVERY 20
#define STEPS 100
#define HOLD_AT (2 * EVERY)
/* a liveness bound on the requeue, 10 times the heartbeat timeout it exercises (the test
 * is labelled realtime): the decision is the heartbeat timeout's, not this bound's */
#define REQUEUE_BOUND_MS (10 * E2E_HEARTBEAT_TIMEOUT_MS)

static e2e T;
static char ns[32], host_if[16], ns_if[16];
static bool net_made;

static void cleanup(void)
{
    if (!net_made) return;
    char cmd[200];
    snprintf(cmd, sizeof cmd, "ip link del %s 2>/dev/null; ip netns del %s 2>/dev/null", host_if,
             ns);
    if (system(cmd) != 0) fprintf(stderr, "could not remove %s\n", ns);
    net_made = false;
}

/* Makes the namespace and the veth pair; false when this machine refuses. */
static bool make_net(int x)
{
    char cmd[1024];
    snprintf(cmd, sizeof cmd,
             "ip netns add %s && ip link add %s type veth peer name %s && "
             "ip link set %s netns %s && ip addr add 10.213.%d.1/30 dev %s && "
             "ip link set %s up && ip netns exec %s ip addr add 10.213.%d.2/30 dev %s && "
             "ip netns exec %s ip link set %s up && ip netns exec %s ip link set lo up",
             ns, host_if, ns_if, ns_if, ns, x, host_if, host_if, ns, x, ns_if, ns, ns_if, ns);
    net_made = true;
    if (fbt_run(cmd) != 0) {
        cleanup();
        return false;
    }
    return true;
}

static void link_set(const char *state)
{
    char cmd[128];
    snprintf(cmd, sizeof cmd, "ip link set %s %s", host_if, state);
    CHECK_INT_EQ(fbt_run(cmd), 0);
}

int main(void)
{
    setvbuf(stdout, NULL, _IONBF, 0); /* the numbers reach the log even when a check aborts */
    if (!getenv("FB_BINARY_DIR")) {
        printf("SKIPPED: run through ctest\n");
        return 77;
    }
    fbt_require_database();
    if (geteuid() != 0 || fbt_run("command -v ip > /dev/null")) {
        printf("SKIPPED: needs root and ip(8)\n");
        return 77;
    }
    int x = (int)(getpid() % 250) + 1;
    snprintf(ns, sizeof ns, "fbrel%d", (int)getpid());
    snprintf(host_if, sizeof host_if, "fbr%dh", (int)getpid() % 1000000);
    snprintf(ns_if, sizeof ns_if, "fbr%dn", (int)getpid() % 1000000);
    atexit(cleanup);
    if (!make_net(x)) {
        printf("SKIPPED: cannot make a network namespace and a veth pair here\n");
        return 77;
    }
    int port = fbt_free_port();
    char listen[64], via_veth[64], via_lo[64];
    snprintf(listen, sizeof listen, "tcp://0.0.0.0:%d", port);
    snprintf(via_veth, sizeof via_veth, "tcp://10.213.%d.1:%d", x, port);
    snprintf(via_lo, sizeof via_lo, "tcp://127.0.0.1:%d", port);
    const char *flags[] = {"--worker-listen", listen, NULL};
    e2e_start(&T, flags);
    char ids[2][64], names[2][64], sql[1024];
    /* held by the first trial's name before the sweep exists, so that the array cannot
     * pass the step first; a hold of one member holds the whole array */
    const char *key = "netsplit-0";
    e2e_hold(&T, key, HOLD_AT);
    const char *wrap[] = {"ip", "netns", "exec", ns, NULL};
    pid_t cut = e2e_worker_via(&T, "cut", via_veth, wrap);
    rel_sweep(&T, "netsplit", HIDDEN, 128, 0, STEPS, EVERY, "[0.002, 0.01]", 2, ids, names);
    CHECK_STR_EQ(names[0], key);
    CHECK_INT_EQ(e2e_wait_held(&T, key, 120), HOLD_AT);
    snprintf(sql, sizeof sql,
             "SELECT bool_and(state = 'running' AND resume_step = %d) FROM jobs"
             " WHERE id IN ('%s', '%s')",
             HOLD_AT, ids[0], ids[1]);
    e2e_wait_sql(&T, sql, 60, "both jobs running, held, their second checkpoint recorded");
    /* one array: the hold stops both jobs */
    char group[64];
    snprintf(group, sizeof group, "%s", e2e_job_field(&T, T.key, ids[0], "group_id"));
    CHECK_STR_EQ(e2e_job_field(&T, T.key, ids[1], "group_id"), group);

    link_set("down");
    double t0 = fbt_now_ms();
    snprintf(sql, sizeof sql,
             "SELECT count(*) = 2 FROM job_events WHERE job_id IN ('%s', '%s')"
             " AND kind = 'requeued'",
             ids[0], ids[1]);
    e2e_wait_sql(&T, sql, 2 * REQUEUE_BOUND_MS / 1000,
                 "the cut-off worker's jobs to return to the queue");
    double requeue_ms = fbt_now_ms() - t0;
    printf("jobs requeued %.0f ms after the link went down (heartbeat timeout %d ms)\n", requeue_ms,
           E2E_HEARTBEAT_TIMEOUT_MS);
    int st;
    CHECK(waitpid(cut, &st, WNOHANG) == 0); /* the cut-off worker lives, held */
    /* the hold moves a step on: the stale worker's old generation trains that step behind
     * the cut and holds again (its held file says so, before any other worker exists); the
     * new generation must train it too, so that its jobs are "started" and running, and
     * then holds at the same step */
    e2e_hold(&T, key, HOLD_AT + 1);
    CHECK_INT_EQ(e2e_wait_held(&T, key, 120), HOLD_AT + 1);
    pid_t fresh = e2e_worker_via(&T, "fresh", via_lo, NULL);
    snprintf(sql, sizeof sql,
             "SELECT bool_and(state = 'running' AND group_id <> '%s') FROM jobs"
             " WHERE id IN ('%s', '%s')",
             group, ids[0], ids[1]);
    e2e_wait_sql(&T, sql, 60, "the jobs running again in a new array");
    char fresh_log[400], held_line[80];
    snprintf(fresh_log, sizeof fresh_log, "%s/worker-fresh.log", T.root);
    snprintf(held_line, sizeof held_line, "held at step %d by hold-%s", HOLD_AT + 1, key);
    rel_wait_count(&T, fresh_log, held_line, 1, 120, "the new generation to hold");
    /* the old array's generation still runs behind the cut, held */
    CHECK(waitpid(cut, &st, WNOHANG) == 0);
    link_set("up");
    double up_at = fbt_now_ms();
    printf("link back up after %.0f ms\n", up_at - t0);
    /* the stale worker speaks (a heartbeat every 200 ms, progress of its held array) and is
     * refused before the new generation goes on; 60 s is a liveness bound */
    double waited = fbt_now_ms();
    while (rel_count_in(T.s.log_path, "stale event dropped") +
               rel_count_in(T.s.log_path, "runs a stale array") ==
           0) {
        if (fbt_now_ms() - waited > 60000) {
            fprintf(stderr, "fuseboxd never refused the stale worker\n");
            e2e_dump(&T);
            CHECK(0);
        }
        rel_sleep_ms(20);
    }
    printf("the stale generation refused %.0f ms after the link came back\n", fbt_now_ms() - up_at);
    /* and stopped where it was held: it never trains past the hold (its group's end ends
     * the hold, and nothing else can before the release) */
    char cut_log[400], unheld_line[80];
    snprintf(cut_log, sizeof cut_log, "%s/worker-cut.log", T.root);
    snprintf(unheld_line, sizeof unheld_line, "the hold at step %d ends", HOLD_AT + 1);
    rel_wait_count(&T, cut_log, unheld_line, 1, 60, "the stale array to stop");
    CHECK(waitpid(cut, &st, WNOHANG) == 0); /* the worker itself lives on */
    e2e_release(&T, key);

    for (int i = 0; i < 2; i++)
        e2e_wait_state(&T, T.key, ids[i], "completed", 240);
    int stale_events = rel_count_in(T.s.log_path, "stale event dropped");
    int stale_arrays = rel_count_in(T.s.log_path, "runs a stale array");
    int lost = 0, twice = 0;
    for (int i = 0; i < 2; i++) {
        lost += strcmp(e2e_job_field(&T, T.key, ids[i], "state"), "completed") != 0;
        CHECK_STR_EQ(e2e_job_field(&T, T.key, ids[i], "restarts"), "0");
        snprintf(sql, sizeof sql,
                 "SELECT count(*) FILTER (WHERE kind = 'completed') > 1 OR count(*) FILTER"
                 " (WHERE kind = 'started') <> 2 OR count(*) FILTER (WHERE kind = 'requeued')"
                 " <> 1 FROM job_events WHERE job_id = '%s'",
                 ids[i]);
        twice += strcmp(fbt_sql_value(&T.s, sql), "t") == 0;
        snprintf(sql, sizeof sql,
                 "SELECT count(*) <> count(DISTINCT step) FROM checkpoints WHERE job_id = '%s'"
                 " AND kind = 'state'",
                 ids[i]);
        twice += strcmp(fbt_sql_value(&T.s, sql), "t") == 0;
    }
    double diff = rel_max_diff_to_reference(&T, ids, names, 2, "netsplit");
    /* both members resume together from the checkpoint of HOLD_AT (the hold made sure it
     * was recorded), so the models equal the uninterrupted run bit for bit */
    twice += !(diff == 0);
    printf("result: netsplit jobs=2 lost=%d ran_twice=%d requeue_ms=%.0f stale_events_rejected=%d"
           " stale_array_stops=%d max_model_diff=%g\n",
           lost, twice, requeue_ms, stale_events, stale_arrays, diff);
    CHECK_INT_EQ(lost, 0);
    CHECK_INT_EQ(twice, 0);
    CHECK(requeue_ms < REQUEUE_BOUND_MS);
    /* the stale generation was refused: its array told to stop, or its reports dropped */
    CHECK(stale_events + stale_arrays > 0);
    /* and briefly: a returning link delivers every HELLO the worker queued during the outage
     * at once, and answering each with a stop and a resend of the whole outbox made 900
     * stale events and 50 stops of one array */
    CHECK(stale_arrays <= 5);
    CHECK(stale_events <= 200);
    CHECK_INT_EQ(e2e_kill(fresh, SIGTERM), 0);
    e2e_kill(cut, SIGKILL);
    e2e_finish(&T);
    cleanup();
    printf("ok\n");
    return 0;
}
