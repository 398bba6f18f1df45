/*
 * In-group batch splits that follow measured per-device speed, end to end
 * through fuseboxd's control loop, every decision at a known time: fuseboxd
 * runs on a manual clock (e2e_start_clocked) with a fair-share period of 1 s
 * (--rebalance-ms); one fake worker (tests/dispatch/fakewire.h) with two CPU
 * devices holds a data-parallel array (parallel.data 2, batch 256) and
 * reports, every 500 ms of the clock, each device's breakdown: steps, the
 * samples its shard trained on (the split it was last sent) and its passes'
 * time at a speed the test sets.  So the test knows every rate the server
 * measures (samples per second of a device's passes, smoothed by the
 * controller's weight 0.3, the first report left out) and computes, from the
 * rule of server/fairshare.h and independently of its code, the split every
 * period must decide: proportional to the rates (largest remainder, each
 * shard at least 1); taken at once when it shortens the predicted step (the
 * slowest shard's samples over its rate) by more than 5%; a smaller gain only
 * after it pointed the same way for 10 periods in a row with gains adding up
 * past 5%.
 *
 * 1. Devices of 4000 and 1000 samples/s: the first period with rates moves
 *    the even split 128/128 to 205/51 at once; later periods change nothing
 *    (no REBALANCE).
 * 2. Device 1 speeds up to 1200 samples/s: the gain is small (2% to 4% a
 *    period), so nothing moves for 9 periods, and the 10th takes the
 *    proportional split 197/59 exactly; then nothing again.
 *
 * It also checks what GET /v1/jobs/{id}, GET /v1/cluster and /metrics serve
 * (each device's latest breakdown, the smoothed speeds), and that bad values
 * of the worker's device flags are refused before a worker starts.  That a
 * moved split does not change training is fusebox-worker's business
 * (tests/parallel/test_worker_parallel: a REBALANCE mid-run, the model equal
 * to training alone); how a real loaded CPU's devices measure is a
 * benchmark's (bench/parallel), not a test's.
 */
#include <math.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <zmq.h>

#include "check.h"
#include "e2e.h"
#include "fakewire.h"
#include "wire.h"

#define BATCH 256
#define PERIOD_MS 1000
#define REPORT_MS 500
#define REPORT_STEPS 10
#define STEPS 1000000LL
/* the controller's documented defaults (server/fairshare.h) */
#define SMOOTHING 0.3
#define SPLIT_HYSTERESIS 0.05
#define SPLIT_PATIENCE 10
/* when device 1 speeds up (after the first report), and how long the test runs */
#define PHASE2_REPORTS 6
#define PERIODS 15
#define WAIT_MS 30000 /* real-time liveness bound on a message the test waits for */

static e2e T;
static void *ctx, *sock;
static long long heartbeats, replies;
static int64_t seq;

/* the array */
static char group_id[FB_WIRE_ID_LEN + 1], job[64];
static int64_t generation, step;
static int64_t split[2] = {0, 0}; /* what the fake was last sent */
static int rebalances;            /* REBALANCEs since the test last looked */
static int64_t rebalance_split[2];

/* ---- the fake worker ------------------------------------------------------- */

static void take(fb_wire_msg *m)
{
    replies += m->type == FB_WIRE_HEARTBEAT && m->reply;
    CHECK(!(m->type == FB_WIRE_HEARTBEAT && m->reply && !m->known));
    if (m->type == FB_WIRE_REBALANCE) {
        CHECK_STR_EQ(m->group_id, group_id);
        CHECK_INT_EQ(m->generation, generation);
        CHECK_INT_EQ(m->n_split, 2);
        CHECK_INT_EQ(m->split[0] + m->split[1], BATCH);
        CHECK(m->time_share == 1.0); /* alone on its devices */
        rebalances++;
        rebalance_split[0] = m->split[0];
        rebalance_split[1] = m->split[1];
    }
    CHECK(m->type != FB_WIRE_DETACH);
    fb_wire_msg_free(m);
}

/* A heartbeat, then every message until it is answered: fuseboxd has read what the fake
 * sent before it, at the clock's current time, and what it sent before (a tick's
 * REBALANCE) is taken. */
static void sync_now(void)
{
    fb_wire_msg hb = {.type = FB_WIRE_HEARTBEAT};
    if (group_id[0]) fw_add_running(&hb, group_id, generation, job, step);
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
        if (fw_recv(sock, "fake-split", 50, &m, NULL, NULL)) take(&m);
    }
}

static void expect(fb_wire_type type, fb_wire_msg *out)
{
    double t0 = fbt_now_ms();
    while (fbt_now_ms() - t0 < WAIT_MS) {
        fb_wire_msg m;
        if (!fw_recv(sock, "fake-split", 50, &m, NULL, NULL)) continue;
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

/* A PROGRESS after REPORT_STEPS more steps, device d's passes at speed[d] samples/s over
 * the samples of its shard. */
static void report(const double speed[2])
{
    step += REPORT_STEPS;
    fb_wire_msg m = {.type = FB_WIRE_PROGRESS, .generation = generation};
    snprintf(m.group_id, sizeof m.group_id, "%s", group_id);
    double slowest = 0;
    m.n_device_steps = 2;
    for (int d = 0; d < 2; d++) {
        fb_wire_device_step *e = &m.device_steps[d];
        e->device = d;
        e->steps = REPORT_STEPS;
        e->samples = split[d] * REPORT_STEPS;
        e->pass_ms = (double)split[d] / speed[d] * 1000.0;
        e->compute_ms = e->pass_ms + 1.0; /* and the update */
        if (e->compute_ms > slowest) slowest = e->compute_ms;
    }
    for (int d = 0; d < 2; d++)
        m.device_steps[d].idle_ms = slowest - m.device_steps[d].compute_ms;
    m.compute_ms = slowest;
    m.samples_per_s = BATCH * 1000.0 / slowest;
    m.n_progress = 1;
    m.progress = calloc(1, sizeof *m.progress);
    CHECK(m.progress != NULL);
    snprintf(m.progress[0].job_id, sizeof m.progress[0].job_id, "%s", job);
    m.progress[0].step = step;
    m.progress[0].steps = STEPS;
    m.progress[0].loss = 1.0;
    m.progress[0].accuracy = 0.5;
    m.progress[0].lr = 0.01;
    fw_send(sock, &m, NULL, 0);
    fb_wire_msg_free(&m);
}

/* ---- the rule (server/fairshare.h) ------------------------------------------ */

typedef struct model {
    int reports;
    double rate[2]; /* smoothed, 0 = not measured */
    int periods;    /* the split's memory: periods pointing the same way, toward, gains */
    unsigned toward;
    double gain_sum;
} model;

/* A report the server read: the first gives no rate (the array's warm-up). */
static void model_report(model *md, const double speed[2])
{
    if (md->reports++ == 0) return;
    for (int d = 0; d < 2; d++)
        md->rate[d] =
            md->rate[d] == 0 ? speed[d] : md->rate[d] + SMOOTHING * (speed[d] - md->rate[d]);
}

static double split_time(const double rate[2], const int64_t s[2])
{
    return fmax((double)s[0] / rate[0], (double)s[1] / rate[1]);
}

/* One period: whether the split changes, and to what (next). */
static bool model_period(model *md, const int64_t cur[2], int64_t next[2])
{
    if (!(md->rate[0] > 0 && md->rate[1] > 0)) {
        md->periods = 0;
        return false;
    }
    /* proportional, rounded down, the rest by largest remainder */
    double ideal[2];
    int64_t total = 0;
    for (int d = 0; d < 2; d++) {
        ideal[d] = BATCH * md->rate[d] / (md->rate[0] + md->rate[1]);
        next[d] = (int64_t)floor(ideal[d]);
        if (next[d] < 1) next[d] = 1;
        total += next[d];
    }
    while (total < BATCH) {
        int best = ideal[1] - (double)next[1] > ideal[0] - (double)next[0] ? 1 : 0;
        next[best]++;
        total++;
    }
    double now = split_time(md->rate, cur), then = split_time(md->rate, next);
    if (!(then < now)) {
        md->periods = 0;
        return false;
    }
    unsigned toward = (next[0] > cur[0] ? 1u : 0u) | (next[1] > cur[1] ? 2u : 0u);
    double gain = 1 - then / now;
    if (md->periods > 0 && md->toward == toward) {
        md->periods++;
        md->gain_sum += gain;
    } else {
        md->periods = 1;
        md->gain_sum = gain;
    }
    md->toward = toward;
    if (gain <= SPLIT_HYSTERESIS &&
        (md->periods < SPLIT_PATIENCE || md->gain_sum <= SPLIT_HYSTERESIS))
        return false;
    md->periods = 0;
    return true;
}

/* ---- what the server serves --------------------------------------------------- */

static double metric_value(const char *key)
{
    fbt_resp r = fbt_call(&T.s, "GET", "/metrics", NULL, NULL);
    fbt_expect(&r, 200, NULL, "metrics");
    const char *p = strstr(r.body, key);
    double v = p ? strtod(p + strlen(key), NULL) : -1;
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

/* GET /v1/jobs/{id}: the split, and each device's latest breakdown (the last report's). */
static void check_job(const double speed[2])
{
    char path[128];
    snprintf(path, sizeof path, "/v1/jobs/%s", job);
    fbt_resp r = fbt_call(&T.s, "GET", path, T.key, NULL);
    fbt_expect(&r, 200, NULL, "get the job");
    CHECK_STR_EQ(json_string_value(json_object_get(r.json, "state")), "running");
    json_t *js = json_object_get(json_object_get(r.json, "fair_share"), "split");
    CHECK_INT_EQ((long long)json_array_size(js), 2);
    json_t *bd = json_object_get(r.json, "device_breakdown");
    CHECK_INT_EQ((long long)json_array_size(bd), 2);
    for (int k = 0; k < 2; k++) {
        CHECK_INT_EQ(json_integer_value(json_array_get(js, (size_t)k)), split[k]);
        json_t *e = json_array_get(bd, (size_t)k);
        CHECK_INT_EQ(json_integer_value(json_object_get(e, "device")), k);
        CHECK_INT_EQ(json_integer_value(json_object_get(e, "shard")), k);
        CHECK_INT_EQ(json_integer_value(json_object_get(e, "stage")), 0);
        CHECK_REL(json_number_value(json_object_get(e, "samples_per_step")), (double)split[k]);
        CHECK_REL(json_number_value(json_object_get(e, "samples_per_s")), speed[k]);
        CHECK_REL(json_number_value(json_object_get(e, "compute_ms")),
                  (double)split[k] / speed[k] * 1000.0 + 1.0);
    }
    fbt_resp_free(&r);
}

/* GET /v1/cluster: the one array, on both devices, with both devices' breakdown. */
static void check_cluster(void)
{
    fbt_resp r = fbt_call(&T.s, "GET", "/v1/cluster", T.key, NULL);
    fbt_expect(&r, 200, NULL, "cluster");
    json_t *arrays = json_object_get(r.json, "arrays");
    CHECK_INT_EQ((long long)json_array_size(arrays), 1);
    json_t *a = json_array_get(arrays, 0);
    CHECK_INT_EQ((long long)json_array_size(json_object_get(a, "devices")), 2);
    json_t *bd = json_object_get(a, "device_breakdown");
    CHECK_INT_EQ((long long)json_array_size(bd), 2);
    for (size_t k = 0; k < 2; k++)
        CHECK_INT_EQ(json_integer_value(json_object_get(json_array_get(bd, k), "device")),
                     (long long)k);
    json_t *js = json_object_get(a, "split");
    CHECK_INT_EQ(json_integer_value(json_array_get(js, 0)), split[0]);
    CHECK_INT_EQ(json_integer_value(json_array_get(js, 1)), split[1]);
    fbt_resp_free(&r);
}

/* ---- the worker's flags ----------------------------------------------------- */

/* fusebox-worker with extra flags after the usual ones, connecting nowhere useful: for
 * flags it must refuse before it connects.  Returns its exit status and what it said. */
static int worker_refuses(const char *flags, char *out, size_t cap)
{
    char cmd[2048];
    snprintf(cmd, sizeof cmd,
             "'%s/workers/fusebox-worker' --server tcp://127.0.0.1:1 --server-key '%s'"
             " --key '%s' --name refused --cpu-devices 2 %s 2>&1",
             getenv("FB_BINARY_DIR"), T.server_pub, T.worker_key, flags);
    FILE *p = popen(cmd, "r");
    CHECK(p != NULL);
    size_t n = fread(out, 1, cap - 1, p);
    out[n] = '\0';
    int st = pclose(p);
    return WIFEXITED(st) ? WEXITSTATUS(st) : -1;
}

static void check_bad_flags(void)
{
    static const struct {
        const char *flags, *says;
    } bad[] = {
        {"--device-threads 0,1", "--device-threads needs 1..64 comma-separated integers"},
        {"--device-threads 2,", "--device-threads needs"},
        {"--device-threads 2,,1", "--device-threads needs"},
        {"--device-threads 1025", "--device-threads needs"},
        {"--device-threads x", "--device-threads needs"},
        {"--device-threads 2,1,1", "device threads are given for 3 devices; the worker offers 2"},
        {"--pin-devices yes", "--pin-devices needs on or off, not 'yes'"},
        {"--device-turns both", "--device-turns needs auto, all or first, not 'both'"},
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        char out[2048];
        int rc = worker_refuses(bad[i].flags, out, sizeof out);
        if (rc != 2 || !strstr(out, bad[i].says))
            fprintf(stderr, "%s: exit %d, said: %s\n", bad[i].flags, rc, out);
        CHECK_INT_EQ(rc, 2);
        CHECK(strstr(out, bad[i].says) != NULL);
    }
}

static const char *spec(void)
{
    static char buf[1024];
    snprintf(buf, sizeof buf,
             "{\"name\": \"split\", \"dataset\": \"synth\", \"model\": {\"input\": [16],"
             " \"layers\": [{\"type\": \"linear\", \"out\": 64}, {\"type\": \"relu\"},"
             " {\"type\": \"linear\", \"out\": 4}]}, \"batch_size\": %d, \"steps\": %lld,"
             " \"parallel\": {\"data\": 2, \"pipeline\": 1},"
             " \"optimizer\": {\"type\": \"sgd\", \"lr\": 0.01}, \"seed\": 5}",
             BATCH, STEPS);
    return buf;
}

int main(void)
{
    CHECK(getenv("FB_BINARY_DIR") != NULL);
    setvbuf(stdout, NULL, _IONBF, 0);
    char period[16];
    snprintf(period, sizeof period, "%d", PERIOD_MS);
    const char *flags[] = {"--rebalance-ms", period, NULL};
    e2e_start_clocked(&T, flags);
    check_bad_flags();
    const long long S = E2E_CLOCK_START_MS;
    ctx = zmq_ctx_new();
    CHECK(ctx != NULL);
    sock = fw_connect(ctx, &T, "fake-split", 0);
    fb_wire_msg m;
    fw_hello(&m, "fake-split", 2);
    fw_send(sock, &m, NULL, 0);
    fb_wire_msg_free(&m);
    expect(FB_WIRE_WELCOME, &m);
    fb_wire_msg_free(&m);

    /* placed on both devices at the next tick, the batch split evenly */
    snprintf(job, sizeof job, "%s", e2e_submit(&T, T.key, spec()));
    e2e_clock_advance(&T, E2E_TICK_MS);
    expect(FB_WIRE_ASSIGN, &m);
    CHECK_INT_EQ(m.n_members, 1);
    CHECK_STR_EQ(m.members[0].job_id, job);
    CHECK_INT_EQ(m.parallel_data, 2);
    CHECK_INT_EQ(m.n_group_devices, 2);
    CHECK_INT_EQ(m.group_devices[0], 0);
    CHECK_INT_EQ(m.group_devices[1], 1);
    CHECK_INT_EQ(m.n_split, 2);
    snprintf(group_id, sizeof group_id, "%s", m.group_id);
    generation = m.generation;
    split[0] = m.split[0];
    split[1] = m.split[1];
    fb_wire_msg_free(&m);
    printf("the planner's split: %lld/%lld\n", (long long)split[0], (long long)split[1]);
    CHECK_INT_EQ(split[0], BATCH / 2);
    CHECK_INT_EQ(split[1], BATCH / 2);
    fb_wire_msg ev = {.type = FB_WIRE_EVENT,
                      .generation = generation,
                      .seq = ++seq,
                      .event = FB_EV_STARTED,
                      .loss = NAN,
                      .accuracy = NAN};
    snprintf(ev.group_id, sizeof ev.group_id, "%s", group_id);
    snprintf(ev.job_id, sizeof ev.job_id, "%s", job);
    fw_send(sock, &ev, NULL, 0);
    fb_wire_msg_free(&ev);

    const long long first_report = e2e_clock_ms(&T);
    const double speed1[2] = {4000, 1000}, speed2[2] = {4000, 1200};
    const double *speed = speed1;
    model md = {0};
    int64_t want_split[2] = {split[0], split[1]};
    int k = 0, n_reports = 0, changed_at[PERIODS];
    int64_t changed_to[PERIODS][2];
    int n_changed = 0;
    for (long long c = e2e_clock_ms(&T); k < PERIODS; c = e2e_clock_ms(&T)) {
        sync_now(); /* the tick at c's REBALANCE, if any */
        if (c > S && (c - S) % PERIOD_MS == 0) {
            int64_t next[2];
            bool change = model_period(&md, want_split, next);
            printf(
                "period at %5lld ms: rates %.3f %.3f, memory %d periods gaining %.4f; expected %s"
                " %lld/%lld; got %d REBALANCE %lld/%lld\n",
                c - S, md.rate[0], md.rate[1], md.periods, md.gain_sum,
                change ? "split" : "no change,", (long long)(change ? next[0] : want_split[0]),
                (long long)(change ? next[1] : want_split[1]), rebalances,
                (long long)rebalance_split[0], (long long)rebalance_split[1]);
            CHECK_INT_EQ(rebalances, change);
            if (change) {
                CHECK_INT_EQ(rebalance_split[0], next[0]);
                CHECK_INT_EQ(rebalance_split[1], next[1]);
                want_split[0] = split[0] = next[0];
                want_split[1] = split[1] = next[1];
                changed_at[n_changed] = k;
                changed_to[n_changed][0] = next[0];
                changed_to[n_changed++][1] = next[1];
            }
            /* the speeds the controller smoothed, as published for the period */
            char key[160];
            for (int d = 0; d < 2 && md.rate[d] > 0; d++) {
                snprintf(key, sizeof key,
                         "fusebox_device_samples_per_second{group=\"%s\",worker=\"fake-split\","
                         "device=\"%d\"} ",
                         group_id, d);
                CHECK_REL(metric_value(key), md.rate[d]);
            }
            k++;
        } else {
            CHECK_INT_EQ(rebalances, 0);
        }
        rebalances = 0;
        if ((c - first_report) % REPORT_MS == 0) {
            if (n_reports == PHASE2_REPORTS) speed = speed2;
            report(speed);
            model_report(&md, speed);
            n_reports++;
        }
        sync_now(); /* the report is read at c */
        e2e_clock_advance(&T, E2E_TICK_MS);
    }
    /* the sequence the header states: 205/51 at once at the first period, 197/59 at the
     * tenth period of device 1's new speed, nothing otherwise */
    CHECK_INT_EQ(n_changed, 2);
    CHECK_INT_EQ(changed_at[0], 0);
    CHECK_INT_EQ(changed_to[0][0], 205);
    CHECK_INT_EQ(changed_to[0][1], 51);
    CHECK_INT_EQ(changed_to[1][0], 197);
    CHECK_INT_EQ(changed_to[1][1], 59);
    int phase2_first = (int)((first_report + PHASE2_REPORTS * REPORT_MS - S) / PERIOD_MS);
    CHECK_INT_EQ(changed_at[1], phase2_first + SPLIT_PATIENCE - 1);

    check_job(speed);
    check_cluster();
    char key[160];
    snprintf(key, sizeof key,
             "fusebox_device_step_seconds{group=\"%s\",worker=\"fake-split\",device=\"1\","
             "phase=\"compute\"} ",
             group_id);
    CHECK_REL(metric_value(key), ((double)split[1] / speed[1] * 1000.0 + 1.0) / 1000.0);
    int rc = fbt_validate_recorded();
    if (rc == 77)
        printf("the responses were not validated against api/openapi.yaml (no node)\n");
    else
        CHECK_INT_EQ(rc, 0);
    printf("result: split 205/51 at period 1, 197/59 at period %d\n", changed_at[1] + 1);
    zmq_close(sock);
    CHECK(zmq_ctx_term(ctx) == 0);
    e2e_finish(&T);
    printf("ok\n");
    return 0;
}
