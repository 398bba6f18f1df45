/*
 * Reference elementwise ops: activations (evaluated in double), add,
 * accumulate and counter-based inverted dropout.
 */
#include "cpu.h"
#include "rng.h"

#include <math.h>

#define FB_SQRT_2_OVER_PI 0.79788456080286535588
#define FB_INV_SQRT_2PI 0.39894228040143267794
#define FB_SQRT1_2 0.70710678118654752440
#define FB_GELU_TANH_C 0.044715

/* act(x) for one value, in double. */
static double ref_act(fb_act act, double x)
{
    switch (act) {
    case FB_ACT_RELU:
        return x < 0.0 ? 0.0 : x; /* a NaN passes through, as in PyTorch */
    case FB_ACT_GELU:
        return 0.5 * x * (1.0 + erf(x * FB_SQRT1_2));
    case FB_ACT_GELU_TANH:
        return 0.5 * x * (1.0 + tanh(FB_SQRT_2_OVER_PI * (x + FB_GELU_TANH_C * x * x * x)));
    case FB_ACT_TANH:
        return tanh(x);
    case FB_ACT_SIGMOID:
        return 1.0 / (1.0 + exp(-x));
    }
    return x;
}

/* d act / dx at input x with forward output y, in double. */
static double ref_act_grad(fb_act act, double x, double y)
{
    switch (act) {
    case FB_ACT_RELU:
        return x <= 0.0 ? 0.0 : 1.0;
    case FB_ACT_GELU:
        return 0.5 * (1.0 + erf(x * FB_SQRT1_2)) + x * FB_INV_SQRT_2PI * exp(-0.5 * x * x);
    case FB_ACT_GELU_TANH: {
        double t = tanh(FB_SQRT_2_OVER_PI * (x + FB_GELU_TANH_C * x * x * x));
        return 0.5 * (1.0 + t) +
               0.5 * x * (1.0 - t * t) * FB_SQRT_2_OVER_PI * (1.0 + 3.0 * FB_GELU_TANH_C * x * x);
    }
    case FB_ACT_TANH:
        return 1.0 - y * y;
    case FB_ACT_SIGMOID:
        return y * (1.0 - y);
    }
    return 1.0;
}

/* out[n] = act(in[n]); out may equal in. */
void fb_ref_act_forward(fb_backend *be, fb_act act, float *out, const float *in, size_t n)
{
    for (size_t i = 0; i < n; i++)
        out[i] = (float)ref_act(act, in[i]);
}

/* din[n] += dout * act'(in); relu and gelu read in, tanh and sigmoid out.
 * relu passes the gradient where in > 0 (or is NaN), as PyTorch. */
void fb_ref_act_backward(fb_backend *be, fb_act act, float *din, const float *dout,
                         const float *in, const float *out, size_t n)
{
    for (size_t i = 0; i < n; i++) {
        double x = in ? in[i] : 0.0, y = out ? out[i] : 0.0;
        if (act == FB_ACT_RELU) {
            din[i] += x <= 0.0 ? 0.0f : dout[i];
            continue;
        }
        din[i] = (float)(din[i] + dout[i] * ref_act_grad(act, x, y));
    }
}

/* out[n] = a[n] + b[n]; out may alias a or b. */
void fb_ref_add_forward(fb_backend *be, float *out, const float *a, const float *b, size_t n)
{
    for (size_t i = 0; i < n; i++)
        out[i] = a[i] + b[i];
}

/* y[n] += x[n]. */
void fb_ref_accumulate(fb_backend *be, float *y, const float *x, size_t n)
{
    for (size_t i = 0; i < n; i++)
        y[i] += x[i];
}

/* The factor dropout multiplies element (n, b, f) of [N, B, F] by: 1/(1-p)
 * when kept, 0 when dropped (0 everywhere for p = 1). */
static float ref_dropout_factor(const uint64_t *seeds, uint64_t stream, float p, int F, int b,
                                int64_t n_global, int f)
{
    float scale = p < 1.0f ? 1.0f / (1.0f - p) : 0.0f;
    uint64_t counter = (uint64_t)n_global * (uint64_t)F + (uint64_t)f;
    return fb_rng_uniform(seeds[b], stream, counter) >= p ? scale : 0.0f;
}

/* out[N, B, F] = in * factor, the factor from member b's seed, the stream and
 * the element's position (n_offset + n, f) in the global batch. */
void fb_ref_dropout_forward(fb_backend *be, float *out, const float *in, const uint64_t *seeds,
                            uint64_t stream, float p, int N, int B, int F, int64_t n_offset)
{
    for (int n = 0; n < N; n++)
        for (int b = 0; b < B; b++)
            for (int f = 0; f < F; f++) {
                size_t i = ((size_t)n * B + b) * F + f;
                out[i] = in[i] * ref_dropout_factor(seeds, stream, p, F, b, n_offset + n, f);
            }
}

/* din[N, B, F] += dout * factor, the same factor as the forward. */
void fb_ref_dropout_backward(fb_backend *be, float *din, const float *dout, const uint64_t *seeds,
                             uint64_t stream, float p, int N, int B, int F, int64_t n_offset)
{
    for (int n = 0; n < N; n++)
        for (int b = 0; b < B; b++)
            for (int f = 0; f < F; f++) {
                size_t i = ((size_t)n * B + b) * F + f;
                din[i] += dout[i] * ref_dropout_factor(seeds, stream, p, F, b, n_offset + n, f);
            }
}
