/*
 * Fast B-batched 2-D convolution: im2col + OpenBLAS GEMM, col2im for the
 * input gradient.
 *
 * Per sample, a group's input [C, H, W] unfolds into col [C*kh*kw, Ho*Wo];
 * its output [Mg, Ho*Wo] is then w_g [Mg, C*kh*kw] . col.  Not shared, a group
 * is one member (Mg = K, B groups per sample); shared, the weights of all
 * members form one [B*K, C*kh*kw] matrix against the single input (Mg = B*K,
 * one GEMM per sample), so the input is never unfolded B times.  A 1x1,
 * stride-1, unpadded convolution needs no unfolding: col is the input itself.
 */
#include "cpu.h"

#include <cblas.h>
/* cblas.h pulls in <complex.h>, whose macro I would shadow our dimension I. */
#undef I
#include <string.h>

static bool conv_is_pointwise(const fb_conv_geom *g)
{
    return g->kh == 1 && g->kw == 1 && g->sh == 1 && g->sw == 1 && g->ph == 0 && g->pw == 0;
}

/* Range [*lo, *hi) of output columns ow whose tap j lands inside [0, W):
 * 0 <= ow*s - p + j < W. */
static void conv_valid_range(int *lo, int *hi, int W, int Wo, int s, int p, int j)
{
    int t = p - j; /* need ow*s >= t */
    int a = t <= 0 ? 0 : (t + s - 1) / s;
    int u = W - 1 + p - j; /* need ow*s <= u */
    int e = u < 0 ? 0 : u / s + 1;
    if (e > Wo) e = Wo;
    if (a > e) a = e;
    *lo = a;
    *hi = e;
}

/* col[(c*kh + i)*kw + j, oh*Wo + ow] = x[c, oh*sh - ph + i, ow*sw - pw + j],
 * zero where the tap falls in the padding.  x [C, H, W]. */
static void conv_im2col(float *restrict col, const float *restrict x, const fb_conv_geom *g)
{
    const int H = g->H, W = g->W, Ho = g->Ho, Wo = g->Wo, sw = g->sw;
    const size_t HoWo = (size_t)Ho * Wo;
    for (int c = 0; c < g->C; c++)
        for (int i = 0; i < g->kh; i++)
            for (int j = 0; j < g->kw; j++) {
                float *restrict row = col + ((size_t)(c * g->kh + i) * g->kw + j) * HoWo;
                const float *restrict xc = x + (size_t)c * H * W;
                int lo, hi;
                conv_valid_range(&lo, &hi, W, Wo, sw, g->pw, j);
                for (int oh = 0; oh < Ho; oh++) {
                    float *restrict r = row + (size_t)oh * Wo;
                    int ih = oh * g->sh - g->ph + i;
                    if (ih < 0 || ih >= H) {
                        memset(r, 0, (size_t)Wo * sizeof(float));
                        continue;
                    }
                    memset(r, 0, (size_t)lo * sizeof(float));
                    memset(r + hi, 0, (size_t)(Wo - hi) * sizeof(float));
                    if (hi == lo) continue;
                    const float *restrict xr = xc + (size_t)ih * W + (lo * sw - g->pw + j);
                    if (sw == 1)
                        memcpy(r + lo, xr, (size_t)(hi - lo) * sizeof(float));
                    else
                        for (int ow = lo; ow < hi; ow++)
                            r[ow] = xr[(size_t)(ow - lo) * sw];
                }
            }
}

/* The adjoint of conv_im2col: x[c, ih, iw] += every col entry that was read
 * from it. */
static void conv_col2im(float *restrict x, const float *restrict col, const fb_conv_geom *g)
{
    const int H = g->H, W = g->W, Ho = g->Ho, Wo = g->Wo, sw = g->sw;
    const size_t HoWo = (size_t)Ho * Wo;
    for (int c = 0; c < g->C; c++)
        for (int i = 0; i < g->kh; i++)
            for (int j = 0; j < g->kw; j++) {
                const float *restrict row = col + ((size_t)(c * g->kh + i) * g->kw + j) * HoWo;
                float *restrict xc = x + (size_t)c * H * W;
                int lo, hi;
                conv_valid_range(&lo, &hi, W, Wo, sw, g->pw, j);
                for (int oh = 0; oh < Ho; oh++) {
                    int ih = oh * g->sh - g->ph + i;
                    if (ih < 0 || ih >= H || hi == lo) continue;
                    const float *restrict r = row + (size_t)oh * Wo;
                    float *restrict xr = xc + (size_t)ih * W + (lo * sw - g->pw + j);
                    if (sw == 1)
                        for (int ow = lo; ow < hi; ow++)
                            xr[ow - lo] += r[ow];
                    else
                        for (int ow = lo; ow < hi; ow++)
                            xr[(size_t)(ow - lo) * sw] += r[ow];
                }
            }
}

/* Floats of scratch: one unfolded input [C*kh*kw, Ho*Wo], or 0 for a
 * pointwise convolution. */
size_t fb_cpu_conv2d_scratch_floats(const fb_backend_t *be, const fb_conv_geom *g)
{
    if (conv_is_pointwise(g)) return 0;
    return (size_t)g->C * g->kh * g->kw * g->Ho * g->Wo;
}

/*
 * out[N, B*K, Ho, Wo] = conv(in[N, Bi*C, H, W], w[B, K, C, kh, kw]) + bias[B, K];
 * scratch holds fb_cpu_conv2d_scratch_floats() floats.
 */
void fb_cpu_conv2d_forward(fb_backend_t *be, float *out, const float *in, const float *w,
                           const float *bias, const fb_conv_geom *g, float *scratch)
{
    const bool pw = conv_is_pointwise(g);
    const int groups = g->shared ? 1 : g->B, Mg = g->shared ? g->B * g->K : g->K;
    const int CKK = g->C * g->kh * g->kw, HoWo = g->Ho * g->Wo;
    const size_t HW = (size_t)g->H * g->W, BK = (size_t)g->B * g->K;
    FB_ASSERT(pw || scratch != NULL);
    for (int n = 0; n < g->N; n++) {
        float *out_n = out + (size_t)n * BK * HoWo;
        if (bias)
            for (size_t ch = 0; ch < BK; ch++) {
                float *restrict o = out_n + ch * HoWo;
                const float v = bias[ch];
                for (int i = 0; i < HoWo; i++)
                    o[i] = v;
            }
        for (int gi = 0; gi < groups; gi++) {
            const float *x = in + ((size_t)n * groups + gi) * g->C * HW;
            const float *col = x;
            if (!pw) {
                conv_im2col(scratch, x, g);
                col = scratch;
            }
            cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, Mg, HoWo, CKK, 1.0f,
                        w + (size_t)gi * Mg * CKK, CKK, col, HoWo, bias ? 1.0f : 0.0f,
                        out_n + (size_t)gi * Mg * HoWo, HoWo);
        }
    }
}

/*
 * dout [N, B*K, Ho, Wo]; accumulates dbias[B*K] (plane sums), per sample and
 * group dw_g [Mg, CKK] += dout_g . col^T, and (not shared) din_g += col2im(
 * w_g^T . dout_g).  scratch as for the forward.
 */
void fb_cpu_conv2d_backward(fb_backend_t *be, float *din, float *dw, float *dbias,
                            const float *dout, const float *in, const float *w,
                            const fb_conv_geom *g, float *scratch)
{
    const bool pw = conv_is_pointwise(g);
    const int groups = g->shared ? 1 : g->B, Mg = g->shared ? g->B * g->K : g->K;
    const int CKK = g->C * g->kh * g->kw, HoWo = g->Ho * g->Wo;
    const size_t HW = (size_t)g->H * g->W, BK = (size_t)g->B * g->K;
    FB_ASSERT(pw || scratch != NULL);
    if (dbias)
        for (int n = 0; n < g->N; n++)
            for (size_t ch = 0; ch < BK; ch++)
                dbias[ch] += (float)fb_cpu_sum(dout + ((size_t)n * BK + ch) * HoWo, HoWo);
    for (int n = 0; n < g->N; n++)
        for (int gi = 0; gi < groups; gi++) {
            const float *x = in + ((size_t)n * groups + gi) * g->C * HW;
            const float *dout_g = dout + ((size_t)n * BK + (size_t)gi * Mg) * HoWo;
            const float *w_g = w + (size_t)gi * Mg * CKK;
            float *din_g = din ? din + ((size_t)n * groups + gi) * g->C * HW : NULL;
            const float *col = x;
            if (!pw) {
                conv_im2col(scratch, x, g);
                col = scratch;
            }
            cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, Mg, CKK, HoWo, 1.0f, dout_g, HoWo,
                        col, HoWo, 1.0f, dw + (size_t)gi * Mg * CKK, CKK);
            if (!din_g) continue;
            if (pw) {
                /* din_g [C, HW] += w_g^T [C, K] . dout_g [K, HW] */
                cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, g->C, HoWo, Mg, 1.0f, w_g, CKK,
                            dout_g, HoWo, 1.0f, din_g, HoWo);
            } else {
                cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, CKK, HoWo, Mg, 1.0f, w_g, CKK,
                            dout_g, HoWo, 0.0f, scratch, HoWo);
                conv_col2im(din_g, scratch, g);
            }
        }
}
