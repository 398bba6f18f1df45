/*
 * Stage partitioning and the 1F1B schedule (pipeline_plan.h).
 *
 * The partition is the classic linear-partition dynamic programme: best[p][i]
 * is the smallest possible largest stage over the first i layers cut into p
 * stages.  Models have at most a few hundred top-level layers, so O(P n^2)
 * is nothing.
 */
#include "pipeline_plan.h"

#include <math.h>
#include <stdlib.h>

#include "errors.h"
#include "kernels.h"

/* Forward + backward FLOPs of a layer and what is nested in it. */
static double layer_cost(const fb_layer *L)
{
    double c = L->flops_fwd + L->flops_bwd;
    for (int i = 0; i < L->n_body; i++) c += layer_cost(&L->body[i]);
    for (int i = 0; i < L->n_shortcut; i++) c += layer_cost(&L->shortcut[i]);
    /* a layer without arithmetic still moves its activations */
    return c > 0 ? c : 1e-3;
}

bool fb_pipeline_can_cut(const fb_job_spec *spec, int j)
{
    if (j <= 0 || j >= spec->n_layers) return false;
    fb_layer_type t = spec->layers[j].type;
    if (t != FB_LAYER_LINEAR && t != FB_LAYER_CONV2D) return false;
    /* the first stage must compute something: a flatten alone is no array */
    for (int i = 0; i < j; i++)
        if (spec->layers[i].type != FB_LAYER_FLATTEN) return true;
    return false;
}

int fb_pipeline_partition(const fb_job_spec *spec, int P, int *first, char *msg, size_t msg_cap)
{
    int n = spec->n_layers;
    if (P < 1 || P > FB_PIPELINE_MAX_STAGES || P > n)
        return fb_errf(msg, msg_cap, FB_ERR_OUT_OF_RANGE,
                       "%d pipeline stages for %d layers (1..min(%d, layers))", P, n,
                       FB_PIPELINE_MAX_STAGES);
    double *pre = calloc((size_t)n + 1, sizeof *pre);
    double *best = calloc((size_t)(P + 1) * (size_t)(n + 1), sizeof *best);
    int *cut = calloc((size_t)(P + 1) * (size_t)(n + 1), sizeof *cut);
    if (!pre || !best || !cut) {
        free(pre);
        free(best);
        free(cut);
        return fb_errf(msg, msg_cap, FB_ERR_NOMEM, "out of memory");
    }
#define BEST(p, i) best[(size_t)(p) * (size_t)(n + 1) + (size_t)(i)]
#define CUT(p, i) cut[(size_t)(p) * (size_t)(n + 1) + (size_t)(i)]
    for (int i = 0; i < n; i++) pre[i + 1] = pre[i] + layer_cost(&spec->layers[i]);
    for (int i = 1; i <= n; i++) BEST(1, i) = pre[i];
    for (int p = 2; p <= P; p++)
        for (int i = 0; i < p; i++) BEST(p, i) = INFINITY;
    for (int p = 2; p <= P; p++)
        for (int i = p; i <= n; i++) {
            BEST(p, i) = INFINITY;
            for (int j = p - 1; j < i; j++) {
                if (!fb_pipeline_can_cut(spec, j) || !isfinite(BEST(p - 1, j))) continue;
                double v = fmax(BEST(p - 1, j), pre[i] - pre[j]);
                /* strictly better only, so the earliest cut wins ties */
                if (v < BEST(p, i) * (1 - 1e-12)) {
                    BEST(p, i) = v;
                    CUT(p, i) = j;
                }
            }
        }
    if (!isfinite(BEST(P, n))) {
        int cuts = 0;
        for (int j = 1; j < n; j++) cuts += fb_pipeline_can_cut(spec, j);
        free(pre);
        free(best);
        free(cut);
        return fb_errf(msg, msg_cap, FB_ERR_OUT_OF_RANGE,
                       "%d pipeline stages need %d cuts; the model can be cut in %d places "
                       "(before a linear or conv2d layer)",
                       P, P - 1, cuts);
    }
    int i = n;
    first[P] = n;
    for (int p = P; p >= 2; p--) {
        i = CUT(p, i);
        first[p - 1] = i;
    }
    first[0] = 0;
#undef BEST
#undef CUT
    free(pre);
    free(best);
    free(cut);
    return FB_OK;
}

int fb_pipeline_1f1b(int P, int m, int s, fb_pipe_op *ops, int cap)
{
    if (P < 1 || P > FB_PIPELINE_MAX_STAGES || m < 1 || s < 0 || s >= P || cap < 2 * m)
        return FB_ERR_OUT_OF_RANGE;
    int warm = P - 1 - s < m ? P - 1 - s : m;
    int k = 0, f = 0, b = 0;
    for (; f < warm; f++) ops[k++] = (fb_pipe_op){.backward = 0, .micro = f};
    while (f < m) {
        ops[k++] = (fb_pipe_op){.backward = 0, .micro = f++};
        ops[k++] = (fb_pipe_op){.backward = 1, .micro = b++};
    }
    while (b < m) ops[k++] = (fb_pipe_op){.backward = 1, .micro = b++};
    return k;
}

double fb_pipeline_bubble_formula(int P, int m)
{
    return (double)(P - 1) / (double)(m + P - 1);
}

int fb_pipeline_simulate(int P, int m, const double *tf, const double *tb, double *makespan,
                         double *bubble)
{
    if (P < 1 || P > FB_PIPELINE_MAX_STAGES || m < 1) return FB_ERR_OUT_OF_RANGE;
    fb_pipe_op *ops = calloc((size_t)P * 2 * (size_t)m, sizeof *ops);
    double *endf = calloc((size_t)P * (size_t)m, sizeof *endf);
    double *endb = calloc((size_t)P * (size_t)m, sizeof *endb);
    int *pos = calloc((size_t)P, sizeof *pos);
    double *free_at = calloc((size_t)P, sizeof *free_at);
    int err = FB_OK;
    if (!ops || !endf || !endb || !pos || !free_at) {
        err = FB_ERR_NOMEM;
        goto done;
    }
    for (int s = 0; s < P; s++) fb_pipeline_1f1b(P, m, s, ops + (size_t)s * 2 * m, 2 * m);
    for (size_t i = 0; i < (size_t)P * m; i++) endf[i] = endb[i] = -1;
    /* advance every stage as far as its dependencies allow, until all ran */
    int left = 2 * m * P;
    while (left > 0) {
        int progress = 0;
        for (int s = 0; s < P; s++) {
            while (pos[s] < 2 * m) {
                fb_pipe_op o = ops[(size_t)s * 2 * m + pos[s]];
                double ready;
                if (!o.backward) {
                    ready = s == 0 ? 0 : endf[(size_t)(s - 1) * m + o.micro];
                } else {
                    ready = s == P - 1 ? endf[(size_t)s * m + o.micro]
                                       : endb[(size_t)(s + 1) * m + o.micro];
                }
                if (ready < 0) break;
                double start = fmax(ready, free_at[s]);
                double end = start + (o.backward ? tb[s] : tf[s]);
                if (o.backward)
                    endb[(size_t)s * m + o.micro] = end;
                else
                    endf[(size_t)s * m + o.micro] = end;
                free_at[s] = end;
                pos[s]++;
                left--;
                progress++;
            }
        }
        /* 1F1B never deadlocks: some stage can always move */
        FB_ASSERT(progress > 0);
    }
    double span = 0, busy = 0;
    for (int s = 0; s < P; s++) {
        span = fmax(span, free_at[s]);
        busy += m * (tf[s] + tb[s]);
    }
    *makespan = span;
    *bubble = span > 0 ? 1.0 - busy / (P * span) : 0;
done:
    free(ops);
    free(endf);
    free(endb);
    free(pos);
    free(free_at);
    return err;
}
