/*
 * Data parallelism (data_parallel.h): D rank threads, one communication thread, and a
 * hooking backend per rank.
 *
 * Each rank's array runs on `struct rank`'s embedded fb_backend, which
 * mirrors the device backend (same name, context and ops) except for the
 * entries overridden here.  An overridden entry calls the device backend's
 * function with the rank's handle, so the device code sees the context it
 * expects, and then does the data-parallel part.
 *
 * Collectives are queued per rank; the communication thread runs
 * collective k when every rank has queued its k-th, so ranks never wait for
 * each other except where they need a result (synchronised batch norm, the
 * end of the step).  A rank queues the same collectives in the same order
 * as every other, because they run the same model: that is what makes the
 * protocol deadlock-free, and fb_dp_last_collectives lets tests check it.
 *
 * Across processes (opts.comm) the same holds for the whole world: every
 * process runs the same model on the same batch, so its communication
 * thread issues the same collectives in the same order, and each one is a
 * sum over every rank of every process.  One more collective ends each
 * training step there: the ranks' weighted losses and correct counts, since
 * no process sees the others' shards.  The checks of a call (split, labels)
 * see the same inputs in every process, so they refuse a call everywhere
 * or nowhere: a process that skipped a step would leave the others waiting
 * for its collectives until the timeout.  On CUDA ranks across processes
 * the gradients (OP_GRADS, device memory) go through NCCL and the host
 * scratch sums (OP_BUF) through the TCP control communicator, still one at
 * a time in queue order, so every process issues them in the same order.
 */
#include "data_parallel.h"

#include <math.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "backend_impl.h"
#include "comm.h"
#include "errors.h"

typedef struct region {
    float *p;
    size_t n;
} region;

typedef enum op_kind { OP_GRADS, OP_BUF } op_kind;

typedef struct op {
    op_kind kind;
    int first, count; /* OP_GRADS: regions[first .. first + count) */
    float *buf;       /* OP_BUF: host scratch of n floats */
    size_t n;
} op;

typedef enum job_kind { JOB_NONE, JOB_FB, JOB_FWD, JOB_STEP, JOB_QUIT } job_kind;

typedef struct rank {
    struct fb_backend be; /* the hooking backend; first, so a handle casts to its rank */
    struct fb_backend_ops ops;
    fb_backend *inner;
    fb_device dev; /* its device, whose cores (if it owns any) the rank thread runs on */
    fb_dp *dp;
    int r;
    fb_array *a;
    pthread_t th;
    bool started;

    /* this step's shard and state, written by the rank thread */
    int64_t off, n;
    bool hooks; /* inside a training forward/backward of fb_dp_forward_backward */
    region *regions;
    int n_regions, cap_regions;
    op *ops_q; /* queued collectives; n_ops under dp->mu */
    int n_ops, cap_ops;
    int bucket_first;
    size_t bucket_floats;
    float *bn_tmp;
    size_t bn_cap;
    float *loss, *correct; /* [B] */
    float *world_loss;     /* across processes: [2B], weighted losses, then correct counts */
    const float *inject; /* pipeline: this shard's output gradient [n, B, K], or NULL */
    float *capture;      /* pipeline: this shard's input gradient [n, input] (B = 1), or NULL */
    int err;
    char msg[256];
    double compute_ms, wait_ms;
} rank;

struct fb_dp {
    int D, B, max_n;
    int world, first; /* the ranks of the world (W) and this process's first */
    fb_dp_opts opts;
    fb_comm *comm; /* the gradient sums */
    fb_comm *ctl;  /* host-memory sums: world losses, synchronised batch norm, broadcasts;
                      * comm itself except for CUDA ranks across processes */
    bool own_comm;
    bool host;
    rank *ranks;

    pthread_mutex_t mu;
    pthread_cond_t job_cv, done_cv, comm_cv, coll_cv;
    bool mu_ok;
    /* the current job: posted by the caller, taken by every rank thread */
    job_kind job;
    uint64_t job_gen;
    int jobs_done;
    /* the step's job arguments */
    const float *x;
    const int32_t *y;
    size_t x_stride;  /* floats per sample */
    size_t in_stride; /* floats per sample of the input gradient (the input's) */
    int N;
    uint64_t stream;
    const fb_optim_hparams *hp;
    const float *dout; /* pipeline: the batch's output gradient [N, B, K], or NULL */
    float *din;        /* pipeline: the batch's input gradient [N, input], or NULL */
    float *out;        /* forward only: outputs [B][N][K], member-major */
    int scale_n;       /* the loss gradient's 1/N: N of the whole batch (0: this call's) */
    int64_t base;      /* where this call's samples start in the whole batch */
    int32_t *zeros;    /* [max_n] labels for stages whose gradient comes from outside */
    /* collectives: the k-th of every rank has run when k < coll_done */
    int coll_done;
    bool comm_quit, comm_started;
    pthread_t comm_th;
    int comm_err;
    char comm_msg[256];
    double comm_busy_ms;

    fb_dp_times times;
};

static double now_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec * 1e3 + (double)ts.tv_nsec / 1e6;
}

/* ---- collectives ---------------------------------------------------------- */

/* Queues op on rank r for the communication thread; returns its index. */
static int enqueue(rank *r, op o)
{
    fb_dp *dp = r->dp;
    pthread_mutex_lock(&dp->mu);
    FB_ASSERT(r->n_ops < r->cap_ops);
    int k = r->n_ops;
    r->ops_q[k] = o;
    r->n_ops++;
    pthread_cond_signal(&dp->comm_cv);
    pthread_mutex_unlock(&dp->mu);
    return k;
}

/* Waits until collective k has run on every rank; the time counts as
 * communication that computation did not hide. */
static void wait_coll(rank *r, int k)
{
    fb_dp *dp = r->dp;
    double t0 = now_ms();
    pthread_mutex_lock(&dp->mu);
    while (dp->coll_done <= k) pthread_cond_wait(&dp->coll_cv, &dp->mu);
    pthread_mutex_unlock(&dp->mu);
    r->wait_ms += now_ms() - t0;
}

/* Hands the gradients gathered since the last bucket to the communication thread. */
static void submit_bucket(rank *r)
{
    int count = r->n_regions - r->bucket_first;
    if (count == 0) return;
    /* a device backend runs ops asynchronously: the gradients must be final
     * before the communication stream reads them */
    if (!r->dp->host) fb_backend_sync(&r->be);
    enqueue(r, (op){.kind = OP_GRADS, .first = r->bucket_first, .count = count});
    r->bucket_first = r->n_regions;
    r->bucket_floats = 0;
}

/* Backward has finished the gradient p [n] of one parameter tensor. */
static void grad_ready(rank *r, float *p, size_t n)
{
    if (!r->hooks || !p || n == 0) return;
    fb_dp *dp = r->dp;
    if (dp->opts.slow_rank == r->r && dp->opts.slow_us > 0) usleep((useconds_t)dp->opts.slow_us);
    FB_ASSERT(r->n_regions < r->cap_regions);
    r->regions[r->n_regions++] = (region){.p = p, .n = n};
    r->bucket_floats += n;
    if (!dp->opts.no_overlap && r->bucket_floats * sizeof(float) >= dp->opts.bucket_bytes)
        submit_bucket(r);
}

static void *comm_main(void *arg)
{
    fb_dp *dp = arg;
    float **bufs = calloc((size_t)dp->D, sizeof *bufs);
    pthread_mutex_lock(&dp->mu);
    for (;;) {
        int k = dp->coll_done;
        bool ready = true;
        for (int d = 0; d < dp->D && ready; d++) ready = dp->ranks[d].n_ops > k;
        if (dp->comm_quit) break;
        if (!ready) {
            pthread_cond_wait(&dp->comm_cv, &dp->mu);
            continue;
        }
        pthread_mutex_unlock(&dp->mu);
        double t0 = now_ms();
        /* collective k of every rank: the same kind and sizes on every rank */
        const op *o0 = &dp->ranks[0].ops_q[k];
        int err = bufs ? FB_OK : FB_ERR_NOMEM;
        char m[256] = "out of memory in the communication thread";
        if (o0->kind == OP_BUF) {
            for (int d = 0; d < dp->D && bufs; d++) {
                const op *o = &dp->ranks[d].ops_q[k];
                FB_ASSERT(o->kind == OP_BUF && o->n == o0->n);
                bufs[d] = o->buf;
            }
            /* host scratch: on CUDA ranks across processes NCCL cannot read it */
            if (!err) err = fb_comm_allreduce_sum(dp->ctl, bufs, o0->n, m, sizeof m);
        } else {
            for (int j = 0; j < o0->count && !err; j++) {
                size_t n = dp->ranks[0].regions[o0->first + j].n;
                for (int d = 0; d < dp->D; d++) {
                    const rank *rk = &dp->ranks[d];
                    const op *o = &rk->ops_q[k];
                    FB_ASSERT(o->kind == OP_GRADS && o->count == o0->count &&
                              rk->regions[o->first + j].n == n);
                    bufs[d] = rk->regions[o->first + j].p;
                }
                err = fb_comm_allreduce_sum(dp->comm, bufs, n, m, sizeof m);
            }
        }
        double t1 = now_ms();
        pthread_mutex_lock(&dp->mu);
        dp->comm_busy_ms += t1 - t0;
        if (err && !dp->comm_err) {
            dp->comm_err = err;
            memcpy(dp->comm_msg, m, sizeof m);
        }
        dp->coll_done = k + 1; /* even after a failure, so no rank waits forever */
        pthread_cond_broadcast(&dp->coll_cv);
    }
    pthread_mutex_unlock(&dp->mu);
    free(bufs);
    return NULL;
}

/* ---- the hooking backend ---------------------------------------------------- */

static rank *rank_of(fb_backend *be)
{
    return (rank *)be;
}

static void h_linear_backward(fb_backend *be, float *din, float *dw, float *dbias,
                              const float *dout, const float *in, const float *w, int N, int B,
                              int I, int O, bool shared)
{
    rank *r = rank_of(be);
    if (r->hooks && r->capture && !din && shared && B == 1) {
        /* a pipeline stage's first layer: with one member the shared input is the
         * member's own, so its gradient is the ordinary one */
        memset(r->capture, 0, (size_t)N * (size_t)I * sizeof(float));
        din = r->capture;
        shared = false;
    }
    r->inner->ops->linear_backward(be, din, dw, dbias, dout, in, w, N, B, I, O, shared);
    /* backward visits layers last to first; within a layer, weight before bias */
    grad_ready(r, dw, (size_t)B * (size_t)O * (size_t)I);
    grad_ready(r, dbias, (size_t)B * (size_t)O);
}

static void h_conv2d_backward(fb_backend *be, float *din, float *dw, float *dbias,
                              const float *dout, const float *in, const float *w,
                              const fb_conv_geom *g, float *scratch)
{
    rank *r = rank_of(be);
    fb_conv_geom own;
    if (r->hooks && r->capture && !din && g->shared && g->B == 1) {
        memset(r->capture, 0, (size_t)g->N * (size_t)g->C * g->H * g->W * sizeof(float));
        din = r->capture;
        own = *g;
        own.shared = false;
        g = &own;
    }
    r->inner->ops->conv2d_backward(be, din, dw, dbias, dout, in, w, g, scratch);
    grad_ready(r, dw, (size_t)g->B * (size_t)g->K * (size_t)g->C * (size_t)g->kh * (size_t)g->kw);
    grad_ready(r, dbias, (size_t)g->B * (size_t)g->K);
}

static void h_layernorm_backward(fb_backend *be, float *din, float *dgamma, float *dbeta,
                                 const float *dout, const float *in, const float *mean,
                                 const float *rstd, const float *gamma, int N, int B, int F)
{
    rank *r = rank_of(be);
    r->inner->ops->layernorm_backward(be, din, dgamma, dbeta, dout, in, mean, rstd, gamma, N, B,
                                      F);
    grad_ready(r, dgamma, (size_t)B * (size_t)F);
    grad_ready(r, dbeta, (size_t)B * (size_t)F);
}

/* Host scratch for synchronised batch norm's sums, [n]. */
static float *bn_scratch(rank *r, size_t n)
{
    if (n > r->bn_cap) {
        float *t = realloc(r->bn_tmp, n * sizeof *t);
        FB_ASSERT(t != NULL);
        r->bn_tmp = t;
        r->bn_cap = n;
    }
    return r->bn_tmp;
}

#define AT(x, n, c, i) (x)[((size_t)(n) * BC + (c)) * HW + (i)]

/* Batch norm over the global batch: per channel, the shards' sums are
 * all-reduced twice (the mean, then the squared deviations from it), as the
 * single-device two-pass variance does. */
static void h_batchnorm_forward_train(fb_backend *be, float *out, float *mean, float *rstd,
                                      float *running_mean, float *running_var, const float *in,
                                      const float *gamma, const float *beta, int N, int BC,
                                      int HW, float eps, float momentum)
{
    rank *r = rank_of(be);
    if (!r->hooks || !r->dp->opts.sync_bn) {
        r->inner->ops->batchnorm_forward_train(be, out, mean, rstd, running_mean, running_var,
                                               in, gamma, beta, N, BC, HW, eps, momentum);
        return;
    }
    const double M = (double)r->dp->N * HW;
    float *s = bn_scratch(r, (size_t)BC);
    for (int c = 0; c < BC; c++) {
        double acc = 0;
        for (int n = 0; n < N; n++)
            for (int i = 0; i < HW; i++) acc += AT(in, n, c, i);
        s[c] = (float)acc;
    }
    wait_coll(r, enqueue(r, (op){.kind = OP_BUF, .buf = s, .n = (size_t)BC}));
    for (int c = 0; c < BC; c++) mean[c] = (float)(s[c] / M);
    for (int c = 0; c < BC; c++) {
        double mu = mean[c], acc = 0;
        for (int n = 0; n < N; n++)
            for (int i = 0; i < HW; i++) {
                double d = AT(in, n, c, i) - mu;
                acc += d * d;
            }
        s[c] = (float)acc;
    }
    wait_coll(r, enqueue(r, (op){.kind = OP_BUF, .buf = s, .n = (size_t)BC}));
    for (int c = 0; c < BC; c++) {
        double mu = mean[c], var = s[c] / M;
        double rs = 1.0 / sqrt(var + eps);
        double g = gamma ? gamma[c] : 1.0, bt = beta ? beta[c] : 0.0;
        for (int n = 0; n < N; n++)
            for (int i = 0; i < HW; i++)
                AT(out, n, c, i) = (float)((AT(in, n, c, i) - mu) * rs * g + bt);
        rstd[c] = (float)rs;
        double unbiased = M > 1.0 ? var * M / (M - 1.0) : var;
        if (running_mean)
            running_mean[c] = (float)((1.0 - momentum) * running_mean[c] + momentum * mu);
        if (running_var)
            running_var[c] = (float)((1.0 - momentum) * running_var[c] + momentum * unbiased);
    }
}

/* The backward of synchronised batch norm: the input gradient needs the
 * global sums of dout and dout * xhat; the parameter gradients keep the
 * shard's own sums, which the gradient all-reduce then adds up. */
static void h_batchnorm_backward(fb_backend *be, float *din, float *dgamma, float *dbeta,
                                 const float *dout, const float *in, const float *mean,
                                 const float *rstd, const float *gamma, int N, int BC, int HW)
{
    rank *r = rank_of(be);
    if (!r->hooks || !r->dp->opts.sync_bn) {
        r->inner->ops->batchnorm_backward(be, din, dgamma, dbeta, dout, in, mean, rstd, gamma, N,
                                          BC, HW);
    } else {
        const double M = (double)r->dp->N * HW;
        float *s = bn_scratch(r, 2 * (size_t)BC);
        for (int c = 0; c < BC; c++) {
            double mu = mean[c], rs = rstd[c], sdy = 0, sdyx = 0;
            for (int n = 0; n < N; n++)
                for (int i = 0; i < HW; i++) {
                    double dy = AT(dout, n, c, i);
                    sdy += dy;
                    sdyx += dy * (AT(in, n, c, i) - mu) * rs;
                }
            if (dgamma) dgamma[c] = (float)(dgamma[c] + sdyx);
            if (dbeta) dbeta[c] = (float)(dbeta[c] + sdy);
            s[c] = (float)sdy;
            s[BC + c] = (float)sdyx;
        }
        wait_coll(r, enqueue(r, (op){.kind = OP_BUF, .buf = s, .n = 2 * (size_t)BC}));
        for (int c = 0; c < BC; c++) {
            double mu = mean[c], rs = rstd[c], g = gamma ? gamma[c] : 1.0;
            double sdy = s[c], sdyx = s[BC + c];
            if (din)
                for (int n = 0; n < N; n++)
                    for (int i = 0; i < HW; i++) {
                        double xhat = (AT(in, n, c, i) - mu) * rs;
                        double d = g * rs * (AT(dout, n, c, i) - sdy / M - xhat * sdyx / M);
                        AT(din, n, c, i) = (float)(AT(din, n, c, i) + d);
                    }
        }
    }
    grad_ready(r, dgamma, (size_t)BC);
    grad_ready(r, dbeta, (size_t)BC);
}

#undef AT

/* The loss gradient's scale: 1 / the samples of the whole batch. */
static float loss_scale(const rank *r)
{
    return 1.0f / (float)(r->dp->scale_n > 0 ? r->dp->scale_n : r->dp->N);
}

/* A pipeline stage other than the last: its output gradient comes from the
 * next stage and replaces the loss's. */
static void inject(rank *r, float *dlogits, size_t n)
{
    if (r->hooks && r->inject && dlogits)
        fb_backend_upload(&r->be, dlogits, r->inject, n * sizeof(float));
}

static void h_softmax_xent(fb_backend *be, float *loss, float *dlogits, float *correct,
                           const float *logits, const int32_t *labels, int N, int B, int K,
                           float grad_scale)
{
    rank *r = rank_of(be);
    if (r->hooks) grad_scale = loss_scale(r); /* the shard's part of the global mean */
    r->inner->ops->softmax_xent(be, loss, dlogits, correct, logits, labels, N, B, K, grad_scale);
    inject(r, dlogits, (size_t)N * (size_t)B * (size_t)K);
}

static void h_mse(fb_backend *be, float *loss, float *dpred, const float *pred,
                  const float *target, int N, int B, int K, float grad_scale)
{
    rank *r = rank_of(be);
    if (r->hooks) grad_scale = loss_scale(r);
    r->inner->ops->mse(be, loss, dpred, pred, target, N, B, K, grad_scale);
    inject(r, dpred, (size_t)N * (size_t)B * (size_t)K);
}

/* Dropout masks follow the sample's position in the global batch. */
static void h_dropout_forward(fb_backend *be, float *out, const float *in,
                              const uint64_t *seeds, uint64_t stream, float p, int N, int B, int F,
                              int64_t n_offset)
{
    rank *r = rank_of(be);
    r->inner->ops->dropout_forward(be, out, in, seeds, stream, p, N, B, F,
                                   n_offset + (r->hooks ? r->dp->base + r->off : 0));
}

static void h_dropout_backward(fb_backend *be, float *din, const float *dout,
                               const uint64_t *seeds, uint64_t stream, float p, int N, int B,
                               int F, int64_t n_offset)
{
    rank *r = rank_of(be);
    r->inner->ops->dropout_backward(be, din, dout, seeds, stream, p, N, B, F,
                                    n_offset + (r->hooks ? r->dp->base + r->off : 0));
}

/* Makes rank r's backend: the device's, with the data-parallel entries
 * overridden where the device has them. */
static void hook_backend(rank *r, fb_backend *inner, int threads)
{
    const struct fb_backend_ops *o = inner->ops;
    r->inner = inner;
    r->ops = *o;
#define HOOK(fn, h)                                                                                \
    if (o->fn) r->ops.fn = h
    HOOK(linear_backward, h_linear_backward);
    HOOK(conv2d_backward, h_conv2d_backward);
    HOOK(layernorm_backward, h_layernorm_backward);
    HOOK(batchnorm_forward_train, h_batchnorm_forward_train);
    HOOK(batchnorm_backward, h_batchnorm_backward);
    HOOK(softmax_xent, h_softmax_xent);
    HOOK(mse, h_mse);
    HOOK(dropout_forward, h_dropout_forward);
    HOOK(dropout_backward, h_dropout_backward);
#undef HOOK
    r->be.name = inner->name;
    r->be.ops = &r->ops;
    r->be.ctx = inner->ctx;
    r->be.threads = threads > 0 ? threads : inner->threads;
}

/* ---- rank threads ------------------------------------------------------------ */

static void rank_fb(rank *r)
{
    fb_dp *dp = r->dp;
    double t0 = now_ms();
    r->n_regions = 0;
    r->bucket_first = 0;
    r->bucket_floats = 0;
    r->wait_ms = 0;
    r->hooks = true;
    int B = fb_array_size(r->a), K = fb_array_outputs(r->a);
    r->inject = dp->dout ? dp->dout + (size_t)r->off * (size_t)B * (size_t)K : NULL;
    r->capture = dp->din ? dp->din + (size_t)r->off * dp->in_stride : NULL;
    r->err = fb_array_forward_backward(r->a, dp->x + (size_t)r->off * dp->x_stride,
                                       dp->y + r->off, (int)r->n, true, dp->stream, r->loss,
                                       r->correct, r->msg, sizeof r->msg);
    r->inject = NULL;
    r->capture = NULL;
    /* The inputs were checked before any rank started; what is left (memory
     * for mse targets) cannot be recovered from without the other ranks
     * waiting forever for this one's collectives, so it is an invariant. */
    FB_ASSERT(r->err == FB_OK);
    if (dp->opts.no_overlap) {
        /* the baseline: the same buckets, handed over only after backward */
        int n = r->n_regions;
        r->n_regions = 0;
        for (int i = 0; i < n; i++) {
            r->n_regions++;
            r->bucket_floats += r->regions[i].n;
            if (r->bucket_floats * sizeof(float) >= dp->opts.bucket_bytes) submit_bucket(r);
        }
    }
    submit_bucket(r);
    if (dp->world > dp->D) {
        /* the other processes' shards' losses: summed like a gradient */
        for (int b = 0; b < B; b++) {
            r->world_loss[b] = (float)((double)r->n / dp->N * r->loss[b]);
            r->world_loss[B + b] = r->correct[b];
        }
        enqueue(r, (op){.kind = OP_BUF, .buf = r->world_loss, .n = 2 * (size_t)B});
    }
    r->hooks = false;
    pthread_mutex_lock(&dp->mu);
    int last = r->n_ops - 1;
    pthread_mutex_unlock(&dp->mu);
    if (last >= 0) wait_coll(r, last);
    r->compute_ms = now_ms() - t0 - r->wait_ms;
}

/* Forward only (a pipeline stage's forward): outputs into dp->out, member-major. */
static void rank_fwd(rank *r)
{
    fb_dp *dp = r->dp;
    double t0 = now_ms();
    r->wait_ms = 0;
    r->hooks = true;
    r->err = fb_array_forward_backward(r->a, dp->x + (size_t)r->off * dp->x_stride, NULL,
                                       (int)r->n, true, dp->stream, NULL, NULL, r->msg,
                                       sizeof r->msg);
    FB_ASSERT(r->err == FB_OK); /* the sizes were checked before any rank started */
    r->hooks = false;
    int B = fb_array_size(r->a), K = fb_array_outputs(r->a);
    for (int m = 0; m < B; m++)
        fb_array_logits(r->a, m, (int)r->n,
                        dp->out + ((size_t)m * (size_t)dp->N + (size_t)r->off) * (size_t)K);
    r->compute_ms = now_ms() - t0 - r->wait_ms;
}

static void *rank_main(void *arg)
{
    rank *r = arg;
    fb_dp *dp = r->dp;
    uint64_t seen = 0;
    /* a device's cores are a placement hint: a thread the kernel will not pin still trains */
    fb_device_pin_thread(&r->dev, NULL, 0);
    for (;;) {
        pthread_mutex_lock(&dp->mu);
        while (dp->job_gen == seen) pthread_cond_wait(&dp->job_cv, &dp->mu);
        seen = dp->job_gen;
        job_kind job = dp->job;
        pthread_mutex_unlock(&dp->mu);
        if (job == JOB_QUIT) break;
        if (job == JOB_FB) {
            rank_fb(r);
        } else if (job == JOB_FWD) {
            rank_fwd(r);
        } else if (job == JOB_STEP) {
            double t0 = now_ms();
            fb_array_step(r->a, dp->hp);
            r->compute_ms += now_ms() - t0;
        }
        pthread_mutex_lock(&dp->mu);
        dp->jobs_done++;
        pthread_cond_broadcast(&dp->done_cv);
        pthread_mutex_unlock(&dp->mu);
    }
    return NULL;
}

/* Runs job on every rank and waits for all of them. */
static void run_job(fb_dp *dp, job_kind job)
{
    pthread_mutex_lock(&dp->mu);
    dp->job = job;
    dp->jobs_done = 0;
    dp->job_gen++;
    pthread_cond_broadcast(&dp->job_cv);
    if (job != JOB_QUIT)
        while (dp->jobs_done < dp->D) pthread_cond_wait(&dp->done_cv, &dp->mu);
    pthread_mutex_unlock(&dp->mu);
}

/* ---- the public side ----------------------------------------------------------- */

int fb_dp_new(const fb_device *devs, int D, const fb_job_spec *const *specs, int B, int max_n,
              const fb_dp_opts *opts, fb_dp **out, char *msg, size_t msg_cap)
{
    if (!devs || !specs || !out) return fb_errf(msg, msg_cap, FB_ERR_INTERNAL, "missing argument");
    if (D < 1 || D > FB_DP_MAX_RANKS)
        return fb_errf(msg, msg_cap, FB_ERR_OUT_OF_RANGE, "data parallelism of %d devices (1..%d)",
                       D, FB_DP_MAX_RANKS);
    fb_dp_opts o = {.slow_rank = -1};
    if (opts) o = *opts;
    if (o.bucket_bytes == 0) o.bucket_bytes = FB_DP_DEFAULT_BUCKET_BYTES;
    if (o.bucket_bytes < sizeof(float) || o.bucket_bytes > ((size_t)1 << 32))
        return fb_errf(msg, msg_cap, FB_ERR_OUT_OF_RANGE,
                       "bucket of %zu bytes (4 bytes .. 4 GiB)", o.bucket_bytes);
    if (o.slow_us < 0 || o.slow_us > 1000000)
        return fb_errf(msg, msg_cap, FB_ERR_OUT_OF_RANGE, "slow_us %d (0..1000000)", o.slow_us);
    for (int d = 0; d < D; d++) {
        if (!devs[d].be) return fb_errf(msg, msg_cap, FB_ERR_INTERNAL, "device %d has no backend", d);
        if (devs[d].kind != devs[0].kind)
            return fb_errf(msg, msg_cap, FB_ERR_UNSUPPORTED,
                           "a data-parallel group needs devices of one kind");
    }
    bool host = devs[0].kind == FB_DEVICE_CPU;
    if (o.sync_bn && !host)
        return fb_errf(msg, msg_cap, FB_ERR_UNSUPPORTED,
                       "synchronised batch norm runs on CPU devices only");
    int world = D, base = 0;
    if (o.control_comm && !o.comm)
        return fb_errf(msg, msg_cap, FB_ERR_UNSUPPORTED,
                       "a control communicator needs a gradient communicator (opts.comm)");
    if (o.comm) {
        fb_comm *ctl = o.control_comm ? o.control_comm : o.comm;
        int err = fb_comm_tcp_layout(ctl, &base, &world, msg, msg_cap);
        if (err) return err;
        if (!host && !o.control_comm)
            return fb_errf(msg, msg_cap, FB_ERR_UNSUPPORTED,
                           "CUDA ranks across processes need an NCCL communicator for the "
                           "gradients and a TCP one for the control (opts.control_comm)");
        if (fb_comm_host_memory(o.comm) != host)
            return fb_errf(msg, msg_cap, FB_ERR_UNSUPPORTED,
                           "the %s communicator cannot sum the gradients of %s devices",
                           fb_comm_name(o.comm), host ? "CPU" : "CUDA");
        if (fb_comm_local_size(ctl) != D || fb_comm_local_size(o.comm) != D)
            return fb_errf(msg, msg_cap, FB_ERR_OUT_OF_RANGE,
                           "the communicators hold %d and %d local ranks, the group has %d "
                           "devices",
                           fb_comm_local_size(o.comm), fb_comm_local_size(ctl), D);
        int gbase = 0, gworld = 0;
        fb_comm_layout(o.comm, &gbase, &gworld);
        if (gbase != base || gworld != world)
            return fb_errf(msg, msg_cap, FB_ERR_OUT_OF_RANGE,
                           "the gradient communicator holds ranks %d.. of %d, the control one "
                           "ranks %d.. of %d",
                           gbase, gworld, base, world);
        if (world > FB_DP_MAX_RANKS)
            return fb_errf(msg, msg_cap, FB_ERR_OUT_OF_RANGE, "a world of %d ranks (1..%d)",
                           world, FB_DP_MAX_RANKS);
    }

    int err = FB_OK;
    fb_dp *dp = calloc(1, sizeof *dp);
    if (!dp) return fb_errf(msg, msg_cap, FB_ERR_NOMEM, "out of memory");
    dp->D = D;
    dp->B = B;
    dp->max_n = max_n;
    dp->world = world;
    dp->first = base;
    dp->opts = o;
    dp->host = host;
    if (pthread_mutex_init(&dp->mu, NULL)) {
        free(dp);
        return fb_errf(msg, msg_cap, FB_ERR_NOMEM, "cannot make a mutex");
    }
    pthread_cond_init(&dp->job_cv, NULL);
    pthread_cond_init(&dp->done_cv, NULL);
    pthread_cond_init(&dp->comm_cv, NULL);
    pthread_cond_init(&dp->coll_cv, NULL);
    dp->mu_ok = true;
    dp->ranks = calloc((size_t)D, sizeof *dp->ranks);
    dp->zeros = calloc((size_t)(max_n > 0 ? max_n : 1), sizeof *dp->zeros);
    if (!dp->ranks || !dp->zeros) {
        err = fb_errf(msg, msg_cap, FB_ERR_NOMEM, "out of memory");
        goto fail;
    }
    if (o.comm) {
        dp->comm = o.comm;
        dp->ctl = o.control_comm ? o.control_comm : o.comm;
    } else if (host) {
        err = fb_comm_shm_new(D, &dp->comm, msg, msg_cap);
    } else {
        int ords[FB_DP_MAX_RANKS];
        unsigned char id[FB_COMM_ID_BYTES];
        for (int d = 0; d < D; d++) ords[d] = devs[d].ordinal;
        err = fb_comm_nccl_unique_id(id, msg, msg_cap);
        if (!err) err = fb_comm_nccl_new(D, ords, 0, D, id, &dp->comm, msg, msg_cap);
    }
    if (err) goto fail;
    dp->own_comm = !o.comm;
    if (!dp->ctl) dp->ctl = dp->comm; /* one process: sync_bn's sums are host memory (CPU) */
    for (int d = 0; d < D; d++) {
        rank *r = &dp->ranks[d];
        r->dp = dp;
        r->r = d;
        r->dev = devs[d];
        hook_backend(r, devs[d].be, o.threads);
        if ((err = fb_array_new(&r->be, specs, B, max_n, &r->a, msg, msg_cap))) goto fail;
        int n_params = fb_array_tensor_count(r->a, FB_ARRAY_PARAM);
        int n_bn = fb_array_bn_count(r->a);
        r->cap_regions = n_params + 1;
        r->cap_ops = n_params + 3 * n_bn + 3;
        r->regions = calloc((size_t)r->cap_regions, sizeof *r->regions);
        r->ops_q = calloc((size_t)r->cap_ops, sizeof *r->ops_q);
        r->loss = calloc((size_t)B, sizeof *r->loss);
        r->correct = calloc((size_t)B, sizeof *r->correct);
        r->world_loss = calloc(2 * (size_t)B, sizeof *r->world_loss);
        if (!r->regions || !r->ops_q || !r->loss || !r->correct || !r->world_loss) {
            err = fb_errf(msg, msg_cap, FB_ERR_NOMEM, "out of memory");
            goto fail;
        }
    }
    for (int d = 0; d < D; d++) {
        if (pthread_create(&dp->ranks[d].th, NULL, rank_main, &dp->ranks[d])) {
            err = fb_errf(msg, msg_cap, FB_ERR_NOMEM, "cannot start a rank thread");
            goto fail;
        }
        dp->ranks[d].started = true;
    }
    if (pthread_create(&dp->comm_th, NULL, comm_main, dp)) {
        err = fb_errf(msg, msg_cap, FB_ERR_NOMEM, "cannot start the communication thread");
        goto fail;
    }
    dp->comm_started = true;
    dp->times.D = D;
    *out = dp;
    return FB_OK;

fail:
    fb_dp_free(dp);
    return err;
}

void fb_dp_free(fb_dp *dp)
{
    if (!dp) return;
    if (dp->ranks) {
        bool any = false;
        for (int d = 0; d < dp->D; d++) any = any || dp->ranks[d].started;
        if (any) {
            run_job(dp, JOB_QUIT);
            for (int d = 0; d < dp->D; d++)
                if (dp->ranks[d].started) pthread_join(dp->ranks[d].th, NULL);
        }
    }
    if (dp->comm_started) {
        pthread_mutex_lock(&dp->mu);
        dp->comm_quit = true;
        pthread_cond_broadcast(&dp->comm_cv);
        pthread_mutex_unlock(&dp->mu);
        pthread_join(dp->comm_th, NULL);
    }
    if (dp->ranks) {
        for (int d = 0; d < dp->D; d++) {
            rank *r = &dp->ranks[d];
            fb_array_free(r->a);
            free(r->regions);
            free(r->ops_q);
            free(r->bn_tmp);
            free(r->loss);
            free(r->correct);
            free(r->world_loss);
        }
        free(dp->ranks);
    }
    if (dp->own_comm) fb_comm_free(dp->comm);
    free(dp->zeros);
    if (dp->mu_ok) {
        pthread_mutex_destroy(&dp->mu);
        pthread_cond_destroy(&dp->job_cv);
        pthread_cond_destroy(&dp->done_cv);
        pthread_cond_destroy(&dp->comm_cv);
        pthread_cond_destroy(&dp->coll_cv);
    }
    free(dp);
}

int fb_dp_ranks(const fb_dp *dp)
{
    return dp ? dp->D : 0;
}

int fb_dp_world(const fb_dp *dp)
{
    return dp ? dp->world : 0;
}

fb_array *fb_dp_array(fb_dp *dp, int d)
{
    return d >= 0 && d < dp->D ? dp->ranks[d].a : NULL;
}

int fb_dp_check_split(const fb_dp *dp, const int64_t *split, int N, char *msg, size_t msg_cap)
{
    int64_t sum = 0;
    for (int d = 0; d < dp->world; d++) {
        if (split[d] < 1 || split[d] > dp->max_n)
            return fb_errf(msg, msg_cap, FB_ERR_OUT_OF_RANGE,
                           "shard %d of the split has %lld samples (1..%d)", d,
                           (long long)split[d], dp->max_n);
        sum += split[d];
    }
    if (sum != N)
        return fb_errf(msg, msg_cap, FB_ERR_OUT_OF_RANGE,
                       "the split adds up to %lld samples, the batch has %d", (long long)sum, N);
    return FB_OK;
}

void fb_dp_even_split(int D, int N, const double *weights, int64_t *split)
{
    if (!weights) {
        for (int d = 0; d < D; d++) split[d] = N / D + (d < N % D ? 1 : 0);
        return;
    }
    double total = 0;
    for (int d = 0; d < D; d++) total += weights[d] > 0 ? weights[d] : 0;
    if (!(total > 0)) {
        fb_dp_even_split(D, N, NULL, split);
        return;
    }
    /* one sample each, the rest by largest remainder of the weights */
    int rest = N - D, given = 0;
    double frac[FB_DP_MAX_RANKS];
    for (int d = 0; d < D; d++) {
        double q = rest * (weights[d] > 0 ? weights[d] : 0) / total;
        split[d] = 1 + (int64_t)floor(q);
        frac[d] = q - floor(q);
        given += (int)floor(q);
    }
    while (given < rest) {
        int best = 0;
        for (int d = 1; d < D; d++)
            if (frac[d] > frac[best]) best = d;
        split[best]++;
        frac[best] = -1;
        given++;
    }
}

/* Runs job (JOB_FB or JOB_FWD) over the ranks on x [N, input] split by split;
 * the checks come first, so that a refused call runs nothing. */
static int dp_run(fb_dp *dp, job_kind job, const float *x, const int32_t *y, int N,
                  const int64_t *split, uint64_t stream, const float *dout, float *din,
                  float *out, float *loss, float *correct, char *msg, size_t msg_cap)
{
    int64_t even[FB_DP_MAX_RANKS];
    if (!x || (job == JOB_FB && !y && !dout) || (job == JOB_FWD && !out))
        return fb_errf(msg, msg_cap, FB_ERR_INTERNAL, "no batch");
    if (dp->world > dp->D && (job == JOB_FWD || dout || din))
        return fb_errf(msg, msg_cap, FB_ERR_UNSUPPORTED,
                       "pipeline stages do not span processes");
    if (N < dp->world)
        return fb_errf(msg, msg_cap, FB_ERR_OUT_OF_RANGE,
                       "a batch of %d samples cannot feed %d devices", N, dp->world);
    if (!split) {
        fb_dp_even_split(dp->world, N, NULL, even);
        split = even;
    }
    int err = fb_dp_check_split(dp, split, N, msg, msg_cap);
    if (err) return err;
    const fb_array *a0 = dp->ranks[0].a;
    int K = fb_array_outputs(a0);
    const fb_job_spec *s = fb_array_spec(a0, 0);
    if (din && (fb_array_size(a0) != 1 || s->n_layers < 1 ||
                (s->layers[0].type != FB_LAYER_LINEAR && s->layers[0].type != FB_LAYER_CONV2D)))
        return fb_errf(msg, msg_cap, FB_ERR_UNSUPPORTED,
                       "an input gradient needs one member and a linear or conv2d first layer");
    /* every rank must reach every collective, so what could fail inside a
     * rank (a label outside the outputs) is checked here, before any starts */
    if (!y) y = dp->zeros;
    for (int n = 0; n < N && job == JOB_FB; n++) {
        bool ok = s->loss == FB_LOSS_CROSS_ENTROPY || K > 1 ? (y[n] >= 0 && y[n] < K) : y[n] >= 0;
        if (!ok)
            return fb_errf(msg, msg_cap, FB_ERR_DATA,
                           "label %d of sample %d is outside the model's %d outputs", y[n], n, K);
    }
    int64_t in_numel = fb_shape_numel(&s->input);
    int64_t off = 0;
    for (int d = 0; d < dp->first; d++) off += split[d]; /* the other processes' shards */
    double t0 = now_ms();
    /* the communication thread reads the queues under the mutex */
    pthread_mutex_lock(&dp->mu);
    for (int d = 0; d < dp->D; d++) {
        rank *r = &dp->ranks[d];
        r->off = off;
        r->n = split[dp->first + d];
        off += r->n;
        r->n_ops = 0;
        r->compute_ms = 0;
    }
    dp->coll_done = 0;
    dp->comm_err = 0;
    pthread_mutex_unlock(&dp->mu);
    dp->x = x;
    dp->y = y;
    dp->N = N;
    dp->stream = stream;
    dp->x_stride = (size_t)in_numel;
    dp->in_stride = (size_t)in_numel;
    dp->dout = dout;
    dp->din = din;
    dp->out = out;
    run_job(dp, job);
    dp->dout = NULL;
    dp->din = NULL;
    dp->out = NULL;
    double wall = now_ms() - t0;
    if (dp->comm_err)
        return fb_errf(msg, msg_cap, dp->comm_err, "gradient all-reduce: %s", dp->comm_msg);
    int B = fb_array_size(a0);
    for (int b = 0; b < B && job == JOB_FB; b++) {
        double l = 0, c = 0;
        if (dp->world > dp->D) {
            l = dp->ranks[0].world_loss[b];
            c = dp->ranks[0].world_loss[B + b];
        }
        for (int d = 0; d < dp->D && dp->world == dp->D; d++) {
            l += (double)dp->ranks[d].n / N * dp->ranks[d].loss[b];
            c += dp->ranks[d].correct[b];
        }
        if (loss) loss[b] = (float)l;
        if (correct) correct[b] = (float)c;
    }
    dp->times.steps += job == JOB_FB;
    dp->times.wall_ms += wall;
    for (int d = 0; d < dp->D; d++) {
        dp->times.compute_ms[d] += dp->ranks[d].compute_ms;
        dp->times.comm_exposed_ms[d] += dp->ranks[d].wait_ms;
        if (job == JOB_FB) {
            dp->times.samples[d] += dp->ranks[d].n;
            dp->times.pass_ms[d] += dp->ranks[d].compute_ms;
        }
    }
    return FB_OK;
}

int fb_dp_forward_backward(fb_dp *dp, const float *x, const int32_t *y, int N,
                           const int64_t *split, uint64_t stream, float *loss, float *correct,
                           char *msg, size_t msg_cap)
{
    if (!y || !loss) return fb_errf(msg, msg_cap, FB_ERR_INTERNAL, "no labels or loss");
    return dp_run(dp, JOB_FB, x, y, N, split, stream, NULL, NULL, NULL, loss, correct, msg,
                  msg_cap);
}

int fb_dp_stage_forward(fb_dp *dp, const float *x, int N, const int64_t *split, uint64_t stream,
                        float *out, char *msg, size_t msg_cap)
{
    return dp_run(dp, JOB_FWD, x, NULL, N, split, stream, NULL, NULL, out, NULL, NULL, msg,
                  msg_cap);
}

int fb_dp_stage_backward(fb_dp *dp, const float *x, const int32_t *y, int N,
                         const int64_t *split, uint64_t stream, const float *dout, float *din,
                         float *loss, float *correct, char *msg, size_t msg_cap)
{
    return dp_run(dp, JOB_FB, x, y, N, split, stream, dout, din, NULL, loss, correct, msg,
                  msg_cap);
}

void fb_dp_set_scale(fb_dp *dp, int whole_n, int64_t base)
{
    dp->scale_n = whole_n > 0 ? whole_n : 0;
    dp->base = base > 0 ? base : 0;
}

void fb_dp_step(fb_dp *dp, const fb_optim_hparams *hp)
{
    double t0 = now_ms();
    for (int d = 0; d < dp->D; d++) dp->ranks[d].compute_ms = 0;
    dp->hp = hp;
    run_job(dp, JOB_STEP);
    dp->times.wall_ms += now_ms() - t0;
    for (int d = 0; d < dp->D; d++) dp->times.compute_ms[d] += dp->ranks[d].compute_ms;
}

void fb_dp_remove(fb_dp *dp, int m)
{
    for (int d = 0; d < dp->D; d++) fb_array_remove(dp->ranks[d].a, m);
}

int fb_dp_broadcast(fb_dp *dp, char *msg, size_t msg_cap)
{
    if (dp->D < 2) return FB_OK;
    fb_array *a0 = dp->ranks[0].a;
    static const fb_array_part parts[] = {FB_ARRAY_PARAM, FB_ARRAY_STATE1, FB_ARRAY_STATE2,
                                          FB_ARRAY_BUFFER};
    size_t big = 0;
    for (size_t p = 0; p < sizeof parts / sizeof parts[0]; p++)
        for (int t = 0; t < fb_array_tensor_count(a0, parts[p]); t++) {
            size_t n = fb_array_tensor_at(a0, parts[p], t).numel;
            if (n > big) big = n;
        }
    float *tmp = malloc((big ? big : 1) * sizeof *tmp);
    if (!tmp) return fb_errf(msg, msg_cap, FB_ERR_NOMEM, "out of memory");
    int B = fb_array_size(a0);
    for (int m = 0; m < B; m++) {
        for (size_t p = 0; p < sizeof parts / sizeof parts[0]; p++)
            for (int t = 0; t < fb_array_tensor_count(a0, parts[p]); t++) {
                fb_array_get(a0, m, parts[p], t, tmp);
                for (int d = 1; d < dp->D; d++) fb_array_set(dp->ranks[d].a, m, parts[p], t, tmp);
            }
        for (int k = 0; k < fb_array_bn_count(a0); k++)
            for (int d = 1; d < dp->D; d++)
                fb_array_set_bn_tracked(dp->ranks[d].a, m, k, fb_array_bn_tracked(a0, m, k));
    }
    free(tmp);
    return FB_OK;
}

int fb_dp_broadcast_i64(fb_dp *dp, int64_t *v, int n, char *msg, size_t msg_cap)
{
    if (!dp || (n > 0 && !v)) return fb_errf(msg, msg_cap, FB_ERR_INTERNAL, "missing argument");
    if (n < 0 || n > FB_DP_MAX_BROADCAST)
        return fb_errf(msg, msg_cap, FB_ERR_OUT_OF_RANGE, "a broadcast of %d values (0..%d)", n,
                       FB_DP_MAX_BROADCAST);
    if (n == 0 || dp->world == dp->D) return FB_OK;
    /* four floats of 16 bits per value: integers below 2^24 add exactly, and zero added to
     * anything leaves it as it was, so the sum is rank 0's values in any order */
    size_t nf = 4 * (size_t)n;
    float *all = calloc((size_t)dp->D * nf, sizeof *all);
    if (!all) return fb_errf(msg, msg_cap, FB_ERR_NOMEM, "out of memory");
    float *bufs[FB_DP_MAX_RANKS];
    for (int d = 0; d < dp->D; d++)
        bufs[d] = all + (size_t)d * nf;
    if (dp->first == 0)
        for (int i = 0; i < n; i++)
            for (int k = 0; k < 4; k++)
                all[4 * (size_t)i + (size_t)k] = (float)(((uint64_t)v[i] >> (16 * k)) & 0xffff);
    char m[256] = "";
    pthread_mutex_lock(&dp->mu);
    /* between steps the communication thread has run every collective queued and waits
     * for the next step's; holding the mutex keeps it there while this sum runs */
    for (int d = 0; d < dp->D; d++)
        FB_ASSERT(dp->ranks[d].n_ops <= dp->coll_done);
    int err = fb_comm_allreduce_sum(dp->ctl, bufs, nf, m, sizeof m);
    pthread_mutex_unlock(&dp->mu);
    /* a part that is not a 16-bit integer means some other rank did not contribute zeros */
    for (size_t j = 0; j < nf && !err; j++) {
        float f = all[j];
        if (!(f >= 0 && f <= 65535 && f == (float)(uint32_t)f))
            err = fb_errf(m, sizeof m, FB_ERR_IO,
                          "value %zu arrived as %g, not a 16-bit part: another process "
                          "contributed to it",
                          j / 4, (double)f);
    }
    if (!err)
        for (int i = 0; i < n; i++) {
            uint64_t x = 0;
            for (int k = 0; k < 4; k++)
                x |= (uint64_t)(uint32_t)all[4 * (size_t)i + (size_t)k] << (16 * k);
            v[i] = (int64_t)x;
        }
    free(all);
    if (err) return fb_errf(msg, msg_cap, err, "broadcast: %s", m);
    return FB_OK;
}

int fb_dp_last_collectives(const fb_dp *dp, int d, size_t *sizes, int cap)
{
    const rank *r = &dp->ranks[d];
    int n = 0;
    for (int k = 0; k < r->n_ops; k++) {
        const op *o = &r->ops_q[k];
        size_t s = 0;
        if (o->kind == OP_BUF)
            s = o->n;
        else
            for (int j = 0; j < o->count; j++) s += r->regions[o->first + j].n;
        if (n < cap) sizes[n] = s;
        n++;
    }
    return n;
}

fb_dp_times fb_dp_take_times(fb_dp *dp)
{
    pthread_mutex_lock(&dp->mu);
    dp->times.comm_busy_ms = dp->comm_busy_ms;
    dp->comm_busy_ms = 0;
    pthread_mutex_unlock(&dp->mu);
    fb_dp_times t = dp->times;
    memset(&dp->times, 0, sizeof dp->times);
    dp->times.D = dp->D;
    return t;
}
