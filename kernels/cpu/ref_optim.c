/*
 * Reference fused optimizer step: torch.optim's SGD, Adam and AdamW, one
 * parameter at a time in double.
 */
#include "cpu.h"

#include <math.h>

/* Whether slot b is empty (an array member that left). */
static bool ref_skip(const fb_optim_hparams *h)
{
    return h->lr == 0.0f && h->t == 0;
}

/*
 * params, grads, state1, state2: slabs indexed by blocks[k].offset +
 * b * per_member + i for member b of B.  For each active member with its own
 * hp[b] (see kernels.h for the formulas):
 *   sgd:   g = grad + wd p; with momentum: buf = t == 1 ? g : momentum buf +
 *          (1 - dampening) g, g = nesterov ? g + momentum buf : buf; p -= lr g
 *   adam:  g = grad + wd p; m += (1 - beta1)(g - m); v = beta2 v + (1 - beta2) g^2;
 *          p -= lr / (1 - beta1^t) m / (sqrt(v) / sqrt(1 - beta2^t) + eps)
 *   adamw: p *= 1 - lr wd, then adam with wd = 0.
 */
void fb_ref_optim_step(fb_backend *be, fb_optim_kind kind, float *params, const float *grads,
                       float *state1, float *state2, const fb_param_block *blocks, int n_blocks,
                       int B, const fb_optim_hparams *hp)
{
    for (int b = 0; b < B; b++) {
        const fb_optim_hparams *h = &hp[b];
        if (ref_skip(h)) continue;
        double bc1 = 1.0 - pow(h->beta1, (double)h->t);
        double bc2 = 1.0 - pow(h->beta2, (double)h->t);
        for (int k = 0; k < n_blocks; k++) {
            size_t base = blocks[k].offset + (size_t)b * blocks[k].per_member;
            for (size_t i = base; i < base + blocks[k].per_member; i++) {
                double p = params[i], g = grads[i];
                if (kind == FB_OPTIM_KIND_SGD) {
                    if (h->weight_decay != 0.0f) g += (double)h->weight_decay * p;
                    if (h->momentum != 0.0f) {
                        double buf = h->t == 1 ? g
                                               : (double)h->momentum * state1[i] +
                                                     (1.0 - (double)h->dampening) * g;
                        state1[i] = (float)buf;
                        buf = state1[i]; /* continue from the stored value, as torch */
                        g = h->nesterov ? g + (double)h->momentum * buf : buf;
                    }
                    params[i] = (float)(p - (double)h->lr * g);
                    continue;
                }
                if (kind == FB_OPTIM_KIND_ADAMW)
                    p *= 1.0 - (double)h->lr * h->weight_decay;
                else if (h->weight_decay != 0.0f)
                    g += (double)h->weight_decay * p;
                double m = state1[i] + (1.0 - (double)h->beta1) * (g - state1[i]);
                double v = (double)h->beta2 * state2[i] + (1.0 - (double)h->beta2) * g * g;
                state1[i] = (float)m;
                state2[i] = (float)v;
                m = state1[i]; /* continue from the stored values, as torch */
                v = state2[i];
                params[i] = (float)(p - (double)h->lr / bc1 * m / (sqrt(v) / sqrt(bc2) + h->eps));
            }
        }
    }
}
