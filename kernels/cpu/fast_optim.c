/*
 * Fast fused optimizer step.  Hyperparameter-derived scalars (bias
 * corrections, decay factors) are computed once per member in double; each
 * (member, block) range is contiguous, and the variant of the update is chosen
 * outside the inner loop, which is branch-free float arithmetic.
 */
#include "cpu.h"

#include <math.h>

/* p, g, buf [n] for one member's slice of one block. */
FB_CPU_VECTOR_CLONES
static void optim_sgd(float *restrict p, const float *restrict g, float *restrict buf, size_t n,
                      const fb_optim_hparams *h)
{
    const float lr = h->lr, wd = h->weight_decay, mom = h->momentum;
    const float damp = 1.0f - h->dampening;
    if (mom == 0.0f) {
        for (size_t i = 0; i < n; i++)
            p[i] -= lr * (g[i] + wd * p[i]);
        return;
    }
    if (h->t == 1)
        for (size_t i = 0; i < n; i++)
            buf[i] = g[i] + wd * p[i];
    else
        for (size_t i = 0; i < n; i++)
            buf[i] = mom * buf[i] + damp * (g[i] + wd * p[i]);
    if (h->nesterov)
        for (size_t i = 0; i < n; i++)
            p[i] -= lr * ((g[i] + wd * p[i]) + mom * buf[i]);
    else
        for (size_t i = 0; i < n; i++)
            p[i] -= lr * buf[i];
}

/* p, g, m, v [n]: Adam (l2 = wd, decay = 1) or AdamW (l2 = 0, decay = 1 - lr wd). */
FB_CPU_VECTOR_CLONES
static void optim_adam(float *restrict p, const float *restrict g, float *restrict m,
                       float *restrict v, size_t n, const fb_optim_hparams *h, bool decoupled)
{
    const double bc1 = 1.0 - pow(h->beta1, (double)h->t);
    const double bc2 = 1.0 - pow(h->beta2, (double)h->t);
    const float step = (float)(h->lr / bc1), inv_bc2s = (float)(1.0 / sqrt(bc2));
    const float l2 = decoupled ? 0.0f : h->weight_decay;
    const float decay = decoupled ? (float)(1.0 - (double)h->lr * h->weight_decay) : 1.0f;
    const float a1 = 1.0f - h->beta1, b2 = h->beta2, a2 = 1.0f - h->beta2, eps = h->eps;
    for (size_t i = 0; i < n; i++) {
        const float pi = p[i] * decay;
        const float gi = g[i] + l2 * pi;
        const float mi = m[i] + a1 * (gi - m[i]);
        const float vi = b2 * v[i] + a2 * gi * gi;
        m[i] = mi;
        v[i] = vi;
        p[i] = pi - step * mi / (sqrtf(vi) * inv_bc2s + eps);
    }
}

/* Floats per piece of work: a piece of every stream of Adam (p, g, m, v)
 * stays well inside L2. */
#define OPTIM_CHUNK 8192

static void optim_range(fb_optim_kind kind, float *params, const float *grads, float *state1,
                        float *state2, size_t base, size_t n, const fb_optim_hparams *h)
{
    float *s1 = state1 ? state1 + base : NULL;
    if (kind == FB_OPTIM_KIND_SGD)
        optim_sgd(params + base, grads + base, s1, n, h);
    else
        optim_adam(params + base, grads + base, s1, state2 + base, n, h,
                   kind == FB_OPTIM_KIND_ADAMW);
}

/* Same contract as fb_ref_optim_step (kernels.h): slabs indexed by
 * blocks[k].offset + b * per_member + i; empty slots (lr 0, t 0) skipped.
 * Every (member, block) range is cut into pieces of OPTIM_CHUNK floats that
 * the threads take in turn; the update of an element does not depend on any
 * other, so the cut changes nothing in the result. */
void fb_cpu_optim_step(fb_backend *be, fb_optim_kind kind, float *params, const float *grads,
                       float *state1, float *state2, const fb_param_block *blocks, int n_blocks,
                       int B, const fb_optim_hparams *hp)
{
    size_t total = 0;
    for (int k = 0; k < n_blocks; k++) total += blocks[k].per_member * (size_t)B;
    const int nt = fb_cpu_team(be, (double)total, 4.0 * OPTIM_CHUNK);
#pragma omp parallel num_threads(nt) if (nt > 1)
    {
        const size_t t = (size_t)omp_get_thread_num(), T = (size_t)omp_get_num_threads();
        size_t piece = 0;
        for (int b = 0; b < B; b++) {
            const fb_optim_hparams *h = &hp[b];
            if (h->lr == 0.0f && h->t == 0) continue;
            for (int k = 0; k < n_blocks; k++) {
                const size_t n = blocks[k].per_member, base = blocks[k].offset + (size_t)b * n;
                for (size_t i = 0; i < n; i += OPTIM_CHUNK, piece++) {
                    if (piece % T != t) continue;
                    size_t len = n - i < OPTIM_CHUNK ? n - i : OPTIM_CHUNK;
                    optim_range(kind, params, grads, state1, state2, base + i, len, h);
                }
            }
        }
    }
}
