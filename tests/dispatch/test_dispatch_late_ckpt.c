/*
 * Nothing a worker reported is lost when its jobs are requeued: the order
 * the control loop keeps between the events it has received and the requeue
 * that reads a job's resume point (docs/wire.md, "Re-queueing").  A
 * fake worker speaks the wire protocol itself over ZeroMQ (CURVE, the test's
 * worker key), so the test knows exactly what fuseboxd has received when it
 * takes the worker for lost:
 *
 * 1. a checkpoint received but not yet written when its worker goes silent
 *    (a plain file where the job's artifacts directory belongs makes the
 *    write fail, so the event waits): the array is requeued only once the
 *    checkpoint is written, and the job resumes from it, not from step 0;
 * 2. a checkpoint of the requeued array that arrives after the requeue,
 *    while the job waits in the queue (the tenant's device quota is 0, so it
 *    is not placed again): it becomes the resume point, and the next ASSIGN
 *    carries its step and its bytes;
 * 3. late checkpoints that must change nothing: one older than the resume
 *    point, one from a worker the array was never assigned to, and one that
 *    arrives after the job was placed in a new array.
 *
 * fuseboxd runs on a manual clock (e2e_start_clocked) that the test moves a
 * tick at a time, a live fake heartbeating and answered before each move: a
 * fake that falls silent is lost at exactly the first tick past the heartbeat
 * timeout after its last heartbeat, and a live one never is, however long
 * the test's checks take.
 */
#include <errno.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>
#include <zmq.h>

#include "check.h"
#include "e2e.h"
#include "fakewire.h"
#include "wire.h"

#define WAIT_MS 20000  /* real-time liveness bound on a message the test waits for */
#define WAIT_TICKS 600 /* the most clock ticks a wait moves */

static e2e T;
static void *ctx;

typedef struct fake {
    char name[32];
    void *sock;
    int64_t seq;
    long long heartbeats, replies;  /* heartbeats sent, and their replies taken */
    char group[FB_WIRE_ID_LEN + 1]; /* the array its heartbeats list ("" = none) */
    int64_t generation;
} fake;

/* A received message and its first blob (malloc'd, NULL when none). */
typedef struct got {
    fb_wire_msg m;
    void *blob;
    size_t blob_len;
} got;

static void fake_open(fake *f, const char *name)
{
    memset(f, 0, sizeof *f);
    snprintf(f->name, sizeof f->name, "%s", name);
    f->sock = fw_connect(ctx, &T, name, 0);
}

static void fake_close(fake *f)
{
    zmq_close(f->sock);
    f->sock = NULL;
}

static void fake_send(fake *f, const fb_wire_msg *m, const void *blob, size_t len)
{
    fw_send(f->sock, m, blob, len);
}

/* HELLO and HEARTBEAT list the array f->group, if any, as running at step `step`. */
static void fill_running(const fake *f, fb_wire_msg *m, const char *job, int64_t step)
{
    if (f->group[0]) fw_add_running(m, f->group, f->generation, job, step);
}

static char job[64];

static void fake_hello(fake *f)
{
    fb_wire_msg m;
    fw_hello(&m, f->name, 1);
    fill_running(f, &m, job, 0);
    fake_send(f, &m, NULL, 0);
    fb_wire_msg_free(&m);
}

/* Sends a checkpoint (or another event) of job in group/generation; returns its seq. */
static int64_t fake_event(fake *f, const char *group, int64_t generation, fb_wire_event_kind kind,
                          int64_t step, const char *blob)
{
    fb_wire_msg m = {.type = FB_WIRE_EVENT, .generation = generation, .seq = ++f->seq,
                     .event = kind, .step = step, .loss = NAN, .accuracy = NAN};
    snprintf(m.group_id, sizeof m.group_id, "%s", group);
    snprintf(m.job_id, sizeof m.job_id, "%s", job);
    if (blob) m.blob = 1;
    fake_send(f, &m, blob, blob ? strlen(blob) : 0);
    return m.seq;
}

/* Receives one message within ms (answering nothing); false when none came. */
static bool fake_recv(fake *f, int ms, got *out)
{
    return fw_recv(f->sock, f->name, ms, &out->m, &out->blob, &out->blob_len);
}

static void got_free(got *g)
{
    fb_wire_msg_free(&g->m);
    free(g->blob);
}

/*
 * The fake heartbeats and takes every message until it is answered: fuseboxd has read
 * all it sent, at the clock's current time.  A message of type `type` (an ACK: of seq)
 * met on the way is kept in *out (when out is not NULL and none is kept yet: *kept).
 */
static void fake_sync(fake *f, fb_wire_type type, int64_t seq, got *out, bool *kept)
{
    fb_wire_msg hb = {.type = FB_WIRE_HEARTBEAT};
    fill_running(f, &hb, job, 0);
    fake_send(f, &hb, NULL, 0);
    fb_wire_msg_free(&hb);
    f->heartbeats++;
    double t0 = fbt_now_ms();
    while (f->replies < f->heartbeats) {
        if (fbt_now_ms() - t0 > WAIT_MS) {
            fprintf(stderr, "fake worker %s: heartbeat not answered within %d ms\n", f->name,
                    WAIT_MS);
            e2e_dump(&T);
            CHECK(0);
        }
        got g;
        if (!fake_recv(f, 20, &g)) continue;
        if (g.m.type == FB_WIRE_HEARTBEAT && g.m.reply) {
            f->replies++;
            CHECK(g.m.known); /* a live fake is never taken for lost */
        }
        if (out && !*kept && g.m.type == type && (type != FB_WIRE_ACK || g.m.seq == seq)) {
            *out = g;
            *kept = true;
        } else {
            got_free(&g);
        }
    }
}

/* One tick: the live fakes (NULL-terminated) answered, then the clock moves a tick. */
static void tick(fake *const *live)
{
    for (int i = 0; live[i]; i++) fake_sync(live[i], FB_WIRE_TYPE_COUNT, 0, NULL, NULL);
    e2e_clock_advance(&T, E2E_TICK_MS);
}

/*
 * Waits for a message of type `type` (an ACK: of seq) to the live fake f and returns it in
 * out; drops the others.  The clock moves a tick at a time meanwhile (an ACK comes once the
 * tick wrote its event, an ASSIGN once a plan placed the job).
 */
static void fake_expect(fake *f, fb_wire_type type, int64_t seq, got *out)
{
    for (int k = 0;; k++) {
        bool kept = false;
        fake_sync(f, type, seq, out, &kept);
        if (kept) return;
        if (k >= WAIT_TICKS) {
            fprintf(stderr, "fake worker %s: no %s (seq %lld) within %d ticks\n", f->name,
                    fb_wire_type_name(type), (long long)seq, WAIT_TICKS);
            e2e_dump(&T);
            CHECK(0);
        }
        e2e_clock_advance(&T, E2E_TICK_MS);
    }
}

static long long sql_ll(const char *fmt, const char *arg)
{
    return fw_sql_ll(&T, fmt, arg);
}

static long long resume_step(void)
{
    return sql_ll("SELECT resume_step FROM jobs WHERE id = '%s'", job);
}

static long long requeues(void)
{
    return sql_ll("SELECT count(*) FROM job_events WHERE job_id = '%s' AND kind = 'requeued'",
                  job);
}

/* Occurrences of text in the server's log. */
static int in_log(const char *text)
{
    FILE *f = fopen(T.s.log_path, "r");
    if (!f) return 0;
    int n = 0;
    char line[8192];
    while (fgets(line, sizeof line, f)) n += strstr(line, text) != NULL;
    fclose(f);
    return n;
}

static const char *file_text(const char *path)
{
    static char buf[256];
    buf[0] = '\0';
    FILE *f = fopen(path, "r");
    if (!f) return "(none)";
    size_t n = fread(buf, 1, sizeof buf - 1, f);
    buf[n] = '\0';
    fclose(f);
    return buf;
}

int main(void)
{
    setvbuf(stdout, NULL, _IONBF, 0);
    e2e_start_clocked(&T, NULL);
    ctx = zmq_ctx_new();
    CHECK(ctx != NULL);
    got g;

    /* fake worker a registers and gets the job's array */
    fake a;
    fake_open(&a, "fake-a");
    fake_hello(&a);
    fake_expect(&a, FB_WIRE_WELCOME, 0, &g);
    got_free(&g);
    snprintf(job, sizeof job, "%s", e2e_submit(&T, T.key, e2e_spec("late", 0.001, 100000, 300)));
    fake_expect(&a, FB_WIRE_ASSIGN, 0, &g);
    CHECK_INT_EQ(g.m.n_members, 1);
    CHECK_STR_EQ(g.m.members[0].job_id, job);
    CHECK_INT_EQ(g.m.members[0].start_step, 0);
    char g1[FB_WIRE_ID_LEN + 1];
    snprintf(g1, sizeof g1, "%s", g.m.group_id);
    int64_t gen1 = g.m.generation;
    got_free(&g);
    snprintf(a.group, sizeof a.group, "%s", g1);
    a.generation = gen1;
    fake_expect(&a, FB_WIRE_ACK, fake_event(&a, g1, gen1, FB_EV_STARTED, 0, NULL), &g);
    got_free(&g);
    /* from now on the job is placed again only when the test allows it */
    fw_set_quota(&T, 0);

    /* 1: a checkpoint received but not yet written when its worker goes silent */
    char dir[700], blocker[800], path[900];
    snprintf(dir, sizeof dir, "%s/artifacts/%s", T.s.data_dir, T.tenant);
    CHECK(mkdir(dir, 0750) == 0 || errno == EEXIST);
    snprintf(blocker, sizeof blocker, "%s/%s", dir, job);
    e2e_write(blocker, "not a directory: the checkpoint cannot be written\n");
    fake_event(&a, g1, gen1, FB_EV_CHECKPOINTED, 300, "state at step 300");
    /* silent from here (after this heartbeat, read now): the server takes the worker for
     * lost at the first tick past its heartbeat timeout, and either requeues the array at
     * once or says that the requeue waits */
    fake_sync(&a, FB_WIRE_TYPE_COUNT, 0, NULL, NULL);
    long long silent_at = e2e_clock_ms(&T), waits_at = 0;
    fake *none[] = {NULL};
    for (int k = 0; requeues() == 0 && in_log("the requeue of an array waits for its events") == 0;
         k++) {
        CHECK(k < WAIT_TICKS);
        tick(none);
    }
    waits_at = e2e_clock_ms(&T);
    long long early = requeues();
    printf("1: the worker was lost %lld ms after its last heartbeat with its checkpoint of step"
           " 300 unwritten; requeued before it was written: %lld\n",
           waits_at - silent_at, early);
    CHECK_INT_EQ(waits_at - silent_at, E2E_HEARTBEAT_TIMEOUT_MS + E2E_TICK_MS);
    CHECK_INT_EQ(in_log("worker lost: no heartbeat"), 1);
    /* while the event cannot be written, the array waits, tick after tick */
    for (int k = 0; k < 5; k++) {
        tick(none);
        CHECK_INT_EQ(requeues(), 0);
    }
    CHECK(unlink(blocker) == 0);
    CHECK(mkdir(blocker, 0750) == 0);
    /* the next tick writes it, then requeues the array from it */
    tick(none);
    printf("1: requeued a tick after the checkpoint could be written, resumes from step %lld\n",
           resume_step());
    CHECK_INT_EQ(requeues(), 1);
    CHECK_INT_EQ(early, 0);
    CHECK_INT_EQ(resume_step(), 300);
    CHECK_INT_EQ(sql_ll("SELECT (data->>'resume_step')::bigint FROM job_events WHERE job_id ="
                        " '%s' AND kind = 'requeued'",
                        job),
                 300);
    CHECK_INT_EQ(sql_ll("SELECT step FROM jobs WHERE id = '%s'", job), 300);
    snprintf(path, sizeof path, "%s/state-300.safetensors", blocker);
    CHECK_STR_EQ(file_text(path), "state at step 300");

    /* 2: the worker's link comes back; a checkpoint of the requeued array arrives while
     * the job waits in the queue */
    fake_hello(&a); /* it still lists the old array, as a cut-off worker does */
    fake_expect(&a, FB_WIRE_WELCOME, 0, &g);
    got_free(&g);
    fake_expect(&a, FB_WIRE_ACK,
                fake_event(&a, g1, gen1, FB_EV_CHECKPOINTED, 600, "state at step 600"), &g);
    got_free(&g);
    printf("2: a checkpoint of step 600 after the requeue; resumes from step %lld\n",
           resume_step());
    CHECK_INT_EQ(resume_step(), 600);
    CHECK_STR_EQ(e2e_job_field(&T, T.key, job, "state"), "queued");
    CHECK_INT_EQ(sql_ll("SELECT step FROM jobs WHERE id = '%s'", job), 600);
    snprintf(path, sizeof path, "%s/state-600.safetensors", blocker);
    CHECK_STR_EQ(file_text(path), "state at step 600");

    /* 3a: an older checkpoint of the same array never moves the resume point back */
    fake_expect(&a, FB_WIRE_ACK,
                fake_event(&a, g1, gen1, FB_EV_CHECKPOINTED, 450, "state at step 450"), &g);
    got_free(&g);
    CHECK_INT_EQ(resume_step(), 600);
    snprintf(path, sizeof path, "%s/state-450.safetensors", blocker);
    CHECK(access(path, F_OK) != 0);

    /* 3b: nor does one from a worker the array was never assigned to */
    fake b;
    fake_open(&b, "fake-b");
    fake_hello(&b);
    fake_expect(&b, FB_WIRE_WELCOME, 0, &g);
    got_free(&g);
    fake_expect(&b, FB_WIRE_ACK,
                fake_event(&b, g1, gen1, FB_EV_CHECKPOINTED, 900, "state at step 900"), &g);
    got_free(&g);
    CHECK_INT_EQ(resume_step(), 600);

    /* the job is placed again (b is gone: lost, or never chosen) from the late checkpoint:
     * its step and its bytes; b is lost at the first tick past its timeout, a stays alive */
    fake_sync(&b, FB_WIRE_TYPE_COUNT, 0, NULL, NULL);
    long long b_silent = e2e_clock_ms(&T);
    fake_close(&b);
    fake *live[] = {&a, NULL};
    for (int k = 0; sql_ll("SELECT count(*) FROM workers WHERE name = '%s' AND state = 'lost'",
                           "fake-b") == 0;
         k++) {
        CHECK(k < WAIT_TICKS);
        tick(live);
    }
    CHECK_INT_EQ(e2e_clock_ms(&T) - b_silent, E2E_HEARTBEAT_TIMEOUT_MS + E2E_TICK_MS);
    a.group[0] = '\0';
    fw_set_quota(&T, 8);
    fake_expect(&a, FB_WIRE_ASSIGN, 0, &g);
    CHECK(strcmp(g.m.group_id, g1) != 0);
    CHECK_INT_EQ(g.m.n_members, 1);
    CHECK_STR_EQ(g.m.members[0].job_id, job);
    printf("3: placed again from step %lld\n", (long long)g.m.members[0].start_step);
    CHECK_INT_EQ(g.m.members[0].start_step, 600);
    CHECK(g.m.members[0].resume_blob == 1 && g.blob != NULL);
    CHECK_STR_EQ((const char *)g.blob, "state at step 600");
    got_free(&g);

    /* 3c: a late checkpoint of the old array no longer belongs to the job's run */
    fake_expect(&a, FB_WIRE_ACK,
                fake_event(&a, g1, gen1, FB_EV_CHECKPOINTED, 1200, "state at step 1200"), &g);
    got_free(&g);
    CHECK_INT_EQ(resume_step(), 600);
    snprintf(path, sizeof path, "%s/state-1200.safetensors", blocker);
    CHECK(access(path, F_OK) != 0);
    CHECK_INT_EQ(requeues(), 1);

    printf("result: late-checkpoint requeued_before_written=%lld resume_after_loss=300"
           " resume_after_late=600\n",
           early);
    fake_close(&a);
    CHECK(zmq_ctx_term(ctx) == 0);
    e2e_finish(&T);
    printf("ok\n");
    return 0;
}
