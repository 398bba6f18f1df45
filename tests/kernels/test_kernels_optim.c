/*
 * Fused optimizer step against a scalar double-precision transcription of
 * torch.optim's update rules (SGD, Adam, AdamW), on both CPU backends.
 *
 * One fused call updates B = 4 members with different hyperparameters, three
 * of them active and slot 2 empty (lr 0, t 0), which must stay bit-for-bit
 * untouched.  Members also differ in their own step count t (one joined the
 * array later), which drives the momentum-buffer initialisation and the Adam
 * bias corrections.  Parameters live in two blocks with gaps between them that
 * must stay untouched too.  Six steps with a per-step learning-rate schedule.
 */
#include "kt_util.h"

#define B 4
#define STEPS 6
#define TOL 1e-5

static const size_t per_member[2] = {5, 17};
static fb_param_block blocks[2];
static size_t total;

/* The torch.optim formulas for one scalar parameter, in double. */
typedef struct {
    double p, s1, s2;
} ref_state;

static void torch_sgd(ref_state *st, double grad, const fb_optim_hparams *h)
{
    double d_p = grad;
    if (h->weight_decay != 0) d_p = d_p + h->weight_decay * st->p;
    if (h->momentum != 0) {
        if (h->t == 1)
            st->s1 = d_p; /* buf = clone(d_p) */
        else
            st->s1 = h->momentum * st->s1 + (1 - h->dampening) * d_p;
        if (h->nesterov)
            d_p = d_p + h->momentum * st->s1;
        else
            d_p = st->s1;
    }
    st->p = st->p - h->lr * d_p;
}

static void torch_adam(ref_state *st, double grad, const fb_optim_hparams *h, bool adamw)
{
    if (adamw)
        st->p = st->p * (1 - h->lr * h->weight_decay);
    else if (h->weight_decay != 0)
        grad = grad + h->weight_decay * st->p;
    st->s1 = h->beta1 * st->s1 + (1 - h->beta1) * grad;
    st->s2 = h->beta2 * st->s2 + (1 - h->beta2) * grad * grad;
    double bias_correction1 = 1 - pow(h->beta1, (double)h->t);
    double bias_correction2 = 1 - pow(h->beta2, (double)h->t);
    double step_size = h->lr / bias_correction1;
    double denom = sqrt(st->s2) / sqrt(bias_correction2) + h->eps;
    st->p = st->p - step_size * st->s1 / denom;
}

static void member_hparams(fb_optim_hparams hp[B], fb_optim_kind kind, int step)
{
    static const int t0[B] = {1, 1, 0, 4}; /* member 3 joined with 3 updates done */
    memset(hp, 0, sizeof(fb_optim_hparams) * B);
    for (int b = 0; b < B; b++) {
        fb_optim_hparams *h = &hp[b];
        double sched = 1.0 - 0.1 * step; /* a decaying schedule */
        h->t = t0[b] + step;
        h->beta1 = 0.9f - 0.1f * b;
        h->beta2 = 0.999f - 0.01f * b;
        h->eps = b == 3 ? 1e-3f : 1e-8f;
        if (kind == FB_OPTIM_KIND_SGD) {
            h->lr = (float)((b == 0 ? 0.1 : 0.05) * sched);
            h->momentum = b == 0 ? 0.0f : 0.9f - 0.1f * b;
            h->dampening = b == 1 ? 0.3f : 0.0f;
            h->nesterov = b == 3;
            h->weight_decay = b == 3 ? 0.01f : 0.0f;
        } else {
            h->lr = (float)((0.01 + 0.005 * b) * sched);
            h->weight_decay = b == 0 ? 0.0f : 0.02f * b;
        }
    }
    hp[2].lr = 0.0f; /* the empty slot */
    hp[2].t = 0;
}

static void run(fb_backend *be, fb_optim_kind kind, const char *name)
{
    float *params = kt_guarded_new(total), *grads = kt_guarded_new(total);
    float *s1 = kt_guarded_new(total), *s2 = kt_guarded_new(total);
    ref_state *ref = calloc(total, sizeof(ref_state));
    float *p0 = malloc(total * sizeof(float)), *s10 = malloc(total * sizeof(float));
    float *s20 = malloc(total * sizeof(float));
    CHECK(ref && p0 && s10 && s20);
    for (size_t i = 0; i < total; i++) {
        params[i] = kt_uniform(-1, 1);
        s1[i] = kt_uniform(-0.1f, 0.1f);
        s2[i] = kt_uniform(0.0f, 0.05f);
        ref[i] = (ref_state){params[i], s1[i], s2[i]};
    }
    memcpy(p0, params, total * sizeof(float));
    memcpy(s10, s1, total * sizeof(float));
    memcpy(s20, s2, total * sizeof(float));
    double worst = 0.0;
    for (int step = 0; step < STEPS; step++) {
        fb_optim_hparams hp[B];
        member_hparams(hp, kind, step);
        for (size_t i = 0; i < total; i++)
            grads[i] = kt_uniform(-1, 1);
        fb_optim_step(be, kind, params, grads, s1, kind == FB_OPTIM_KIND_SGD ? NULL : s2, blocks, 2,
                      B, hp);
        for (int k = 0; k < 2; k++)
            for (int b = 0; b < B; b++) {
                if (b == 2) continue;
                size_t base = blocks[k].offset + (size_t)b * blocks[k].per_member;
                for (size_t i = base; i < base + blocks[k].per_member; i++) {
                    if (kind == FB_OPTIM_KIND_SGD)
                        torch_sgd(&ref[i], grads[i], &hp[b]);
                    else
                        torch_adam(&ref[i], grads[i], &hp[b], kind == FB_OPTIM_KIND_ADAMW);
                    CHECK_NEAR(params[i], ref[i].p, TOL);
                    if (kind != FB_OPTIM_KIND_SGD || hp[b].momentum != 0.0f)
                        CHECK_NEAR(s1[i], ref[i].s1, TOL);
                    if (kind != FB_OPTIM_KIND_SGD) CHECK_NEAR(s2[i], ref[i].s2, TOL);
                    double e = fabs(params[i] - ref[i].p) / fmax(1.0, fabs(ref[i].p));
                    if (e > worst) worst = e;
                }
            }
    }
    /* the empty slot, the gaps and, for plain SGD, member 0's buffer: untouched */
    for (size_t i = 0; i < total; i++) {
        bool active = false, s1_used = false;
        for (int k = 0; k < 2; k++)
            for (int b = 0; b < B; b++) {
                size_t base = blocks[k].offset + (size_t)b * blocks[k].per_member;
                if (b != 2 && i >= base && i < base + blocks[k].per_member) {
                    active = true;
                    s1_used = kind != FB_OPTIM_KIND_SGD || b != 0;
                }
            }
        if (!active) CHECK(memcmp(&params[i], &p0[i], 4) == 0);
        if (!s1_used) CHECK(memcmp(&s1[i], &s10[i], 4) == 0);
        if (!active || kind == FB_OPTIM_KIND_SGD) CHECK(memcmp(&s2[i], &s20[i], 4) == 0);
    }
    CHECK(kt_guarded_ok(params, total) && kt_guarded_ok(grads, total));
    CHECK(kt_guarded_ok(s1, total) && kt_guarded_ok(s2, total));
    printf("%-6s %-8s B%d %d steps, slot 2 empty: max rel err %.2e ok\n", name, fb_backend_name(be),
           B, STEPS, worst);
    kt_guarded_free(params);
    kt_guarded_free(grads);
    kt_guarded_free(s1);
    kt_guarded_free(s2);
    free(ref);
    free(p0);
    free(s10);
    free(s20);
}

int main(void)
{
    size_t off = 2;
    for (int k = 0; k < 2; k++) {
        blocks[k] = (fb_param_block){off, per_member[k]};
        off += per_member[k] * B + 3; /* a gap after each block */
    }
    total = off;
    fb_backend *bes[2] = {fb_backend_cpu_ref(), fb_backend_cpu()};
    static const char *names[] = {"sgd", "adam", "adamw"};
    for (int k = 0; k < 2; k++)
        for (int kind = FB_OPTIM_KIND_SGD; kind <= FB_OPTIM_KIND_ADAMW; kind++)
            run(bes[k], (fb_optim_kind)kind, names[kind]);
    return 0;
}
