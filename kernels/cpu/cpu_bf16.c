/*
 * The bf16 helpers of the CPU backends: rounding to bfloat16, the per-member
 * scaling of the loss gradient, and the unscaling of the parameter gradients
 * with its finiteness check.  Rounding and scaling are one pass over memory,
 * so the reference and the fast backend share those loops; the unscaling has
 * a plain reference loop and a vectorised, threaded fast one.  The rounding
 * itself is fb_bf16_round (kernels/bf16.h), the same function the CUDA
 * kernel runs.
 */
#include "cpu.h"

#include <math.h>
#include <string.h>

#include "../bf16.h"

/* out[i] = fb_bf16_round(in[i]) over n floats; out may equal in. */
void fb_cpu_round_bf16(fb_backend *be, float *out, const float *in, size_t n)
{
    (void)be;
    for (size_t i = 0; i < n; i++)
        out[i] = fb_bf16_round(in[i]);
}

/*
 * Reference: for each member b, over its part of every block,
 * g[i] *= inv_scales[b], and flags[b] = 1 if a product is NaN or infinite.
 * grads: block k is [B, per_member] at blocks[k].offset; flags [B]; inv_scales [B].
 */
void fb_ref_grad_unscale(fb_backend *be, float *flags, float *grads, const float *inv_scales,
                         const fb_param_block *blocks, int n_blocks, int B)
{
    (void)be;
    for (int b = 0; b < B; b++) {
        float bad = 0.0f;
        for (int k = 0; k < n_blocks; k++) {
            float *g = grads + blocks[k].offset + (size_t)b * blocks[k].per_member;
            for (size_t i = 0; i < blocks[k].per_member; i++) {
                g[i] *= inv_scales[b];
                if (!isfinite(g[i])) bad = 1.0f;
            }
        }
        flags[b] = bad;
    }
}

/* Floats of one member's block below which its row stays on one thread. */
#define UNSCALE_GRAIN 65536

/* g[0..n) *= s; returns whether a product has an all-ones exponent (a NaN
 * or an infinity).  Branch-free on the bits, so the loop vectorises
 * with an OR reduction instead of stopping at the first bad value. */
static uint32_t unscale_range(float *restrict g, size_t n, float s)
{
    uint32_t bad = 0;
    for (size_t i = 0; i < n; i++) {
        float v = g[i] * s;
        uint32_t u;
        memcpy(&u, &v, sizeof u);
        bad |= (uint32_t)((u & 0x7f800000u) == 0x7f800000u);
        g[i] = v;
    }
    return bad;
}

/* Fast path of fb_ref_grad_unscale: the same products, with a member's part
 * of a large block cut into one range per thread (gradient slabs of a wide
 * array are tens of megabytes, and one core cannot keep the memory bus busy). */
void fb_cpu_grad_unscale(fb_backend *be, float *flags, float *grads, const float *inv_scales,
                         const fb_param_block *blocks, int n_blocks, int B)
{
    for (int b = 0; b < B; b++) {
        uint32_t bad = 0;
        float s = inv_scales[b];
        for (int k = 0; k < n_blocks; k++) {
            size_t n = blocks[k].per_member;
            float *g = grads + blocks[k].offset + (size_t)b * n;
            const int nt = fb_cpu_team(be, (double)n, UNSCALE_GRAIN);
            if (nt == 1) {
                bad |= unscale_range(g, n, s);
                continue;
            }
#pragma omp parallel num_threads(nt) reduction(| : bad)
            {
                size_t lo, hi;
                fb_cpu_split(n, omp_get_thread_num(), omp_get_num_threads(), 16, &lo, &hi);
                if (hi > lo) bad |= unscale_range(g + lo, hi - lo, s);
            }
        }
        flags[b] = bad ? 1.0f : 0.0f;
    }
}

/* x[n, b, f] *= scales[b] over x [N, B, F]. */
void fb_cpu_scale_members(fb_backend *be, float *x, const float *scales, int N, int B, size_t F)
{
    (void)be;
    for (int n = 0; n < N; n++)
        for (int b = 0; b < B; b++) {
            float s = scales[b], *row = x + ((size_t)n * (size_t)B + (size_t)b) * F;
            for (size_t f = 0; f < F; f++)
                row[f] *= s;
        }
}
