/*
 * The CUDA backend's own kernels: bias and per-channel sums, pooling,
 * activations, add and accumulate, dropout, batch and layer norm, the losses
 * the fused optimizer step, and the bf16 rounding and loss-scaling helpers.
 *
 * Each kernel follows the reference loop of kernels/cpu/ref_*.c it replaces,
 * in the same arithmetic where that is cheap on a GPU: statistics, losses,
 * transcendental activations and the optimizer are evaluated in double as the
 * reference does, so the two backends agree to a few float ulps.  No kernel
 * uses atomics: a reduction is a fixed tree inside one block or a sequential
 * loop in one thread, and a scatter (pooling backward) is turned into a
 * gather in the reference's order, so results are the same run after run.
 * (The one atomic, atomicOr on the bad-input flag, orders no result.)
 * Loops are grid-stride with size_t indices, so any grid covers any size.
 */
#include <math.h>
#include <string.h>

#include "../bf16.h"
#include "../rng.h"
#include "cuda_internal.h"

#define FBC_THREADS 256

#define GRID_STRIDE(i, n)                                                                          \
    for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < (n);                        \
         i += (size_t)blockDim.x * gridDim.x)

/* Sum of v over the block (FBC_THREADS threads); the result is valid in
 * thread 0.  sh holds FBC_THREADS / 32 doubles.  Fixed tree: deterministic. */
__device__ static double block_sum(double v, double *sh)
{
    for (int o = 16; o > 0; o >>= 1)
        v += __shfl_down_sync(0xffffffffu, v, o);
    int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    __syncthreads(); /* sh may still be read from the previous call */
    if (lane == 0) sh[warp] = v;
    __syncthreads();
    double s = 0.0;
    if (threadIdx.x == 0)
        for (int w = 0; w < FBC_THREADS / 32; w++)
            s += sh[w];
    return s;
}

/* Broadcasts thread 0's value to the block. */
__device__ static double block_bcast(double v, double *slot)
{
    __syncthreads();
    if (threadIdx.x == 0) *slot = v;
    __syncthreads();
    return *slot;
}

/* ---- bias and channel sums -------------------------------------------------- */

__global__ static void k_bias_add(float *out, const float *bias, size_t total, int C, int HW)
{
    GRID_STRIDE(i, total)
    out[i] += bias[(i / (size_t)HW) % (size_t)C];
}

extern "C" void fbc_bias_add(struct fbc_ctx *c, float *out, const float *bias, int N, int C, int HW)
{
    size_t total = (size_t)N * C * HW;
    if (!total) return;
    k_bias_add<<<fbc_grid(c, total, FBC_THREADS), FBC_THREADS, 0, c->stream>>>(out, bias, total, C,
                                                                              HW);
    FBC_LAUNCHED(c, "bias_add");
}

/* HW = 1: one thread per column of x [N, C], reading rows in order. */
__global__ static void k_column_sum_acc(float *out, const float *x, int N, int C)
{
    GRID_STRIDE(col, (size_t)C)
    {
        double acc = 0.0;
        for (int n = 0; n < N; n++)
            acc += x[(size_t)n * C + col];
        out[col] = (float)(out[col] + acc);
    }
}

/* One block per channel of x [N, C, HW]. */
__global__ static void k_channel_sum_acc(float *out, const float *x, int N, int C, int HW)
{
    __shared__ double sh[FBC_THREADS / 32];
    const size_t ch = blockIdx.x, M = (size_t)N * HW;
    double acc = 0.0;
    for (size_t m = threadIdx.x; m < M; m += blockDim.x)
        acc += x[((m / HW) * C + ch) * HW + m % HW];
    acc = block_sum(acc, sh);
    if (threadIdx.x == 0) out[ch] = (float)(out[ch] + acc);
}

extern "C" void fbc_channel_sum_acc(struct fbc_ctx *c, float *out, const float *x, int N, int C,
                                    int HW)
{
    if (N == 0 || C == 0) return;
    if (HW == 1)
        k_column_sum_acc<<<fbc_grid(c, (size_t)C, FBC_THREADS), FBC_THREADS, 0, c->stream>>>(
            out, x, N, C);
    else
        k_channel_sum_acc<<<C, FBC_THREADS, 0, c->stream>>>(out, x, N, C, HW);
    FBC_LAUNCHED(c, "channel_sum");
}

/* ---- pooling ------------------------------------------------------------------ */

/* The window geometry, by value (kernels take it as an argument). */
struct pool_g {
    int H, W, kh, kw, sh, sw, ph, pw, Ho, Wo;
};

static pool_g to_pool_g(const fb_pool_geom *g)
{
    pool_g p = {g->H, g->W, g->kh, g->kw, g->sh, g->sw, g->ph, g->pw, g->Ho, g->Wo};
    return p;
}

/* Outputs oh in [lo, hi] whose window covers input row ih (k, s, p, n_out
 * of that axis); hi < lo when none. */
__device__ static void covering(int ih, int k, int s, int p, int n_out, int *lo, int *hi)
{
    int a = ih + p - k + 1; /* oh * s >= a */
    *lo = a <= 0 ? 0 : (a + s - 1) / s;
    int b = (ih + p) / s; /* oh * s <= ih + p */
    *hi = b < n_out - 1 ? b : n_out - 1;
}

/* As the reference: first maximum in window order, a NaN wins; -1 for a
 * window of padding only. */
__global__ static void k_maxpool_fwd(float *out, int32_t *argmax, const float *in, size_t total,
                                     pool_g g)
{
    const size_t HoWo = (size_t)g.Ho * g.Wo, HW = (size_t)g.H * g.W;
    GRID_STRIDE(o, total)
    {
        size_t p = o / HoWo;
        int r = (int)(o % HoWo), oh = r / g.Wo, ow = r % g.Wo;
        const float *x = in + p * HW;
        float m = -INFINITY;
        int32_t mi = -1;
        for (int i = 0; i < g.kh; i++)
            for (int j = 0; j < g.kw; j++) {
                int ih = oh * g.sh - g.ph + i, iw = ow * g.sw - g.pw + j;
                if (ih < 0 || ih >= g.H || iw < 0 || iw >= g.W) continue;
                float v = x[(size_t)ih * g.W + iw];
                if (mi < 0 || v > m || isnan(v)) {
                    m = v;
                    mi = ih * g.W + iw;
                }
            }
        out[o] = m;
        argmax[o] = mi;
    }
}

/* Gather form of the reference scatter: input (ih, iw) adds, in output
 * order, dout of every covering window whose argmax is it. */
__global__ static void k_maxpool_bwd(float *din, const float *dout, const int32_t *argmax,
                                     size_t total, pool_g g)
{
    const size_t HoWo = (size_t)g.Ho * g.Wo, HW = (size_t)g.H * g.W;
    GRID_STRIDE(e, total)
    {
        size_t p = e / HW;
        int r = (int)(e % HW), ih = r / g.W, iw = r % g.W;
        int oh0, oh1, ow0, ow1;
        covering(ih, g.kh, g.sh, g.ph, g.Ho, &oh0, &oh1);
        covering(iw, g.kw, g.sw, g.pw, g.Wo, &ow0, &ow1);
        float acc = din[e];
        for (int oh = oh0; oh <= oh1; oh++)
            for (int ow = ow0; ow <= ow1; ow++) {
                size_t o = p * HoWo + (size_t)oh * g.Wo + ow;
                if (argmax[o] == r) acc += dout[o];
            }
        din[e] = acc;
    }
}

__global__ static void k_avgpool_fwd(float *out, const float *in, size_t total, pool_g g)
{
    const size_t HoWo = (size_t)g.Ho * g.Wo, HW = (size_t)g.H * g.W;
    GRID_STRIDE(o, total)
    {
        size_t p = o / HoWo;
        int r = (int)(o % HoWo), oh = r / g.Wo, ow = r % g.Wo;
        double acc = 0.0;
        for (int i = 0; i < g.kh; i++)
            for (int j = 0; j < g.kw; j++) {
                int ih = oh * g.sh - g.ph + i, iw = ow * g.sw - g.pw + j;
                if (ih >= 0 && ih < g.H && iw >= 0 && iw < g.W)
                    acc += in[p * HW + (size_t)ih * g.W + iw];
            }
        out[o] = (float)(acc / (g.kh * g.kw));
    }
}

__global__ static void k_avgpool_bwd(float *din, const float *dout, size_t total, pool_g g)
{
    const size_t HoWo = (size_t)g.Ho * g.Wo, HW = (size_t)g.H * g.W;
    const float inv = 1.0f / (float)(g.kh * g.kw);
    GRID_STRIDE(e, total)
    {
        size_t p = e / HW;
        int r = (int)(e % HW), ih = r / g.W, iw = r % g.W;
        int oh0, oh1, ow0, ow1;
        covering(ih, g.kh, g.sh, g.ph, g.Ho, &oh0, &oh1);
        covering(iw, g.kw, g.sw, g.pw, g.Wo, &ow0, &ow1);
        float acc = din[e];
        for (int oh = oh0; oh <= oh1; oh++)
            for (int ow = ow0; ow <= ow1; ow++)
                acc += dout[p * HoWo + (size_t)oh * g.Wo + ow] * inv;
        din[e] = acc;
    }
}

extern "C" void fbc_maxpool2d_forward(fb_backend *be, float *out, int32_t *argmax,
                                      const float *in, const fb_pool_geom *g)
{
    struct fbc_ctx *c = fbc_begin(be);
    size_t total = (size_t)g->N * g->BC * g->Ho * g->Wo;
    if (!c || !total) return;
    k_maxpool_fwd<<<fbc_grid(c, total, FBC_THREADS), FBC_THREADS, 0, c->stream>>>(
        out, argmax, in, total, to_pool_g(g));
    FBC_LAUNCHED(c, "maxpool2d_forward");
}

extern "C" void fbc_maxpool2d_backward(fb_backend *be, float *din, const float *dout,
                                       const int32_t *argmax, const fb_pool_geom *g)
{
    struct fbc_ctx *c = fbc_begin(be);
    size_t total = (size_t)g->N * g->BC * g->H * g->W;
    if (!c || !total) return;
    k_maxpool_bwd<<<fbc_grid(c, total, FBC_THREADS), FBC_THREADS, 0, c->stream>>>(
        din, dout, argmax, total, to_pool_g(g));
    FBC_LAUNCHED(c, "maxpool2d_backward");
}

extern "C" void fbc_avgpool2d_forward(fb_backend *be, float *out, const float *in,
                                      const fb_pool_geom *g)
{
    struct fbc_ctx *c = fbc_begin(be);
    size_t total = (size_t)g->N * g->BC * g->Ho * g->Wo;
    if (!c || !total) return;
    k_avgpool_fwd<<<fbc_grid(c, total, FBC_THREADS), FBC_THREADS, 0, c->stream>>>(out, in, total,
                                                                                  to_pool_g(g));
    FBC_LAUNCHED(c, "avgpool2d_forward");
}

extern "C" void fbc_avgpool2d_backward(fb_backend *be, float *din, const float *dout,
                                       const fb_pool_geom *g)
{
    struct fbc_ctx *c = fbc_begin(be);
    size_t total = (size_t)g->N * g->BC * g->H * g->W;
    if (!c || !total) return;
    k_avgpool_bwd<<<fbc_grid(c, total, FBC_THREADS), FBC_THREADS, 0, c->stream>>>(din, dout, total,
                                                                                  to_pool_g(g));
    FBC_LAUNCHED(c, "avgpool2d_backward");
}

/* One warp per plane of in [P, HW]: 8 planes per block. */
__global__ static void k_gap_fwd(float *out, const float *in, size_t planes, int HW)
{
    const int lane = threadIdx.x & 31;
    for (size_t p = ((size_t)blockIdx.x * blockDim.x + threadIdx.x) / 32; p < planes;
         p += ((size_t)blockDim.x * gridDim.x) / 32) {
        double acc = 0.0;
        for (int i = lane; i < HW; i += 32)
            acc += in[p * HW + i];
        for (int o = 16; o > 0; o >>= 1)
            acc += __shfl_down_sync(0xffffffffu, acc, o);
        if (lane == 0) out[p] = (float)(acc / HW);
    }
}

__global__ static void k_gap_bwd(float *din, const float *dout, size_t total, int HW)
{
    const float inv = 1.0f / (float)HW;
    GRID_STRIDE(i, total)
    din[i] += dout[i / (size_t)HW] * inv;
}

extern "C" void fbc_global_avgpool_forward(fb_backend *be, float *out, const float *in, int N,
                                           int BC, int HW)
{
    struct fbc_ctx *c = fbc_begin(be);
    size_t planes = (size_t)N * BC;
    if (!c || !planes) return;
    /* Every thread of a warp runs the same plane loop, so the shuffle is
     * always full-warp: the grid is a whole number of warps. */
    k_gap_fwd<<<fbc_grid(c, planes * 32, FBC_THREADS), FBC_THREADS, 0, c->stream>>>(out, in,
                                                                                    planes, HW);
    FBC_LAUNCHED(c, "global_avgpool_forward");
}

extern "C" void fbc_global_avgpool_backward(fb_backend *be, float *din, const float *dout, int N,
                                            int BC, int HW)
{
    struct fbc_ctx *c = fbc_begin(be);
    size_t total = (size_t)N * BC * HW;
    if (!c || !total) return;
    k_gap_bwd<<<fbc_grid(c, total, FBC_THREADS), FBC_THREADS, 0, c->stream>>>(din, dout, total,
                                                                              HW);
    FBC_LAUNCHED(c, "global_avgpool_backward");
}

/* ---- activations, add, accumulate -------------------------------------------- */

#define FBC_SQRT_2_OVER_PI 0.79788456080286535588
#define FBC_INV_SQRT_2PI 0.39894228040143267794
#define FBC_SQRT1_2 0.70710678118654752440
#define FBC_GELU_TANH_C 0.044715

__device__ static double act_f(int act, double x)
{
    switch (act) {
    case FB_ACT_GELU:
        return 0.5 * x * (1.0 + erf(x * FBC_SQRT1_2));
    case FB_ACT_GELU_TANH:
        return 0.5 * x * (1.0 + tanh(FBC_SQRT_2_OVER_PI * (x + FBC_GELU_TANH_C * x * x * x)));
    case FB_ACT_TANH:
        return tanh(x);
    case FB_ACT_SIGMOID:
        return 1.0 / (1.0 + exp(-x));
    default:
        return x;
    }
}

__device__ static double act_grad(int act, double x, double y)
{
    switch (act) {
    case FB_ACT_GELU:
        return 0.5 * (1.0 + erf(x * FBC_SQRT1_2)) + x * FBC_INV_SQRT_2PI * exp(-0.5 * x * x);
    case FB_ACT_GELU_TANH: {
        double t = tanh(FBC_SQRT_2_OVER_PI * (x + FBC_GELU_TANH_C * x * x * x));
        return 0.5 * (1.0 + t) +
               0.5 * x * (1.0 - t * t) * FBC_SQRT_2_OVER_PI * (1.0 + 3.0 * FBC_GELU_TANH_C * x * x);
    }
    case FB_ACT_TANH:
        return 1.0 - y * y;
    case FB_ACT_SIGMOID:
        return y * (1.0 - y);
    default:
        return 1.0;
    }
}

__global__ static void k_act_fwd(int act, float *out, const float *in, size_t n)
{
    GRID_STRIDE(i, n)
    {
        float x = in[i];
        if (act == FB_ACT_RELU)
            out[i] = x < 0.0f ? 0.0f : x; /* a NaN passes through */
        else
            out[i] = (float)act_f(act, x);
    }
}

__global__ static void k_act_bwd(int act, float *din, const float *dout, const float *in,
                                 const float *out, size_t n)
{
    GRID_STRIDE(i, n)
    {
        double x = in ? in[i] : 0.0, y = out ? out[i] : 0.0;
        if (act == FB_ACT_RELU)
            din[i] += x <= 0.0 ? 0.0f : dout[i];
        else
            din[i] = (float)(din[i] + dout[i] * act_grad(act, x, y));
    }
}

extern "C" void fbc_act_forward(fb_backend *be, fb_act act, float *out, const float *in, size_t n)
{
    struct fbc_ctx *c = fbc_begin(be);
    if (!c || !n) return;
    k_act_fwd<<<fbc_grid(c, n, FBC_THREADS), FBC_THREADS, 0, c->stream>>>((int)act, out, in, n);
    FBC_LAUNCHED(c, "act_forward");
}

extern "C" void fbc_act_backward(fb_backend *be, fb_act act, float *din, const float *dout,
                                 const float *in, const float *out, size_t n)
{
    struct fbc_ctx *c = fbc_begin(be);
    if (!c || !n) return;
    k_act_bwd<<<fbc_grid(c, n, FBC_THREADS), FBC_THREADS, 0, c->stream>>>((int)act, din, dout, in,
                                                                          out, n);
    FBC_LAUNCHED(c, "act_backward");
}

__global__ static void k_add(float *out, const float *a, const float *b, size_t n)
{
    GRID_STRIDE(i, n)
    out[i] = a[i] + b[i];
}

__global__ static void k_accumulate(float *y, const float *x, size_t n)
{
    GRID_STRIDE(i, n)
    y[i] += x[i];
}

extern "C" void fbc_add_forward(fb_backend *be, float *out, const float *a, const float *b,
                                size_t n)
{
    struct fbc_ctx *c = fbc_begin(be);
    if (!c || !n) return;
    k_add<<<fbc_grid(c, n, FBC_THREADS), FBC_THREADS, 0, c->stream>>>(out, a, b, n);
    FBC_LAUNCHED(c, "add_forward");
}

extern "C" void fbc_accumulate(fb_backend *be, float *y, const float *x, size_t n)
{
    struct fbc_ctx *c = fbc_begin(be);
    if (!c || !n) return;
    k_accumulate<<<fbc_grid(c, n, FBC_THREADS), FBC_THREADS, 0, c->stream>>>(y, x, n);
    FBC_LAUNCHED(c, "accumulate");
}

/* ---- dropout ------------------------------------------------------------------ */

/* x [N, B, F]: element (n, b, f) is kept when member b's uniform at counter
 * (n_offset + n) F + f is >= p (kernels.h); backward adds into dst. */
__global__ static void k_dropout(float *dst, const float *src, const uint64_t *seeds,
                                 uint64_t stream, float p, size_t total, int B, int F,
                                 int64_t n_offset, int backward)
{
    const float scale = p < 1.0f ? 1.0f / (1.0f - p) : 0.0f;
    GRID_STRIDE(i, total)
    {
        size_t f = i % (size_t)F, nb = i / (size_t)F;
        int b = (int)(nb % (size_t)B);
        uint64_t n = (uint64_t)(nb / (size_t)B);
        uint64_t counter = ((uint64_t)n_offset + n) * (uint64_t)F + f;
        float factor = fb_rng_uniform(seeds[b], stream, counter) >= p ? scale : 0.0f;
        if (backward)
            dst[i] += src[i] * factor;
        else
            dst[i] = src[i] * factor;
    }
}

static void dropout_run(fb_backend *be, float *dst, const float *src, const uint64_t *seeds,
                        uint64_t stream, float p, int N, int B, int F, int64_t n_offset,
                        int backward)
{
    struct fbc_ctx *c = fbc_begin(be);
    size_t total = (size_t)N * B * F;
    if (!c || !total) return;
    size_t bytes = (size_t)B * sizeof *seeds;
    if (!fbc_buf_get(c, &c->stage, bytes, "staging buffer")) return;
    const uint64_t *dseeds = (const uint64_t *)fbc_stage(c, 0, seeds, bytes);
    if (!dseeds) return;
    k_dropout<<<fbc_grid(c, total, FBC_THREADS), FBC_THREADS, 0, c->stream>>>(
        dst, src, dseeds, stream, p, total, B, F, n_offset, backward);
    FBC_LAUNCHED(c, backward ? "dropout_backward" : "dropout_forward");
}

extern "C" void fbc_dropout_forward(fb_backend *be, float *out, const float *in,
                                    const uint64_t *seeds, uint64_t stream, float p, int N, int B,
                                    int F, int64_t n_offset)
{
    dropout_run(be, out, in, seeds, stream, p, N, B, F, n_offset, 0);
}

extern "C" void fbc_dropout_backward(fb_backend *be, float *din, const float *dout,
                                     const uint64_t *seeds, uint64_t stream, float p, int N, int B,
                                     int F, int64_t n_offset)
{
    dropout_run(be, din, dout, seeds, stream, p, N, B, F, n_offset, 1);
}

/* ---- batch norm ----------------------------------------------------------------- */

/* Element m of channel ch of x [N, BC, HW], m in [0, N HW). */
#define CH_AT(x, m) (x)[(((m) / HW) * BC + ch) * HW + (m) % HW]

/* One block per channel: mean, biased variance (two passes, in double),
 * normalised output, saved mean and rstd, running statistics. */
__global__ static void k_bn_fwd_train(float *out, float *mean, float *rstd, float *running_mean,
                                      float *running_var, const float *in, const float *gamma,
                                      const float *beta, int N, int BC, int HW, float eps,
                                      float momentum)
{
    __shared__ double sh[FBC_THREADS / 32];
    __shared__ double slot;
    const size_t ch = blockIdx.x, M = (size_t)N * HW;
    double s = 0.0;
    for (size_t m = threadIdx.x; m < M; m += blockDim.x)
        s += CH_AT(in, m);
    double mu = block_bcast(block_sum(s, sh) / (double)M, &slot);
    double ss = 0.0;
    for (size_t m = threadIdx.x; m < M; m += blockDim.x) {
        double d = CH_AT(in, m) - mu;
        ss += d * d;
    }
    double var = block_bcast(block_sum(ss, sh) / (double)M, &slot);
    double r = 1.0 / sqrt(var + eps);
    double g = gamma ? gamma[ch] : 1.0, bt = beta ? beta[ch] : 0.0;
    for (size_t m = threadIdx.x; m < M; m += blockDim.x)
        CH_AT(out, m) = (float)((CH_AT(in, m) - mu) * r * g + bt);
    if (threadIdx.x == 0) {
        mean[ch] = (float)mu;
        rstd[ch] = (float)r;
        double unbiased = M > 1 ? var * (double)M / ((double)M - 1.0) : var;
        if (running_mean)
            running_mean[ch] = (float)((1.0 - momentum) * running_mean[ch] + momentum * mu);
        if (running_var)
            running_var[ch] = (float)((1.0 - momentum) * running_var[ch] + momentum * unbiased);
    }
}

__global__ static void k_bn_fwd_eval(float *out, const float *in, const float *gamma,
                                     const float *beta, const float *running_mean,
                                     const float *running_var, size_t total, int BC, int HW,
                                     float eps)
{
    GRID_STRIDE(i, total)
    {
        size_t ch = (i / (size_t)HW) % (size_t)BC;
        double r = 1.0 / sqrt((double)running_var[ch] + eps);
        double g = gamma ? gamma[ch] : 1.0, bt = beta ? beta[ch] : 0.0;
        out[i] = (float)((in[i] - running_mean[ch]) * r * g + bt);
    }
}

/* One block per channel: sums of dout and dout xhat, then din. */
__global__ static void k_bn_bwd(float *din, float *dgamma, float *dbeta, const float *dout,
                                const float *in, const float *mean, const float *rstd,
                                const float *gamma, int N, int BC, int HW)
{
    __shared__ double sh[FBC_THREADS / 32];
    __shared__ double slot;
    const size_t ch = blockIdx.x, M = (size_t)N * HW;
    const double mu = mean[ch], r = rstd[ch], g = gamma ? gamma[ch] : 1.0;
    double a = 0.0, b = 0.0;
    for (size_t m = threadIdx.x; m < M; m += blockDim.x) {
        double dy = CH_AT(dout, m);
        a += dy;
        b += dy * (CH_AT(in, m) - mu) * r;
    }
    double sdy = block_bcast(block_sum(a, sh), &slot);
    double sdyx = block_bcast(block_sum(b, sh), &slot);
    if (threadIdx.x == 0) {
        if (dgamma) dgamma[ch] = (float)(dgamma[ch] + sdyx);
        if (dbeta) dbeta[ch] = (float)(dbeta[ch] + sdy);
    }
    const double Md = (double)M;
    for (size_t m = threadIdx.x; m < M; m += blockDim.x) {
        double xhat = (CH_AT(in, m) - mu) * r;
        double d = g * r * (CH_AT(dout, m) - sdy / Md - xhat * sdyx / Md);
        CH_AT(din, m) = (float)(CH_AT(din, m) + d);
    }
}

#undef CH_AT

extern "C" void fbc_batchnorm_forward_train(fb_backend *be, float *out, float *mean, float *rstd,
                                            float *running_mean, float *running_var,
                                            const float *in, const float *gamma, const float *beta,
                                            int N, int BC, int HW, float eps, float momentum)
{
    struct fbc_ctx *c = fbc_begin(be);
    if (!c) return;
    k_bn_fwd_train<<<BC, FBC_THREADS, 0, c->stream>>>(out, mean, rstd, running_mean, running_var,
                                                      in, gamma, beta, N, BC, HW, eps, momentum);
    FBC_LAUNCHED(c, "batchnorm_forward_train");
}

extern "C" void fbc_batchnorm_forward_eval(fb_backend *be, float *out, const float *in,
                                           const float *gamma, const float *beta,
                                           const float *running_mean, const float *running_var,
                                           int N, int BC, int HW, float eps)
{
    struct fbc_ctx *c = fbc_begin(be);
    size_t total = (size_t)N * BC * HW;
    if (!c || !total) return;
    k_bn_fwd_eval<<<fbc_grid(c, total, FBC_THREADS), FBC_THREADS, 0, c->stream>>>(
        out, in, gamma, beta, running_mean, running_var, total, BC, HW, eps);
    FBC_LAUNCHED(c, "batchnorm_forward_eval");
}

extern "C" void fbc_batchnorm_backward(fb_backend *be, float *din, float *dgamma, float *dbeta,
                                       const float *dout, const float *in, const float *mean,
                                       const float *rstd, const float *gamma, int N, int BC, int HW)
{
    struct fbc_ctx *c = fbc_begin(be);
    if (!c) return;
    k_bn_bwd<<<BC, FBC_THREADS, 0, c->stream>>>(din, dgamma, dbeta, dout, in, mean, rstd, gamma, N,
                                                BC, HW);
    FBC_LAUNCHED(c, "batchnorm_backward");
}

/* ---- layer norm ------------------------------------------------------------------- */

/* Sum over a warp, valid in every lane. */
__device__ static double warp_sum(double v)
{
    for (int o = 16; o > 0; o >>= 1)
        v += __shfl_xor_sync(0xffffffffu, v, o);
    return v;
}

/* One warp per row (n, b) of in [N, B, F]. */
__global__ static void k_ln_fwd(float *out, float *mean, float *rstd, const float *in,
                                const float *gamma, const float *beta, size_t rows, int B, int F,
                                float eps)
{
    const int lane = threadIdx.x & 31;
    for (size_t row = ((size_t)blockIdx.x * blockDim.x + threadIdx.x) / 32; row < rows;
         row += ((size_t)blockDim.x * gridDim.x) / 32) {
        const float *x = in + row * F;
        const size_t b = row % (size_t)B;
        double s = 0.0;
        for (int f = lane; f < F; f += 32)
            s += x[f];
        double mu = warp_sum(s) / F, ss = 0.0;
        for (int f = lane; f < F; f += 32)
            ss += (x[f] - mu) * (x[f] - mu);
        double r = 1.0 / sqrt(warp_sum(ss) / F + eps);
        for (int f = lane; f < F; f += 32) {
            double g = gamma ? gamma[b * F + f] : 1.0, bt = beta ? beta[b * F + f] : 0.0;
            out[row * F + f] = (float)((x[f] - mu) * r * g + bt);
        }
        if (lane == 0) {
            mean[row] = (float)mu;
            rstd[row] = (float)r;
        }
    }
}

__global__ static void k_ln_bwd_din(float *din, const float *dout, const float *in,
                                    const float *mean, const float *rstd, const float *gamma,
                                    size_t rows, int B, int F)
{
    const int lane = threadIdx.x & 31;
    for (size_t row = ((size_t)blockIdx.x * blockDim.x + threadIdx.x) / 32; row < rows;
         row += ((size_t)blockDim.x * gridDim.x) / 32) {
        const size_t b = row % (size_t)B, base = row * F;
        const double mu = mean[row], r = rstd[row];
        double s1 = 0.0, s2 = 0.0;
        for (int f = lane; f < F; f += 32) {
            double g = gamma ? gamma[b * F + f] : 1.0;
            double dxh = dout[base + f] * g;
            s1 += dxh;
            s2 += dxh * (in[base + f] - mu) * r;
        }
        s1 = warp_sum(s1);
        s2 = warp_sum(s2);
        for (int f = lane; f < F; f += 32) {
            double g = gamma ? gamma[b * F + f] : 1.0;
            double xhat = (in[base + f] - mu) * r;
            double d = r * (dout[base + f] * g - s1 / F - xhat * s2 / F);
            din[base + f] = (float)(din[base + f] + d);
        }
    }
}

/* One thread per (b, f): sums over the N rows of member b, in order. */
__global__ static void k_ln_bwd_params(float *dgamma, float *dbeta, const float *dout,
                                       const float *in, const float *mean, const float *rstd,
                                       int N, int B, int F)
{
    GRID_STRIDE(bf, (size_t)B * F)
    {
        size_t b = bf / (size_t)F, f = bf % (size_t)F;
        double sg = 0.0, sb = 0.0;
        for (int n = 0; n < N; n++) {
            size_t row = (size_t)n * B + b;
            double dy = dout[row * F + f];
            sg += dy * (in[row * F + f] - mean[row]) * rstd[row];
            sb += dy;
        }
        if (dgamma) dgamma[bf] = (float)(dgamma[bf] + sg);
        if (dbeta) dbeta[bf] = (float)(dbeta[bf] + sb);
    }
}

extern "C" void fbc_layernorm_forward(fb_backend *be, float *out, float *mean, float *rstd,
                                      const float *in, const float *gamma, const float *beta,
                                      int N, int B, int F, float eps)
{
    struct fbc_ctx *c = fbc_begin(be);
    size_t rows = (size_t)N * B;
    if (!c || !rows) return;
    k_ln_fwd<<<fbc_grid(c, rows * 32, FBC_THREADS), FBC_THREADS, 0, c->stream>>>(
        out, mean, rstd, in, gamma, beta, rows, B, F, eps);
    FBC_LAUNCHED(c, "layernorm_forward");
}

extern "C" void fbc_layernorm_backward(fb_backend *be, float *din, float *dgamma, float *dbeta,
                                       const float *dout, const float *in, const float *mean,
                                       const float *rstd, const float *gamma, int N, int B, int F)
{
    struct fbc_ctx *c = fbc_begin(be);
    size_t rows = (size_t)N * B;
    if (!c || !rows) return;
    k_ln_bwd_din<<<fbc_grid(c, rows * 32, FBC_THREADS), FBC_THREADS, 0, c->stream>>>(
        din, dout, in, mean, rstd, gamma, rows, B, F);
    if (!FBC_LAUNCHED(c, "layernorm_backward")) return;
    if (dgamma || dbeta) {
        k_ln_bwd_params<<<fbc_grid(c, (size_t)B * F, FBC_THREADS), FBC_THREADS, 0, c->stream>>>(
            dgamma, dbeta, dout, in, mean, rstd, N, B, F);
        FBC_LAUNCHED(c, "layernorm_backward (parameters)");
    }
}

/* ---- losses ------------------------------------------------------------------------- */

/* One thread per row (n, b) of logits [N, B, K], as the reference row loop:
 * row_loss [N*B] (double) and row_hit [N*B]; dlogits when not NULL.  A label
 * outside [0, K) sets FBC_FLAG_LABEL in *flag and makes the row NaN. */
__global__ static void k_xent_rows(double *row_loss, double *row_hit, float *dlogits,
                                   const float *logits, const int32_t *labels, size_t rows, int B,
                                   int K, float grad_scale, int *flag)
{
    GRID_STRIDE(row, rows)
    {
        const float *z = logits + row * K;
        int y = labels[row / (size_t)B];
        if (y < 0 || y >= K) {
            atomicOr(flag, FBC_FLAG_LABEL);
            row_loss[row] = nan("");
            row_hit[row] = 0.0;
            if (dlogits)
                for (int k = 0; k < K; k++)
                    dlogits[row * K + k] = nanf("");
            continue;
        }
        int arg = 0;
        for (int k = 1; k < K; k++)
            if (z[k] > z[arg]) arg = k;
        double mx = z[arg], sum = 0.0;
        for (int k = 0; k < K; k++)
            sum += exp(z[k] - mx);
        row_loss[row] = mx + log(sum) - z[y];
        row_hit[row] = arg == y ? 1.0 : 0.0;
        if (dlogits)
            for (int k = 0; k < K; k++)
                dlogits[row * K + k] =
                    (float)((exp(z[k] - mx) / sum - (k == y ? 1.0 : 0.0)) * grad_scale);
    }
}

/* One thread per member: loss[b] = sum over n of row[n, b] / div, in order;
 * hits, when given, into correct[b]. */
__global__ static void k_member_mean(float *loss, float *correct, const double *row_loss,
                                     const double *row_hit, int N, int B, double div)
{
    GRID_STRIDE(b, (size_t)B)
    {
        double total = 0.0, hits = 0.0;
        for (int n = 0; n < N; n++) {
            total += row_loss[(size_t)n * B + b];
            if (row_hit) hits += row_hit[(size_t)n * B + b];
        }
        loss[b] = (float)(total / div);
        if (correct) correct[b] = (float)hits;
    }
}

extern "C" void fbc_softmax_xent(fb_backend *be, float *loss, float *dlogits, float *correct,
                                 const float *logits, const int32_t *labels, int N, int B, int K,
                                 float grad_scale)
{
    struct fbc_ctx *c = fbc_begin(be);
    size_t rows = (size_t)N * B;
    if (!c || !rows) return;
    double *red = (double *)fbc_buf_get(c, &c->red, 2 * rows * sizeof(double), "loss buffer");
    if (!red) return;
    k_xent_rows<<<fbc_grid(c, rows, 128), 128, 0, c->stream>>>(red, red + rows, dlogits, logits,
                                                              labels, rows, B, K, grad_scale,
                                                              c->flag);
    if (!FBC_LAUNCHED(c, "softmax_xent")) return;
    k_member_mean<<<fbc_grid(c, (size_t)B, 128), 128, 0, c->stream>>>(loss, correct, red,
                                                                     red + rows, N, B, (double)N);
    FBC_LAUNCHED(c, "softmax_xent (mean)");
}

/* One thread per row (n, b) of pred [N, B, K]. */
__global__ static void k_mse_rows(double *row_loss, float *dpred, const float *pred,
                                  const float *target, size_t rows, int B, int K, float grad_scale)
{
    GRID_STRIDE(row, rows)
    {
        const size_t n = row / (size_t)B;
        double total = 0.0;
        for (int k = 0; k < K; k++) {
            double d = (double)pred[row * K + k] - target[n * K + k];
            total += d * d;
            if (dpred) dpred[row * K + k] = (float)(2.0 * d * grad_scale / K);
        }
        row_loss[row] = total;
    }
}

extern "C" void fbc_mse(fb_backend *be, float *loss, float *dpred, const float *pred,
                        const float *target, int N, int B, int K, float grad_scale)
{
    struct fbc_ctx *c = fbc_begin(be);
    size_t rows = (size_t)N * B;
    if (!c || !rows) return;
    double *red = (double *)fbc_buf_get(c, &c->red, rows * sizeof(double), "loss buffer");
    if (!red) return;
    k_mse_rows<<<fbc_grid(c, rows, 128), 128, 0, c->stream>>>(red, dpred, pred, target, rows, B, K,
                                                             grad_scale);
    if (!FBC_LAUNCHED(c, "mse")) return;
    k_member_mean<<<fbc_grid(c, (size_t)B, 128), 128, 0, c->stream>>>(
        loss, NULL, red, NULL, N, B, (double)N * K);
    FBC_LAUNCHED(c, "mse (mean)");
}

/* ---- the fused optimizer step ------------------------------------------------------- */

/* One member's hyperparameters on the device, in double as the reference
 * computes, with the bias corrections computed once on the host. */
struct optim_hp {
    double lr, wd, momentum, dampening, beta1, beta2, eps, bc1, bc2;
    long long t;
    int nesterov, skip;
};

/* A parameter block and where its elements start in the flat index. */
struct optim_blk {
    unsigned long long offset, per_member, start;
};

/* One thread per element of every block of every member: the flat index j
 * finds its block by binary search over the starts, then its member. */
__global__ static void k_optim(int kind, float *params, const float *grads, float *state1,
                               float *state2, const optim_blk *blocks, int n_blocks,
                               const optim_hp *hps, size_t total)
{
    GRID_STRIDE(j, total)
    {
        int lo = 0, hi = n_blocks - 1;
        while (lo < hi) {
            int mid = (lo + hi + 1) / 2;
            if (blocks[mid].start <= j)
                lo = mid;
            else
                hi = mid - 1;
        }
        const optim_blk bk = blocks[lo];
        size_t local = j - bk.start, b = local / bk.per_member;
        const optim_hp h = hps[b];
        if (h.skip) continue;
        size_t i = bk.offset + local;
        double p = params[i], g = grads[i];
        if (kind == FB_OPTIM_KIND_SGD) {
            if (h.wd != 0.0) g += h.wd * p;
            if (h.momentum != 0.0) {
                double buf = h.t == 1 ? g : h.momentum * state1[i] + (1.0 - h.dampening) * g;
                state1[i] = (float)buf;
                buf = state1[i]; /* continue from the stored value, as torch */
                g = h.nesterov ? g + h.momentum * buf : buf;
            }
            params[i] = (float)(p - h.lr * g);
            continue;
        }
        if (kind == FB_OPTIM_KIND_ADAMW)
            p *= 1.0 - h.lr * h.wd;
        else if (h.wd != 0.0)
            g += h.wd * p;
        double m = state1[i] + (1.0 - h.beta1) * (g - state1[i]);
        double v = h.beta2 * state2[i] + (1.0 - h.beta2) * g * g;
        state1[i] = (float)m;
        state2[i] = (float)v;
        m = state1[i];
        v = state2[i];
        params[i] = (float)(p - h.lr / h.bc1 * m / (sqrt(v) / sqrt(h.bc2) + h.eps));
    }
}

/* Stages the hyperparameters and the block table (host memory, kernels.h)
 * and runs one kernel over all members' parameters. */
extern "C" void fbc_optim_step(fb_backend *be, fb_optim_kind kind, float *params,
                               const float *grads, float *state1, float *state2,
                               const fb_param_block *blocks, int n_blocks, int B,
                               const fb_optim_hparams *hp)
{
    struct fbc_ctx *c = fbc_begin(be);
    if (!c || n_blocks == 0) return;
    size_t hp_bytes = (size_t)B * sizeof(optim_hp);
    size_t hp_off = 0, blk_off = (hp_bytes + 15) / 16 * 16;
    size_t blk_bytes = (size_t)n_blocks * sizeof(optim_blk);
    optim_hp *hh = (optim_hp *)malloc(hp_bytes);
    optim_blk *bh = (optim_blk *)malloc(blk_bytes);
    const optim_hp *dh = NULL;
    const optim_blk *db = NULL;
    size_t total = 0;
    if (!hh || !bh) {
        fbc_fail(c, FB_ERR_NOMEM, "optim_step: out of host memory");
        goto done;
    }
    for (int b = 0; b < B; b++) {
        const fb_optim_hparams *x = &hp[b];
        optim_hp *h = &hh[b];
        h->lr = x->lr;
        h->wd = x->weight_decay;
        h->momentum = x->momentum;
        h->dampening = x->dampening;
        h->beta1 = x->beta1;
        h->beta2 = x->beta2;
        h->eps = x->eps;
        h->bc1 = 1.0 - pow((double)x->beta1, (double)x->t);
        h->bc2 = 1.0 - pow((double)x->beta2, (double)x->t);
        h->t = (long long)x->t;
        h->nesterov = x->nesterov;
        h->skip = x->lr == 0.0f && x->t == 0;
    }
    for (int k = 0; k < n_blocks; k++) {
        bh[k].offset = blocks[k].offset;
        bh[k].per_member = blocks[k].per_member;
        bh[k].start = total;
        total += (size_t)B * blocks[k].per_member;
    }
    /* An empty block would own no index; the search needs none of them to
     * own a start shared with the next, so drop them from the table. */
    {
        int kept = 0;
        for (int k = 0; k < n_blocks; k++)
            if (bh[k].per_member) bh[kept++] = bh[k];
        n_blocks = kept;
        blk_bytes = (size_t)n_blocks * sizeof(optim_blk);
    }
    if (!total) goto done;
    if (!fbc_buf_get(c, &c->stage, blk_off + blk_bytes, "staging buffer")) goto done;
    dh = (const optim_hp *)fbc_stage(c, hp_off, hh, hp_bytes);
    db = dh ? (const optim_blk *)fbc_stage(c, blk_off, bh, blk_bytes) : NULL;
    if (!db) goto done;
    k_optim<<<fbc_grid(c, total, FBC_THREADS), FBC_THREADS, 0, c->stream>>>(
        (int)kind, params, grads, state1, state2, db, n_blocks, dh, total);
    FBC_LAUNCHED(c, "optim_step");
done:
    free(bh);
    free(hh);
}

/* ---- bf16 ---------------------------------------------------------------- */

/* out[i] = fb_bf16_round(in[i]): the host function of kernels/bf16.h compiled
 * for the device, so the GPU rounds exactly as the CPU backends do. */
__global__ static void k_round_bf16(float *out, const float *in, size_t n)
{
    GRID_STRIDE(i, n) out[i] = fb_bf16_round(in[i]);
}

extern "C" void fbc_round_bf16(fb_backend *be, float *out, const float *in, size_t n)
{
    struct fbc_ctx *c = fbc_begin(be);
    if (!c || n == 0) return;
    k_round_bf16<<<fbc_grid(c, n, FBC_THREADS), FBC_THREADS, 0, c->stream>>>(out, in, n);
    FBC_LAUNCHED(c, "round_bf16");
}

/* A parameter block of fb_grad_unscale and where its elements start in the
 * flat index over all blocks. */
struct unscale_blk {
    unsigned long long offset, per_member, start;
};

/* One thread per gradient float of every block of every member: the flat
 * index j finds its block by binary search over the starts, then its member
 * b; the float is multiplied by inv[b] and the product checked.  Every thread
 * that finds a bad float stores the same 1, so the flags do not depend on
 * which does (no atomics needed). */
__global__ static void k_grad_unscale(float *flags, float *grads, const float *inv,
                                      const unscale_blk *blocks, int n_blocks, size_t total)
{
    GRID_STRIDE(j, total)
    {
        int lo = 0, hi = n_blocks - 1;
        while (lo < hi) {
            int mid = (lo + hi + 1) / 2;
            if (blocks[mid].start <= j)
                lo = mid;
            else
                hi = mid - 1;
        }
        const unscale_blk bk = blocks[lo];
        size_t local = j - bk.start, b = local / bk.per_member, i = bk.offset + local;
        float g = grads[i] * inv[b];
        grads[i] = g;
        if (!isfinite(g)) flags[b] = 1.0f;
    }
}

/* See kernels.h: the B inverse scales and the non-empty blocks are staged in
 * one buffer, the flags zeroed, then one launch covers every block. */
extern "C" void fbc_grad_unscale(fb_backend *be, float *flags, float *grads,
                                 const float *inv_scales, const fb_param_block *blocks,
                                 int n_blocks, int B)
{
    struct fbc_ctx *c = fbc_begin(be);
    if (!c) return;
    if (!FBC_CUDA(c, cudaMemsetAsync(flags, 0, (size_t)B * sizeof *flags, c->stream))) return;
    size_t inv_bytes = (size_t)B * sizeof *inv_scales;
    size_t blk_off = (inv_bytes + 15) / 16 * 16, total = 0;
    unscale_blk *bh = (unscale_blk *)malloc((size_t)(n_blocks ? n_blocks : 1) * sizeof *bh);
    if (!bh) {
        fbc_fail(c, FB_ERR_NOMEM, "grad_unscale: out of host memory");
        return;
    }
    /* an empty block would own no index, and the search needs every start
     * to belong to one block only, so empty blocks stay out of the table */
    int kept = 0;
    for (int k = 0; k < n_blocks; k++) {
        if (!blocks[k].per_member) continue;
        bh[kept].offset = blocks[k].offset;
        bh[kept].per_member = blocks[k].per_member;
        bh[kept].start = total;
        total += (size_t)B * blocks[k].per_member;
        kept++;
    }
    size_t blk_bytes = (size_t)kept * sizeof *bh;
    const float *di = NULL;
    const unscale_blk *db = NULL;
    if (!total) goto done;
    if (!fbc_buf_get(c, &c->stage, blk_off + blk_bytes, "staging buffer")) goto done;
    di = (const float *)fbc_stage(c, 0, inv_scales, inv_bytes);
    db = di ? (const unscale_blk *)fbc_stage(c, blk_off, bh, blk_bytes) : NULL;
    if (!db) goto done;
    k_grad_unscale<<<fbc_grid(c, total, FBC_THREADS), FBC_THREADS, 0, c->stream>>>(
        flags, grads, di, db, kept, total);
    FBC_LAUNCHED(c, "grad_unscale");
done:
    free(bh);
}

/* x[i] *= scales[member of i] over x [N, B, F] flattened. */
__global__ static void k_scale_members(float *x, const float *scales, size_t F, size_t B,
                                       size_t total)
{
    GRID_STRIDE(i, total) x[i] *= scales[(i / F) % B];
}

/* See kernels.h: the B scales are staged, then one pass. */
extern "C" void fbc_scale_members(fb_backend *be, float *x, const float *scales, int N, int B,
                                  size_t F)
{
    struct fbc_ctx *c = fbc_begin(be);
    if (!c) return;
    size_t bytes = (size_t)B * sizeof *scales, total = (size_t)N * (size_t)B * F;
    if (!fbc_buf_get(c, &c->stage, bytes, "staging buffer")) return;
    const float *ds = (const float *)fbc_stage(c, 0, scales, bytes);
    if (!ds) return;
    k_scale_members<<<fbc_grid(c, total, FBC_THREADS), FBC_THREADS, 0, c->stream>>>(
        x, ds, F, (size_t)B, total);
    FBC_LAUNCHED(c, "scale_members");
}
