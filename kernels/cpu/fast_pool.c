/*
 * Fast pooling: each window is clipped to the image once, so the inner loops
 * run over real pixels only with no bounds tests.
 */
#include "cpu.h"

#include <math.h>

/* The in-image part [*lo, *hi) of the window of output position o. */
static inline void pool_clip(int *lo, int *hi, int o, int s, int p, int k, int n)
{
    int a = o * s - p, e = a + k;
    *lo = a < 0 ? 0 : a;
    *hi = e > n ? n : e;
}

/*
 * out, argmax [N, BC, Ho, Wo] from in [N, BC, H, W]; same semantics as the
 * reference: first maximum wins, NaN wins, argmax -1 for an empty window.
 */
void fb_cpu_maxpool2d_forward(fb_backend_t *be, float *out, int32_t *argmax, const float *in,
                              const fb_pool_geom *g)
{
    const int H = g->H, W = g->W, Ho = g->Ho, Wo = g->Wo;
    const size_t HW = (size_t)H * W, HoWo = (size_t)Ho * Wo, P = (size_t)g->N * g->BC;
    for (size_t p = 0; p < P; p++) {
        const float *restrict x = in + p * HW;
        float *restrict o = out + p * HoWo;
        int32_t *restrict a = argmax + p * HoWo;
        for (int oh = 0; oh < Ho; oh++) {
            int h0, h1;
            pool_clip(&h0, &h1, oh, g->sh, g->ph, g->kh, H);
            for (int ow = 0; ow < Wo; ow++) {
                int w0, w1;
                pool_clip(&w0, &w1, ow, g->sw, g->pw, g->kw, W);
                float m = -INFINITY;
                int32_t mi = h0 < h1 && w0 < w1 ? h0 * W + w0 : -1;
                for (int ih = h0; ih < h1; ih++) {
                    const float *xr = x + (size_t)ih * W;
                    for (int iw = w0; iw < w1; iw++) {
                        float v = xr[iw];
                        if (v > m || isnan(v)) {
                            m = v;
                            mi = ih * W + iw;
                        }
                    }
                }
                o[(size_t)oh * Wo + ow] = m;
                a[(size_t)oh * Wo + ow] = mi;
            }
        }
    }
}

/* din [N, BC, H, W] += dout routed to argmax. */
void fb_cpu_maxpool2d_backward(fb_backend_t *be, float *din, const float *dout,
                               const int32_t *argmax, const fb_pool_geom *g)
{
    const size_t HW = (size_t)g->H * g->W, HoWo = (size_t)g->Ho * g->Wo;
    const size_t P = (size_t)g->N * g->BC;
    for (size_t p = 0; p < P; p++) {
        float *restrict d = din + p * HW;
        const float *restrict dy = dout + p * HoWo;
        const int32_t *restrict a = argmax + p * HoWo;
        for (size_t o = 0; o < HoWo; o++)
            if (a[o] >= 0) d[a[o]] += dy[o];
    }
}

/* out [N, BC, Ho, Wo] = window sums / (kh kw) (count_include_pad). */
void fb_cpu_avgpool2d_forward(fb_backend_t *be, float *out, const float *in, const fb_pool_geom *g)
{
    const int H = g->H, W = g->W, Ho = g->Ho, Wo = g->Wo;
    const size_t HW = (size_t)H * W, HoWo = (size_t)Ho * Wo, P = (size_t)g->N * g->BC;
    const double inv = 1.0 / (double)(g->kh * g->kw);
    for (size_t p = 0; p < P; p++) {
        const float *restrict x = in + p * HW;
        float *restrict o = out + p * HoWo;
        for (int oh = 0; oh < Ho; oh++) {
            int h0, h1;
            pool_clip(&h0, &h1, oh, g->sh, g->ph, g->kh, H);
            for (int ow = 0; ow < Wo; ow++) {
                int w0, w1;
                pool_clip(&w0, &w1, ow, g->sw, g->pw, g->kw, W);
                double s = 0.0;
                for (int ih = h0; ih < h1; ih++)
                    for (int iw = w0; iw < w1; iw++)
                        s += x[(size_t)ih * W + iw];
                o[(size_t)oh * Wo + ow] = (float)(s * inv);
            }
        }
    }
}

/* din [N, BC, H, W] += dout / (kh kw) over the in-image part of each window. */
void fb_cpu_avgpool2d_backward(fb_backend_t *be, float *din, const float *dout,
                               const fb_pool_geom *g)
{
    const int H = g->H, W = g->W, Ho = g->Ho, Wo = g->Wo;
    const size_t HW = (size_t)H * W, HoWo = (size_t)Ho * Wo, P = (size_t)g->N * g->BC;
    const float inv = 1.0f / (float)(g->kh * g->kw);
    for (size_t p = 0; p < P; p++) {
        float *restrict d = din + p * HW;
        const float *restrict dy = dout + p * HoWo;
        for (int oh = 0; oh < Ho; oh++) {
            int h0, h1;
            pool_clip(&h0, &h1, oh, g->sh, g->ph, g->kh, H);
            for (int ow = 0; ow < Wo; ow++) {
                int w0, w1;
                pool_clip(&w0, &w1, ow, g->sw, g->pw, g->kw, W);
                const float v = dy[(size_t)oh * Wo + ow] * inv;
                for (int ih = h0; ih < h1; ih++)
                    for (int iw = w0; iw < w1; iw++)
                        d[(size_t)ih * W + iw] += v;
            }
        }
    }
}

/* out [N, BC] = mean over HW of in [N, BC, HW]. */
void fb_cpu_global_avgpool_forward(fb_backend_t *be, float *out, const float *in, int N, int BC,
                                   int HW)
{
    const size_t P = (size_t)N * BC;
    for (size_t p = 0; p < P; p++)
        out[p] = (float)(fb_cpu_sum(in + p * HW, (size_t)HW) / HW);
}

/* din [N, BC, HW] += dout [N, BC] / HW. */
void fb_cpu_global_avgpool_backward(fb_backend_t *be, float *din, const float *dout, int N, int BC,
                                    int HW)
{
    const size_t P = (size_t)N * BC;
    const float inv = 1.0f / (float)HW;
    for (size_t p = 0; p < P; p++) {
        float *restrict d = din + p * HW;
        const float v = dout[p] * inv;
        for (int i = 0; i < HW; i++)
            d[i] += v;
    }
}
