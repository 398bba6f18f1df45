/*
 * Fast sequence ops: token embedding, positional add, multi-head attention
 * and pooling over positions, on activations [N, T, B, D].
 *
 * Attention is GEMMs per (sample, member, head) on OpenBLAS, reading q, k and
 * v in place from the packed qkv [N, T, B, 3D] (head h of member b at sample
 * n is a [T, Dh] matrix at column b 3D + h Dh with leading dimension B 3D)
 * and writing out [N, T, B, D] in place the same way, so nothing is copied.
 * The (n, b, h) units are dealt out to OpenMP threads; each is a fixed
 * sequence of single-threaded OpenBLAS calls of one shape that writes only
 * its own columns, so results do not depend on the thread count.  Scores go
 * straight into probs; the backward's dP of a unit lives in its thread's
 * T x T slice of the scratch.
 *
 * The embedding's gradient is a scatter: members and feature ranges are
 * dealt out to threads, and each walks the positions in order, so every
 * element is added to in the reference's order and the result is exact.
 */
#include "cpu.h"

#include <cblas.h>
#include <math.h>
#include <string.h>

#include "errors.h"

/* Pieces of work smaller than this many floats moved are not worth a thread. */
#define SEQ_GRAIN 32768.0
/* A GEMM piece smaller than this many flops is not worth a thread. */
#define ATTN_GRAIN 1.5e6
/* Features summed at a time in a stack buffer of doubles. */
#define SEQ_CHUNK 256

/* ids [N*T]; table [B, V, D]; out [N, T, B, D]: one row copy per (position,
 * member), positions cut over threads. */
int fb_cpu_embedding_forward(fb_backend *be, float *out, const int32_t *ids, const float *table,
                             int N, int T, int B, int V, int D, char *msg, size_t msg_cap)
{
    const size_t P = (size_t)N * T;
    int rc = fb_cpu_check_ids(ids, P, V, "embedding", msg, msg_cap);
    if (rc != FB_OK) return rc;
    const int nt = fb_cpu_team(be, (double)P * B * D, SEQ_GRAIN);
#pragma omp parallel for num_threads(nt) if (nt > 1) schedule(static)
    for (size_t p = 0; p < P; p++)
        for (int b = 0; b < B; b++)
            memcpy(out + (p * B + b) * D, table + ((size_t)b * V + ids[p]) * D,
                   (size_t)D * sizeof(float));
    return FB_OK;
}

/* dout [N, T, B, D]; dtable [B, V, D]: pieces of (member, feature range),
 * each walking the positions in order (the reference's order per element). */
int fb_cpu_embedding_backward(fb_backend *be, float *dtable, const float *dout, const int32_t *ids,
                              int N, int T, int B, int V, int D, char *msg, size_t msg_cap)
{
    const size_t P = (size_t)N * T;
    int rc = fb_cpu_check_ids(ids, P, V, "embedding", msg, msg_cap);
    if (rc != FB_OK) return rc;
    const int nt = fb_cpu_team(be, (double)P * B * D, SEQ_GRAIN);
    const int R = B >= nt ? 1 : (nt + B - 1) / B;
#pragma omp parallel for num_threads(nt) if (nt > 1) schedule(static)
    for (int u = 0; u < B * R; u++) {
        const int b = u / R;
        size_t d0, d1;
        fb_cpu_split((size_t)D, u % R, R, 16, &d0, &d1);
        for (size_t p = 0; p < P; p++) {
            float *restrict g = dtable + ((size_t)b * V + ids[p]) * D;
            const float *restrict x = dout + (p * B + b) * D;
            for (size_t d = d0; d < d1; d++)
                g[d] += x[d];
        }
    }
    return FB_OK;
}

/* in, out [N, T, B, D]; pos [B, L, D]: rows (n, t) cut over threads. */
void fb_cpu_positional_forward(fb_backend *be, float *out, const float *in, const float *pos,
                               int N, int T, int B, int L, int D)
{
    const size_t rows = (size_t)N * T;
    const int nt = fb_cpu_team(be, (double)rows * B * D, SEQ_GRAIN);
#pragma omp parallel for num_threads(nt) if (nt > 1) schedule(static)
    for (size_t r = 0; r < rows; r++) {
        const int t = (int)(r % (size_t)T);
        for (int b = 0; b < B; b++) {
            const float *x = in + (r * B + b) * D, *restrict q = pos + ((size_t)b * L + t) * D;
            float *o = out + (r * B + b) * D; /* may equal x */
            for (int d = 0; d < D; d++)
                o[d] = x[d] + q[d];
        }
    }
}

/* dout, din [N, T, B, D]; dpos [B, L, D]: (t, b) pairs cut over threads,
 * the sum over n in double, n ascending as in the reference. */
void fb_cpu_positional_backward(fb_backend *be, float *din, float *dpos, const float *dout, int N,
                                int T, int B, int L, int D)
{
    const size_t TB = (size_t)T * B;
    const int nt = fb_cpu_team(be, (double)N * TB * D, SEQ_GRAIN);
#pragma omp parallel for num_threads(nt) if (nt > 1) schedule(static)
    for (size_t tb = 0; tb < TB; tb++) {
        const size_t t = tb / (size_t)B, b = tb % (size_t)B;
        for (int d0 = 0; d0 < D; d0 += SEQ_CHUNK) {
            const int dn = D - d0 < SEQ_CHUNK ? D - d0 : SEQ_CHUNK;
            double acc[SEQ_CHUNK] = {0};
            for (int n = 0; n < N; n++) {
                const size_t i = (((size_t)n * T + t) * B + b) * D + d0;
                const float *restrict x = dout + i;
                for (int d = 0; d < dn; d++)
                    acc[d] += x[d];
                if (din) {
                    float *restrict g = din + i;
                    for (int d = 0; d < dn; d++)
                        g[d] += x[d];
                }
            }
            float *restrict p = dpos + (b * L + t) * D + d0;
            for (int d = 0; d < dn; d++)
                p[d] = (float)(p[d] + acc[d]);
        }
    }
}

/* Threads times T x T floats: each thread's dP in the backward. */
size_t fb_cpu_attention_scratch_floats(const fb_backend *be, int N, int T, int B, int H)
{
    return (size_t)fb_cpu_threads(be) * T * T;
}

/* Row t of the scores z [T] (already scaled) becomes its softmax over s < S,
 * max subtracted, sum in double; z[S..T) becomes 0 (masked).  Each loop is
 * one that vectorises: the max over eight lanes (a max is exact in any
 * order), then the exponentials, then their sum with fb_cpu_sum's fixed
 * order (a running double sum in the exponentials' loop would be one long
 * chain of dependent adds and keep that loop scalar). */
FB_CPU_VECTOR_CLONES
static void softmax_row(float *restrict z, int S, int T)
{
    const float mx = fb_cpu_row_max(z, S);
    int s;
    for (s = 0; s < S; s++)
        z[s] = fb_cpu_expf(z[s] - mx);
    const float inv = (float)(1.0 / fb_cpu_sum(z, (size_t)S));
    for (s = 0; s < S; s++)
        z[s] *= inv;
    for (s = S; s < T; s++)
        z[s] = 0.0f;
}

/*
 * qkv [N, T, B, 3D]; probs [N, B, H, T, T]; out [N, T, B, D].  Per unit
 * u = (n, b, h), with Q, K, V its [T, Dh] views (ld B 3D):
 *   P = scale Q K^T (into probs), masked softmax of each row, O = P V.
 */
void fb_cpu_attention_forward(fb_backend *be, float *out, float *probs, const float *qkv, int N,
                              int T, int B, int D, int H, bool causal, float *scratch)
{
    const int Dh = D / H, ld = 3 * B * D, units = N * B * H;
    const float scale = (float)(1.0 / sqrt((double)Dh));
    const int nt = fb_cpu_team(be, 4.0 * units * (double)T * T * Dh, ATTN_GRAIN);
#pragma omp parallel for num_threads(nt) if (nt > 1) schedule(static)
    for (int u = 0; u < units; u++) {
        const int n = u / (B * H), b = u / H % B, h = u % H;
        const float *q = qkv + ((size_t)n * T * B + b) * 3 * D + (size_t)h * Dh;
        const float *k = q + D, *v = q + 2 * D;
        float *p = probs + (size_t)u * T * T;
        float *o = out + ((size_t)n * T * B + b) * D + (size_t)h * Dh;
        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, T, T, Dh, scale, q, ld, k, ld, 0.0f,
                    p, T);
        for (int t = 0; t < T; t++)
            softmax_row(p + (size_t)t * T, causal ? t + 1 : T, T);
        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, T, Dh, T, 1.0f, p, T, v, ld, 0.0f,
                    o, B * D);
    }
}

/*
 * dout [N, T, B, D]; probs [N, B, H, T, T]; qkv, dqkv [N, T, B, 3D].  Per
 * unit, with dO its [T, Dh] view of dout (ld B D) and S its thread's scratch:
 *   dV += P^T dO;  S = dO V^T;  S = P * (S - rowsum(P * S));
 *   dQ += scale S K;  dK += scale S^T Q.
 */
void fb_cpu_attention_backward(fb_backend *be, float *dqkv, const float *dout, const float *probs,
                               const float *qkv, int N, int T, int B, int D, int H,
                               float *scratch)
{
    const int Dh = D / H, ld = 3 * B * D, units = N * B * H;
    const float scale = (float)(1.0 / sqrt((double)Dh));
    const int nt = fb_cpu_team(be, 8.0 * units * (double)T * T * Dh, ATTN_GRAIN);
    FB_ASSERT(scratch != NULL);
#pragma omp parallel num_threads(nt) if (nt > 1)
    {
        float *S = scratch + (size_t)omp_get_thread_num() * T * T;
#pragma omp for schedule(static)
        for (int u = 0; u < units; u++) {
            const int n = u / (B * H), b = u / H % B, h = u % H;
            const size_t at = ((size_t)n * T * B + b) * 3 * D + (size_t)h * Dh;
            const float *q = qkv + at, *k = q + D, *v = q + 2 * D;
            float *dq = dqkv + at, *dk = dq + D, *dv = dq + 2 * D;
            const float *p = probs + (size_t)u * T * T;
            const float *dO = dout + ((size_t)n * T * B + b) * D + (size_t)h * Dh;
            cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, T, Dh, T, 1.0f, p, T, dO, B * D,
                        1.0f, dv, ld);
            cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, T, T, Dh, 1.0f, dO, B * D, v, ld,
                        0.0f, S, T);
            for (int t = 0; t < T; t++) {
                const float *restrict pr = p + (size_t)t * T;
                float *restrict sr = S + (size_t)t * T;
                const float dot = (float)fb_cpu_dot(pr, sr, (size_t)T);
                for (int s = 0; s < T; s++)
                    sr[s] = pr[s] * (sr[s] - dot);
            }
            cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, T, Dh, T, scale, S, T, k, ld,
                        1.0f, dq, ld);
            cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, T, Dh, T, scale, S, T, q, ld,
                        1.0f, dk, ld);
        }
    }
}

/* in [N, T, B, D]; out [N, B, D]: samples cut over threads; the mean sums
 * over t in double, t ascending, in chunks of features. */
void fb_cpu_seq_pool_forward(fb_backend *be, fb_seq_pool kind, float *out, const float *in, int N,
                             int T, int B, int D)
{
    const size_t F = (size_t)B * D;
    const int last = kind == FB_SEQ_POOL_MEAN ? T : 1;
    const int nt = fb_cpu_team(be, (double)N * last * F, SEQ_GRAIN);
#pragma omp parallel for num_threads(nt) if (nt > 1) schedule(static)
    for (int n = 0; n < N; n++) {
        const float *x = in + (size_t)n * T * F;
        float *restrict o = out + (size_t)n * F;
        if (kind == FB_SEQ_POOL_FIRST) {
            memcpy(o, x, F * sizeof(float));
            continue;
        }
        for (size_t f0 = 0; f0 < F; f0 += SEQ_CHUNK) {
            const size_t fn = F - f0 < SEQ_CHUNK ? F - f0 : SEQ_CHUNK;
            double acc[SEQ_CHUNK] = {0};
            for (int t = 0; t < T; t++) {
                const float *restrict r = x + (size_t)t * F + f0;
                for (size_t f = 0; f < fn; f++)
                    acc[f] += r[f];
            }
            for (size_t f = 0; f < fn; f++)
                o[f0 + f] = (float)(acc[f] / T);
        }
    }
}

/* dout [N, B, D]; din [N, T, B, D]: rows (n, t) cut over threads. */
void fb_cpu_seq_pool_backward(fb_backend *be, fb_seq_pool kind, float *din, const float *dout,
                              int N, int T, int B, int D)
{
    const size_t F = (size_t)B * D;
    const int last = kind == FB_SEQ_POOL_MEAN ? T : 1;
    const int nt = fb_cpu_team(be, (double)N * last * F, SEQ_GRAIN);
#pragma omp parallel for collapse(2) num_threads(nt) if (nt > 1) schedule(static)
    for (int n = 0; n < N; n++)
        for (int t = 0; t < last; t++) {
            float *restrict g = din + ((size_t)n * T + t) * F;
            const float *restrict x = dout + (size_t)n * F;
            for (size_t f = 0; f < F; f++)
                g[f] = (float)(g[f] + (double)x[f] / last);
        }
}
