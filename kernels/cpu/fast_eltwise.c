/*
 * Fast elementwise ops: one branch-free loop per activation in float, cut
 * into one range per thread when the array is large enough to share.
 * GELU's normal CDF is 1 - tail or the tail (fb_cpu_normal_tail, cpu.h) with
 * fb_cpu_expf, which vectorise: glibc's erff and expf are scalar calls, and
 * they were a quarter of a transformer's training step.
 * Dropout reuses the reference, whose cost is the counter-based RNG itself.
 */
#include "cpu.h"

#include <math.h>
#include <string.h>

#define FB_SQRT_2_OVER_PI_F 0.79788456080286535588f
#define FB_INV_SQRT_2PI_F 0.39894228040143267794f
#define FB_GELU_TANH_C_F 0.044715f

/* Elements per thread below which a loop stays on one thread. */
#define ELT_GRAIN 32768

/* out[n] = act(in[n]); out may equal in, so no restrict here. */
FB_CPU_VECTOR_CLONES
static void act_forward(fb_act act, float *out, const float *in, size_t n)
{
    switch (act) {
    case FB_ACT_RELU:
        for (size_t i = 0; i < n; i++)
            out[i] = in[i] < 0.0f ? 0.0f : in[i];
        return;
    case FB_ACT_GELU:
        for (size_t i = 0; i < n; i++) {
            const float x = in[i], tail = fb_cpu_normal_tail(x, fb_cpu_expf(-0.5f * x * x));
            out[i] = x * (x < 0.0f ? tail : 1.0f - tail);
        }
        return;
    case FB_ACT_GELU_TANH:
        for (size_t i = 0; i < n; i++) {
            float x = in[i];
            out[i] =
                0.5f * x * (1.0f + tanhf(FB_SQRT_2_OVER_PI_F * (x + FB_GELU_TANH_C_F * x * x * x)));
        }
        return;
    case FB_ACT_TANH:
        for (size_t i = 0; i < n; i++)
            out[i] = tanhf(in[i]);
        return;
    case FB_ACT_SIGMOID:
        for (size_t i = 0; i < n; i++)
            out[i] = 1.0f / (1.0f + expf(-in[i]));
        return;
    }
}

/* din[n] += dout * act'(in) (relu, gelu) or act'(out) (tanh, sigmoid); with
 * ACC "= 0.0f +", din[n] = 0 + the same term: what zeroing din and adding
 * would leave, bit for bit, without reading din. */
#define ACT_BACKWARD_BODY(ACC)                                                                     \
    float *restrict d = din;                                                                       \
    const float *restrict dy = dout, *restrict x = in, *restrict y = out;                          \
    switch (act) {                                                                                 \
    case FB_ACT_RELU:                                                                              \
        for (size_t i = 0; i < n; i++)                                                             \
            d[i] ACC(x[i] <= 0.0f ? 0.0f : dy[i]);                                                 \
        return;                                                                                    \
    case FB_ACT_GELU:                                                                              \
        for (size_t i = 0; i < n; i++) {                                                           \
            const float v = x[i], e = fb_cpu_expf(-0.5f * v * v), tail = fb_cpu_normal_tail(v, e); \
            const float cdf = v < 0.0f ? tail : 1.0f - tail;                                       \
            d[i] ACC(dy[i] * (cdf + v * FB_INV_SQRT_2PI_F * e));                                   \
        }                                                                                          \
        return;                                                                                    \
    case FB_ACT_GELU_TANH:                                                                         \
        for (size_t i = 0; i < n; i++) {                                                           \
            float v = x[i];                                                                        \
            float t = tanhf(FB_SQRT_2_OVER_PI_F * (v + FB_GELU_TANH_C_F * v * v * v));             \
            d[i] ACC(dy[i] * (0.5f * (1.0f + t) + 0.5f * v * (1.0f - t * t) * FB_SQRT_2_OVER_PI_F * \
                                                      (1.0f + 3.0f * FB_GELU_TANH_C_F * v * v)));   \
        }                                                                                          \
        return;                                                                                    \
    case FB_ACT_TANH:                                                                              \
        for (size_t i = 0; i < n; i++)                                                             \
            d[i] ACC(dy[i] * (1.0f - y[i] * y[i]));                                                \
        return;                                                                                    \
    case FB_ACT_SIGMOID:                                                                           \
        for (size_t i = 0; i < n; i++)                                                             \
            d[i] ACC(dy[i] * (y[i] * (1.0f - y[i])));                                              \
        return;                                                                                    \
    }

FB_CPU_VECTOR_CLONES
static void act_backward(fb_act act, float *din, const float *dout, const float *in,
                         const float *out, size_t n)
{
    ACT_BACKWARD_BODY(+=)
}

FB_CPU_VECTOR_CLONES
static void act_backward_set(fb_act act, float *din, const float *dout, const float *in,
                             const float *out, size_t n)
{
    ACT_BACKWARD_BODY(= 0.0f +)
}

/* The threaded entry points: each thread runs the loop on its own range. */
#define ELT_PARALLEL(be, n, body)                                                                 \
    do {                                                                                           \
        const int nt_ = fb_cpu_team(be, (double)(n), ELT_GRAIN);                                  \
        _Pragma("omp parallel num_threads(nt_) if (nt_ > 1)")                                     \
        {                                                                                          \
            size_t lo, hi;                                                                         \
            fb_cpu_split(n, omp_get_thread_num(), omp_get_num_threads(), 16, &lo, &hi);           \
            if (hi > lo) body;                                                                     \
        }                                                                                          \
    } while (0)

/* out[n] = act(in[n]); out may equal in. */
void fb_cpu_act_forward(fb_backend *be, fb_act act, float *out, const float *in, size_t n)
{
    ELT_PARALLEL(be, n, act_forward(act, out + lo, in + lo, hi - lo));
}

/* din[n] += dout * act'(in or out). */
void fb_cpu_act_backward(fb_backend *be, fb_act act, float *din, const float *dout,
                         const float *in, const float *out, size_t n)
{
    ELT_PARALLEL(be, n,
                 act_backward(act, din + lo, dout + lo, in ? in + lo : NULL, out ? out + lo : NULL,
                              hi - lo));
}

/* din[n] = dout * act'(in or out), as zeroing din and fb_cpu_act_backward would. */
void fb_cpu_act_backward_set(fb_backend *be, fb_act act, float *din, const float *dout,
                             const float *in, const float *out, size_t n)
{
    ELT_PARALLEL(be, n,
                 act_backward_set(act, din + lo, dout + lo, in ? in + lo : NULL,
                                  out ? out + lo : NULL, hi - lo));
}

static void add_range(float *out, const float *a, const float *b, size_t n)
{
    for (size_t i = 0; i < n; i++)
        out[i] = a[i] + b[i];
}

static void accumulate_range(float *y, const float *x, size_t n)
{
    float *restrict yy = y;
    const float *restrict xx = x;
    for (size_t i = 0; i < n; i++)
        yy[i] += xx[i];
}

/* out[n] = a[n] + b[n]; out may alias a or b. */
void fb_cpu_add_forward(fb_backend *be, float *out, const float *a, const float *b, size_t n)
{
    ELT_PARALLEL(be, n, add_range(out + lo, a + lo, b + lo, hi - lo));
}

/* y[n] += x[n]; y and x do not overlap. */
void fb_cpu_accumulate(fb_backend *be, float *y, const float *x, size_t n)
{
    ELT_PARALLEL(be, n, accumulate_range(y + lo, x + lo, hi - lo));
}

/* Bytes per thread below which zeroing stays on one thread. */
#define ZERO_GRAIN (1u << 20)

/* Sets bytes at p to zero, cut over threads when large (gradient buffers of
 * a wide array are tens of megabytes; one core cannot fill the memory bus). */
void fb_cpu_zero(fb_backend *be, void *p, size_t bytes)
{
    const int nt = fb_cpu_team(be, (double)bytes, ZERO_GRAIN);
#pragma omp parallel num_threads(nt) if (nt > 1)
    {
        size_t lo, hi;
        fb_cpu_split(bytes, omp_get_thread_num(), omp_get_num_threads(), 64, &lo, &hi);
        if (hi > lo) memset((char *)p + lo, 0, hi - lo);
    }
}
