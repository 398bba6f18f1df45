/*
 * Pipeline parallelism (pipeline_parallel.h): one thread per stage per step, following the
 * stage's 1F1B order; micro-batch activations and gradients pass between
 * stages through host buffers, member-major ([B][n][K]), guarded by one
 * mutex and condition variable.
 *
 * bf16: a member has one loss scale, the same in every stage's arrays.  The
 * last stage multiplies the loss gradient by it; the input gradients it
 * passes back are therefore scaled, and the earlier stages' arrays are
 * "prescaled" (array.h), so they do not scale them again.  Each stage reads
 * its gradients unscaled (fb_array_get divides by the member's scale) and
 * sums them over the micro-batches; before the update every stage tells,
 * per member, whether its sum holds a NaN or an infinity, and waits for the
 * others.  A member that overflowed anywhere skips its update in every
 * stage (fb_array_skip_update where only another stage saw it), so its
 * scale halves once everywhere; its data shards need nothing more, since a
 * stage's replicas hold the all-reduced sum, where one shard's NaN or
 * infinity shows up in all.
 */
#include "pipeline_parallel.h"

#include <math.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "errors.h"

typedef struct stage {
    int first, last;           /* top-level layers first .. last - 1 */
    fb_job_spec *sub;          /* [B] the members' specs cut to this stage */
    const fb_job_spec **subp;  /* [B] */
    fb_dp *fused;              /* stage 0: all members over the shared input */
    fb_dp **solo;              /* later stages: one per member */
    int n_dp;                  /* 1 or B */
    int64_t in_numel, out_numel;
    float **acc;               /* [n_dp]: gradients summed over micro-batches */
    size_t *acc_len;
    bool *verdict; /* bf16, [B]: this stage found the member's gradients not finite */
    double busy_ms;
    int err;
    char msg[256];
} stage;

struct fb_pp {
    int D, P, m, B, batch, mb_max;
    stage *st;
    float **act, **grad; /* [(P-1) * m]: stage p's output / its input gradient, micro j */
    bool *act_ok, *grad_ok;
    float *tmp;          /* stage 0's output gradient, [n, B, K] */
    pthread_mutex_t mu;
    pthread_cond_t cv;
    bool failed;
    /* this step */
    const float *x;
    const int32_t *y;
    uint64_t stream;
    int64_t off[64 + 1]; /* micro-batch j is samples off[j] .. off[j + 1] - 1 */
    int64_t split[FB_DP_MAX_RANKS];
    const fb_optim_hparams *hp;
    double *loss, *correct; /* [B] */
    bool bf16;
    bool *skip;     /* bf16, [B]: some stage found the member's gradients not finite */
    int arrived;    /* stages that have added their verdicts to skip this step */
    float *l0, *c0; /* [B]: the last stage's loss and correct count of one micro-batch */
    fb_pp_times times;
};

static double now_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec * 1e3 + (double)ts.tv_nsec / 1e6;
}

static fb_dp *stage_dp(stage *s, int b)
{
    return s->fused ? s->fused : s->solo[b];
}

/* ---- building ------------------------------------------------------------- */

/* Copies the whole model's member b (of full) into member mb of every replica
 * of dp, whose tensors are the full model's layers first.. renumbered. */
static void copy_params(const fb_array *full, int b, fb_dp *dp, int mb, int first)
{
    static const fb_array_part parts[] = {FB_ARRAY_PARAM, FB_ARRAY_BUFFER};
    fb_array *a0 = fb_dp_array(dp, 0);
    for (size_t p = 0; p < 2; p++)
        for (int t = 0; t < fb_array_tensor_count(a0, parts[p]); t++) {
            fb_array_tensor st = fb_array_tensor_at(a0, parts[p], t);
            int local = atoi(st.name);
            const char *rest = strchr(st.name, '.');
            char want[160];
            snprintf(want, sizeof want, "%d%s", local + first, rest ? rest : "");
            for (int u = 0; u < fb_array_tensor_count(full, parts[p]); u++) {
                fb_array_tensor ft = fb_array_tensor_at(full, parts[p], u);
                if (strcmp(ft.name, want) != 0) continue;
                FB_ASSERT(ft.numel == st.numel);
                float *v = malloc(ft.numel * sizeof *v);
                FB_ASSERT(v != NULL);
                fb_array_get(full, b, parts[p], u, v);
                for (int d = 0; d < fb_dp_ranks(dp); d++)
                    fb_array_set(fb_dp_array(dp, d), mb, parts[p], t, v);
                free(v);
                break;
            }
        }
}

static int stage_build(fb_pp *pp, stage *s, int p, const fb_device *devs,
                       const fb_job_spec *const *specs, const fb_array *full,
                       const fb_dp_opts *opts, char *msg, size_t msg_cap)
{
    int B = pp->B, err;
    fb_device dv[FB_DP_MAX_RANKS];
    for (int d = 0; d < pp->D; d++) dv[d] = devs[d * pp->P + p];
    s->sub = calloc((size_t)B, sizeof *s->sub);
    s->subp = calloc((size_t)B, sizeof *s->subp);
    if (!s->sub || !s->subp) return fb_errf(msg, msg_cap, FB_ERR_NOMEM, "out of memory");
    for (int b = 0; b < B; b++) {
        /* a view of the member's spec: its layers first..last, no init file (the
         * parameters come from the whole model below) */
        s->sub[b] = *specs[b];
        s->sub[b].layers = specs[b]->layers + s->first;
        s->sub[b].n_layers = s->last - s->first;
        s->sub[b].input = specs[b]->layers[s->first].in;
        s->sub[b].output = specs[b]->layers[s->last - 1].out;
        s->sub[b].init[0] = '\0';
        s->subp[b] = &s->sub[b];
    }
    s->in_numel = fb_shape_numel(&s->sub[0].input);
    s->out_numel = fb_shape_numel(&s->sub[0].output);
    s->n_dp = p == 0 ? 1 : B;
    if (p > 0) {
        s->solo = calloc((size_t)B, sizeof *s->solo);
        if (!s->solo) return fb_errf(msg, msg_cap, FB_ERR_NOMEM, "out of memory");
    }
    s->acc = calloc((size_t)s->n_dp, sizeof *s->acc);
    s->acc_len = calloc((size_t)s->n_dp, sizeof *s->acc_len);
    s->verdict = calloc((size_t)B, sizeof *s->verdict);
    if (!s->acc || !s->acc_len || !s->verdict)
        return fb_errf(msg, msg_cap, FB_ERR_NOMEM, "out of memory");
    for (int k = 0; k < s->n_dp; k++) {
        fb_dp **slot = p == 0 ? &s->fused : &s->solo[k];
        int nb = p == 0 ? B : 1;
        if ((err = fb_dp_new(dv, pp->D, p == 0 ? s->subp : &s->subp[k], nb, pp->mb_max, opts, slot,
                             msg, msg_cap)))
            return err;
        for (int b = 0; b < nb; b++) copy_params(full, p == 0 ? b : k, *slot, b, s->first);
        for (int d = 0; p + 1 < pp->P && d < fb_dp_ranks(*slot); d++)
            fb_array_set_grad_prescaled(fb_dp_array(*slot, d), true);
        s->acc_len[k] = fb_array_member_params(fb_dp_array(*slot, 0)) * (size_t)nb;
        s->acc[k] = malloc((s->acc_len[k] ? s->acc_len[k] : 1) * sizeof(float));
        if (!s->acc[k]) return fb_errf(msg, msg_cap, FB_ERR_NOMEM, "out of memory");
    }
    return FB_OK;
}

int fb_pp_new(const fb_device *devs, int D, int P, int m, const fb_job_spec *const *specs, int B,
              int batch, const fb_dp_opts *opts, fb_pp **out, char *msg, size_t msg_cap)
{
    if (!devs || !specs || !out) return fb_errf(msg, msg_cap, FB_ERR_INTERNAL, "missing argument");
    if (D < 1 || D > FB_DP_MAX_RANKS || P < 1 || P > FB_PIPELINE_MAX_STAGES || m < 1 || m > 64 ||
        B < 1 || batch < m * D)
        return fb_errf(msg, msg_cap, FB_ERR_OUT_OF_RANGE,
                       "a pipeline of %d stages x %d shards with %d micro-batches (1..64) needs "
                       "a batch of at least %d samples, not %d",
                       P, D, m, m * D, batch);
    /* a communicator across processes serves one replica set; each stage needs its own */
    if (opts && opts->comm)
        return fb_errf(msg, msg_cap, FB_ERR_UNSUPPORTED,
                       "pipeline stages do not run across processes (a data-parallel world of "
                       "its own per stage is not built yet)");
    /* stage inputs and their gradients pass through host buffers that the
     * device's ops read and write directly */
    for (int k = 0; k < D * P; k++)
        if (devs[k].kind != FB_DEVICE_CPU)
            return fb_errf(msg, msg_cap, FB_ERR_UNSUPPORTED,
                           "pipeline stages run on CPU devices only (device %d is %s)", k,
                           devs[k].name);
    int first[FB_PIPELINE_MAX_STAGES + 1];
    int err = fb_pipeline_partition(specs[0], P, first, msg, msg_cap);
    if (err) return err;
    fb_pp *pp = calloc(1, sizeof *pp);
    if (!pp) return fb_errf(msg, msg_cap, FB_ERR_NOMEM, "out of memory");
    pp->D = D;
    pp->P = P;
    pp->m = m;
    pp->B = B;
    pp->batch = batch;
    pp->mb_max = (batch + m - 1) / m;
    pp->times.P = P;
    pthread_mutex_init(&pp->mu, NULL);
    pthread_cond_init(&pp->cv, NULL);
    fb_array *full = NULL;
    size_t links = (size_t)(P > 1 ? P - 1 : 1) * (size_t)m;
    pp->st = calloc((size_t)P, sizeof *pp->st);
    pp->act = calloc(links, sizeof *pp->act);
    pp->grad = calloc(links, sizeof *pp->grad);
    pp->act_ok = calloc(links, sizeof *pp->act_ok);
    pp->grad_ok = calloc(links, sizeof *pp->grad_ok);
    pp->loss = calloc((size_t)B, sizeof *pp->loss);
    pp->l0 = calloc((size_t)B, sizeof *pp->l0);
    pp->c0 = calloc((size_t)B, sizeof *pp->c0);
    pp->correct = calloc((size_t)B, sizeof *pp->correct);
    pp->skip = calloc((size_t)B, sizeof *pp->skip);
    pp->bf16 = specs[0]->precision == FB_PREC_BF16;
    if (!pp->skip || !pp->l0 || !pp->c0 || !pp->correct || !pp->st || !pp->act || !pp->grad ||
        !pp->act_ok || !pp->grad_ok || !pp->loss) {
        err = fb_errf(msg, msg_cap, FB_ERR_NOMEM, "out of memory");
        goto fail;
    }
    /* the whole model, once, for the parameters every stage starts from */
    if ((err = fb_array_new(fb_backend_cpu_ref(), specs, B, 1, &full, msg, msg_cap))) goto fail;
    for (int p = 0; p < P; p++) {
        pp->st[p].first = first[p];
        pp->st[p].last = first[p + 1];
        if ((err = stage_build(pp, &pp->st[p], p, devs, specs, full, opts, msg, msg_cap)))
            goto fail;
    }
    size_t k_max = 1;
    for (int p = 0; p + 1 < P; p++) {
        size_t k = (size_t)pp->st[p].out_numel;
        if (k > k_max) k_max = k;
        for (int j = 0; j < m; j++) {
            size_t n = (size_t)B * (size_t)pp->mb_max * k;
            pp->act[(size_t)p * m + j] = malloc(n * sizeof(float));
            pp->grad[(size_t)p * m + j] = malloc(n * sizeof(float));
            if (!pp->act[(size_t)p * m + j] || !pp->grad[(size_t)p * m + j]) {
                err = fb_errf(msg, msg_cap, FB_ERR_NOMEM, "out of memory");
                goto fail;
            }
        }
    }
    pp->tmp = malloc((size_t)B * (size_t)pp->mb_max * k_max * sizeof(float));
    if (!pp->tmp) {
        err = fb_errf(msg, msg_cap, FB_ERR_NOMEM, "out of memory");
        goto fail;
    }
    fb_array_free(full);
    *out = pp;
    return FB_OK;
fail:
    fb_array_free(full);
    fb_pp_free(pp);
    return err;
}

void fb_pp_free(fb_pp *pp)
{
    if (!pp) return;
    for (int p = 0; pp->st && p < pp->P; p++) {
        stage *s = &pp->st[p];
        fb_dp_free(s->fused);
        for (int k = 0; s->solo && k < pp->B; k++) fb_dp_free(s->solo[k]);
        for (int k = 0; s->acc && k < s->n_dp; k++) free(s->acc[k]);
        free(s->solo);
        free(s->acc);
        free(s->acc_len);
        free(s->verdict);
        free(s->sub);
        free(s->subp);
    }
    size_t links = (size_t)(pp->P > 1 ? pp->P - 1 : 1) * (size_t)pp->m;
    for (size_t i = 0; i < links; i++) {
        if (pp->act) free(pp->act[i]);
        if (pp->grad) free(pp->grad[i]);
    }
    free(pp->act);
    free(pp->grad);
    free(pp->act_ok);
    free(pp->grad_ok);
    free(pp->tmp);
    free(pp->loss);
    free(pp->l0);
    free(pp->c0);
    free(pp->correct);
    free(pp->skip);
    free(pp->st);
    pthread_mutex_destroy(&pp->mu);
    pthread_cond_destroy(&pp->cv);
    free(pp);
}

int fb_pp_stage_first(const fb_pp *pp, int p)
{
    return p >= pp->P ? pp->st[pp->P - 1].last : pp->st[p].first;
}

/* ---- the whole model's view (sessions: checkpoints, evaluation, leaving) ------ */

/* Member mb of replica d of dp and member b of full, part by part, tensor by
 * tensor under the whole model's names; to_full picks the direction. */
static void move_member(fb_array *full, int b, fb_array *a, int mb, int first, bool to_full)
{
    static const fb_array_part parts[] = {FB_ARRAY_PARAM, FB_ARRAY_STATE1, FB_ARRAY_STATE2,
                                          FB_ARRAY_BUFFER};
    for (size_t p = 0; p < sizeof parts / sizeof parts[0]; p++) {
        /* the optimizer parts are named after the parameters */
        fb_array_part names = parts[p] == FB_ARRAY_BUFFER ? FB_ARRAY_BUFFER : FB_ARRAY_PARAM;
        for (int t = 0; t < fb_array_tensor_count(a, parts[p]); t++) {
            fb_array_tensor st = fb_array_tensor_at(a, names, t);
            const char *rest = strchr(st.name, '.');
            char want[160];
            snprintf(want, sizeof want, "%d%s", atoi(st.name) + first, rest ? rest : "");
            for (int u = 0; u < fb_array_tensor_count(full, parts[p]); u++) {
                if (strcmp(fb_array_tensor_at(full, names, u).name, want) != 0) continue;
                float *v = malloc(st.numel * sizeof *v);
                FB_ASSERT(v != NULL);
                if (to_full) {
                    fb_array_get(a, mb, parts[p], t, v);
                    fb_array_set(full, b, parts[p], u, v);
                } else {
                    fb_array_get(full, b, parts[p], u, v);
                    fb_array_set(a, mb, parts[p], t, v);
                }
                free(v);
                break;
            }
        }
    }
    if (fb_array_spec(a, mb)->precision == FB_PREC_BF16) {
        const fb_array *from = to_full ? a : full;
        fb_array *to = to_full ? full : a;
        int fm = to_full ? mb : b, tm = to_full ? b : mb;
        int rc = fb_array_set_loss_scale(to, tm, fb_array_loss_scale(from, fm),
                                         fb_array_loss_scale_good(from, fm), NULL, 0);
        FB_ASSERT(rc == FB_OK); /* both hold the same specs, so both have a scale */
    }
    for (int k = 0; k < fb_array_bn_count(a); k++) {
        char name[160], want[160], fname[160];
        fb_array_bn_name(a, k, name, sizeof name);
        const char *rest = strchr(name, '.');
        snprintf(want, sizeof want, "%d%s", atoi(name) + first, rest ? rest : "");
        for (int u = 0; u < fb_array_bn_count(full); u++) {
            fb_array_bn_name(full, u, fname, sizeof fname);
            if (strcmp(fname, want) != 0) continue;
            if (to_full)
                fb_array_set_bn_tracked(full, b, u, fb_array_bn_tracked(a, mb, k));
            else
                fb_array_set_bn_tracked(a, mb, k, fb_array_bn_tracked(full, b, u));
            break;
        }
    }
}

void fb_pp_gather(fb_pp *pp, fb_array *full)
{
    for (int p = 0; p < pp->P; p++) {
        stage *s = &pp->st[p];
        for (int b = 0; b < pp->B; b++) {
            const fb_array *a = fb_dp_array(stage_dp(s, b), 0);
            int mb = p == 0 ? b : 0;
            /* a member's loss scale is one across the stages (see the top) */
            FB_ASSERT(p == 0 ||
                      (fb_array_loss_scale(a, mb) == fb_array_loss_scale(full, b) &&
                       fb_array_loss_scale_good(a, mb) == fb_array_loss_scale_good(full, b)));
            move_member(full, b, (fb_array *)a, mb, s->first, true);
        }
    }
}

void fb_pp_scatter(fb_pp *pp, const fb_array *full, int m)
{
    for (int p = 0; p < pp->P; p++) {
        stage *s = &pp->st[p];
        fb_dp *dp = stage_dp(s, m);
        for (int d = 0; d < fb_dp_ranks(dp); d++)
            move_member((fb_array *)full, m, fb_dp_array(dp, d), p == 0 ? m : 0, s->first, false);
    }
}

void fb_pp_remove(fb_pp *pp, int m)
{
    if (m < 0 || m >= pp->B) return;
    for (int p = 0; p < pp->P; p++) {
        stage *s = &pp->st[p];
        if (s->fused) {
            fb_dp_remove(s->fused, m);
            continue;
        }
        fb_dp_free(s->solo[m]);
        free(s->acc[m]);
        for (int k = m; k + 1 < s->n_dp; k++) {
            s->solo[k] = s->solo[k + 1];
            s->acc[k] = s->acc[k + 1];
            s->acc_len[k] = s->acc_len[k + 1];
        }
        s->n_dp--;
    }
    /* a member's specs stay where they are: its arrays point at them */
    pp->B--;
}

int fb_pp_size(const fb_pp *pp)
{
    return pp->B;
}

/* ---- one step ---------------------------------------------------------------- */

/* Waits for flag (under pp->mu); false when another stage failed. */
static bool wait_flag(fb_pp *pp, const bool *flag)
{
    pthread_mutex_lock(&pp->mu);
    while (!*flag && !pp->failed) pthread_cond_wait(&pp->cv, &pp->mu);
    bool ok = *flag;
    pthread_mutex_unlock(&pp->mu);
    return ok;
}

static void set_flag(fb_pp *pp, bool *flag)
{
    pthread_mutex_lock(&pp->mu);
    *flag = true;
    pthread_cond_broadcast(&pp->cv);
    pthread_mutex_unlock(&pp->mu);
}

static void fail(fb_pp *pp, stage *s, int err, const char *msg)
{
    s->err = err;
    snprintf(s->msg, sizeof s->msg, "%s", msg);
    pthread_mutex_lock(&pp->mu);
    pp->failed = true;
    pthread_cond_broadcast(&pp->cv);
    pthread_mutex_unlock(&pp->mu);
}

/* Adds this micro-batch's gradients (every replica holds the all-reduced sum)
 * to the stage's accumulators. */
static void accumulate(stage *s, int k, bool first, int nb)
{
    fb_array *a = fb_dp_array(stage_dp(s, k), 0);
    float *at = s->acc[k];
    int T = fb_array_tensor_count(a, FB_ARRAY_GRAD);
    for (int b = 0; b < nb; b++)
        for (int t = 0; t < T; t++) {
            size_t n = fb_array_tensor_at(a, FB_ARRAY_GRAD, t).numel;
            if (first) {
                fb_array_get(a, b, FB_ARRAY_GRAD, t, at);
            } else {
                float *v = malloc(n * sizeof *v);
                FB_ASSERT(v != NULL);
                fb_array_get(a, b, FB_ARRAY_GRAD, t, v);
                for (size_t i = 0; i < n; i++) at[i] += v[i];
                free(v);
            }
            at += n;
        }
}

/* bf16: adds this stage's verdicts (a member's summed gradients hold a NaN
 * or an infinity) to pp->skip and waits until every stage has; false when
 * another stage failed.  The check is on the sum times the member's scale,
 * which is what restore_grads stores and the update unscales and checks
 * again, so a stage's own update never finds what this missed. */
static bool share_verdicts(fb_pp *pp, stage *s)
{
    int B = pp->B;
    bool *mine = s->verdict;
    for (int q = 0; q < s->n_dp; q++) {
        const fb_array *a = fb_dp_array(stage_dp(s, q), 0);
        int nb = s->fused ? B : 1;
        size_t per = fb_array_member_params(a);
        for (int mb = 0; mb < nb; mb++) {
            const float *g = s->acc[q] + (size_t)mb * per;
            float scale = fb_array_loss_scale(a, mb);
            bool nonfinite = false;
            for (size_t i = 0; i < per; i++)
                nonfinite |= !isfinite(g[i] * scale);
            mine[s->fused ? mb : q] = nonfinite;
        }
    }
    pthread_mutex_lock(&pp->mu);
    for (int b = 0; b < B; b++)
        pp->skip[b] |= mine[b];
    pp->arrived++;
    pthread_cond_broadcast(&pp->cv);
    while (pp->arrived < pp->P && !pp->failed)
        pthread_cond_wait(&pp->cv, &pp->mu);
    bool ok = pp->arrived == pp->P;
    pthread_mutex_unlock(&pp->mu);
    return ok;
}

/* Puts the summed gradients back into every replica, for the update. */
static void restore_grads(stage *s, int k, int nb)
{
    fb_dp *dp = stage_dp(s, k);
    for (int d = 0; d < fb_dp_ranks(dp); d++) {
        fb_array *a = fb_dp_array(dp, d);
        const float *at = s->acc[k];
        int T = fb_array_tensor_count(a, FB_ARRAY_GRAD);
        for (int b = 0; b < nb; b++)
            for (int t = 0; t < T; t++) {
                fb_array_set(a, b, FB_ARRAY_GRAD, t, at);
                at += fb_array_tensor_at(a, FB_ARRAY_GRAD, t).numel;
            }
    }
}

typedef struct stage_arg {
    fb_pp *pp;
    int p;
} stage_arg;

static void *stage_main(void *arg)
{
    stage_arg *sa = arg;
    fb_pp *pp = sa->pp;
    int p = sa->p, P = pp->P, m = pp->m, B = pp->B;
    stage *s = &pp->st[p];
    fb_pipe_op ops[128];
    fb_pipeline_1f1b(P, m, p, ops, 128);
    char msg[256];
    int64_t in0 = s->in_numel;
    for (int k = 0; k < 2 * m; k++) {
        int j = ops[k].micro;
        int64_t off = pp->off[j], n = pp->off[j + 1] - pp->off[j];
        int64_t split[FB_DP_MAX_RANKS];
        double w[FB_DP_MAX_RANKS];
        for (int d = 0; d < pp->D; d++) w[d] = (double)pp->split[d];
        fb_dp_even_split(pp->D, (int)n, w, split);
        bool last = p == P - 1;
        /* the input of micro-batch j: the shared rows, or the previous stage's outputs */
        float *in = p > 0 ? pp->act[(size_t)(p - 1) * m + j] : NULL;
        if (p > 0 && !wait_flag(pp, &pp->act_ok[(size_t)(p - 1) * m + j])) return NULL;
        double t0 = now_ms();
        int err = FB_OK;
        if (!ops[k].backward) {
            if (last) continue; /* the last stage runs forward and backward together */
            float *out = pp->act[(size_t)p * m + j];
            for (int q = 0; q < s->n_dp && !err; q++) {
                fb_dp *dp = stage_dp(s, q);
                fb_dp_set_scale(dp, pp->batch, off);
                const float *xin = p == 0 ? pp->x + (size_t)off * (size_t)in0
                                          : in + (size_t)q * (size_t)n * (size_t)in0;
                err = fb_dp_stage_forward(dp, xin, (int)n, split, pp->stream,
                                          out + (size_t)q * (size_t)n * (size_t)s->out_numel, msg,
                                          sizeof msg);
            }
            s->busy_ms += now_ms() - t0;
            if (err) {
                fail(pp, s, err, msg);
                return NULL;
            }
            set_flag(pp, &pp->act_ok[(size_t)p * m + j]);
            continue;
        }
        /* backward of micro-batch j: from the labels, or the next stage's input gradient */
        const float *g = NULL;
        if (!last) {
            if (!wait_flag(pp, &pp->grad_ok[(size_t)p * m + j])) return NULL;
            t0 = now_ms();
            g = pp->grad[(size_t)p * m + j];
            if (p == 0) {
                /* member-major [B][n][K] to the array's [n, B, K] */
                int64_t K = s->out_numel;
                for (int b = 0; b < B; b++)
                    for (int64_t r = 0; r < n; r++)
                        memcpy(pp->tmp + ((size_t)r * B + b) * K, g + ((size_t)b * n + r) * K,
                               (size_t)K * sizeof(float));
                g = pp->tmp;
            }
        }
        float *din = p > 0 ? pp->grad[(size_t)(p - 1) * m + j] : NULL;
        for (int q = 0; q < s->n_dp && !err; q++) {
            fb_dp *dp = stage_dp(s, q);
            fb_dp_set_scale(dp, pp->batch, off);
            const float *xin = p == 0 ? pp->x + (size_t)off * (size_t)in0
                                      : in + (size_t)q * (size_t)n * (size_t)in0;
            float l1, c1, *l = p == 0 ? pp->l0 : &l1, *c = p == 0 ? pp->c0 : &c1;
            err = fb_dp_stage_backward(
                dp, xin, last ? pp->y + off : NULL, (int)n, split, pp->stream,
                last ? NULL : (p == 0 ? g : g + (size_t)q * (size_t)n * (size_t)s->out_numel),
                din ? din + (size_t)q * (size_t)n * (size_t)in0 : NULL, last ? l : NULL,
                last ? c : NULL, msg, sizeof msg);
            if (!err && last)
                for (int b = 0; b < (p == 0 ? B : 1); b++) {
                    pp->loss[p == 0 ? b : q] += (double)n / pp->batch * l[b];
                    pp->correct[p == 0 ? b : q] += c[b];
                }
            if (!err) accumulate(s, q, j == 0, p == 0 ? B : 1);
        }
        s->busy_ms += now_ms() - t0;
        if (err) {
            fail(pp, s, err, msg);
            return NULL;
        }
        if (p > 0) set_flag(pp, &pp->grad_ok[(size_t)(p - 1) * m + j]);
    }
    /* every micro-batch is in: the update, once every stage has said which
     * members overflowed (bf16) */
    if (pp->bf16 && !share_verdicts(pp, s)) return NULL;
    double t0 = now_ms();
    for (int q = 0; q < s->n_dp; q++) {
        fb_dp *dp = stage_dp(s, q);
        for (int mb = 0; pp->bf16 && mb < (p == 0 ? B : 1); mb++)
            if (pp->skip[p == 0 ? mb : q])
                for (int d = 0; d < fb_dp_ranks(dp); d++)
                    fb_array_skip_update(fb_dp_array(dp, d), mb);
        restore_grads(s, q, p == 0 ? B : 1);
        fb_dp_set_scale(stage_dp(s, q), 0, 0);
        fb_dp_step(stage_dp(s, q), p == 0 ? pp->hp : &pp->hp[q]);
    }
    s->busy_ms += now_ms() - t0;
    return NULL;
}

int fb_pp_train_step(fb_pp *pp, const float *x, const int32_t *y, int N, const int64_t *split,
                     uint64_t stream, const fb_optim_hparams *hp, float *loss, float *correct,
                     char *msg, size_t msg_cap)
{
    if (!x || !y || !hp || !loss) return fb_errf(msg, msg_cap, FB_ERR_INTERNAL, "missing argument");
    if (N != pp->batch)
        return fb_errf(msg, msg_cap, FB_ERR_OUT_OF_RANGE, "a batch of %d samples; the pipeline "
                       "takes %d", N, pp->batch);
    int64_t sum = 0;
    for (int d = 0; d < pp->D; d++) {
        int64_t v = split ? split[d] : 1;
        if (v < 1 || v > N)
            return fb_errf(msg, msg_cap, FB_ERR_OUT_OF_RANGE,
                           "shard %d of the split has %lld samples (1..%d)", d, (long long)v, N);
        pp->split[d] = v;
        sum += v;
    }
    if (split && sum != N)
        return fb_errf(msg, msg_cap, FB_ERR_OUT_OF_RANGE,
                       "the split adds up to %lld samples, the batch has %d", (long long)sum, N);
    const stage *last = &pp->st[pp->P - 1];
    int K = (int)last->out_numel;
    for (int n = 0; n < N; n++) {
        bool ok = last->sub[0].loss == FB_LOSS_CROSS_ENTROPY || K > 1 ? (y[n] >= 0 && y[n] < K)
                                                                      : y[n] >= 0;
        if (!ok)
            return fb_errf(msg, msg_cap, FB_ERR_DATA,
                           "label %d of sample %d is outside the model's %d outputs", y[n], n, K);
    }
    for (int j = 0; j <= pp->m; j++)
        pp->off[j] = (int64_t)j * (N / pp->m) + (j < N % pp->m ? j : N % pp->m);
    pp->x = x;
    pp->y = y;
    pp->stream = stream;
    pp->hp = hp;
    pp->failed = false;
    pp->arrived = 0;
    memset(pp->skip, 0, (size_t)pp->B * sizeof *pp->skip);
    size_t links = (size_t)(pp->P > 1 ? pp->P - 1 : 1) * (size_t)pp->m;
    memset(pp->act_ok, 0, links * sizeof *pp->act_ok);
    memset(pp->grad_ok, 0, links * sizeof *pp->grad_ok);
    for (int b = 0; b < pp->B; b++) pp->loss[b] = pp->correct[b] = 0;
    stage_arg args[FB_PIPELINE_MAX_STAGES];
    pthread_t th[FB_PIPELINE_MAX_STAGES];
    double t0 = now_ms();
    int started = 0;
    for (int p = 0; p < pp->P; p++) {
        pp->st[p].err = FB_OK;
        args[p] = (stage_arg){.pp = pp, .p = p};
        if (pthread_create(&th[p], NULL, stage_main, &args[p]) != 0) {
            fail(pp, &pp->st[p], FB_ERR_NOMEM, "cannot start a stage thread");
            break;
        }
        started++;
    }
    for (int p = 0; p < started; p++) pthread_join(th[p], NULL);
    pp->times.wall_ms += now_ms() - t0;
    pp->times.steps++;
    for (int p = 0; p < pp->P; p++) {
        pp->times.busy_ms[p] += pp->st[p].busy_ms;
        pp->st[p].busy_ms = 0;
        if (pp->st[p].err)
            return fb_errf(msg, msg_cap, pp->st[p].err, "stage %d: %s", p, pp->st[p].msg);
    }
    for (int b = 0; b < pp->B; b++) {
        loss[b] = (float)pp->loss[b];
        if (correct) correct[b] = (float)pp->correct[b];
    }
    return FB_OK;
}

fb_pp_times fb_pp_take_times(fb_pp *pp)
{
    fb_pp_times t = pp->times;
    memset(&pp->times, 0, sizeof pp->times);
    pp->times.P = pp->P;
    /* per device, from the stages' data-parallel replicas: a later stage runs one replica set
     * per member over the same samples, so their times add up and their samples count once */
    bool per_device = pp->D * pp->P <= FB_DP_MAX_RANKS;
    t.D = per_device ? pp->D : 0;
    for (int p = 0; p < pp->P; p++) {
        stage *s = &pp->st[p];
        for (int q = 0; q < s->n_dp; q++) {
            fb_dp_times dt = fb_dp_take_times(stage_dp(s, q));
            for (int d = 0; d < pp->D && per_device; d++) {
                int k = d * pp->P + p;
                t.compute_ms[k] += dt.compute_ms[d];
                t.comm_ms[k] += dt.comm_exposed_ms[d];
                t.pass_ms[k] += dt.pass_ms[d];
                if (q == 0) t.samples[k] += dt.samples[d];
            }
        }
    }
    return t;
}
