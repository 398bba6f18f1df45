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
 *
 * This file is what every engine shares (session_impl.h): opening, the
 * minibatches, each step's events and departures.  How the array trains (one
 * device, data-parallel replicas, pipeline stages) is the engine's;
 * checkpoints and restoring are in session_checkpoint.c.
 */
#include <inttypes.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>

#include "rng.h"
#include "session_impl.h"

#define DATA_STREAM 0x64617461ULL /* "data": the shuffle's RNG stream */

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
                    double *acc, char *msg, size_t msg_cap)
{
    int B = fb_array_size(a);
    float *l = calloc((size_t)B, sizeof *l), *c = calloc((size_t)B, sizeof *c);
    if (!l || !c) {
        free(l);
        free(c);
        return fb_errf(msg, msg_cap, FB_ERR_NOMEM, "out of memory");
    }
    for (int b = 0; b < B; b++)
        loss[b] = acc[b] = 0;
    int err = FB_OK;
    for (int64_t i = 0; i < test->n; i += chunk) {
        int N = (int)(test->n - i < chunk ? test->n - i : chunk);
        err = fb_array_forward_backward(a, test->x + i * in_numel, test->y + i, N, false, 0, l, c,
                                        msg, msg_cap);
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

/*
 * A token model's dataset (docs/jobspec.md, "Token models"): records of T + 1
 * ids for a language model, T for one that pools, each an integer in [0, V),
 * and labels for one that pools.  Ids held in memory are checked here, so a
 * mismatched dataset fails when training opens rather than at some step.
 */
static int check_token_data(const fb_job_spec *s, const fb_dataset *ds, const char *split,
                            char *msg, size_t msg_cap)
{
    int64_t rec = (int64_t)ds->C * ds->H * ds->W;
    if (rec != fb_shape_numel(&s->input))
        return fb_errf(msg, msg_cap, FB_ERR_DATA,
                       "dataset %s (%s) has records of %lld values; the model (model.input.tokens "
                       "%lld, %s) reads records of %lld tokens",
                       s->dataset, split, (long long)rec, (long long)s->tokens,
                       s->lm ? "a language model: T + 1" : "pooled: T",
                       (long long)fb_shape_numel(&s->input));
    if (!s->lm && ds->n_classes < 2)
        return fb_errf(msg, msg_cap, FB_ERR_DATA,
                       "dataset %s (%s) has no labels; a model with a pool layer is a classifier "
                       "(remove the pool layer for a language model)",
                       s->dataset, split);
    if (ds->n < 1)
        return fb_errf(msg, msg_cap, FB_ERR_DATA, "dataset %s (%s) is empty", s->dataset, split);
    if (!ds->x) return FB_OK;
    for (int64_t i = 0; i < ds->n * rec; i++) {
        float v = ds->x[i];
        if (!(v >= 0 && v < (float)s->vocab && v == floorf(v)))
            return fb_errf(msg, msg_cap, FB_ERR_DATA,
                           "dataset %s (%s) record %lld position %lld: %g is not a token id below "
                           "the model's vocab %lld (model.input.vocab)",
                           s->dataset, split, (long long)(i / rec), (long long)(i % rec), (double)v,
                           (long long)s->vocab);
    }
    return FB_OK;
}

/* A token model against the manifest of a shard dataset read by a loader, whose train
 * records are not in memory for check_token_data to scan: token ids (int32, within the
 * model's vocab, or float32 values the array checks as they arrive), not images. */
static int check_token_manifest(const fb_job_spec *s, const fb_manifest *m, char *msg,
                                size_t msg_cap)
{
    if (m->dtype == FB_DTYPE_U8)
        return fb_errf(msg, msg_cap, FB_ERR_DATA,
                       "dataset %s holds uint8 samples (images); a token model "
                       "(model.input.tokens) reads token ids: an int32 dataset, or float32 "
                       "values that are ids",
                       s->dataset);
    if (m->dtype == FB_DTYPE_I32 && m->vocab > s->vocab)
        return fb_errf(msg, msg_cap, FB_ERR_DATA,
                       "dataset %s has a vocabulary of %lld tokens; the model's model.input.vocab "
                       "is %lld",
                       s->dataset, (long long)m->vocab, (long long)s->vocab);
    return FB_OK;
}

/* What a token model's session needs besides its data (check_data): one device, since its
 * loss is a mean over N*T positions, which the engines that split a batch do not scale for
 * (the spec refuses parallel for them, docs/jobspec.md), and a fitting loader's manifest. */
static int check_token_run(const fb_job_spec *s, const fb_train_opts *o, char *msg,
                           size_t msg_cap)
{
    if (!o) return FB_OK;
    if (o->pipeline > 1 || o->n_devices > 1 || o->comm || o->control_comm)
        return fb_errf(msg, msg_cap, FB_ERR_UNSUPPORTED,
                       "job %s: token models (model.input.tokens) train on one device", s->name);
    return o->loader ? check_token_manifest(s, fb_loader_manifest(o->loader), msg, msg_cap)
                     : FB_OK;
}

static int check_data(const fb_job_spec *s, int K, const fb_dataset *ds, const char *split,
                      char *msg, size_t msg_cap)
{
    if (!ds) return FB_OK;
    if (s->tokens) return check_token_data(s, ds, split, msg, msg_cap);
    int64_t numel = (int64_t)ds->C * ds->H * ds->W;
    if (numel != fb_shape_numel(&s->input))
        return fb_errf(msg, msg_cap, FB_ERR_DATA,
                       "dataset %s (%s) has samples of %d x %d x %d values; the model input "
                       "has %lld",
                       s->dataset, split, ds->C, ds->H, ds->W,
                       (long long)fb_shape_numel(&s->input));
    if (s->loss == FB_LOSS_CROSS_ENTROPY && ds->n_classes > K)
        return fb_errf(msg, msg_cap, FB_ERR_DATA,
                       "dataset %s has %d classes; the model has only %d outputs", s->dataset,
                       ds->n_classes, K);
    if (ds->n < 1)
        return fb_errf(msg, msg_cap, FB_ERR_DATA, "dataset %s (%s) is empty", s->dataset, split);
    return FB_OK;
}

/* The slot of member i (session_impl.h). */
int fb_session_slot(const fb_session *s, int i)
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
    s->engine->remove(s, b);
    for (int j = b; j + 1 < B; j++) {
        s->member[j] = s->member[j + 1];
        s->worig[j] = s->worig[j + 1];
    }
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

/* The minibatches of a window take at most this much memory. */
#define WINDOW_BYTES ((size_t)16 << 20)

/* The options' window and its bound in milliseconds. */
static int check_window(const fb_train_opts *o, char *msg, size_t msg_cap)
{
    if (o->window < 0 || o->window > FB_SESSION_MAX_WINDOW)
        return fb_errf(msg, msg_cap, FB_ERR_OUT_OF_RANGE,
                       "a window of %d steps; it is 0 or 1 (one step a call) to %d", o->window,
                       FB_SESSION_MAX_WINDOW);
    if (!(o->window_ms >= 0 && o->window_ms <= 1e9))
        return fb_errf(msg, msg_cap, FB_ERR_OUT_OF_RANGE,
                       "a window of %g ms; it is 0 (no bound) to 1e9", o->window_ms);
    return FB_OK;
}

/* Sizes s->window from the options and the engine and allocates its buffers. */
static int window_open(fb_session *s, char *msg, size_t msg_cap)
{
    s->window = 1;
    if (s->opts.window <= 1 || !s->engine->train_steps) return FB_OK;
    size_t batch = (size_t)s->bs * ((size_t)s->in_numel * sizeof(float) + sizeof(int32_t));
    int w = s->opts.window;
    while (w > 1 && (size_t)w * batch > WINDOW_BYTES) w--;
    if (w <= 1) return FB_OK;
    size_t slots = (size_t)w * (size_t)s->n;
    s->wx = calloc((size_t)w, sizeof *s->wx);
    s->wy = calloc((size_t)w, sizeof *s->wy);
    s->whp = malloc(slots * sizeof *s->whp);
    s->wloss = malloc(slots * sizeof *s->wloss);
    s->wcorrect = malloc(slots * sizeof *s->wcorrect);
    if (!s->wx || !s->wy || !s->whp || !s->wloss || !s->wcorrect)
        return fb_errf(msg, msg_cap, FB_ERR_NOMEM, "out of memory");
    s->window = w;
    for (int j = 0; j < w; j++) {
        s->wx[j] = malloc((size_t)s->bs * (size_t)s->in_numel * sizeof *s->wx[j]);
        s->wy[j] = malloc((size_t)s->bs * sizeof *s->wy[j]);
        if (!s->wx[j] || !s->wy[j])
            return fb_errf(msg, msg_cap, FB_ERR_NOMEM, "out of memory for a window's minibatches");
    }
    return FB_OK;
}

int fb_session_new(fb_session **out, fb_backend *be, const fb_job_spec *const *specs, int n,
                   const fb_dataset *train, const fb_dataset *val, const fb_train_opts *opts,
                   char *msg, size_t msg_cap)
{
    if (!out || !be || !specs || n < 1 || !train)
        return fb_errf(msg, msg_cap, FB_ERR_INTERNAL, "fb_session_new: missing argument");
    for (int i = 0; i < n; i++)
        if (!specs[i])
            return fb_errf(msg, msg_cap, FB_ERR_INTERNAL, "fb_session_new: spec %d is NULL", i);
    const fb_job_spec *s0 = specs[0];
    int64_t in_numel = fb_shape_numel(&s0->input);
    int K = (int)fb_shape_numel(&s0->output);
    int err;
    if ((err = check_data(s0, K, train, "train", msg, msg_cap))) return err;
    if (s0->tokens && (err = check_token_run(s0, opts, msg, msg_cap))) return err;
    /* an empty validation set (val_fraction 0) is none */
    if (val && val->n == 0) val = NULL;
    const fb_dataset *test = opts ? opts->test : NULL;
    if ((err = check_data(s0, K, val, "validation", msg, msg_cap))) return err;
    if ((err = check_data(s0, K, test, "test", msg, msg_cap))) return err;
    int64_t bs = s0->batch_size;
    if (train->n < bs)
        return fb_errf(msg, msg_cap, FB_ERR_DATA,
                       "dataset %s has %lld training samples, fewer than batch_size %lld",
                       s0->dataset, (long long)train->n, (long long)bs);
    fb_loader *loader = opts ? opts->loader : NULL;
    if (loader && fb_loader_batch_size(loader) != bs)
        return fb_errf(msg, msg_cap, FB_ERR_INTERNAL,
                       "the loader delivers batches of %lld, the specs train with %lld",
                       (long long)fb_loader_batch_size(loader), (long long)bs);
    if (opts && (err = check_window(opts, msg, msg_cap))) return err;
    int64_t start = opts ? opts->start_step : 0;
    if (start < 0)
        return fb_errf(msg, msg_cap, FB_ERR_OUT_OF_RANGE, "start step %lld is negative",
                       (long long)start);
    for (int i = 0; i < n; i++) {
        int64_t total = fb_train_total_steps(specs[i], train->n);
        if (start >= total)
            return fb_errf(msg, msg_cap, FB_ERR_OUT_OF_RANGE,
                           "job %s trains %lld steps; it cannot start at step %lld", specs[i]->name,
                           (long long)total, (long long)start);
    }

    fb_session *s = calloc(1, sizeof *s);
    if (!s) return fb_errf(msg, msg_cap, FB_ERR_NOMEM, "out of memory");
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
    s->worig = malloc(un * sizeof *s->worig);
    if (!s->worig || !s->specs || !s->member || !s->total || !s->files ||
        (!s->perm && !loader) || !s->x || !s->y || !s->loss || !s->correct || !s->eloss || !s->eacc || !s->tloss || !s->tacc ||
        !s->hp || !s->failed ||
        !s->last || !s->ckpt || !s->why || !s->fail_loss || !s->fail_list || !s->known) {
        err = fb_errf(msg, msg_cap, FB_ERR_NOMEM, "out of memory");
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
    /* the engine: pipeline stages, data-parallel replicas, or the array on one device */
    if (s->opts.pipeline > 1)
        s->engine = &fb_session_engine_pipeline;
    else if (s->opts.n_devices > 1 || s->opts.comm || s->opts.control_comm)
        s->engine = &fb_session_engine_data_parallel;
    else
        s->engine = &fb_session_engine_single;
    if ((err = s->engine->open(s, specs, n, msg, msg_cap))) goto fail;
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
        err = fb_errf(msg, msg_cap, FB_ERR_NOMEM, "out of memory");
        goto fail;
    }
    if ((err = window_open(s, msg, msg_cap))) goto fail;
    /* only once the array (and its init files) are good: bad input writes nothing */
    if (s->opts.out_dir && mkdir(s->opts.out_dir, 0755) != 0) {
        struct stat st;
        if (stat(s->opts.out_dir, &st) != 0 || !S_ISDIR(st.st_mode)) {
            err = fb_errf(msg, msg_cap, FB_ERR_IO, "%s: cannot create the output directory",
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
    if (s->engine) s->engine->free(s);
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
    for (int j = 0; s->wx && j < s->window; j++) {
        free(s->wx[j]);
        free(s->wy[j]);
    }
    free(s->wx);
    free(s->wy);
    free(s->whp);
    free(s->wloss);
    free(s->wcorrect);
    free(s->worig);
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
    return fb_session_slot(s, member) >= 0;
}

int64_t fb_session_total_steps(const fb_session *s, int member)
{
    return member >= 0 && member < s->n ? s->total[member] : 0;
}

void fb_session_detach(fb_session *s, int member)
{
    int b = fb_session_slot(s, member);
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
    return s->engine->devices(s);
}

int fb_session_shards(const fb_session *s)
{
    return s->shards;
}

int fb_session_set_split(fb_session *s, const int64_t *split, int n, char *msg, size_t msg_cap)
{
    int D = s->shards;
    if (!split || n != D)
        return fb_errf(msg, msg_cap, FB_ERR_OUT_OF_RANGE,
                       "a split of %d shards for a session on %d device%s", split ? n : 0, D,
                       D == 1 ? "" : "s");
    return s->engine->set_split(s, split, msg, msg_cap);
}

int fb_session_broadcast(fb_session *s, int64_t *v, int n, char *msg, size_t msg_cap)
{
    if (!s || (n > 0 && !v)) return fb_errf(msg, msg_cap, FB_ERR_INTERNAL, "missing argument");
    if (!s->engine->broadcast) return FB_OK; /* one process: its values are rank 0's */
    return s->engine->broadcast(s, v, n, msg, msg_cap);
}

/* ---- one step -------------------------------------------------------------- */

/* The minibatch of the current step into bx, by (from the loader or memory). */
/* The minibatch of step (0-based): in dx, dy where they are given (a
 * window's), else in the loader's buffers or s->x, s->y; *bx, *by say where. */
static int next_batch(fb_session *s, int64_t step, float *dx, int32_t *dy, const float **bx,
                      const int32_t **by, char *msg, size_t msg_cap)
{
    size_t xn = (size_t)s->bs * (size_t)s->in_numel;
    if (s->loader) {
        fb_loader_batch lb;
        int err = fb_loader_next(&lb, s->loader, msg, msg_cap);
        if (err) return err;
        *bx = lb.x;
        *by = lb.y;
        if (dx) {
            memcpy(dx, lb.x, xn * sizeof *dx);
            memcpy(dy, lb.y, (size_t)s->bs * sizeof *dy);
            *bx = dx;
            *by = dy;
        }
        return FB_OK;
    }
    if (!dx) {
        dx = s->x;
        dy = s->y;
    }
    const fb_job_spec *s0 = s->specs[0];
    int64_t e = step / s->per_epoch, k = step % s->per_epoch;
    if (e != s->epoch) {
        epoch_order(s->perm, s->train->n, s0->data_seed, e, s0->shuffle);
        s->epoch = e;
    }
    for (int64_t i = 0; i < s->bs; i++) {
        int64_t src = s->perm[k * s->bs + i];
        memcpy(dx + i * s->in_numel, s->train->x + src * s->in_numel,
               (size_t)s->in_numel * sizeof *dx);
        dy[i] = s->train->y[src];
    }
    *bx = dx;
    *by = dy;
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

/* The step's events of the members that stay or are due a file: STEP on the
 * log grid and at a member's last step, the test evaluation at its end,
 * EVAL, CHECKPOINT (writing the file first). */
static int report(fb_session *s, int B, int64_t done_steps, char *msg, size_t msg_cap)
{
    fb_array *a = s->a;
    int err;
    const fb_train_opts *o = &s->opts;
    bool log_now = o->log_every > 0 && done_steps % o->log_every == 0;
    double rate = 0, io_ms = 0;
    /* a member's last step is reported too, so it needs a rate even off the log grid */
    bool any_last = false;
    for (int b = 0; b < B; b++)
        any_last |= s->last[b];
    if (log_now || any_last) {
        double t = s->t_now;
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
        if ((err = evaluate(a, s->test, s->in_numel, (int)s->bs, s->tloss, s->tacc, msg, msg_cap)))
            return err;
        for (int b = 0; b < B; b++) {
            if (s->failed[b] || !s->last[b]) continue;
            member_metrics *k = &s->known[s->member[b]];
            k->tested = true;
            k->test_loss = s->tloss[b];
            k->test_accuracy = s->tacc[b];
        }
    }
    if (need_eval) {
        if ((err = evaluate(a, s->val, s->in_numel, (int)s->bs, s->eloss, s->eacc, msg, msg_cap)))
            return err;
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
        if ((err = fb_session_member_output(s, b, true, ".checkpoint.safetensors", path, &blob,
                                            &blob_len, msg, msg_cap)))
            return err;
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
    return FB_OK;
}

/* The step's departures: finished members write their model and leave (DONE),
 * then failed ones leave (FAILED). */
static int depart(fb_session *s, int B, int64_t done_steps, char *msg, size_t msg_cap)
{
    fb_array *a = s->a;
    int err = FB_OK;
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
        if ((err = fb_session_member_output(s, b, false, ".safetensors", path, &blob, &blob_len,
                                            msg, msg_cap)))
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
        remove_slot(s, fb_session_slot(s, i));
    }
    return err;
}

/* Whether anything reads the array's state after step done (1-based): a
 * member's last step, checkpoint or validation.  A window ends there. */
static bool step_reads_state(const fb_session *s, int64_t done)
{
    int B = fb_array_size(s->a);
    for (int b = 0; b < B; b++) {
        const fb_job_spec *spec = fb_array_spec(s->a, b);
        if (done >= s->total[s->member[b]]) return true;
        if (spec->checkpoint_every && done % spec->checkpoint_every == 0) return true;
        if (s->val && spec->eval_every && done % spec->eval_every == 0) return true;
    }
    return false;
}

/* The steps of the next window: up to s->window where the array trains in
 * tiles (elsewhere a window saves nothing), fewer than window_ms take at the
 * last call's step time, the last of them the first that reads the array's
 * state. */
static int window_steps(const fb_session *s)
{
    int most = s->window;
    if (most <= 1 || !fb_array_tiles(s->a)) return 1;
    if (s->opts.window_ms > 0) {
        if (s->step_ms <= 0) return 1;
        double fit = s->opts.window_ms / s->step_ms;
        if (fit < most) most = fit < 1 ? 1 : (int)fit;
    }
    int k = 1;
    while (k < most && !step_reads_state(s, s->step + k)) k++;
    return k;
}

/* Step s->step + 1 after its training (s->loss, s->correct, s->hp by slot):
 * its failures, its update where the engine makes it apart (update), its
 * times (io_ms waiting for its minibatch, wall_ms training), its events and
 * departures. */
static int finish_step(fb_session *s, bool update, double io_ms, double wall_ms, char *msg,
                       size_t msg_cap)
{
    fb_array *a = s->a;
    int B = fb_array_size(a);
    int64_t done_steps = s->step + 1;
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
        member_metrics *k = &s->known[s->member[b]];
        k->trained = true;
        k->loss = s->loss[b];
        k->accuracy = s->correct[b] / (double)s->bs;
    }
    if (update) s->engine->update(s);
    s->step = done_steps;
    s->wait_since += io_ms / 1e3;
    s->steps_since++;
    s->samples_since += s->bs * B;
    s->times.io_ms += io_ms;
    int n_dev = fb_session_devices(s);
    fb_session_device_times *dv = s->times.dev;
    if (n_dev > FB_SESSION_MAX_DEVICES) n_dev = 0; /* more than a group has: means only */
    for (int k = 0; k < n_dev; k++) dv[k].io_ms += io_ms;
    s->engine->account(s, wall_ms, n_dev);
    s->times.steps++;

    double t2 = now_s();
    classify(s, done_steps);
    /* reports, evaluations, checkpoints and departures, in that order */
    int err = report(s, B, done_steps, msg, msg_cap);
    if (!err) err = depart(s, B, done_steps, msg, msg_cap);
    s->times.other_ms += 1e3 * (now_s() - t2);
    return err;
}

int fb_session_step(fb_session *s, char *msg, size_t msg_cap)
{
    if (fb_session_done(s)) return FB_OK;
    fb_array *a = s->a;
    int err;
    const int k = window_steps(s), B = fb_array_size(a);

    /* the minibatches, and how long the steps waited for them */
    double t0 = now_s();
    const float *bx[FB_SESSION_MAX_WINDOW];
    const int32_t *by[FB_SESSION_MAX_WINDOW];
    for (int j = 0; j < k; j++)
        if ((err = next_batch(s, s->step + j, k > 1 ? s->wx[j] : NULL, k > 1 ? s->wy[j] : NULL,
                              &bx[j], &by[j], msg, msg_cap)))
            return err;
    double t1 = now_s();

    /* the pipeline updates within its step, so the hyperparameters come first; a
     * member whose loss turns out not finite leaves below, and its update goes
     * with it (elsewhere it gets an empty slot's; in a window the array skips its
     * later steps' updates too) */
    if (k == 1) {
        for (int b = 0; b < B; b++)
            fb_array_hparams(a, b, s->step + 1, s->total[s->member[b]], &s->hp[b]);
        err = s->engine->train(s, bx[0], by[0], msg, msg_cap);
    } else {
        for (int j = 0; j < k; j++)
            for (int b = 0; b < B; b++)
                fb_array_hparams(a, b, s->step + j + 1, s->total[s->member[b]],
                                 &s->whp[(size_t)j * B + b]);
        err = s->engine->train_steps(s, k, bx, by, msg, msg_cap);
    }
    if (err) return err;
    double t2 = now_s();
    s->step_ms = 1e3 * (t2 - t1) / k;

    /* each step's events, in order, as if it had been trained alone: a member that
     * fails at one step of a window leaves there, and the slots of the later steps'
     * results are those the window started with (worig) */
    for (int b = 0; b < B; b++)
        s->worig[b] = b;
    double io = 1e3 * (t1 - t0) / k, wall = 1e3 * (t2 - t1) / k;
    for (int j = 0; j < k && !err && !fb_session_done(s); j++) {
        if (k > 1) {
            for (int b = 0; b < fb_array_size(a); b++) {
                size_t at = (size_t)j * B + (size_t)s->worig[b];
                s->loss[b] = s->wloss[at];
                s->correct[b] = s->wcorrect[at];
                s->hp[b] = s->whp[at];
            }
        }
        s->t_now = t1 + (t2 - t1) * (j + 1) / k;
        err = finish_step(s, k == 1, io, wall, msg, msg_cap);
    }
    return err;
}
