/*
 * Fast losses.  Rows are short (K classes), so the work is one pass per row
 * with the exponentials computed once and per-member sums in double.
 */
#include "cpu.h"

#include <math.h>

/*
 * logits, dlogits [N, B, K]; labels [N]; loss, correct [B].  Per row: first
 * argmax, max-shifted exponentials, lse = max + log(sum); dlogits =
 * (exp / sum - onehot) grad_scale.
 */
void fb_cpu_softmax_xent(fb_backend *be, float *loss, float *dlogits, float *correct,
                         const float *logits, const int32_t *labels, int N, int B, int K,
                         float grad_scale)
{
    for (int b = 0; b < B; b++) {
        double total = 0.0;
        int hits = 0;
        for (int n = 0; n < N; n++) {
            const float *restrict z = logits + ((size_t)n * B + b) * K;
            const int y = labels[n];
            FB_ASSERT(y >= 0 && y < K);
            int arg = 0;
            float mx = z[0];
            for (int k = 1; k < K; k++)
                if (z[k] > mx) {
                    mx = z[k];
                    arg = k;
                }
            hits += arg == y;
            if (dlogits) {
                float *restrict d = dlogits + ((size_t)n * B + b) * K;
                double sum = 0.0;
                for (int k = 0; k < K; k++) {
                    d[k] = expf(z[k] - mx);
                    sum += d[k];
                }
                const float inv = (float)(grad_scale / sum);
                for (int k = 0; k < K; k++)
                    d[k] *= inv;
                d[y] -= grad_scale;
                total += mx + log(sum) - z[y];
            } else {
                double sum = 0.0;
                for (int k = 0; k < K; k++)
                    sum += expf(z[k] - mx);
                total += mx + log(sum) - z[y];
            }
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
