/*
 * Reference sequence ops: token embedding, learned positional add,
 * multi-head self-attention and pooling over positions.  Sequence
 * activations are [N, T, B, D] (kernels.h, "sequences"); sums in double.
 */
#include "cpu.h"

#include <math.h>
#include <stdio.h>

#include "errors.h"

/* FB_OK when every id of ids [n_ids] is in [0, V); else FB_ERR_DATA with the
 * first bad position in msg.  Shared by both CPU backends. */
int fb_cpu_check_ids(const int32_t *ids, size_t n_ids, int V, const char *op, char *msg,
                     size_t msg_cap)
{
    for (size_t i = 0; i < n_ids; i++)
        if (ids[i] < 0 || ids[i] >= V) {
            if (msg && msg_cap)
                snprintf(msg, msg_cap, "%s: token id %d at position %zu is outside [0, %d)", op,
                         (int)ids[i], i, V);
            return FB_ERR_DATA;
        }
    return FB_OK;
}

/*
 * ids [N*T]; table [B, V, D]; out [N, T, B, D]:
 *   out[n, t, b, d] = table[b, ids[n T + t], d].
 */
int fb_ref_embedding_forward(fb_backend *be, float *out, const int32_t *ids, const float *table,
                             int N, int T, int B, int V, int D, char *msg, size_t msg_cap)
{
    int rc = fb_cpu_check_ids(ids, (size_t)N * T, V, "embedding", msg, msg_cap);
    if (rc != FB_OK) return rc;
    for (size_t p = 0; p < (size_t)N * T; p++)
        for (int b = 0; b < B; b++)
            for (int d = 0; d < D; d++)
                out[(p * B + b) * D + d] = table[((size_t)b * V + ids[p]) * D + d];
    return FB_OK;
}

/*
 * dout [N, T, B, D]; ids [N*T]; dtable [B, V, D]:
 *   for p = 0, 1, ... N T - 1 in order: dtable[b, ids[p], d] += dout[p, b, d]
 * (float adds in position order: the order every backend keeps).
 */
int fb_ref_embedding_backward(fb_backend *be, float *dtable, const float *dout, const int32_t *ids,
                              int N, int T, int B, int V, int D, char *msg, size_t msg_cap)
{
    int rc = fb_cpu_check_ids(ids, (size_t)N * T, V, "embedding", msg, msg_cap);
    if (rc != FB_OK) return rc;
    for (size_t p = 0; p < (size_t)N * T; p++)
        for (int b = 0; b < B; b++)
            for (int d = 0; d < D; d++)
                dtable[((size_t)b * V + ids[p]) * D + d] += dout[(p * B + b) * D + d];
    return FB_OK;
}

/*
 * in, out [N, T, B, D]; pos [B, L, D]:
 *   out[n, t, b, d] = in[n, t, b, d] + pos[b, t, d].
 */
void fb_ref_positional_forward(fb_backend *be, float *out, const float *in, const float *pos,
                               int N, int T, int B, int L, int D)
{
    for (int n = 0; n < N; n++)
        for (int t = 0; t < T; t++)
            for (int b = 0; b < B; b++)
                for (int d = 0; d < D; d++) {
                    size_t i = (((size_t)n * T + t) * B + b) * D + d;
                    out[i] = in[i] + pos[((size_t)b * L + t) * D + d];
                }
}

/*
 * dout, din [N, T, B, D]; dpos [B, L, D]:
 *   din += dout (if not NULL);  dpos[b, t, d] += sum over n of dout[n, t, b, d].
 */
void fb_ref_positional_backward(fb_backend *be, float *din, float *dpos, const float *dout, int N,
                                int T, int B, int L, int D)
{
    for (int t = 0; t < T; t++)
        for (int b = 0; b < B; b++)
            for (int d = 0; d < D; d++) {
                double s = 0.0;
                for (int n = 0; n < N; n++) {
                    size_t i = (((size_t)n * T + t) * B + b) * D + d;
                    s += dout[i];
                    if (din) din[i] += dout[i];
                }
                float *p = &dpos[((size_t)b * L + t) * D + d];
                *p = (float)(*p + s);
            }
}

/* Index of qkv [N, T, B, 3D]: part 0 (q), 1 (k) or 2 (v), column c of D. */
static size_t qkv_at(int n, int t, int b, int part, int c, int T, int B, int D)
{
    return (((size_t)n * T + t) * B + b) * 3 * (size_t)D + (size_t)part * D + c;
}

/*
 * qkv [N, T, B, 3D]; probs [N, B, H, T, T]; out [N, T, B, D]; Dh = D / H.
 * For each n, b, h, t (a row of probs):
 *   z_s = (q_t . k_s) / sqrt(Dh) for s <= t (causal) or every s;
 *   probs_s = exp(z_s - max z) / sum exp(z - max z), 0 where masked;
 *   out[n, t, b, h Dh + j] = sum over s of probs_s v_s[h Dh + j].
 */
void fb_ref_attention_forward(fb_backend *be, float *out, float *probs, const float *qkv, int N,
                              int T, int B, int D, int H, bool causal, float *scratch)
{
    const int Dh = D / H;
    const double scale = 1.0 / sqrt((double)Dh);
    double *z = malloc((size_t)T * sizeof *z);
    FB_ASSERT(z != NULL);
    for (int n = 0; n < N; n++)
        for (int b = 0; b < B; b++)
            for (int h = 0; h < H; h++)
                for (int t = 0; t < T; t++) {
                    float *p = probs + ((((size_t)n * B + b) * H + h) * T + t) * T;
                    const int S = causal ? t + 1 : T;
                    double mx = -INFINITY, sum = 0.0;
                    for (int s = 0; s < S; s++) {
                        double dot = 0.0;
                        for (int j = 0; j < Dh; j++)
                            dot += (double)qkv[qkv_at(n, t, b, 0, h * Dh + j, T, B, D)] *
                                   qkv[qkv_at(n, s, b, 1, h * Dh + j, T, B, D)];
                        z[s] = dot * scale;
                        if (z[s] > mx) mx = z[s];
                    }
                    for (int s = 0; s < S; s++)
                        sum += exp(z[s] - mx);
                    for (int s = 0; s < T; s++)
                        p[s] = s < S ? (float)(exp(z[s] - mx) / sum) : 0.0f;
                    for (int j = 0; j < Dh; j++) {
                        double acc = 0.0;
                        for (int s = 0; s < S; s++)
                            acc += (double)p[s] * qkv[qkv_at(n, s, b, 2, h * Dh + j, T, B, D)];
                        out[(((size_t)n * T + t) * B + b) * D + h * Dh + j] = (float)acc;
                    }
                }
    free(z);
}

/*
 * dout [N, T, B, D]; probs [N, B, H, T, T]; qkv, dqkv [N, T, B, 3D].  For each
 * n, b, h, with P = probs, do = dout's head columns, scale = 1 / sqrt(Dh):
 *   dP[t, s] = do_t . v_s;   dZ[t, s] = P[t, s] (dP[t, s] - sum_r P[t, r] dP[t, r]);
 *   dq_t += scale sum_s dZ[t, s] k_s;   dk_s += scale sum_t dZ[t, s] q_t;
 *   dv_s += sum_t P[t, s] do_t.
 */
void fb_ref_attention_backward(fb_backend *be, float *dqkv, const float *dout, const float *probs,
                               const float *qkv, int N, int T, int B, int D, int H,
                               float *scratch)
{
    const int Dh = D / H;
    const double scale = 1.0 / sqrt((double)Dh);
    double *dz = malloc((size_t)T * T * sizeof *dz);
    FB_ASSERT(dz != NULL);
    for (int n = 0; n < N; n++)
        for (int b = 0; b < B; b++)
            for (int h = 0; h < H; h++) {
                const float *P = probs + (((size_t)n * B + b) * H + h) * T * T;
                for (int t = 0; t < T; t++) {
                    double dot = 0.0;
                    for (int s = 0; s < T; s++) {
                        double dp = 0.0;
                        for (int j = 0; j < Dh; j++)
                            dp += (double)dout[(((size_t)n * T + t) * B + b) * D + h * Dh + j] *
                                  qkv[qkv_at(n, s, b, 2, h * Dh + j, T, B, D)];
                        dz[(size_t)t * T + s] = dp;
                        dot += P[(size_t)t * T + s] * dp;
                    }
                    for (int s = 0; s < T; s++)
                        dz[(size_t)t * T + s] = P[(size_t)t * T + s] * (dz[(size_t)t * T + s] - dot);
                }
                for (int j = 0; j < Dh; j++) {
                    const int c = h * Dh + j;
                    for (int t = 0; t < T; t++) {
                        double dq = 0.0, dk = 0.0, dv = 0.0;
                        for (int s = 0; s < T; s++) {
                            dq += dz[(size_t)t * T + s] * qkv[qkv_at(n, s, b, 1, c, T, B, D)];
                            dk += dz[(size_t)s * T + t] * qkv[qkv_at(n, s, b, 0, c, T, B, D)];
                            dv += (double)P[(size_t)s * T + t] *
                                  dout[(((size_t)n * T + s) * B + b) * D + c];
                        }
                        float *g = dqkv + qkv_at(n, t, b, 0, c, T, B, D);
                        g[0] = (float)(g[0] + dq * scale);
                        g[D] = (float)(g[D] + dk * scale);
                        g[2 * D] = (float)(g[2 * D] + dv);
                    }
                }
            }
    free(dz);
}

/*
 * in [N, T, B, D]; out [N, B, D]:
 *   mean:  out[n, b, d] = sum over t of in[n, t, b, d] / T;
 *   first: out[n, b, d] = in[n, 0, b, d].
 */
void fb_ref_seq_pool_forward(fb_backend *be, fb_seq_pool kind, float *out, const float *in, int N,
                             int T, int B, int D)
{
    for (int n = 0; n < N; n++)
        for (int b = 0; b < B; b++)
            for (int d = 0; d < D; d++) {
                double s = 0.0;
                int last = kind == FB_SEQ_POOL_MEAN ? T : 1;
                for (int t = 0; t < last; t++)
                    s += in[(((size_t)n * T + t) * B + b) * D + d];
                out[((size_t)n * B + b) * D + d] = (float)(s / last);
            }
}

/*
 * dout [N, B, D]; din [N, T, B, D]:
 *   mean:  din[n, t, b, d] += dout[n, b, d] / T for every t;
 *   first: din[n, 0, b, d] += dout[n, b, d].
 */
void fb_ref_seq_pool_backward(fb_backend *be, fb_seq_pool kind, float *din, const float *dout,
                              int N, int T, int B, int D)
{
    int last = kind == FB_SEQ_POOL_MEAN ? T : 1;
    for (int n = 0; n < N; n++)
        for (int t = 0; t < last; t++)
            for (int b = 0; b < B; b++)
                for (int d = 0; d < D; d++) {
                    float *g = &din[(((size_t)n * T + t) * B + b) * D + d];
                    *g = (float)(*g + (double)dout[((size_t)n * B + b) * D + d] / last);
                }
}
