/*
 * Fair share by slowdown, end to end through fuseboxd's control loop, every
 * decision at a known time: fuseboxd runs on a manual clock
 * (e2e_start_clocked) with a fair-share period of 1 s (--rebalance-ms), and
 * one fake worker with one CPU device (fakewire.h) holds two arrays of unlike
 * models (fusion keys that cannot fuse), A and B, co-located on it.  The test
 * decides everything the controller measures:
 *
 * - both jobs are submitted at the same clock time and are long (10^6 steps);
 * - their profiles (isolated step times) are 10 ms each, written into the
 *   profiles table;
 * - the fake reports progress every 500 ms of the clock with steps that take
 *   exactly A_STEP_MS and B_STEP_MS, whatever their shares (all busy, no
 *   idle time, so no shared window lowers a profile); A's and B's reports are
 *   a tick apart, so that each tick flushes one.
 *
 * At every period the expected decision is computed here from the rule of
 * server/fairshare.h, independently of its code: the slowdown of a job is
 * (elapsed + remaining x step) / (total x isolated step); the step time at
 * fraction f of the device is k / f with k = step x f now; the target
 * fractions x make the predicted slowdowns equal, x_A + x_B = 1 (a quadratic
 * in the common slowdown, solved in closed form), with a floor of min_share
 * (0.25) of an even split (0.125); the shares move toward the targets by at
 * most max_share_step (0.1), and not at all while every fraction is within
 * share_hysteresis (0.02) of its target.  With A's steps 2.5 times faster
 * than B's, A is ahead: the controller must take A's time for B by 0.1 a
 * period (0.5 -> 0.4 -> 0.3 -> 0.2), then to the floor (0.125), then hold.
 * The test asserts the REBALANCE messages of every period, in order (none in
 * a period that changes nothing), the slowdowns the controller published
 * (/metrics) and the job records' (GET /v1/jobs/{id}), and what GET
 * /v1/cluster shows.
 *
 * The real-contention counterpart (real workers sharing a loaded CPU, the
 * slowdowns as measured) is bench/fairshare/validate.sh.
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

#define PERIOD_MS 1000
#define REPORT_MS 500 /* the server's measuring window (STEP_WINDOW_MS) */
#define STEPS 1000000LL
#define ISO_MS 10.0  /* both profiles */
#define A_STEP_MS 20 /* A's and B's step times: 25 and 10 steps a report */
#define B_STEP_MS 50
#define BATCH 32
/* the controller's documented defaults (server/fairshare.h) */
#define MIN_SHARE 0.25
#define MAX_SHARE_STEP 0.1
#define SHARE_HYSTERESIS 0.02
#define PERIODS 6
#define WAIT_MS 30000 /* real-time liveness bound on a message the test waits for */

static e2e T;
static void *ctx;

typedef struct arr {
    const char *name;
    int step_ms;
    long long start_ms; /* clock time of its first report */
    char id[FB_WIRE_ID_LEN + 1];
    int64_t generation;
    char job[64];
    int64_t step;         /* last reported */
    int64_t step_flushed; /* what the server has written (a tick after the report) */
    int reports;          /* sent */
    long long measured;   /* clock ms of its second report, which closes a window; 0: none */
    double share;         /* the last time share the server sent */
    int rebalances;       /* REBALANCE messages received since the test last looked */
    double rebalance_share;
    int64_t rebalance_split;
} arr;

static arr A = {.name = "a", .step_ms = A_STEP_MS}, B = {.name = "b", .step_ms = B_STEP_MS};
static void *sock;
static long long heartbeats, replies;
static int64_t seq;

static arr *by_group(const char *gid)
{
    if (strcmp(A.id, gid) == 0) return &A;
    if (strcmp(B.id, gid) == 0) return &B;
    return NULL;
}

/* Takes one message the fake received: counts heartbeat replies, notes REBALANCEs. */
static void take(fb_wire_msg *m)
{
    replies += m->type == FB_WIRE_HEARTBEAT && m->reply;
    CHECK(!(m->type == FB_WIRE_HEARTBEAT && m->reply && !m->known));
    if (m->type == FB_WIRE_REBALANCE) {
        arr *a = by_group(m->group_id);
        CHECK(a != NULL);
        CHECK_INT_EQ(m->generation, a->generation);
        CHECK_INT_EQ(m->n_split, 1);
        a->rebalances++;
        a->rebalance_share = m->time_share;
        a->rebalance_split = m->split[0];
    }
    if (m->type == FB_WIRE_ASSIGN) {
        CHECK_INT_EQ(m->n_members, 1);
        arr *a = strcmp(m->members[0].job_id, A.job) == 0 ? &A : &B;
        CHECK_STR_EQ(m->members[0].job_id, a->job);
        CHECK(!a->id[0]);
        snprintf(a->id, sizeof a->id, "%s", m->group_id);
        a->generation = m->generation;
        CHECK_INT_EQ(m->n_split, 1);
        CHECK_INT_EQ(m->split[0], BATCH);
        a->share = m->time_share;
    }
    CHECK(m->type != FB_WIRE_DETACH);
    fb_wire_msg_free(m);
}

/* A heartbeat listing both arrays (once placed); then every message until it is answered:
 * fuseboxd has read all the fake sent before it, at the clock's current time, and
 * everything it sent before the reply (a tick's REBALANCE) has been taken. */
static void sync_now(void)
{
    fb_wire_msg hb = {.type = FB_WIRE_HEARTBEAT};
    if (A.id[0]) fw_add_running(&hb, A.id, A.generation, A.job, A.step);
    if (B.id[0]) fw_add_running(&hb, B.id, B.generation, B.job, B.step);
    fw_send(sock, &hb, NULL, 0);
    fb_wire_msg_free(&hb);
    heartbeats++;
    double t0 = fbt_now_ms();
    while (replies < heartbeats) {
        if (fbt_now_ms() - t0 > WAIT_MS) {
            fprintf(stderr, "fake worker: heartbeat not answered within %d ms\n", WAIT_MS);
            e2e_dump(&T);
            CHECK(0);
        }
        fb_wire_msg m;
        if (fw_recv(sock, "fake-fair", 50, &m, NULL, NULL)) take(&m);
    }
}

/* Waits for a message of type `type` (heartbeating meanwhile) and returns it in out. */
static void expect(fb_wire_type type, fb_wire_msg *out)
{
    double t0 = fbt_now_ms();
    while (fbt_now_ms() - t0 < WAIT_MS) {
        fb_wire_msg m;
        if (!fw_recv(sock, "fake-fair", 50, &m, NULL, NULL)) continue;
        if (m.type == type) {
            *out = m;
            return;
        }
        take(&m);
    }
    fprintf(stderr, "fake worker: no %s within %d ms\n", fb_wire_type_name(type), WAIT_MS);
    e2e_dump(&T);
    CHECK(0);
}

static void event_started(arr *a)
{
    fb_wire_msg m = {.type = FB_WIRE_EVENT,
                     .generation = a->generation,
                     .seq = ++seq,
                     .event = FB_EV_STARTED,
                     .step = 0,
                     .loss = NAN,
                     .accuracy = NAN};
    snprintf(m.group_id, sizeof m.group_id, "%s", a->id);
    snprintf(m.job_id, sizeof m.job_id, "%s", a->job);
    fw_send(sock, &m, NULL, 0);
    fb_wire_msg_free(&m);
}

/* A PROGRESS of a at step, its steps all busy for step_ms each. */
static void report(arr *a, int64_t step)
{
    a->step = step;
    fb_wire_msg m = {.type = FB_WIRE_PROGRESS, .generation = a->generation};
    snprintf(m.group_id, sizeof m.group_id, "%s", a->id);
    m.compute_ms = a->step_ms;
    m.idle_ms = 0;
    m.samples_per_s = BATCH * 1000.0 / a->step_ms;
    m.n_progress = 1;
    m.progress = calloc(1, sizeof *m.progress);
    CHECK(m.progress != NULL);
    snprintf(m.progress[0].job_id, sizeof m.progress[0].job_id, "%s", a->job);
    m.progress[0].step = step;
    m.progress[0].steps = STEPS;
    m.progress[0].loss = 1.0;
    m.progress[0].accuracy = 0.5;
    m.progress[0].lr = 0.001;
    fw_send(sock, &m, NULL, 0);
    fb_wire_msg_free(&m);
}

static const char *spec(const char *name, int hidden)
{
    static char buf[1024];
    snprintf(buf, sizeof buf,
             "{\"name\": \"%s\", \"dataset\": \"synth\", \"model\": {\"input\": [16],"
             " \"layers\": [{\"type\": \"linear\", \"out\": %d}, {\"type\": \"relu\"},"
             " {\"type\": \"linear\", \"out\": 4}]}, \"batch_size\": %d, \"steps\": %lld,"
             " \"optimizer\": {\"type\": \"adam\", \"lr\": 0.001}, \"seed\": 11}",
             name, hidden, BATCH, STEPS);
    return buf;
}

/* What the tick at clock c flushed (and wrote into the jobs' records): the reports the
 * fake sent at the tick before. */
static void note_flushed(long long c)
{
    arr *both[2] = {&A, &B};
    for (int i = 0; i < 2; i++) {
        arr *a = both[i];
        if (c - E2E_TICK_MS >= a->start_ms && (c - E2E_TICK_MS - a->start_ms) % REPORT_MS == 0)
            a->step_flushed = a->step;
    }
}

/* ---- the rule (server/fairshare.h), for two arrays of one tenant on one device ---- */

/* Job slowdown: (elapsed + remaining x step) / (total x isolated). */
static double slowdown_of(double elapsed_ms, int64_t done, double step_ms)
{
    return (elapsed_ms + (double)(STEPS - done) * step_ms) / ((double)STEPS * ISO_MS);
}

/*
 * The target fractions: with a_i = elapsed / (total x iso) and b_i = remaining x k_i /
 * (total x iso), array i reaches slowdown L at fraction b_i / (L - a_i); the common L
 * with x_A + x_B = 1 is the larger root of
 *   L^2 - (a_A + a_B + b_A + b_B) L + (a_A a_B + b_A a_B + b_B a_A) = 0.
 * A fraction below the floor is raised to it and the other gets the rest.
 */
static void targets(double elapsed_ms, const arr *a, const arr *b, double fa, double fb, double *xa,
                    double *xb)
{
    double run = (double)STEPS * ISO_MS;
    double aa = elapsed_ms / run, ab = elapsed_ms / run;
    double ba = (double)(STEPS - a->step_flushed) * a->step_ms * fa / run;
    double bb = (double)(STEPS - b->step_flushed) * b->step_ms * fb / run;
    double p = aa + ab + ba + bb, q = aa * ab + ba * ab + bb * aa;
    double L = (p + sqrt(p * p - 4 * q)) / 2;
    *xa = ba / (L - aa);
    *xb = bb / (L - ab);
    double floor_x = MIN_SHARE * 0.5;
    if (*xa < floor_x) {
        *xa = floor_x;
        *xb = 1 - floor_x;
    } else if (*xb < floor_x) {
        *xb = floor_x;
        *xa = 1 - floor_x;
    }
}

/* The shares after a period (unchanged when *changed is false). */
static void decide(double elapsed_ms, double *sa, double *sb, bool *changed)
{
    double fa = *sa / (*sa + *sb), fb = *sb / (*sa + *sb), xa, xb;
    targets(elapsed_ms, &A, &B, fa, fb, &xa, &xb);
    double delta = fmax(fabs(xa - fa), fabs(xb - fb));
    double gap = fmax(fabs(xa / (xa + xb) - fa), fabs(xb / (xa + xb) - fb));
    *changed = !(delta == 0 || gap < SHARE_HYSTERESIS);
    if (!*changed) return;
    double move = delta;
    if (delta > MAX_SHARE_STEP) {
        move = MAX_SHARE_STEP;
        if (delta - move < SHARE_HYSTERESIS) move = delta - SHARE_HYSTERESIS;
    }
    *sa = fa + move / delta * (xa - fa);
    *sb = fb + move / delta * (xb - fb);
}

/* fusebox_group_slowdown{group="gid"} in /metrics. */
static double metric_slowdown(const char *gid)
{
    char key[128];
    snprintf(key, sizeof key, "fusebox_group_slowdown{group=\"%s\"} ", gid);
    fbt_resp r = fbt_call(&T.s, "GET", "/metrics", NULL, NULL);
    fbt_expect(&r, 200, NULL, "metrics");
    const char *p = strstr(r.body, key);
    double v = p ? strtod(p + strlen(key), NULL) : -1;
    fbt_resp_free(&r);
    return v;
}

static long long metric_count(const char *name)
{
    fbt_resp r = fbt_call(&T.s, "GET", "/metrics", NULL, NULL);
    fbt_expect(&r, 200, NULL, "metrics");
    char key[128];
    snprintf(key, sizeof key, "\n%s ", name);
    const char *p = strstr(r.body, key);
    long long v = p ? strtoll(p + strlen(key), NULL, 10) : -1;
    fbt_resp_free(&r);
    return v;
}

#define CHECK_REL(x, want)                                                                         \
    do {                                                                                           \
        double x_ = (x), w_ = (want);                                                              \
        if (!(fabs(x_ - w_) <= 1e-8 * fabs(w_))) {                                                 \
            fprintf(stderr, "%s:%d: %s = %.17g, want %.17g\n", __FILE__, __LINE__, #x, x_, w_);    \
            CHECK(0);                                                                              \
        }                                                                                          \
    } while (0)

/* fuseboxd refuses a rebalance period outside 0..3600000 ms, naming the flag, before it
 * touches anything (the database URL given is never reached). */
static void check_bad_flag(const char *value)
{
    char cmd[1024], out[2048] = "";
    snprintf(cmd, sizeof cmd,
             "'%s/server/fuseboxd' --database-url postgresql://127.0.0.1:1/none"
             " --rebalance-ms '%s' 2>&1",
             getenv("FB_BINARY_DIR"), value);
    FILE *p = popen(cmd, "r");
    CHECK(p != NULL);
    size_t n = fread(out, 1, sizeof out - 1, p);
    out[n] = '\0';
    int st = pclose(p);
    if (!strstr(out, "rebalance-ms")) fprintf(stderr, "fuseboxd said: %s\n", out);
    CHECK(st != 0 && strstr(out, "rebalance-ms") != NULL);
}

/* The array's job as GET /v1/jobs/{id} shows it: its slowdown and time share. */
static void job_view(const arr *a, double *slowdown, double *share)
{
    char path[128];
    snprintf(path, sizeof path, "/v1/jobs/%s", a->job);
    fbt_resp r = fbt_call(&T.s, "GET", path, T.key, NULL);
    fbt_expect(&r, 200, NULL, "get a job");
    CHECK_STR_EQ(json_string_value(json_object_get(r.json, "state")), "running");
    json_t *fs = json_object_get(r.json, "fair_share");
    CHECK(json_is_object(fs));
    json_t *split = json_object_get(fs, "split");
    CHECK(json_is_array(split) && json_array_size(split) == 1);
    CHECK_INT_EQ(json_integer_value(json_array_get(split, 0)), BATCH);
    *slowdown = json_number_value(json_object_get(r.json, "slowdown"));
    *share = json_number_value(json_object_get(fs, "time_share"));
    fbt_resp_free(&r);
}

int main(void)
{
    setvbuf(stdout, NULL, _IONBF, 0);
    CHECK(getenv("FB_BINARY_DIR") != NULL);
    check_bad_flag("-1");
    check_bad_flag("3600001");
    check_bad_flag("5s");
    char period[16];
    snprintf(period, sizeof period, "%d", PERIOD_MS);
    const char *flags[] = {"--rebalance-ms", period, NULL};
    e2e_start_clocked(&T, flags);
    const long long S = E2E_CLOCK_START_MS;
    ctx = zmq_ctx_new();
    CHECK(ctx != NULL);
    sock = fw_connect(ctx, &T, "fake-fair", 0);
    fb_wire_msg m;
    fw_hello(&m, "fake-fair", 1);
    fw_send(sock, &m, NULL, 0);
    fb_wire_msg_free(&m);
    expect(FB_WIRE_WELCOME, &m);
    fb_wire_msg_free(&m);

    /* both submitted at S and planned together at the next tick, half the device each (a
     * plan that ran out of its real-time budget for new arrays starts the other at a later
     * tick: the shares are the same, and the test's reports start once both are placed) */
    snprintf(A.job, sizeof A.job, "%s", e2e_submit(&T, T.key, spec("a", 64)));
    snprintf(B.job, sizeof B.job, "%s", e2e_submit(&T, T.key, spec("b", 48)));
    for (int k = 0; !A.id[0] || !B.id[0]; k++) {
        CHECK(k < 100);
        e2e_clock_advance(&T, E2E_TICK_MS);
        sync_now();
    }
    printf("placed at %lld ms: shares a %.3f b %.3f\n", e2e_clock_ms(&T) - S, A.share, B.share);
    CHECK_REL(A.share, 0.5);
    CHECK_REL(B.share, 0.5);
    event_started(&A);
    event_started(&B);
    char sql[1024];
    snprintf(sql, sizeof sql,
             "INSERT INTO profiles (fusion_key, n_models, device_kind, isolated_step_ms, warm)"
             " SELECT fusion_key, 1, 'cpu', %g, true FROM groups WHERE id IN ('%s', '%s')",
             ISO_MS, A.id, B.id);
    PQclear(fbt_sql(&T.s, sql));
    A.start_ms = e2e_clock_ms(&T);
    B.start_ms = A.start_ms + E2E_TICK_MS;

    /* tick by tick through PERIODS fair-share periods */
    double sa = A.share, sb = B.share;
    const double want_a[PERIODS] = {
        0.4, 0.3, 0.2, MIN_SHARE * 0.5, MIN_SHARE * 0.5, MIN_SHARE * 0.5};
    int changes = 0, k = 0;
    for (long long c = e2e_clock_ms(&T); k < PERIODS; c = e2e_clock_ms(&T)) {
        note_flushed(c);
        arr *both[2] = {&A, &B};
        /* the REBALANCEs of the tick at c (if any) arrive before the heartbeat's reply */
        sync_now();
        /* a period before both step times are measured (both arrays' second reports read
         * before its tick) predicts with the profile where none is: B's reports come a tick
         * after A's, and A's 20 ms at half the device is its profile's 10 ms, so the arrays
         * look alike and keep their even shares */
        bool measured = A.measured && A.measured < c && B.measured && B.measured < c;
        if (c > S && (c - S) % PERIOD_MS == 0 && !measured) {
            printf("period at %5lld ms: step times not measured yet; got %d+%d REBALANCE\n",
                   c - S, A.rebalances, B.rebalances);
            CHECK_INT_EQ(A.rebalances, 0);
            CHECK_INT_EQ(B.rebalances, 0);
        } else if (c > S && (c - S) % PERIOD_MS == 0) {
            bool changed;
            decide((double)(c - S), &sa, &sb, &changed);
            printf("period at %5lld ms: steps a %lld b %lld; expected %s a %.6f b %.6f;"
                   " got %d+%d REBALANCE a %.6f b %.6f\n",
                   c - S, (long long)A.step_flushed, (long long)B.step_flushed,
                   changed ? "shares" : "no change,", sa, sb, A.rebalances, B.rebalances,
                   A.rebalances ? A.rebalance_share : A.share,
                   B.rebalances ? B.rebalance_share : B.share);
            CHECK_REL(sa, want_a[k]); /* the rule's sequence, as the header says */
            CHECK_INT_EQ(A.rebalances, changed);
            CHECK_INT_EQ(B.rebalances, changed);
            if (changed) {
                CHECK_REL(A.rebalance_share, sa);
                CHECK_REL(B.rebalance_share, sb);
                CHECK_INT_EQ(A.rebalance_split, BATCH);
                CHECK_INT_EQ(B.rebalance_split, BATCH);
                A.share = sa;
                B.share = sb;
                changes += 2;
            }
            /* the slowdowns the controller published for this period */
            CHECK_REL(metric_slowdown(A.id),
                      slowdown_of((double)(c - S), A.step_flushed, A_STEP_MS));
            CHECK_REL(metric_slowdown(B.id),
                      slowdown_of((double)(c - S), B.step_flushed, B_STEP_MS));
            k++;
        } else {
            CHECK_INT_EQ(A.rebalances, 0);
            CHECK_INT_EQ(B.rebalances, 0);
        }
        A.rebalances = B.rebalances = 0;
        /* the reports due at c, read at c (the next sync proves it) */
        for (int i = 0; i < 2; i++) {
            arr *a = both[i];
            if (c >= a->start_ms && (c - a->start_ms) % REPORT_MS == 0) {
                report(a, a->step + REPORT_MS / a->step_ms);
                if (++a->reports == 2) a->measured = c;
            }
        }
        sync_now();
        e2e_clock_advance(&T, E2E_TICK_MS);
    }
    CHECK_INT_EQ(metric_count("fusebox_fair_changes_total"), changes);
    CHECK_INT_EQ(changes, 8);

    /* the job records: the slowdown of each one's last report, written a tick after it was
     * read (its elapsed time then), and the share the controller set */
    long long now = e2e_clock_ms(&T);
    note_flushed(now);
    arr *both[2] = {&A, &B};
    for (int i = 0; i < 2; i++) {
        arr *a = both[i];
        long long last = a->start_ms + (now - E2E_TICK_MS - a->start_ms) / REPORT_MS * REPORT_MS;
        if (last + E2E_TICK_MS > now) last -= REPORT_MS; /* not flushed yet */
        double sd, share;
        job_view(a, &sd, &share);
        double want = slowdown_of((double)(last + E2E_TICK_MS - S), a->step_flushed, a->step_ms);
        printf("job %s: slowdown %.6f (expected %.6f), time share %.6f\n", a->name, sd, want,
               share);
        CHECK_REL(sd, want);
        CHECK_REL(share, a->share);
    }
    /* and the cluster view has each array's split and slowdown */
    fbt_resp r = fbt_call(&T.s, "GET", "/v1/cluster", T.key, NULL);
    fbt_expect(&r, 200, NULL, "cluster");
    json_t *arrays = json_object_get(r.json, "arrays");
    CHECK_INT_EQ((long long)json_array_size(arrays), 2);
    for (size_t i = 0; i < json_array_size(arrays); i++) {
        json_t *x = json_array_get(arrays, i);
        json_t *split = json_object_get(x, "split");
        CHECK(json_is_array(split) && json_array_size(split) == 1);
        CHECK_INT_EQ(json_integer_value(json_array_get(split, 0)), BATCH);
        CHECK(json_is_number(json_object_get(x, "slowdown")));
    }
    fbt_resp_free(&r);
    printf("result: fair shares a %.3f b %.3f after %d periods, %d changes\n", A.share, B.share,
           PERIODS, changes);
    zmq_close(sock);
    CHECK(zmq_ctx_term(ctx) == 0);
    e2e_finish(&T);
    printf("ok\n");
    return 0;
}
