/*
 * A slowdown profile measured too slow is lowered by an array that shares its
 * device (server/dispatch.c, record_slowdown; docs/api.md, "slowdown").  A
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

#define HEARTBEAT_MS 200
#define WAIT_MS 30000
/* reports of an array are this far apart: more than the server's measuring window
 * (STEP_WINDOW_MS, 500 ms), so that each one closes a window */
#define REPORT_MS 650
#define PROFILE_MS 1000.0

static e2e T;
static void *ctx;

/* An array the fake holds, with its one member. */
typedef struct arr {
    char id[FB_WIRE_ID_LEN + 1];
    int64_t generation;
    char job[64];
    int64_t step, steps;
    bool running; /* listed in heartbeats */
} arr;

typedef struct fake {
    char name[32];
    void *sock;
    int64_t seq;
    double last_hb;
    arr a[3];
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

/* Receives one message within ms into out; false when none came. */
static bool fake_recv(int ms, fb_wire_msg *out)
{
    return fw_recv(F.sock, F.name, ms, out, NULL, NULL);
}

/* Heartbeats while it waits up to ms for a message; drops what is not of type `type`
 * (FB_WIRE_TYPE_COUNT: drops all).  True when one of `type` came, returned in out. */
static bool pump(int ms, fb_wire_type type, fb_wire_msg *out)
{
    double t0 = fbt_now_ms();
    while (fbt_now_ms() - t0 < ms) {
        if (fbt_now_ms() - F.last_hb >= HEARTBEAT_MS) {
            F.last_hb = fbt_now_ms();
            fb_wire_msg hb = {.type = FB_WIRE_HEARTBEAT};
            fill_running(&hb);
            fake_send(&hb, NULL, 0);
        }
        fb_wire_msg m;
        if (!fake_recv(20, &m)) continue;
        if (m.type == type) {
            *out = m;
            return true;
        }
        fb_wire_msg_free(&m);
    }
    return false;
}

static void expect(fb_wire_type type, fb_wire_msg *out)
{
    if (pump(WAIT_MS, type, out)) return;
    fprintf(stderr, "fake worker: no %s within %d ms\n", fb_wire_type_name(type), WAIT_MS);
    e2e_dump(&T);
    CHECK(0);
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
    snprintf(a->job, sizeof a->job, "%s", e2e_submit(&T, T.key, spec));
    fb_wire_msg m;
    expect(FB_WIRE_ASSIGN, &m);
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
 * compute_ms busy and idle_ms waiting for the array's turn, then heartbeats
 * until the server has written it (the job's step reached it): the profile and
 * slowdown statements run in the same transaction.  Each call waits
 * REPORT_MS first, so the report closes a measuring window.
 */
static void report(arr *a, int64_t steps, double compute_ms, double idle_ms)
{
    fb_wire_msg none;
    if (pump(REPORT_MS, FB_WIRE_TYPE_COUNT, &none)) fb_wire_msg_free(&none);
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
    char sql[256];
    snprintf(sql, sizeof sql, "SELECT step FROM jobs WHERE id = '%s'", a->job);
    double t0 = fbt_now_ms();
    while (strtoll(fbt_sql_value(&T.s, sql), NULL, 10) < a->step) {
        if (fbt_now_ms() - t0 > WAIT_MS) {
            fprintf(stderr, "the report of step %lld was not written\n", (long long)a->step);
            e2e_dump(&T);
            CHECK(0);
        }
        if (pump(20, FB_WIRE_TYPE_COUNT, &none)) fb_wire_msg_free(&none);
    }
}

int main(void)
{
    setvbuf(stdout, NULL, _IONBF, 0);
    /* no fair-share period: the test alone decides what the server hears */
    const char *flags[] = {"--rebalance-ms", "0", NULL};
    e2e_start(&T, flags);
    ctx = zmq_ctx_new();
    CHECK(ctx != NULL);
    fake_open("fake-p");
    fake_hello();
    fb_wire_msg m;
    expect(FB_WIRE_WELCOME, &m);
    fb_wire_msg_free(&m);
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
    report(A, 60, 4.0, 6.0); /* closes no window: cold */
    double s0 = slowdown(A);
    printf("1: A's first report: profile %s ms, slowdown %.4f\n", profile_text(A), s0);
    CHECK_NEAR(profile(A), PROFILE_MS, 1e-9);
    CHECK(s0 > 0);
    double prev = PROFILE_MS;
    for (int i = 0; i < 5; i++) {
        report(A, 60, 4.0, 6.0);
        double p = profile(A);
        printf("1: shared window %d of A: profile %.3f ms, slowdown %.4f\n", i + 1, p,
               slowdown(A));
        /* half the gap to a busy time far below it; never below the busy time */
        CHECK(p < prev);
        CHECK(p > 0.5 * prev);
        CHECK(p >= 1.0);
        prev = p;
    }
    double s1 = slowdown(A);
    CHECK(prev < PROFILE_MS / 8);
    /* the slowdown follows the profile: elapsed time is tiny next to the remaining steps,
     * so it rises about as much as the profile fell (the step time moves too) */
    CHECK(s1 > 4 * s0);
    report(B, 60, 4.0, 6.0);
    report(B, 60, 4.0, 6.0);
    CHECK_STR_EQ(profile_text(B), "none");

    /* 2: windows of A whose busy time is above the profile, still shared */
    char before[64];
    snprintf(before, sizeof before, "%s", profile_text(A));
    for (int i = 0; i < 3; i++) {
        report(A, 2, 300.0, 0.0);
        printf("2: shared slow window %d of A: profile %s ms\n", i + 1, profile_text(A));
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
    double t0 = fbt_now_ms();
    while (strcmp(fbt_sql_value(&T.s, sql), "t") != 0) {
        if (fbt_now_ms() - t0 > WAIT_MS) {
            e2e_dump(&T);
            CHECK(0);
        }
        if (pump(20, FB_WIRE_TYPE_COUNT, &m)) fb_wire_msg_free(&m);
    }
    prev = strtod(before, NULL);
    for (int i = 0; i < 3; i++) {
        report(A, 2, 300.0, 0.0);
        double p = profile(A);
        printf("4: window %d of A alone: profile %.3f ms\n", i + 1, p);
        /* a tenth of the way towards a step of 300 ms or more (the first window also spans
         * the reports of phase 3, so only later ones have a known length) */
        CHECK(p > prev);
        if (i > 0) CHECK(p < 0.9 * prev + 0.1 * 3000);
        prev = p;
    }

    printf("result: profile-shared first=%.0f lowered=%s slowdown_ratio=%.1f alone=%.3f\n",
           PROFILE_MS, before, s1 / s0, prev);
    zmq_close(F.sock);
    CHECK(zmq_ctx_term(ctx) == 0);
    e2e_finish(&T);
    printf("ok\n");
    return 0;
}
