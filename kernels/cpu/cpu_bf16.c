/*
 * The bf16 helpers of both CPU backends: rounding to bfloat16, and the
 * per-member finiteness check and scaling of loss scaling.  Each is one pass
 * over memory, so the reference and the fast backend share these loops; the
 * rounding itself is fb_bf16_round (kernels/bf16.h), the same function the
 * CUDA kernel runs.
 */
#include "cpu.h"

#include <math.h>

#include "../bf16.h"

/* out[i] = fb_bf16_round(in[i]) over n floats; out may equal in. */
void fb_cpu_round_bf16(fb_backend_t *be, float *out, const float *in, size_t n)
{
    (void)be;
    for (size_t i = 0; i < n; i++)
        out[i] = fb_bf16_round(in[i]);
}

/* flags[b] = 1 when a float of member b's part of any block is NaN or
 * infinite, else 0.  The scan of a member stops at its first bad value: an
 * overflowed step is the rare case, and a finite one reads everything once. */
void fb_cpu_grad_nonfinite(fb_backend_t *be, float *flags, const float *grads,
                           const fb_param_block *blocks, int n_blocks, int B)
{
    (void)be;
    for (int b = 0; b < B; b++) {
        float bad = 0.0f;
        for (int k = 0; k < n_blocks && bad == 0.0f; k++) {
            const float *g = grads + blocks[k].offset + (size_t)b * blocks[k].per_member;
            for (size_t i = 0; i < blocks[k].per_member; i++)
                if (!isfinite(g[i])) {
                    bad = 1.0f;
                    break;
                }
        }
        flags[b] = bad;
    }
}

/* x[n, b, f] *= scales[b] over x [N, B, F]. */
void fb_cpu_scale_members(fb_backend_t *be, float *x, const float *scales, int N, int B, size_t F)
{
    (void)be;
    for (int n = 0; n < N; n++)
        for (int b = 0; b < B; b++) {
            float s = scales[b], *row = x + ((size_t)n * (size_t)B + (size_t)b) * F;
            for (size_t f = 0; f < F; f++)
                row[f] *= s;
        }
}
