/*
 * Reference linear layer and GEMM: one dot product per output, in double.
 */
#include "cpu.h"

/*
 * out[N, B, O] = in[N, Bi, I] . w[B, O, I]^T + bias[B, O]
 * Bi = shared ? 1 : B; member b reads input slot (shared ? 0 : b).
 */
void fb_ref_linear_forward(fb_backend *be, float *out, const float *in, const float *w,
                           const float *bias, int N, int B, int I, int O, bool shared)
{
    int Bi = shared ? 1 : B;
    for (int n = 0; n < N; n++) {
        for (int b = 0; b < B; b++) {
            const float *x = in + ((size_t)n * Bi + (shared ? 0 : b)) * I;
            for (int o = 0; o < O; o++) {
                const float *wr = w + ((size_t)b * O + o) * I;
                double acc = bias ? bias[(size_t)b * O + o] : 0.0;
                for (int i = 0; i < I; i++)
                    acc += (double)x[i] * wr[i];
                out[((size_t)n * B + b) * O + o] = (float)acc;
            }
        }
    }
}

/*
 * dout[N, B, O], in[N, Bi, I], w[B, O, I]:
 *   din[N, Bi, I] += sum over the members reading slot bi and o of dout . w
 *   dw[B, O, I]   += sum over n of dout[n, b, o] in[n, bi, i]
 *   dbias[B, O]   += sum over n of dout[n, b, o]
 * din and dbias may be NULL.
 */
void fb_ref_linear_backward(fb_backend *be, float *din, float *dw, float *dbias,
                            const float *dout, const float *in, const float *w, int N, int B, int I,
                            int O, bool shared)
{
    int Bi = shared ? 1 : B;
    if (din) {
        for (int n = 0; n < N; n++) {
            for (int bi = 0; bi < Bi; bi++) {
                int b0 = shared ? 0 : bi, b1 = shared ? B : bi + 1;
                for (int i = 0; i < I; i++) {
                    double acc = 0.0;
                    for (int b = b0; b < b1; b++)
                        for (int o = 0; o < O; o++)
                            acc += (double)dout[((size_t)n * B + b) * O + o] *
                                   w[((size_t)b * O + o) * I + i];
                    float *d = &din[((size_t)n * Bi + bi) * I + i];
                    *d = (float)(*d + acc);
                }
            }
        }
    }
    for (int b = 0; b < B; b++) {
        int bi = shared ? 0 : b;
        for (int o = 0; o < O; o++) {
            for (int i = 0; i < I; i++) {
                double acc = 0.0;
                for (int n = 0; n < N; n++)
                    acc += (double)dout[((size_t)n * B + b) * O + o] *
                           in[((size_t)n * Bi + bi) * I + i];
                float *d = &dw[((size_t)b * O + o) * I + i];
                *d = (float)(*d + acc);
            }
            if (dbias) {
                double acc = 0.0;
                for (int n = 0; n < N; n++)
                    acc += dout[((size_t)n * B + b) * O + o];
                dbias[(size_t)b * O + o] = (float)(dbias[(size_t)b * O + o] + acc);
            }
        }
    }
}

/* c[M, N] = a[M, K] . b[K, N], row-major. */
void fb_ref_sgemm(fb_backend *be, float *c, const float *a, const float *b, int M, int N, int K)
{
    for (int m = 0; m < M; m++) {
        for (int n = 0; n < N; n++) {
            double acc = 0.0;
            for (int k = 0; k < K; k++)
                acc += (double)a[(size_t)m * K + k] * b[(size_t)k * N + n];
            c[(size_t)m * N + n] = (float)acc;
        }
    }
}
