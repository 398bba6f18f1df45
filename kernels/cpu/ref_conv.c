/*
 * Reference B-batched 2-D convolution (cross-correlation with zero padding,
 * as PyTorch), written as direct loops over every tap.  Needs no scratch.
 */
#include "cpu.h"

/* in(n, slot, c, ih, iw) of in [N, Bi*C, H, W], or 0 outside the image. */
static double conv_in_at(const float *in, const fb_conv_geom *g, int n, int slot, int c, int ih,
                         int iw)
{
    if (ih < 0 || ih >= g->H || iw < 0 || iw >= g->W) return 0.0;
    int Bi = g->shared ? 1 : g->B;
    return in[(((size_t)n * Bi + slot) * g->C + c) * g->H * g->W + (size_t)ih * g->W + iw];
}

/* The window sum of output (n, b, k, oh, ow): sum over c, i, j of
 * w[b, k, c, i, j] in(n, slot, c, oh*sh - ph + i, ow*sw - pw + j). */
static double conv_window(const float *in, const float *w, const fb_conv_geom *g, int n, int b,
                          int k, int oh, int ow)
{
    const int C = g->C, kh = g->kh, kw = g->kw, slot = g->shared ? 0 : b;
    const float *wk = w + ((size_t)b * g->K + k) * C * kh * kw;
    double acc = 0.0;
    for (int c = 0; c < C; c++)
        for (int i = 0; i < kh; i++)
            for (int j = 0; j < kw; j++)
                acc +=
                    wk[((size_t)c * kh + i) * kw + j] *
                    conv_in_at(in, g, n, slot, c, oh * g->sh - g->ph + i, ow * g->sw - g->pw + j);
    return acc;
}

/*
 * out[N, B*K, Ho, Wo]: out[n, b, k, oh, ow] = bias[b, k] + conv_window(...)
 * with in [N, Bi*C, H, W], slot = shared ? 0 : b, w [B, K, C, kh, kw].
 */
void fb_ref_conv2d_forward(fb_backend *be, float *out, const float *in, const float *w,
                           const float *bias, const fb_conv_geom *g, float *scratch)
{
    const int B = g->B, K = g->K, Ho = g->Ho, Wo = g->Wo;
    for (int n = 0; n < g->N; n++)
        for (int b = 0; b < B; b++)
            for (int k = 0; k < K; k++)
                for (int oh = 0; oh < Ho; oh++)
                    for (int ow = 0; ow < Wo; ow++) {
                        double acc = bias ? bias[(size_t)b * K + k] : 0.0;
                        acc += conv_window(in, w, g, n, b, k, oh, ow);
                        size_t o = (((size_t)n * B + b) * K + k) * Ho * Wo + (size_t)oh * Wo + ow;
                        out[o] = (float)acc;
                    }
}

/* dout(n, b, k, oh, ow) of dout [N, B*K, Ho, Wo]. */
static double conv_dout_at(const float *dout, const fb_conv_geom *g, int n, int b, int k, int oh,
                           int ow)
{
    size_t plane = ((size_t)n * g->B + b) * g->K + k;
    return dout[plane * g->Ho * g->Wo + (size_t)oh * g->Wo + ow];
}

/* dbias[b, k] += sum over n, oh, ow of dout[n, b, k, oh, ow]. */
static void ref_conv_dbias(float *dbias, const float *dout, const fb_conv_geom *g)
{
    for (int b = 0; b < g->B; b++)
        for (int k = 0; k < g->K; k++) {
            double acc = 0.0;
            for (int n = 0; n < g->N; n++)
                for (int oh = 0; oh < g->Ho; oh++)
                    for (int ow = 0; ow < g->Wo; ow++)
                        acc += conv_dout_at(dout, g, n, b, k, oh, ow);
            float *d = &dbias[(size_t)b * g->K + k];
            *d = (float)(*d + acc);
        }
}

/* dw[b, k, c, i, j] += sum over n, oh, ow of dout[n, b, k, oh, ow] times the
 * input that tap (i, j) of that window reads. */
static void ref_conv_dw(float *dw, const float *dout, const float *in, const fb_conv_geom *g)
{
    const int kh = g->kh, kw = g->kw;
    for (int b = 0; b < g->B; b++)
        for (int k = 0; k < g->K; k++)
            for (int c = 0; c < g->C; c++)
                for (int i = 0; i < kh; i++)
                    for (int j = 0; j < kw; j++) {
                        double acc = 0.0;
                        for (int n = 0; n < g->N; n++)
                            for (int oh = 0; oh < g->Ho; oh++)
                                for (int ow = 0; ow < g->Wo; ow++)
                                    acc +=
                                        conv_dout_at(dout, g, n, b, k, oh, ow) *
                                        conv_in_at(in, g, n, g->shared ? 0 : b, c,
                                                   oh * g->sh - g->ph + i, ow * g->sw - g->pw + j);
                        float *d = &dw[((((size_t)b * g->K + k) * g->C + c) * kh + i) * kw + j];
                        *d = (float)(*d + acc);
                    }
}

/* din[n, b, c, ih, iw] += sum over k, i, j of w[b, k, c, i, j] dout[n, b, k,
 * oh, ow] for the output (oh, ow), if any, whose tap (i, j) reads (ih, iw):
 * oh*sh - ph + i = ih and ow*sw - pw + j = iw. */
static void ref_conv_din(float *din, const float *dout, const float *w, const fb_conv_geom *g)
{
    const int C = g->C, H = g->H, W = g->W, kh = g->kh, kw = g->kw;
    for (int n = 0; n < g->N; n++)
        for (int b = 0; b < g->B; b++)
            for (int c = 0; c < C; c++)
                for (int ih = 0; ih < H; ih++)
                    for (int iw = 0; iw < W; iw++) {
                        double acc = 0.0;
                        for (int k = 0; k < g->K; k++)
                            for (int i = 0; i < kh; i++)
                                for (int j = 0; j < kw; j++) {
                                    int th = ih + g->ph - i, tw = iw + g->pw - j;
                                    if (th < 0 || th % g->sh != 0 || th / g->sh >= g->Ho) continue;
                                    if (tw < 0 || tw % g->sw != 0 || tw / g->sw >= g->Wo) continue;
                                    acc += w[((((size_t)b * g->K + k) * C + c) * kh + i) * kw + j] *
                                           conv_dout_at(dout, g, n, b, k, th / g->sh, tw / g->sw);
                                }
                        float *d =
                            &din[(((size_t)n * g->B + b) * C + c) * H * W + (size_t)ih * W + iw];
                        *d = (float)(*d + acc);
                    }
}

/*
 * dout [N, B*K, Ho, Wo]; accumulates dbias [B, K], dw [B, K, C, kh, kw] and
 * (not shared) din [N, B*C, H, W] as above.  din (NULL when shared) and dbias
 * may be NULL.
 */
void fb_ref_conv2d_backward(fb_backend *be, float *din, float *dw, float *dbias,
                            const float *dout, const float *in, const float *w,
                            const fb_conv_geom *g, float *scratch)
{
    if (dbias) ref_conv_dbias(dbias, dout, g);
    ref_conv_dw(dw, dout, in, g);
    if (din) ref_conv_din(din, dout, w, g);
}
