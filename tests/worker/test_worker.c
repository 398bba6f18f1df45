/*
 * fusebox-worker as fuseboxd sees it: this process plays the server (a CURVE
 * ROUTER on loopback with a ZAP handler that admits one key) and drives the
 * real executable.  One scenario per run, named by the first argument:
 *   train    HELLO, WELCOME, a 3-member group with evaluations and
 *            checkpoints; every event and PROGRESS; each finished model
 *            equals fb_train_run's in this process, bit for bit as the same
 *            3-array and within float tolerance of each member alone
 *   detach   the server restarts mid-run: the worker keeps training,
 *            registers its running group again and resends what was not
 *            acknowledged; then one member is detached and the others finish
 *   drain    SIGTERM mid-run (placed with the test step hook: the array is held at
 *            step 150, then sent on towards a hold at 400 and SIGTERM follows at
 *            once, so it falls between the two): every member leaves with its full
 *            state at one step; a second worker resumes them (new generation) and
 *            the finished models equal the uninterrupted run's bit for bit
 *   share    two groups on one device take turns in proportion to their time shares,
 *            which REBALANCE changes, on scripted step times and the test's clock: the
 *            exact order of their turns; DETACH without a job stops a group silently
 *   outbox   (an agent in this process) past its bound, unacknowledged checkpoints
 *            that a newer one supersedes are dropped, the rest is resent in order
 *   bad      garbage, a wrong version, stale and unknown groups, bad members
 *            (spec, fusion key, checkpoint), a missing dataset, a missing
 *            device: each is dropped or fails alone and the worker keeps
 *            answering; configured through FUSEBOX_WORKER_* variables
 *   auth     a worker whose key is not admitted gets no message through
 *   cli      --help, bad flags and variables (exit 2), --gen-key, names
 *   hook     the test step hook: refused without FUSEBOX_TEST_HOOKS=1 (exit 2, by
 *            the executable and by fb_agent_new), as are the test clock and the step
 *            time script, and bad clock files and scripts; an array held at a step stays
 *            there while the worker heartbeats, follows a moved hold, lets a
 *            member detach and drains at the held step; resumed from there it
 *            starts at the next step and ends bit-identical to the uninterrupted run
 */
#include "worker_util.h"
#include "turns_script.h"

#include "agent.h"
#include "kernels.h"
#include "train.h"

#define F_IN 16
#define CLASSES 4
#define MAX_JOBS 8
#define TENANT 0x7e

/* ---- what the worker reported ------------------------------------------------------------ */

typedef struct job_log {
    char id[FB_WIRE_ID_LEN + 1];
    int started;
    int64_t started_step;
    int64_t ckpt_step[64];
    int n_ckpt;
    int64_t eval_step[64];
    int n_eval;
    bool finished;
    int64_t finished_step;
    double loss, accuracy;
    void *model;
    size_t model_len;
    bool detached;
    int64_t detached_step;
    char detached_text[FB_WIRE_TEXT_MAX + 1];
    void *state;
    size_t state_len;
    bool failed;
    char failed_text[FB_WIRE_TEXT_MAX + 1];
} job_log;

typedef struct run_log {
    const char *group_id;
    int64_t generation;
    job_log job[MAX_JOBS];
    int n_jobs;
    int64_t seen[4096]; /* event seqs seen: a resent event is counted once */
    int n_seen, resent;
    int progress, progress_full; /* PROGRESS messages; those naming every job */
    bool drain;
    char drain_text[FB_WIRE_TEXT_MAX + 1];
} run_log;

static void log_init(run_log *L, const char *group_id, int64_t generation,
                     char (*ids)[FB_WIRE_ID_LEN + 1], int n)
{
    memset(L, 0, sizeof *L);
    L->group_id = group_id;
    L->generation = generation;
    L->n_jobs = n;
    for (int i = 0; i < n; i++)
        snprintf(L->job[i].id, sizeof L->job[i].id, "%s", ids[i]);
}

static void log_free(run_log *L)
{
    for (int i = 0; i < L->n_jobs; i++) {
        free(L->job[i].model);
        free(L->job[i].state);
    }
}

static job_log *find_job(run_log *L, const char *id)
{
    for (int i = 0; i < L->n_jobs; i++)
        if (strcmp(L->job[i].id, id) == 0) return &L->job[i];
    fprintf(stderr, "an event names job %s, which is not in the group\n", id);
    abort();
}

/* Takes the blob an event names (it must have one exactly when want is true). */
static void take_blob(wu_msg *w, bool want, void **data, size_t *len)
{
    if (!want) {
        CHECK_INT_EQ(w->m.blob, 0);
        CHECK_INT_EQ(w->n_blobs, 0);
        return;
    }
    wu_take_blob(w, data, len);
}

/* Records an EVENT, PROGRESS or DRAIN of group L (events of other groups are not expected). */
static void record(run_log *L, wu_msg *w)
{
    fb_wire_msg *m = &w->m;
    if (m->type == FB_WIRE_DRAIN) {
        L->drain = true;
        snprintf(L->drain_text, sizeof L->drain_text, "%s", m->text);
        return;
    }
    if (m->type == FB_WIRE_PROGRESS) {
        CHECK_STR_EQ(m->group_id, L->group_id);
        CHECK_INT_EQ(m->generation, L->generation);
        CHECK(m->n_progress >= 1 && m->n_progress <= L->n_jobs);
        CHECK(m->compute_ms >= 0 && m->io_ms >= 0 && m->idle_ms >= 0);
        CHECK(m->comm_ms == 0);
        CHECK(m->samples_per_s > 0);
        for (int i = 0; i < m->n_progress; i++) {
            const fb_wire_member_progress *p = &m->progress[i];
            find_job(L, p->job_id);
            CHECK(p->step >= 1 && p->step <= p->steps);
            CHECK(isfinite(p->loss) && p->loss >= 0);
            CHECK(p->accuracy >= 0 && p->accuracy <= 1);
            CHECK(p->lr > 0);
        }
        L->progress++;
        if (m->n_progress == L->n_jobs) L->progress_full++;
        return;
    }
    if (m->type != FB_WIRE_EVENT) {
        fprintf(stderr, "unexpected %s message\n", fb_wire_type_name(m->type));
        abort();
    }
    CHECK_STR_EQ(m->group_id, L->group_id);
    CHECK_INT_EQ(m->generation, L->generation);
    for (int i = 0; i < L->n_seen; i++)
        if (L->seen[i] == m->seq) {
            L->resent++;
            return;
        }
    CHECK(L->n_seen < 4096);
    if (L->n_seen > 0 && m->seq <= L->seen[L->n_seen - 1]) {
        fprintf(stderr, "event seq %lld (%s) arrived after seq %lld\n", (long long)m->seq,
                fb_wire_event_name(m->event), (long long)L->seen[L->n_seen - 1]);
        abort();
    }
    L->seen[L->n_seen++] = m->seq;
    job_log *j = find_job(L, m->job_id);
    CHECK(!j->finished && !j->detached && !j->failed); /* nothing after the last word */
    switch (m->event) {
    case FB_EV_STARTED:
        j->started++;
        j->started_step = m->step;
        take_blob(w, false, NULL, NULL);
        break;
    case FB_EV_EVALUATED:
        CHECK(j->started);
        CHECK(j->n_eval < 64);
        CHECK(isfinite(m->loss) && m->accuracy >= 0 && m->accuracy <= 1);
        j->eval_step[j->n_eval++] = m->step;
        break;
    case FB_EV_CHECKPOINTED: {
        CHECK(j->started);
        CHECK(j->n_ckpt < 64);
        j->ckpt_step[j->n_ckpt++] = m->step;
        void *blob = NULL;
        size_t len = 0;
        take_blob(w, true, &blob, &len);
        /* a full-state checkpoint of this step */
        fb_st_file *f = NULL;
        char msg[512], step[32];
        CHECK_INT_EQ(fb_st_parse_buffer(blob, len, &f, msg, sizeof msg), 0);
        CHECK_STR_EQ(fb_st_metadata_get(f, "format"), "fusebox-checkpoint-1");
        snprintf(step, sizeof step, "%lld", (long long)m->step);
        CHECK_STR_EQ(fb_st_metadata_get(f, "step"), step);
        fb_st_close(f);
        free(blob);
        break;
    }
    case FB_EV_FINISHED:
        CHECK(j->started);
        j->finished = true;
        j->finished_step = m->step;
        j->loss = m->loss;
        j->accuracy = m->accuracy;
        take_blob(w, true, &j->model, &j->model_len);
        break;
    case FB_EV_DETACHED:
        j->detached = true;
        j->detached_step = m->step;
        snprintf(j->detached_text, sizeof j->detached_text, "%s", m->text);
        if (m->blob) take_blob(w, true, &j->state, &j->state_len);
        break;
    case FB_EV_FAILED:
        j->failed = true;
        snprintf(j->failed_text, sizeof j->failed_text, "%s", m->text);
        break;
    default:
        abort();
    }
}

static bool all_done(const run_log *L)
{
    for (int i = 0; i < L->n_jobs; i++)
        if (!L->job[i].finished && !L->job[i].detached && !L->job[i].failed) return false;
    return true;
}

static void dump(const run_log *L)
{
    for (int i = 0; i < L->n_jobs; i++) {
        const job_log *j = &L->job[i];
        fprintf(stderr,
                "  job %s: started %d, %d checkpoints, %d evals, finished %d, "
                "detached %d, failed %d (%s)\n",
                j->id, j->started, j->n_ckpt, j->n_eval, j->finished, j->detached, j->failed,
                j->failed_text);
    }
}

/* Receives (acknowledging every event) and records until done(L) or timeout. */
static void pump(wu_server *s, run_log *L, int timeout_ms, bool (*done)(const run_log *),
                 const char *what)
{
    double end = wu_now_ms() + timeout_ms;
    while (!done(L)) {
        wu_msg w;
        int left = (int)(end - wu_now_ms());
        if (left <= 0 || !wu_next(s, left, true, &w)) {
            fprintf(stderr, "timed out after %d ms waiting for %s\n", timeout_ms, what);
            dump(L);
            abort();
        }
        record(L, &w);
        wu_msg_free(&w);
    }
}

/* ---- groups --------------------------------------------------------------------------- */

typedef struct group_def {
    int n;
    char ids[MAX_JOBS][FB_WIRE_ID_LEN + 1];
    fb_job_spec spec[MAX_JOBS];
    char *json[MAX_JOBS];
} group_def;

static void group_free(group_def *g)
{
    for (int i = 0; i < g->n; i++) {
        fb_job_spec_free(&g->spec[i]);
        free(g->json[i]);
    }
}

/*
 * A small MLP job on dataset synth.  hidden, dropout and the schedule are
 * part of the model or fusion key only where the job spec says so: lr, seed
 * and steps differ between members.
 */
static void mlp_job(group_def *g, int hidden, double dropout, int64_t steps, double lr, int seed,
                    int eval_every, int ckpt_every)
{
    int i = g->n++;
    CHECK(i < MAX_JOBS);
    wu_uuid(g->ids[i], 0x10b, (unsigned long long)(1000 * hidden + i + 1));
    char drop[96] = "";
    if (dropout > 0) snprintf(drop, sizeof drop, "{\"type\": \"dropout\", \"p\": %g}, ", dropout);
    wu_spec(&g->spec[i], &g->json[i],
            "{\"name\": \"m%d\", \"dataset\": \"synth\", \"model\": {\"input\": [%d], "
            "\"layers\": [{\"type\": \"linear\", \"out\": %d}, {\"type\": \"relu\"}, %s"
            "{\"type\": \"linear\", \"out\": %d}]}, \"batch_size\": 32, \"steps\": %lld, "
            "\"optimizer\": {\"type\": \"adamw\", \"lr\": %g, \"weight_decay\": 0.01}, "
            "\"schedule\": {\"type\": \"cosine\", \"warmup_steps\": 10}, "
            "\"seed\": %d, \"data_seed\": 5, \"eval_every\": %d, \"checkpoint_every\": %d}",
            i, F_IN, hidden, drop, CLASSES, (long long)steps, lr, seed, eval_every, ckpt_every);
}

/* Sends ASSIGN of g as (group_id, generation) on device dev; blobs[i] resumes member i. */
static void send_assign(wu_server *s, const char *to, const group_def *g, const char *group_id,
                        int64_t generation, const char *dataset, int dev, int64_t start_step,
                        void *const *states, const size_t *state_lens)
{
    fb_wire_msg m = {.type = FB_WIRE_ASSIGN,
                     .generation = generation,
                     .n_group_devices = 1,
                     .parallel_data = 1,
                     .parallel_pipeline = 1,
                     .n_split = 1,
                     .time_share = 1.0};
    snprintf(m.group_id, sizeof m.group_id, "%s", group_id);
    snprintf(m.fusion_key, sizeof m.fusion_key, "%s", g->spec[0].fusion_key);
    snprintf(m.dataset, sizeof m.dataset, "%s", dataset);
    m.group_devices[0] = dev;
    m.split[0] = g->spec[0].batch_size;
    m.n_members = g->n;
    m.members = calloc((size_t)g->n, sizeof *m.members);
    CHECK(m.members != NULL);
    const void *blobs[WU_MAX_BLOBS];
    size_t lens[WU_MAX_BLOBS];
    int n_blobs = 0;
    for (int i = 0; i < g->n; i++) {
        fb_wire_member *mb = &m.members[i];
        snprintf(mb->job_id, sizeof mb->job_id, "%s", g->ids[i]);
        wu_uuid(mb->tenant_id, TENANT, 1);
        mb->spec = strdup(g->json[i]);
        CHECK(mb->spec != NULL);
        mb->start_step = start_step;
        if (states && states[i]) {
            CHECK(n_blobs < WU_MAX_BLOBS);
            blobs[n_blobs] = states[i];
            lens[n_blobs] = state_lens[i];
            mb->resume_blob = ++n_blobs;
        }
    }
    wu_send(s, to, &m, blobs, lens, n_blobs);
    fb_wire_msg_free(&m);
}

/* ---- the in-process reference ------------------------------------------------------------ */

typedef struct ref_run {
    void *model[MAX_JOBS];
    size_t len[MAX_JOBS];
    double loss[MAX_JOBS], accuracy[MAX_JOBS];
} ref_run;

static void ref_event(const fb_train_event *ev, void *user)
{
    ref_run *r = user;
    if (ev->kind != FB_TRAIN_DONE) return;
    CHECK(ev->blob != NULL);
    r->model[ev->member] = malloc(ev->blob_len);
    CHECK(r->model[ev->member] != NULL);
    memcpy(r->model[ev->member], ev->blob, ev->blob_len);
    r->len[ev->member] = ev->blob_len;
}

/* Trains specs[0..n) as one array in this process on dataset "synth" of data_dir, reading it
 * as fusebox-train and the worker do (a shard dataset through the loader; one thread). */
static void reference(ref_run *r, const fb_job_spec *const *specs, int n, const char *data_dir)
{
    memset(r, 0, sizeof *r);
    fb_backend *be = fb_backend_cpu();
    fb_backend_set_threads(be, 1);
    char msg[1024];
    fb_dataset train = {0}, val = {0}, test = {0};
    fb_loader *loader = NULL;
    fb_data_source_opts so = {.batch_size = specs[0]->batch_size, .shuffle = specs[0]->shuffle,
                              .data_seed = specs[0]->data_seed, .want_test = true,
                              .want_val = true, .val_fraction = specs[0]->val_fraction};
    int err = fb_data_open_named(&train, &val, &test, &loader, "synth", data_dir, &so, msg,
                                 sizeof msg);
    if (err) fprintf(stderr, "reference data: %s\n", msg);
    CHECK_INT_EQ(err, FB_OK);
    fb_train_opts o = {.cb = ref_event, .user = r, .blobs = true, .loader = loader,
                       .test = &test};
    err = fb_train_run(be, specs, n, &train, &val, &o, r->loss, r->accuracy, msg, sizeof msg);
    if (err) fprintf(stderr, "reference run: %s\n", msg);
    CHECK_INT_EQ(err, FB_OK);
    fb_loader_free(loader);
    fb_dataset_free(&train);
    fb_dataset_free(&val);
    fb_dataset_free(&test);
    for (int i = 0; i < n; i++)
        CHECK(r->model[i] != NULL);
}

static void ref_free(ref_run *r)
{
    for (int i = 0; i < MAX_JOBS; i++)
        free(r->model[i]);
}

/* Stops a worker with SIGTERM: it reports DRAIN and exits 0. */
static void stop_worker(wu_server *s, pid_t pid, run_log *L)
{
    CHECK(kill(pid, SIGTERM) == 0);
    double end = wu_now_ms() + 15000;
    while (!L->drain) {
        wu_msg w;
        int left = (int)(end - wu_now_ms());
        CHECK(left > 0 && wu_next(s, left, true, &w));
        record(L, &w);
        wu_msg_free(&w);
    }
    CHECK_STR_EQ(L->drain_text, "draining");
    CHECK_INT_EQ(wu_wait(pid, 20000), 0);
}

/* ---- the set-up the scenarios share ------------------------------------------------------ */

/* The fake server with the dataset synth and one registered worker; the group the scenario
 * fills in (g) and, once scene_assign has run, its id and what the worker reported (L). */
typedef struct scene {
    wu_server s;
    const char *name;          /* the worker's */
    const char *const *extra;  /* its flags beyond wu_start_worker's (NULL: none) */
    pid_t pid;
    group_def g;
    char gid[FB_WIRE_ID_LEN + 1];
    run_log L;
} scene;

/* Starts the worker and WELCOMEs it after its HELLO, which *hello receives (the caller frees
 * it) unless hello is NULL. */
static void scene_worker(scene *c, wu_msg *hello)
{
    c->pid = wu_start_worker(&c->s, c->name, c->extra);
    wu_msg w;
    wu_expect_hello(&c->s, c->name, 20000, &w);
    if (hello)
        *hello = w;
    else
        wu_msg_free(&w);
    wu_send_welcome(&c->s, c->name);
}

/* The fake server (scratch directory named by tag), the dataset synth of data_seed and worker
 * `name` with flags extra, registered (scene_worker). */
static void scene_start(scene *c, const char *tag, uint64_t data_seed, const char *name,
                        const char *const *extra, wu_msg *hello)
{
    memset(c, 0, sizeof *c);
    c->name = name;
    c->extra = extra;
    wu_server_start(&c->s, tag, true);
    wu_make_dataset(c->s.data_dir, "synth", 512, 128, F_IN, CLASSES, data_seed);
    scene_worker(c, hello);
}

/* Assigns c->g as the group numbered `group` (generation 1) on device dev, and serves the
 * worker until until(&c->L). */
static void scene_assign(scene *c, unsigned group, int dev, int timeout_ms,
                         bool (*until)(const run_log *), const char *what)
{
    wu_uuid(c->gid, 0x6, group);
    log_init(&c->L, c->gid, 1, c->g.ids, c->g.n);
    send_assign(&c->s, c->name, &c->g, c->gid, 1, "synth", dev, 0, NULL, NULL);
    pump(&c->s, &c->L, timeout_ms, until, what);
}

/* Stops the worker (stop_worker, recording into L, or c->L when L is NULL) and frees the
 * rest. */
static void scene_finish(scene *c, run_log *L)
{
    stop_worker(&c->s, c->pid, L ? L : &c->L);
    log_free(&c->L);
    group_free(&c->g);
    wu_server_stop(&c->s);
}

/* ---- train ------------------------------------------------------------------------------ */

static void scenario_train(void)
{
    static const char *const extra[] = {"--cpu-devices", "2", NULL};
    scene c;
    wu_msg w;
    scene_start(&c, "train", 11, "w-train", extra, &w);
    CHECK_INT_EQ(w.m.n_devices, 2);
    CHECK_STR_EQ(w.m.devices[1].name, "cpu1");
    CHECK_INT_EQ(w.m.n_running, 0);
    wu_msg_free(&w);
    group_def *g = &c.g;
    mlp_job(g, 32, 0, 40, 0.01, 1, 20, 20);
    mlp_job(g, 32, 0, 50, 0.003, 2, 20, 20);
    mlp_job(g, 32, 0, 60, 0.02, 3, 20, 20);
    scene_assign(&c, 1, 1, 120000, all_done, "every member to finish");
    run_log *L = &c.L;

    /* what each member reported */
    static const int64_t steps[3] = {40, 50, 60};
    static const int n_ckpt[3] = {1, 2, 2}, n_eval[3] = {2, 3, 3};
    for (int i = 0; i < 3; i++) {
        job_log *j = &L->job[i];
        CHECK_INT_EQ(j->started, 1);
        CHECK_INT_EQ(j->started_step, 1);
        CHECK(j->finished);
        CHECK_INT_EQ(j->finished_step, steps[i]);
        CHECK_INT_EQ(j->n_ckpt, n_ckpt[i]);
        for (int k = 0; k < j->n_ckpt; k++)
            CHECK_INT_EQ(j->ckpt_step[k], 20 * (k + 1));
        CHECK_INT_EQ(j->n_eval, n_eval[i]);
        CHECK_INT_EQ(j->eval_step[j->n_eval - 1], steps[i]);
    }
    CHECK(L->progress_full >= 1);
    CHECK_INT_EQ(L->resent, 0);

    /* the same specs in this process: bit-identical as the same array, close alone */
    const fb_job_spec *specs[3] = {&g->spec[0], &g->spec[1], &g->spec[2]};
    ref_run fused;
    reference(&fused, specs, 3, c.s.data_dir);
    for (int i = 0; i < 3; i++) {
        wu_models_compare(L->job[i].model, L->job[i].model_len, fused.model[i], fused.len[i], -1,
                          "worker vs in-process array");
        CHECK(L->job[i].loss == fused.loss[i]);
        CHECK(L->job[i].accuracy == fused.accuracy[i]);
        ref_run solo;
        reference(&solo, &specs[i], 1, c.s.data_dir);
        double e = wu_models_compare(L->job[i].model, L->job[i].model_len, solo.model[0],
                                     solo.len[0], 1e-4, "worker vs member alone");
        printf("member %d: bit-identical to the in-process array; %.3g from training alone\n", i,
               e);
        ref_free(&solo);
    }
    /* and the members really are different jobs */
    CHECK(L->job[0].model_len != L->job[1].model_len ||
          memcmp(L->job[0].model, L->job[1].model, L->job[0].model_len) != 0);
    ref_free(&fused);

    scene_finish(&c, NULL);
}

/* ---- detach, and a server restart ------------------------------------------------------- */

static bool all_started(const run_log *L)
{
    for (int i = 0; i < L->n_jobs; i++)
        if (!L->job[i].started) return false;
    return true;
}

static void scenario_detach(void)
{
    scene c;
    scene_start(&c, "detach", 12, "w-detach", NULL, NULL);
    group_def *g = &c.g;
    /* members 0 and 3 would train for hours: only a DETACH ends them */
    mlp_job(g, 48, 0, 100000000, 0.01, 1, 0, 0);
    mlp_job(g, 48, 0, 300, 0.003, 2, 100, 0);
    mlp_job(g, 48, 0, 400, 0.02, 3, 100, 0);
    mlp_job(g, 48, 0, 100000000, 0.005, 4, 0, 0);
    scene_assign(&c, 2, 0, 60000, all_started, "every member to start");
    run_log *L = &c.L;
    const char *gid = c.gid;
    wu_msg w;

    /* The server goes away for longer than three heartbeats, and comes back without any
     * memory of the worker: the worker must register again with its running group. */
    wu_server_restart(&c.s, 5 * WU_HEARTBEAT_MS);
    wu_expect_hello(&c.s, "w-detach", 20000, &w);
    CHECK_INT_EQ(w.m.n_running, 1);
    fb_wire_running *r = &w.m.running[0];
    CHECK_STR_EQ(r->group_id, gid);
    CHECK_INT_EQ(r->generation, 1);
    bool has_long = false;
    for (int k = 0; k < r->n_jobs; k++) {
        CHECK(r->steps[k] >= 1);
        has_long |= strcmp(r->job_ids[k], g->ids[0]) == 0;
    }
    CHECK(has_long);
    int64_t step_at_hello = r->steps[0];
    wu_msg_free(&w);
    wu_send_welcome(&c.s, "w-detach");

    /* it kept training while the server was away */
    double end = wu_now_ms() + 30000;
    bool moved = false;
    while (!moved) {
        CHECK(wu_now_ms() < end);
        CHECK(wu_recv(&c.s, 5000, &w));
        if (w.m.type == FB_WIRE_HEARTBEAT && !w.m.reply) {
            for (int k = 0; k < w.m.n_running; k++)
                for (int j = 0; j < w.m.running[k].n_jobs; j++)
                    moved |= strcmp(w.m.running[k].job_ids[j], g->ids[0]) == 0 &&
                             w.m.running[k].steps[j] > step_at_hello;
            wu_send_heartbeat_reply(&c.s, w.from, true);
        } else if (w.m.type == FB_WIRE_EVENT || w.m.type == FB_WIRE_PROGRESS) {
            if (w.m.type == FB_WIRE_EVENT) wu_send_ack(&c.s, w.from, &w.m);
            record(L, &w);
        }
        wu_msg_free(&w);
    }

    fb_wire_msg d = {.type = FB_WIRE_DETACH, .generation = 1};
    snprintf(d.group_id, sizeof d.group_id, "%s", gid);
    snprintf(d.job_id, sizeof d.job_id, "%s", g->ids[0]);
    snprintf(d.text, sizeof d.text, "cancelled by its tenant");
    wu_send(&c.s, "w-detach", &d, NULL, NULL, 0);
    /* a migration: member 3 leaves with its full state, to resume elsewhere */
    snprintf(d.job_id, sizeof d.job_id, "%s", g->ids[3]);
    snprintf(d.text, sizeof d.text, "migrated");
    d.keep_state = true;
    wu_send(&c.s, "w-detach", &d, NULL, NULL, 0);
    pump(&c.s, L, 120000, all_done, "the detaches and the others to finish");
    CHECK(L->job[0].detached);
    CHECK(!L->job[0].finished && !L->job[0].failed);
    CHECK(L->job[0].state == NULL);
    CHECK(L->job[0].detached_step > step_at_hello);
    CHECK(L->job[3].detached && !L->job[3].finished && !L->job[3].failed);
    CHECK(L->job[3].state != NULL);
    {
        /* the state of the very step it left at: nothing to train again */
        fb_st_file *f = NULL;
        char msg[512], step[32];
        CHECK_INT_EQ(fb_st_parse_buffer(L->job[3].state, L->job[3].state_len, &f, msg, sizeof msg),
                     0);
        CHECK_STR_EQ(fb_st_metadata_get(f, "format"), "fusebox-checkpoint-1");
        snprintf(step, sizeof step, "%lld", (long long)L->job[3].detached_step);
        CHECK_STR_EQ(fb_st_metadata_get(f, "step"), step);
        fb_st_close(f);
        printf("migrated member left at step %lld with %zu bytes of state (%s)\n",
               (long long)L->job[3].detached_step, L->job[3].state_len, L->job[3].detached_text);
    }
    for (int i = 1; i < 3; i++) {
        CHECK(L->job[i].finished);
        CHECK_INT_EQ(L->job[i].finished_step, g->spec[i].steps);
        CHECK_INT_EQ(L->job[i].started, 1);
    }
    printf("detached at step %lld; %d events were resent after the restart\n",
           (long long)L->job[0].detached_step, L->resent);

    /* the members that stayed followed their own trajectory (the array shrank under them) */
    for (int i = 1; i < 3; i++) {
        const fb_job_spec *one = &g->spec[i];
        ref_run solo;
        reference(&solo, &one, 1, c.s.data_dir);
        wu_models_compare(L->job[i].model, L->job[i].model_len, solo.model[0], solo.len[0], 1e-3,
                          "detach scenario: worker vs member alone");
        ref_free(&solo);
    }

    /* the group is over: the heartbeat lists nothing */
    end = wu_now_ms() + 10000;
    for (;;) {
        CHECK(wu_now_ms() < end);
        CHECK(wu_recv(&c.s, 5000, &w));
        bool empty = w.m.type == FB_WIRE_HEARTBEAT && !w.m.reply && w.m.n_running == 0;
        if (w.m.type == FB_WIRE_HEARTBEAT && !w.m.reply)
            wu_send_heartbeat_reply(&c.s, w.from, true);
        wu_msg_free(&w);
        if (empty) break;
    }
    scene_finish(&c, NULL);
}

/* ---- drain and resume ------------------------------------------------------------------- */

static bool drained(const run_log *L)
{
    return all_done(L) && L->drain;
}

/* Where scenario_drain holds the array before the drain, and the hold it sends the array on
 * to as the drain is asked for. */
#define DRAIN_HOLD 150
#define DRAIN_HOLD_NEXT 400

static void hook_hold(const char *dir, const char *path, long long step);
static void serve_until_held(scene *c, const char *held, long long step);
static long long hook_file_step(const char *path);

static void scenario_drain(void)
{
    /* the test step hook places the drain mid-run on any machine, not the job's size */
    CHECK(setenv(FB_AGENT_TEST_HOOKS_ENV, "1", 1) == 0);
    const char *t = getenv("TMPDIR");
    char dir[700];
    snprintf(dir, sizeof dir, "%s/fbworker-draindir-XXXXXX", t && *t ? t : "/tmp");
    CHECK(mkdtemp(dir) != NULL);
    /* reports at the first step, at a member's end and on entering a hold (each after steps,
     * so with samples, which record checks), not every --progress-ms while held: how long the
     * array waits held is the test's real time, which a sanitizer makes longer */
    const char *extra[] = {"--test-step-hook", dir, "--progress-ms", "3600000", NULL};
    scene c;
    scene_start(&c, "drain", 13, "w-drain", extra, NULL);
    group_def *g = &c.g;
    /* dropout and a cosine schedule: the random streams and the learning rate must continue
     * exactly where they stopped */
    mlp_job(g, 128, 0.1, 600, 0.01, 1, 100, 100);
    mlp_job(g, 128, 0.1, 700, 0.003, 2, 100, 100);
    mlp_job(g, 128, 0.1, 800, 0.02, 3, 100, 100);
    char hold[800], held[800];
    snprintf(hold, sizeof hold, "%s/hold-%s", dir, g->ids[0]);
    snprintf(held, sizeof held, "%s/held-%s", dir, g->ids[0]);
    hook_hold(dir, hold, DRAIN_HOLD); /* before the array exists: it cannot pass it first */
    scene_assign(&c, 3, 0, 60000, all_started, "every member to start");
    serve_until_held(&c, held, DRAIN_HOLD);
    run_log *L = &c.L;
    const char *gid = c.gid;
    wu_msg w;
    /* sent on, and drained on its way once it has left the hold (its held file gone, or
     * already the next hold's): the drain lands past the checkpoint of step 100 and no
     * later than the next hold, before any member's end */
    hook_hold(dir, hold, DRAIN_HOLD_NEXT);
    double end = wu_now_ms() + 60000;
    while (hook_file_step(held) == DRAIN_HOLD) {
        CHECK(wu_now_ms() < end); /* a liveness bound */
        if (!wu_next(&c.s, 5, true, &w)) continue;
        record(L, &w);
        wu_msg_free(&w);
    }
    CHECK(kill(c.pid, SIGTERM) == 0);
    pump(&c.s, L, 60000, drained, "every member to drain");
    CHECK_STR_EQ(L->drain_text, "draining");
    CHECK_INT_EQ(wu_wait(c.pid, 20000), 0);
    int64_t at = L->job[0].detached_step;
    for (int i = 0; i < 3; i++) {
        job_log *j = &L->job[i];
        if (!j->detached) {
            fprintf(stderr, "member %d was not drained mid-run\n", i);
            dump(L);
            abort();
        }
        CHECK_STR_EQ(j->detached_text, "drained");
        CHECK(j->state != NULL);
        CHECK_INT_EQ(j->detached_step, at);
        CHECK(!j->finished);
        CHECK(j->n_ckpt >= 1 && j->ckpt_step[0] == 100);
    }
    CHECK(at >= DRAIN_HOLD && at <= DRAIN_HOLD_NEXT);
    printf("held at step %d, sent on and drained at step %lld\n", DRAIN_HOLD, (long long)at);
    CHECK(unlink(hold) == 0); /* the resumed array trains to its end */

    /* a second worker picks the group up where the first left it */
    scene_worker(&c, &w);
    CHECK_INT_EQ(w.m.n_running, 0);
    wu_msg_free(&w);
    run_log R;
    log_init(&R, gid, 2, g->ids, g->n);
    void *states[3] = {L->job[0].state, L->job[1].state, L->job[2].state};
    size_t lens[3] = {L->job[0].state_len, L->job[1].state_len, L->job[2].state_len};
    send_assign(&c.s, "w-drain", g, gid, 2, "synth", 0, at, states, lens);
    pump(&c.s, &R, 180000, all_done, "the resumed members to finish");

    const fb_job_spec *specs[3] = {&g->spec[0], &g->spec[1], &g->spec[2]};
    ref_run whole;
    reference(&whole, specs, 3, c.s.data_dir);
    for (int i = 0; i < 3; i++) {
        CHECK(R.job[i].finished);
        CHECK_INT_EQ(R.job[i].started_step, at + 1);
        CHECK_INT_EQ(R.job[i].finished_step, g->spec[i].steps);
        wu_models_compare(R.job[i].model, R.job[i].model_len, whole.model[i], whole.len[i], -1,
                          "drained and resumed vs uninterrupted");
        CHECK(R.job[i].loss == whole.loss[i]);
    }
    printf("resumed from step %lld: bit-identical to the uninterrupted run\n", (long long)at);
    ref_free(&whole);
    scene_finish(&c, &R);
    log_free(&R);
    et_rmtree(dir);
}

/* ---- time sharing ------------------------------------------------------------------------ */

/* What the PROGRESS reports of the two groups sharing a device said. */
typedef struct share_obs {
    const char *id[2];
    int reports[2];
    bool compute_exact; /* every report: 10 ms of compute per step, no I/O, no communication */
    double idle_max[2]; /* the largest idle time per step in a PROGRESS */
} share_obs;

static void share_watch(const wu_msg *w, void *arg)
{
    share_obs *o = arg;
    if (w->m.type != FB_WIRE_PROGRESS) return;
    int g = strcmp(w->m.group_id, o->id[0]) == 0 ? 0 : 1;
    CHECK_STR_EQ(w->m.group_id, o->id[g]);
    o->reports[g]++;
    if (w->m.compute_ms != 10.0 || w->m.io_ms != 0 || w->m.comm_ms != 0)
        o->compute_exact = false;
    if (w->m.idle_ms > o->idle_max[g]) o->idle_max[g] = w->m.idle_ms;
}

/* The grants of the model's log from line `from` on as letters (A, B), and each one's count. */
static void share_grants(const ts_model *m, int from, char *out, size_t cap, int count[2])
{
    char words[4096];
    ts_model_grants(m, from, words, sizeof words);
    size_t n = 0;
    count[0] = count[1] = 0;
    for (const char *p = words; *p && n + 1 < cap; p++)
        if ((p == words || p[-1] == ' ') && (*p == 'A' || *p == 'B')) {
            out[n++] = *p;
            count[*p - 'A']++;
        }
    out[n] = '\0';
}

static void scenario_share(void)
{
    /* two groups of the same model on one device, for good, on scripted steps of 10 ms and
     * the test's clock (tests/worker/turns_script.h) */
    scene c;
    memset(&c, 0, sizeof c);
    c.name = "w-share";
    wu_server_start(&c.s, "share", true);
    wu_make_dataset(c.s.data_dir, "synth", 512, 128, F_IN, CLASSES, 15);
    ts_script t;
    ts_start(&c.s, &t, 1000);
    const char *const extra[] = {"--test-clock", t.clock_path, "--test-step-ms", "*=10",
                                 "--test-step-hook", t.hook_dir, NULL};
    c.extra = extra;
    scene_worker(&c, NULL);
    group_def *ga = &c.g;
    group_def gb = {0};
    mlp_job(ga, 256, 0, 100000000, 0.01, 1, 0, 0);
    mlp_job(&gb, 256, 0, 100000000, 0.01, 1, 0, 0);
    wu_uuid(gb.ids[0], 0x10b, 77);
    char id_a[FB_WIRE_ID_LEN + 1], id_b[FB_WIRE_ID_LEN + 1];
    wu_uuid(id_a, 0x6, 20);
    wu_uuid(id_b, 0x6, 21);
    share_obs o = {.id = {id_a, id_b}, .compute_exact = true};
    ts_on_msg = share_watch;
    ts_on_msg_arg = &o;
    const int dev0[1] = {0};
    ts_model m;
    ts_model_init(&m, 1);

    /* A first (so that it is the older), then B, both at 1000 ms; B's share becomes 0.25 */
    send_assign(&c.s, "w-share", ga, id_a, 1, "synth", 0, 0, NULL, NULL);
    ts_model_join(&m, id_a, dev0, 1, 1.0, 10, 1000);
    ts_model_run(&m, 1000);
    ts_wait(&c.s, &t, m.log.n, NULL, NULL);
    send_assign(&c.s, "w-share", &gb, id_b, 1, "synth", 0, 0, NULL, NULL);
    ts_model_join(&m, id_b, dev0, 1, 1.0, 10, 1000);
    ts_wait(&c.s, &t, 1, "join", id_b);
    fb_wire_msg rb = {.type = FB_WIRE_REBALANCE,
                      .generation = 1,
                      .n_split = 1,
                      .split = {32},
                      .time_share = 0.25};
    snprintf(rb.group_id, sizeof rb.group_id, "%s", id_b);
    wu_send(&c.s, "w-share", &rb, NULL, NULL, 0);
    ts_wait(&c.s, &t, 1, "share", id_b);
    ts_model_share(&m, 1, 0.25, 1000);

    /* Shares 1 : 0.25 give A four times B's device time: 500 ms in one jump */
    int from = m.log.n;
    ts_set(&t, 1500);
    ts_model_run(&m, 1500);
    ts_wait(&c.s, &t, m.log.n, NULL, NULL);
    ts_expect(&t, &m.log);
    char order[512];
    int count[2];
    share_grants(&m, from, order, sizeof order, count);
    printf("shares 1 : 0.25, 1000..1500 ms: %s\n", order);
    /* worked out by hand: B goes when A's first step ends (B's clock 0, A's 10), then A four
     * times until their clocks meet at 40 (A first at a tie: older), and so on */
    CHECK(strncmp(order, "BAAAABAAAAB", 11) == 0);
    CHECK_INT_EQ(count[0], 40);
    CHECK_INT_EQ(count[1], 10); /* the smaller share is not starved */

    /* equal shares give equal time: they alternate from the next turn on */
    rb.time_share = 1.0;
    wu_send(&c.s, "w-share", &rb, NULL, NULL, 0);
    ts_wait(&c.s, &t, 2, "share", id_b);
    ts_model_share(&m, 1, 1.0, 1500);
    from = m.log.n;
    for (int64_t ms = 1510; ms <= 1700; ms += 10) {
        ts_set(&t, ms);
        ts_model_run(&m, ms);
        ts_wait(&c.s, &t, m.log.n, NULL, NULL);
        ts_expect(&t, &m.log);
    }
    share_grants(&m, from, order, sizeof order, count);
    printf("shares 1 : 1, 1500..1700 ms: %s\n", order);
    CHECK_STR_EQ(order, "BABABABABABABABABABA");
    /* every report says the script's 10 ms per step, and each group waited for the device
     * while the other had its turn */
    CHECK(o.reports[0] > 0 && o.reports[1] > 0);
    CHECK(o.compute_exact);
    CHECK(o.idle_max[0] > 0 && o.idle_max[1] > 0);
    ts_on_msg = NULL;

    /* a DETACH without a job id stops a whole group at once, without a word */
    for (int k = 0; k < 2; k++) {
        fb_wire_msg d = {.type = FB_WIRE_DETACH, .generation = 1};
        snprintf(d.group_id, sizeof d.group_id, "%s", k ? id_b : id_a);
        wu_send(&c.s, "w-share", &d, NULL, NULL, 0);
    }
    wu_msg w;
    double end = wu_now_ms() + 10000;
    for (bool empty = false; !empty;) {
        CHECK(wu_now_ms() < end);
        /* a heartbeat per 200 ms of the clock, or a HELLO: a worker whose replies came
         * after three of its heartbeats' times registers again (WELCOMEd here) */
        ts_set(&t, t.now_ms + 200);
        for (bool beat = false; !beat;) {
            CHECK(wu_recv(&c.s, 5000, &w));
            CHECK(w.m.type != FB_WIRE_EVENT);
            beat = (w.m.type == FB_WIRE_HEARTBEAT && !w.m.reply) || w.m.type == FB_WIRE_HELLO;
            empty = w.m.type == FB_WIRE_HEARTBEAT && !w.m.reply && w.m.n_running == 0;
            wu_answer(&c.s, &w, false);
            wu_msg_free(&w);
        }
    }
    run_log L;
    log_init(&L, id_a, 1, ga->ids, 1);
    scene_finish(&c, &L);
    CHECK_INT_EQ(L.n_seen, 0);
    log_free(&L);
    group_free(&gb);
    ts_stop(&t);
    ts_log_free(&m.log);
}

/* ---- the outbox bound (an agent in this process) ------------------------------------------ */

typedef struct agent_run {
    fb_agent *a;
    int rc;
    char msg[512];
} agent_run;

static void *agent_main(void *arg)
{
    agent_run *r = arg;
    r->rc = fb_agent_run(r->a, r->msg, sizeof r->msg);
    return NULL;
}

static void scenario_outbox(void)
{
    wu_server s;
    wu_server_start(&s, "outbox", true);
    wu_make_dataset(s.data_dir, "synth", 512, 128, F_IN, CLASSES, 16);
    char pub[41], sec[41], msg[512];
    CHECK_INT_EQ(fb_wire_key_load(s.worker_key_file, pub, sec, msg, sizeof msg), 0);
    /* an outbox bound of one byte: every unacknowledged checkpoint is over it */
    fb_agent_opts o = {.server = s.endpoint,
                       .server_key = s.pub,
                       .public_key = pub,
                       .secret_key = sec,
                       .name = "w-outbox",
                       .threads_per_device = 1,
                       .data_dir = s.data_dir,
                       .heartbeat_ms = WU_HEARTBEAT_MS,
                       .progress_ms = 50,
                       .outbox_bytes = 1};
    agent_run r = {0};
    CHECK_INT_EQ(fb_agent_new(&r.a, &o, msg, sizeof msg), FB_OK);
    pthread_t th;
    CHECK(pthread_create(&th, NULL, agent_main, &r) == 0);
    wu_msg w;
    wu_expect_hello(&s, "w-outbox", 20000, &w);
    wu_msg_free(&w);
    wu_send_welcome(&s, "w-outbox");

    group_def g = {0};
    mlp_job(&g, 16, 0, 200, 0.01, 1, 0, 20);
    char gid[FB_WIRE_ID_LEN + 1];
    wu_uuid(gid, 0x6, 30);
    send_assign(&s, "w-outbox", &g, gid, 1, "synth", 0, 0, NULL, NULL);
    /* nothing is acknowledged: the nine checkpoints all go out once */
    int ckpts = 0;
    bool finished = false;
    while (!finished) {
        CHECK(wu_next(&s, 60000, false, &w));
        if (w.m.type == FB_WIRE_EVENT) {
            ckpts += w.m.event == FB_EV_CHECKPOINTED;
            finished = w.m.event == FB_EV_FINISHED;
        }
        wu_msg_free(&w);
    }
    CHECK_INT_EQ(ckpts, 9);

    /* registering again resends what is unacknowledged: the newest checkpoint only */
    wu_send_heartbeat_reply(&s, "w-outbox", false);
    wu_expect_hello(&s, "w-outbox", 10000, &w);
    wu_msg_free(&w);
    wu_send_welcome(&s, "w-outbox");
    int started = 0, resent_ckpts = 0;
    int64_t ckpt_step = 0;
    finished = false;
    while (!finished) {
        CHECK(wu_next(&s, 10000, true, &w));
        if (w.m.type == FB_WIRE_EVENT) {
            started += w.m.event == FB_EV_STARTED;
            if (w.m.event == FB_EV_CHECKPOINTED) {
                resent_ckpts++;
                ckpt_step = w.m.step;
            }
            finished = w.m.event == FB_EV_FINISHED;
        }
        wu_msg_free(&w);
    }
    CHECK_INT_EQ(started, 1);
    CHECK_INT_EQ(resent_ckpts, 1);
    CHECK_INT_EQ(ckpt_step, 180);

    fb_agent_drain(r.a);
    CHECK(pthread_join(th, NULL) == 0);
    CHECK_INT_EQ(r.rc, FB_OK);
    fb_agent_free(r.a);
    group_free(&g);
    wu_server_stop(&s);
}

/* ---- bad input -------------------------------------------------------------------------- */

static void send_text(wu_server *s, const char *to, const char *text)
{
    const void *f[1] = {text};
    size_t len[1] = {strlen(text)};
    wu_send_frames(s, to, f, len, 1);
}

static bool three_done(const run_log *L)
{
    return all_done(L);
}

static void scenario_bad(void)
{
    wu_server s;
    wu_server_start(&s, "bad", true);
    wu_make_dataset(s.data_dir, "synth", 512, 128, F_IN, CLASSES, 14);

    /* configured entirely through the environment */
    char e_server[400], e_skey[700], e_key[700], e_data[700];
    snprintf(e_server, sizeof e_server, "FUSEBOX_WORKER_SERVER=%s", s.endpoint);
    snprintf(e_skey, sizeof e_skey, "FUSEBOX_WORKER_SERVER_KEY=%s", s.server_key_file);
    snprintf(e_key, sizeof e_key, "FUSEBOX_WORKER_KEY=%s", s.worker_key_file);
    snprintf(e_data, sizeof e_data, "FUSEBOX_WORKER_DATA_DIR=%s", s.data_dir);
    const char *env[] = {e_server,
                         e_skey,
                         e_key,
                         e_data,
                         "FUSEBOX_WORKER_NAME=w-bad",
                         "FUSEBOX_WORKER_HEARTBEAT_MS=200",
                         "FUSEBOX_WORKER_PROGRESS_MS=50",
                         "FUSEBOX_WORKER_THREADS_PER_DEVICE=1",
                         NULL};
    char *argv[] = {(char *)wu_worker_binary(), NULL};
    pid_t pid = wu_spawn(argv, env, NULL);
    wu_msg w;
    wu_expect_hello(&s, "w-bad", 20000, &w);
    wu_msg_free(&w);
    wu_send_welcome(&s, "w-bad");

    /* frames that are no message, or not one for this worker */
    send_text(&s, "w-bad", "garbage \x01\x02");
    send_text(&s, "w-bad", "[1, 2, 3]");
    send_text(&s, "w-bad", "{\"v\": 99, \"type\": \"heartbeat\", \"known\": true}");
    send_text(&s, "w-bad", "{\"v\": 1, \"type\": \"teleport\"}");
    send_text(&s, "w-bad", "{\"v\": 1, \"type\": \"ack\", \"seq\": 0}");
    send_text(&s, "w-bad", "{\"v\": 1, \"type\": \"ack\", \"seq\": 123456}");
    send_text(&s, "w-bad", "{\"v\": 1, \"type\": \"heartbeat\", \"running\": []}");
    const void *two[2] = {"{\"v\": 1, \"type\": \"drain\"}", "unreferenced blob"};
    size_t two_len[2] = {strlen(two[0]), strlen(two[1])};
    wu_send_frames(&s, "w-bad", two, two_len, 2); /* a drain with a stray frame: dropped */
    char unknown[FB_WIRE_ID_LEN + 1];
    wu_uuid(unknown, 0x6, 999);
    fb_wire_msg d = {.type = FB_WIRE_DETACH, .generation = 1};
    snprintf(d.group_id, sizeof d.group_id, "%s", unknown);
    wu_send(&s, "w-bad", &d, NULL, NULL, 0);
    fb_wire_msg rb = {
        .type = FB_WIRE_REBALANCE, .generation = 1, .n_split = 1, .split = {32}, .time_share = 0.5};
    snprintf(rb.group_id, sizeof rb.group_id, "%s", unknown);
    wu_send(&s, "w-bad", &rb, NULL, NULL, 0);

    /* a dataset the worker does not have: every member fails with a clear text */
    group_def nods = {0};
    mlp_job(&nods, 16, 0, 50, 0.01, 1, 0, 0);
    mlp_job(&nods, 16, 0, 50, 0.02, 2, 0, 0);
    char gid_nods[FB_WIRE_ID_LEN + 1];
    wu_uuid(gid_nods, 0x6, 10);
    {
        /* the specs name synth; the group names nosuch, as a server would for a job whose
         * dataset this worker lacks */
        group_def other = {0};
        for (int i = 0; i < 2; i++) {
            char *j = nods.json[i], *p = strstr(j, "\"synth\"");
            CHECK(p != NULL);
            char buf[4096];
            snprintf(buf, sizeof buf, "%.*s\"nosuch\"%s", (int)(p - j), j, p + 7);
            other.n++;
            snprintf(other.ids[i], sizeof other.ids[i], "%s", nods.ids[i]);
            wu_spec(&other.spec[i], &other.json[i], "%s", buf);
        }
        run_log N;
        log_init(&N, gid_nods, 1, other.ids, other.n);
        send_assign(&s, "w-bad", &other, gid_nods, 1, "nosuch", 0, 0, NULL, NULL);
        pump(&s, &N, 30000, all_done, "members of a group without its dataset to fail");
        for (int i = 0; i < 2; i++) {
            CHECK(N.job[i].failed);
            CHECK(strstr(N.job[i].failed_text,
                         "dataset nosuch is not in the worker's data directory") != NULL);
        }
        log_free(&N);
        group_free(&other);
    }

    /* a device the worker does not have */
    char gid_dev[FB_WIRE_ID_LEN + 1];
    wu_uuid(gid_dev, 0x6, 11);
    run_log D;
    log_init(&D, gid_dev, 1, nods.ids, nods.n);
    send_assign(&s, "w-bad", &nods, gid_dev, 1, "synth", 5, 0, NULL, NULL);
    pump(&s, &D, 30000, all_done, "members on a missing device to fail");
    for (int i = 0; i < 2; i++) {
        CHECK(D.job[i].failed);
        CHECK(strstr(D.job[i].failed_text, "device 5 does not exist") != NULL);
    }
    log_free(&D);

    /* a group with one good member and three bad ones, each of which fails alone */
    group_def g = {0};
    mlp_job(&g, 24, 0, 2000, 0.01, 1, 0, 0); /* good */
    mlp_job(&g, 24, 0, 100, 0.01, 2, 0, 0);  /* its spec will not parse */
    mlp_job(&g, 40, 0, 100, 0.01, 3, 0, 0);  /* another model: another fusion key */
    mlp_job(&g, 24, 0, 100, 0.01, 4, 0, 0);  /* resumes from a broken checkpoint */
    free(g.json[1]);
    g.json[1] = strdup("{\"name\": \"broken\", \"dataset\": ");
    char gid[FB_WIRE_ID_LEN + 1];
    wu_uuid(gid, 0x6, 12);
    run_log L;
    log_init(&L, gid, 1, g.ids, g.n);
    {
        fb_wire_msg m = {.type = FB_WIRE_ASSIGN,
                         .generation = 1,
                         .n_group_devices = 1,
                         .parallel_data = 1,
                         .parallel_pipeline = 1,
                         .n_split = 1,
                         .time_share = 1.0,
                         .split = {32}};
        snprintf(m.group_id, sizeof m.group_id, "%s", gid);
        snprintf(m.fusion_key, sizeof m.fusion_key, "%s", g.spec[0].fusion_key);
        snprintf(m.dataset, sizeof m.dataset, "synth");
        m.n_members = 4;
        m.members = calloc(4, sizeof *m.members);
        CHECK(m.members != NULL);
        for (int i = 0; i < 4; i++) {
            snprintf(m.members[i].job_id, sizeof m.members[i].job_id, "%s", g.ids[i]);
            wu_uuid(m.members[i].tenant_id, TENANT, 1);
            m.members[i].spec = strdup(g.json[i]);
        }
        m.members[3].resume_blob = 1;
        const void *blob[1] = {"this is not a checkpoint"};
        size_t blob_len[1] = {strlen(blob[0])};
        wu_send(&s, "w-bad", &m, blob, blob_len, 1);
        /* the same assignment again is a duplicate, and a DETACH of a stale generation is
         * dropped: member 0 must still train to its end */
        wu_send(&s, "w-bad", &m, blob, blob_len, 1);
        fb_wire_msg stale = {.type = FB_WIRE_DETACH, .generation = 7};
        snprintf(stale.group_id, sizeof stale.group_id, "%s", gid);
        snprintf(stale.job_id, sizeof stale.job_id, "%s", g.ids[0]);
        wu_send(&s, "w-bad", &stale, NULL, NULL, 0);
        fb_wire_msg_free(&m);
    }
    pump(&s, &L, 120000, three_done, "the good member to finish and the others to fail");
    CHECK(L.job[0].finished);
    CHECK_INT_EQ(L.job[0].started, 1);
    CHECK(L.job[1].failed && strstr(L.job[1].failed_text, "does not parse") != NULL);
    CHECK(L.job[2].failed && strstr(L.job[2].failed_text, "fusion key") != NULL);
    CHECK(L.job[3].failed && strstr(L.job[3].failed_text, "does not restore") != NULL);
    CHECK_INT_EQ(L.resent, 0);

    /* after all that it still runs, and registers again when the server asks */
    CHECK(wu_alive(pid));
    wu_send_heartbeat_reply(&s, "w-bad", false);
    wu_expect_hello(&s, "w-bad", 10000, &w);
    wu_msg_free(&w);
    wu_send_welcome(&s, "w-bad");
    double end = wu_now_ms() + 10000;
    for (;;) {
        CHECK(wu_now_ms() < end);
        CHECK(wu_recv(&s, 5000, &w));
        bool beat = w.m.type == FB_WIRE_HEARTBEAT && !w.m.reply;
        wu_msg_free(&w);
        if (beat) break;
    }
    CHECK(wu_alive(pid));
    stop_worker(&s, pid, &L);
    log_free(&L);
    group_free(&g);
    group_free(&nods);
    wu_server_stop(&s);
}

/* ---- authentication ----------------------------------------------------------------------- */

static void scenario_auth(void)
{
    wu_server s;
    wu_server_start(&s, "auth", false);
    pid_t pid = wu_start_worker(&s, "w-auth", NULL);
    /* the first attempt comes once the worker is up, which a loaded machine (or a sanitizer)
     * can delay by seconds: the time to watch starts at the first refusal */
    wu_msg w;
    double end = wu_now_ms() + 20000;
    while (atomic_load(&s.zap_denied) == 0) {
        CHECK(wu_now_ms() < end);
        CHECK(!wu_recv(&s, 50, &w));
    }
    /* several heartbeats' worth of HELLOs and reconnections: none gets through */
    CHECK(!wu_recv(&s, 3000, &w));
    CHECK_INT_EQ(atomic_load(&s.zap_allowed), 0);
    CHECK(wu_alive(pid));
    CHECK(kill(pid, SIGTERM) == 0);
    CHECK_INT_EQ(wu_wait(pid, 20000), 0);
    CHECK(!wu_recv(&s, 200, &w));
    wu_server_stop(&s);
}

/* ---- the command line ---------------------------------------------------------------------- */

static void scenario_cli(void)
{
    wu_server s;
    wu_server_start(&s, "cli", true);
    const char *d = s.dir;
    const char *ep = s.endpoint, *sk = s.server_key_file, *wk = s.worker_key_file;

    wu_expect_run(d, (const char *[]){"--help", NULL}, NULL, 0, "usage: fusebox-worker");
    wu_expect_run(d, (const char *[]){NULL}, NULL, 2,
                  "--server (or FUSEBOX_WORKER_SERVER) is required");
    wu_expect_run(d, (const char *[]){"--bogus", NULL}, NULL, 2, "usage");
    wu_expect_run(d, (const char *[]){"--server", ep, "--server-key", sk, NULL}, NULL, 2,
                  "--key (or FUSEBOX_WORKER_KEY) is required");
    wu_expect_run(d,
                  (const char *[]){"--server", ep, "--server-key", sk, "--key", wk, "--cpu-devices",
                                   "0", NULL},
                  NULL, 2, "--cpu-devices needs an integer");
    wu_expect_run(d,
                  (const char *[]){"--server", ep, "--server-key", sk, "--key", wk,
                                   "--threads-per-device", "2x", NULL},
                  NULL, 2, "--threads-per-device needs an integer");
    wu_expect_run(d, (const char *[]){"--server", ep, "--server-key", sk, "--key", wk, NULL},
                  (const char *[]){"FUSEBOX_WORKER_HEARTBEAT_MS=5", NULL}, 2,
                  "FUSEBOX_WORKER_HEARTBEAT_MS needs an integer");
    wu_expect_run(d,
                  (const char *[]){"--server", ep, "--server-key", sk, "--key", wk, "--name",
                                   "Bad Name", NULL},
                  NULL, 2, "not a worker name");
    wu_expect_run(
        d, (const char *[]){"--server", ep, "--server-key", sk, "--key", "/nonexistent/k", NULL},
        NULL, 2, "worker key");
    /* a public key alone is not a keypair */
    char pub_only[700];
    snprintf(pub_only, sizeof pub_only, "%s/public.key", d);
    FILE *pf = fopen(pub_only, "w");
    CHECK(pf != NULL);
    fprintf(pf, "public: %s\n", s.pub);
    CHECK(fclose(pf) == 0);
    wu_expect_run(
        d, (const char *[]){"--server", ep, "--server-key", pub_only, "--key", pub_only, NULL},
        NULL, 2, "worker key");
    /* a flag wins over its variable */
    wu_expect_run(d,
                  (const char *[]){"--server", ep, "--server-key", sk, "--key", wk, "--cpu-devices",
                                   "x", NULL},
                  (const char *[]){"FUSEBOX_WORKER_CPU_DEVICES=2", NULL}, 2,
                  "--cpu-devices needs an integer in [1, 64], not 'x'");
    wu_expect_run(
        d, (const char *[]){"--server", "not an endpoint", "--server-key", sk, "--key", wk, NULL},
        NULL, 2, "cannot connect");

    /* --gen-key writes a keypair once, mode 0600, and prints its public key */
    char key[700], out[700];
    snprintf(key, sizeof key, "%s/new.key", d);
    snprintf(out, sizeof out, "%s/gen.out", d);
    CHECK_INT_EQ(wu_run((const char *[]){"--gen-key", key, NULL}, NULL, out), 0);
    char *printed = wu_read_file(out, NULL), pub[41], sec[41], msg[256];
    CHECK(printed != NULL);
    CHECK_INT_EQ(fb_wire_key_load(key, pub, sec, msg, sizeof msg), 0);
    CHECK(strncmp(printed, pub, 40) == 0 && printed[40] == '\n');
    free(printed);
    struct stat st;
    CHECK(stat(key, &st) == 0);
    CHECK_INT_EQ(st.st_mode & 0777, 0600);
    wu_expect_run(d, (const char *[]){"--gen-key", key, NULL}, NULL, 1, "");
    char pub2[41];
    CHECK_INT_EQ(fb_wire_key_load(key, pub2, NULL, msg, sizeof msg), 0);
    CHECK_STR_EQ(pub2, pub); /* not overwritten */

    /* names */
    char name[128];
    fb_agent_name_sanitize("Build-Host_7.Example.COM", name, sizeof name);
    CHECK_STR_EQ(name, "build-host_7.example.com");
    fb_agent_name_sanitize("--my host!", name, sizeof name);
    CHECK_STR_EQ(name, "my-host-");
    fb_agent_name_sanitize("", name, sizeof name);
    CHECK_STR_EQ(name, "worker");
    fb_agent_name_sanitize("\xc3\xa4\xc3\xb6", name, sizeof name);
    CHECK_STR_EQ(name, "worker");
    char longname[200];
    memset(longname, 'a', sizeof longname - 1);
    longname[sizeof longname - 1] = '\0';
    fb_agent_name_sanitize(longname, name, sizeof name);
    CHECK_INT_EQ(strlen(name), 63);
    CHECK(fb_agent_name_valid(name));
    fb_agent_default_name(name, sizeof name);
    CHECK(fb_agent_name_valid(name));
    CHECK(fb_agent_name_valid("w-1.a_b"));
    CHECK(!fb_agent_name_valid("-w"));
    CHECK(!fb_agent_name_valid("W"));
    CHECK(!fb_agent_name_valid(""));
    CHECK(!fb_agent_name_valid(longname));

    /* fb_agent_new refuses bad options and leaves its output alone */
    fb_agent *a = (fb_agent *)&s, *before = a;
    fb_agent_opts o = {.server = ep, .server_key = s.pub, .public_key = s.pub, .secret_key = s.sec};
    o.server_key = "short";
    CHECK_INT_EQ(fb_agent_new(&a, &o, msg, sizeof msg), FB_ERR_OUT_OF_RANGE);
    CHECK(strstr(msg, "server key") != NULL);
    o.server_key = s.pub;
    o.heartbeat_ms = 50;
    CHECK_INT_EQ(fb_agent_new(&a, &o, msg, sizeof msg), FB_ERR_OUT_OF_RANGE);
    o.heartbeat_ms = 0;
    o.cpu_devices = FB_WIRE_MAX_DEVICES + 1;
    CHECK_INT_EQ(fb_agent_new(&a, &o, msg, sizeof msg), FB_ERR_OUT_OF_RANGE);
    o.cpu_devices = 0;
    o.name = "UPPER";
    CHECK_INT_EQ(fb_agent_new(&a, &o, msg, sizeof msg), FB_ERR_OUT_OF_RANGE);
    o.name = NULL;
    o.server = "nonsense";
    CHECK_INT_EQ(fb_agent_new(&a, &o, msg, sizeof msg), FB_ERR_OUT_OF_RANGE);
    CHECK(a == before);
    o.server = ep;
    CHECK_INT_EQ(fb_agent_new(&a, &o, msg, sizeof msg), FB_OK);
    CHECK(a != before);
    fb_agent_free(a);
    fb_agent_free(NULL);
    wu_server_stop(&s);
}

/* ---- init weights and a built-in under another name ----------------------------------- */

/* A member of the "init" scenario: the MLP of mlp_job on dataset "my-alias", init as given. */
static void init_job(group_def *g, int hidden, double lr, int64_t steps, const char *init)
{
    int i = g->n++;
    CHECK(i < MAX_JOBS);
    wu_uuid(g->ids[i], 0x1a1, (unsigned long long)(i + 1));
    wu_spec(&g->spec[i], &g->json[i],
            "{\"name\": \"i%d\", \"dataset\": \"my-alias\", \"model\": {\"input\": [%d], "
            "\"layers\": [{\"type\": \"linear\", \"out\": %d}, {\"type\": \"relu\"}, "
            "{\"type\": \"linear\", \"out\": %d}]}, \"batch_size\": 32, \"steps\": %lld, "
            "\"optimizer\": {\"type\": \"adam\", \"lr\": %g}, \"seed\": %d, \"data_seed\": 5%s}",
            i, F_IN, hidden, CLASSES, (long long)steps, lr, 30 + i, init);
}

/*
 * The worker takes a member's initial weights only from the ASSIGN: a spec that names a path
 * fails (it opens no path a spec names), a member whose init has no weights in the message
 * fails, a member whose weights do not fit fails alone, the one whose weights fit starts from
 * them, and a member without init trains as ever.  The group's dataset is a tenant's alias
 * "my-alias" of the public dataset synth (ASSIGN builtin): the specs name the alias, the
 * worker reads synth.
 */
static void scenario_init(void)
{
    scene c;
    scene_start(&c, "init", 17, "w-init", NULL, NULL);
    /* the weights a tenant's earlier job left: 30 steps of the same model, and of another */
    group_def src = {0};
    mlp_job(&src, 32, 0, 30, 0.01, 9, 0, 0);
    mlp_job(&src, 16, 0, 30, 0.01, 9, 0, 0);
    ref_run made, other;
    const fb_job_spec *s0 = &src.spec[0], *s1 = &src.spec[1];
    reference(&made, &s0, 1, c.s.data_dir);
    reference(&other, &s1, 1, c.s.data_dir);
    static const char ref[] = ", \"init\": {\"job\": \"0b6e1c2a-3f4d-4e5f-8a9b-0c1d2e3f4a5b\"}";
    group_def *g = &c.g;
    init_job(g, 32, 1e-9, 1, ", \"init\": \"/etc/hostname\""); /* 0: a path */
    init_job(g, 32, 1e-9, 1, ref);                             /* 1: fits */
    init_job(g, 32, 1e-9, 1, ref);                             /* 2: another model's */
    init_job(g, 32, 1e-9, 1, ref);                             /* 3: no weights sent */
    init_job(g, 32, 0.01, 20, "");                             /* 4: none */
    wu_uuid(c.gid, 0x6, 7);
    log_init(&c.L, c.gid, 1, g->ids, g->n);

    fb_wire_msg m = {.type = FB_WIRE_ASSIGN,
                     .generation = 1,
                     .n_group_devices = 1,
                     .parallel_data = 1,
                     .parallel_pipeline = 1,
                     .n_split = 1,
                     .time_share = 1.0};
    snprintf(m.group_id, sizeof m.group_id, "%s", c.gid);
    snprintf(m.fusion_key, sizeof m.fusion_key, "%s", g->spec[0].fusion_key);
    snprintf(m.dataset, sizeof m.dataset, "my-alias");
    snprintf(m.builtin, sizeof m.builtin, "synth");
    m.split[0] = 32;
    m.n_members = g->n;
    m.members = calloc((size_t)g->n, sizeof *m.members);
    CHECK(m.members != NULL);
    for (int i = 0; i < g->n; i++) {
        snprintf(m.members[i].job_id, sizeof m.members[i].job_id, "%s", g->ids[i]);
        wu_uuid(m.members[i].tenant_id, TENANT, 1);
        m.members[i].spec = strdup(g->json[i]);
        CHECK(m.members[i].spec != NULL);
    }
    const void *blobs[2] = {made.model[0], other.model[0]};
    size_t lens[2] = {made.len[0], other.len[0]};
    m.members[1].init_blob = 1;
    m.members[2].init_blob = 2;
    wu_send(&c.s, c.name, &m, blobs, lens, 2);
    fb_wire_msg_free(&m);
    pump(&c.s, &c.L, 120000, all_done, "every member to finish or fail");

    run_log *L = &c.L;
    CHECK(L->job[0].failed);
    CHECK(strstr(L->job[0].failed_text, "never from a path") != NULL);
    CHECK(L->job[1].finished);
    double e = wu_models_compare(L->job[1].model, L->job[1].model_len, made.model[0], made.len[0],
                                 1e-6, "a member started from the tenant's weights");
    CHECK(L->job[2].failed);
    CHECK(strstr(L->job[2].failed_text, "do not fit") != NULL);
    CHECK(L->job[3].failed);
    CHECK(strstr(L->job[3].failed_text, "carries no weights") != NULL);
    CHECK(L->job[4].finished);
    CHECK_INT_EQ(L->job[4].finished_step, 20);
    /* the untouched member trained on synth, as alone */
    const fb_job_spec *s4 = &g->spec[4];
    ref_run solo;
    reference(&solo, &s4, 1, c.s.data_dir);
    wu_models_compare(L->job[4].model, L->job[4].model_len, solo.model[0], solo.len[0], 1e-4,
                      "the member without init vs alone on synth");
    printf("init: the member with the tenant's weights is %.2g from them after one step at lr "
           "1e-9; a path, missing and misfit weights failed their members alone\n",
           e);
    for (int i = 0; i < 4; i++)
        printf("  member %d: %s\n", i, L->job[i].failed ? L->job[i].failed_text : "finished");
    ref_free(&solo);
    ref_free(&made);
    ref_free(&other);
    group_free(&src);
    scene_finish(&c, NULL);
}

/* ---- hook ------------------------------------------------------------------------------- */

/* The step a hook file holds, or -1 when there is no such file. */
static long long hook_file_step(const char *path)
{
    FILE *f = fopen(path, "r");
    if (!f) return -1;
    long long n = -1;
    if (fscanf(f, "%lld", &n) != 1) n = -1;
    fclose(f);
    return n;
}

/* Writes the hold file path with step, renamed into place as a test must write it. */
static void hook_hold(const char *dir, const char *path, long long step)
{
    char tmp[800], text[32];
    snprintf(tmp, sizeof tmp, "%s/.hold.tmp", dir);
    snprintf(text, sizeof text, "%lld\n", step);
    FILE *f = fopen(tmp, "w");
    CHECK(f != NULL);
    CHECK(fputs(text, f) >= 0);
    CHECK(fclose(f) == 0);
    CHECK(rename(tmp, path) == 0);
}

/* Serves the worker (recording into L) until the held file says step. */
static void serve_until_held(scene *c, const char *held, long long step)
{
    double end = wu_now_ms() + 60000;
    while (hook_file_step(held) != step) {
        if (wu_now_ms() > end) {
            fprintf(stderr, "%s never said %lld (it says %lld)\n", held, step,
                    hook_file_step(held));
            dump(&c->L);
            abort();
        }
        wu_msg w;
        if (!wu_next(&c->s, 20, true, &w)) continue;
        record(&c->L, &w);
        wu_msg_free(&w);
    }
}

static bool member1_detached(const run_log *L) { return L->job[1].detached; }
static bool member0_detached(const run_log *L) { return L->job[0].detached; }

static void scenario_hook(void)
{
    /* without FUSEBOX_TEST_HOOKS=1 the hook is refused, whichever way it is asked for */
    unsetenv(FB_AGENT_TEST_HOOKS_ENV);
    wu_server s;
    wu_server_start(&s, "hook-flags", true);
    char dir[700], file[700];
    snprintf(dir, sizeof dir, "%s/hooks", s.dir);
    CHECK(mkdir(dir, 0755) == 0);
    snprintf(file, sizeof file, "%s/server.key", s.dir);
    char env_dir[800], clock[700], env_clock[800];
    snprintf(env_dir, sizeof env_dir, "FUSEBOX_WORKER_TEST_STEP_HOOK=%s", dir);
    snprintf(clock, sizeof clock, "%s/clock", s.dir);
    char cmsg[256];
    fb_clock_file *cf = fb_clock_file_create(clock, 5000000000LL, cmsg, sizeof cmsg);
    CHECK(cf != NULL);
    snprintf(env_clock, sizeof env_clock, "FUSEBOX_WORKER_TEST_CLOCK=%s", clock);
    /* keys that do not exist: a hook that is accepted gets past its check and fails on them;
     * with the real keys a refused directory reaches the agent's own check */
    static const char *const nokeys[] = {"--server", "tcp://127.0.0.1:1", "--server-key",
                                         "/nonexistent/k", "--key", "/nonexistent/k"};
    const char *keys[] = {"--server",         "tcp://127.0.0.1:1", "--server-key",
                          s.server_key_file, "--key",             s.worker_key_file};
    static const char refused[] = "is for tests only and needs FUSEBOX_TEST_HOOKS=1 in the "
                                  "environment; refusing to start";
    static const char *const on[] = {"FUSEBOX_TEST_HOOKS=1", NULL};
    const struct {
        bool real_keys;
        const char *flag, *value; /* a test hook's flag and value; NULL: none */
        const char *env[3];
        int rc;
        const char *has;
    } cases[] = {
        {false, "--test-step-hook", dir, {NULL}, 2, "--test-step-hook is for tests only"},
        {false, NULL, NULL, {env_dir, NULL}, 2, "FUSEBOX_WORKER_TEST_STEP_HOOK is for tests only"},
        {false, "--test-step-hook", dir, {"FUSEBOX_TEST_HOOKS=0", NULL}, 2, refused},
        {false, "--test-step-hook", dir, {"FUSEBOX_TEST_HOOKS=yes", NULL}, 2, refused},
        {false, "--test-step-hook", dir, {"FUSEBOX_TEST_HOOKS=", NULL}, 2, refused},
        {false, "--test-step-hook", dir, {"FUSEBOX_TEST_HOOKS=1 ", NULL}, 2, refused},
        {true, "--test-step-hook", "/nonexistent/hooks", {on[0], NULL}, 2, "is not a directory"},
        {true, "--test-step-hook", file, {on[0], NULL}, 2, "is not a directory"},
        {false, "--test-step-hook", dir, {on[0], NULL}, 2, "server key"}, /* accepted */
        /* the test clock and the step time script, under the same rule */
        {false, "--test-clock", clock, {NULL}, 2, "--test-clock is for tests only"},
        {false, NULL, NULL, {env_clock, NULL}, 2, "FUSEBOX_WORKER_TEST_CLOCK is for tests only"},
        {false, "--test-clock", clock, {"FUSEBOX_TEST_HOOKS=true", NULL}, 2, refused},
        {false, "--test-step-ms", "*=10", {NULL}, 2, "--test-step-ms is for tests only"},
        {false, NULL, NULL, {"FUSEBOX_WORKER_TEST_STEP_MS=*=10", NULL}, 2,
         "FUSEBOX_WORKER_TEST_STEP_MS is for tests only"},
        {true, "--test-clock", "/nonexistent/clock", {on[0], NULL}, 2,
         "clock file /nonexistent/clock: No such file"},
        {true, "--test-clock", dir, {on[0], NULL}, 2, "not a regular file of 8 bytes"},
        {true, "--test-clock", file, {on[0], NULL}, 2, "not a regular file of 8 bytes"},
        {true, "--test-step-ms", "x", {on[0], NULL}, 2, "'x' is not KEY=MS"},
        {true, "--test-step-ms", "=5", {on[0], NULL}, 2, "'=5' is not KEY=MS"},
        {true, "--test-step-ms", "a=", {on[0], NULL}, 2, "'a=' is not KEY=MS"},
        {true, "--test-step-ms", "a=1,", {on[0], NULL}, 2, "'' is not KEY=MS"},
        {true, "--test-step-ms", "a=0", {on[0], NULL}, 2, "'a=0' needs an integer of ms"},
        {true, "--test-step-ms", "a=3600001", {on[0], NULL}, 2, "in [1, 3600000]"},
        {true, "--test-step-ms", "a=5ms", {on[0], NULL}, 2, "'a=5ms' needs an integer"},
        {true, "--test-step-ms", "a=+5", {on[0], NULL}, 2, "'a=+5' needs an integer"},
        {true, "--test-step-ms", "a=1,b=2,a=3", {on[0], NULL}, 2, "'a' is named twice"},
        {false, "--test-clock", clock, {on[0], NULL}, 2, "server key"}, /* accepted */
        {false, "--test-step-ms", "m0=5,*=7", {on[0], NULL}, 2, "server key"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        const char *args[10];
        int n = 0;
        for (int k = 0; k < 6; k++) args[n++] = cases[i].real_keys ? keys[k] : nokeys[k];
        if (cases[i].flag) {
            args[n++] = cases[i].flag;
            args[n++] = cases[i].value;
        }
        args[n] = NULL;
        wu_expect_run(s.dir, args, cases[i].env, cases[i].rc, cases[i].has);
    }
    /* no refused clock file was touched */
    CHECK_INT_EQ(fb_clock_file_get(cf), 5000000000LL);
    fb_clock_file_close(cf);
    /* the agent's own check, for callers other than the executable */
    char pub[41], sec[41], spub[41], ssec[41], msg[512];
    CHECK(zmq_curve_keypair(pub, sec) == 0 && zmq_curve_keypair(spub, ssec) == 0);
    fb_agent_opts ao = {.server = "tcp://127.0.0.1:1", .server_key = spub, .public_key = pub,
                        .secret_key = sec, .test_step_hook = dir};
    fb_agent *sentinel = (fb_agent *)&ao, *a = sentinel;
    CHECK_INT_EQ(fb_agent_new(&a, &ao, msg, sizeof msg), FB_ERR_OUT_OF_RANGE);
    CHECK(strstr(msg, "the test step hook is for tests only") != NULL);
    CHECK(a == sentinel);
    ao.test_step_hook = NULL;
    ao.test_clock = "/nonexistent/clock";
    CHECK_INT_EQ(fb_agent_new(&a, &ao, msg, sizeof msg), FB_ERR_OUT_OF_RANGE);
    CHECK(strstr(msg, "the test clock is for tests only") != NULL);
    ao.test_clock = NULL;
    ao.test_step_ms = "*=10";
    CHECK_INT_EQ(fb_agent_new(&a, &ao, msg, sizeof msg), FB_ERR_OUT_OF_RANGE);
    CHECK(strstr(msg, "the step time script is for tests only") != NULL);
    CHECK(a == sentinel);
    CHECK(!fb_clock_is_manual());
    wu_server_stop(&s);

    /* a held array: the hook directory outlives the scene's first worker */
    CHECK(setenv(FB_AGENT_TEST_HOOKS_ENV, "1", 1) == 0);
    const char *t = getenv("TMPDIR");
    snprintf(dir, sizeof dir, "%s/fbworker-hookdir-XXXXXX", t && *t ? t : "/tmp");
    CHECK(mkdtemp(dir) != NULL);
    /* reports only at the first step, at a member's end and on entering a hold (each after
     * steps, so with samples), not every --progress-ms while held */
    const char *extra[] = {"--test-step-hook", dir, "--progress-ms", "3600000", NULL};
    scene c;
    scene_start(&c, "hook", 21, "w-hook", extra, NULL);
    group_def *g = &c.g;
    /* dropout and a cosine schedule: the held step must not change a thing */
    mlp_job(g, 64, 0.1, 600, 0.01, 1, 0, 100);
    mlp_job(g, 64, 0.1, 700, 0.003, 2, 0, 100);
    char hold[800], held[800];
    snprintf(hold, sizeof hold, "%s/hold-%s", dir, g->ids[0]);
    snprintf(held, sizeof held, "%s/held-%s", dir, g->ids[0]);
    hook_hold(dir, hold, 150); /* before the array exists: it cannot pass 150 first */
    scene_assign(&c, 9, 0, 60000, all_started, "both members to start");
    serve_until_held(&c, held, 150);
    /* moved: it goes on to 250 and holds there */
    hook_hold(dir, hold, 250);
    serve_until_held(&c, held, 250);
    /* held, the worker still heartbeats and answers: three heartbeats, and no event past
     * the held step meanwhile */
    int beats = 0;
    double end = wu_now_ms() + 30000;
    while (beats < 3) {
        CHECK(wu_now_ms() < end);
        wu_msg w;
        if (!wu_recv(&c.s, 1000, &w)) continue;
        wu_answer(&c.s, &w, true);
        if (w.m.type == FB_WIRE_HEARTBEAT && !w.m.reply)
            beats++;
        else if (w.m.type != FB_WIRE_HELLO)
            record(&c.L, &w);
        wu_msg_free(&w);
    }
    CHECK_INT_EQ(hook_file_step(held), 250);
    for (int i = 0; i < 2; i++)
        for (int k = 0; k < c.L.job[i].n_ckpt; k++) CHECK(c.L.job[i].ckpt_step[k] <= 250);
    /* a member sent away leaves at the held step, with its state */
    fb_wire_msg d = {.type = FB_WIRE_DETACH, .generation = 1, .keep_state = true};
    snprintf(d.group_id, sizeof d.group_id, "%s", c.gid);
    snprintf(d.job_id, sizeof d.job_id, "%s", g->ids[1]);
    snprintf(d.text, sizeof d.text, "migrated");
    wu_send(&c.s, "w-hook", &d, NULL, NULL, 0);
    pump(&c.s, &c.L, 30000, member1_detached, "member 1 to leave while held");
    CHECK_INT_EQ(c.L.job[1].detached_step, 250);
    CHECK(c.L.job[1].state != NULL);
    /* a drain checkpoints the other at the held step and the worker exits 0 */
    CHECK(kill(c.pid, SIGTERM) == 0);
    pump(&c.s, &c.L, 30000, member0_detached, "member 0 to drain while held");
    CHECK_STR_EQ(c.L.job[0].detached_text, "drained");
    CHECK_INT_EQ(c.L.job[0].detached_step, 250);
    CHECK(c.L.job[0].state != NULL);
    end = wu_now_ms() + 20000;
    while (!c.L.drain) {
        wu_msg w;
        CHECK(wu_now_ms() < end);
        if (!wu_next(&c.s, 1000, true, &w)) continue;
        record(&c.L, &w);
        wu_msg_free(&w);
    }
    CHECK_INT_EQ(wu_wait(c.pid, 20000), 0);
    CHECK_INT_EQ(hook_file_step(held), -1); /* the hold ended with the group */
    for (int i = 0; i < 2; i++) {
        CHECK_INT_EQ(c.L.job[i].n_ckpt, 2);
        CHECK(c.L.job[i].ckpt_step[0] == 100 && c.L.job[i].ckpt_step[1] == 200);
        CHECK(!c.L.job[i].finished);
    }
    printf("held at 150, then 250: detached and drained there\n");

    /* released, the states resume on a new worker at the step after the held one */
    CHECK(unlink(hold) == 0);
    scene_worker(&c, NULL);
    run_log R;
    log_init(&R, c.gid, 2, g->ids, g->n);
    void *states[2] = {c.L.job[0].state, c.L.job[1].state};
    size_t lens[2] = {c.L.job[0].state_len, c.L.job[1].state_len};
    send_assign(&c.s, "w-hook", g, c.gid, 2, "synth", 0, 250, states, lens);
    pump(&c.s, &R, 180000, all_done, "the resumed members to finish");
    const fb_job_spec *specs[2] = {&g->spec[0], &g->spec[1]};
    ref_run whole;
    reference(&whole, specs, 2, c.s.data_dir);
    for (int i = 0; i < 2; i++) {
        CHECK(R.job[i].finished);
        CHECK_INT_EQ(R.job[i].started_step, 251);
        CHECK_INT_EQ(R.job[i].finished_step, g->spec[i].steps);
        wu_models_compare(R.job[i].model, R.job[i].model_len, whole.model[i], whole.len[i], -1,
                          "held, drained and resumed vs uninterrupted");
        CHECK(R.job[i].loss == whole.loss[i]);
    }
    printf("resumed at step 251: bit-identical to the uninterrupted run\n");
    ref_free(&whole);
    scene_finish(&c, &R);
    log_free(&R);
    et_rmtree(dir);
}

int main(int argc, char **argv)
{
    if (argc != 2) {
        fprintf(stderr, "usage: %s train|detach|drain|share|outbox|bad|auth|cli|init|hook\n",
                argv[0]);
        return 2;
    }
    signal(SIGPIPE, SIG_IGN);
    double t0 = wu_now_ms();
    if (strcmp(argv[1], "train") == 0)
        scenario_train();
    else if (strcmp(argv[1], "detach") == 0)
        scenario_detach();
    else if (strcmp(argv[1], "drain") == 0)
        scenario_drain();
    else if (strcmp(argv[1], "share") == 0)
        scenario_share();
    else if (strcmp(argv[1], "outbox") == 0)
        scenario_outbox();
    else if (strcmp(argv[1], "bad") == 0)
        scenario_bad();
    else if (strcmp(argv[1], "auth") == 0)
        scenario_auth();
    else if (strcmp(argv[1], "cli") == 0)
        scenario_cli();
    else if (strcmp(argv[1], "init") == 0)
        scenario_init();
    else if (strcmp(argv[1], "hook") == 0)
        scenario_hook();
    else {
        fprintf(stderr, "unknown scenario %s\n", argv[1]);
        return 2;
    }
    printf("worker scenario %s passed in %.1f s\n", argv[1], (wu_now_ms() - t0) / 1e3);
    return 0;
}
