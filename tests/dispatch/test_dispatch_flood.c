/*
 * One worker that floods the control loop does not hold back the loss
 * decisions about the others (docs/wire.md, "Re-queueing").  Three fake
 * workers speak the wire protocol over ZeroMQ (CURVE, the test's worker
 * key):
 *
 * - "fake-silent" holds the job's array, then stops sending (a hung
 *   worker);
 * - "fake-flood", registered, sends valid heartbeats without pause from a
 *   thread of its own, always keeping thousands more in flight than
 *   fuseboxd has answered, so that the worker socket never runs empty;
 * - "fake-healthy" keeps its normal heartbeat.
 *
 * fuseboxd's control loop runs on a manual clock (e2e_start_clocked), which
 * the test moves tick by tick; the healthy and silent workers heartbeat every
 * E2E_HEARTBEAT_MS of that clock, each heartbeat answered before the clock
 * moves on, and before each move the test waits until fuseboxd has read a
 * flood heartbeat at the current time (fusebox_worker_last_seen_clock_ms).
 * So the decisions are exact, however long the test's own checks or the
 * flood's threads take in real time: with every worker alive for two heartbeat timeouts,
 * nobody is lost; once the silent worker stops, it is not lost at any tick up
 * to its heartbeat timeout after its last heartbeat, and it is lost and its
 * array requeued at the first tick past it; the healthy worker and the
 * flooder are never lost.
 */
#include <pthread.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <zmq.h>

#include "check.h"
#include "e2e.h"
#include "fakewire.h"
#include "wire.h"

/* heartbeats the flooder keeps sent but not yet answered, at most and at start */
#define FLOOD_AHEAD 20000
#define FLOOD_READY 5000
/* job ids in each flood heartbeat's (stale) running array: a few kilobytes to decode */
#define FLOOD_JOBS 64

static e2e T;
static void *ctx;
static char job[64];

typedef struct fake {
    char name[32];
    void *sock;
    long long heartbeats, replies;  /* heartbeats sent, and the replies read */
    char group[FB_WIRE_ID_LEN + 1]; /* the array its heartbeats list ("" = none) */
    int64_t generation;
} fake;

static void fake_open(fake *f, const char *name)
{
    memset(f, 0, sizeof *f);
    snprintf(f->name, sizeof f->name, "%s", name);
    /* the flooder's replies pile up between its reads; none may be dropped */
    f->sock = fw_connect(ctx, &T, name, 2 * FLOOD_AHEAD);
}

/* Encodes m (malloc'd text). */
static char *encode(const fb_wire_msg *m)
{
    char err[256];
    char *json = fb_wire_encode(m, err, sizeof err);
    if (!json) fprintf(stderr, "cannot encode: %s\n", err);
    CHECK(json != NULL);
    return json;
}

static void fake_send(fake *f, const fb_wire_msg *m)
{
    fw_send(f->sock, m, NULL, 0);
}

/* HELLO and HEARTBEAT list the array f->group, if any, as running at step 0. */
static void fill_running(const fake *f, fb_wire_msg *m)
{
    if (f->group[0]) fw_add_running(m, f->group, f->generation, job, 0);
}

static void fake_hello(fake *f)
{
    fb_wire_msg m;
    fw_hello(&m, f->name, 1);
    fill_running(f, &m);
    fake_send(f, &m);
    fb_wire_msg_free(&m);
}

static void fake_heartbeat(fake *f)
{
    fb_wire_msg hb = {.type = FB_WIRE_HEARTBEAT};
    fill_running(f, &hb);
    fake_send(f, &hb);
    fb_wire_msg_free(&hb);
    f->heartbeats++;
}

/* Receives one message within ms into out; false when none came. */
static bool fake_recv(fake *f, int ms, fb_wire_msg *out)
{
    if (!fw_recv(f->sock, f->name, ms, out, NULL, NULL)) return false;
    f->replies += out->type == FB_WIRE_HEARTBEAT && out->reply;
    return true;
}

/* Waits for a message of type `type` and returns it in out; heartbeats meanwhile. */
static void fake_expect(fake *f, fb_wire_type type, fb_wire_msg *out)
{
    double t0 = fbt_now_ms(), last_hb = 0;
    for (;;) {
        double now = fbt_now_ms();
        if (now - t0 > 20000) {
            fprintf(stderr, "fake worker %s: no %s within 20 s\n", f->name,
                    fb_wire_type_name(type));
            e2e_dump(&T);
            CHECK(0);
        }
        if (now - last_hb >= E2E_HEARTBEAT_MS) {
            last_hb = now;
            fake_heartbeat(f);
        }
        if (!fake_recv(f, 20, out)) continue;
        if (out->type == type) return;
        fb_wire_msg_free(out);
    }
}

/* Whether m answers a heartbeat with "unknown" (the server took the worker for lost). */
static bool unknown_reply(const fb_wire_msg *m)
{
    return m->type == FB_WIRE_HEARTBEAT && m->reply && !m->known;
}

/* ---- the flooder ---------------------------------------------------------- */

typedef struct flood {
    fake f;
    char *json; /* the heartbeat it sends, encoded once */
    atomic_bool stop, ready;
    atomic_llong sent, answered, unknown;
    /* the fewest heartbeats sent but not answered since it was ready */
    atomic_llong min_ahead;
} flood;

/*
 * Sends the same valid heartbeat as fast as the socket takes it, while no
 * more than FLOOD_AHEAD wait for their answers (which bounds what fuseboxd
 * holds of it), and reads the answers.  Ready once FLOOD_READY are ahead:
 * fuseboxd then reads slower than it sends.
 */
static void *flood_run(void *arg)
{
    flood *fl = arg;
    size_t len = strlen(fl->json);
    long long sent = 0, answered = 0, unknown = 0, min_ahead = -1;
    bool ready = false;
    while (!atomic_load(&fl->stop)) {
        bool busy = false;
        zmq_msg_t fr;
        zmq_msg_init(&fr);
        while (zmq_msg_recv(&fr, fl->f.sock, ZMQ_DONTWAIT) >= 0) {
            busy = true;
            fb_wire_msg m;
            char err[256];
            if (!zmq_msg_more(&fr) &&
                fb_wire_decode(zmq_msg_data(&fr), zmq_msg_size(&fr), 0, &m, err, sizeof err) == 0) {
                if (m.type == FB_WIRE_HEARTBEAT && m.reply) answered++;
                unknown += unknown_reply(&m);
                fb_wire_msg_free(&m);
            }
        }
        zmq_msg_close(&fr);
        long long ahead = sent - answered;
        if (!ready && ahead >= FLOOD_READY) ready = true;
        if (ready && (min_ahead < 0 || ahead < min_ahead)) min_ahead = ahead;
        for (int k = 0; k < 256 && sent - answered < FLOOD_AHEAD; k++) {
            if (zmq_send(fl->f.sock, fl->json, len, ZMQ_DONTWAIT) < 0) break;
            sent++;
            busy = true;
        }
        atomic_store(&fl->sent, sent);
        atomic_store(&fl->answered, answered);
        atomic_store(&fl->unknown, unknown);
        atomic_store(&fl->min_ahead, min_ahead);
        atomic_store(&fl->ready, ready);
        if (!busy) {
            zmq_pollitem_t it = {fl->f.sock, 0, ZMQ_POLLIN, 0};
            zmq_poll(&it, 1, 1);
        }
    }
    return NULL;
}

/* The flood's heartbeat: it lists an array fuseboxd does not know, of FLOOD_JOBS jobs, so
 * that each one takes fuseboxd a while to decode (and is still a valid message). */
static char *flood_heartbeat(void)
{
    fb_wire_msg hb = {.type = FB_WIRE_HEARTBEAT, .n_running = 1};
    hb.running = calloc(1, sizeof *hb.running);
    CHECK(hb.running != NULL);
    fb_wire_running *r = &hb.running[0];
    snprintf(r->group_id, sizeof r->group_id, "00000000-0000-4000-8000-00000000f100");
    r->generation = 1;
    r->n_jobs = FLOOD_JOBS;
    r->job_ids = calloc(FLOOD_JOBS, sizeof *r->job_ids);
    r->steps = calloc(FLOOD_JOBS, sizeof *r->steps);
    CHECK(r->job_ids && r->steps);
    for (int i = 0; i < FLOOD_JOBS; i++) {
        snprintf(r->job_ids[i], sizeof r->job_ids[i], "00000000-0000-4000-8000-%012d", i);
        r->steps[i] = 1000 + i;
    }
    char *json = encode(&hb);
    fb_wire_msg_free(&hb);
    return json;
}

/* ---- the database and the log --------------------------------------------- */

static long long sql_ll(const char *fmt, const char *arg)
{
    return fw_sql_ll(&T, fmt, arg);
}

static long long requeues(void)
{
    return sql_ll("SELECT count(*) FROM job_events WHERE job_id = '%s' AND kind = 'requeued'", job);
}

static long long worker_lost_in_db(const char *name)
{
    return sql_ll("SELECT count(*) FROM workers WHERE name = '%s' AND state = 'lost'", name);
}

/* Lines of the server's log that say worker `name` was lost. */
static int lost_in_log(const char *name)
{
    FILE *f = fopen(T.s.log_path, "r");
    if (!f) return 0;
    char quoted[64];
    snprintf(quoted, sizeof quoted, "\"%s\"", name);
    int n = 0;
    char line[8192];
    while (fgets(line, sizeof line, f))
        n += strstr(line, "worker lost: no heartbeat") && strstr(line, quoted);
    fclose(f);
    return n;
}

/* ---- the scenario --------------------------------------------------------- */

static fake silent, healthy;
static int healthy_unknown;

/*
 * Heartbeats from f and reads what it gets until every heartbeat it sent is
 * answered (counting "unknown" answers to the healthy one): fuseboxd has then
 * read this one, at the clock's current time, which stands still meanwhile.
 * Fails after 20 s of real time (a liveness bound; no decision depends on it).
 */
static void heartbeat_now(fake *f)
{
    fake_heartbeat(f);
    double t0 = fbt_now_ms();
    while (f->replies < f->heartbeats) {
        if (fbt_now_ms() - t0 > 20000) {
            fprintf(stderr, "fake worker %s: %lld of %lld heartbeats answered within 20 s\n",
                    f->name, f->replies, f->heartbeats);
            e2e_dump(&T);
            CHECK(0);
        }
        fb_wire_msg m;
        if (!fake_recv(f, 50, &m)) continue;
        if (f == &healthy) healthy_unknown += unknown_reply(&m);
        fb_wire_msg_free(&m);
    }
}

/*
 * Waits until fuseboxd has read a heartbeat of the flooder at the clock's
 * current time: the flood is on when the clock moves.  Whether the flood's
 * messages reach fuseboxd's socket between two ticks depends on the threads
 * of both processes (under TSan on a loaded machine one run saw none read for
 * 16 ticks); fuseboxd would then rightly take the flooder for lost, and the
 * test would judge the machine, not the loop.  Meanwhile thousands of its
 * heartbeats stay unanswered (min_ahead): the socket never runs empty.
 * Fails after 20 s of real time (a liveness bound).
 */
static void flood_read_now(void)
{
    long long now = e2e_clock_ms(&T);
    double t0 = fbt_now_ms();
    while (e2e_worker_seen_ms(&T, "fake-flood") < now) {
        if (fbt_now_ms() - t0 > 20000) {
            fprintf(stderr,
                    "fuseboxd read no heartbeat of the flooder at clock %lld ms"
                    " within 20 s\n",
                    now);
            e2e_dump(&T);
            CHECK(0);
        }
        fw_sleep_ms(5);
    }
}

/*
 * One tick of the clock: the healthy worker (and the silent one while
 * silent_alive) heartbeats when a heartbeat period has passed since its last
 * (*last_hb, clock ms), fuseboxd reads the flooder at this time, then the
 * clock moves one tick and the tick is waited for.  Returns the clock time of
 * that tick.
 */
static long long tick_once(bool silent_alive, long long *last_hb, long long *last_silent_hb)
{
    long long now = e2e_clock_ms(&T);
    if (now - *last_hb >= E2E_HEARTBEAT_MS) {
        *last_hb = now;
        heartbeat_now(&healthy);
        if (silent_alive) {
            heartbeat_now(&silent);
            *last_silent_hb = now;
        }
    }
    flood_read_now();
    e2e_clock_advance(&T, E2E_TICK_MS);
    return e2e_clock_ms(&T);
}

/* Nobody is lost and nothing requeued yet, at the clock's time (what). */
static void expect_nobody_lost(const char *what)
{
    long long rq = requeues();
    int l_silent = lost_in_log("fake-silent"), l_healthy = lost_in_log("fake-healthy");
    int l_flood = lost_in_log("fake-flood");
    if (rq || l_silent || l_healthy || l_flood)
        fprintf(stderr, "%s, clock %lld ms: requeues %lld, lost: silent %d healthy %d flood %d\n",
                what, e2e_clock_ms(&T), rq, l_silent, l_healthy, l_flood);
    CHECK_INT_EQ(rq, 0);
    CHECK_INT_EQ(l_silent, 0);
    CHECK_INT_EQ(l_healthy, 0);
    CHECK_INT_EQ(l_flood, 0);
}

int main(void)
{
    setvbuf(stdout, NULL, _IONBF, 0);
    e2e_start_clocked(&T, NULL);
    ctx = zmq_ctx_new();
    CHECK(ctx != NULL);
    fb_wire_msg m;

    /* the silent-to-be worker registers and gets the job's array, planned at the next tick */
    fake_open(&silent, "fake-silent");
    fake_hello(&silent);
    fake_expect(&silent, FB_WIRE_WELCOME, &m);
    fb_wire_msg_free(&m);
    snprintf(job, sizeof job, "%s", e2e_submit(&T, T.key, e2e_spec("flood", 0.001, 100000, 300)));
    e2e_clock_advance(&T, E2E_TICK_MS);
    fake_expect(&silent, FB_WIRE_ASSIGN, &m);
    CHECK_INT_EQ(m.n_members, 1);
    CHECK_STR_EQ(m.members[0].job_id, job);
    snprintf(silent.group, sizeof silent.group, "%s", m.group_id);
    silent.generation = m.generation;
    fb_wire_msg_free(&m);
    /* the job is placed nowhere else: the requeue alone is what the test looks for */
    fw_set_quota(&T, 0);

    /* the healthy worker and the flooder register */
    fake_open(&healthy, "fake-healthy");
    fake_hello(&healthy);
    fake_expect(&healthy, FB_WIRE_WELCOME, &m);
    fb_wire_msg_free(&m);
    static flood fl;
    fake_open(&fl.f, "fake-flood");
    fake_hello(&fl.f);
    fake_expect(&fl.f, FB_WIRE_WELCOME, &m);
    fb_wire_msg_free(&m);
    fl.json = flood_heartbeat();
    atomic_init(&fl.stop, false);
    atomic_init(&fl.ready, false);
    atomic_init(&fl.sent, 0);
    atomic_init(&fl.answered, 0);
    atomic_init(&fl.unknown, 0);
    atomic_init(&fl.min_ahead, -1);

    /* the flood starts; the clock stands still until fuseboxd has fallen behind */
    pthread_t th;
    CHECK(pthread_create(&th, NULL, flood_run, &fl) == 0);
    double t0 = fbt_now_ms();
    while (!atomic_load(&fl.ready)) {
        if (fbt_now_ms() - t0 > 20000) {
            fprintf(stderr, "the flood never got %d heartbeats ahead of fuseboxd\n", FLOOD_READY);
            CHECK(0);
        }
        fw_sleep_ms(10);
    }
    /* two heartbeat timeouts with the flood on and every worker alive: nobody is lost */
    long long last_hb = -E2E_HEARTBEAT_MS, last_silent_hb = -1;
    for (int k = 0; k < 2 * E2E_HEARTBEAT_TIMEOUT_MS / E2E_TICK_MS; k++) {
        tick_once(true, &last_hb, &last_silent_hb);
        expect_nobody_lost("all alive");
    }
    printf("flooding: %lld heartbeats sent, %lld answered\n", (long long)atomic_load(&fl.sent),
           (long long)atomic_load(&fl.answered));

    /* the silent worker stops; the flood and the healthy worker go on.  Not lost at any
     * tick up to its heartbeat timeout after its last heartbeat (silent <= timeout) ... */
    long long at;
    do {
        at = tick_once(false, &last_hb, &last_silent_hb);
        expect_nobody_lost("silent within its timeout");
    } while (at - last_silent_hb < E2E_HEARTBEAT_TIMEOUT_MS);
    CHECK_INT_EQ(at - last_silent_hb, E2E_HEARTBEAT_TIMEOUT_MS);
    /* ... and lost, its array requeued, at the first tick past it */
    long long lost_at = tick_once(false, &last_hb, &last_silent_hb);
    long long after = lost_at - last_silent_hb;
    printf("the silent worker's array was requeued at the tick %lld ms after its last"
           " heartbeat (timeout %d ms, tick %d ms)\n",
           after, E2E_HEARTBEAT_TIMEOUT_MS, E2E_TICK_MS);
    CHECK_INT_EQ(after, E2E_HEARTBEAT_TIMEOUT_MS + E2E_TICK_MS);
    CHECK_INT_EQ(requeues(), 1);
    CHECK_INT_EQ(lost_in_log("fake-silent"), 1);
    CHECK_INT_EQ(worker_lost_in_db("fake-silent"), 1);
    /* a lost worker leaves the gauge of its last read; the others are on it */
    CHECK_INT_EQ(e2e_worker_seen_ms(&T, "fake-silent"), -1);
    CHECK(e2e_worker_seen_ms(&T, "fake-healthy") >= last_hb);

    /* and two more timeouts of flood: the others are still not lost */
    for (int k = 0; k < 2 * E2E_HEARTBEAT_TIMEOUT_MS / E2E_TICK_MS; k++)
        tick_once(false, &last_hb, &last_silent_hb);
    long long sent = atomic_load(&fl.sent), answered = atomic_load(&fl.answered);
    long long min_ahead = atomic_load(&fl.min_ahead);
    atomic_store(&fl.stop, true);
    CHECK(pthread_join(th, NULL) == 0);
    printf("flood: %lld heartbeats sent, %lld answered, at least %lld unanswered throughout\n",
           sent, answered, min_ahead);

    /* the flood was one: fuseboxd never caught up with it */
    CHECK(min_ahead > 0);
    CHECK_INT_EQ(requeues(), 1);
    CHECK_INT_EQ(lost_in_log("fake-silent"), 1);
    CHECK_INT_EQ(lost_in_log("fake-healthy"), 0);
    CHECK_INT_EQ(lost_in_log("fake-flood"), 0);
    CHECK_INT_EQ(worker_lost_in_db("fake-healthy"), 0);
    CHECK_INT_EQ(worker_lost_in_db("fake-flood"), 0);
    CHECK_INT_EQ(healthy_unknown, 0);
    CHECK_INT_EQ(atomic_load(&fl.unknown), 0);

    printf("result: flood requeue_after_ms=%lld timeout_ms=%d flood_sent=%lld"
           " flood_min_unanswered=%lld\n",
           after, E2E_HEARTBEAT_TIMEOUT_MS, sent, min_ahead);
    free(fl.json);
    zmq_close(fl.f.sock);
    zmq_close(silent.sock);
    zmq_close(healthy.sock);
    CHECK(zmq_ctx_term(ctx) == 0);
    e2e_finish(&T);
    printf("ok\n");
    return 0;
}
