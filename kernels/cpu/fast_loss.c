/*
 * Fast losses.  Rows are short (K classes), so the work is one pass per row
 * with the exponentials computed once and per-member sums in double.
 */
#include "cpu.h"

#include <math.h>

/* Rows of this many classes or more are worth a thread per member. */
#define XENT_GRAIN 32768.0
/* Exponentials summed at a time (in a stack buffer when there is no dlogits). */
#define XENT_CHUNK 256

/* e = e^(z - mx) over [0, n), the sum in double (fb_cpu_sum's order). */
FB_CPU_VECTOR_CLONES
static double exp_chunk(float *restrict e, const float *restrict z, float mx, int n)
{
    for (int k = 0; k < n; k++)
        e[k] = fb_cpu_expf(z[k] - mx);
    return fb_cpu_sum(e, (size_t)n);
}

/*
 * logits, dlogits [N, B, K]; labels [N]; loss, correct [B].  Per row: first
 * argmax, max-shifted exponentials, lse = max + log(sum); dlogits =
 * (exp / sum - onehot) grad_scale.  Each loop vectorises (the max over lanes,
 * the exponentials with fb_cpu_expf, their sum chunk by chunk of XENT_CHUNK
 * in the same order with or without dlogits); members are dealt out to
 * threads, each summing its loss over n ascending.
 */
void fb_cpu_softmax_xent(fb_backend *be, float *loss, float *dlogits, float *correct,
                         const float *logits, const int32_t *labels, int N, int B, int K,
                         float grad_scale)
{
    const int nt = fb_cpu_team(be, (double)N * B * K, XENT_GRAIN);
#pragma omp parallel for num_threads(nt) if (nt > 1) schedule(static)
    for (int b = 0; b < B; b++) {
        double total = 0.0;
        int hits = 0;
        float tmp[XENT_CHUNK];
        for (int n = 0; n < N; n++) {
            const float *restrict z = logits + ((size_t)n * B + b) * K;
            const int y = labels[n];
            FB_ASSERT(y >= 0 && y < K);
            const float mx = fb_cpu_row_max(z, K);
            int arg = 0; /* the first k at the max (0 when the max is NaN) */
            while (arg < K && !(z[arg] == mx))
                arg++;
            if (arg == K) arg = 0;
            hits += arg == y;
            float *restrict d = dlogits ? dlogits + ((size_t)n * B + b) * K : NULL;
            double sum = 0.0;
            for (int k0 = 0; k0 < K; k0 += XENT_CHUNK) {
                const int kn = K - k0 < XENT_CHUNK ? K - k0 : XENT_CHUNK;
                sum += exp_chunk(d ? d + k0 : tmp, z + k0, mx, kn);
            }
            if (d) {
                const float inv = (float)(grad_scale / sum);
                for (int k = 0; k < K; k++)
                    d[k] *= inv;
                d[y] -= grad_scale;
            }
            total += mx + log(sum) - z[y];
        }
        loss[b] = (float)(total / N);
        if (correct) correct[b] = (float)hits;
    }
}

/*
 * pred, dpred [N, B, K]; target [N, K]; loss [B] = mean of squares;
 * dpred = (2 grad_scale / K) (pred - target).
 */
void fb_cpu_mse(fb_backend *be, float *loss, float *dpred, const float *pred, const float *target,
                int N, int B, int K, float grad_scale)
{
    const float k2 = (float)(2.0 * grad_scale / K);
    for (int b = 0; b < B; b++) {
        double total = 0.0;
        for (int n = 0; n < N; n++) {
            const float *restrict p = pred + ((size_t)n * B + b) * K;
            const float *restrict t = target + (size_t)n * K;
            for (int k = 0; k < K; k++) {
                double e = (double)p[k] - t[k];
                total += e * e;
            }
            if (dpred) {
                float *restrict d = dpred + ((size_t)n * B + b) * K;
                for (int k = 0; k < K; k++)
                    d[k] = k2 * (p[k] - t[k]);
            }
        }
        loss[b] = (float)(total / ((double)N * K));
    }
}
