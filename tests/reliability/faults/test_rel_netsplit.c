/*
 * A worker cut off from the server without dying, end to end on real
 * processes.  The worker runs in a network namespace of the test's own,
 * joined to the host by a veth pair (made with ip(8) as root; skipped with
 * 77 where that is not permitted), and fuseboxd listens for workers on all
 * addresses.  Once its array of two jobs has checkpointed, the host end of
 * the pair goes down: the worker keeps training, but nothing reaches the
 * server.  Checked: within the heartbeat timeout the jobs return to the
 * queue (restarts unused) and a second worker, on loopback, resumes them
 * from their checkpoint in a new generation of the array.  Then the link
 * comes back while the stale worker still trains its old generation:
 * fuseboxd must reject its reports by generation number and stop its
 * array.  Counted: jobs lost, stale reports rejected, and jobs that ran
 * twice (a job completed twice, a 'started' of the old generation after
 * the requeue, a checkpoint step recorded twice, or a model that differs
 * from an uninterrupted fusebox-train run beyond the fused-vs-solo
 * tolerance).
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
#define CHECKPOINT_S 0.5
#define TRAIN_S 14.0
#define TOLERANCE 1e-2

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

static int count_in(const char *file, const char *text)
{
    char cmd[800];
    snprintf(cmd, sizeof cmd, "grep -c '%s' '%s' 2>/dev/null", text, file);
    FILE *p = popen(cmd, "r");
    CHECK(p != NULL);
    int n = 0;
    if (fscanf(p, "%d", &n) != 1) n = 0;
    pclose(p);
    return n;
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
    double speed = rel_steps_per_s(&T, HIDDEN, 128, 2);
    int every = (int)(speed * CHECKPOINT_S) > 1 ? (int)(speed * CHECKPOINT_S) : 1;
    int steps = every * (int)(TRAIN_S / CHECKPOINT_S);
    printf("the array trains %.0f steps/s here: %d steps, a checkpoint every %d\n", speed, steps,
           every);
    const char *wrap[] = {"ip", "netns", "exec", ns, NULL};
    pid_t cut = e2e_worker_via(&T, "cut", via_veth, wrap);
    char ids[2][64], names[2][64], sql[1024];
    rel_sweep(&T, "netsplit", HIDDEN, 128, 0, steps, every, "[0.002, 0.01]", 2, ids, names);
    snprintf(sql, sizeof sql,
             "SELECT bool_and(state = 'running' AND resume_step >= %d) FROM jobs"
             " WHERE id IN ('%s', '%s')",
             2 * every, ids[0], ids[1]);
    e2e_wait_sql(&T, sql, 60, "both jobs running past their second checkpoint");
    char group[64];
    snprintf(group, sizeof group, "%s", e2e_job_field(&T, T.key, ids[0], "group_id"));

    link_set("down");
    double t0 = fbt_now_ms();
    snprintf(sql, sizeof sql,
             "SELECT count(*) = 2 FROM job_events WHERE job_id IN ('%s', '%s')"
             " AND kind = 'requeued'",
             ids[0], ids[1]);
    e2e_wait_sql(&T, sql, 20, "the cut-off worker's jobs to return to the queue");
    double requeue_ms = fbt_now_ms() - t0;
    printf("jobs requeued %.0f ms after the link went down (heartbeat timeout 1500 ms)\n",
           requeue_ms);
    int st;
    CHECK(waitpid(cut, &st, WNOHANG) == 0); /* the cut-off worker lives and trains on */
    pid_t fresh = e2e_worker_via(&T, "fresh", via_lo, NULL);
    snprintf(sql, sizeof sql,
             "SELECT bool_and(state = 'running' AND group_id <> '%s') FROM jobs"
             " WHERE id IN ('%s', '%s')",
             group, ids[0], ids[1]);
    e2e_wait_sql(&T, sql, 60, "the jobs running again in a new array");
    /* the old array's generation still trains behind the cut */
    rel_sleep_ms(1000);
    CHECK(waitpid(cut, &st, WNOHANG) == 0);
    link_set("up");
    double up_at = fbt_now_ms();
    printf("link back up after %.0f ms\n", up_at - t0);

    for (int i = 0; i < 2; i++) e2e_wait_state(&T, T.key, ids[i], "completed", 240);
    /* the stale worker has spoken by now: at least a heartbeat a second */
    while (fbt_now_ms() - up_at < 3000) rel_sleep_ms(100);
    int stale_events = count_in(T.s.log_path, "stale event dropped");
    int stale_arrays = count_in(T.s.log_path, "runs a stale array");
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
    twice += !(diff <= TOLERANCE);
    printf("result: netsplit jobs=2 lost=%d ran_twice=%d requeue_ms=%.0f stale_events_rejected=%d"
           " stale_array_stops=%d max_model_diff=%g\n",
           lost, twice, requeue_ms, stale_events, stale_arrays, diff);
    CHECK_INT_EQ(lost, 0);
    CHECK_INT_EQ(twice, 0);
    CHECK(requeue_ms < 1500 + 2500);
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
