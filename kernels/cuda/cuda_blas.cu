/*
 * The CUDA backend's GEMMs: the B-batched linear layer on cuBLAS and sgemm.
 *
 * cuBLAS is column-major; a row-major [R, C] matrix is a column-major
 * [C, R] one with the same leading dimension, so every call below is the
 * row-major formula of kernels.h transposed.  Members are strided batches:
 * member b's rows of out [N, B, O] start at out + b*O with leading dimension
 * B*O, its weights w [B, O, I] at w + b*O*I.  The shared first layer is one
 * wide GEMM against w viewed as [B*O, I].
 */
#include <limits.h>

#include "cuda_internal.h"

static const float fbc_one = 1.0f, fbc_zero = 0.0f;

/* Leading dimensions and batch strides are int in cuBLAS's 32-bit API; the
 * engine's sizes fit, but a product over the limit is an error, not a wrap. */
static bool fits_int(struct fbc_ctx *c, long long v, const char *what)
{
    if (v <= INT_MAX) return true;
    fbc_fail(c, FB_ERR_UNSUPPORTED, "linear: %s = %lld exceeds cuBLAS's int range", what, v);
    return false;
}

/*
 * out[N, B, O] = in[N, Bi, I] . w[B, O, I]^T + bias[B, O].
 * Not shared, per member b (column-major): out_b^T [O, N] (ld B*O) =
 * w_b [O, I] (stored [I, O], ld I, transposed) . in_b^T [I, N] (ld B*I).
 * Shared: out^T [B*O, N] = w^T . in^T [I, N] (ld I) in one GEMM.
 */
extern "C" void fbc_linear_forward(fb_backend *be, float *out, const float *in, const float *w,
                                   const float *bias, int N, int B, int I, int O, bool shared)
{
    struct fbc_ctx *c = fbc_begin(be);
    if (!c || N == 0) return;
    long long BO = (long long)B * O, BI = (long long)B * I;
    if (!fits_int(c, BO, "B*O") || !fits_int(c, BI, "B*I") ||
        !fits_int(c, (long long)O * I, "O*I"))
        return;
    if (shared) {
        if (!FBC_BLAS(c, cublasSgemm(c->blas, CUBLAS_OP_T, CUBLAS_OP_N, (int)BO, N, I, &fbc_one, w,
                                     I, in, I, &fbc_zero, out, (int)BO)))
            return;
    } else {
        if (!FBC_BLAS(c, cublasSgemmStridedBatched(c->blas, CUBLAS_OP_T, CUBLAS_OP_N, O, N, I,
                                                   &fbc_one, w, I, (long long)O * I, in, (int)BI,
                                                   I, &fbc_zero, out, (int)BO, O, B)))
            return;
    }
    if (bias) fbc_bias_add(c, out, bias, N, (int)BO, 1);
}

/*
 * dout [N, B, O]; accumulates (beta = 1):
 *   dw_b^T [I, O] += in_b^T [I, N] . dout_b [N, O]     (dout_b^T stored [O, N], ld B*O)
 *   din_b^T [I, N] += w_b^T [I, O] . dout_b^T [O, N]   (not shared)
 *   din^T [I, N] += w^T [I, B*O] . dout^T [B*O, N]     (shared: summed over members)
 *   dbias[B*O] += column sums of dout viewed [N, B*O]
 */
extern "C" void fbc_linear_backward(fb_backend *be, float *din, float *dw, float *dbias,
                                    const float *dout, const float *in, const float *w, int N,
                                    int B, int I, int O, bool shared)
{
    struct fbc_ctx *c = fbc_begin(be);
    if (!c || N == 0) return;
    long long BO = (long long)B * O, BI = (long long)B * I;
    if (!fits_int(c, BO, "B*O") || !fits_int(c, BI, "B*I") ||
        !fits_int(c, (long long)O * I, "O*I"))
        return;
    if (shared) {
        if (!FBC_BLAS(c, cublasSgemm(c->blas, CUBLAS_OP_N, CUBLAS_OP_T, I, (int)BO, N, &fbc_one,
                                     in, I, dout, (int)BO, &fbc_one, dw, I)))
            return;
        if (din && !FBC_BLAS(c, cublasSgemm(c->blas, CUBLAS_OP_N, CUBLAS_OP_N, I, N, (int)BO,
                                            &fbc_one, w, I, dout, (int)BO, &fbc_one, din, I)))
            return;
    } else {
        if (!FBC_BLAS(c, cublasSgemmStridedBatched(c->blas, CUBLAS_OP_N, CUBLAS_OP_T, I, O, N,
                                                   &fbc_one, in, (int)BI, I, dout, (int)BO, O,
                                                   &fbc_one, dw, I, (long long)O * I, B)))
            return;
        if (din && !FBC_BLAS(c, cublasSgemmStridedBatched(
                                    c->blas, CUBLAS_OP_N, CUBLAS_OP_N, I, N, O, &fbc_one, w, I,
                                    (long long)O * I, dout, (int)BO, O, &fbc_one, din, (int)BI, I,
                                    B)))
            return;
    }
    if (dbias) fbc_channel_sum_acc(c, dbias, dout, N, (int)BO, 1);
}

/* c[M, N] = a[M, K] . b[K, N] row-major: c^T [N, M] = b^T [N, K] . a^T [K, M]. */
extern "C" void fbc_sgemm(fb_backend *be, float *cm, const float *a, const float *b, int M, int N,
                          int K)
{
    struct fbc_ctx *c = fbc_begin(be);
    if (!c || M == 0 || N == 0) return;
    if (K == 0) {
        FBC_CUDA(c, cudaMemsetAsync(cm, 0, (size_t)M * N * sizeof *cm, c->stream));
        return;
    }
    FBC_BLAS(c, cublasSgemm(c->blas, CUBLAS_OP_N, CUBLAS_OP_N, N, M, K, &fbc_one, b, N, a, K,
                            &fbc_zero, cm, N));
}
