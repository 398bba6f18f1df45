/*
 * Fast linear layer and GEMM on OpenBLAS.
 *
 * The [N, B, F] layout lets every member's activations be read in place: the
 * member-b matrix [N, F] starts at b*F with leading dimension B*F.  Each
 * member's forward and weight gradient is one GEMM of exactly the shape a
 * solo job of that member runs, shared input or not (shared, the member reads
 * the one [N, I] input): OpenBLAS picks its kernel by shape (AVX-512 builds
 * have a separate kernel for small matrices, which sums in another order), so
 * one wide GEMM over all members' weights would give a member results that
 * depend on B.  This way a member's trajectory is the same at every B.  The
 * shared input's gradient (the sum over members) stays one GEMM.
 *
 * Threads (cpu.h): members are dealt out to threads, and a member is cut into
 * row ranges only when there are fewer members than threads; the shared
 * input's gradient is cut into sample-row ranges.  Every piece is an ordinary
 * single-threaded OpenBLAS call on a sub-matrix, so no two threads write the
 * same element.
 */
#include "cpu.h"

#include <cblas.h>
/* cblas.h pulls in <complex.h>, whose macro I would shadow our dimension I. */
#undef I
#include <pthread.h>
#include <string.h>

/* A GEMM piece smaller than this many flops is not worth a thread. */
#define GEMM_GRAIN 1.5e6

static void blas_single_threaded(void)
{
    openblas_set_num_threads(1);
}

/* OpenBLAS runs inside our threads, never with its own (cpu.h, "Threads"). */
void fb_cpu_blas_init(void)
{
    static pthread_once_t once = PTHREAD_ONCE_INIT;
    pthread_once(&once, blas_single_threaded);
}

/* Records nothing beyond be->threads (done by the caller): OpenBLAS stays at
 * one thread and the fast ops size their OpenMP teams from be->threads. */
void fb_cpu_set_threads(fb_backend *be, int n)
{
    (void)be;
    (void)n;
    fb_cpu_blas_init();
}

/* Pieces to cut a not-shared layer into: B members, each in R row ranges. */
static int row_ranges(int B, int nt)
{
    return B >= nt ? 1 : (nt + B - 1) / B;
}

/*
 * out[N, B, O] = in[N, Bi, I] . w[B, O, I]^T + bias[B, O].
 * Rows of out start as the bias, then GEMMs add (beta = 1).
 */
void fb_cpu_linear_forward(fb_backend *be, float *out, const float *in, const float *w,
                           const float *bias, int N, int B, int I, int O, bool shared)
{
    const size_t BO = (size_t)B * O;
    const float beta = bias ? 1.0f : 0.0f;
    if (N == 0) return;
    const int nt = fb_cpu_team(be, 2.0 * N * (double)BO * I, GEMM_GRAIN);
    /* member b's input rows: its own columns of [N, B, I], or the one [N, I] */
    const size_t in_ld = shared ? (size_t)I : (size_t)B * I, in_b = shared ? 0 : (size_t)I;
    const int R = row_ranges(B, nt);
#pragma omp parallel for num_threads(nt) if (nt > 1) schedule(static)
    for (int t = 0; t < B * R; t++) {
        const int b = t / R;
        size_t n0, n1;
        fb_cpu_split((size_t)N, t % R, R, 1, &n0, &n1);
        if (n1 <= n0) continue;
        float *o = out + n0 * BO + (size_t)b * O;
        if (bias)
            for (size_t n = n0; n < n1; n++)
                memcpy(o + (n - n0) * BO, bias + (size_t)b * O, (size_t)O * sizeof(float));
        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, (int)(n1 - n0), O, I, 1.0f,
                    in + n0 * in_ld + b * in_b, (int)in_ld, w + (size_t)b * O * I, I, beta, o,
                    (int)BO);
    }
}

/* dbias[c0, c1) += column sums of dout [N, BO] over that column range. */
static void bias_grad(float *restrict db, const float *restrict dout, int N, size_t BO, size_t c0,
                      size_t c1)
{
    for (int n = 0; n < N; n++) {
        const float *restrict d = dout + (size_t)n * BO;
        for (size_t j = c0; j < c1; j++)
            db[j] += d[j];
    }
}

/*
 * dout[N, B, O], in[N, Bi, I], w[B, O, I]; accumulates
 *   dw_b[O, I] += dout_b^T . in_b,  din_b[N, I] += dout_b . w_b,
 *   dbias[B*O] += column sums of dout viewed as [N, B*O].
 * Shared, in_b is the one input [N, I] and din[N, I] += dout . w is one GEMM
 * over all members (their sum), w viewed as [B*O, I].
 */
void fb_cpu_linear_backward(fb_backend *be, float *din, float *dw, float *dbias,
                            const float *dout, const float *in, const float *w, int N, int B, int I,
                            int O, bool shared)
{
    const size_t BO = (size_t)B * O;
    if (N == 0) return;
    const int nt = fb_cpu_team(be, (din ? 4.0 : 2.0) * N * (double)BO * I, GEMM_GRAIN);
    /* member b's input rows: its own columns of [N, B, I], or the one [N, I] */
    const size_t in_ld = shared ? (size_t)I : (size_t)B * I, in_b = shared ? 0 : (size_t)I;
    const int R = row_ranges(B, nt);
#pragma omp parallel num_threads(nt) if (nt > 1)
    {
        if (dbias) {
            size_t c0, c1;
            fb_cpu_split(BO, omp_get_thread_num(), omp_get_num_threads(), 16, &c0, &c1);
            bias_grad(dbias, dout, N, BO, c0, c1);
        }
        /* dw_b rows [o0, o1) += dout_b[:, o0:o1]^T . in_b */
#pragma omp for schedule(static) nowait
        for (int t = 0; t < B * R; t++) {
            const int b = t / R;
            size_t o0, o1;
            fb_cpu_split((size_t)O, t % R, R, 1, &o0, &o1);
            if (o1 > o0)
                cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, (int)(o1 - o0), I, N, 1.0f,
                            dout + (size_t)b * O + o0, (int)BO, in + b * in_b, (int)in_ld, 1.0f,
                            dw + ((size_t)b * O + o0) * I, I);
        }
        /* shared: din sample rows [n0, n1) of [N, I] += dout[n0:n1] . w, w as [B*O, I] */
        if (din && shared) {
            size_t n0, n1;
            fb_cpu_split((size_t)N, omp_get_thread_num(), omp_get_num_threads(), 1, &n0, &n1);
            if (n1 > n0)
                cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, (int)(n1 - n0), I, (int)BO,
                            1.0f, dout + n0 * BO, (int)BO, w, I, 1.0f, din + n0 * I, I);
        }
        /* din_b rows [n0, n1) += dout_b[n0:n1] . w_b */
        if (din && !shared) {
#pragma omp for schedule(static) nowait
            for (int t = 0; t < B * R; t++) {
                const int b = t / R;
                size_t n0, n1;
                fb_cpu_split((size_t)N, t % R, R, 1, &n0, &n1);
                if (n1 > n0)
                    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, (int)(n1 - n0), I, O,
                                1.0f, dout + n0 * BO + (size_t)b * O, (int)BO,
                                w + (size_t)b * O * I, I, 1.0f, din + n0 * B * I + (size_t)b * I,
                                B * I);
            }
        }
    }
}

/* c[M, N] = a[M, K] . b[K, N], row-major, with cblas_sgemm, cut into row
 * ranges over the backend's threads. */
void fb_cpu_sgemm(fb_backend *be, float *c, const float *a, const float *b, int M, int N, int K)
{
    if (M == 0 || N == 0) return;
    if (K == 0) {
        memset(c, 0, (size_t)M * N * sizeof(float));
        return;
    }
    const int nt = fb_cpu_team(be, 2.0 * M * (double)N * K, GEMM_GRAIN);
#pragma omp parallel num_threads(nt) if (nt > 1)
    {
        size_t r0, r1;
        fb_cpu_split((size_t)M, omp_get_thread_num(), omp_get_num_threads(), 1, &r0, &r1);
        if (r1 > r0)
            cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, (int)(r1 - r0), N, K, 1.0f,
                        a + r0 * K, K, b, N, 0.0f, c + r0 * N, N);
    }
}
