/*
 * The CUDA backend's 2-D convolution on cuDNN.
 *
 * The engine's layouts are cuDNN's NCHW ones: in [N, B*C, H, W], w [B, K, C,
 * kh, kw] = [B*K, C, kh, kw] and out [N, B*K, Ho, Wo], so B members are one
 * grouped convolution with groups = B.  The shared first layer reads in [N,
 * C, H, W] and is one ungrouped convolution with B*K output channels.
 *
 * Each shape (geometry, TF32 setting and search mode) gets a plan on first
 * use: the descriptors and, for each direction, the candidates cuDNN's
 * heuristics rank, kept when deterministic and within the workspace limit.
 * With FUSEBOX_CUDNN_SEARCH=timed the first call of each direction times
 * every candidate on the caller's inputs, writing into scratch from the pool,
 * and keeps the fastest; with "heuristic" (the default, so that runs repeat
 * each other bit for bit) the first candidate is used as ranked.  Either way
 * every algorithm is deterministic; the heuristic choice is also the same in
 * every run on the same device and library, while the timed one may differ
 * between runs when two candidates are about as fast.  Plans live as long as
 * the backend.
 *
 * The timing is ours rather than cudnnFind*AlgorithmEx's: those time every
 * algorithm, non-deterministic ones included, with beta = 0 only, and like
 * the rest of this legacy convolution API they are deprecated in cuDNN 9.
 */
#include <stdlib.h>
#include <string.h>

#include "cuda_internal.h"

/* The most workspace one algorithm may ask for. */
#define FBC_CONV_WS_LIMIT ((size_t)512 << 20)
/* Timed runs of each candidate after its warm-up run. */
#define FBC_SEARCH_RUNS 3
/* A later candidate (in heuristic order) must be this much faster than the
 * best so far to replace it, so that timing noise between two about equally
 * fast algorithms does not decide, and the heuristic order breaks near-ties. */
#define FBC_SEARCH_MARGIN 0.05f

/* The search mode FUSEBOX_CUDNN_SEARCH asks for: unset or empty is heuristic.
 * Any other value than "timed" or "heuristic" is recorded as the backend's
 * error (the convolution then does nothing); -1 then. */
static int search_mode(struct fbc_ctx *c)
{
    const char *v = getenv("FUSEBOX_CUDNN_SEARCH");
    if (!v || !*v || strcmp(v, "heuristic") == 0) return FBC_SEARCH_HEURISTIC;
    if (strcmp(v, "timed") == 0) return FBC_SEARCH_TIMED;
    fbc_fail(c, FB_ERR_BAD_ENUM,
             "FUSEBOX_CUDNN_SEARCH=\"%.40s\": expected \"timed\" or \"heuristic\"", v);
    return -1;
}

static cudnnMathType_t plan_math(const struct fbc_conv_plan *p)
{
    /* FMA math keeps float convolutions off the TF32 tensor cores. */
    return p->tf32 ? CUDNN_DEFAULT_MATH : CUDNN_FMA_MATH;
}

static bool geom_equal(const fb_conv_geom *a, const fb_conv_geom *b)
{
    return a->N == b->N && a->B == b->B && a->C == b->C && a->H == b->H && a->W == b->W &&
           a->K == b->K && a->kh == b->kh && a->kw == b->kw && a->sh == b->sh && a->sw == b->sw &&
           a->ph == b->ph && a->pw == b->pw && a->Ho == b->Ho && a->Wo == b->Wo &&
           a->shared == b->shared;
}

static void plan_destroy(struct fbc_conv_plan *p)
{
    if (p->x) cudnnDestroyTensorDescriptor(p->x);
    if (p->y) cudnnDestroyTensorDescriptor(p->y);
    if (p->w) cudnnDestroyFilterDescriptor(p->w);
    if (p->conv) cudnnDestroyConvolutionDescriptor(p->conv);
    memset(p, 0, sizeof *p);
}

/* The exact workspace of one algorithm of one direction (dir 0 forward,
 * 1 backward data, 2 backward filter) in math type math (set on the
 * descriptor first); false when cuDNN cannot say. */
static bool algo_ws(struct fbc_ctx *c, const struct fbc_conv_plan *p, int dir, int algo,
                    cudnnMathType_t math, size_t *ws)
{
    cudnnStatus_t s = cudnnSetConvolutionMathType(p->conv, math);
    if (s != CUDNN_STATUS_SUCCESS) return false;
    if (dir == 0)
        s = cudnnGetConvolutionForwardWorkspaceSize(c->dnn, p->x, p->w, p->conv, p->y,
                                                    (cudnnConvolutionFwdAlgo_t)algo, ws);
    else if (dir == 1)
        s = cudnnGetConvolutionBackwardDataWorkspaceSize(c->dnn, p->w, p->y, p->conv, p->x,
                                                         (cudnnConvolutionBwdDataAlgo_t)algo, ws);
    else
        s = cudnnGetConvolutionBackwardFilterWorkspaceSize(
            c->dnn, p->x, p->y, p->conv, p->w, (cudnnConvolutionBwdFilterAlgo_t)algo, ws);
    return s == CUDNN_STATUS_SUCCESS;
}

/* Keeps, in cuDNN's heuristic order, the results that succeeded, are
 * deterministic and whose workspace fits the limit, each with the math type
 * cuDNN ranked it with.  Without TF32 only FMA-math results are kept: the
 * descriptor asks for FMA math, and a result in another math type would put
 * float convolutions on the TF32 tensor cores.  perf has n entries. */
template <typename Perf>
static void keep_algos(struct fbc_ctx *c, const struct fbc_conv_plan *p, int dir, const Perf *perf,
                       int n, struct fbc_conv_algos *out)
{
    out->n = out->cur = 0;
    for (int i = 0; i < n && out->n < FBC_CONV_CANDIDATES; i++) {
        size_t ws = 0;
        if (perf[i].status != CUDNN_STATUS_SUCCESS || perf[i].determinism != CUDNN_DETERMINISTIC)
            continue;
        if (!p->tf32 && perf[i].mathType != CUDNN_FMA_MATH) continue;
        if (!algo_ws(c, p, dir, (int)perf[i].algo, perf[i].mathType, &ws) ||
            ws > FBC_CONV_WS_LIMIT)
            continue;
        out->algo[out->n] = (int)perf[i].algo;
        out->math[out->n] = perf[i].mathType;
        out->ws[out->n] = ws;
        out->n++;
    }
}

/* Fills p (zeroed by the caller) for g; false with the error recorded. */
static bool plan_make(struct fbc_ctx *c, struct fbc_conv_plan *p, const fb_conv_geom *g,
                      int search)
{
    const int Bi = g->shared ? 1 : g->B;
    long long cin = (long long)Bi * g->C, cout = (long long)g->B * g->K;
    if (cin > INT32_MAX || cout > INT32_MAX) {
        fbc_fail(c, FB_ERR_UNSUPPORTED, "conv2d: %lld input or %lld output channels", cin, cout);
        return false;
    }
    p->g = *g;
    p->tf32 = c->tf32;
    p->search = search;
    if (!FBC_DNN(c, cudnnCreateTensorDescriptor(&p->x)) ||
        !FBC_DNN(c, cudnnCreateTensorDescriptor(&p->y)) ||
        !FBC_DNN(c, cudnnCreateFilterDescriptor(&p->w)) ||
        !FBC_DNN(c, cudnnCreateConvolutionDescriptor(&p->conv)))
        return false;
    if (!FBC_DNN(c, cudnnSetTensor4dDescriptor(p->x, CUDNN_TENSOR_NCHW, CUDNN_DATA_FLOAT, g->N,
                                               (int)cin, g->H, g->W)) ||
        !FBC_DNN(c, cudnnSetTensor4dDescriptor(p->y, CUDNN_TENSOR_NCHW, CUDNN_DATA_FLOAT, g->N,
                                               (int)cout, g->Ho, g->Wo)) ||
        !FBC_DNN(c, cudnnSetFilter4dDescriptor(p->w, CUDNN_DATA_FLOAT, CUDNN_TENSOR_NCHW,
                                               (int)cout, g->C, g->kh, g->kw)) ||
        !FBC_DNN(c, cudnnSetConvolution2dDescriptor(p->conv, g->ph, g->pw, g->sh, g->sw, 1, 1,
                                                    CUDNN_CROSS_CORRELATION, CUDNN_DATA_FLOAT)) ||
        !FBC_DNN(c, cudnnSetConvolutionGroupCount(p->conv, Bi == 1 ? 1 : g->B)) ||
        !FBC_DNN(c, cudnnSetConvolutionMathType(p->conv, plan_math(p))))
        return false;

    /* cuDNN's idea of the output size must be ours. */
    int dn = 0, dc = 0, dh = 0, dw = 0;
    if (!FBC_DNN(c, cudnnGetConvolution2dForwardOutputDim(p->conv, p->x, p->w, &dn, &dc, &dh, &dw)))
        return false;
    if (dn != g->N || dc != (int)cout || dh != g->Ho || dw != g->Wo) {
        fbc_fail(c, FB_ERR_INTERNAL,
                 "conv2d: cuDNN output [%d, %d, %d, %d], expected [%d, %lld, %d, %d]", dn, dc, dh,
                 dw, g->N, cout, g->Ho, g->Wo);
        return false;
    }

    enum { MAXALG = 16 };
    int n = 0;
    cudnnConvolutionFwdAlgoPerf_t pf[MAXALG];
    if (!FBC_DNN(c, cudnnGetConvolutionForwardAlgorithm_v7(c->dnn, p->x, p->w, p->conv, p->y,
                                                           MAXALG, &n, pf)))
        return false;
    keep_algos(c, p, 0, pf, n, &p->fwd);
    if (!p->fwd.n) {
        fbc_fail(c, FB_ERR_UNSUPPORTED, "conv2d: cuDNN offers no deterministic forward algorithm");
        return false;
    }
    /* keep_algos left the last candidate's math type on the descriptor; each
     * ranking is asked in the plan's (which says what math cuDNN may use). */
    if (!g->shared) {
        cudnnConvolutionBwdDataAlgoPerf_t pd[MAXALG];
        if (!FBC_DNN(c, cudnnSetConvolutionMathType(p->conv, plan_math(p))) ||
            !FBC_DNN(c, cudnnGetConvolutionBackwardDataAlgorithm_v7(c->dnn, p->w, p->y, p->conv,
                                                                    p->x, MAXALG, &n, pd)))
            return false;
        keep_algos(c, p, 1, pd, n, &p->bwd_data);
        if (!p->bwd_data.n) {
            fbc_fail(c, FB_ERR_UNSUPPORTED,
                     "conv2d: cuDNN offers no deterministic backward-data algorithm");
            return false;
        }
    }
    cudnnConvolutionBwdFilterAlgoPerf_t pw[MAXALG];
    if (!FBC_DNN(c, cudnnSetConvolutionMathType(p->conv, plan_math(p))) ||
        !FBC_DNN(c, cudnnGetConvolutionBackwardFilterAlgorithm_v7(c->dnn, p->x, p->y, p->conv,
                                                                  p->w, MAXALG, &n, pw)))
        return false;
    keep_algos(c, p, 2, pw, n, &p->bwd_filter);
    if (!p->bwd_filter.n) {
        fbc_fail(c, FB_ERR_UNSUPPORTED,
                 "conv2d: cuDNN offers no deterministic backward-filter algorithm");
        return false;
    }
    return true;
}

/* The plan for g, made on first use; NULL with the error recorded. */
static struct fbc_conv_plan *plan_get(struct fbc_ctx *c, const fb_conv_geom *g)
{
    const int search = search_mode(c);
    if (search < 0) return NULL;
    for (int i = 0; i < c->n_plans; i++)
        if (c->plans[i].tf32 == c->tf32 && c->plans[i].search == search &&
            geom_equal(&c->plans[i].g, g))
            return &c->plans[i];
    if (c->n_plans == c->cap_plans) {
        int cap = c->cap_plans ? 2 * c->cap_plans : 16;
        struct fbc_conv_plan *np =
            (struct fbc_conv_plan *)realloc(c->plans, (size_t)cap * sizeof *np);
        if (!np) {
            fbc_fail(c, FB_ERR_NOMEM, "conv2d: out of host memory for a plan");
            return NULL;
        }
        c->plans = np;
        c->cap_plans = cap;
    }
    struct fbc_conv_plan *p = &c->plans[c->n_plans];
    memset(p, 0, sizeof *p);
    if (!plan_make(c, p, g, search)) {
        plan_destroy(p);
        return NULL;
    }
    c->n_plans++;
    pthread_mutex_lock(&c->lock);
    c->stats.conv_plans++;
    pthread_mutex_unlock(&c->lock);
    return p;
}

/* Whether a status says cuDNN will not run this algorithm on this shape
 * (any of the NOT_SUPPORTED codes), so the next candidate may be tried.
 * Success is excluded explicitly: with cuDNN 8's numbering (NOT_SUPPORTED =
 * 9) the division alone would call success "not supported" and run the next
 * algorithm again, adding the backward gradients twice. */
static bool not_supported(cudnnStatus_t s)
{
    return s != CUDNN_STATUS_SUCCESS &&
           (int)s / 1000 == (int)CUDNN_STATUS_NOT_SUPPORTED / 1000;
}

/* The candidates of direction dir (0 forward, 1 backward data, 2 backward
 * filter). */
static struct fbc_conv_algos *plan_algos(struct fbc_conv_plan *p, int dir)
{
    return dir == 0 ? &p->fwd : dir == 1 ? &p->bwd_data : &p->bwd_filter;
}

/* Floats of the tensor direction dir writes: y, x or w. */
static size_t dir_out_floats(const struct fbc_conv_plan *p, int dir)
{
    const fb_conv_geom *g = &p->g;
    if (dir == 0) return (size_t)g->N * g->B * g->K * g->Ho * g->Wo;
    if (dir == 1) return (size_t)g->N * (g->shared ? 1 : g->B) * g->C * g->H * g->W;
    return (size_t)g->B * g->K * g->C * g->kh * g->kw;
}

/* One cuDNN call of direction dir with candidate i of its algorithms: dst =
 * beta dst + conv(a, b) (forward: a = x, b = w; backward data: a = w, b = dy;
 * backward filter: a = x, b = dy).  The descriptor gets the candidate's math
 * type first (the directions share it). */
static cudnnStatus_t conv_exec(struct fbc_ctx *c, const struct fbc_conv_plan *p, int dir, int i,
                               void *ws, size_t wsz, const float *a, const float *b, float *dst,
                               float beta)
{
    const float one = 1.0f;
    const struct fbc_conv_algos *al =
        dir == 0 ? &p->fwd : dir == 1 ? &p->bwd_data : &p->bwd_filter;
    const int algo = al->algo[i];
    cudnnStatus_t s = cudnnSetConvolutionMathType(p->conv, al->math[i]);
    if (s != CUDNN_STATUS_SUCCESS) return s;
    if (dir == 0)
        return cudnnConvolutionForward(c->dnn, &one, p->x, a, p->w, b, p->conv,
                                       (cudnnConvolutionFwdAlgo_t)algo, ws, wsz, &beta, p->y, dst);
    if (dir == 1)
        return cudnnConvolutionBackwardData(c->dnn, &one, p->w, a, p->y, b, p->conv,
                                            (cudnnConvolutionBwdDataAlgo_t)algo, ws, wsz, &beta,
                                            p->x, dst);
    return cudnnConvolutionBackwardFilter(c->dnn, &one, p->x, a, p->y, b, p->conv,
                                          (cudnnConvolutionBwdFilterAlgo_t)algo, ws, wsz, &beta,
                                          p->w, dst);
}

/*
 * The timed search of direction dir, once per plan: each candidate from the
 * current one on runs once to warm up and FBC_SEARCH_RUNS times between two
 * events on the compute stream, reading the caller's inputs a and b and
 * writing (with the caller's beta) into scratch of the output's size from
 * the pool, so no tensor the caller sees changes.  The fastest becomes
 * current (a later one must win by FBC_SEARCH_MARGIN).  A candidate cuDNN
 * refuses is left out; when the pool has no room for the scratch, or no
 * candidate runs, the heuristic order stays.  False with the error recorded
 * when a CUDA call fails.
 */
static bool conv_search(fb_backend *be, struct fbc_ctx *c, struct fbc_conv_plan *p, int dir,
                        const float *a, const float *b, float beta)
{
    struct fbc_conv_algos *al = plan_algos(p, dir);
    al->searched = 1;
    pthread_mutex_lock(&c->lock);
    c->stats.conv_searches++;
    pthread_mutex_unlock(&c->lock);
    if (al->n - al->cur < 2) return true;
    size_t wmax = 0;
    for (int i = al->cur; i < al->n; i++)
        if (al->ws[i] > wmax) wmax = al->ws[i];
    void *ws = NULL;
    if (wmax && !(ws = fbc_buf_get(c, &c->ws, wmax, "cuDNN workspace"))) return false;
    float *scratch = (float *)fbc_pool_alloc(be, dir_out_floats(p, dir) * sizeof(float));
    if (!scratch) return true;
    int pick = -1;
    float best = 0.0f;
    bool ok = true;
    for (int i = al->cur; i < al->n && ok; i++) {
        if (conv_exec(c, p, dir, i, ws, al->ws[i], a, b, scratch, beta) !=
            CUDNN_STATUS_SUCCESS)
            continue;
        if (!(ok = FBC_CUDA(c, cudaEventRecord(c->ev[0], c->stream)))) break;
        bool ran = true;
        for (int r = 0; r < FBC_SEARCH_RUNS && ran; r++)
            ran = conv_exec(c, p, dir, i, ws, al->ws[i], a, b, scratch, beta) ==
                  CUDNN_STATUS_SUCCESS;
        float ms = 0.0f;
        ok = FBC_CUDA(c, cudaEventRecord(c->ev[1], c->stream)) &&
             FBC_CUDA(c, cudaEventSynchronize(c->ev[1])) &&
             FBC_CUDA(c, cudaEventElapsedTime(&ms, c->ev[0], c->ev[1]));
        if (ok && ran && (pick < 0 || ms < best * (1.0f - FBC_SEARCH_MARGIN))) {
            pick = i;
            best = ms;
        }
    }
    fbc_pool_free(be, scratch);
    if (ok && pick >= 0) al->cur = pick;
    return ok;
}

/* Runs direction dir with the current candidate (after the timed search on
 * the first call, when the plan asks for one), moving on to the next while
 * cuDNN refuses; false with the error recorded. */
static bool conv_run(fb_backend *be, struct fbc_ctx *c, struct fbc_conv_plan *p, int dir,
                     const float *a, const float *b, float *dst, float beta)
{
    struct fbc_conv_algos *al = plan_algos(p, dir);
    if (p->search == FBC_SEARCH_TIMED && !al->searched && !conv_search(be, c, p, dir, a, b, beta))
        return false;
    for (;;) {
        size_t wsz = al->ws[al->cur];
        void *ws = NULL;
        if (wsz && !(ws = fbc_buf_get(c, &c->ws, wsz, "cuDNN workspace"))) return false;
        cudnnStatus_t s = conv_exec(c, p, dir, al->cur, ws, wsz, a, b, dst, beta);
        if (not_supported(s) && al->cur + 1 < al->n) {
            al->cur++;
            continue;
        }
        return FBC_DNN(c, s);
    }
}

/* out [N, B*K, Ho, Wo] = conv(in, w) + bias [B*K] (bias may be NULL). */
extern "C" void fbc_conv2d_forward(fb_backend *be, float *out, const float *in, const float *w,
                                   const float *bias, const fb_conv_geom *g, float *scratch)
{
    (void)scratch;
    struct fbc_ctx *c = fbc_begin(be);
    if (!c || g->N == 0) return;
    struct fbc_conv_plan *p = plan_get(c, g);
    if (!p || !conv_run(be, c, p, 0, in, w, out, 0.0f)) return;
    if (bias) fbc_bias_add(c, out, bias, g->N, g->B * g->K, g->Ho * g->Wo);
}

/* Accumulates (beta = 1) dbias [B*K] (may be NULL), dw [B*K, C, kh, kw] and,
 * not shared, din [N, B*C, H, W] (may be NULL). */
extern "C" void fbc_conv2d_backward(fb_backend *be, float *din, float *dw, float *dbias,
                                    const float *dout, const float *in, const float *w,
                                    const fb_conv_geom *g, float *scratch)
{
    (void)scratch;
    struct fbc_ctx *c = fbc_begin(be);
    if (!c || g->N == 0) return;
    struct fbc_conv_plan *p = plan_get(c, g);
    if (!p) return;
    if (dbias) fbc_channel_sum_acc(c, dbias, dout, g->N, g->B * g->K, g->Ho * g->Wo);
    if (!conv_run(be, c, p, 2, in, dout, dw, 1.0f)) return;
    if (din && !g->shared) conv_run(be, c, p, 1, w, dout, din, 1.0f);
}
