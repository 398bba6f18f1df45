/*
 * The training session: one array, a shared stream of minibatches, members
 * that leave as they finish, fail or are detached, and full-state
 * checkpoints that resume a member exactly.
 *
 * Everything a step does is a function of the session's global step: the
 * in-memory minibatch (epoch = step / steps per epoch, a permutation drawn
 * from data_seed and the epoch), the dropout masks (the step is the dropout
 * stream, mixed with each member's seed) and the schedule (update t = step +
 * 1).  A checkpoint therefore needs only the arrays' contents and the step.
 */
#include "session.h"

#include <errno.h>
#include <float.h>
#include <inttypes.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>

#include <jansson.h>

#include "array.h"
#include "loader.h"
#include "rng.h"
#include "safetensors.h"
#include "dp.h"
#include "pp.h"

#define DATA_STREAM 0x64617461ULL /* "data": the shuffle's RNG stream */
#define FILE_CAP 160
#define PATH_CAP 1024
#define TEXT_CAP 128
#define NAME_CAP 256
#define METRICS_CAP 256

/* The names of docs/jobspec.md's metric vocabulary ("Metrics") that the
 * files' "metrics" entry uses; val_step is the step of the validation, as a
 * job's latest_metrics has it. */
#define METRIC_LOSS "loss"
#define METRIC_ACCURACY "accuracy"
#define METRIC_VAL_LOSS "val_loss"
#define METRIC_VAL_ACCURACY "val_accuracy"
#define METRIC_VAL_STEP "val_step"
#define METRIC_TEST_LOSS "test_loss"
#define METRIC_TEST_ACCURACY "test_accuracy"

/* The latest metrics known of a member, for its files' "metrics" entry. */
typedef struct member_metrics {
    bool trained;     /* loss and accuracy hold the step's training values */
    float loss;       /* as the step reported it */
    double accuracy;
    int64_t val_step; /* of the latest validation, or -1: none yet */
    double val_loss, val_accuracy;
    bool tested;      /* test_loss and test_accuracy hold the final test evaluation */
    double test_loss, test_accuracy;
} member_metrics;

struct fb_session {
    fb_backend *be;
    const fb_job_spec **specs; /* [n], by member index */
    int n;
    const fb_dataset *train;
    const fb_dataset *val;  /* evaluated at eval_every and at each member's end; or NULL */
    const fb_dataset *test; /* evaluated once, at each member's end; or NULL */
    fb_train_opts opts; /* a copy */
    fb_loader *loader;
    fb_array *a;  /* the array; with data parallelism, replica 0 of dp's */
    fb_dp *dp;    /* NULL on one device */
    fb_pp *pp;    /* pipeline stages (then a is the whole model's view of them), or NULL */
    int shards;   /* data shards: dp's ranks, or pp's */
    int64_t split[FB_DP_MAX_RANKS];

    int *member;                /* [n]: slot -> member index, first B valid */
    int64_t *total;             /* [n] by member: updates in total */
    char (*files)[FILE_CAP];    /* [n] by member: file name stem in out_dir */
    int64_t *perm;              /* [train n]: this epoch's sample order (in memory) */
    float *x;                   /* [bs, in_numel]: the minibatch (in memory) */
    int32_t *y;                 /* [bs] */
    float *loss, *correct;      /* [n] by slot: this step's */
    double *eloss, *eacc;       /* [n] by slot: this step's validation */
    double *tloss, *tacc;       /* [n] by slot: this step's test evaluation */
    fb_optim_hparams *hp;       /* [n] by slot */
    bool *failed, *last, *ckpt; /* [n] by slot: this step's fate */
    char (*why)[TEXT_CAP];      /* [n] by member: why it failed */
    float *fail_loss;           /* [n] by member: the loss it failed with */
    int *fail_list;             /* [n]: members that failed this step */
    float *tmp;                 /* [the largest parameter tensor]: finiteness checks */
    /* [n] by member: what its files report; a restored member takes its checkpoint's, so
     * a resumed member writes the bytes it would have written without the interruption */
    member_metrics *known;

    int64_t in_numel, bs, per_epoch, epoch; /* epoch: the one perm holds, or -1 */
    int64_t step, max_total;

    /* since the last logged step, for the reported rate and I/O wait */
    double t_log, wait_since;
    int64_t samples_since, steps_since;
    fb_session_times times; /* since the last fb_session_take_times */
};

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

/* The sample order of one epoch: a Fisher-Yates permutation from data_seed. */
static void epoch_order(int64_t *perm, int64_t n, uint64_t data_seed, int64_t epoch, bool shuffle)
{
    for (int64_t i = 0; i < n; i++)
        perm[i] = i;
    if (!shuffle) return;
    for (int64_t i = n - 1; i > 0; i--) {
        uint64_t r = fb_rng_u64(data_seed, DATA_STREAM + (uint64_t)epoch, (uint64_t)i);
        int64_t j = (int64_t)(r % (uint64_t)(i + 1));
        int64_t t = perm[i];
        perm[i] = perm[j];
        perm[j] = t;
    }
}

static void emit(const fb_session *s, const fb_train_event *ev)
{
    if (s->opts.cb) s->opts.cb(ev, s->opts.user);
}

/* Evaluates every member on the whole of an evaluation set (validation or test).
 * loss/acc [B]. */
static int evaluate(fb_array *a, const fb_dataset *test, int64_t in_numel, int chunk, double *loss,
                    double *acc, char *msg, size_t cap)
{
    int B = fb_array_size(a);
    float *l = calloc((size_t)B, sizeof *l), *c = calloc((size_t)B, sizeof *c);
    if (!l || !c) {
        free(l);
        free(c);
        return fb_errf(msg, cap, FB_ERR_NOMEM, "out of memory");
    }
    for (int b = 0; b < B; b++)
        loss[b] = acc[b] = 0;
    int err = FB_OK;
    for (int64_t i = 0; i < test->n; i += chunk) {
        int N = (int)(test->n - i < chunk ? test->n - i : chunk);
        err = fb_array_forward_backward(a, test->x + i * in_numel, test->y + i, N, false, 0, l, c,
                                        msg, cap);
        if (err) break;
        for (int b = 0; b < B; b++) {
            loss[b] += (double)l[b] * N;
            acc[b] += c[b];
        }
    }
    for (int b = 0; b < B; b++) {
        loss[b] /= (double)test->n;
        acc[b] /= (double)test->n;
    }
    free(l);
    free(c);
    return err;
}

static int check_data(const fb_job_spec *s, int K, const fb_dataset *ds, const char *split,
                      char *msg, size_t cap)
{
    if (!ds) return FB_OK;
    int64_t numel = (int64_t)ds->C * ds->H * ds->W;
    if (numel != fb_shape_numel(&s->input))
        return fb_errf(msg, cap, FB_ERR_DATA,
                       "dataset %s (%s) has samples of %d x %d x %d values; the model input "
                       "has %lld",
                       s->dataset, split, ds->C, ds->H, ds->W,
                       (long long)fb_shape_numel(&s->input));
    if (s->loss == FB_LOSS_CROSS_ENTROPY && ds->n_classes > K)
        return fb_errf(msg, cap, FB_ERR_DATA,
                       "dataset %s has %d classes; the model has only %d outputs", s->dataset,
                       ds->n_classes, K);
    if (ds->n < 1)
        return fb_errf(msg, cap, FB_ERR_DATA, "dataset %s (%s) is empty", s->dataset, split);
    return FB_OK;
}

/* The slot of member i, or -1 when it has left (or never was). */
static int slot_of(const fb_session *s, int i)
{
    if (!s) return -1;
    int B = fb_array_size(s->a);
    for (int b = 0; b < B; b++)
        if (s->member[b] == i) return b;
    return -1;
}

/* Takes slot b out of the array; higher slots move down, as the array's do. */
static void remove_slot(fb_session *s, int b)
{
    int B = fb_array_size(s->a);
    if (s->dp)
        fb_dp_remove(s->dp, b);
    else
        fb_array_remove(s->a, b);
    if (s->pp) fb_pp_remove(s->pp, b);
    for (int j = b; j + 1 < B; j++)
        s->member[j] = s->member[j + 1];
}

/* ---- checkpoint bytes ------------------------------------------------------ */

/* The optimizer state a member carries: slot names and the array parts they live in. */
static int optim_slots(const fb_job_spec *spec, const char **names, fb_array_part *parts)
{
    if (spec->optim.type == FB_OPTIM_SGD) {
        /* without momentum torch.optim.SGD keeps no state, and neither do we */
        if (spec->optim.momentum == 0) return 0;
        names[0] = "momentum_buffer";
        parts[0] = FB_ARRAY_STATE1;
        return 1;
    }
    names[0] = "exp_avg";
    parts[0] = FB_ARRAY_STATE1;
    names[1] = "exp_avg_sq";
    parts[1] = FB_ARRAY_STATE2;
    return 2;
}

/* A number of the "metrics" entry: shortest round-trip digits (digits; 9
 * for a float, 17 for a double), null where it is not finite (JSON has no
 * NaN). */
static size_t put_number(char *buf, size_t cap, const char *key, double v, int digits)
{
    if (!isfinite(v)) return (size_t)snprintf(buf, cap, "\"%s\":null,", key);
    return (size_t)snprintf(buf, cap, "\"%s\":%.*g,", key, digits, v);
}

/* The "metrics" entry of a member's files: a JSON object with sorted keys of
 * what is known of it, "{}" before its first step. */
static void metrics_json(const member_metrics *k, char *buf, size_t cap)
{
    size_t at = (size_t)snprintf(buf, cap, "{");
    if (k->trained) at += put_number(buf + at, cap - at, METRIC_ACCURACY, k->accuracy, 17);
    if (k->trained) at += put_number(buf + at, cap - at, METRIC_LOSS, k->loss, 9);
    if (k->tested) {
        at += put_number(buf + at, cap - at, METRIC_TEST_ACCURACY, k->test_accuracy, 17);
        at += put_number(buf + at, cap - at, METRIC_TEST_LOSS, k->test_loss, 17);
    }
    if (k->val_step >= 0) {
        at += put_number(buf + at, cap - at, METRIC_VAL_ACCURACY, k->val_accuracy, 17);
        at += put_number(buf + at, cap - at, METRIC_VAL_LOSS, k->val_loss, 17);
        at += (size_t)snprintf(buf + at, cap - at, "\"%s\":%" PRId64 ",", METRIC_VAL_STEP,
                               k->val_step);
    }
    FB_ASSERT(at < cap);
    if (buf[at - 1] == ',') at--; /* the last entry's comma */
    snprintf(buf + at, cap - at, "}");
}

/*
 * A writer holding slot b's model (parameters, buffers, counters; metadata
 * "step", the description of fb_array_add_description and "metrics") or,
 * with full, its whole training state (plus optimizer state and the
 * checkpoint metadata).  *hold1 and *hold2 keep the data the writer
 * references alive; the caller frees them after the writer.
 */
static int member_writer(const fb_session *s, int b, bool full, fb_st_writer **out, void **hold1,
                         void **hold2, char *msg, size_t cap)
{
    const fb_array *a = s->a;
    const fb_job_spec *spec = fb_array_spec(a, b);
    int err;
    void *h1 = NULL;
    float *h2 = NULL;
    fb_st_writer *w = fb_st_writer_new();
    if (!w) return fb_errf(msg, cap, FB_ERR_NOMEM, "out of memory");
    if ((err = fb_array_add_tensors(a, b, false, w, &h1, msg, cap))) goto fail;
    char num[32];
    snprintf(num, sizeof num, "%" PRId64, s->step);
    if ((err = fb_st_writer_set_metadata(w, "step", num, msg, cap))) goto fail;
    if ((err = fb_array_add_description(a, b, w, msg, cap))) goto fail;
    char metrics[METRICS_CAP];
    metrics_json(&s->known[s->member[b]], metrics, sizeof metrics);
    if ((err = fb_st_writer_set_metadata(w, "metrics", metrics, msg, cap))) goto fail;
    if (full) {
        const char *names[2];
        fb_array_part parts[2];
        int n_slots = optim_slots(spec, names, parts);
        int n_params = fb_array_tensor_count(a, FB_ARRAY_PARAM);
        size_t floats = 0;
        for (int t = 0; t < n_params; t++)
            floats += fb_array_tensor_at(a, FB_ARRAY_PARAM, t).numel;
        h2 = malloc((floats * (size_t)n_slots + 1) * sizeof *h2);
        if (!h2) {
            err = fb_errf(msg, cap, FB_ERR_NOMEM, "out of memory");
            goto fail;
        }
        float *at = h2;
        for (int k = 0; k < n_slots; k++) {
            for (int t = 0; t < n_params; t++) {
                fb_array_tensor d = fb_array_tensor_at(a, parts[k], t);
                char name[NAME_CAP];
                snprintf(name, sizeof name, "optim.%s.%s", names[k], d.name);
                fb_array_get(a, b, parts[k], t, at);
                if ((err = fb_st_writer_add_f32(w, name, d.shape, d.ndim, at, msg, cap))) goto fail;
                at += d.numel;
            }
        }
        const char *keys[] = {"format",    "fusion_key", "name",           "seed",
                              "data_seed", "loss_scale", "loss_scale_good"};
        char seed[32], data_seed[32], scale[48], good[32];
        snprintf(seed, sizeof seed, "%" PRIu64, (uint64_t)spec->seed);
        snprintf(data_seed, sizeof data_seed, "%" PRIu64, (uint64_t)spec->data_seed);
        /* a power of two has a finite decimal expansion: 25 digits write every
         * scale of [2^-24, 2^64] exactly, so it reads back to the same float */
        snprintf(scale, sizeof scale, "%.25g", (double)fb_array_loss_scale(a, b));
        snprintf(good, sizeof good, "%" PRId64, fb_array_loss_scale_good(a, b));
        const char *values[] = {
            FB_CHECKPOINT_FORMAT, spec->fusion_key, spec->name, seed, data_seed, scale, good};
        /* only a bf16 member has a loss scale */
        size_t n_keys = sizeof keys / sizeof *keys - (spec->precision == FB_PREC_BF16 ? 0 : 2);
        for (size_t k = 0; k < n_keys; k++)
            if ((err = fb_st_writer_set_metadata(w, keys[k], values[k], msg, cap))) goto fail;
    }
    *out = w;
    *hold1 = h1;
    *hold2 = h2;
    return FB_OK;
fail:
    fb_st_writer_free(w);
    free(h1);
    free(h2);
    return err;
}

/* Slot b's bytes: its full state or its model. */
static int member_bytes(const fb_session *s, int b, bool full, void **buf, size_t *len, char *msg,
                        size_t cap)
{
    fb_st_writer *w = NULL;
    void *h1 = NULL, *h2 = NULL;
    int err = member_writer(s, b, full, &w, &h1, &h2, msg, cap);
    if (!err) err = fb_st_write_buffer(w, buf, len, msg, cap);
    fb_st_writer_free(w);
    free(h1);
    free(h2);
    return err;
}

/*
 * Slot b's checkpoint (full) or model at this step, written atomically to
 * out_dir/<stem><suffix> when the session has an out_dir (path receives it,
 * else "") and returned as bytes when it has blobs (*buf, else NULL).
 */
static int member_output(const fb_session *s, int b, bool full, const char *suffix, char *path,
                         void **buf, size_t *len, char *msg, size_t cap)
{
    path[0] = '\0';
    *buf = NULL;
    *len = 0;
    if (!s->opts.out_dir && !s->opts.blobs) return FB_OK;
    fb_st_writer *w = NULL;
    void *h1 = NULL, *h2 = NULL;
    int err = member_writer(s, b, full, &w, &h1, &h2, msg, cap);
    if (!err && s->opts.out_dir) {
        snprintf(path, PATH_CAP, "%s/%s%s", s->opts.out_dir, s->files[s->member[b]], suffix);
        err = fb_st_write(w, path, msg, cap);
        if (err) path[0] = '\0';
    }
    if (!err && s->opts.blobs) err = fb_st_write_buffer(w, buf, len, msg, cap);
    fb_st_writer_free(w);
    free(h1);
    free(h2);
    return err;
}

/* Whether every parameter of slot b is finite. */
static bool params_finite(const fb_session *s, int b, float *tmp)
{
    int n = fb_array_tensor_count(s->a, FB_ARRAY_PARAM);
    for (int t = 0; t < n; t++) {
        fb_array_tensor d = fb_array_tensor_at(s->a, FB_ARRAY_PARAM, t);
        fb_array_get(s->a, b, FB_ARRAY_PARAM, t, tmp);
        for (size_t i = 0; i < d.numel; i++)
            if (!isfinite(tmp[i])) return false;
    }
    return true;
}

/* ---- the session ----------------------------------------------------------- */

int fb_session_new(fb_session **out, fb_backend *be, const fb_job_spec *const *specs, int n,
                   const fb_dataset *train, const fb_dataset *val, const fb_train_opts *opts,
                   char *msg, size_t cap)
{
    if (!out || !be || !specs || n < 1 || !train)
        return fb_errf(msg, cap, FB_ERR_INTERNAL, "fb_session_new: missing argument");
    for (int i = 0; i < n; i++)
        if (!specs[i])
            return fb_errf(msg, cap, FB_ERR_INTERNAL, "fb_session_new: spec %d is NULL", i);
    const fb_job_spec *s0 = specs[0];
    int64_t in_numel = fb_shape_numel(&s0->input);
    int K = (int)fb_shape_numel(&s0->output);
    int err;
    if ((err = check_data(s0, K, train, "train", msg, cap))) return err;
    /* an empty validation set (val_fraction 0) is none */
    if (val && val->n == 0) val = NULL;
    const fb_dataset *test = opts ? opts->test : NULL;
    if ((err = check_data(s0, K, val, "validation", msg, cap))) return err;
    if ((err = check_data(s0, K, test, "test", msg, cap))) return err;
    int64_t bs = s0->batch_size;
    if (train->n < bs)
        return fb_errf(msg, cap, FB_ERR_DATA,
                       "dataset %s has %lld training samples, fewer than batch_size %lld",
                       s0->dataset, (long long)train->n, (long long)bs);
    fb_loader *loader = opts ? opts->loader : NULL;
    if (loader && fb_loader_batch_size(loader) != bs)
        return fb_errf(msg, cap, FB_ERR_INTERNAL,
                       "the loader delivers batches of %lld, the specs train with %lld",
                       (long long)fb_loader_batch_size(loader), (long long)bs);
    int64_t start = opts ? opts->start_step : 0;
    if (start < 0)
        return fb_errf(msg, cap, FB_ERR_OUT_OF_RANGE, "start step %lld is negative",
                       (long long)start);
    for (int i = 0; i < n; i++) {
        int64_t total = fb_train_total_steps(specs[i], train->n);
        if (start >= total)
            return fb_errf(msg, cap, FB_ERR_OUT_OF_RANGE,
                           "job %s trains %lld steps; it cannot start at step %lld", specs[i]->name,
                           (long long)total, (long long)start);
    }

    fb_session *s = calloc(1, sizeof *s);
    if (!s) return fb_errf(msg, cap, FB_ERR_NOMEM, "out of memory");
    s->be = be;
    s->n = n;
    s->train = train;
    s->val = val;
    s->test = test;
    if (opts) s->opts = *opts;
    s->loader = loader;
    s->in_numel = in_numel;
    s->bs = bs;
    s->per_epoch = train->n / bs;
    s->epoch = -1;
    s->step = start;
    size_t un = (size_t)n;
    s->specs = malloc(un * sizeof *s->specs);
    s->member = malloc(un * sizeof *s->member);
    s->total = malloc(un * sizeof *s->total);
    s->files = calloc(un, sizeof *s->files);
    s->perm = loader ? NULL : malloc((size_t)train->n * sizeof *s->perm);
    s->x = malloc((size_t)bs * (size_t)in_numel * sizeof *s->x);
    s->y = malloc((size_t)bs * sizeof *s->y);
    s->loss = malloc(un * sizeof *s->loss);
    s->correct = malloc(un * sizeof *s->correct);
    s->eloss = malloc(un * sizeof *s->eloss);
    s->eacc = malloc(un * sizeof *s->eacc);
    s->tloss = malloc(un * sizeof *s->tloss);
    s->tacc = malloc(un * sizeof *s->tacc);
    s->hp = malloc(un * sizeof *s->hp);
    s->failed = malloc(un * sizeof *s->failed);
    s->last = malloc(un * sizeof *s->last);
    s->ckpt = malloc(un * sizeof *s->ckpt);
    s->why = calloc(un, sizeof *s->why);
    s->fail_loss = malloc(un * sizeof *s->fail_loss);
    s->fail_list = malloc(un * sizeof *s->fail_list);
    s->known = malloc(un * sizeof *s->known);
    if (!s->specs || !s->member || !s->total || !s->files || (!s->perm && !loader) || !s->x ||
        !s->y || !s->loss || !s->correct || !s->eloss || !s->eacc || !s->tloss || !s->tacc ||
        !s->hp || !s->failed ||
        !s->last || !s->ckpt || !s->why || !s->fail_loss || !s->fail_list || !s->known) {
        err = fb_errf(msg, cap, FB_ERR_NOMEM, "out of memory");
        goto fail;
    }
    for (int i = 0; i < n; i++) {
        s->specs[i] = specs[i];
        s->member[i] = i;
        s->known[i] = (member_metrics){.val_step = -1};
        s->total[i] = fb_train_total_steps(specs[i], train->n);
        if (s->total[i] > s->max_total) s->max_total = s->total[i];
        /* two members of one name would overwrite each other's files */
        int dup = 0;
        for (int j = 0; j < i; j++)
            dup |= strcmp(specs[j]->name, specs[i]->name) == 0;
        if (dup)
            snprintf(s->files[i], FILE_CAP, "%s-%d", specs[i]->name, i);
        else
            snprintf(s->files[i], FILE_CAP, "%s", specs[i]->name);
    }
    s->shards = 1;
    if ((s->opts.comm || s->opts.control_comm) && s->opts.pipeline > 1) {
        err = fb_errf(msg, cap, FB_ERR_UNSUPPORTED, "pipeline stages do not span processes");
        goto fail;
    }
    if (s->opts.pipeline > 1) {
        int P = s->opts.pipeline, D = s->opts.n_devices / P;
        if (!s->opts.devices || D < 1 || D * P != s->opts.n_devices || D > FB_DP_MAX_RANKS ||
            D > bs) {
            err = fb_errf(msg, cap, FB_ERR_OUT_OF_RANGE,
                          "%d pipeline stages need a multiple of %d devices (not %d) and a batch "
                          "of at least one sample per data shard",
                          P, P, s->opts.n_devices);
            goto fail;
        }
        int m = s->opts.micro_batches > 0 ? s->opts.micro_batches : 2 * P;
        if (m > bs / D) m = (int)(bs / D);
        if (m > 64) m = 64;
        if ((err = fb_pp_new(s->opts.devices, D, P, m, specs, n, (int)bs, s->opts.dp, &s->pp, msg,
                             cap)))
            goto fail;
        /* the whole model, for evaluation, checkpoints and weights, kept equal to the stages */
        if ((err = fb_array_new(be, specs, n, (int)bs, &s->a, msg, cap))) goto fail;
        s->shards = D;
        if (s->opts.split) {
            int64_t sum = 0;
            for (int d = 0; d < D; d++) {
                if (s->opts.split[d] < 1) sum = -1;
                if (sum >= 0) sum += s->opts.split[d];
            }
            if (sum != bs) {
                err = fb_errf(msg, cap, FB_ERR_OUT_OF_RANGE,
                              "the split of %d shards does not add up to the batch of %lld", D,
                              (long long)bs);
                goto fail;
            }
            memcpy(s->split, s->opts.split, (size_t)D * sizeof *s->split);
        } else {
            fb_dp_even_split(D, (int)bs, NULL, s->split);
        }
    } else if (s->opts.n_devices > 1 || s->opts.comm || s->opts.control_comm) {
        int D = s->opts.n_devices;
        if (!s->opts.devices || D < 1 || D > FB_DP_MAX_RANKS || D > bs) {
            err = fb_errf(msg, cap, FB_ERR_OUT_OF_RANGE,
                          "data parallelism over %d devices needs %d..%d devices and a batch of "
                          "at least that many samples (batch_size %lld)",
                          D, s->opts.comm ? 1 : 2, FB_DP_MAX_RANKS, (long long)bs);
            goto fail;
        }
        /* across processes the communicator joins the local ranks to the others */
        fb_dp_opts dpo = {.slow_rank = -1};
        if (s->opts.dp) dpo = *s->opts.dp;
        if (s->opts.comm) dpo.comm = s->opts.comm;
        if (s->opts.control_comm) dpo.control_comm = s->opts.control_comm;
        if ((err = fb_dp_new(s->opts.devices, D, specs, n, (int)bs, &dpo, &s->dp, msg, cap)))
            goto fail;
        /* the split covers every rank of the world, this process's and the others' */
        D = fb_dp_world(s->dp);
        s->shards = D;
        if (D > bs) {
            err = fb_errf(msg, cap, FB_ERR_OUT_OF_RANGE,
                          "a world of %d ranks needs a batch of at least that many samples "
                          "(batch_size %lld)",
                          D, (long long)bs);
            goto fail;
        }
        s->a = fb_dp_array(s->dp, 0);
        if (s->opts.split) {
            if ((err = fb_dp_check_split(s->dp, s->opts.split, (int)bs, msg, cap))) goto fail;
            memcpy(s->split, s->opts.split, (size_t)D * sizeof *s->split);
        } else {
            fb_dp_even_split(D, (int)bs, NULL, s->split);
        }
    } else if ((err = fb_array_new(be, specs, n, (int)bs, &s->a, msg, cap))) {
        goto fail;
    }
    /* none of these outlive the call (train.h) */
    s->opts.devices = NULL;
    s->opts.split = NULL;
    s->opts.dp = NULL;
    s->opts.comm = NULL; /* dp borrows it; the caller frees it after the session */
    s->opts.control_comm = NULL;
    size_t most = 1;
    for (int t = 0; t < fb_array_tensor_count(s->a, FB_ARRAY_PARAM); t++) {
        size_t k = fb_array_tensor_at(s->a, FB_ARRAY_PARAM, t).numel;
        if (k > most) most = k;
    }
    s->tmp = malloc(most * sizeof *s->tmp);
    if (!s->tmp) {
        err = fb_errf(msg, cap, FB_ERR_NOMEM, "out of memory");
        goto fail;
    }
    /* only once the array (and its init files) are good: bad input writes nothing */
    if (s->opts.out_dir && mkdir(s->opts.out_dir, 0755) != 0) {
        struct stat st;
        if (stat(s->opts.out_dir, &st) != 0 || !S_ISDIR(st.st_mode)) {
            err = fb_errf(msg, cap, FB_ERR_IO, "%s: cannot create the output directory",
                          s->opts.out_dir);
            goto fail;
        }
    }
    s->t_log = now_s();
    *out = s;
    return FB_OK;
fail:
    fb_session_free(s);
    return err;
}

void fb_session_free(fb_session *s)
{
    if (!s) return;
    if (s->dp)
        fb_dp_free(s->dp);
    else
        fb_array_free(s->a);
    fb_pp_free(s->pp);
    free(s->specs);
    free(s->member);
    free(s->total);
    free(s->files);
    free(s->perm);
    free(s->x);
    free(s->y);
    free(s->loss);
    free(s->correct);
    free(s->eloss);
    free(s->eacc);
    free(s->tloss);
    free(s->tacc);
    free(s->hp);
    free(s->failed);
    free(s->last);
    free(s->ckpt);
    free(s->why);
    free(s->fail_loss);
    free(s->fail_list);
    free(s->known);
    free(s->tmp);
    free(s);
}

bool fb_session_done(const fb_session *s)
{
    return fb_array_size(s->a) == 0 || s->step >= s->max_total;
}

int64_t fb_session_steps_done(const fb_session *s)
{
    return s->step;
}

int fb_session_size(const fb_session *s)
{
    return fb_array_size(s->a);
}

bool fb_session_has(const fb_session *s, int member)
{
    return slot_of(s, member) >= 0;
}

int64_t fb_session_total_steps(const fb_session *s, int member)
{
    return member >= 0 && member < s->n ? s->total[member] : 0;
}

void fb_session_detach(fb_session *s, int member)
{
    int b = slot_of(s, member);
    if (b >= 0) remove_slot(s, b);
}

fb_session_times fb_session_take_times(fb_session *s)
{
    fb_session_times t = s->times;
    t.devices = fb_session_devices(s);
    memset(&s->times, 0, sizeof s->times);
    return t;
}

int fb_session_devices(const fb_session *s)
{
    return s->pp ? s->shards * s->opts.pipeline : s->dp ? fb_dp_ranks(s->dp) : 1;
}

int fb_session_shards(const fb_session *s)
{
    return s->shards;
}

int fb_session_set_split(fb_session *s, const int64_t *split, int n, char *msg, size_t cap)
{
    int D = s->shards;
    if (!split || n != D)
        return fb_errf(msg, cap, FB_ERR_OUT_OF_RANGE,
                       "a split of %d shards for a session on %d device%s", split ? n : 0, D,
                       D == 1 ? "" : "s");
    if (s->pp) {
        int64_t sum = 0;
        for (int d = 0; d < D; d++) {
            if (split[d] < 1)
                return fb_errf(msg, cap, FB_ERR_OUT_OF_RANGE,
                               "shard %d of the split has %lld samples (at least 1)", d,
                               (long long)split[d]);
            sum += split[d];
        }
        if (sum != s->bs)
            return fb_errf(msg, cap, FB_ERR_OUT_OF_RANGE,
                           "the split adds up to %lld samples, the batch has %lld",
                           (long long)sum, (long long)s->bs);
        memcpy(s->split, split, (size_t)D * sizeof *split);
        return FB_OK;
    }
    if (!s->dp) {
        if (split[0] != s->bs)
            return fb_errf(msg, cap, FB_ERR_OUT_OF_RANGE,
                           "the split adds up to %lld samples, the batch has %lld",
                           (long long)split[0], (long long)s->bs);
        return FB_OK;
    }
    int err = fb_dp_check_split(s->dp, split, (int)s->bs, msg, cap);
    if (err) return err;
    memcpy(s->split, split, (size_t)D * sizeof *split);
    return FB_OK;
}

int fb_session_broadcast(fb_session *s, int64_t *v, int n, char *msg, size_t cap)
{
    if (!s || (n > 0 && !v)) return fb_errf(msg, cap, FB_ERR_INTERNAL, "missing argument");
    if (!s->dp) return FB_OK; /* one process: its values are rank 0's */
    return fb_dp_broadcast_i64(s->dp, v, n, msg, cap);
}

int fb_session_checkpoint(const fb_session *s, int member, void **buf, size_t *len, char *msg,
                          size_t cap)
{
    int b = slot_of(s, member);
    if (b < 0) return fb_errf(msg, cap, FB_ERR_NOT_FOUND, "member %d is not in the array", member);
    return member_bytes(s, b, true, buf, len, msg, cap);
}

int fb_session_model(const fb_session *s, int member, void **buf, size_t *len, char *msg,
                     size_t cap)
{
    int b = slot_of(s, member);
    if (b < 0) return fb_errf(msg, cap, FB_ERR_NOT_FOUND, "member %d is not in the array", member);
    return member_bytes(s, b, false, buf, len, msg, cap);
}

/* ---- restoring ------------------------------------------------------------- */

/* Parses a metadata value as a non-negative decimal integer. */
static bool meta_u64(const char *v, uint64_t *out)
{
    if (!v || *v < '0' || *v > '9') return false;
    char *end;
    errno = 0;
    unsigned long long x = strtoull(v, &end, 10);
    if (errno || *end) return false;
    *out = (uint64_t)x;
    return true;
}

static const char *fmt_shape(char *buf, size_t cap, const int64_t *shape, int ndim)
{
    size_t at = 0;
    at += (size_t)snprintf(buf, cap, "[");
    for (int i = 0; i < ndim && at < cap; i++)
        at += (size_t)snprintf(buf + at, cap - at, "%s%" PRId64, i ? ", " : "", shape[i]);
    if (at < cap) snprintf(buf + at, cap - at, "]");
    return buf;
}

/* Checks that tensor name is in f with dtype and shape; copies its bytes to dst. */
static int take_tensor(const fb_st_file *f, const char *who, const char *name, fb_st_dtype dtype,
                       const int64_t *shape, int ndim, void *dst, char *msg, size_t cap)
{
    const fb_st_tensor *t = fb_st_find(f, name);
    if (!t) return fb_errf(msg, cap, FB_ERR_CHECKPOINT, "%s: tensor %s is missing", who, name);
    if (t->dtype != dtype)
        return fb_errf(msg, cap, FB_ERR_CHECKPOINT, "%s: tensor %s has dtype %s, expected %s", who,
                       name, fb_st_dtype_name(t->dtype), fb_st_dtype_name(dtype));
    bool same = t->ndim == ndim;
    for (int i = 0; same && i < ndim; i++)
        same = t->shape[i] == shape[i];
    if (!same) {
        char got[160], want[160];
        return fb_errf(msg, cap, FB_ERR_CHECKPOINT, "%s: tensor %s has shape %s, expected %s", who,
                       name, fmt_shape(got, sizeof got, t->shape, t->ndim),
                       fmt_shape(want, sizeof want, shape, ndim));
    }
    memcpy(dst, t->data, t->nbytes);
    return FB_OK;
}

/* Whether name is one of the tensors a checkpoint of slot b holds. */
static bool known_tensor(const fb_session *s, int b, const char *name)
{
    const fb_array *a = s->a;
    const fb_array_part parts[] = {FB_ARRAY_PARAM, FB_ARRAY_BUFFER};
    for (int p = 0; p < 2; p++)
        for (int t = 0; t < fb_array_tensor_count(a, parts[p]); t++)
            if (strcmp(fb_array_tensor_at(a, parts[p], t).name, name) == 0) return true;
    for (int k = 0; k < fb_array_bn_count(a); k++) {
        char bn[NAME_CAP];
        fb_array_bn_name(a, k, bn, sizeof bn);
        if (strcmp(bn, name) == 0) return true;
    }
    const char *names[2];
    fb_array_part oparts[2];
    int n_slots = optim_slots(fb_array_spec(a, b), names, oparts);
    for (int k = 0; k < n_slots; k++) {
        size_t len = strlen(names[k]);
        if (strncmp(name, "optim.", 6) != 0 || strncmp(name + 6, names[k], len) != 0 ||
            name[6 + len] != '.')
            continue;
        for (int t = 0; t < fb_array_tensor_count(a, FB_ARRAY_PARAM); t++)
            if (strcmp(fb_array_tensor_at(a, FB_ARRAY_PARAM, t).name, name + 7 + len) == 0)
                return true;
    }
    return false;
}

/* Checks the checkpoint's metadata against slot b and the session. */
static int check_metadata(const fb_session *s, int b, const fb_st_file *f, const char *who,
                          char *msg, size_t cap)
{
    const fb_job_spec *spec = fb_array_spec(s->a, b);
    const char *format = fb_st_metadata_get(f, "format");
    if (!format || strcmp(format, FB_CHECKPOINT_FORMAT) != 0)
        return fb_errf(msg, cap, FB_ERR_CHECKPOINT,
                       "%s: metadata format is %s%s%s, expected \"%s\"", who, format ? "\"" : "",
                       format ? format : "missing", format ? "\"" : "", FB_CHECKPOINT_FORMAT);
    uint64_t step;
    const char *v = fb_st_metadata_get(f, "step");
    if (!meta_u64(v, &step))
        return fb_errf(msg, cap, FB_ERR_CHECKPOINT,
                       "%s: metadata step is %s, expected a step count", who, v ? v : "missing");
    if (step != (uint64_t)s->step)
        return fb_errf(msg, cap, FB_ERR_CHECKPOINT,
                       "%s: metadata step is %" PRIu64 ", the session is at step %" PRId64, who,
                       step, s->step);
    v = fb_st_metadata_get(f, "fusion_key");
    if (!v || strcmp(v, spec->fusion_key) != 0)
        return fb_errf(msg, cap, FB_ERR_CHECKPOINT,
                       "%s: metadata fusion_key is %s, the job's is %s", who, v ? v : "missing",
                       spec->fusion_key);
    /* the seeds drive the dropout masks and the data order: another seed is another job */
    const char *keys[] = {"seed", "data_seed"};
    uint64_t want[] = {(uint64_t)spec->seed, (uint64_t)spec->data_seed};
    for (int k = 0; k < 2; k++) {
        uint64_t got;
        v = fb_st_metadata_get(f, keys[k]);
        if (!meta_u64(v, &got) || got != want[k])
            return fb_errf(msg, cap, FB_ERR_CHECKPOINT,
                           "%s: metadata %s is %s, the job's is %" PRIu64, who, keys[k],
                           v ? v : "missing", want[k]);
    }
    return FB_OK;
}

/*
 * The loss scale of a checkpoint of slot b: *scale and *good from the
 * metadata "loss_scale" (the scale's exact decimal) and "loss_scale_good"
 * (finite steps since it last changed).  A bf16 checkpoint written before
 * the scale was kept has neither and starts at FB_LOSS_SCALE_INIT with 0
 * steps, as a fresh member does; one key without the other, or either in
 * the checkpoint of a job without a loss scale, is refused.  The range
 * checks are fb_array_set_loss_scale's, made by the caller.
 */
static int read_loss_scale(const fb_session *s, int b, const fb_st_file *f, const char *who,
                           float *scale, int64_t *good, char *msg, size_t cap)
{
    const fb_job_spec *spec = fb_array_spec(s->a, b);
    const char *vs = fb_st_metadata_get(f, "loss_scale");
    const char *vg = fb_st_metadata_get(f, "loss_scale_good");
    if (spec->precision != FB_PREC_BF16) {
        if (vs || vg)
            return fb_errf(msg, cap, FB_ERR_CHECKPOINT,
                           "%s: metadata %s is set, but the job's precision has no loss scale", who,
                           vs ? "loss_scale" : "loss_scale_good");
        *scale = 1.0f;
        *good = 0;
        return FB_OK;
    }
    if (!vs && !vg) {
        *scale = FB_LOSS_SCALE_INIT;
        *good = 0;
        return FB_OK;
    }
    if (!vs || !vg)
        return fb_errf(msg, cap, FB_ERR_CHECKPOINT, "%s: metadata %s is missing (%s is set)", who,
                       vs ? "loss_scale_good" : "loss_scale",
                       vs ? "loss_scale" : "loss_scale_good");
    /* strict: the whole text is one number, exactly a float (the writer's
     * exact decimal is), so a damaged digit is refused, not rounded away */
    char *end;
    errno = 0;
    double x = strtod(vs, &end);
    if (end == vs || *end || errno || !(x > 0 && x <= FLT_MAX) || (double)(float)x != x)
        return fb_errf(msg, cap, FB_ERR_CHECKPOINT,
                       "%s: metadata loss_scale is %s, expected a power of two in [2^-24, 2^64]",
                       who, vs);
    uint64_t g;
    if (!meta_u64(vg, &g) || g > INT64_MAX)
        return fb_errf(msg, cap, FB_ERR_CHECKPOINT,
                       "%s: metadata loss_scale_good is %s, expected a count of steps", who, vg);
    *scale = (float)x;
    *good = (int64_t)g;
    return FB_OK;
}

/* A number of the metrics entry into *out: present with json null (NaN), or
 * a number; *seen tells whether it was present. */
static int metric_value(const json_t *o, const char *key, const char *who, double lo, double hi,
                        bool *seen, double *out, char *msg, size_t cap)
{
    const json_t *v = json_object_get(o, key);
    *seen = v != NULL;
    if (!v) return FB_OK;
    if (json_is_null(v)) {
        *out = NAN;
        return FB_OK;
    }
    if (!json_is_number(v) || !(json_number_value(v) >= lo && json_number_value(v) <= hi))
        return fb_errf(msg, cap, FB_ERR_CHECKPOINT,
                       "%s: metadata metrics.%s is not a number in [%g, %g]", who, key, lo, hi);
    *out = json_number_value(v);
    return FB_OK;
}

/*
 * The metrics entry of a checkpoint at step `step` into *out: absent (a file
 * from before the entry) means nothing known; present, it must be a JSON
 * object whose loss and accuracy come together, as do val_loss,
 * val_accuracy and val_step (at most step), and test_loss and test_accuracy;
 * other keys are ignored, so a later vocabulary (or an earlier one, whose
 * eval_* were test evaluations) still loads.
 */
static int read_metrics(const fb_st_file *f, const char *who, int64_t step, member_metrics *out,
                        char *msg, size_t cap)
{
    member_metrics k = {.val_step = -1};
    const char *text = fb_st_metadata_get(f, "metrics");
    if (!text) {
        *out = k;
        return FB_OK;
    }
    json_t *o = json_loads(text, JSON_REJECT_DUPLICATES, NULL);
    int err = FB_OK;
    if (!json_is_object(o)) {
        err = fb_errf(msg, cap, FB_ERR_CHECKPOINT, "%s: metadata metrics is not a JSON object",
                      who);
        goto done;
    }
    bool has_loss, has_acc, has_eloss, has_eacc, has_tloss, has_tacc;
    double loss = 0;
    if ((err = metric_value(o, METRIC_LOSS, who, 0, HUGE_VAL, &has_loss, &loss, msg, cap)) ||
        (err = metric_value(o, METRIC_ACCURACY, who, 0, 1, &has_acc, &k.accuracy, msg, cap)) ||
        (err = metric_value(o, METRIC_VAL_LOSS, who, 0, HUGE_VAL, &has_eloss, &k.val_loss, msg,
                            cap)) ||
        (err = metric_value(o, METRIC_VAL_ACCURACY, who, 0, 1, &has_eacc, &k.val_accuracy, msg,
                            cap)) ||
        (err = metric_value(o, METRIC_TEST_LOSS, who, 0, HUGE_VAL, &has_tloss, &k.test_loss, msg,
                            cap)) ||
        (err = metric_value(o, METRIC_TEST_ACCURACY, who, 0, 1, &has_tacc, &k.test_accuracy, msg,
                            cap)))
        goto done;
    if (has_tloss != has_tacc) {
        err = fb_errf(msg, cap, FB_ERR_CHECKPOINT, "%s: metadata metrics has %s without %s", who,
                      has_tloss ? METRIC_TEST_LOSS : METRIC_TEST_ACCURACY,
                      has_tloss ? METRIC_TEST_ACCURACY : METRIC_TEST_LOSS);
        goto done;
    }
    k.tested = has_tloss;
    if (has_loss != has_acc) {
        err = fb_errf(msg, cap, FB_ERR_CHECKPOINT, "%s: metadata metrics has %s without %s", who,
                      has_loss ? METRIC_LOSS : METRIC_ACCURACY,
                      has_loss ? METRIC_ACCURACY : METRIC_LOSS);
        goto done;
    }
    k.trained = has_loss;
    k.loss = (float)loss;
    const json_t *es = json_object_get(o, METRIC_VAL_STEP);
    if (es && (!json_is_integer(es) || json_integer_value(es) < 1 ||
               json_integer_value(es) > step)) {
        err = fb_errf(msg, cap, FB_ERR_CHECKPOINT,
                      "%s: metadata metrics.%s is not a step in [1, %" PRId64 "]", who,
                      METRIC_VAL_STEP, step);
        goto done;
    }
    if (has_eloss != has_eacc || has_eloss != (es != NULL)) {
        err = fb_errf(msg, cap, FB_ERR_CHECKPOINT,
                      "%s: metadata metrics needs %s, %s and %s together", who, METRIC_VAL_LOSS,
                      METRIC_VAL_ACCURACY, METRIC_VAL_STEP);
        goto done;
    }
    if (es) k.val_step = (int64_t)json_integer_value(es);
    *out = k;
done:
    json_decref(o);
    return err;
}

int fb_session_restore(fb_session *s, int member, const void *buf, size_t len, char *msg,
                       size_t cap)
{
    int b = slot_of(s, member);
    if (b < 0) return fb_errf(msg, cap, FB_ERR_NOT_FOUND, "member %d is not in the array", member);
    fb_array *a = s->a;
    const fb_job_spec *spec = fb_array_spec(a, b);
    char who[FILE_CAP + 32];
    snprintf(who, sizeof who, "checkpoint of %s", spec->name);
    if (!buf || len == 0) return fb_errf(msg, cap, FB_ERR_CHECKPOINT, "%s: no bytes", who);

    fb_st_file *f = NULL;
    char inner[512];
    int err = fb_st_parse_buffer(buf, len, &f, inner, sizeof inner);
    if (err) {
        if (err == FB_ERR_NOMEM) return fb_errf(msg, cap, err, "%s", inner);
        return fb_errf(msg, cap, FB_ERR_CHECKPOINT, "%s: %s", who, inner);
    }
    const char *names[2];
    fb_array_part oparts[2];
    int n_slots = optim_slots(spec, names, oparts);
    int n_params = fb_array_tensor_count(a, FB_ARRAY_PARAM);
    int n_bufs = fb_array_tensor_count(a, FB_ARRAY_BUFFER);
    int n_bn = fb_array_bn_count(a);
    /* every value lands in scratch first: the member changes only once all of it fits */
    size_t floats = 0;
    for (int t = 0; t < n_params; t++)
        floats += fb_array_tensor_at(a, FB_ARRAY_PARAM, t).numel * (size_t)(1 + n_slots);
    for (int t = 0; t < n_bufs; t++)
        floats += fb_array_tensor_at(a, FB_ARRAY_BUFFER, t).numel;
    float *scratch = malloc((floats + 1) * sizeof *scratch);
    int64_t *tracked = malloc(((size_t)n_bn + 1) * sizeof *tracked);
    if (!scratch || !tracked) {
        err = fb_errf(msg, cap, FB_ERR_NOMEM, "out of memory");
        goto done;
    }
    if ((err = check_metadata(s, b, f, who, msg, cap))) goto done;
    for (size_t i = 0; i < fb_st_count(f); i++) {
        const char *name = fb_st_at(f, i)->name;
        if (!known_tensor(s, b, name)) {
            err = fb_errf(msg, cap, FB_ERR_CHECKPOINT,
                          "%s: tensor %s is not part of this job's training state", who, name);
            goto done;
        }
    }
    float *at = scratch;
    const fb_array_part parts[] = {FB_ARRAY_PARAM, FB_ARRAY_BUFFER};
    for (int p = 0; p < 2; p++) {
        for (int t = 0; t < fb_array_tensor_count(a, parts[p]); t++) {
            fb_array_tensor d = fb_array_tensor_at(a, parts[p], t);
            if ((err = take_tensor(f, who, d.name, FB_ST_F32, d.shape, d.ndim, at, msg, cap)))
                goto done;
            at += d.numel;
        }
    }
    for (int k = 0; k < n_slots; k++) {
        for (int t = 0; t < n_params; t++) {
            fb_array_tensor d = fb_array_tensor_at(a, oparts[k], t);
            char name[NAME_CAP];
            snprintf(name, sizeof name, "optim.%s.%s", names[k], d.name);
            if ((err = take_tensor(f, who, name, FB_ST_F32, d.shape, d.ndim, at, msg, cap)))
                goto done;
            at += d.numel;
        }
    }
    for (int k = 0; k < n_bn; k++) {
        char name[NAME_CAP];
        fb_array_bn_name(a, k, name, sizeof name);
        if ((err = take_tensor(f, who, name, FB_ST_I64, NULL, 0, &tracked[k], msg, cap))) goto done;
        if (tracked[k] < 0) {
            err = fb_errf(msg, cap, FB_ERR_CHECKPOINT, "%s: tensor %s is negative (%" PRId64 ")",
                          who, name, tracked[k]);
            goto done;
        }
    }

    member_metrics known;
    if ((err = read_metrics(f, who, s->step, &known, msg, cap))) goto done;
    float scale = FB_LOSS_SCALE_INIT;
    int64_t good = 0;
    if ((err = read_loss_scale(s, b, f, who, &scale, &good, msg, cap))) goto done;
    if (spec->precision == FB_PREC_BF16) {
        /* the last check; it changes only the scale of a, and only when it passes,
         * after which nothing below fails */
        char inner[256];
        if ((err = fb_array_set_loss_scale(a, b, scale, good, inner, sizeof inner))) {
            const char *vs = fb_st_metadata_get(f, "loss_scale");
            err = fb_errf(msg, cap, FB_ERR_CHECKPOINT,
                          "%s: metadata loss_scale %s, good %" PRId64 ": %s", who,
                          vs ? vs : "(absent)", good, inner);
            goto done;
        }
    }

    /* everything fits: now change the member, in the order it was read, on every
     * data-parallel replica (they hold one state) */
    int replicas = s->dp ? fb_dp_ranks(s->dp) : 1;
    for (int d = 0; d < replicas; d++) {
        fb_array *ad = s->dp ? fb_dp_array(s->dp, d) : a;
        at = scratch;
        for (int p = 0; p < 2; p++) {
            for (int t = 0; t < fb_array_tensor_count(ad, parts[p]); t++) {
                fb_array_set(ad, b, parts[p], t, at);
                at += fb_array_tensor_at(ad, parts[p], t).numel;
            }
        }
        for (int k = 0; k < n_slots; k++) {
            for (int t = 0; t < n_params; t++) {
                fb_array_set(ad, b, oparts[k], t, at);
                at += fb_array_tensor_at(ad, oparts[k], t).numel;
            }
        }
        for (int k = 0; k < n_bn; k++)
            fb_array_set_bn_tracked(ad, b, k, tracked[k]);
        if (spec->precision == FB_PREC_BF16 && ad != a) {
            int rc = fb_array_set_loss_scale(ad, b, scale, good, NULL, 0);
            FB_ASSERT(rc == FB_OK); /* a's replica took the same values */
        }
    }
    if (s->pp) fb_pp_scatter(s->pp, a, b);
    s->known[member] = known;
    err = FB_OK;
done:
    free(scratch);
    free(tracked);
    fb_st_close(f);
    return err;
}

int fb_session_load_weights(fb_session *s, int member, const void *buf, size_t len, char *msg,
                            size_t cap)
{
    int b = slot_of(s, member);
    if (b < 0) return fb_errf(msg, cap, FB_ERR_NOT_FOUND, "member %d is not in the array", member);
    if (s->step != 0)
        return fb_errf(msg, cap, FB_ERR_STATE_CONFLICT,
                       "initial weights are for a session at step 0, this one is at %lld",
                       (long long)s->step);
    fb_array *a = s->a;
    if (!buf || len == 0) return fb_errf(msg, cap, FB_ERR_CHECKPOINT, "the init weights: no bytes");
    int err = fb_array_load_buffer(a, b, buf, len, "the init weights", msg, cap);
    if (err) return err;
    /* the data-parallel replicas hold one state: they take what the first took */
    int replicas = s->dp ? fb_dp_ranks(s->dp) : 1;
    const fb_array_part parts[] = {FB_ARRAY_PARAM, FB_ARRAY_BUFFER};
    size_t most = 1;
    for (int p = 0; p < 2; p++)
        for (int t = 0; t < fb_array_tensor_count(a, parts[p]); t++)
            if (fb_array_tensor_at(a, parts[p], t).numel > most)
                most = fb_array_tensor_at(a, parts[p], t).numel;
    float *tmp = replicas > 1 ? malloc(most * sizeof *tmp) : NULL;
    if (replicas > 1 && !tmp) return fb_errf(msg, cap, FB_ERR_NOMEM, "out of memory");
    for (int d = 0; d < replicas; d++) {
        fb_array *ad = s->dp ? fb_dp_array(s->dp, d) : a;
        if (ad == a) continue;
        for (int p = 0; p < 2; p++)
            for (int t = 0; t < fb_array_tensor_count(a, parts[p]); t++) {
                fb_array_get(a, b, parts[p], t, tmp);
                fb_array_set(ad, b, parts[p], t, tmp);
            }
        for (int k = 0; k < fb_array_bn_count(a); k++)
            fb_array_set_bn_tracked(ad, b, k, fb_array_bn_tracked(a, b, k));
    }
    free(tmp);
    if (s->pp) fb_pp_scatter(s->pp, a, b);
    return FB_OK;
}

/* ---- one step -------------------------------------------------------------- */

/* The minibatch of the current step into bx, by (from the loader or memory). */
static int next_batch(fb_session *s, const float **bx, const int32_t **by, char *msg, size_t cap)
{
    if (s->loader) {
        fb_loader_batch lb;
        int err = fb_loader_next(&lb, s->loader, msg, cap);
        if (err) return err;
        *bx = lb.x;
        *by = lb.y;
        return FB_OK;
    }
    const fb_job_spec *s0 = s->specs[0];
    int64_t e = s->step / s->per_epoch, k = s->step % s->per_epoch;
    if (e != s->epoch) {
        epoch_order(s->perm, s->train->n, s0->data_seed, e, s0->shuffle);
        s->epoch = e;
    }
    for (int64_t i = 0; i < s->bs; i++) {
        int64_t src = s->perm[k * s->bs + i];
        memcpy(s->x + i * s->in_numel, s->train->x + src * s->in_numel,
               (size_t)s->in_numel * sizeof *s->x);
        s->y[i] = s->train->y[src];
    }
    *bx = s->x;
    *by = s->y;
    return FB_OK;
}

/* Decides each slot's fate at this step: failed (non-finite loss, or parameters
 * at a step whose state leaves the array), last, or due for a checkpoint. */
static void classify(fb_session *s, int64_t done_steps)
{
    int B = fb_array_size(s->a);
    for (int b = 0; b < B; b++) {
        const fb_job_spec *spec = fb_array_spec(s->a, b);
        bool last = done_steps == s->total[s->member[b]];
        bool ckpt = spec->checkpoint_every && !last && done_steps % spec->checkpoint_every == 0;
        s->last[b] = s->ckpt[b] = false;
        if (s->failed[b]) continue;
        /* the loss is checked every step; the parameters only where they are about to be
         * kept (a checkpoint, the final weights), since the next step's loss covers the rest */
        if ((last || ckpt) && !params_finite(s, b, s->tmp)) {
            s->failed[b] = true;
            snprintf(s->why[s->member[b]], TEXT_CAP,
                     "parameters are not finite after step %" PRId64, done_steps);
            continue;
        }
        s->last[b] = last;
        s->ckpt[b] = ckpt;
    }
}

int fb_session_step(fb_session *s, char *msg, size_t cap)
{
    if (fb_session_done(s)) return FB_OK;
    fb_array *a = s->a;
    int err;

    /* the minibatch, and how long the step waited for it */
    double t0 = now_s();
    const float *bx;
    const int32_t *by;
    if ((err = next_batch(s, &bx, &by, msg, cap))) return err;
    double t1 = now_s();
    s->wait_since += t1 - t0;
    s->steps_since++;

    int B = fb_array_size(a);
    int64_t done_steps = s->step + 1;
    if (s->pp) {
        /* the pipeline updates within its step, so the hyperparameters come first; a
         * member whose loss turns out not finite leaves below, and its update goes
         * with it */
        for (int b = 0; b < B; b++)
            fb_array_hparams(a, b, done_steps, s->total[s->member[b]], &s->hp[b]);
        err = fb_pp_train_step(s->pp, bx, by, (int)s->bs, s->split, (uint64_t)s->step, s->hp,
                               s->loss, s->correct, msg, cap);
    } else if (s->dp) {
        err = fb_dp_forward_backward(s->dp, bx, by, (int)s->bs, s->split, (uint64_t)s->step,
                                     s->loss, s->correct, msg, cap);
    } else {
        err = fb_array_forward_backward(a, bx, by, (int)s->bs, true, (uint64_t)s->step, s->loss,
                                        s->correct, msg, cap);
    }
    if (err) return err;
    for (int b = 0; b < B; b++) {
        /* each member's loss is its own mean (no sum over members feeds back), so one
         * member's NaN stays in its slot; its update is skipped and it leaves below */
        s->failed[b] = !isfinite(s->loss[b]);
        if (s->failed[b]) {
            memset(&s->hp[b], 0, sizeof s->hp[b]); /* lr 0 and t 0: an empty slot */
            snprintf(s->why[s->member[b]], TEXT_CAP, "loss is %s at step %" PRId64,
                     isnan(s->loss[b]) ? "NaN"
                     : s->loss[b] > 0  ? "+inf"
                                       : "-inf",
                     done_steps);
            continue;
        }
        fb_array_hparams(a, b, done_steps, s->total[s->member[b]], &s->hp[b]);
        member_metrics *k = &s->known[s->member[b]];
        k->trained = true;
        k->loss = s->loss[b];
        k->accuracy = s->correct[b] / (double)s->bs;
    }
    if (s->pp)
        fb_pp_gather(s->pp, a); /* the whole model's view, for what follows the step */
    else if (s->dp)
        fb_dp_step(s->dp, s->hp);
    else
        fb_array_step(a, s->hp);
    s->step = done_steps;
    s->samples_since += s->bs * B;
    double t2 = now_s();
    double io = 1e3 * (t1 - t0), wall = 1e3 * (t2 - t1);
    s->times.io_ms += io;
    int n_dev = fb_session_devices(s);
    fb_session_device_times *dv = s->times.dev;
    if (n_dev > FB_SESSION_MAX_DEVICES) n_dev = 0; /* more than a group has: means only */
    for (int k = 0; k < n_dev; k++) dv[k].io_ms += io;
    if (s->pp) {
        /* the stages' mean busy time is compute; the rest of the step is the bubble */
        fb_pp_times pt = fb_pp_take_times(s->pp);
        double busy = 0;
        for (int p = 0; p < pt.P; p++) busy += pt.busy_ms[p] / pt.P;
        s->times.compute_ms += busy;
        s->times.idle_ms += wall > busy ? wall - busy : 0;
        /* a device's own compute and exposed communication; the rest of the step it waited,
         * for its neighbours in the pipeline or the slower shard */
        for (int k = 0; k < n_dev && pt.D * pt.P == n_dev; k++) {
            double rest = wall - pt.compute_ms[k] - pt.comm_ms[k];
            dv[k].compute_ms += pt.compute_ms[k];
            dv[k].comm_ms += pt.comm_ms[k];
            dv[k].idle_ms += rest > 0 ? rest : 0;
            dv[k].samples += pt.samples[k];
            dv[k].pass_ms += pt.pass_ms[k];
        }
    } else if (s->dp) {
        /* the step's wall time, split into the devices' mean compute, their mean wait
         * for communication, and the rest: waiting for the slowest device */
        fb_dp_times dt = fb_dp_take_times(s->dp);
        double compute = 0, comm = 0;
        for (int d = 0; d < dt.D; d++) {
            compute += dt.compute_ms[d] / dt.D;
            comm += dt.comm_exposed_ms[d] / dt.D;
        }
        double idle = wall - compute - comm;
        s->times.compute_ms += compute;
        s->times.comm_ms += comm;
        s->times.idle_ms += idle > 0 ? idle : 0;
        for (int d = 0; d < n_dev && dt.D == n_dev; d++) {
            double rest = wall - dt.compute_ms[d] - dt.comm_exposed_ms[d];
            dv[d].compute_ms += dt.compute_ms[d];
            dv[d].comm_ms += dt.comm_exposed_ms[d];
            dv[d].idle_ms += rest > 0 ? rest : 0;
            dv[d].samples += dt.samples[d];
            dv[d].pass_ms += dt.pass_ms[d];
        }
    } else {
        s->times.compute_ms += wall;
        if (n_dev == 1) {
            dv[0].compute_ms += wall;
            dv[0].samples += s->bs;
            dv[0].pass_ms += wall; /* one device: no split to tell the update from */
        }
    }
    s->times.steps++;

    classify(s, done_steps);

    /* reports, evaluations, checkpoints and departures, in that order */
    const fb_train_opts *o = &s->opts;
    bool log_now = o->log_every > 0 && done_steps % o->log_every == 0;
    double rate = 0, io_ms = 0;
    /* a member's last step is reported too, so it needs a rate even off the log grid */
    bool any_last = false;
    for (int b = 0; b < B; b++)
        any_last |= s->last[b];
    if (log_now || any_last) {
        double t = now_s();
        rate = (double)s->samples_since / (t - s->t_log > 1e-9 ? t - s->t_log : 1e-9);
        io_ms = 1e3 * s->wait_since / (double)s->steps_since;
        s->t_log = t;
        s->samples_since = 0;
        s->steps_since = 0;
        s->wait_since = 0;
    }
    bool need_eval = false, need_test = false;
    for (int b = 0; b < B; b++) {
        if (s->failed[b]) continue;
        const fb_job_spec *spec = fb_array_spec(a, b);
        int i = s->member[b];
        if (log_now || s->last[b]) {
            fb_train_event ev = {.kind = FB_TRAIN_STEP,
                                 .member = i,
                                 .spec = spec,
                                 .step = done_steps,
                                 .steps = s->total[i],
                                 .array_size = B,
                                 .loss = s->loss[b],
                                 .accuracy = s->correct[b] / (double)s->bs,
                                 .lr = s->hp[b].lr,
                                 .samples_per_s = rate,
                                 .io_wait_ms = io_ms};
            emit(s, &ev);
        }
        if (s->val && (s->last[b] || (spec->eval_every && done_steps % spec->eval_every == 0)))
            need_eval = true;
        if (s->test && s->last[b]) need_test = true;
    }
    /* the test split once, at a member's end: reported, never a basis for a decision */
    if (need_test) {
        if ((err = evaluate(a, s->test, s->in_numel, (int)s->bs, s->tloss, s->tacc, msg, cap)))
            goto out;
        for (int b = 0; b < B; b++) {
            if (s->failed[b] || !s->last[b]) continue;
            member_metrics *k = &s->known[s->member[b]];
            k->tested = true;
            k->test_loss = s->tloss[b];
            k->test_accuracy = s->tacc[b];
        }
    }
    if (need_eval) {
        if ((err = evaluate(a, s->val, s->in_numel, (int)s->bs, s->eloss, s->eacc, msg, cap)))
            goto out;
        for (int b = 0; b < B; b++) {
            const fb_job_spec *spec = fb_array_spec(a, b);
            if (s->failed[b] ||
                (!s->last[b] && !(spec->eval_every && done_steps % spec->eval_every == 0)))
                continue;
            int i = s->member[b];
            s->known[i].val_step = done_steps;
            s->known[i].val_loss = s->eloss[b];
            s->known[i].val_accuracy = s->eacc[b];
            fb_train_event ev = {.kind = FB_TRAIN_EVAL,
                                 .member = i,
                                 .spec = spec,
                                 .step = done_steps,
                                 .steps = s->total[i],
                                 .array_size = B,
                                 .loss = s->eloss[b],
                                 .accuracy = s->eacc[b]};
            emit(s, &ev);
        }
    }
    for (int b = 0; b < B; b++) {
        if (!s->ckpt[b]) continue;
        char path[PATH_CAP];
        void *blob;
        size_t blob_len;
        if ((err = member_output(s, b, true, ".checkpoint.safetensors", path, &blob, &blob_len, msg,
                                 cap)))
            goto out;
        int i = s->member[b];
        fb_train_event ev = {.kind = FB_TRAIN_CHECKPOINT,
                             .member = i,
                             .spec = fb_array_spec(a, b),
                             .step = done_steps,
                             .steps = s->total[i],
                             .array_size = B,
                             .loss = s->loss[b],
                             .accuracy = s->correct[b] / (double)s->bs,
                             .weights_path = path[0] ? path : NULL,
                             .blob = blob,
                             .blob_len = blob_len};
        emit(s, &ev);
        free(blob);
    }
    /* failures are noted by member before anyone leaves: leaving renumbers the slots */
    int n_failed = 0;
    for (int b = B - 1; b >= 0; b--) {
        if (!s->failed[b]) continue;
        s->fail_list[n_failed++] = s->member[b];
        s->fail_loss[s->member[b]] = s->loss[b];
    }
    /* finished members leave, highest slot first so lower slots keep their place */
    for (int b = B - 1; b >= 0 && !err; b--) {
        if (!s->last[b]) continue;
        char path[PATH_CAP];
        void *blob;
        size_t blob_len;
        if ((err = member_output(s, b, false, ".safetensors", path, &blob, &blob_len, msg, cap)))
            break;
        int i = s->member[b];
        fb_train_event ev = {.kind = FB_TRAIN_DONE,
                             .member = i,
                             .spec = fb_array_spec(a, b),
                             .step = done_steps,
                             .steps = s->total[i],
                             .array_size = fb_array_size(a),
                             /* the final validation; without a validation set none, never
                              * the last step's training values under its name */
                             .loss = s->val ? s->eloss[b] : NAN,
                             .accuracy = s->val ? s->eacc[b] : NAN,
                             .test_loss = s->test ? s->tloss[b] : NAN,
                             .test_accuracy = s->test ? s->tacc[b] : NAN,
                             .weights_path = path[0] ? path : NULL,
                             .blob = blob,
                             .blob_len = blob_len};
        emit(s, &ev);
        free(blob);
        remove_slot(s, b);
    }
    for (int k = 0; k < n_failed && !err; k++) {
        int i = s->fail_list[k];
        fb_train_event ev = {.kind = FB_TRAIN_FAILED,
                             .member = i,
                             .spec = s->specs[i],
                             .step = done_steps,
                             .steps = s->total[i],
                             .array_size = fb_array_size(a),
                             .loss = s->fail_loss[i],
                             .accuracy = NAN,
                             .err = FB_ERR_DIVERGED,
                             .text = s->why[i]};
        emit(s, &ev);
        remove_slot(s, slot_of(s, i));
    }
out:
    s->times.other_ms += 1e3 * (now_s() - t2);
    return err;
}
