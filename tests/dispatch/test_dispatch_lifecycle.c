/*
 * No job in limbo, and max_restarts that counts (docs/scheduling.md, "Fault
 * classes" and "No job in limbo").  Fake workers speak the wire protocol
 * (fakewire.h), so the test decides every event fuseboxd gets and reads the
 * outcome through the HTTP API:
 *
 * 1. a table of failures a worker reports (before and after the member
 *    started; job and spec faults; no restarts left) -> the job's state,
 *    restarts, error and last event, and the array gone from its device;
 * 2. max_restarts used up: the job fails with the last error;
 * 3. a worker that takes an ASSIGN and never starts it (no event at all):
 *    the array is re-queued within seconds, nothing counted;
 * 4. a poison array: its workers die on 3 different workers in a row
 *    without progress, which uses up a restart, and the next such loss,
 *    with none left, fails it;
 * 5. infrastructure faults: workers lost after progress, three in a row,
 *    and a drain: restarts stays 0 and the job completes;
 * 6. the stale-state check: a job left scheduled without an array, a job
 *    running in a finished array, and an unfinished array no worker runs
 *    holding a device are found and put right.
 *
 * fuseboxd runs on a manual clock (e2e_start_clocked).  Every wait moves it a
 * tick at a time, and before each move every live fake heartbeats and is
 * answered, so no fake that should be alive is ever judged lost, however long
 * the test's own checks take, and a fake that dies is judged lost at exactly
 * the first tick past the heartbeat timeout after its last heartbeat (cases
 * 4 and 5 and fake-a's loss assert the tick); an array never started is
 * re-queued once it has been missing a heartbeat timeout, which starts a
 * heartbeat timeout after its assignment (case 3 asserts the tick).
 */
#include <jansson.h>
#include <math.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <zmq.h>

#include "check.h"
#include "e2e.h"
#include "fakewire.h"
#include "wire.h"

#define WAIT_MS 30000
#define WAIT_TICKS 600 /* the most clock ticks a wait moves (60 s of the clock) */
#define MAX_ARRAYS 64
#define MAX_FAKES 8
#define MAX_SEQ 1024

static e2e T;
static void *ctx;

/* An array the fake was assigned: it lists it as running while `on`. */
typedef struct arr {
    char group[FB_WIRE_ID_LEN + 1];
    int64_t generation;
    char job[FB_WIRE_ID_LEN + 1];
    int64_t start_step;
    bool on, claimed;
} arr;

typedef struct fake {
    char name[32];
    void *sock;
    int64_t seq;
    long long heartbeats, replies; /* heartbeats sent, and the replies taken */
    arr a[MAX_ARRAYS];
    int n;
    bool acked[MAX_SEQ];
    char ignore[FB_WIRE_ID_LEN + 1]; /* an ASSIGN of this job is dropped: never started */
} fake;

static long long ignored_at; /* clock ms at which a fake took the ASSIGN it ignores */
static fake *live[MAX_FAKES];
static int n_live;

static void fake_heartbeat(fake *f)
{
    f->heartbeats++;
    fb_wire_msg hb = {.type = FB_WIRE_HEARTBEAT};
    for (int i = 0; i < f->n; i++)
        if (f->a[i].on) fw_add_running(&hb, f->a[i].group, f->a[i].generation, f->a[i].job, 0);
    fw_send(f->sock, &hb, NULL, 0);
    fb_wire_msg_free(&hb);
}

static int64_t fake_event(fake *f, const arr *a, fb_wire_event_kind kind, int64_t step,
                          const char *text, fb_wire_fault fault, const char *blob)
{
    fb_wire_msg m = {.type = FB_WIRE_EVENT, .generation = a->generation, .seq = ++f->seq,
                     .event = kind, .step = step, .loss = NAN, .accuracy = NAN,
                     .fault = fault};
    CHECK(m.seq < MAX_SEQ);
    snprintf(m.group_id, sizeof m.group_id, "%s", a->group);
    snprintf(m.job_id, sizeof m.job_id, "%s", a->job);
    if (text) snprintf(m.text, sizeof m.text, "%s", text);
    if (blob) m.blob = 1;
    fw_send(f->sock, &m, blob, blob ? strlen(blob) : 0);
    return m.seq;
}

/* One turn of a fake: one message (within ms) handled as a worker would: ASSIGN starts
 * arrays, DETACH stops them (a member leaves with its DETACHED event), ACKs and heartbeat
 * replies are noted.  (It heartbeats in sync_fake, on the clock.) */
static void fake_pump(fake *f, int ms)
{
    fb_wire_msg m;
    if (!fw_recv(f->sock, f->name, ms, &m, NULL, NULL)) return;
    if (m.type == FB_WIRE_HEARTBEAT && m.reply) {
        f->replies++;
        /* a live fake is never taken for lost */
        CHECK(m.known);
    } else if (m.type == FB_WIRE_ASSIGN) {
        for (int i = 0; i < m.n_members; i++) {
            if (strcmp(m.members[i].job_id, f->ignore) == 0) {
                ignored_at = e2e_clock_ms(&T);
                continue;
            }
            CHECK(f->n < MAX_ARRAYS);
            arr *a = &f->a[f->n++];
            memset(a, 0, sizeof *a);
            snprintf(a->group, sizeof a->group, "%s", m.group_id);
            a->generation = m.generation;
            snprintf(a->job, sizeof a->job, "%s", m.members[i].job_id);
            a->start_step = m.members[i].start_step;
            a->on = true;
        }
    } else if (m.type == FB_WIRE_DETACH) {
        for (int i = 0; i < f->n; i++) {
            arr *a = &f->a[i];
            if (!a->on || strcmp(a->group, m.group_id) != 0 || a->generation != m.generation ||
                (m.job_id[0] && strcmp(a->job, m.job_id) != 0))
                continue;
            a->on = false;
            if (m.job_id[0]) fake_event(f, a, FB_EV_DETACHED, a->start_step, m.text, 0, NULL);
        }
    } else if (m.type == FB_WIRE_ACK && m.seq > 0 && m.seq < MAX_SEQ) {
        f->acked[m.seq] = true;
    }
    fb_wire_msg_free(&m);
}

/* The fake heartbeats (listing what it runs) and takes every message until it is
 * answered: fuseboxd has read all it sent, at the clock's current time. */
static void sync_fake(fake *f)
{
    fake_heartbeat(f);
    double t0 = fbt_now_ms();
    while (f->replies < f->heartbeats) {
        if (fbt_now_ms() - t0 > WAIT_MS) {
            fprintf(stderr, "fake %s: heartbeat not answered within %d ms\n", f->name, WAIT_MS);
            e2e_dump(&T);
            CHECK(0);
        }
        fake_pump(f, 20);
    }
}

/* One tick of the clock: every live fake heartbeats and is answered, then the clock moves
 * a tick and the tick is waited for. */
static void step_clock(void)
{
    for (int i = 0; i < n_live; i++)
        sync_fake(live[i]);
    e2e_clock_advance(&T, E2E_TICK_MS);
}

/* Until cond holds: the clock moves a tick at a time (at most WAIT_TICKS); `at` (a long
 * long, or NULL) receives the clock time at which it first held. */
#define WAIT_UNTIL_AT(cond, what, at)                                                              \
    do {                                                                                           \
        int ticks_ = 0;                                                                            \
        while (!(cond)) {                                                                          \
            if (ticks_++ >= WAIT_TICKS) {                                                          \
                fprintf(stderr, "waited %d ticks of the clock: %s\n", WAIT_TICKS, what);           \
                e2e_dump(&T);                                                                      \
                CHECK(0);                                                                          \
            }                                                                                      \
            step_clock();                                                                          \
        }                                                                                          \
        long long *at_ = (at);                                                                     \
        if (at_) *at_ = e2e_clock_ms(&T);                                                          \
    } while (0)
#define WAIT_UNTIL(cond, what) WAIT_UNTIL_AT(cond, what, NULL)

/* A fake worker with one CPU device, registered and live. */
static fake *fake_open(const char *name)
{
    fake *f = calloc(1, sizeof *f);
    CHECK(f != NULL && n_live < MAX_FAKES);
    snprintf(f->name, sizeof f->name, "%s", name);
    f->sock = fw_connect(ctx, &T, name, 0);
    fb_wire_msg m;
    fw_hello(&m, name, 1);
    fw_send(f->sock, &m, NULL, 0);
    fb_wire_msg_free(&m);
    live[n_live++] = f;
    char sql[256];
    snprintf(sql, sizeof sql, "SELECT count(*) = 1 FROM workers WHERE name = '%s' AND state ="
             " 'ready'", name);
    WAIT_UNTIL(strcmp(fbt_sql_value(&T.s, sql), "t") == 0, "the fake registered");
    return f;
}

/* The fake dies: its socket closes without a word, as a killed process's does, right
 * after a heartbeat fuseboxd read at the clock's current time, which it returns. */
static long long fake_die(fake *f)
{
    sync_fake(f);
    long long at = e2e_clock_ms(&T);
    for (int i = 0; i < n_live; i++)
        if (live[i] == f) live[i] = live[--n_live];
    zmq_close(f->sock);
    free(f);
    return at;
}

/* Waits for the ASSIGN of job to f; its array. */
static arr *unclaimed(fake *f, const char *job)
{
    for (int i = 0; i < f->n; i++)
        if (f->a[i].on && !f->a[i].claimed && strcmp(f->a[i].job, job) == 0) return &f->a[i];
    return NULL;
}

static arr *wait_assign(fake *f, const char *job)
{
    WAIT_UNTIL(unclaimed(f, job) != NULL, "the ASSIGN of the job");
    arr *a = unclaimed(f, job);
    a->claimed = true;
    return a;
}

/* Sends an event and waits for its ACK (the server committed it). */
static void event_acked(fake *f, const arr *a, fb_wire_event_kind kind, int64_t step,
                        const char *text, fb_wire_fault fault, const char *blob)
{
    int64_t seq = fake_event(f, a, kind, step, text, fault, blob);
    WAIT_UNTIL(f->acked[seq], "an event's ACK");
}

static void progress(fake *f, const arr *a, int64_t step, int64_t steps)
{
    fb_wire_msg m = {.type = FB_WIRE_PROGRESS, .generation = a->generation};
    snprintf(m.group_id, sizeof m.group_id, "%s", a->group);
    m.compute_ms = 1;
    m.samples_per_s = 1000.0;
    m.n_progress = 1;
    m.progress = calloc(1, sizeof *m.progress);
    CHECK(m.progress != NULL);
    snprintf(m.progress[0].job_id, sizeof m.progress[0].job_id, "%s", a->job);
    m.progress[0].step = step;
    m.progress[0].steps = steps;
    m.progress[0].loss = 1.0;
    m.progress[0].accuracy = 0.5;
    m.progress[0].lr = 0.001;
    fw_send(f->sock, &m, NULL, 0);
    fb_wire_msg_free(&m);
}

/* A spec with its own hidden width (its own fusion key: no two cases share an array). */
static const char *spec(const char *name, int hidden, int max_restarts)
{
    static char buf[1024];
    snprintf(buf, sizeof buf,
             "{\"name\": \"%s\", \"dataset\": \"synth\", \"model\": {\"input\": [16],"
             " \"layers\": [{\"type\": \"linear\", \"out\": %d}, {\"type\": \"relu\"},"
             " {\"type\": \"linear\", \"out\": 4}]}, \"batch_size\": 32, \"steps\": 1000,"
             " \"eval_every\": 100, \"checkpoint_every\": 100,"
             " \"optimizer\": {\"type\": \"adam\", \"lr\": 0.001}, \"seed\": 3,"
             " \"max_restarts\": %d}",
             name, hidden, max_restarts);
    return buf;
}

static const char *field(const char *job, const char *name)
{
    return e2e_job_field(&T, T.key, job, name);
}

static long long sql_ll(const char *fmt, const char *arg)
{
    return fw_sql_ll(&T, fmt, arg);
}

static bool sql_true(const char *fmt, const char *arg)
{
    char sql[1024];
    snprintf(sql, sizeof sql, fmt, arg);
    const char *v = fbt_sql_value(&T.s, sql);
    return v && strcmp(v, "t") == 0;
}

static void sql_exec(const char *fmt, const char *a, const char *b)
{
    char sql[1024];
    snprintf(sql, sizeof sql, fmt, a, b);
    PQclear(fbt_sql(&T.s, sql));
}

static bool job_state_is(const char *job, const char *state)
{
    char sql[256];
    snprintf(sql, sizeof sql, "SELECT state = '%s' FROM jobs WHERE id = '%%s'", state);
    return sql_true(sql, job);
}

/* The job's last requeued or failed event through the API: its kind, message and data's
 * `fault`. */
typedef struct last_event {
    char kind[32], message[600], fault[32];
    int n; /* the job's events */
} last_event;

static last_event job_last_event(const char *job)
{
    last_event e;
    memset(&e, 0, sizeof e);
    char path[128];
    snprintf(path, sizeof path, "/v1/jobs/%s/events", job);
    fbt_resp r = fbt_call(&T.s, "GET", path, T.key, NULL);
    fbt_expect(&r, 200, NULL, "a job's events");
    json_t *evs = json_object_get(r.json, "events");
    CHECK(json_is_array(evs));
    e.n = (int)json_array_size(evs);
    json_t *last = NULL;
    size_t i;
    json_t *ev;
    long long best = -1;
    json_array_foreach(evs, i, ev) {
        long long id = (long long)json_integer_value(json_object_get(ev, "id"));
        const char *kind = json_string_value(json_object_get(ev, "kind"));
        if (!kind || (strcmp(kind, "requeued") != 0 && strcmp(kind, "failed") != 0)) continue;
        if (id > best) {
            best = id;
            last = ev;
        }
    }
    if (last) {
        snprintf(e.kind, sizeof e.kind, "%s", json_string_value(json_object_get(last, "kind")));
        snprintf(e.message, sizeof e.message, "%s",
                 json_string_value(json_object_get(last, "message")));
        json_t *f = json_object_get(json_object_get(last, "data"), "fault");
        if (json_is_string(f)) snprintf(e.fault, sizeof e.fault, "%s", json_string_value(f));
    }
    fbt_resp_free(&r);
    return e;
}

static void cancel(const char *job)
{
    char path[128];
    snprintf(path, sizeof path, "/v1/jobs/%s/cancel", job);
    fbt_resp r = fbt_call(&T.s, "POST", path, T.key, NULL);
    CHECK(r.status == 200 || r.status == 409);
    fbt_resp_free(&r);
}

/* The array left its device: finished, and no device row names it. */
static void check_array_gone(const char *group)
{
    WAIT_UNTIL(sql_true("SELECT state = 'finished' FROM groups WHERE id = '%s'", group),
               "the array finished");
    CHECK_INT_EQ(sql_ll("SELECT count(*) FROM devices WHERE group_id = '%s'", group), 0);
}

/* ---- 1 and 2: failures a worker reports ----------------------------------------------- */

typedef struct fail_case {
    const char *name;
    bool started;        /* the member sent STARTED first (running), or not (scheduled) */
    fb_wire_fault fault; /* what the worker says */
    int max_restarts;
    const char *state; /* then */
    int restarts;
    const char *event; /* the last event's kind */
} fail_case;

static const fail_case cases[] = {
    /* out of memory, numerics, bad data: the array's own, a restart is used */
    {"job-fault-running", true, FB_FAULT_JOB, 2, "queued", 1, "requeued"},
    /* an array that failed to start (unreadable data): the same, from scheduled */
    {"job-fault-scheduled", false, FB_FAULT_JOB, 2, "queued", 1, "requeued"},
    /* the spec cannot train anywhere: failed at once, whatever restarts are left */
    {"spec-fault-running", true, FB_FAULT_SPEC, 2, "failed", 0, "failed"},
    {"spec-fault-scheduled", false, FB_FAULT_SPEC, 2, "failed", 0, "failed"},
    /* no restarts to use: failed with the error */
    {"job-fault-no-restarts", true, FB_FAULT_JOB, 0, "failed", 0, "failed"},
};

static void run_case(fake *f, const fail_case *c, int hidden)
{
    char job[64], text[128];
    snprintf(job, sizeof job, "%s", e2e_submit(&T, T.key, spec(c->name, hidden, c->max_restarts)));
    arr *a = wait_assign(f, job);
    char group[FB_WIRE_ID_LEN + 1];
    snprintf(group, sizeof group, "%s", a->group);
    if (c->started) event_acked(f, a, FB_EV_STARTED, 0, NULL, 0, NULL);
    fw_set_quota(&T, 0); /* a job re-queued stays in the queue until the checks are done */
    snprintf(text, sizeof text, "%s: out of memory allocating the array", c->name);
    a->on = false; /* the worker's array ends with the failure */
    event_acked(f, a, FB_EV_FAILED, 0, text, c->fault, NULL);
    char state[32];
    snprintf(state, sizeof state, "%s", field(job, "state"));
    long long restarts = strtoll(field(job, "restarts"), NULL, 10);
    char error[256];
    snprintf(error, sizeof error, "%s", field(job, "error"));
    last_event e = job_last_event(job);
    printf("1: %-22s -> %s, restarts %lld, error \"%s\", last event %s (%s): %s\n", c->name,
           state, restarts, error, e.kind, e.fault, e.message);
    CHECK_STR_EQ(state, c->state);
    CHECK_INT_EQ(restarts, c->restarts);
    CHECK_STR_EQ(e.kind, c->event);
    CHECK_STR_EQ(e.fault, c->fault == FB_FAULT_SPEC ? "spec" : "job");
    CHECK(strstr(e.message, text) != NULL);
    if (strcmp(c->state, "failed") == 0) {
        CHECK_STR_EQ(error, text);
    } else {
        CHECK_STR_EQ(error, ""); /* the reason is in the event; the planner's own follows */
    }
    check_array_gone(group);
    fw_set_quota(&T, 8);
    if (strcmp(c->state, "queued") == 0) {
        /* re-queued for real: placed again in a new array */
        arr *b = wait_assign(f, job);
        CHECK(strcmp(b->group, group) != 0);
        cancel(job);
        WAIT_UNTIL(!b->on, "the cancelled member's DETACH");
        check_array_gone(b->group);
    }
}

static void max_restarts_used_up(fake *f)
{
    char job[64];
    snprintf(job, sizeof job, "%s", e2e_submit(&T, T.key, spec("used-up", 40, 1)));
    arr *a = wait_assign(f, job);
    event_acked(f, a, FB_EV_STARTED, 0, NULL, 0, NULL);
    fw_set_quota(&T, 0);
    a->on = false;
    event_acked(f, a, FB_EV_FAILED, 0, "loss is NaN at step 0", FB_FAULT_JOB, NULL);
    CHECK_STR_EQ(field(job, "state"), "queued");
    CHECK_INT_EQ(strtoll(field(job, "restarts"), NULL, 10), 1);
    fw_set_quota(&T, 8);
    a = wait_assign(f, job);
    event_acked(f, a, FB_EV_STARTED, 0, NULL, 0, NULL);
    a->on = false;
    event_acked(f, a, FB_EV_FAILED, 0, "a kernel failed: illegal address", FB_FAULT_JOB, NULL);
    printf("2: max_restarts 1 used up -> error \"%s\"\n", field(job, "error"));
    CHECK_STR_EQ(field(job, "state"), "failed");
    CHECK_INT_EQ(strtoll(field(job, "restarts"), NULL, 10), 1);
    CHECK_STR_EQ(field(job, "error"), "a kernel failed: illegal address");
    CHECK_INT_EQ(sql_ll("SELECT count(*) FROM job_events WHERE job_id = '%s' AND kind ="
                        " 'requeued'", job),
                 1);
    check_array_gone(a->group);
}

/* ---- 3: an ASSIGN the worker never starts ---------------------------------------------- */

static void never_started(fake *f)
{
    char job[64];
    snprintf(job, sizeof job, "%s", e2e_submit(&T, T.key, spec("never-started", 44, 0)));
    snprintf(f->ignore, sizeof f->ignore, "%s", job);
    char sql[256];
    snprintf(sql, sizeof sql, "SELECT group_id IS NOT NULL FROM jobs WHERE id = '%%s'");
    long long placed, requeued;
    WAIT_UNTIL_AT(sql_true(sql, job), "the job placed", &placed);
    fw_set_quota(&T, 0);
    char group[64];
    snprintf(group, sizeof group, "%s",
             fbt_sql_value(&T.s, "SELECT group_id FROM jobs WHERE name = 'never-started'"));
    WAIT_UNTIL_AT(sql_ll("SELECT count(*) FROM job_events WHERE job_id = '%s' AND kind ="
                         " 'requeued'",
                         job) == 1,
                  "the array no worker runs re-queued", &requeued);
    last_event e = job_last_event(job);
    printf("3: an ASSIGN never started (placed by %lld ms, its ASSIGN taken at %lld ms) ->"
           " requeued at %lld ms (restarts %s): %s\n",
           placed - E2E_CLOCK_START_MS, ignored_at - E2E_CLOCK_START_MS,
           requeued - E2E_CLOCK_START_MS, field(job, "restarts"), e.message);
    /* assigned at A (the tick the plan was seen by, or the one before): the first heartbeat
     * more than a timeout after A (A + timeout + tick, the fake heartbeats every tick) marks
     * it missing, and the first tick more than a timeout after that re-queues it */
    long long after = requeued - placed, full = 2 * (E2E_HEARTBEAT_TIMEOUT_MS + E2E_TICK_MS);
    if (after != full && after != full - E2E_TICK_MS)
        fprintf(stderr, "requeued %lld ms after the placement was seen, wanted %lld or %lld\n",
                after, full - E2E_TICK_MS, full);
    CHECK(after == full || after == full - E2E_TICK_MS);
    CHECK_INT_EQ(strtoll(field(job, "restarts"), NULL, 10), 0);
    CHECK_STR_EQ(e.fault, "infrastructure");
    CHECK(strstr(e.message, "no longer runs the array") != NULL);
    check_array_gone(group);
    /* it is placed again (on the same fake, now willing) and cancelled there */
    f->ignore[0] = '\0';
    fw_set_quota(&T, 8);
    arr *a = wait_assign(f, job);
    cancel(job);
    WAIT_UNTIL(!a->on, "the cancelled member's DETACH");
}

/* ---- 4: a poison array ------------------------------------------------------------------ */

static void poison(void)
{
    char job[64];
    snprintf(job, sizeof job, "%s", e2e_submit(&T, T.key, spec("poison", 48, 1)));
    for (int k = 0; k < 4; k++) {
        char name[32];
        snprintf(name, sizeof name, "poison-%d", k);
        fake *f = fake_open(name);
        arr *a = wait_assign(f, job);
        event_acked(f, a, FB_EV_STARTED, 0, NULL, 0, NULL);
        long long before = sql_ll("SELECT count(*) FROM job_events WHERE job_id = '%s' AND kind"
                                  " IN ('requeued', 'failed')", job);
        long long died = fake_die(f), at; /* the array takes its worker down, no progress */
        WAIT_UNTIL_AT(sql_ll("SELECT count(*) FROM job_events WHERE job_id = '%s' AND kind IN"
                             " ('requeued', 'failed')",
                             job) > before,
                      "the poison array's jobs re-queued", &at);
        CHECK_INT_EQ(at - died, E2E_HEARTBEAT_TIMEOUT_MS + E2E_TICK_MS);
        last_event e = job_last_event(job);
        printf("4: lost on %s -> restarts %s: %s (%s)\n", name, field(job, "restarts"),
               e.message, e.fault);
        if (k < 2) {
            CHECK_STR_EQ(field(job, "state"), "queued");
            CHECK_INT_EQ(strtoll(field(job, "restarts"), NULL, 10), 0);
            CHECK_STR_EQ(e.fault, "infrastructure");
        } else if (k == 2) {
            CHECK_STR_EQ(field(job, "state"), "queued");
            CHECK_INT_EQ(strtoll(field(job, "restarts"), NULL, 10), 1);
            CHECK_STR_EQ(e.fault, "job");
            CHECK(strstr(e.message, "3 different workers in a row without progress") != NULL);
        } else {
            CHECK_STR_EQ(field(job, "state"), "failed");
            CHECK_INT_EQ(strtoll(field(job, "restarts"), NULL, 10), 1);
            CHECK_STR_EQ(e.kind, "failed");
            CHECK(strstr(field(job, "error"), "4 different workers in a row without progress"));
        }
    }
}

/* ---- 5: infrastructure faults ---------------------------------------------------------- */

static void infrastructure(void)
{
    char job[64];
    /* max_restarts 0: a single counted fault would fail it */
    snprintf(job, sizeof job, "%s", e2e_submit(&T, T.key, spec("infra", 52, 0)));
    for (int k = 0; k < 3; k++) {
        char name[32];
        snprintf(name, sizeof name, "infra-%d", k);
        fake *f = fake_open(name);
        arr *a = wait_assign(f, job);
        event_acked(f, a, FB_EV_STARTED, 0, NULL, 0, NULL);
        int64_t step = 10 * (k + 1);
        progress(f, a, step, 1000);
        char sql[128];
        snprintf(sql, sizeof sql, "SELECT step >= %lld FROM jobs WHERE id = '%%s'",
                 (long long)step);
        WAIT_UNTIL(sql_true(sql, job), "the progress written");
        long long died = fake_die(f), at;
        WAIT_UNTIL_AT(sql_ll("SELECT count(*) FROM job_events WHERE job_id = '%s' AND kind ="
                             " 'requeued'",
                             job) == k + 1,
                      "the lost worker's job re-queued", &at);
        /* lost, and its array re-queued, at the first tick past the heartbeat timeout */
        CHECK_INT_EQ(at - died, E2E_HEARTBEAT_TIMEOUT_MS + E2E_TICK_MS);
        printf("5: lost on %s after progress to step %lld -> restarts %s\n", name,
               (long long)step, field(job, "restarts"));
        CHECK_STR_EQ(field(job, "state"), "queued");
        CHECK_INT_EQ(strtoll(field(job, "restarts"), NULL, 10), 0);
    }
    /* each loss came after progress: the streak holds the last worker only */
    CHECK(sql_true("SELECT lost_workers = '{infra-2}' FROM jobs WHERE id = '%s'", job));
    /* a drain: the worker leaves with the member's state */
    fake *f = fake_open("infra-drain");
    arr *a = wait_assign(f, job);
    event_acked(f, a, FB_EV_STARTED, 0, NULL, 0, NULL);
    fb_wire_msg dr = {.type = FB_WIRE_DRAIN};
    snprintf(dr.text, sizeof dr.text, "draining");
    fw_send(f->sock, &dr, NULL, 0);
    a->on = false;
    event_acked(f, a, FB_EV_DETACHED, 70, "drained", 0, "state at step 70");
    printf("5: drained -> restarts %s, resumes from %lld\n", field(job, "restarts"),
           sql_ll("SELECT resume_step FROM jobs WHERE id = '%s'", job));
    CHECK_STR_EQ(field(job, "state"), "queued");
    CHECK_INT_EQ(strtoll(field(job, "restarts"), NULL, 10), 0);
    fake *g = fake_open("infra-last");
    a = wait_assign(g, job);
    CHECK_INT_EQ(a->start_step, 70);
    event_acked(g, a, FB_EV_STARTED, 70, NULL, 0, NULL);
    a->on = false;
    event_acked(g, a, FB_EV_FINISHED, 1000, NULL, 0, NULL);
    printf("5: finished -> restarts %s\n", field(job, "restarts"));
    CHECK_STR_EQ(field(job, "state"), "completed");
    CHECK_INT_EQ(strtoll(field(job, "restarts"), NULL, 10), 0);
    fake_die(f);
    fake_die(g);
}

/* ---- 6: the stale-state check ----------------------------------------------------------- */

static void stale(void)
{
    fw_set_quota(&T, 0); /* nothing is placed from here on */
    char lone[64], inner[64];
    snprintf(lone, sizeof lone, "%s", e2e_submit(&T, T.key, spec("stale-lone", 56, 3)));
    snprintf(inner, sizeof inner, "%s", e2e_submit(&T, T.key, spec("stale-inner", 60, 3)));
    /* an array of an earlier case, finished, comes back to life in the database alone,
     * holding a device of a registered worker */
    fake *f = fake_open("stale-host");
    char ghost[64];
    snprintf(ghost, sizeof ghost, "%s",
             fbt_sql_value(&T.s, "SELECT g.id FROM groups g JOIN jobs j ON j.group_id = g.id"
                                 " WHERE j.name = 'used-up' ORDER BY g.created_at DESC LIMIT 1"));
    CHECK(ghost[0]);
    /* the rows as a lost write or a hand would leave them, an hour old */
    sql_exec("UPDATE jobs SET state = 'scheduled', updated_at = now() - interval '1 hour'"
             " WHERE id = '%s'%s", lone, "");
    sql_exec("UPDATE jobs SET state = 'running', in_group = true, group_id = '%s',"
             " updated_at = now() - interval '1 hour' WHERE id = '%s'", ghost, inner);
    sql_exec("UPDATE groups SET state = 'running', n_members = 1,"
             " updated_at = now() - interval '1 hour' WHERE id = '%s'%s", ghost, "");
    sql_exec("UPDATE devices SET group_id = '%s', tenant_id = '%s' WHERE worker_id ="
             " (SELECT id FROM workers WHERE name = 'stale-host')", ghost, T.tenant);
    long long t0 = e2e_clock_ms(&T), found;
    WAIT_UNTIL_AT(job_state_is(lone, "queued") && job_state_is(inner, "queued") &&
                      sql_true("SELECT state = 'finished' FROM groups WHERE id = '%s'", ghost) &&
                      sql_ll("SELECT count(*) FROM devices WHERE group_id = '%s'", ghost) == 0,
                  "the stale check", &found);
    last_event el = job_last_event(lone), ei = job_last_event(inner);
    printf("6: found %lld ms later: %s; %s; the ghost array finished, its device free\n",
           found - t0, el.message, ei.message);
    /* the check runs every STALE_EVERY_TICKS (10) ticks */
    CHECK(found - t0 <= 10 * E2E_TICK_MS);
    CHECK_STR_EQ(el.kind, "requeued");
    CHECK_STR_EQ(ei.kind, "requeued");
    CHECK(strstr(el.message, "found scheduled without a live array") != NULL);
    CHECK(strstr(ei.message, "found running without a live array") != NULL);
    CHECK_INT_EQ(strtoll(field(inner, "restarts"), NULL, 10), 0);
    fbt_resp r = fbt_call(&T.s, "GET", "/v1/cluster", T.key, NULL);
    fbt_expect(&r, 200, NULL, "the cluster view");
    CHECK(strstr(r.body, ghost) == NULL);
    fbt_resp_free(&r);
    fake_die(f);
}

int main(void)
{
    setvbuf(stdout, NULL, _IONBF, 0);
    e2e_start_clocked(&T, NULL);
    ctx = zmq_ctx_new();
    CHECK(ctx != NULL);

    fake *a = fake_open("fake-a");
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++)
        run_case(a, &cases[i], 8 + 4 * (int)i);
    max_restarts_used_up(a);
    never_started(a);
    /* a leaves (lost), so that each of the next jobs goes where the test says */
    long long died = fake_die(a), lost;
    WAIT_UNTIL_AT(sql_true("SELECT state = 'lost' FROM workers WHERE name = '%s'", "fake-a"),
                  "fake-a lost", &lost);
    CHECK_INT_EQ(lost - died, E2E_HEARTBEAT_TIMEOUT_MS + E2E_TICK_MS);
    poison();
    infrastructure();
    stale();

    printf("result: lifecycle cases=%d poison_failed_after=4 infra_restarts=0\n",
           (int)(sizeof cases / sizeof cases[0]));
    CHECK(zmq_ctx_term(ctx) == 0);
    e2e_finish(&T);
    printf("ok\n");
    return 0;
}
