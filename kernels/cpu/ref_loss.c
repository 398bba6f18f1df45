/*
 * Reference losses: softmax cross-entropy and mean squared error, per member.
 */
#include "cpu.h"

#include <math.h>

/*
 * logits, dlogits [N, B, K]; labels [N] in [0, K); loss, correct [B].
 * Per row (n, b), stable in double: lse = max + log sum exp(z - max),
 *   loss[b] = mean over n of (lse - z[label]);
 *   dlogits = (softmax(z) - onehot(label)) grad_scale   (if not NULL);
 *   correct[b] = count of rows whose first maximum is the label (if not NULL).
 */
void fb_ref_softmax_xent(fb_backend *be, float *loss, float *dlogits, float *correct,
                         const float *logits, const int32_t *labels, int N, int B, int K,
                         float grad_scale)
{
    for (int b = 0; b < B; b++) {
        double total = 0.0;
        int hits = 0;
        for (int n = 0; n < N; n++) {
            const float *z = logits + ((size_t)n * B + b) * K;
            int y = labels[n];
            FB_ASSERT(y >= 0 && y < K);
            int arg = 0;
            for (int k = 1; k < K; k++)
                if (z[k] > z[arg]) arg = k;
            double mx = z[arg], sum = 0.0;
            for (int k = 0; k < K; k++)
                sum += exp(z[k] - mx);
            double lse = mx + log(sum);
            total += lse - z[y];
            hits += arg == y;
            if (dlogits) {
                float *d = dlogits + ((size_t)n * B + b) * K;
                for (int k = 0; k < K; k++)
                    d[k] = (float)((exp(z[k] - mx) / sum - (k == y ? 1.0 : 0.0)) * grad_scale);
            }
        }
        loss[b] = (float)(total / N);
        if (correct) correct[b] = (float)hits;
    }
}

/*
 * pred, dpred [N, B, K]; target [N, K]; loss [B].
 *   loss[b] = mean over n, k of (pred - target)^2
 *   dpred = 2 (pred - target) grad_scale / K   (if not NULL)
 */
void fb_ref_mse(fb_backend *be, float *loss, float *dpred, const float *pred, const float *target,
                int N, int B, int K, float grad_scale)
{
    for (int b = 0; b < B; b++) {
        double total = 0.0;
        for (int n = 0; n < N; n++)
            for (int k = 0; k < K; k++) {
                size_t i = ((size_t)n * B + b) * K + k;
                double d = (double)pred[i] - target[(size_t)n * K + k];
                total += d * d;
                if (dpred) dpred[i] = (float)(2.0 * d * grad_scale / K);
            }
        loss[b] = (float)(total / ((double)N * K));
    }
}
