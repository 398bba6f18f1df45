/*
 * The two CPU backends' functions, shared by their op tables.
 *
 * fb_ref_* is the plain-C reference ("cpu-ref"): short loops over flat
 * arrays, double accumulators, written to be obviously correct.  fb_cpu_* is
 * the fast path ("cpu"): OpenBLAS GEMMs, im2col, contiguous restrict loops.
 * Every function has the signature of its entry in struct fb_backend_ops
 * (backend_impl.h) and the semantics documented in kernels.h; the shapes are
 * repeated above each definition.  Memory of both is plain host memory.
 */
#ifndef FB_KERNELS_CPU_H
#define FB_KERNELS_CPU_H

#include "backend_impl.h"

#include <math.h>
#include <stdint.h>

#ifdef _OPENMP
#include <omp.h>
#else
/* Built without OpenMP (FUSEBOX_OPENMP=OFF): each parallel region runs once,
 * on the calling thread, as a team of one. */
static inline int omp_get_thread_num(void)
{
    return 0;
}
static inline int omp_get_num_threads(void)
{
    return 1;
}
#endif

/* ---- memory shared by both CPU backends (cpu_mem.c) ---- */
void *fb_cpumem_alloc(fb_backend *be, size_t bytes);
void fb_cpumem_free(fb_backend *be, void *p);
void fb_cpumem_zero(fb_backend *be, void *p, size_t bytes);
void fb_cpumem_copy(fb_backend *be, void *dst, const void *src, size_t bytes);

/* ---- bf16, shared by both CPU backends (cpu_bf16.c) ---- */
void fb_cpu_round_bf16(fb_backend *be, float *out, const float *in, size_t n);
void fb_ref_grad_unscale(fb_backend *be, float *flags, float *grads, const float *inv_scales,
                         const fb_param_block *blocks, int n_blocks, int B);
void fb_cpu_grad_unscale(fb_backend *be, float *flags, float *grads, const float *inv_scales,
                         const fb_param_block *blocks, int n_blocks, int B);
void fb_cpu_scale_members(fb_backend *be, float *x, const float *scales, int N, int B, size_t F);

/* ---- token ids, shared by both CPU backends (ref_seq.c) ---- */
/* FB_OK when every ids[i] of [0, n_ids) is in [0, V); else FB_ERR_DATA and
 * msg (may be NULL) names op and the first bad position. */
int fb_cpu_check_ids(const int32_t *ids, size_t n_ids, int V, const char *op, char *msg,
                     size_t msg_cap);

/* ---- reference ---- */
void fb_ref_linear_forward(fb_backend *be, float *out, const float *in, const float *w,
                           const float *bias, int N, int B, int I, int O, bool shared);
void fb_ref_linear_backward(fb_backend *be, float *din, float *dw, float *dbias,
                            const float *dout, const float *in, const float *w, int N, int B, int I,
                            int O, bool shared);
void fb_ref_sgemm(fb_backend *be, float *c, const float *a, const float *b, int M, int N, int K);

void fb_ref_conv2d_forward(fb_backend *be, float *out, const float *in, const float *w,
                           const float *bias, const fb_conv_geom *g, float *scratch);
void fb_ref_conv2d_backward(fb_backend *be, float *din, float *dw, float *dbias,
                            const float *dout, const float *in, const float *w,
                            const fb_conv_geom *g, float *scratch);

void fb_ref_maxpool2d_forward(fb_backend *be, float *out, int32_t *argmax, const float *in,
                              const fb_pool_geom *g);
void fb_ref_maxpool2d_backward(fb_backend *be, float *din, const float *dout,
                               const int32_t *argmax, const fb_pool_geom *g);
void fb_ref_avgpool2d_forward(fb_backend *be, float *out, const float *in, const fb_pool_geom *g);
void fb_ref_avgpool2d_backward(fb_backend *be, float *din, const float *dout,
                               const fb_pool_geom *g);
void fb_ref_global_avgpool_forward(fb_backend *be, float *out, const float *in, int N, int BC,
                                   int HW);
void fb_ref_global_avgpool_backward(fb_backend *be, float *din, const float *dout, int N, int BC,
                                    int HW);

void fb_ref_act_forward(fb_backend *be, fb_act act, float *out, const float *in, size_t n);
void fb_ref_act_backward(fb_backend *be, fb_act act, float *din, const float *dout,
                         const float *in, const float *out, size_t n);
void fb_ref_add_forward(fb_backend *be, float *out, const float *a, const float *b, size_t n);
void fb_ref_accumulate(fb_backend *be, float *y, const float *x, size_t n);
void fb_ref_dropout_forward(fb_backend *be, float *out, const float *in, const uint64_t *seeds,
                            uint64_t stream, float p, int N, int B, int F, int64_t n_offset);
void fb_ref_dropout_backward(fb_backend *be, float *din, const float *dout, const uint64_t *seeds,
                             uint64_t stream, float p, int N, int B, int F, int64_t n_offset);

void fb_ref_batchnorm_forward_train(fb_backend *be, float *out, float *mean, float *rstd,
                                    float *running_mean, float *running_var, const float *in,
                                    const float *gamma, const float *beta, int N, int BC, int HW,
                                    float eps, float momentum);
void fb_ref_batchnorm_forward_eval(fb_backend *be, float *out, const float *in,
                                   const float *gamma, const float *beta, const float *running_mean,
                                   const float *running_var, int N, int BC, int HW, float eps);
void fb_ref_batchnorm_backward(fb_backend *be, float *din, float *dgamma, float *dbeta,
                               const float *dout, const float *in, const float *mean,
                               const float *rstd, const float *gamma, int N, int BC, int HW);
void fb_ref_layernorm_forward(fb_backend *be, float *out, float *mean, float *rstd,
                              const float *in, const float *gamma, const float *beta, int N, int B,
                              int F, float eps);
void fb_ref_layernorm_backward(fb_backend *be, float *din, float *dgamma, float *dbeta,
                               const float *dout, const float *in, const float *mean,
                               const float *rstd, const float *gamma, int N, int B, int F);

int fb_ref_embedding_forward(fb_backend *be, float *out, const int32_t *ids, const float *table,
                             int N, int T, int B, int V, int D, char *msg, size_t msg_cap);
int fb_ref_embedding_backward(fb_backend *be, float *dtable, const float *dout, const int32_t *ids,
                              int N, int T, int B, int V, int D, char *msg, size_t msg_cap);
void fb_ref_positional_forward(fb_backend *be, float *out, const float *in, const float *pos,
                               int N, int T, int B, int L, int D);
void fb_ref_positional_backward(fb_backend *be, float *din, float *dpos, const float *dout, int N,
                                int T, int B, int L, int D);
void fb_ref_attention_forward(fb_backend *be, float *out, float *probs, const float *qkv, int N,
                              int T, int B, int D, int H, bool causal, float *scratch);
void fb_ref_attention_backward(fb_backend *be, float *dqkv, const float *dout, const float *probs,
                               const float *qkv, int N, int T, int B, int D, int H,
                               float *scratch);
void fb_ref_seq_pool_forward(fb_backend *be, fb_seq_pool kind, float *out, const float *in, int N,
                             int T, int B, int D);
void fb_ref_seq_pool_backward(fb_backend *be, fb_seq_pool kind, float *din, const float *dout,
                              int N, int T, int B, int D);

void fb_ref_softmax_xent(fb_backend *be, float *loss, float *dlogits, float *correct,
                         const float *logits, const int32_t *labels, int N, int B, int K,
                         float grad_scale);
void fb_ref_mse(fb_backend *be, float *loss, float *dpred, const float *pred, const float *target,
                int N, int B, int K, float grad_scale);

void fb_ref_optim_step(fb_backend *be, fb_optim_kind kind, float *params, const float *grads,
                       float *state1, float *state2, const fb_param_block *blocks, int n_blocks,
                       int B, const fb_optim_hparams *hp);

/* ---- fast ---- */
/* Whether the kernels written with AVX2 and FMA intrinsics (the grid
 * convolution, 2x2 max pooling) run: the CPU has both and
 * fb_cpu_kernels_portable is off.  Their portable loops give the same bits. */
bool fb_cpu_own_avx2(void);
void fb_cpu_set_threads(fb_backend *be, int n);
void fb_cpu_zero(fb_backend *be, void *p, size_t bytes);

void fb_cpu_linear_forward(fb_backend *be, float *out, const float *in, const float *w,
                           const float *bias, int N, int B, int I, int O, bool shared);
void fb_cpu_linear_backward(fb_backend *be, float *din, float *dw, float *dbias,
                            const float *dout, const float *in, const float *w, int N, int B, int I,
                            int O, bool shared);
void fb_cpu_sgemm(fb_backend *be, float *c, const float *a, const float *b, int M, int N, int K);

size_t fb_cpu_conv2d_scratch_floats(const fb_backend *be, const fb_conv_geom *g);
void fb_cpu_conv2d_forward(fb_backend *be, float *out, const float *in, const float *w,
                           const float *bias, const fb_conv_geom *g, float *scratch);
void fb_cpu_conv2d_backward(fb_backend *be, float *din, float *dw, float *dbias,
                            const float *dout, const float *in, const float *w,
                            const fb_conv_geom *g, float *scratch);

/* fast_conv_grid.c: stride-1 convolutions on a padded grid.  Whether g is
 * one; the floats of one thread's space; the forward of samples [n0, n1)
 * (every group); the backward of one chunk [n0, n1) (weight gradient set
 * into sums, bias gradient set into db, input gradient added into din;
 * either may be NULL). */
bool fb_cpu_conv_grid_fits(const fb_conv_geom *g);
size_t fb_cpu_conv_grid_floats(const fb_conv_geom *g);
void fb_cpu_conv_grid_forward(float *out, const float *in, const float *w, const float *bias,
                              const fb_conv_geom *g, size_t n0, size_t n1, float *scratch);
void fb_cpu_conv_grid_backward(float *din, float *sums, float *db, const float *dout,
                               const float *in, const float *w, const fb_conv_geom *g, size_t n0,
                               size_t n1, float *scratch);

void fb_cpu_maxpool2d_forward(fb_backend *be, float *out, int32_t *argmax, const float *in,
                              const fb_pool_geom *g);
void fb_cpu_maxpool2d_backward(fb_backend *be, float *din, const float *dout,
                               const int32_t *argmax, const fb_pool_geom *g);
void fb_cpu_maxpool2d_backward_set(fb_backend *be, float *din, const float *dout,
                                   const int32_t *argmax, const fb_pool_geom *g);
void fb_cpu_avgpool2d_forward(fb_backend *be, float *out, const float *in, const fb_pool_geom *g);
void fb_cpu_avgpool2d_backward(fb_backend *be, float *din, const float *dout,
                               const fb_pool_geom *g);
void fb_cpu_global_avgpool_forward(fb_backend *be, float *out, const float *in, int N, int BC,
                                   int HW);
void fb_cpu_global_avgpool_backward(fb_backend *be, float *din, const float *dout, int N, int BC,
                                    int HW);

void fb_cpu_act_forward(fb_backend *be, fb_act act, float *out, const float *in, size_t n);
void fb_cpu_act_backward(fb_backend *be, fb_act act, float *din, const float *dout,
                         const float *in, const float *out, size_t n);
void fb_cpu_act_backward_set(fb_backend *be, fb_act act, float *din, const float *dout,
                             const float *in, const float *out, size_t n);
void fb_cpu_add_forward(fb_backend *be, float *out, const float *a, const float *b, size_t n);
void fb_cpu_accumulate(fb_backend *be, float *y, const float *x, size_t n);

void fb_cpu_batchnorm_forward_train(fb_backend *be, float *out, float *mean, float *rstd,
                                    float *running_mean, float *running_var, const float *in,
                                    const float *gamma, const float *beta, int N, int BC, int HW,
                                    float eps, float momentum);
void fb_cpu_batchnorm_forward_eval(fb_backend *be, float *out, const float *in,
                                   const float *gamma, const float *beta, const float *running_mean,
                                   const float *running_var, int N, int BC, int HW, float eps);
void fb_cpu_batchnorm_backward(fb_backend *be, float *din, float *dgamma, float *dbeta,
                               const float *dout, const float *in, const float *mean,
                               const float *rstd, const float *gamma, int N, int BC, int HW);
void fb_cpu_layernorm_forward(fb_backend *be, float *out, float *mean, float *rstd,
                              const float *in, const float *gamma, const float *beta, int N, int B,
                              int F, float eps);
void fb_cpu_layernorm_backward(fb_backend *be, float *din, float *dgamma, float *dbeta,
                               const float *dout, const float *in, const float *mean,
                               const float *rstd, const float *gamma, int N, int B, int F);

size_t fb_cpu_attention_scratch_floats(const fb_backend *be, int N, int T, int B, int H);
int fb_cpu_embedding_forward(fb_backend *be, float *out, const int32_t *ids, const float *table,
                             int N, int T, int B, int V, int D, char *msg, size_t msg_cap);
int fb_cpu_embedding_backward(fb_backend *be, float *dtable, const float *dout, const int32_t *ids,
                              int N, int T, int B, int V, int D, char *msg, size_t msg_cap);
void fb_cpu_positional_forward(fb_backend *be, float *out, const float *in, const float *pos,
                               int N, int T, int B, int L, int D);
void fb_cpu_positional_backward(fb_backend *be, float *din, float *dpos, const float *dout, int N,
                                int T, int B, int L, int D);
void fb_cpu_attention_forward(fb_backend *be, float *out, float *probs, const float *qkv, int N,
                              int T, int B, int D, int H, bool causal, float *scratch);
void fb_cpu_attention_backward(fb_backend *be, float *dqkv, const float *dout, const float *probs,
                               const float *qkv, int N, int T, int B, int D, int H,
                               float *scratch);
void fb_cpu_seq_pool_forward(fb_backend *be, fb_seq_pool kind, float *out, const float *in, int N,
                             int T, int B, int D);
void fb_cpu_seq_pool_backward(fb_backend *be, fb_seq_pool kind, float *din, const float *dout,
                              int N, int T, int B, int D);

void fb_cpu_softmax_xent(fb_backend *be, float *loss, float *dlogits, float *correct,
                         const float *logits, const int32_t *labels, int N, int B, int K,
                         float grad_scale);
void fb_cpu_mse(fb_backend *be, float *loss, float *dpred, const float *pred, const float *target,
                int N, int B, int K, float grad_scale);

void fb_cpu_optim_step(fb_backend *be, fb_optim_kind kind, float *params, const float *grads,
                       float *state1, float *state2, const fb_param_block *blocks, int n_blocks,
                       int B, const fb_optim_hparams *hp);

/* ---- threads of the fast path ----
 *
 * The fast backend keeps OpenBLAS single-threaded (fb_cpu_blas_init, run once
 * by fb_backend_cpu) and spreads its own work over OpenMP threads: a GEMM is
 * split into per-thread pieces (members, rows or columns) that each thread
 * hands to OpenBLAS, and a loop is split by ranges.  So the thread count given
 * to fb_backend_set_threads is the number of cores the backend keeps busy,
 * never OpenBLAS threads times OpenMP threads.  Work is split statically by
 * thread count, so results are reproducible for a given count.
 */
void fb_cpu_blas_init(void);

/* The threads the fast backend may use: the count set, or OpenMP's default;
 * one without OpenMP, whatever the count set (the regions would run as teams
 * of one, and the per-thread scratch is sized from this). */
static inline int fb_cpu_threads(const fb_backend *be)
{
#ifdef _OPENMP
    return be->threads > 0 ? be->threads : omp_get_max_threads();
#else
    (void)be;
    return 1;
#endif
}

/* Threads worth waking for `work` units when each should get at least
 * `grain` of them (1 when the work is too small to share). */
static inline int fb_cpu_team(const fb_backend *be, double work, double grain)
{
    int t = fb_cpu_threads(be);
    double cap = work / grain;
    if (cap < 2.0) return 1;
    return cap < (double)t ? (int)cap : t;
}

/* Part `part` of `parts` near-equal pieces of [0, n): [*lo, *hi), with inner
 * boundaries rounded to multiples of align (>= 1). */
static inline void fb_cpu_split(size_t n, int part, int parts, size_t align, size_t *lo,
                                size_t *hi)
{
    size_t units = (n + align - 1) / align;
    size_t a = units * (size_t)part / (size_t)parts * align;
    size_t e = units * (size_t)(part + 1) / (size_t)parts * align;
    *lo = a < n ? a : n;
    *hi = e < n ? e : n;
}

/* Compiles a hot loop once per vector width (AVX-512, AVX2, baseline SSE2)
 * and picks the widest the CPU runs, at load time; the build itself stays
 * portable.  For loops that are bound by arithmetic (square roots and
 * divisions in the optimizers, transcendental activations) rather than by
 * memory.  Not under ThreadSanitizer: clang instruments the clones' resolver,
 * which the dynamic loader runs before TSan's runtime is set up (a crash
 * before main), so that build has the baseline loop alone. */
#if defined(__has_feature)
#if __has_feature(thread_sanitizer)
#define FB_CPU_TSAN 1
#endif
#endif
#if defined(__SANITIZE_THREAD__)
#define FB_CPU_TSAN 1
#endif
#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__)) && !defined(FB_CPU_TSAN)
#define FB_CPU_VECTOR_CLONES __attribute__((target_clones("avx512f", "avx2", "default")))
#else
#define FB_CPU_VECTOR_CLONES
#endif

/* ---- small helpers of the fast path ---- */

/* The largest of z[0..n) (n >= 1) that is not NaN (z[0] if it is NaN), over eight lanes so that
 * the loop vectorises: a max is exact in any order, so every clone and width gives the same. */
static inline float fb_cpu_row_max(const float *restrict z, int n)
{
    float m8[8];
    for (int j = 0; j < 8; j++)
        m8[j] = z[0];
    int k = 0;
    for (; k + 8 <= n; k += 8)
        for (int j = 0; j < 8; j++)
            m8[j] = z[k + j] > m8[j] ? z[k + j] : m8[j];
    float mx = m8[0];
    for (int j = 1; j < 8; j++)
        mx = m8[j] > mx ? m8[j] : mx;
    for (; k < n; k++)
        mx = z[k] > mx ? z[k] : mx;
    return mx;
}

/*
 * e^x in float for the fast loops, where glibc's expf stays a scalar call:
 * e^x = 2^n e^r, n = rint(x log2 e), r = x - n ln 2 in two parts (Cody and
 * Waite; n times the first is exact), e^r by its Taylor polynomial to r^7 (|r| <= ln2 / 2:
 * truncation below 1e-8 relative), 2^n by building the exponent bits.  About 1 ulp; 0 below -87
 * (where e^x would be subnormal), +inf above 88, NaN for NaN. Plain operations and selects only (no
 * fmaf, fminf: the kernels build without FMA contraction, and in a clone without FMA they are
 * calls), so the loops vectorise and round alike in every clone and at every width.
 */
static inline float fb_cpu_expf(float x)
{
    float xc = x < -87.0f ? -87.0f : x;
    xc = xc > 88.0f ? 88.0f : xc;
    xc = x != x ? 0.0f : xc;
    /* rintf vectorises from SSE4.1 on (the loops' AVX clones) */
    const float n = rintf(xc * 1.44269504088896341f);
    float r = n * -0.693359375f + xc;
    r = n * 2.12194440e-4f + r;
    float p = 1.0f / 5040.0f;
    p = p * r + 1.0f / 720.0f;
    p = p * r + 1.0f / 120.0f;
    p = p * r + 1.0f / 24.0f;
    p = p * r + 1.0f / 6.0f;
    p = p * r + 0.5f;
    p = p * r + 1.0f;
    p = p * r + 1.0f;
    union {
        int32_t i;
        float f;
    } s = {.i = ((int32_t)n + 127) * (1 << 23)};
    float y = p * s.f;
    y = x < -87.0f ? 0.0f : y;
    y = x > 88.0f ? INFINITY : y;
    return x != x ? x : y;
}

/*
 * The standard normal tail 0.5 erfc(|x| / sqrt 2) = Q(t) e^(-x^2 / 2) / 2,
 * given e = e^(-x^2 / 2): Q(z) = e^(z^2) erfc(z) as a degree-10 polynomial
 * in t = 1 / (1 + z / 2), fitted by weighted least squares on z in [0, 12]
 * for these sources (relative error 5e-8 in exact arithmetic, 3e-7 in
 * float).  The tail keeps its relative accuracy far out, where 1 + erf(x)
 * would cancel.
 */
static inline float fb_cpu_normal_tail(float x, float e)
{
    const float z = fabsf(x) * 0.70710678118654752440f, t = 1.0f / (0.5f * z + 1.0f);
    float q = 1.798098534e-02f;
    q = q * t + -1.567880511e-01f;
    q = q * t + 5.147573352e-01f;
    q = q * t + -7.954980135e-01f;
    q = q * t + 5.369915366e-01f;
    q = q * t + -1.684697121e-01f;
    q = q * t + 2.537805140e-01f;
    q = q * t + 2.312092334e-01f;
    q = q * t + 2.840806246e-01f;
    q = q * t + 2.819509804e-01f;
    q = q * t + 4.510044164e-06f;
    return 0.5f * q * e;
}

/* Sum of x[0..n) in double with four independent accumulators. */
static inline double fb_cpu_sum(const float *restrict x, size_t n)
{
    double s0 = 0, s1 = 0, s2 = 0, s3 = 0;
    size_t i = 0;
    for (; i + 4 <= n; i += 4) {
        s0 += x[i];
        s1 += x[i + 1];
        s2 += x[i + 2];
        s3 += x[i + 3];
    }
    for (; i < n; i++)
        s0 += x[i];
    return (s0 + s1) + (s2 + s3);
}

/* Sum of (x[i] - c)^2 over [0, n) in double. */
static inline double fb_cpu_sum_sqdev(const float *restrict x, size_t n, double c)
{
    double s0 = 0, s1 = 0, s2 = 0, s3 = 0;
    size_t i = 0;
    for (; i + 4 <= n; i += 4) {
        double d0 = x[i] - c, d1 = x[i + 1] - c, d2 = x[i + 2] - c, d3 = x[i + 3] - c;
        s0 += d0 * d0;
        s1 += d1 * d1;
        s2 += d2 * d2;
        s3 += d3 * d3;
    }
    for (; i < n; i++) {
        double d = x[i] - c;
        s0 += d * d;
    }
    return (s0 + s1) + (s2 + s3);
}

/* Sum of x[i] * y[i] over [0, n) in double. */
static inline double fb_cpu_dot(const float *restrict x, const float *restrict y, size_t n)
{
    double s0 = 0, s1 = 0, s2 = 0, s3 = 0;
    size_t i = 0;
    for (; i + 4 <= n; i += 4) {
        s0 += (double)x[i] * y[i];
        s1 += (double)x[i + 1] * y[i + 1];
        s2 += (double)x[i + 2] * y[i + 2];
        s3 += (double)x[i + 3] * y[i + 3];
    }
    for (; i < n; i++)
        s0 += (double)x[i] * y[i];
    return (s0 + s1) + (s2 + s3);
}

#endif
