/*
 * Arrays that span workers, as fuseboxd sees them: this process plays the
 * server (one CURVE ROUTER on loopback) for two real fusebox-worker
 * processes with one CPU device each, and assigns them one group of three
 * members as ranks 0 (the leader) and 1 (the follower) of a world of 2, the
 * batch of 128 split 70/58, joined on a loopback port the test picks.  One
 * scenario per run, named by the first argument:
 *   train    the leader's PROGRESS losses equal a one-device fb_train_run's
 *            (1e-5 relative, first 30 steps), its FINISHED models equal a
 *            two-device data-parallel run's in this process bit for bit; the
 *            follower reports its device only and sends no event
 *   change   REBALANCE (40/88) and DETACH with keep_state go to the leader;
 *            both workers switch the split at the same step (their devices'
 *            samples per step tell), the follower drops the member there too,
 *            and the detached state and the finished models equal an
 *            in-process run that made the same changes at those steps
 *   drain    SIGTERM of the leader: it drains the group on both workers and alone sends
 *            the members' states, the two-device run's at that step bit for bit; the
 *            follower stops its part silently
 *   kill     the follower is SIGKILLed mid-run: the leader stops the group
 *            within its comm timeout, sends no FAILED event and no longer
 *            lists the group
 *   refuse   a follower with a wrong token, then one whose world disagrees:
 *            refused at the rendezvous, no member event, the group stops on
 *            both workers
 *   flags    --comm-addr and --comm-timeout-ms: bad values exit 2 naming
 *            the flag or variable; HELLO carries the comm address
 */
#include "worker_util.h"

#include "agent.h"
#include "device.h"
#include "kernels.h"
#include "ports.h"
#include "session.h"
#include "train.h"

#define F_IN 16
#define CLASSES 4
#define N_JOBS 3
#define BATCH 128
#define TENANT 0x7e
#define LEAD "w-lead"
#define FOLLOW "w-follow"
#define MAX_STEPS 1000
#define MAX_IVALS 4096

/* The members of a group: ids, parsed specs and their canonical JSON. */
typedef struct jobs {
    char ids[N_JOBS][FB_WIRE_ID_LEN + 1];
    fb_job_spec spec[N_JOBS];
    char *json[N_JOBS];
} jobs;

/* ---- what the workers reported ------------------------------------------------------------ */

typedef struct ival {
    int64_t steps, samples; /* one PROGRESS's device entry */
} ival;

typedef struct span_log {
    char gid[FB_WIRE_ID_LEN + 1];
    int64_t generation;
    char ids[N_JOBS][FB_WIRE_ID_LEN + 1];
    /* the leader's events */
    int started[N_JOBS];
    bool finished[N_JOBS], detached[N_JOBS], failed[N_JOBS];
    int64_t finished_step[N_JOBS], detached_step[N_JOBS];
    int n_ckpt[N_JOBS], n_eval[N_JOBS];
    void *model[N_JOBS], *state[N_JOBS];
    size_t model_len[N_JOBS], state_len[N_JOBS];
    char failed_text[N_JOBS][FB_WIRE_TEXT_MAX + 1];
    int lead_events, follow_events;
    /* PROGRESS */
    int lead_progress, follow_progress;
    int64_t last_step[N_JOBS];               /* the leader's latest reported step per member */
    double step_loss[N_JOBS][MAX_STEPS + 1]; /* the leader's reported loss at a step, or NaN */
    ival lead_iv[MAX_IVALS], follow_iv[MAX_IVALS];
    int n_lead_iv, n_follow_iv;
    /* heartbeats: whether the latest of each worker listed the group, and when it came */
    bool lead_lists, follow_lists;
    double lead_hb_ms, follow_hb_ms;
    bool lead_drain; /* the leader said DRAIN */
    char detached_text[N_JOBS][FB_WIRE_TEXT_MAX + 1];
} span_log;

static void log_init(span_log *L, const char *gid, int64_t generation, const jobs *J)
{
    memset(L, 0, sizeof *L);
    snprintf(L->gid, sizeof L->gid, "%s", gid);
    L->generation = generation;
    for (int i = 0; i < N_JOBS; i++) {
        snprintf(L->ids[i], sizeof L->ids[i], "%s", J->ids[i]);
        for (int k = 0; k <= MAX_STEPS; k++)
            L->step_loss[i][k] = NAN;
    }
}

static void log_free(span_log *L)
{
    for (int i = 0; i < N_JOBS; i++) {
        free(L->model[i]);
        free(L->state[i]);
    }
}

static int job_index(const span_log *L, const char *id)
{
    for (int i = 0; i < N_JOBS; i++)
        if (strcmp(L->ids[i], id) == 0) return i;
    fprintf(stderr, "a message names job %s, not a member\n", id);
    abort();
}

/* Whether a worker's running list names the group. */
static bool lists(const fb_wire_msg *m, const char *gid)
{
    for (int i = 0; i < m->n_running; i++)
        if (strcmp(m->running[i].group_id, gid) == 0) return true;
    return false;
}

static void record_progress(span_log *L, const wu_msg *w)
{
    const fb_wire_msg *m = &w->m;
    CHECK_STR_EQ(m->group_id, L->gid);
    CHECK_INT_EQ(m->generation, L->generation);
    /* each worker reports its own one device, index 0 of that worker */
    CHECK_INT_EQ(m->n_device_steps, 1);
    CHECK_INT_EQ(m->device_steps[0].device, 0);
    bool lead = strcmp(w->from, LEAD) == 0;
    ival *iv = lead ? L->lead_iv : L->follow_iv;
    int *n_iv = lead ? &L->n_lead_iv : &L->n_follow_iv;
    CHECK(*n_iv < MAX_IVALS);
    iv[(*n_iv)++] = (ival){m->device_steps[0].steps, m->device_steps[0].samples};
    if (!lead) {
        /* the members are the leader's to report */
        CHECK_INT_EQ(m->n_progress, 0);
        L->follow_progress++;
        return;
    }
    CHECK(m->n_progress >= 1);
    for (int i = 0; i < m->n_progress; i++) {
        const fb_wire_member_progress *p = &m->progress[i];
        int j = job_index(L, p->job_id);
        CHECK(p->step >= 1 && p->step <= p->steps && p->step <= MAX_STEPS);
        CHECK(isfinite(p->loss));
        L->last_step[j] = p->step;
        L->step_loss[j][p->step] = p->loss;
    }
    L->lead_progress++;
}

static void record_event(span_log *L, wu_msg *w)
{
    fb_wire_msg *m = &w->m;
    if (strcmp(w->from, LEAD) != 0) {
        fprintf(stderr, "the follower sent a %s event of %s\n", fb_wire_event_name(m->event),
                m->job_id);
        L->follow_events++;
        return;
    }
    CHECK_STR_EQ(m->group_id, L->gid);
    CHECK_INT_EQ(m->generation, L->generation);
    L->lead_events++;
    int j = job_index(L, m->job_id);
    CHECK(!L->finished[j] && !L->detached[j] && !L->failed[j]);
    switch (m->event) {
    case FB_EV_STARTED:
        L->started[j]++;
        CHECK_INT_EQ(m->step, 1);
        break;
    case FB_EV_EVALUATED:
        L->n_eval[j]++;
        break;
    case FB_EV_CHECKPOINTED:
        L->n_ckpt[j]++;
        break;
    case FB_EV_FINISHED:
        L->finished[j] = true;
        L->finished_step[j] = m->step;
        wu_take_blob(w, &L->model[j], &L->model_len[j]);
        break;
    case FB_EV_DETACHED:
        L->detached[j] = true;
        L->detached_step[j] = m->step;
        snprintf(L->detached_text[j], sizeof L->detached_text[j], "%s", m->text);
        if (m->blob) wu_take_blob(w, &L->state[j], &L->state_len[j]);
        break;
    case FB_EV_FAILED:
        L->failed[j] = true;
        snprintf(L->failed_text[j], sizeof L->failed_text[j], "%s", m->text);
        fprintf(stderr, "member %s failed: %s\n", m->job_id, m->text);
        break;
    default:
        abort();
    }
}

/*
 * Receives one message from either worker within timeout_ms and handles it as a server
 * does: HELLO gets WELCOME, a heartbeat gets known = true (and is recorded), an event is
 * acknowledged and recorded, PROGRESS is recorded.  False on timeout.
 */
static bool serve(wu_server *s, span_log *L, int timeout_ms)
{
    wu_msg w;
    if (!wu_recv(s, timeout_ms, &w)) return false;
    bool lead = strcmp(w.from, LEAD) == 0;
    CHECK(lead || strcmp(w.from, FOLLOW) == 0);
    wu_answer(s, &w, true);
    switch (w.m.type) {
    case FB_WIRE_HELLO:
        break;
    case FB_WIRE_HEARTBEAT:
        CHECK(!w.m.reply);
        if (L) {
            *(lead ? &L->lead_lists : &L->follow_lists) = lists(&w.m, L->gid);
            *(lead ? &L->lead_hb_ms : &L->follow_hb_ms) = wu_now_ms();
        }
        break;
    case FB_WIRE_EVENT:
        if (L) record_event(L, &w);
        break;
    case FB_WIRE_PROGRESS:
        if (L) record_progress(L, &w);
        break;
    case FB_WIRE_DRAIN:
        CHECK(lead);
        if (L) L->lead_drain = true;
        break;
    default:
        fprintf(stderr, "unexpected %s message from %s\n", fb_wire_type_name(w.m.type), w.from);
        abort();
    }
    wu_msg_free(&w);
    return true;
}

/* Serves until done(L) or timeout_ms. */
static void pump(wu_server *s, span_log *L, int timeout_ms, bool (*done)(const span_log *),
                 const char *what)
{
    double end = wu_now_ms() + timeout_ms;
    while (!done(L)) {
        int left = (int)(end - wu_now_ms());
        if (left <= 0 || !serve(s, L, left)) {
            fprintf(stderr, "timed out after %d ms waiting for %s\n", timeout_ms, what);
            abort();
        }
    }
}

static bool all_left(const span_log *L)
{
    for (int i = 0; i < N_JOBS; i++)
        if (!L->finished[i] && !L->detached[i] && !L->failed[i]) return false;
    return true;
}

/* Both workers' latest heartbeats came after `since` and no longer list the group. */
static double g_since;
static bool both_dropped(const span_log *L)
{
    return L->lead_hb_ms > g_since && L->follow_hb_ms > g_since && !L->lead_lists &&
           !L->follow_lists;
}

static bool leader_lists(const span_log *L)
{
    return L->lead_lists;
}

/* ---- set-up ------------------------------------------------------------------------------ */

/* Three MLPs on dataset synth with a batch of 128: steps, lr and seed differ. */
static void make_jobs(jobs *J, const int64_t *steps, int eval_every, int ckpt_every)
{
    static const double lr[N_JOBS] = {0.01, 0.003, 0.02};
    for (int i = 0; i < N_JOBS; i++) {
        wu_uuid(J->ids[i], 0x5a, (unsigned long long)(i + 1));
        wu_spec(&J->spec[i], &J->json[i],
                "{\"name\": \"s%d\", \"dataset\": \"synth\", \"model\": {\"input\": [%d], "
                "\"layers\": [{\"type\": \"linear\", \"out\": 32}, {\"type\": \"relu\"}, "
                "{\"type\": \"linear\", \"out\": %d}]}, \"batch_size\": %d, \"steps\": %lld, "
                "\"optimizer\": {\"type\": \"adamw\", \"lr\": %g, \"weight_decay\": 0.01}, "
                "\"schedule\": {\"type\": \"cosine\", \"warmup_steps\": 5}, "
                "\"seed\": %d, \"data_seed\": 5, \"eval_every\": %d, \"checkpoint_every\": %d}",
                i, F_IN, CLASSES, BATCH, (long long)steps[i], lr[i], i + 1, eval_every, ckpt_every);
    }
}

static void jobs_free(jobs *J)
{
    for (int i = 0; i < N_JOBS; i++) {
        fb_job_spec_free(&J->spec[i]);
        free(J->json[i]);
    }
}

typedef struct pair {
    pid_t lead, follow;
    int port;
    char comm_addr[64];
} pair;

/* Starts both workers (one CPU device each, the given comm timeout) and registers them,
 * checking that their HELLOs carry the comm address. */
static void start_pair(wu_server *s, pair *p, const char *timeout_ms)
{
    p->port = fbt_free_port();
    snprintf(p->comm_addr, sizeof p->comm_addr, "127.0.0.1:%d", p->port);
    const char *extra[] = {"--cpu-devices",     "1",        "--comm-addr", p->comm_addr,
                           "--comm-timeout-ms", timeout_ms, NULL};
    p->lead = wu_start_worker(s, LEAD, extra);
    p->follow = wu_start_worker(s, FOLLOW, extra);
    bool hello[2] = {false, false};
    double end = wu_now_ms() + 20000;
    while (!hello[0] || !hello[1]) {
        wu_msg w;
        int left = (int)(end - wu_now_ms());
        CHECK(left > 0 && wu_recv(s, left, &w));
        if (w.m.type == FB_WIRE_HELLO) {
            int k = strcmp(w.from, LEAD) == 0 ? 0 : 1;
            CHECK_STR_EQ(w.m.backend, "cpu");
            CHECK_INT_EQ(w.m.n_devices, 1);
            CHECK_STR_EQ(w.m.comm_host, "127.0.0.1");
            CHECK_INT_EQ(w.m.comm_port_lo, p->port);
            CHECK_INT_EQ(w.m.comm_port_hi, p->port);
            hello[k] = true;
        }
        wu_answer(s, &w, false);
        wu_msg_free(&w);
    }
}

/* Stops the workers that still run (pid 0: gone already) with SIGTERM, so that they
 * drain, and waits for their exits. */
static void stop_pair(wu_server *s, pair *p)
{
    if (p->follow > 0) CHECK(kill(p->follow, SIGTERM) == 0);
    if (p->lead > 0) CHECK(kill(p->lead, SIGTERM) == 0);
    double end = wu_now_ms() + 20000;
    int lead_rc = p->lead > 0 ? -1 : 0, follow_rc = p->follow > 0 ? -1 : 0;
    while (lead_rc < 0 || follow_rc < 0) {
        CHECK(wu_now_ms() < end);
        wu_msg w;
        if (wu_recv(s, 100, &w)) {
            wu_answer(s, &w, true);
            wu_msg_free(&w);
        }
        if (lead_rc < 0) lead_rc = wu_wait(p->lead, 0);
        if (follow_rc < 0) follow_rc = wu_wait(p->follow, 0);
    }
    /* a drain with nothing to drain: both exit 0 */
    CHECK_INT_EQ(lead_rc, 0);
    CHECK_INT_EQ(follow_rc, 0);
}

/* ASSIGN of J's members as ranks rank_base.. of world on device 0 of `to`. */
static void send_span_assign(wu_server *s, const char *to, const jobs *J, const char *gid,
                             int64_t generation, int world, int rank_base, const int64_t *split,
                             const char *rendezvous, const char *token)
{
    fb_wire_msg m = {.type = FB_WIRE_ASSIGN,
                     .generation = generation,
                     .n_group_devices = 1,
                     .parallel_data = 1,
                     .parallel_pipeline = 1,
                     .n_split = world,
                     .time_share = 1.0,
                     .world = world,
                     .rank_base = rank_base};
    snprintf(m.group_id, sizeof m.group_id, "%s", gid);
    snprintf(m.fusion_key, sizeof m.fusion_key, "%s", J->spec[0].fusion_key);
    snprintf(m.dataset, sizeof m.dataset, "synth");
    snprintf(m.rendezvous, sizeof m.rendezvous, "%s", rendezvous);
    snprintf(m.token, sizeof m.token, "%s", token);
    for (int r = 0; r < world; r++)
        m.split[r] = split[r];
    m.n_members = N_JOBS;
    m.members = calloc(N_JOBS, sizeof *m.members);
    CHECK(m.members != NULL);
    for (int i = 0; i < N_JOBS; i++) {
        snprintf(m.members[i].job_id, sizeof m.members[i].job_id, "%s", J->ids[i]);
        wu_uuid(m.members[i].tenant_id, TENANT, 1);
        m.members[i].spec = strdup(J->json[i]);
        CHECK(m.members[i].spec != NULL);
    }
    wu_send(s, to, &m, NULL, NULL, 0);
    fb_wire_msg_free(&m);
}

#define TOKEN_A "00112233445566778899aabbccddeeff00112233445566778899aabbccddeeff"
#define TOKEN_B "ffeeddccbbaa99887766554433221100ffeeddccbbaa99887766554433221100"

/* Assigns the group to both workers, the leader first. */
static void assign_pair(wu_server *s, const pair *p, const jobs *J, const char *gid,
                        int64_t generation)
{
    static const int64_t split[2] = {70, 58};
    send_span_assign(s, LEAD, J, gid, generation, 2, 0, split, p->comm_addr, TOKEN_A);
    send_span_assign(s, FOLLOW, J, gid, generation, 2, 1, split, p->comm_addr, TOKEN_A);
}

/* ---- a scenario's fixture ------------------------------------------------------------------ */

/* What the scenarios that run the pair choose. */
typedef struct scene_opts {
    const char *tag;             /* names the scratch directory */
    uint64_t data_seed;          /* of the dataset synth */
    int64_t steps[N_JOBS];       /* each member's */
    int every;                   /* evaluation and checkpoint cadence, 0 for none */
    const char *comm_timeout_ms; /* both workers' --comm-timeout-ms */
    unsigned group;              /* the group id's number, for scene_assign */
} scene_opts;

/* The fake server with the dataset synth, the three members, both workers registered and,
 * once scene_assign has run, the group and what the workers reported about it. */
typedef struct scene {
    const scene_opts *o;
    wu_server s;
    jobs J;
    pair p;
    char gid[FB_WIRE_ID_LEN + 1];
    span_log *L;
} scene;

static void scene_start(scene *c, const scene_opts *o)
{
    memset(c, 0, sizeof *c);
    c->o = o;
    wu_server_start(&c->s, o->tag, true);
    wu_make_dataset(c->s.data_dir, "synth", 1024, 256, F_IN, CLASSES, o->data_seed);
    make_jobs(&c->J, o->steps, o->every, o->every);
    start_pair(&c->s, &c->p, o->comm_timeout_ms);
}

/* Assigns the group (generation 1) to both workers and serves them until until(L). */
static void scene_assign(scene *c, int timeout_ms, bool (*until)(const span_log *),
                         const char *what)
{
    wu_uuid(c->gid, 0x5b, c->o->group);
    c->L = calloc(1, sizeof *c->L);
    CHECK(c->L != NULL);
    log_init(c->L, c->gid, 1, &c->J);
    assign_pair(&c->s, &c->p, &c->J, c->gid, 1);
    pump(&c->s, c->L, timeout_ms, until, what);
}

/* Stops the workers that still run (each must exit 0) and frees the rest. */
static void scene_finish(scene *c)
{
    stop_pair(&c->s, &c->p);
    if (c->L) log_free(c->L);
    free(c->L);
    jobs_free(&c->J);
    wu_server_stop(&c->s);
}

/* ---- references in this process ------------------------------------------------------------ */

typedef struct ref_run {
    double loss[N_JOBS][MAX_STEPS + 1]; /* each step's training loss */
    void *model[N_JOBS], *state[N_JOBS];
    size_t model_len[N_JOBS], state_len[N_JOBS];
} ref_run;

static void ref_event(const fb_train_event *ev, void *user)
{
    ref_run *r = user;
    if (ev->kind == FB_TRAIN_STEP && ev->step <= MAX_STEPS)
        r->loss[ev->member][ev->step] = ev->loss;
    if (ev->kind != FB_TRAIN_DONE) return;
    CHECK(ev->blob != NULL);
    r->model[ev->member] = malloc(ev->blob_len);
    CHECK(r->model[ev->member] != NULL);
    memcpy(r->model[ev->member], ev->blob, ev->blob_len);
    r->model_len[ev->member] = ev->blob_len;
}

static void ref_free(ref_run *r)
{
    for (int i = 0; i < N_JOBS; i++) {
        free(r->model[i]);
        free(r->state[i]);
    }
}

/*
 * Trains J as one array in this process on the synth dataset as the workers read it (the
 * loader, one math thread): on one device (devices 1), or data-parallel over two CPU
 * devices with split 70/58 that becomes split2 from step split_at (0: never), with member
 * detach_member leaving at step detach_at (its full state kept; -1: none), until the end
 * or, when stop_at > 0, until step stop_at, where every member's full state is kept.
 */
static void reference(ref_run *r, const jobs *J, const char *data_dir, int devices,
                      int64_t split_at, const int64_t *split2, int detach_member, int64_t detach_at,
                      int64_t stop_at)
{
    memset(r, 0, sizeof *r);
    fb_backend *be = fb_backend_cpu();
    fb_backend_set_threads(be, 1);
    char msg[1024];
    fb_dataset train = {0}, val = {0}, test = {0};
    fb_loader *loader = NULL;
    fb_data_source_opts so = {.batch_size = BATCH,
                              .shuffle = J->spec[0].shuffle,
                              .data_seed = J->spec[0].data_seed,
                              .want_test = true,
                              .want_val = true, .val_fraction = J->spec[0].val_fraction};
    CHECK_INT_EQ(
        fb_data_open_named(&train, &val, &test, &loader, "synth", data_dir, &so, msg, sizeof msg),
        FB_OK);
    fb_device devs[2];
    CHECK_INT_EQ(fb_devices_discover(2, (uint64_t)1 << 30, devs, 2, msg, sizeof msg), 2);
    static const int64_t split[2] = {70, 58};
    fb_train_opts o = {.cb = ref_event, .user = r, .blobs = true, .loader = loader, .log_every = 1,
                       .test = &test};
    if (devices == 2) {
        o.devices = devs;
        o.n_devices = 2;
        o.split = split;
    }
    const fb_job_spec *specs[N_JOBS];
    for (int i = 0; i < N_JOBS; i++)
        specs[i] = &J->spec[i];
    fb_session *s = NULL;
    int err = fb_session_new(&s, be, specs, N_JOBS, &train, &val, &o, msg, sizeof msg);
    if (err) fprintf(stderr, "reference: %s\n", msg);
    CHECK_INT_EQ(err, FB_OK);
    int split_done = 0;
    while (!fb_session_done(s)) {
        int64_t at = fb_session_steps_done(s);
        if (stop_at > 0 && at == stop_at) {
            for (int i = 0; i < N_JOBS; i++)
                CHECK_INT_EQ(
                    fb_session_checkpoint(s, i, &r->state[i], &r->state_len[i], msg, sizeof msg),
                    FB_OK);
            break;
        }
        if (split_at > 0 && at == split_at && !split_done++)
            CHECK_INT_EQ(fb_session_set_split(s, split2, 2, msg, sizeof msg), FB_OK);
        if (detach_member >= 0 && at == detach_at && fb_session_has(s, detach_member)) {
            void *buf;
            size_t len;
            CHECK_INT_EQ(fb_session_checkpoint(s, detach_member, &buf, &len, msg, sizeof msg),
                         FB_OK);
            r->state[detach_member] = buf;
            r->state_len[detach_member] = len;
            fb_session_detach(s, detach_member);
            continue;
        }
        err = fb_session_step(s, msg, sizeof msg);
        if (err) fprintf(stderr, "reference step: %s\n", msg);
        CHECK_INT_EQ(err, FB_OK);
    }
    fb_session_free(s);
    fb_loader_free(loader);
    fb_dataset_free(&train);
    fb_dataset_free(&val);
    fb_dataset_free(&test);
}

/* ---- train ------------------------------------------------------------------------------- */

static void scenario_train(void)
{
    static const scene_opts o = {.tag = "span-train",
                                 .data_seed = 11,
                                 .steps = {30, 40, 50},
                                 .every = 20,
                                 .comm_timeout_ms = "20000",
                                 .group = 1};
    const int64_t *steps = o.steps;
    scene c;
    scene_start(&c, &o);
    scene_assign(&c, 60000, all_left, "every member to finish");
    span_log *L = c.L;

    /* the leader alone reported the members, each of them completely */
    CHECK_INT_EQ(L->follow_events, 0);
    for (int i = 0; i < N_JOBS; i++) {
        CHECK_INT_EQ(L->started[i], 1);
        CHECK(L->finished[i]);
        CHECK(!L->failed[i]);
        CHECK_INT_EQ(L->finished_step[i], steps[i]);
        /* checkpoints before the last step, evaluations also at it */
        CHECK_INT_EQ(L->n_ckpt[i], (steps[i] - 1) / 20);
        CHECK_INT_EQ(L->n_eval[i], (steps[i] - 1) / 20 + 1);
    }
    CHECK(L->lead_progress >= 1);
    CHECK(L->follow_progress >= 1);
    /* every device's share of the batch: 70 samples a step on the leader, 58 on the follower */
    int64_t lead_steps = 0, follow_steps = 0;
    for (int k = 0; k < L->n_lead_iv; k++) {
        CHECK_INT_EQ(L->lead_iv[k].samples, 70 * L->lead_iv[k].steps);
        lead_steps += L->lead_iv[k].steps;
    }
    for (int k = 0; k < L->n_follow_iv; k++) {
        CHECK_INT_EQ(L->follow_iv[k].samples, 58 * L->follow_iv[k].steps);
        follow_steps += L->follow_iv[k].steps;
    }
    CHECK(lead_steps >= 1 && lead_steps <= steps[2]);
    CHECK(follow_steps >= 1 && follow_steps <= steps[2]);

    /* the losses the leader reported: one device's, up to float rounding, for 30 steps */
    ref_run one;
    reference(&one, &c.J, c.s.data_dir, 1, 0, NULL, -1, -1, 0);
    int compared = 0;
    for (int i = 0; i < N_JOBS; i++)
        for (int64_t k = 1; k <= 30; k++) {
            double got = L->step_loss[i][k], want = one.loss[i][k];
            if (isnan(got)) continue;
            if (!(fabs(got - want) <= 1e-5 * fabs(want))) {
                fprintf(stderr, "member %d step %lld: loss %.9g, one device %.9g\n", i,
                        (long long)k, got, want);
                abort();
            }
            compared++;
        }
    CHECK(compared >= 3);
    /* the finished models: the two-device run's in one process, bit for bit */
    ref_run two;
    reference(&two, &c.J, c.s.data_dir, 2, 0, NULL, -1, -1, 0);
    for (int i = 0; i < N_JOBS; i++)
        wu_models_compare(L->model[i], L->model_len[i], two.model[i], two.model_len[i], -1,
                          "a member's model against the two-device run");
    /* and one device's within float rounding */
    for (int i = 0; i < N_JOBS; i++)
        wu_models_compare(L->model[i], L->model_len[i], one.model[i], one.model_len[i], 1e-4,
                          "a member's model against the one-device run");
    ref_free(&one);
    ref_free(&two);

    /* both stop listing the group once it is over */
    g_since = wu_now_ms();
    pump(&c.s, L, 10000, both_dropped, "both workers to stop listing the group");
    scene_finish(&c);
}

/* ---- change --------------------------------------------------------------------------- */

/*
 * Where the split changed from `before` to `after` samples a step on one worker's device,
 * from its PROGRESS intervals: the step count at the change (0 when it never changed).
 */
static int64_t split_change(const ival *iv, int n, int64_t before, int64_t after)
{
    int64_t done = 0, at = 0;
    for (int k = 0; k < n; k++) {
        int64_t old_steps = (iv[k].samples - after * iv[k].steps) / (before - after);
        CHECK_INT_EQ(old_steps * before + (iv[k].steps - old_steps) * after, iv[k].samples);
        CHECK(old_steps >= 0 && old_steps <= iv[k].steps);
        if (at == 0 && old_steps < iv[k].steps) at = done + old_steps;
        if (at != 0) CHECK(at == done + old_steps || old_steps == 0);
        done += iv[k].steps;
    }
    return at;
}

static bool leader_at_3(const span_log *L)
{
    return L->last_step[0] >= 3;
}

static void scenario_change(void)
{
    static const scene_opts o = {.tag = "span-change",
                                 .data_seed = 12,
                                 .steps = {300, 320, 340},
                                 .every = 100,
                                 .comm_timeout_ms = "20000",
                                 .group = 2};
    scene c;
    scene_start(&c, &o);
    scene_assign(&c, 60000, leader_at_3, "the leader to report step 3");
    span_log *L = c.L;

    /* the follower ignores what only the leader decides */
    fb_wire_msg m = {.type = FB_WIRE_REBALANCE,
                     .generation = 1,
                     .n_split = 2,
                     .split = {10, 118},
                     .time_share = 1.0};
    snprintf(m.group_id, sizeof m.group_id, "%s", c.gid);
    wu_send(&c.s, FOLLOW, &m, NULL, NULL, 0);
    /* the leader's REBALANCE and DETACH with the state */
    m.split[0] = 40;
    m.split[1] = 88;
    wu_send(&c.s, LEAD, &m, NULL, NULL, 0);
    fb_wire_msg d = {.type = FB_WIRE_DETACH, .generation = 1, .keep_state = true};
    snprintf(d.group_id, sizeof d.group_id, "%s", c.gid);
    snprintf(d.job_id, sizeof d.job_id, "%s", c.J.ids[1]);
    wu_send(&c.s, FOLLOW, &d, NULL, NULL, 0); /* dropped there too */
    wu_send(&c.s, LEAD, &d, NULL, NULL, 0);
    pump(&c.s, L, 90000, all_left, "every member to finish or leave");

    CHECK_INT_EQ(L->follow_events, 0);
    CHECK(L->detached[1]);
    CHECK(L->state[1] != NULL);
    CHECK(L->finished[0] && L->finished[2]);
    CHECK(!L->failed[0] && !L->failed[1] && !L->failed[2]);
    int64_t at_lead = split_change(L->lead_iv, L->n_lead_iv, 70, 40);
    int64_t at_follow = split_change(L->follow_iv, L->n_follow_iv, 58, 88);
    fprintf(stderr,
            "split changed at step %lld (leader) and %lld (follower); member 1 left at "
            "step %lld\n",
            (long long)at_lead, (long long)at_follow, (long long)L->detached_step[1]);
    CHECK(at_lead >= 3);
    CHECK_INT_EQ(at_lead, at_follow);
    CHECK(L->detached_step[1] >= 3 && L->detached_step[1] < o.steps[1]);

    /* the same run with the same changes at the same steps, in this process */
    static const int64_t split2[2] = {40, 88};
    ref_run ref;
    reference(&ref, &c.J, c.s.data_dir, 2, at_lead, split2, 1, L->detached_step[1], 0);
    wu_models_compare(L->state[1], L->state_len[1], ref.state[1], ref.state_len[1], -1,
                      "the detached member's state");
    for (int i = 0; i < N_JOBS; i += 2)
        wu_models_compare(L->model[i], L->model_len[i], ref.model[i], ref.model_len[i], -1,
                          "a member's model against the changed two-device run");
    ref_free(&ref);
    scene_finish(&c);
}

/* ---- kill --------------------------------------------------------------------------------- */

static bool leader_at_5(const span_log *L)
{
    return L->last_step[0] >= 5 && L->lead_lists;
}

static bool leader_dropped(const span_log *L)
{
    return L->lead_hb_ms > g_since && !L->lead_lists;
}

static void scenario_kill(void)
{
    static const scene_opts o = {.tag = "span-kill",
                                 .data_seed = 13,
                                 .steps = {100000, 100000, 100000},
                                 .comm_timeout_ms = "3000",
                                 .group = 3};
    scene c;
    scene_start(&c, &o);
    scene_assign(&c, 60000, leader_at_5, "the leader to train and list the group");
    span_log *L = c.L;
    int events_before = L->lead_events;

    CHECK(kill(c.p.follow, SIGKILL) == 0);
    CHECK_INT_EQ(wu_wait(c.p.follow, 5000), 128 + SIGKILL);
    c.p.follow = 0;
    double t0 = wu_now_ms();
    g_since = t0;
    pump(&c.s, L, 3000 + 3000, leader_dropped, "the leader to stop listing the group");
    fprintf(stderr, "the leader dropped the group %.0f ms after the follower died\n",
            wu_now_ms() - t0);
    /* nothing failed, nothing left: the server re-queues the group from its checkpoints */
    for (int i = 0; i < N_JOBS; i++) {
        CHECK(!L->failed[i]);
        CHECK(!L->detached[i] && !L->finished[i]);
    }
    /* and nothing more comes (a started event may have crossed the kill, nothing else) */
    double quiet_end = wu_now_ms() + 1000;
    while (wu_now_ms() < quiet_end)
        serve(&c.s, L, 100);
    for (int i = 0; i < N_JOBS; i++)
        CHECK(!L->failed[i]);
    CHECK(L->lead_events >= events_before);
    CHECK(!L->lead_lists);
    CHECK(wu_alive(c.p.lead));
    scene_finish(&c);
}

/* ---- drain ------------------------------------------------------------------------------- */

static bool drained(const span_log *L)
{
    return all_left(L) && L->lead_drain;
}

static bool follower_dropped(const span_log *L)
{
    return L->follow_hb_ms > g_since && !L->follow_lists;
}

static void scenario_drain(void)
{
    static const scene_opts o = {.tag = "span-drain",
                                 .data_seed = 15,
                                 .steps = {100000, 100000, 100000},
                                 .comm_timeout_ms = "20000",
                                 .group = 4};
    scene c;
    scene_start(&c, &o);
    scene_assign(&c, 60000, leader_at_5, "the leader to train and list the group");
    span_log *L = c.L;

    /* the leader drains the group on both workers and alone reports the states */
    CHECK(kill(c.p.lead, SIGTERM) == 0);
    pump(&c.s, L, 20000, drained, "the leader to drain every member");
    CHECK_INT_EQ(wu_wait(c.p.lead, 20000), 0);
    c.p.lead = 0;
    CHECK_INT_EQ(L->follow_events, 0);
    int64_t at = L->detached_step[0];
    for (int i = 0; i < N_JOBS; i++) {
        CHECK(L->detached[i] && !L->failed[i]);
        CHECK_STR_EQ(L->detached_text[i], "drained");
        CHECK(L->state[i] != NULL);
        CHECK_INT_EQ(L->detached_step[i], at);
    }
    CHECK(at >= 5);
    g_since = wu_now_ms();
    pump(&c.s, L, 5000, follower_dropped, "the follower to stop listing the group");
    CHECK(wu_alive(c.p.follow));

    /* each state is the two-device run's at that step, bit for bit */
    ref_run ref;
    reference(&ref, &c.J, c.s.data_dir, 2, 0, NULL, -1, -1, at);
    for (int i = 0; i < N_JOBS; i++)
        wu_models_compare(L->state[i], L->state_len[i], ref.state[i], ref.state_len[i], -1,
                          "a drained member's state");
    ref_free(&ref);
    scene_finish(&c); /* the follower alone, which must exit 0 */
}

/* ---- refuse ------------------------------------------------------------------------------ */

static void refused(wu_server *s, const pair *p, const jobs *J, int generation,
                    const char *follow_token, int follow_world)
{
    char gid[FB_WIRE_ID_LEN + 1];
    wu_uuid(gid, 0x5c, (unsigned long long)generation);
    span_log *L = calloc(1, sizeof *L);
    CHECK(L != NULL);
    log_init(L, gid, generation, J);
    static const int64_t split2[2] = {70, 58}, split3[3] = {40, 40, 48};
    send_span_assign(s, LEAD, J, gid, generation, 2, 0, split2, p->comm_addr, TOKEN_A);
    send_span_assign(s, FOLLOW, J, gid, generation, follow_world, 1,
                     follow_world == 2 ? split2 : split3, p->comm_addr, follow_token);
    /* the leader waits for the rightful follower; the refused one may leave before its next
     * heartbeat could list the group */
    pump(s, L, 10000, leader_lists, "the leader to list the group");
    g_since = wu_now_ms();
    double t0 = g_since;
    /* the follower is refused at once, the leader waits out its comm timeout of 3 s */
    pump(s, L, 3000 + 4000, both_dropped, "both workers to stop listing the group");
    fprintf(stderr, "refused group dropped after %.0f ms\n", wu_now_ms() - t0);
    CHECK_INT_EQ(L->lead_events, 0);
    CHECK_INT_EQ(L->follow_events, 0);
    CHECK_INT_EQ(L->lead_progress + L->follow_progress, 0);
    log_free(L);
    free(L);
}

static void scenario_refuse(void)
{
    static const scene_opts o = {.tag = "span-refuse",
                                 .data_seed = 14,
                                 .steps = {1000, 1000, 1000},
                                 .comm_timeout_ms = "3000"};
    scene c;
    scene_start(&c, &o);
    refused(&c.s, &c.p, &c.J, 1, TOKEN_B, 2); /* a wrong token */
    refused(&c.s, &c.p, &c.J, 2, TOKEN_A, 3); /* a world of 3 against the leader's 2 */
    CHECK(wu_alive(c.p.lead) && wu_alive(c.p.follow));
    scene_finish(&c);
}

/* ---- flags ------------------------------------------------------------------------------- */

static void scenario_flags(void)
{
    wu_server s;
    wu_server_start(&s, "span-flags", true);
    /* keys that do not exist: a good comm flag gets past its check and fails on the key */
    const char *base[] = {"--server", "tcp://127.0.0.1:1", "--server-key", "/nonexistent/k",
                          "--key",    "/nonexistent/k"};
    /* the parser, in this process: every refusal names what is wrong and leaves the
     * outputs untouched */
    static const struct {
        const char *value, *has;
    } bad[] = {
        {"127.0.0.1", "'127.0.0.1' has no ports"},
        {"node-1:", "the ports must be LO or LO-HI"},
        {"node-1:0", "the ports must be LO or LO-HI"},
        {"node-1:65536", "the ports must be LO or LO-HI"},
        {"node-1:29500-", "the ports must be LO or LO-HI"},
        {"node-1:+29500", "the ports must be LO or LO-HI"},
        {"node-1:029500", "the ports must be LO or LO-HI"},
        {"node-1:29599-29500", "the port range 29599-29500 is reversed"},
        {"node-1:1000-2024", "1025 ports, at most 1024"},
        {"::1:29500", "write an IPv6 address in brackets"},
        {"[::1]29500", "must be followed by :PORT"},
        {"[node]:29500", "only an IPv6 address goes in brackets"},
        {":29500", "the host must have 1.."},
        {"no de:29500", "the host is neither a host name"},
        {"-node:29500", "the host is neither a host name"},
    };
    char host[FB_WIRE_NAME_MAX + 1], msg[256];
    int lo, hi;
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        snprintf(host, sizeof host, "untouched");
        lo = hi = -1;
        msg[0] = '\0';
        int rc =
            fb_agent_parse_comm_addr(bad[i].value, host, sizeof host, &lo, &hi, msg, sizeof msg);
        if (rc != FB_ERR_OUT_OF_RANGE || !strstr(msg, bad[i].has)) {
            fprintf(stderr, "'%s': rc %d, message \"%s\", wanted \"%s\"\n", bad[i].value, rc, msg,
                    bad[i].has);
            abort();
        }
        CHECK_STR_EQ(host, "untouched");
        CHECK(lo == -1 && hi == -1);
    }
    static const struct {
        const char *value, *host;
        int lo, hi;
    } good[] = {
        {"node-1.example:29500-30523", "node-1.example", 29500, 30523},
        {"[fe80::1]:7", "fe80::1", 7, 7},
        {"10.0.0.7:65535", "10.0.0.7", 65535, 65535},
    };
    for (size_t i = 0; i < sizeof good / sizeof good[0]; i++) {
        CHECK_INT_EQ(
            fb_agent_parse_comm_addr(good[i].value, host, sizeof host, &lo, &hi, msg, sizeof msg),
            FB_OK);
        CHECK_STR_EQ(host, good[i].host);
        CHECK(lo == good[i].lo && hi == good[i].hi);
    }

    /* the agent's own checks of the same options, for callers other than the executable */
    char pub[41], sec[41], spub[41], ssec[41];
    CHECK(zmq_curve_keypair(pub, sec) == 0 && zmq_curve_keypair(spub, ssec) == 0);
    fb_agent_opts ao = {.server = "tcp://127.0.0.1:1",
                        .server_key = spub,
                        .public_key = pub,
                        .secret_key = sec,
                        .comm_host = "no host",
                        .comm_port_lo = 1,
                        .comm_port_hi = 2};
    static const struct {
        const char *host;
        int lo, hi, timeout;
        const char *has;
    } opt_cases[] = {
        {"no host", 1, 2, 0, "the comm host 'no host' is neither"},
        {"[::1]", 1, 2, 0, "the comm host '[::1]' is neither"},
        {"node-1", 3, 2, 0, "the comm ports 3..2"},
        {"node-1", 0, 2, 0, "the comm ports 0..2"},
        {"node-1", 1, 1025, 0, "at most 1024 ports"},
        {"node-1", 1, 2, -1, "the comm timeout must be in [1, 3600000] ms, not -1"},
        {NULL, 0, 0, 3600001, "the comm timeout must be in [1, 3600000] ms"},
    };
    for (size_t i = 0; i < sizeof opt_cases / sizeof opt_cases[0]; i++) {
        fb_agent *sentinel = (fb_agent *)&ao, *a = sentinel;
        ao.comm_host = opt_cases[i].host;
        ao.comm_port_lo = opt_cases[i].lo;
        ao.comm_port_hi = opt_cases[i].hi;
        ao.comm_timeout_ms = opt_cases[i].timeout;
        msg[0] = '\0';
        CHECK_INT_EQ(fb_agent_new(&a, &ao, msg, sizeof msg), FB_ERR_OUT_OF_RANGE);
        if (!strstr(msg, opt_cases[i].has)) {
            fprintf(stderr, "fb_agent_new said \"%s\", wanted \"%s\"\n", msg, opt_cases[i].has);
            abort();
        }
        CHECK(a == sentinel);
    }

    /* the executable: a refused value exits 2 naming the flag or the variable; an accepted
     * one gets past its check and fails on the missing key */
    static const struct {
        const char *flag, *value, *has;
    } cases[] = {
        {"--comm-addr", "127.0.0.1", "--comm-addr: '127.0.0.1' has no ports"},
        {"--comm-timeout-ms", "0", "--comm-timeout-ms needs an integer in [1, 3600000]"},
        {"--comm-timeout-ms", "1s", "--comm-timeout-ms needs an integer"},
        {"--comm-addr", "[fe80::1]:29500-29501", "server key"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        const char *args[] = {base[0], base[1],       base[2],        base[3], base[4],
                              base[5], cases[i].flag, cases[i].value, NULL};
        wu_expect_run(s.dir, args, NULL, 2, cases[i].has);
    }
    const char *args[] = {base[0], base[1], base[2], base[3], base[4], base[5], NULL};
    const char *env[] = {"FUSEBOX_WORKER_COMM_ADDR=node-1", NULL};
    wu_expect_run(s.dir, args, env, 2, "FUSEBOX_WORKER_COMM_ADDR: 'node-1' has no ports");
    const char *env2[] = {"FUSEBOX_WORKER_COMM_TIMEOUT_MS=-5", NULL};
    wu_expect_run(s.dir, args, env2, 2, "FUSEBOX_WORKER_COMM_TIMEOUT_MS needs an integer");

    /* a worker without --comm-addr says nothing about comm in its HELLO */
    const char *extra[] = {"--cpu-devices", "1", NULL};
    pid_t pid = wu_start_worker(&s, "w-plain", extra);
    wu_msg w;
    wu_expect_hello(&s, "w-plain", 20000, &w);
    CHECK_STR_EQ(w.m.comm_host, "");
    CHECK_INT_EQ(w.m.comm_port_lo, 0);
    wu_msg_free(&w);
    wu_send_welcome(&s, "w-plain");
    /* and refuses a spanning group without a word: no event, not listed */
    jobs J;
    static const int64_t steps[N_JOBS] = {100, 100, 100};
    make_jobs(&J, steps, 0, 0);
    char gid[FB_WIRE_ID_LEN + 1];
    wu_uuid(gid, 0x5d, 1);
    static const int64_t split[2] = {70, 58};
    send_span_assign(&s, "w-plain", &J, gid, 1, 2, 0, split, "127.0.0.1:9", TOKEN_A);
    double end = wu_now_ms() + 1500;
    int beats = 0;
    while (wu_now_ms() < end) {
        if (!wu_recv(&s, 100, &w)) continue;
        CHECK(w.m.type == FB_WIRE_HEARTBEAT || w.m.type == FB_WIRE_HELLO);
        if (w.m.type == FB_WIRE_HEARTBEAT) {
            CHECK(!lists(&w.m, gid));
            wu_send_heartbeat_reply(&s, w.from, true);
            beats++;
        }
        wu_msg_free(&w);
    }
    CHECK(beats >= 2);
    CHECK(kill(pid, SIGTERM) == 0);
    CHECK_INT_EQ(wu_wait(pid, 20000), 0);
    jobs_free(&J);
    wu_server_stop(&s);
}

int main(int argc, char **argv)
{
    signal(SIGPIPE, SIG_IGN);
    if (argc < 2) {
        fprintf(stderr, "usage: %s train|change|drain|kill|refuse|flags\n", argv[0]);
        return 2;
    }
    const char *sc = argv[1];
    if (strcmp(sc, "train") == 0)
        scenario_train();
    else if (strcmp(sc, "change") == 0)
        scenario_change();
    else if (strcmp(sc, "drain") == 0)
        scenario_drain();
    else if (strcmp(sc, "kill") == 0)
        scenario_kill();
    else if (strcmp(sc, "refuse") == 0)
        scenario_refuse();
    else if (strcmp(sc, "flags") == 0)
        scenario_flags();
    else {
        fprintf(stderr, "unknown scenario %s\n", sc);
        return 2;
    }
    printf("test_worker_span %s: ok\n", sc);
    return 0;
}
