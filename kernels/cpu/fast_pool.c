/*
 * Fast pooling: each window is clipped to the image once, so the inner loops
 * run over real pixels only with no bounds tests; the common 2x2, stride-2,
 * unpadded max pooling has its own loop.  Planes ([n, channel] pairs) are
 * dealt out to threads in contiguous ranges.
 */
#include "cpu.h"

#include <math.h>
#include <string.h>

/* The in-image part [*lo, *hi) of the window of output position o. */
static inline void pool_clip(int *lo, int *hi, int o, int s, int p, int k, int n)
{
    int a = o * s - p, e = a + k;
    *lo = a < 0 ? 0 : a;
    *hi = e > n ? n : e;
}

/* Plane-elements per thread below which pooling stays on one thread. */
#define POOL_GRAIN 32768

/* One plane of max pooling, any window. */
static void maxpool_plane(float *restrict o, int32_t *restrict a, const float *restrict x,
                          const fb_pool_geom *g)
{
    const int H = g->H, W = g->W, Ho = g->Ho, Wo = g->Wo;
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

/* One plane of 2x2, stride-2, unpadded max pooling: every window lies inside
 * the image and is scanned in the same order as maxpool_plane's, with the
 * same rule (a larger value or a NaN takes over), so the results are equal.
 * The rule is written as selects, which the compiler vectorises. */
static void maxpool_plane_2x2(float *restrict o, int32_t *restrict a, const float *restrict x,
                              int W, int Ho, int Wo)
{
    for (int oh = 0; oh < Ho; oh++) {
        const float *restrict r0 = x + (size_t)(2 * oh) * W, *restrict r1 = r0 + W;
        float *restrict orow = o + (size_t)oh * Wo;
        int32_t *restrict arow = a + (size_t)oh * Wo;
        const int32_t base = 2 * oh * W;
        for (int ow = 0; ow < Wo; ow++) {
            const float v0 = r0[2 * ow], v1 = r0[2 * ow + 1];
            const float v2 = r1[2 * ow], v3 = r1[2 * ow + 1];
            /* the first tap always wins against -inf, and as a NaN */
            float m = v0;
            int32_t k = 0;
            bool t = v1 > m || isnan(v1);
            m = t ? v1 : m;
            k = t ? 1 : k;
            t = v2 > m || isnan(v2);
            m = t ? v2 : m;
            k = t ? W : k;
            t = v3 > m || isnan(v3);
            m = t ? v3 : m;
            k = t ? W + 1 : k;
            orow[ow] = m;
            arow[ow] = base + 2 * ow + k;
        }
    }
}

/*
 * out, argmax [N, BC, Ho, Wo] from in [N, BC, H, W]; same semantics as the
 * reference: first maximum wins, NaN wins, argmax -1 for an empty window.
 */
void fb_cpu_maxpool2d_forward(fb_backend *be, float *out, int32_t *argmax, const float *in,
                              const fb_pool_geom *g)
{
    const size_t HW = (size_t)g->H * g->W, HoWo = (size_t)g->Ho * g->Wo;
    const size_t P = (size_t)g->N * g->BC;
    const bool k2 = g->kh == 2 && g->kw == 2 && g->sh == 2 && g->sw == 2 && g->ph == 0 &&
                    g->pw == 0;
    const int nt = fb_cpu_team(be, (double)(P * HW), POOL_GRAIN);
#pragma omp parallel num_threads(nt) if (nt > 1)
    {
        size_t p0, p1;
        fb_cpu_split(P, omp_get_thread_num(), omp_get_num_threads(), 1, &p0, &p1);
        for (size_t p = p0; p < p1; p++) {
            if (k2)
                maxpool_plane_2x2(out + p * HoWo, argmax + p * HoWo, in + p * HW, g->W, g->Ho,
                                  g->Wo);
            else
                maxpool_plane(out + p * HoWo, argmax + p * HoWo, in + p * HW, g);
        }
    }
}

/* din [N, BC, H, W] += dout routed to argmax; with set, each plane is zeroed
 * first. */
static void maxpool_backward(fb_backend *be, float *din, const float *dout, const int32_t *argmax,
                             const fb_pool_geom *g, bool set)
{
    const size_t HW = (size_t)g->H * g->W, HoWo = (size_t)g->Ho * g->Wo;
    const size_t P = (size_t)g->N * g->BC;
    const int nt = fb_cpu_team(be, (double)(P * HW), POOL_GRAIN);
#pragma omp parallel num_threads(nt) if (nt > 1)
    {
        size_t p0, p1;
        fb_cpu_split(P, omp_get_thread_num(), omp_get_num_threads(), 1, &p0, &p1);
        for (size_t p = p0; p < p1; p++) {
            float *restrict d = din + p * HW;
            const float *restrict dy = dout + p * HoWo;
            const int32_t *restrict a = argmax + p * HoWo;
            if (set) memset(d, 0, HW * sizeof *d);
            for (size_t o = 0; o < HoWo; o++)
                if (a[o] >= 0) d[a[o]] += dy[o];
        }
    }
}

/* din [N, BC, H, W] += dout routed to argmax. */
void fb_cpu_maxpool2d_backward(fb_backend *be, float *din, const float *dout,
                               const int32_t *argmax, const fb_pool_geom *g)
{
    maxpool_backward(be, din, dout, argmax, g, false);
}

/*
 * din [N, BC, H, W] = dout routed to argmax, 0 elsewhere: what zeroing din and
 * fb_cpu_maxpool2d_backward would leave, bit for bit, without reading din
 * first.  Each plane is zeroed just before its windows add into it, so the
 * adds find it in cache (zeroing the whole buffer first sent it to memory
 * and back); writing each 2x2 window's four inputs directly measured no
 * faster.
 */
void fb_cpu_maxpool2d_backward_set(fb_backend *be, float *din, const float *dout,
                                   const int32_t *argmax, const fb_pool_geom *g)
{
    maxpool_backward(be, din, dout, argmax, g, true);
}

/* out [N, BC, Ho, Wo] = window sums / (kh kw) (count_include_pad). */
void fb_cpu_avgpool2d_forward(fb_backend *be, float *out, const float *in, const fb_pool_geom *g)
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
void fb_cpu_avgpool2d_backward(fb_backend *be, float *din, const float *dout,
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
void fb_cpu_global_avgpool_forward(fb_backend *be, float *out, const float *in, int N, int BC,
                                   int HW)
{
    const size_t P = (size_t)N * BC;
    for (size_t p = 0; p < P; p++)
        out[p] = (float)(fb_cpu_sum(in + p * HW, (size_t)HW) / HW);
}

/* din [N, BC, HW] += dout [N, BC] / HW. */
void fb_cpu_global_avgpool_backward(fb_backend *be, float *din, const float *dout, int N, int BC,
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
