/*
 * The training loop: one array, a shared stream of minibatches, members that
 * leave as they finish.
 */
#include "train.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>

#include "array.h"
#include "loader.h"
#include "rng.h"

#define DATA_STREAM 0x64617461ULL /* "data": the shuffle's RNG stream */

int64_t fb_train_total_steps(const fb_job_spec *spec, int64_t n_train)
{
    if (spec->steps) return spec->steps;
    return spec->epochs * (n_train / spec->batch_size);
}

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

/* The sample order of one epoch: a Fisher-Yates permutation from data_seed. */
static void epoch_order(int64_t *perm, int64_t n, uint64_t data_seed, int64_t epoch, bool shuffle)
{
    for (int64_t i = 0; i < n; i++) perm[i] = i;
    if (!shuffle) return;
    for (int64_t i = n - 1; i > 0; i--) {
        uint64_t r = fb_rng_u64(data_seed, DATA_STREAM + (uint64_t)epoch, (uint64_t)i);
        int64_t j = (int64_t)(r % (uint64_t)(i + 1));
        int64_t t = perm[i];
        perm[i] = perm[j];
        perm[j] = t;
    }
}

static void emit(const fb_train_opts *o, const fb_train_event *ev)
{
    if (o && o->cb) o->cb(ev, o->user);
}

/* Evaluates every member on the whole test split. loss/acc [B]. */
static int evaluate(fb_array *a, const fb_dataset *test, int64_t in_numel, int chunk,
                    double *loss, double *acc, char *msg, size_t cap)
{
    int B = fb_array_size(a);
    float *l = calloc((size_t)B, sizeof *l), *c = calloc((size_t)B, sizeof *c);
    if (!l || !c) {
        free(l);
        free(c);
        return fb_errf(msg, cap, FB_ERR_NOMEM, "out of memory");
    }
    for (int b = 0; b < B; b++) loss[b] = acc[b] = 0;
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

/* Writes a member's weights to out_dir/<file>; path receives the full path. */
static int save_member(fb_array *a, int slot, const char *out_dir, const char *file,
                       int64_t step, char *path, size_t path_cap, char *msg, size_t cap)
{
    char stepbuf[32];
    snprintf(stepbuf, sizeof stepbuf, "%lld", (long long)step);
    snprintf(path, path_cap, "%s/%s", out_dir, file);
    return fb_array_save(a, slot, path, false, "step", stepbuf, msg, cap);
}

int fb_train_run(fb_backend_t *be, const fb_job_spec *const *specs, int n,
                 const fb_dataset *train, const fb_dataset *test, const fb_train_opts *opts,
                 double *final_loss, double *final_acc, char *msg, size_t cap)
{
    const fb_job_spec *s0 = specs[0];
    int64_t in_numel = fb_shape_numel(&s0->input);
    int K = (int)fb_shape_numel(&s0->output);
    int err;
    if ((err = check_data(s0, K, train, "train", msg, cap))) return err;
    if ((err = check_data(s0, K, test, "test", msg, cap))) return err;
    int64_t bs = s0->batch_size;
    if (train->n < bs)
        return fb_errf(msg, cap, FB_ERR_DATA,
                       "dataset %s has %lld training samples, fewer than batch_size %lld",
                       s0->dataset, (long long)train->n, (long long)bs);

    fb_array *a = NULL;
    int *member = malloc((size_t)n * sizeof *member);      /* slot -> index into specs */
    int64_t *total = malloc((size_t)n * sizeof *total);     /* by index */
    char (*files)[160] = calloc((size_t)n, sizeof *files);   /* by index */
    fb_loader *loader = opts ? opts->loader : NULL;
    int64_t *perm = loader ? NULL : malloc((size_t)train->n * sizeof *perm);
    float *x = malloc((size_t)bs * (size_t)in_numel * sizeof *x);
    int32_t *y = malloc((size_t)bs * sizeof *y);
    float *loss = malloc((size_t)n * sizeof *loss), *correct = malloc((size_t)n * sizeof *correct);
    double *eloss = malloc((size_t)n * sizeof *eloss), *eacc = malloc((size_t)n * sizeof *eacc);
    fb_optim_hparams *hp = malloc((size_t)n * sizeof *hp);
    if (!member || !total || !files || (!perm && !loader) || !x || !y || !loss || !correct ||
        !eloss || !eacc || !hp) {
        err = fb_errf(msg, cap, FB_ERR_NOMEM, "out of memory");
        goto done;
    }
    if (loader && fb_loader_batch_size(loader) != bs) {
        err = fb_errf(msg, cap, FB_ERR_INTERNAL, "the loader delivers batches of %lld, the "
                      "specs train with %lld", (long long)fb_loader_batch_size(loader),
                      (long long)bs);
        goto done;
    }
    int64_t max_total = 0;
    for (int i = 0; i < n; i++) {
        member[i] = i;
        total[i] = fb_train_total_steps(specs[i], train->n);
        if (total[i] > max_total) max_total = total[i];
        if (final_loss) final_loss[i] = NAN;
        if (final_acc) final_acc[i] = NAN;
        int dup = 0;
        for (int j = 0; j < i; j++) dup |= strcmp(specs[j]->name, specs[i]->name) == 0;
        if (dup)
            snprintf(files[i], sizeof files[i], "%s-%d", specs[i]->name, i);
        else
            snprintf(files[i], sizeof files[i], "%s", specs[i]->name);
    }
    if ((err = fb_array_new(be, specs, n, (int)bs, &a, msg, cap))) goto done;
    /* only once the array (and its init files) are good: bad input writes nothing */
    if (opts && opts->out_dir && mkdir(opts->out_dir, 0755) != 0) {
        struct stat st;
        if (stat(opts->out_dir, &st) != 0 || !S_ISDIR(st.st_mode)) {
            err = fb_errf(msg, cap, FB_ERR_IO, "%s: cannot create the output directory",
                          opts->out_dir);
            goto done;
        }
    }

    int64_t per_epoch = train->n / bs, epoch = -1;
    double t_log = now_s();
    int64_t samples_since = 0, steps_since = 0;
    double wait_since = 0;
    for (int64_t step = 0; step < max_total && fb_array_size(a) > 0; step++) {
        /* the minibatch, and how long the step waited for it */
        double t_data = now_s();
        const float *bx = x;
        const int32_t *by = y;
        if (loader) {
            fb_loader_batch lb;
            if ((err = fb_loader_next(&lb, loader, msg, cap))) goto done;
            bx = lb.x;
            by = lb.y;
        } else {
            int64_t e = step / per_epoch, k = step % per_epoch;
            if (e != epoch) {
                epoch_order(perm, train->n, s0->data_seed, e, s0->shuffle);
                epoch = e;
            }
            for (int64_t i = 0; i < bs; i++) {
                int64_t src = perm[k * bs + i];
                memcpy(x + i * in_numel, train->x + src * in_numel, (size_t)in_numel * sizeof *x);
                y[i] = train->y[src];
            }
        }
        wait_since += now_s() - t_data;
        steps_since++;
        int B = fb_array_size(a);
        if ((err = fb_array_forward_backward(a, bx, by, (int)bs, true, (uint64_t)step, loss,
                                             correct, msg, cap)))
            goto done;
        for (int b = 0; b < B; b++) fb_array_hparams(a, b, step + 1, total[member[b]], &hp[b]);
        fb_array_step(a, hp);
        samples_since += bs * B;

        /* reports, evaluations and departures, in that order */
        int64_t done_steps = step + 1;
        bool log_now = opts && opts->log_every > 0 && done_steps % opts->log_every == 0;
        double rate = 0, io_ms = 0;
        /* a member's last step is reported too, so it needs a rate even off the log grid */
        bool any_last = false;
        for (int b = 0; b < B; b++) any_last |= done_steps == total[member[b]];
        if (log_now || any_last) {
            double t = now_s();
            rate = (double)samples_since / (t - t_log > 1e-9 ? t - t_log : 1e-9);
            io_ms = 1e3 * wait_since / (double)steps_since;
            t_log = t;
            samples_since = 0;
            steps_since = 0;
            wait_since = 0;
        }
        bool need_eval = false;
        for (int b = 0; b < B; b++) {
            const fb_job_spec *s = a ? fb_array_spec(a, b) : NULL;
            bool last = done_steps == total[member[b]];
            if (log_now || last) {
                fb_train_event ev = {.kind = FB_TRAIN_STEP, .member = member[b], .spec = s,
                                     .step = done_steps, .steps = total[member[b]],
                                     .array_size = B, .loss = loss[b],
                                     .accuracy = correct[b] / (double)bs, .lr = hp[b].lr,
                                     .samples_per_s = rate, .io_wait_ms = io_ms};
                emit(opts, &ev);
            }
            if (test && (last || (s->eval_every && done_steps % s->eval_every == 0)))
                need_eval = true;
            if (opts && opts->out_dir && s->checkpoint_every && !last &&
                done_steps % s->checkpoint_every == 0) {
                char path[1024], file[200];
                snprintf(file, sizeof file, "%s.checkpoint.safetensors", files[member[b]]);
                if ((err = save_member(a, b, opts->out_dir, file, done_steps, path, sizeof path,
                                       msg, cap)))
                    goto done;
            }
        }
        if (need_eval) {
            if ((err = evaluate(a, test, in_numel, (int)bs, eloss, eacc, msg, cap))) goto done;
            for (int b = 0; b < B; b++) {
                const fb_job_spec *s = fb_array_spec(a, b);
                bool last = done_steps == total[member[b]];
                if (!last && !(s->eval_every && done_steps % s->eval_every == 0)) continue;
                fb_train_event ev = {.kind = FB_TRAIN_EVAL, .member = member[b], .spec = s,
                                     .step = done_steps, .steps = total[member[b]],
                                     .array_size = B, .loss = eloss[b], .accuracy = eacc[b]};
                emit(opts, &ev);
                if (last && final_loss) final_loss[member[b]] = eloss[b];
                if (last && final_acc) final_acc[member[b]] = eacc[b];
            }
        }
        /* finished members leave, highest slot first so lower slots keep their place */
        for (int b = B - 1; b >= 0; b--) {
            if (done_steps != total[member[b]]) continue;
            char path[1024] = "";
            if (opts && opts->out_dir) {
                char file[200];
                snprintf(file, sizeof file, "%s.safetensors", files[member[b]]);
                if ((err = save_member(a, b, opts->out_dir, file, done_steps, path, sizeof path,
                                       msg, cap)))
                    goto done;
            }
            fb_train_event ev = {.kind = FB_TRAIN_DONE, .member = member[b],
                                 .spec = fb_array_spec(a, b), .step = done_steps,
                                 .steps = total[member[b]], .array_size = B,
                                 .loss = test ? eloss[b] : loss[b],
                                 .accuracy = test ? eacc[b] : correct[b] / (double)bs,
                                 .weights_path = path[0] ? path : NULL};
            emit(opts, &ev);
            fb_array_remove(a, b);
            for (int j = b; j + 1 < B; j++) member[j] = member[j + 1];
            B--;
        }
    }
    err = FB_OK;
done:
    fb_array_free(a);
    free(member);
    free(total);
    free(files);
    free(perm);
    free(x);
    free(y);
    free(loss);
    free(correct);
    free(eloss);
    free(eacc);
    free(hp);
    return err;
}
