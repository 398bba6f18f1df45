/*
 * Reference pooling over planes of [N, BC, H, W].
 */
#include "cpu.h"

#include <math.h>

/*
 * out, argmax [N, BC, Ho, Wo] from in [N, BC, H, W]: the maximum of each
 * window, padding counting as -inf.  As PyTorch: the first maximum in
 * row-major window order wins, and a NaN wins over (and after) anything.
 * argmax is ih * W + iw within the plane, or -1 for a window of padding only.
 */
void fb_ref_maxpool2d_forward(fb_backend *be, float *out, int32_t *argmax, const float *in,
                              const fb_pool_geom *g)
{
    const size_t HW = (size_t)g->H * g->W, HoWo = (size_t)g->Ho * g->Wo;
    for (size_t p = 0; p < (size_t)g->N * g->BC; p++) {
        const float *x = in + p * HW;
        for (int oh = 0; oh < g->Ho; oh++)
            for (int ow = 0; ow < g->Wo; ow++) {
                float m = -INFINITY;
                int32_t mi = -1;
                for (int i = 0; i < g->kh; i++)
                    for (int j = 0; j < g->kw; j++) {
                        int ih = oh * g->sh - g->ph + i, iw = ow * g->sw - g->pw + j;
                        if (ih < 0 || ih >= g->H || iw < 0 || iw >= g->W) continue;
                        float v = x[(size_t)ih * g->W + iw];
                        if (mi < 0 || v > m || isnan(v)) {
                            m = v;
                            mi = ih * g->W + iw;
                        }
                    }
                out[p * HoWo + (size_t)oh * g->Wo + ow] = m;
                argmax[p * HoWo + (size_t)oh * g->Wo + ow] = mi;
            }
    }
}

/* din [N, BC, H, W] += dout [N, BC, Ho, Wo] routed to argmax. */
void fb_ref_maxpool2d_backward(fb_backend *be, float *din, const float *dout,
                               const int32_t *argmax, const fb_pool_geom *g)
{
    const size_t HW = (size_t)g->H * g->W, HoWo = (size_t)g->Ho * g->Wo;
    for (size_t p = 0; p < (size_t)g->N * g->BC; p++)
        for (size_t o = 0; o < HoWo; o++) {
            int32_t a = argmax[p * HoWo + o];
            if (a >= 0) din[p * HW + (size_t)a] += dout[p * HoWo + o];
        }
}

/* out [N, BC, Ho, Wo] = sum of each window of in [N, BC, H, W] / (kh kw):
 * padding counts as zeros in the divisor (count_include_pad). */
void fb_ref_avgpool2d_forward(fb_backend *be, float *out, const float *in, const fb_pool_geom *g)
{
    const size_t HW = (size_t)g->H * g->W, HoWo = (size_t)g->Ho * g->Wo;
    for (size_t p = 0; p < (size_t)g->N * g->BC; p++)
        for (int oh = 0; oh < g->Ho; oh++)
            for (int ow = 0; ow < g->Wo; ow++) {
                double acc = 0.0;
                for (int i = 0; i < g->kh; i++)
                    for (int j = 0; j < g->kw; j++) {
                        int ih = oh * g->sh - g->ph + i, iw = ow * g->sw - g->pw + j;
                        if (ih >= 0 && ih < g->H && iw >= 0 && iw < g->W)
                            acc += in[p * HW + (size_t)ih * g->W + iw];
                    }
                out[p * HoWo + (size_t)oh * g->Wo + ow] = (float)(acc / (g->kh * g->kw));
            }
}

/* din [N, BC, H, W] += dout / (kh kw) over every in-image tap of each window. */
void fb_ref_avgpool2d_backward(fb_backend *be, float *din, const float *dout,
                               const fb_pool_geom *g)
{
    const size_t HW = (size_t)g->H * g->W, HoWo = (size_t)g->Ho * g->Wo;
    const float inv = 1.0f / (float)(g->kh * g->kw);
    for (size_t p = 0; p < (size_t)g->N * g->BC; p++)
        for (int oh = 0; oh < g->Ho; oh++)
            for (int ow = 0; ow < g->Wo; ow++) {
                float d = dout[p * HoWo + (size_t)oh * g->Wo + ow] * inv;
                for (int i = 0; i < g->kh; i++)
                    for (int j = 0; j < g->kw; j++) {
                        int ih = oh * g->sh - g->ph + i, iw = ow * g->sw - g->pw + j;
                        if (ih >= 0 && ih < g->H && iw >= 0 && iw < g->W)
                            din[p * HW + (size_t)ih * g->W + iw] += d;
                    }
            }
}

/* out [N, BC] = mean over HW of in [N, BC, HW]. */
void fb_ref_global_avgpool_forward(fb_backend *be, float *out, const float *in, int N, int BC,
                                   int HW)
{
    for (size_t p = 0; p < (size_t)N * BC; p++) {
        double acc = 0.0;
        for (int i = 0; i < HW; i++)
            acc += in[p * HW + i];
        out[p] = (float)(acc / HW);
    }
}

/* din [N, BC, HW] += dout [N, BC] / HW. */
void fb_ref_global_avgpool_backward(fb_backend *be, float *din, const float *dout, int N, int BC,
                                    int HW)
{
    const float inv = 1.0f / (float)HW;
    for (size_t p = 0; p < (size_t)N * BC; p++)
        for (int i = 0; i < HW; i++)
            din[p * HW + i] += dout[p] * inv;
}
