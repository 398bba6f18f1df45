/*
 * The CUDA backend's sequence ops: token embedding, positional add,
 * multi-head attention and pooling over positions, on activations
 * [N, T, B, D] (kernels.h, "sequences").
 *
 * Attention is cuBLAS strided-batched GEMMs and an own masked-softmax
 * kernel.  The packed qkv [N, T, B, 3D] puts head h of member b at column
 * b 3D + h Dh, which is not one stride in b H + h, so each GEMM is one
 * strided batch over the N samples (stride T B 3D in qkv, B H T T in probs)
 * per (member, head): B H calls of N matrices each, reading q, k, v and
 * writing out in place through leading dimensions, never copying.  cuBLAS
 * is column-major: a row-major [R, C] matrix with leading dimension ld is a
 * column-major [C, R] one with the same ld, so each call is the row-major
 * formula of kernels/cpu/fast_seq.c transposed.  The backward's dP is the
 * caller's scratch, laid out like probs.
 *
 * The other kernels follow the reference loops of kernels/cpu/ref_seq.c,
 * sums in double.  No result uses atomics: the embedding's gradient is one
 * thread per (member, feature) walking the positions in order, the
 * reference's order, so it is exact and the same run after run; a bad token
 * id sets a bit of the backend's flag (the one use of atomicOr, which orders
 * no result), and the gather and scatter kernels that follow see the bit and
 * leave their outputs untouched.
 */
#include <limits.h>
#include <math.h>

#include "cuda_internal.h"

#define FBC_THREADS 256

#define GRID_STRIDE(i, n)                                                                          \
    for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < (n);                        \
         i += (size_t)blockDim.x * gridDim.x)

/* Sum and maximum over a warp (every lane gets the result); fixed tree. */
__device__ static double seq_warp_sum(double v)
{
    for (int o = 16; o > 0; o >>= 1)
        v += __shfl_xor_sync(0xffffffffu, v, o);
    return v;
}

__device__ static float seq_warp_max(float v)
{
    for (int o = 16; o > 0; o >>= 1)
        v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
    return v;
}

/* Grid of warps (FBC_THREADS / 32 per block) for one warp per row. */
static unsigned warp_grid(const struct fbc_ctx *c, size_t rows)
{
    return fbc_grid(c, rows * 32, FBC_THREADS);
}

/* ---- embedding ------------------------------------------------------------------ */

/* Sets FBC_FLAG_TOKEN when an id of ids [P] is outside [0, V). */
__global__ static void k_check_ids(const int32_t *ids, size_t P, int V, int *flag)
{
    GRID_STRIDE(p, P)
    if (ids[p] < 0 || ids[p] >= V) atomicOr(flag, FBC_FLAG_TOKEN);
}

/* out [P, B, D] = table[b, ids[p], :]; nothing when a bad id was seen. */
__global__ static void k_embed_fwd(float *out, const int32_t *ids, const float *table, size_t P,
                                   int B, int V, int D, const int *flag)
{
    if (*flag & FBC_FLAG_TOKEN) return;
    GRID_STRIDE(i, P * B * D)
    {
        const size_t d = i % (size_t)D, b = i / (size_t)D % (size_t)B, p = i / ((size_t)D * B);
        out[i] = table[(b * V + ids[p]) * D + d];
    }
}

/* One thread per (b, d): dtable[b, ids[p], d] += dout[p, b, d], p ascending. */
__global__ static void k_embed_bwd(float *dtable, const float *dout, const int32_t *ids, size_t P,
                                   int B, int V, int D, const int *flag)
{
    if (*flag & FBC_FLAG_TOKEN) return;
    GRID_STRIDE(col, (size_t)B * D)
    {
        const size_t b = col / (size_t)D, d = col % (size_t)D;
        for (size_t p = 0; p < P; p++)
            dtable[(b * V + ids[p]) * D + d] += dout[(p * B + b) * D + d];
    }
}

/* Queues the id check; the caller's kernel then reads the flag. */
static bool check_ids(struct fbc_ctx *c, const int32_t *ids, size_t P, int V)
{
    k_check_ids<<<fbc_grid(c, P, FBC_THREADS), FBC_THREADS, 0, c->stream>>>(ids, P, V, c->flag);
    return FBC_LAUNCHED(c, "embedding (ids)");
}

extern "C" int fbc_embedding_forward(fb_backend *be, float *out, const int32_t *ids,
                                     const float *table, int N, int T, int B, int V, int D,
                                     char *msg, size_t msg_cap)
{
    struct fbc_ctx *c = fbc_begin(be);
    const size_t P = (size_t)N * T;
    if (!c || !check_ids(c, ids, P, V)) return FB_OK;
    k_embed_fwd<<<fbc_grid(c, P * B * D, FBC_THREADS), FBC_THREADS, 0, c->stream>>>(
        out, ids, table, P, B, V, D, c->flag);
    FBC_LAUNCHED(c, "embedding_forward");
    return FB_OK;
}

extern "C" int fbc_embedding_backward(fb_backend *be, float *dtable, const float *dout,
                                      const int32_t *ids, int N, int T, int B, int V, int D,
                                      char *msg, size_t msg_cap)
{
    struct fbc_ctx *c = fbc_begin(be);
    const size_t P = (size_t)N * T;
    if (!c || !check_ids(c, ids, P, V)) return FB_OK;
    k_embed_bwd<<<fbc_grid(c, (size_t)B * D, 128), 128, 0, c->stream>>>(dtable, dout, ids, P, B,
                                                                        V, D, c->flag);
    FBC_LAUNCHED(c, "embedding_backward");
    return FB_OK;
}

/* ---- positional ------------------------------------------------------------------ */

__global__ static void k_pos_fwd(float *out, const float *in, const float *pos, size_t total,
                                 int T, int B, int L, int D)
{
    GRID_STRIDE(i, total)
    {
        const size_t d = i % (size_t)D, b = i / (size_t)D % (size_t)B;
        const size_t t = i / ((size_t)D * B) % (size_t)T;
        out[i] = in[i] + pos[(b * L + t) * D + d];
    }
}

/* One thread per (t, b, d): the sum over n in double, n ascending. */
__global__ static void k_pos_bwd(float *din, float *dpos, const float *dout, int N, int T, int B,
                                 int L, int D)
{
    GRID_STRIDE(j, (size_t)T * B * D)
    {
        const size_t d = j % (size_t)D, b = j / (size_t)D % (size_t)B, t = j / ((size_t)D * B);
        const size_t TBD = (size_t)T * B * D;
        double s = 0.0;
        for (int n = 0; n < N; n++) {
            const size_t i = n * TBD + j;
            s += dout[i];
            if (din) din[i] += dout[i];
        }
        float *p = &dpos[(b * L + t) * D + d];
        *p = (float)(*p + s);
    }
}

extern "C" void fbc_positional_forward(fb_backend *be, float *out, const float *in,
                                       const float *pos, int N, int T, int B, int L, int D)
{
    struct fbc_ctx *c = fbc_begin(be);
    const size_t total = (size_t)N * T * B * D;
    if (!c || !total) return;
    k_pos_fwd<<<fbc_grid(c, total, FBC_THREADS), FBC_THREADS, 0, c->stream>>>(out, in, pos, total,
                                                                             T, B, L, D);
    FBC_LAUNCHED(c, "positional_forward");
}

extern "C" void fbc_positional_backward(fb_backend *be, float *din, float *dpos, const float *dout,
                                        int N, int T, int B, int L, int D)
{
    struct fbc_ctx *c = fbc_begin(be);
    if (!c || N == 0) return;
    k_pos_bwd<<<fbc_grid(c, (size_t)T * B * D, FBC_THREADS), FBC_THREADS, 0, c->stream>>>(
        din, dpos, dout, N, T, B, L, D);
    FBC_LAUNCHED(c, "positional_backward");
}

/* ---- attention ------------------------------------------------------------------- */

/* One warp per row r of probs [N B H T, T] holding the scaled scores: the
 * softmax over s <= t (causal) or every s, maximum subtracted, exp and sum
 * in double; masked entries become 0. */
__global__ static void k_softmax_rows(float *probs, size_t rows, int T, bool causal)
{
    const int lane = threadIdx.x & 31;
    for (size_t row = ((size_t)blockIdx.x * blockDim.x + threadIdx.x) / 32; row < rows;
         row += ((size_t)blockDim.x * gridDim.x) / 32) {
        float *z = probs + row * T;
        const int S = causal ? (int)(row % (size_t)T) + 1 : T;
        float mx = -INFINITY;
        for (int s = lane; s < S; s += 32)
            mx = fmaxf(mx, z[s]);
        mx = seq_warp_max(mx);
        double sum = 0.0;
        for (int s = lane; s < S; s += 32)
            sum += exp((double)z[s] - mx);
        sum = seq_warp_sum(sum);
        for (int s = lane; s < T; s += 32)
            z[s] = s < S ? (float)(exp((double)z[s] - mx) / sum) : 0.0f;
    }
}

/* One warp per row of dP (the scratch, [N B H T, T], overwritten in place):
 * dZ = P (dP - sum_s P dP), the dot in double. */
__global__ static void k_softmax_bwd_rows(float *dp, const float *probs, size_t rows, int T)
{
    const int lane = threadIdx.x & 31;
    for (size_t row = ((size_t)blockIdx.x * blockDim.x + threadIdx.x) / 32; row < rows;
         row += ((size_t)blockDim.x * gridDim.x) / 32) {
        float *g = dp + row * T;
        const float *p = probs + row * T;
        double dot = 0.0;
        for (int s = lane; s < T; s += 32)
            dot += (double)p[s] * g[s];
        dot = seq_warp_sum(dot);
        for (int s = lane; s < T; s += 32)
            g[s] = (float)(p[s] * (g[s] - dot));
    }
}

/* Leading dimensions are int in cuBLAS: 3 B D must fit. */
static bool attn_fits(struct fbc_ctx *c, int B, int D)
{
    if ((long long)3 * B * D <= INT_MAX) return true;
    fbc_fail(c, FB_ERR_UNSUPPORTED, "attention: 3*B*D = %lld exceeds cuBLAS's int range",
             (long long)3 * B * D);
    return false;
}

/* One strided batch over the N samples, row-major formula C = op(A) op(B)
 * written column-major (see the top of the file). */
static bool gemm_n(struct fbc_ctx *c, cublasOperation_t ta, cublasOperation_t tb, int m, int n,
                   int k, float alpha, const float *A, int lda, long long sa, const float *Bm,
                   int ldb, long long sb, float beta, float *C, int ldc, long long sc, int count)
{
    return FBC_BLAS(c, cublasSgemmStridedBatched(c->blas, ta, tb, m, n, k, &alpha, A, lda, sa, Bm,
                                                 ldb, sb, &beta, C, ldc, sc, count));
}

extern "C" size_t fbc_attention_scratch_floats(const fb_backend *be, int N, int T, int B, int H)
{
    return (size_t)N * B * H * T * T;
}

/*
 * Per (b, h), over n: probs^T = scale K Q^T (column-major [T, T], ld T),
 * then the softmax rows, then out_h^T [Dh, T] (ld B D) = V^T probs^T.
 */
extern "C" void fbc_attention_forward(fb_backend *be, float *out, float *probs, const float *qkv,
                                      int N, int T, int B, int D, int H, bool causal,
                                      float *scratch)
{
    struct fbc_ctx *c = fbc_begin(be);
    if (!c || N == 0 || !attn_fits(c, B, D)) return;
    const int Dh = D / H, ld = 3 * B * D;
    const float scale = (float)(1.0 / sqrt((double)Dh));
    const long long s_qkv = (long long)T * B * 3 * D, s_p = (long long)B * H * T * T;
    const long long s_out = (long long)T * B * D;
    for (int b = 0; b < B; b++)
        for (int h = 0; h < H; h++) {
            const float *q = qkv + (size_t)b * 3 * D + (size_t)h * Dh, *k = q + D;
            float *p = probs + ((size_t)b * H + h) * T * T;
            if (!gemm_n(c, CUBLAS_OP_T, CUBLAS_OP_N, T, T, Dh, scale, k, ld, s_qkv, q, ld, s_qkv,
                        0.0f, p, T, s_p, N))
                return;
        }
    const size_t rows = (size_t)N * B * H * T;
    k_softmax_rows<<<warp_grid(c, rows), FBC_THREADS, 0, c->stream>>>(probs, rows, T, causal);
    if (!FBC_LAUNCHED(c, "attention_forward (softmax)")) return;
    for (int b = 0; b < B; b++)
        for (int h = 0; h < H; h++) {
            const float *v = qkv + (size_t)b * 3 * D + 2 * (size_t)D + (size_t)h * Dh;
            const float *p = probs + ((size_t)b * H + h) * T * T;
            float *o = out + (size_t)b * D + (size_t)h * Dh;
            if (!gemm_n(c, CUBLAS_OP_N, CUBLAS_OP_N, Dh, T, T, 1.0f, v, ld, s_qkv, p, T, s_p, 0.0f,
                        o, B * D, s_out, N))
                return;
        }
}

/*
 * Per (b, h), over n, column-major (each X^T the column-major view of a
 * row-major X): dV^T += dO^T P;  dP^T = V dO^T (scratch);  dZ by rows;
 * dQ^T += scale K^T dZ^T;  dK^T += scale Q^T dZ.
 */
extern "C" void fbc_attention_backward(fb_backend *be, float *dqkv, const float *dout,
                                       const float *probs, const float *qkv, int N, int T, int B,
                                       int D, int H, float *scratch)
{
    struct fbc_ctx *c = fbc_begin(be);
    if (!c || N == 0 || !attn_fits(c, B, D)) return;
    const int Dh = D / H, ld = 3 * B * D, ldo = B * D;
    const float scale = (float)(1.0 / sqrt((double)Dh));
    const long long s_qkv = (long long)T * B * 3 * D, s_p = (long long)B * H * T * T;
    const long long s_out = (long long)T * B * D;
    for (int b = 0; b < B; b++)
        for (int h = 0; h < H; h++) {
            const size_t at = (size_t)b * 3 * D + (size_t)h * Dh;
            const float *v = qkv + at + 2 * (size_t)D, *dO = dout + (size_t)b * D + (size_t)h * Dh;
            const float *p = probs + ((size_t)b * H + h) * T * T;
            float *dp = scratch + ((size_t)b * H + h) * T * T, *dv = dqkv + at + 2 * (size_t)D;
            if (!gemm_n(c, CUBLAS_OP_N, CUBLAS_OP_T, Dh, T, T, 1.0f, dO, ldo, s_out, p, T, s_p,
                        1.0f, dv, ld, s_qkv, N) ||
                !gemm_n(c, CUBLAS_OP_T, CUBLAS_OP_N, T, T, Dh, 1.0f, v, ld, s_qkv, dO, ldo, s_out,
                        0.0f, dp, T, s_p, N))
                return;
        }
    const size_t rows = (size_t)N * B * H * T;
    k_softmax_bwd_rows<<<warp_grid(c, rows), FBC_THREADS, 0, c->stream>>>(scratch, probs, rows, T);
    if (!FBC_LAUNCHED(c, "attention_backward (softmax)")) return;
    for (int b = 0; b < B; b++)
        for (int h = 0; h < H; h++) {
            const size_t at = (size_t)b * 3 * D + (size_t)h * Dh;
            const float *q = qkv + at, *k = q + D;
            const float *dz = scratch + ((size_t)b * H + h) * T * T;
            float *dq = dqkv + at, *dk = dq + D;
            if (!gemm_n(c, CUBLAS_OP_N, CUBLAS_OP_N, Dh, T, T, scale, k, ld, s_qkv, dz, T, s_p,
                        1.0f, dq, ld, s_qkv, N) ||
                !gemm_n(c, CUBLAS_OP_N, CUBLAS_OP_T, Dh, T, T, scale, q, ld, s_qkv, dz, T, s_p,
                        1.0f, dk, ld, s_qkv, N))
                return;
        }
}

/* ---- pooling over positions --------------------------------------------------------- */

/* One thread per (n, b, d) of out [N, B, D]: the mean over the first
 * `last` positions (T for the mean, 1 for the first), t ascending. */
__global__ static void k_seq_pool_fwd(float *out, const float *in, int N, int T, int B, int D,
                                      int last)
{
    GRID_STRIDE(i, (size_t)N * B * D)
    {
        const size_t F = (size_t)B * D, n = i / F, f = i % F;
        double s = 0.0;
        for (int t = 0; t < last; t++)
            s += in[(n * T + t) * F + f];
        out[i] = (float)(s / last);
    }
}

/* din[n, t, :] += dout[n, :] / last for t < last. */
__global__ static void k_seq_pool_bwd(float *din, const float *dout, int N, int T, int B, int D,
                                      int last)
{
    const size_t F = (size_t)B * D;
    GRID_STRIDE(i, (size_t)N * last * F)
    {
        const size_t f = i % F, t = i / F % (size_t)last, n = i / (F * last);
        float *g = &din[(n * T + t) * F + f];
        *g = (float)(*g + (double)dout[n * F + f] / last);
    }
}

extern "C" void fbc_seq_pool_forward(fb_backend *be, fb_seq_pool kind, float *out, const float *in,
                                     int N, int T, int B, int D)
{
    struct fbc_ctx *c = fbc_begin(be);
    const size_t total = (size_t)N * B * D;
    if (!c || !total) return;
    k_seq_pool_fwd<<<fbc_grid(c, total, FBC_THREADS), FBC_THREADS, 0, c->stream>>>(
        out, in, N, T, B, D, kind == FB_SEQ_POOL_MEAN ? T : 1);
    FBC_LAUNCHED(c, "seq_pool_forward");
}

extern "C" void fbc_seq_pool_backward(fb_backend *be, fb_seq_pool kind, float *din,
                                      const float *dout, int N, int T, int B, int D)
{
    struct fbc_ctx *c = fbc_begin(be);
    const int last = kind == FB_SEQ_POOL_MEAN ? T : 1;
    const size_t total = (size_t)N * last * B * D;
    if (!c || !total) return;
    k_seq_pool_bwd<<<fbc_grid(c, total, FBC_THREADS), FBC_THREADS, 0, c->stream>>>(
        din, dout, N, T, B, D, last);
    FBC_LAUNCHED(c, "seq_pool_backward");
}
