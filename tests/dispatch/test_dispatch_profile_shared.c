/*
 * A slowdown profile measured too slow is lowered by an array that shares its
 * device (server/dispatch_record.c, record_slowdown; docs/api.md, "slowdown").  A
 * fake worker with two CPU devices speaks the wire protocol over ZeroMQ
 * (CURVE, the test's worker key) and holds three arrays of different fusion
 * keys: D, data parallel on both devices, then A and B, each on one of them,
 * so every array shares a device.  The test decides every PROGRESS report,
 * so it knows each window's step and busy time:
 *
 * 1. A's profile row reads 1000 ms a step (as if measured on a loaded
 *    machine).  A's first report, which closes no window, leaves it; warm
 *    windows of about 10 ms a step of which 4 ms busy lower it, by half the
 *    gap each, and A's slowdown rises with it.  B's windows, shared, create
 *    no profile for B's key.
 * 2. Windows of A, still shared, whose busy time (about 300 ms) is above the
 *    profile leave it as it is: a shared window never raises a profile.
 * 3. D's profile, as slow, is left by its windows with a low busy time: of a
 *    data-parallel array the busy time is the devices' mean, which leaves
 *    out the wait for the slowest device, so it bounds nothing.
 * 4. B and D finish; A has its device to itself, and its slow windows raise
 *    the profile slowly, as before.
 *
 * fuseboxd runs on a manual clock (e2e_start_clocked) and the fake sends an
 * array's reports exactly REPORT_MS of it apart, so each window's step and
 * busy time are known exactly and so is every profile value: a shared
 * window moves it halfway to its busy time (1000 -> 502 -> 253 -> ...), a
 * window alone a tenth of the way to its step (0.9 p + 0.1 step), and the
 * slowdown is (time since submission + remaining x step) / (total x profile)
 * on that clock.
 */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <zmq.h>

#include "check.h"
#include "e2e.h"
#include "fakewire.h"
#include "wire.h"

#define WAIT_MS 30000  /* real-time liveness bound on a message the test waits for */
#define WAIT_TICKS 600 /* the most clock ticks a wait moves */
/* reports of an array are this far apart on the clock: more than the server's measuring
 * window (STEP_WINDOW_MS, 500 ms), so that each one closes a window */
#define REPORT_MS 600
#define PROFILE_MS 1000.0

static e2e T;
static void *ctx;

/* An array the fake holds, with its one member. */
typedef struct arr {
    char id[FB_WIRE_ID_LEN + 1];
    int64_t generation;
    char job[64];
    int64_t step, steps;
    bool running;        /* listed in heartbeats */
    long long submitted; /* clock ms of its submission */
    long long last_ms;   /* clock ms of its last report, -1 before the first */
} arr;

typedef struct fake {
    char name[32];
    void *sock;
    int64_t seq;
    long long heartbeats, replies;
    arr a[3];
    fb_wire_msg assign; /* the last ASSIGN taken, type 0 when none waits */
    bool have_assign;
} fake;

static fake F;

static void fake_open(const char *name)
{
    memset(&F, 0, sizeof F);
    snprintf(F.name, sizeof F.name, "%s", name);
    F.sock = fw_connect(ctx, &T, name, 0);
}

/* Sends m (and blob) and frees m. */
static void fake_send(fb_wire_msg *m, const void *blob, size_t len)
{
    fw_send(F.sock, m, blob, len);
    fb_wire_msg_free(m);
}

/* HELLO and HEARTBEAT list the arrays the fake runs. */
static void fill_running(fb_wire_msg *m)
{
    for (int i = 0; i < 3; i++) {
        const arr *a = &F.a[i];
        if (a->running) fw_add_running(m, a->id, a->generation, a->job, a->step);
    }
}

static void fake_hello(void)
{
    fb_wire_msg m;
    fw_hello(&m, F.name, 2);
    fake_send(&m, NULL, 0);
}

/* Takes what fuseboxd sends: heartbeat replies are counted, an ASSIGN kept for place(). */
static void take(fb_wire_msg *m)
{
    if (m->type == FB_WIRE_HEARTBEAT && m->reply) {
        F.replies++;
        CHECK(m->known);
    }
    if (m->type == FB_WIRE_ASSIGN) {
        CHECK(!F.have_assign);
        F.assign = *m;
        F.have_assign = true;
        return;
    }
    fb_wire_msg_free(m);
}

/* A heartbeat, then every message until it is answered: fuseboxd has read all the fake
 * sent before it, at the clock's current time. */
static void sync_now(void)
{
    fb_wire_msg hb = {.type = FB_WIRE_HEARTBEAT};
    fill_running(&hb);
    fake_send(&hb, NULL, 0);
    F.heartbeats++;
    double t0 = fbt_now_ms();
    while (F.replies < F.heartbeats) {
        if (fbt_now_ms() - t0 > WAIT_MS) {
            fprintf(stderr, "fake worker: heartbeat not answered within %d ms\n", WAIT_MS);
            e2e_dump(&T);
            CHECK(0);
        }
        fb_wire_msg m;
        if (fw_recv(F.sock, F.name, 20, &m, NULL, NULL)) take(&m);
    }
}

/* The fake answered, then the clock moves ms (ticks, each waited for). */
static void tick_for(long long ms)
{
    for (long long t = 0; t < ms; t += E2E_TICK_MS) {
        sync_now();
        e2e_clock_advance(&T, E2E_TICK_MS);
    }
}

static void event(arr *a, fb_wire_event_kind kind, const char *blob)
{
    fb_wire_msg m = {.type = FB_WIRE_EVENT, .generation = a->generation, .seq = ++F.seq,
                     .event = kind, .step = a->step, .loss = NAN, .accuracy = NAN};
    snprintf(m.group_id, sizeof m.group_id, "%s", a->id);
    snprintf(m.job_id, sizeof m.job_id, "%s", a->job);
    if (blob) m.blob = 1;
    fake_send(&m, blob, blob ? strlen(blob) : 0);
}

/* Submits a job (batch size `batch` sets its fusion key) with `data` data-parallel
 * shards and takes its ASSIGN into a. */
static void place(arr *a, const char *name, int batch, int data, int64_t steps)
{
    char spec[1024];
    snprintf(spec, sizeof spec,
             "{\"name\": \"%s\", \"dataset\": \"synth\", \"model\": {\"input\": [16],"
             " \"layers\": [{\"type\": \"linear\", \"out\": 32}, {\"type\": \"relu\"},"
             " {\"type\": \"linear\", \"out\": 4}]}, \"batch_size\": %d, \"steps\": %lld,"
             " \"optimizer\": {\"type\": \"adam\", \"lr\": 0.001}, \"seed\": 3,"
             " \"parallel\": {\"data\": %d, \"pipeline\": 1}}",
             name, batch, (long long)steps, data);
    a->submitted = e2e_clock_ms(&T);
    a->last_ms = -1;
    snprintf(a->job, sizeof a->job, "%s", e2e_submit(&T, T.key, spec));
    for (int k = 0; !F.have_assign; k++) {
        CHECK(k < WAIT_TICKS);
        tick_for(E2E_TICK_MS);
        sync_now();
    }
    fb_wire_msg m = F.assign;
    F.have_assign = false;
    CHECK_INT_EQ(m.n_members, 1);
    CHECK_STR_EQ(m.members[0].job_id, a->job);
    CHECK_INT_EQ(m.n_group_devices, data);
    snprintf(a->id, sizeof a->id, "%s", m.group_id);
    a->generation = m.generation;
    a->steps = steps;
    a->running = true;
    fb_wire_msg_free(&m);
    event(a, FB_EV_STARTED, NULL);
}

static double sql_num(const char *fmt, const char *arg)
{
    char sql[512];
    snprintf(sql, sizeof sql, fmt, arg);
    const char *v = fbt_sql_value(&T.s, sql);
    CHECK(v != NULL && v[0]);
    return strtod(v, NULL);
}

/* An array's profile row (by its fusion key, one model, CPU), as text and as a number. */
static const char *profile_text(const arr *a)
{
    static char buf[64];
    char sql[512];
    snprintf(sql, sizeof sql,
             "SELECT coalesce((SELECT p.isolated_step_ms::text FROM profiles p JOIN groups g"
             " ON g.fusion_key = p.fusion_key WHERE g.id = '%s' AND p.n_models = 1"
             " AND p.device_kind = 'cpu'), 'none')",
             a->id);
    snprintf(buf, sizeof buf, "%s", fbt_sql_value(&T.s, sql));
    return buf;
}

static double profile(const arr *a)
{
    const char *t = profile_text(a);
    CHECK(strcmp(t, "none") != 0);
    return strtod(t, NULL);
}

static double slowdown(const arr *a)
{
    return sql_num("SELECT coalesce(slowdown, -1) FROM jobs WHERE id = '%s'", a->job);
}

/*
 * Sends a PROGRESS of array a after `steps` more steps whose breakdown is
 * compute_ms busy and idle_ms waiting for the array's turn, REPORT_MS of the
 * clock after its last report (at once for its first), read at that time;
 * then the next tick writes it (the job's step reached it, checked): the
 * profile and slowdown statements run in that transaction.  Returns the
 * window's length on the clock (0 for a first report).
 */
static long long report(arr *a, int64_t steps, double compute_ms, double idle_ms)
{
    if (a->last_ms >= 0) {
        long long due = a->last_ms + REPORT_MS, now = e2e_clock_ms(&T);
        if (due > now) tick_for(due - now);
    }
    long long now = e2e_clock_ms(&T), window = a->last_ms >= 0 ? now - a->last_ms : 0;
    a->last_ms = now;
    a->step += steps;
    CHECK(a->step < a->steps); /* never a member's last report: that one is cold */
    fb_wire_msg m = {.type = FB_WIRE_PROGRESS, .generation = a->generation};
    snprintf(m.group_id, sizeof m.group_id, "%s", a->id);
    m.compute_ms = compute_ms;
    m.idle_ms = idle_ms;
    m.samples_per_s = 1000.0;
    m.n_progress = 1;
    m.progress = calloc(1, sizeof *m.progress);
    CHECK(m.progress != NULL);
    snprintf(m.progress[0].job_id, sizeof m.progress[0].job_id, "%s", a->job);
    m.progress[0].step = a->step;
    m.progress[0].steps = a->steps;
    m.progress[0].loss = 1.0;
    m.progress[0].accuracy = 0.5;
    m.progress[0].lr = 0.001;
    fake_send(&m, NULL, 0);
    tick_for(E2E_TICK_MS);
    char sql[256];
    snprintf(sql, sizeof sql, "SELECT step FROM jobs WHERE id = '%s'", a->job);
    CHECK_INT_EQ(strtoll(fbt_sql_value(&T.s, sql), NULL, 10), a->step);
    return window;
}

/* A's slowdown as the flush of its last report computed it: (time since submission +
 * remaining x step) / (total x profile), on the clock, the flush a tick after the report. */
static double slowdown_want(const arr *a, double step_ms, double profile_ms)
{
    double elapsed = (double)(a->last_ms + E2E_TICK_MS - a->submitted);
    return (elapsed + (double)(a->steps - a->step) * step_ms) / ((double)a->steps * profile_ms);
}

#define CHECK_REL(x, want)                                                                         \
    do {                                                                                           \
        double x_ = (x), w_ = (want);                                                              \
        if (!(fabs(x_ - w_) <= 1e-12 * fabs(w_))) {                                                \
            fprintf(stderr, "%s:%d: %s = %.17g, want %.17g\n", __FILE__, __LINE__, #x, x_, w_);    \
            CHECK(0);                                                                              \
        }                                                                                          \
    } while (0)

int main(void)
{
    setvbuf(stdout, NULL, _IONBF, 0);
    /* no fair-share period: the test alone decides what the server hears */
    const char *flags[] = {"--rebalance-ms", "0", NULL};
    e2e_start_clocked(&T, flags);
    ctx = zmq_ctx_new();
    CHECK(ctx != NULL);
    fake_open("fake-p");
    fake_hello();
    sync_now(); /* the reply to a heartbeat after the HELLO: registered */
    arr *A = &F.a[0], *B = &F.a[1], *D = &F.a[2];
    place(D, "d", 64, 2, 1000);
    place(A, "a", 32, 1, 1000000);
    place(B, "b", 16, 1, 1000);

    /* 1: A's and D's profiles are far too slow */
    char sql[1024];
    snprintf(sql, sizeof sql,
             "INSERT INTO profiles (fusion_key, n_models, device_kind, isolated_step_ms, warm)"
             " SELECT fusion_key, 1, 'cpu', %g, true FROM groups WHERE id IN ('%s', '%s')",
             PROFILE_MS, A->id, D->id);
    PQclear(fbt_sql(&T.s, sql));
    report(A, 60, 4.0, 6.0); /* closes no window: cold; its own breakdown, 10 ms a step */
    double s0 = slowdown(A);
    printf("1: A's first report: profile %s ms, slowdown %.6f\n", profile_text(A), s0);
    CHECK_NEAR(profile(A), PROFILE_MS, 1e-9);
    CHECK_REL(s0, slowdown_want(A, 10.0, PROFILE_MS));
    double want = PROFILE_MS;
    for (int i = 0; i < 5; i++) {
        /* a window of 60 steps in REPORT_MS: 10 ms a step, 4 of them busy */
        CHECK_INT_EQ(report(A, 60, 4.0, 6.0), REPORT_MS);
        want = 0.5 * want + 0.5 * 4.0; /* halfway down to the busy time */
        double p = profile(A);
        printf("1: shared window %d of A: profile %.4f ms (expected %.4f), slowdown %.6f\n", i + 1,
               p, want, slowdown(A));
        CHECK_REL(p, want);
        CHECK_REL(slowdown(A), slowdown_want(A, 10.0, want));
    }
    double s1 = slowdown(A);
    CHECK(s1 > 4 * s0);
    report(B, 60, 4.0, 6.0);
    report(B, 60, 4.0, 6.0);
    CHECK_STR_EQ(profile_text(B), "none"); /* shared windows create no profile */

    /* 2: windows of A whose busy time (300 ms of a 300 ms step) is above the profile */
    char before[64];
    snprintf(before, sizeof before, "%s", profile_text(A));
    for (int i = 0; i < 3; i++) {
        long long window = report(A, 2, 300.0, 0.0);
        printf("2: shared slow window %d of A (%lld ms): profile %s ms\n", i + 1, window,
               profile_text(A));
        CHECK_STR_EQ(profile_text(A), before);
    }

    /* 3: a data-parallel array's busy time lowers nothing */
    for (int i = 0; i < 3; i++) {
        report(D, 60, 4.0, 6.0);
        printf("3: shared window %d of D: profile %s ms\n", i + 1, profile_text(D));
    }
    CHECK_NEAR(profile(D), PROFILE_MS, 1e-9);

    /* 4: B and D finish and leave A alone on its device */
    B->step = B->steps;
    event(B, FB_EV_FINISHED, "model");
    B->running = false;
    D->step = D->steps;
    event(D, FB_EV_FINISHED, "model");
    D->running = false;
    snprintf(sql, sizeof sql,
             "SELECT bool_and(state = 'finished') FROM groups WHERE id IN ('%s', '%s')", B->id,
             D->id);
    for (int k = 0; strcmp(fbt_sql_value(&T.s, sql), "t") != 0; k++) {
        if (k >= WAIT_TICKS) {
            e2e_dump(&T);
            CHECK(0);
        }
        tick_for(E2E_TICK_MS);
    }
    want = strtod(before, NULL);
    for (int i = 0; i < 3; i++) {
        long long window = report(A, 2, 300.0, 0.0);
        /* a tenth of the way towards the window's step; the first window spans phase 3 */
        double step = (double)window / 2;
        want = 0.9 * want + 0.1 * step;
        double p = profile(A);
        printf("4: window %d of A alone (%lld ms, %.1f ms a step): profile %.4f ms (expected"
               " %.4f)\n",
               i + 1, window, step, p, want);
        CHECK(i == 0 ? window > REPORT_MS : window == REPORT_MS);
        CHECK_REL(p, want);
    }

    printf("result: profile-shared first=%.0f lowered=%s slowdown_ratio=%.1f alone=%.3f\n",
           PROFILE_MS, before, s1 / s0, want);
    zmq_close(F.sock);
    CHECK(zmq_ctx_term(ctx) == 0);
    e2e_finish(&T);
    printf("ok\n");
    return 0;
}
