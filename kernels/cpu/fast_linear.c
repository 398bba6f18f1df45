/*
 * Fast linear layer and GEMM on OpenBLAS.
 *
 * The [N, B, F] layout lets every member's activations be read in place: the
 * member-b matrix [N, F] starts at b*F with leading dimension B*F.  Not
 * shared, each member is one GEMM on those strided views; shared, the weights
 * of all members are one [B*O, I] matrix and the whole layer is one GEMM.
 */
#include "cpu.h"

#include <cblas.h>
/* cblas.h pulls in <complex.h>, whose macro I would shadow our dimension I. */
#undef I
#include <string.h>

/* Threads OpenBLAS may use; n = 0 means all online processors. */
void fb_cpu_set_threads(fb_backend_t *be, int n)
{
    openblas_set_num_threads(n > 0 ? n : openblas_get_num_procs());
}

/*
 * out[N, B, O] = in[N, Bi, I] . w[B, O, I]^T + bias[B, O].
 * Rows of out start as the bias ([B*O] is one row of out), then GEMMs add.
 */
void fb_cpu_linear_forward(fb_backend_t *be, float *out, const float *in, const float *w,
                           const float *bias, int N, int B, int I, int O, bool shared)
{
    const size_t BO = (size_t)B * O;
    if (N == 0) return;
    if (bias)
        for (int n = 0; n < N; n++)
            memcpy(out + (size_t)n * BO, bias, BO * sizeof(float));
    const float beta = bias ? 1.0f : 0.0f;
    if (shared) {
        /* out [N, B*O] = in [N, I] . w[B*O, I]^T */
        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, N, (int)BO, I, 1.0f, in, I, w, I, beta,
                    out, (int)BO);
        return;
    }
    for (int b = 0; b < B; b++)
        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, N, O, I, 1.0f, in + (size_t)b * I,
                    B * I, w + (size_t)b * O * I, I, beta, out + (size_t)b * O, (int)BO);
}

/*
 * dout[N, B, O], in[N, Bi, I], w[B, O, I]; accumulates
 *   dw_b[O, I] += dout_b^T . in_b,  din_b[N, I] += dout_b . w_b,
 *   dbias[B*O] += column sums of dout viewed as [N, B*O].
 * Shared: dw[B*O, I] += dout^T . in and din[N, I] += dout . w, one GEMM each.
 */
void fb_cpu_linear_backward(fb_backend_t *be, float *din, float *dw, float *dbias,
                            const float *dout, const float *in, const float *w, int N, int B, int I,
                            int O, bool shared)
{
    const size_t BO = (size_t)B * O;
    if (N == 0) return;
    if (dbias) {
        float *restrict db = dbias;
        for (int n = 0; n < N; n++) {
            const float *restrict d = dout + (size_t)n * BO;
            for (size_t j = 0; j < BO; j++)
                db[j] += d[j];
        }
    }
    if (shared) {
        cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, (int)BO, I, N, 1.0f, dout, (int)BO, in,
                    I, 1.0f, dw, I);
        if (din)
            cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, N, I, (int)BO, 1.0f, dout,
                        (int)BO, w, I, 1.0f, din, I);
        return;
    }
    for (int b = 0; b < B; b++) {
        const float *dout_b = dout + (size_t)b * O, *in_b = in + (size_t)b * I;
        const float *w_b = w + (size_t)b * O * I;
        cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, O, I, N, 1.0f, dout_b, (int)BO, in_b,
                    B * I, 1.0f, dw + (size_t)b * O * I, I);
        if (din)
            cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, N, I, O, 1.0f, dout_b, (int)BO,
                        w_b, I, 1.0f, din + (size_t)b * I, B * I);
    }
}

/* c[M, N] = a[M, K] . b[K, N], row-major, with cblas_sgemm. */
void fb_cpu_sgemm(fb_backend_t *be, float *c, const float *a, const float *b, int M, int N, int K)
{
    if (M == 0 || N == 0) return;
    if (K == 0) {
        memset(c, 0, (size_t)M * N * sizeof(float));
        return;
    }
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, M, N, K, 1.0f, a, K, b, N, 0.0f, c, N);
}
