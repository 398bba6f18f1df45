/*
 * The worker runs hybrid-parallel groups end to end: a fusebox-worker with
 * four CPU devices gets an ASSIGN with parallel 2 x 1 (an uneven split,
 * then a REBALANCE to another split mid-run) and one with 2 x 2 (pipeline
 * stages); every member finishes, its model matches the same job trained
 * alone in this process, and PROGRESS reports the step breakdown, also per
 * device: each of the group's devices in its order, with the samples its
 * shard trained on (so the split shows in them) and its own times.  A
 * REBALANCE with a split that does not fit is ignored and training goes on.
 * A data-parallel group and a one-device group that share a device take turns
 * on it (--device-turns all: what CUDA devices do by default).
 *
 * The test plays the server, so it must answer the worker's heartbeats as they
 * come: a worker whose server is silent for three heartbeats registers again
 * and resends what was not acknowledged.  So nothing slow runs while the worker
 * does: the models are compared with the ones trained alone once the worker
 * has drained and exited, however slow the machine (a sanitizer) makes that.
 */
#include "worker/worker_util.h"

#include "agent.h"
#include "kernels.h"
#include "train.h"

#define F_IN 16
#define CLASSES 4
#define JOBS 3
#define TENANT 0x7e

typedef struct job {
    char id[FB_WIRE_ID_LEN + 1];
    fb_job_spec spec;
    char *json;
    void *model;
    size_t model_len;
} job;

typedef struct seen {
    int progress, progress_comm;
    double comm_ms, idle_ms;
    int first_split; /* reports whose per-device samples show exactly the ASSIGN's split */
} seen;

/* The group's layout, for checking PROGRESS's per-device entries. */
typedef struct layout {
    int D, P;
    const int *devices;
    const int64_t *split, *rebalance; /* rebalance: NULL when none */
} layout;

/*
 * Each device of the group once, in the group's order, over the report's
 * steps, with compute time of its own, and its shard's samples: the
 * ASSIGN's split, the REBALANCE's, or (in the report the change falls in) a
 * mix of both; every stage of a shard trains on the same samples.
 */
static void check_devices(const fb_wire_msg *m, const layout *l, seen *o)
{
    if (m->n_device_steps == 0) return; /* a report after no step (a member's last) */
    CHECK_INT_EQ(m->n_device_steps, l->D * l->P);
    int64_t steps = m->device_steps[0].steps, total = 0;
    CHECK(steps >= 1);
    bool first = true;
    for (int k = 0; k < l->D * l->P; k++) {
        const fb_wire_device_step *e = &m->device_steps[k];
        int d = k / l->P;
        CHECK_INT_EQ(e->device, l->devices[k]);
        CHECK_INT_EQ(e->steps, steps);
        CHECK(e->compute_ms > 0 && e->comm_ms >= 0 && e->io_ms >= 0 && e->idle_ms >= 0);
        /* the passes are part of compute, and the update is the rest (the speed that
         * splits the batch counts the passes only) */
        CHECK(e->pass_ms > 0 && e->pass_ms < e->compute_ms);
        int64_t a = l->split[d] * steps, b = l->rebalance ? l->rebalance[d] * steps : a;
        CHECK(e->samples >= (a < b ? a : b) && e->samples <= (a > b ? a : b));
        CHECK_INT_EQ(e->samples, m->device_steps[d * l->P].samples);
        first &= e->samples == a;
        if (k % l->P == 0) total += e->samples;
    }
    CHECK_INT_EQ(total, 32 * steps); /* the shards together: the whole batch, every step */
    o->first_split += first;
}

static void make_jobs(job *j, int group, int scale, int hidden)
{
    static const int steps[JOBS] = {40, 50, 40};
    for (int i = 0; i < JOBS; i++) {
        wu_uuid(j[i].id, 0x20b, (unsigned long long)(100 * group + i + 1));
        wu_spec(&j[i].spec, &j[i].json,
                "{\"name\": \"p%d\", \"dataset\": \"synth\", \"model\": {\"input\": [%d], "
                "\"layers\": [{\"type\": \"linear\", \"out\": %d}, {\"type\": \"relu\"}, "
                "{\"type\": \"linear\", \"out\": 16}, {\"type\": \"tanh\"}, "
                "{\"type\": \"linear\", \"out\": %d}]}, \"batch_size\": 32, \"steps\": %d, "
                "\"optimizer\": {\"type\": \"adamw\", \"lr\": %g}, \"seed\": %d, "
                "\"data_seed\": 5, \"eval_every\": 20}",
                i, F_IN, hidden, CLASSES, steps[i] * scale, 0.005 * (i + 1), 7 + i);
        j[i].model = NULL;
    }
}

static void send_assign(wu_server *s, const char *gid, job *j, int D, int P, const int *devices,
                        const int64_t *split)
{
    fb_wire_msg m = {.type = FB_WIRE_ASSIGN,
                     .generation = 1,
                     .n_group_devices = D * P,
                     .parallel_data = D,
                     .parallel_pipeline = P,
                     .n_split = D,
                     .time_share = 1.0};
    snprintf(m.group_id, sizeof m.group_id, "%s", gid);
    snprintf(m.fusion_key, sizeof m.fusion_key, "%s", j[0].spec.fusion_key);
    snprintf(m.dataset, sizeof m.dataset, "synth");
    for (int k = 0; k < D * P; k++) m.group_devices[k] = devices[k];
    for (int d = 0; d < D; d++) m.split[d] = split[d];
    m.n_members = JOBS;
    m.members = calloc(JOBS, sizeof *m.members);
    CHECK(m.members != NULL);
    for (int i = 0; i < JOBS; i++) {
        snprintf(m.members[i].job_id, sizeof m.members[i].job_id, "%s", j[i].id);
        wu_uuid(m.members[i].tenant_id, TENANT, 1);
        m.members[i].spec = strdup(j[i].json);
        CHECK(m.members[i].spec != NULL);
    }
    wu_send(s, "w-par", &m, NULL, NULL, 0);
    fb_wire_msg_free(&m);
}

static void send_rebalance(wu_server *s, const char *gid, int n, const int64_t *split)
{
    fb_wire_msg m = {.type = FB_WIRE_REBALANCE, .generation = 1, .n_split = n,
                     .time_share = 1.0};
    snprintf(m.group_id, sizeof m.group_id, "%s", gid);
    for (int d = 0; d < n; d++) m.split[d] = split[d];
    wu_send(s, "w-par", &m, NULL, NULL, 0);
}

/* Runs the group until every member finished; REBALANCEs after the first PROGRESS. */
static void pump(wu_server *s, const char *gid, job *j, const layout *l, seen *o)
{
    const int64_t *rebalance = l->rebalance;
    int finished = 0;
    bool rebalanced = rebalance == NULL;
    double end = wu_now_ms() + 120000;
    while (finished < JOBS) {
        wu_msg w;
        int left = (int)(end - wu_now_ms());
        CHECK(left > 0 && wu_next(s, left, true, &w));
        if (strcmp(w.m.group_id, gid) != 0) {
            wu_msg_free(&w);
            continue;
        }
        if (w.m.type == FB_WIRE_PROGRESS) {
            o->progress++;
            o->comm_ms += w.m.comm_ms;
            o->idle_ms += w.m.idle_ms;
            o->progress_comm += w.m.comm_ms > 0;
            CHECK(w.m.compute_ms > 0 && w.m.comm_ms >= 0 && w.m.idle_ms >= 0);
            check_devices(&w.m, l, o);
            if (!rebalanced) {
                /* a split for 3 shards does not fit a 2-shard group: logged, ignored */
                int64_t wrong[3] = {10, 10, 12};
                send_rebalance(s, gid, 3, wrong);
                send_rebalance(s, gid, 2, rebalance);
                rebalanced = true;
            }
        } else if (w.m.type == FB_WIRE_EVENT) {
            if (w.m.event == FB_EV_FAILED) fprintf(stderr, "failed: %s\n", w.m.text);
            CHECK(w.m.event != FB_EV_FAILED);
            if (w.m.event == FB_EV_FINISHED) {
                for (int i = 0; i < JOBS; i++) {
                    if (strcmp(j[i].id, w.m.job_id) != 0) continue;
                    CHECK(j[i].model == NULL);
                    CHECK(w.m.blob >= 1 && w.m.blob <= w.n_blobs);
                    j[i].model = w.blob[w.m.blob];
                    j[i].model_len = w.blob_len[w.m.blob];
                    w.blob[w.m.blob] = NULL;
                    finished++;
                }
            }
        }
        wu_msg_free(&w);
    }
}

typedef struct model_out {
    void *model;
    size_t len;
} model_out;

static void on_done(const fb_train_event *ev, void *user)
{
    model_out *r = user;
    if (ev->kind != FB_TRAIN_DONE) return;
    CHECK(ev->blob != NULL && r->model == NULL);
    r->model = malloc(ev->blob_len);
    CHECK(r->model != NULL);
    memcpy(r->model, ev->blob, ev->blob_len);
    r->len = ev->blob_len;
}

/* Trains a job alone on one device in this process, reading the data as the worker does. */
static model_out alone(const job *jb, const char *data_dir)
{
    fb_backend *be = fb_backend_cpu();
    fb_backend_set_threads(be, 1);
    char msg[1024];
    fb_dataset train = {0}, val = {0}, test = {0};
    fb_loader *loader = NULL;
    fb_data_source_opts so = {.batch_size = jb->spec.batch_size, .shuffle = jb->spec.shuffle,
                              .data_seed = jb->spec.data_seed, .want_test = true,
                              .want_val = true, .val_fraction = jb->spec.val_fraction};
    CHECK_INT_EQ(fb_data_open_named(&train, &val, &test, &loader, "synth", data_dir, &so, msg,
                                    sizeof msg),
                 FB_OK);
    model_out r = {0};
    fb_train_opts o = {.blobs = true, .loader = loader, .cb = on_done, .user = &r, .test = &test};
    const fb_job_spec *specs[1] = {&jb->spec};
    int err = fb_train_run(be, specs, 1, &train, &val, &o, NULL, NULL, msg, sizeof msg);
    if (err) fprintf(stderr, "reference: %s\n", msg);
    CHECK_INT_EQ(err, FB_OK);
    fb_loader_free(loader);
    fb_dataset_free(&train);
    fb_dataset_free(&val);
    fb_dataset_free(&test);
    CHECK(r.model != NULL);
    return r;
}

/* The groups whose models check_alone compares once the worker is gone. */
#define MAX_CHECKS 4
static job checks[MAX_CHECKS][JOBS];
static int n_checks;

/* Keeps the group's jobs (their models) for check_alone after the worker's exit. */
static void keep_for_check(const job *j)
{
    CHECK(n_checks < MAX_CHECKS);
    memcpy(checks[n_checks++], j, sizeof checks[0]);
}

/* Each member's model equals the same job trained alone on one device; frees the jobs. */
static void check_alone(wu_server *s, job *j)
{
    for (int i = 0; i < JOBS; i++) {
        model_out ref = alone(&j[i], s->data_dir);
        double e = wu_models_compare(j[i].model, j[i].model_len, ref.model, ref.len, 1e-4,
                                     "worker (parallel) vs alone");
        printf("  member %d: %.3g from training alone on one device\n", i, e);
        free(ref.model);
        free(j[i].model);
        fb_job_spec_free(&j[i].spec);
        free(j[i].json);
    }
}

static void run_group(wu_server *s, int group, int D, int P, const int *devices,
                      const int64_t *split, const int64_t *rebalance, const char *what)
{
    job j[JOBS];
    /* long enough for a REBALANCE sent at the first PROGRESS to land mid-run */
    make_jobs(j, group, rebalance ? 6 : 1, 32);
    char gid[FB_WIRE_ID_LEN + 1];
    wu_uuid(gid, 0x6, (unsigned long long)group);
    send_assign(s, gid, j, D, P, devices, split);
    seen o = {0};
    layout l = {.D = D, .P = P, .devices = devices, .split = split, .rebalance = rebalance};
    pump(s, gid, j, &l, &o);
    CHECK(o.progress >= 1);
    CHECK(o.first_split >= 1); /* a report before the REBALANCE shows the ASSIGN split exactly */
    printf("%s: %d PROGRESS reports, mean comm %.3f ms, idle %.3f ms a step\n", what,
           o.progress, o.comm_ms / o.progress, o.idle_ms / o.progress);
    if (D > 1 && P == 1) CHECK(o.progress_comm >= 1); /* a step waits for its all-reduce */
    keep_for_check(j);
}

/*
 * Two groups share device 3: a data-parallel one on devices 1 and 3, and a one-device one
 * on 3.  The first takes its turn on both its devices for each step, so the two take
 * turns on device 3 and the one-device group waits (idle) for the other's steps: with
 * equal shares it gets as much device time as the other, so it runs several of its
 * shorter steps per step of the other and waits once among them.  Were the first to step
 * on device 3 without its turn there, the second would never wait (idle 0).  Both train
 * as they would alone.
 */
static void run_shared(wu_server *s)
{
    static const int devices[2][2] = {{1, 3}, {3}};
    static const int64_t splits[2][2] = {{16, 16}, {32}};
    job j[2][JOBS];
    char gid[2][FB_WIRE_ID_LEN + 1];
    for (int g = 0; g < 2; g++) {
        make_jobs(j[g], 3 + g, 5, 128);
        wu_uuid(gid[g], 0x6, (unsigned long long)(3 + g));
        send_assign(s, gid[g], j[g], 2 - g, 1, devices[g], splits[g]);
    }
    int finished[2] = {0, 0}, reports[2] = {0, 0}, seen[2] = {0, 0};
    double idle[2] = {0, 0}, compute[2] = {0, 0};
    double end = wu_now_ms() + 120000;
    while (finished[0] < JOBS || finished[1] < JOBS) {
        wu_msg w;
        int left = (int)(end - wu_now_ms());
        CHECK(left > 0 && wu_next(s, left, true, &w));
        int g = strcmp(w.m.group_id, gid[0]) == 0 ? 0 : strcmp(w.m.group_id, gid[1]) == 0 ? 1 : -1;
        if (g >= 0 && w.m.type == FB_WIRE_PROGRESS) seen[g]++;
        if (g >= 0 && w.m.type == FB_WIRE_PROGRESS && seen[1 - g] && !finished[1 - g]) {
            /* while both train: the other has reported a step and none of its members
             * finished */
            reports[g]++;
            idle[g] += w.m.idle_ms;
            compute[g] += w.m.compute_ms;
        } else if (g >= 0 && w.m.type == FB_WIRE_EVENT) {
            if (w.m.event == FB_EV_FAILED) fprintf(stderr, "failed: %s\n", w.m.text);
            CHECK(w.m.event != FB_EV_FAILED);
            for (int i = 0; w.m.event == FB_EV_FINISHED && i < JOBS; i++) {
                if (strcmp(j[g][i].id, w.m.job_id) != 0) continue;
                CHECK(j[g][i].model == NULL);
                CHECK(w.m.blob >= 1 && w.m.blob <= w.n_blobs);
                j[g][i].model = w.blob[w.m.blob];
                j[g][i].model_len = w.blob_len[w.m.blob];
                w.blob[w.m.blob] = NULL;
                finished[g]++;
            }
        }
        wu_msg_free(&w);
    }
    for (int g = 0; g < 2; g++)
        printf("sharing device 3, %s: %d PROGRESS reports while both trained, compute %.3f ms, "
               "idle %.3f ms a step\n",
               g ? "1 device" : "2 x 1 on devices 1 and 3", reports[g],
               reports[g] ? compute[g] / reports[g] : 0, reports[g] ? idle[g] / reports[g] : 0);
    CHECK(reports[1] >= 1);
    CHECK(idle[1] > 0.05 * compute[1]);
    for (int g = 0; g < 2; g++)
        keep_for_check(j[g]);
}

int main(void)
{
    wu_server s;
    wu_server_start(&s, "parallel", true);
    wu_make_dataset(s.data_dir, "synth", 512, 128, F_IN, CLASSES, 11);
    /* the turns CUDA devices take by default (auto), for the shared-device scenario; the
     * others have their devices to themselves */
    const char *extra[] = {"--cpu-devices", "4", "--device-turns", "all", NULL};
    pid_t pid = wu_start_worker(&s, "w-par", extra);
    wu_msg w;
    wu_expect_hello(&s, "w-par", 20000, &w);
    CHECK_INT_EQ(w.m.n_devices, 4);
    wu_msg_free(&w);
    wu_send_welcome(&s, "w-par");

    int dp_devices[2] = {0, 2};
    int64_t uneven[2] = {22, 10}, rebalanced[2] = {8, 24};
    run_group(&s, 1, 2, 1, dp_devices, uneven, rebalanced, "2 x 1, split 22/10 then 8/24");
    int hybrid_devices[4] = {0, 1, 2, 3};
    int64_t even[2] = {16, 16};
    run_group(&s, 2, 2, 2, hybrid_devices, even, NULL, "2 x 2");
    run_shared(&s);

    /* SIGTERM drains the worker; it exits 0 */
    CHECK(kill(pid, SIGTERM) == 0);
    double end = wu_now_ms() + 15000;
    bool drained = false;
    while (!drained) {
        int left = (int)(end - wu_now_ms());
        CHECK(left > 0 && wu_next(&s, left, true, &w));
        drained = w.m.type == FB_WIRE_DRAIN;
        wu_msg_free(&w);
    }
    CHECK_INT_EQ(wu_wait(pid, 20000), 0);
    for (int k = 0; k < n_checks; k++)
        check_alone(&s, checks[k]);
    wu_server_stop(&s);
    printf("ok\n");
    return 0;
}
