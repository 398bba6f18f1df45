/*
 * Fast pooling: each window is clipped to the image once, so the inner loops
 * run over real pixels only with no bounds tests; the common 2x2, stride-2,
 * unpadded max pooling has its own loop.  Planes ([n, channel] pairs) are
 * dealt out to threads in contiguous ranges.
 */
#include "cpu.h"

#include <math.h>
#include <string.h>

#if defined(__x86_64__) && defined(__GNUC__)
#include <immintrin.h>
#define POOL_X86 1
#endif

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

#ifdef POOL_X86
/* The even and the odd of the 16 floats at p, each in order. */
__attribute__((target("avx2"))) static inline void deal_pairs(const float *p, __m256 *even,
                                                              __m256 *odd)
{
    const __m256 a = _mm256_loadu_ps(p), b = _mm256_loadu_ps(p + 8);
    /* per 128-bit half: a0 a2 b0 b2 | a4 a6 b4 b6; then the 64-bit quarters in order */
    *even = _mm256_castpd_ps(
        _mm256_permute4x64_pd(_mm256_castps_pd(_mm256_shuffle_ps(a, b, 0x88)), 0xD8));
    *odd = _mm256_castpd_ps(
        _mm256_permute4x64_pd(_mm256_castps_pd(_mm256_shuffle_ps(a, b, 0xDD)), 0xD8));
}

/* The starts of the blocks of n windows that cover a row of Wo >= n: every
 * n-th, and the last block ending at Wo (overlapping the one before; its
 * windows are written twice, the same values). */
static inline int next_block(int ow, int Wo, int n)
{
    return ow + n < Wo && ow + 2 * n > Wo ? Wo - n : ow + n;
}

/* maxpool_plane_2x2's rule for eight windows: v takes over where it is
 * larger or NaN. */
__attribute__((target("avx2"))) static inline void take_over(__m256 *m, __m256i *k, __m256 v,
                                                             int32_t at)
{
    const __m256 t = _mm256_or_ps(_mm256_cmp_ps(v, *m, _CMP_GT_OQ),
                                  _mm256_cmp_ps(v, v, _CMP_UNORD_Q));
    *m = _mm256_blendv_ps(*m, v, t);
    *k = _mm256_castps_si256(
        _mm256_blendv_ps(_mm256_castsi256_ps(*k), _mm256_castsi256_ps(_mm256_set1_epi32(at)), t));
}

/* One row of Wo >= 8 2x2 windows, eight at a time: the same comparisons in
 * the same order as maxpool_plane_2x2's loop. */
__attribute__((target("avx2"))) static void maxpool_row_2x2_avx2(float *restrict orow,
                                                                 int32_t *restrict arow,
                                                                 const float *r0, const float *r1,
                                                                 int W, int Wo, int32_t base)
{
    const __m256i lane2 = _mm256_setr_epi32(0, 2, 4, 6, 8, 10, 12, 14);
    for (int ow = 0; ow + 8 <= Wo; ow = next_block(ow, Wo, 8)) {
        __m256 v0, v1, v2, v3;
        deal_pairs(r0 + 2 * ow, &v0, &v1);
        deal_pairs(r1 + 2 * ow, &v2, &v3);
        __m256 m = v0;
        __m256i k = _mm256_setzero_si256();
        take_over(&m, &k, v1, 1);
        take_over(&m, &k, v2, W);
        take_over(&m, &k, v3, W + 1);
        const __m256i at = _mm256_add_epi32(_mm256_set1_epi32(base + 2 * ow), lane2);
        _mm256_storeu_ps(orow + ow, m);
        _mm256_storeu_si256((__m256i *)(arow + ow), _mm256_add_epi32(at, k));
    }
}

/* take_over for four windows. */
__attribute__((target("avx2"))) static inline void take_over4(__m128 *m, __m128i *k, __m128 v,
                                                              int32_t at)
{
    const __m128 t = _mm_or_ps(_mm_cmp_ps(v, *m, _CMP_GT_OQ), _mm_cmp_ps(v, v, _CMP_UNORD_Q));
    *m = _mm_blendv_ps(*m, v, t);
    *k = _mm_castps_si128(
        _mm_blendv_ps(_mm_castsi128_ps(*k), _mm_castsi128_ps(_mm_set1_epi32(at)), t));
}

/* maxpool_row_2x2_avx2 for rows of 4 <= Wo < 8 windows, four at a time. */
__attribute__((target("avx2"))) static void maxpool_row_2x2_x4(float *restrict orow,
                                                               int32_t *restrict arow,
                                                               const float *r0, const float *r1,
                                                               int W, int Wo, int32_t base)
{
    const __m128i lane2 = _mm_setr_epi32(0, 2, 4, 6);
    for (int ow = 0; ow + 4 <= Wo; ow = next_block(ow, Wo, 4)) {
        const __m128 a0 = _mm_loadu_ps(r0 + 2 * ow), b0 = _mm_loadu_ps(r0 + 2 * ow + 4);
        const __m128 a1 = _mm_loadu_ps(r1 + 2 * ow), b1 = _mm_loadu_ps(r1 + 2 * ow + 4);
        __m128 m = _mm_shuffle_ps(a0, b0, 0x88);
        __m128i k = _mm_setzero_si128();
        take_over4(&m, &k, _mm_shuffle_ps(a0, b0, 0xDD), 1);
        take_over4(&m, &k, _mm_shuffle_ps(a1, b1, 0x88), W);
        take_over4(&m, &k, _mm_shuffle_ps(a1, b1, 0xDD), W + 1);
        const __m128i at = _mm_add_epi32(_mm_set1_epi32(base + 2 * ow), lane2);
        _mm_storeu_ps(orow + ow, m);
        _mm_storeu_si128((__m128i *)(arow + ow), _mm_add_epi32(at, k));
    }
}

/* A row in vectors of eight or four windows; false (nothing done) for rows
 * of fewer than four. */
static bool maxpool_row_2x2_vec(float *orow, int32_t *arow, const float *r0, const float *r1,
                                int W, int Wo, int32_t base)
{
    if (Wo >= 8)
        maxpool_row_2x2_avx2(orow, arow, r0, r1, W, Wo, base);
    else if (Wo >= 4)
        maxpool_row_2x2_x4(orow, arow, r0, r1, W, Wo, base);
    return Wo >= 4;
}
#endif

/* One plane of 2x2, stride-2, unpadded max pooling: every window lies inside
 * the image and is scanned in the same order as maxpool_plane's, with the
 * same rule (a larger value or a NaN takes over), so the results are equal.
 * Rows of eight windows or more go eight at a time with AVX2
 * (fb_cpu_own_avx2), of four to seven four at a time; otherwise the rule is
 * written as selects, which the compiler vectorises. */
static void maxpool_plane_2x2(float *restrict o, int32_t *restrict a, const float *restrict x,
                              int W, int Ho, int Wo)
{
#ifdef POOL_X86
    const bool avx2 = fb_cpu_own_avx2();
#endif
    for (int oh = 0; oh < Ho; oh++) {
        const float *restrict r0 = x + (size_t)(2 * oh) * W, *restrict r1 = r0 + W;
        float *restrict orow = o + (size_t)oh * Wo;
        int32_t *restrict arow = a + (size_t)oh * Wo;
        const int32_t base = 2 * oh * W;
#ifdef POOL_X86
        if (avx2 && maxpool_row_2x2_vec(orow, arow, r0, r1, W, Wo, base)) continue;
#endif
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

#ifdef POOL_X86
/* Two input rows of Wo >= 8 2x2 windows that tile them, each value 0 + dy
 * where the window's argmax is, +0 elsewhere: what zeroing and adding
 * leaves; eight windows at a time. */
__attribute__((target("avx2"))) static void maxpool_set_rows_2x2_avx2(
    float *restrict d0, float *restrict d1, const float *restrict dy,
    const int32_t *restrict a, int W, int Wo, int32_t base)
{
    const __m256i lane2 = _mm256_setr_epi32(0, 2, 4, 6, 8, 10, 12, 14);
    const __m256 zero = _mm256_setzero_ps();
    for (int ow = 0; ow + 8 <= Wo; ow = next_block(ow, Wo, 8)) {
        const __m256 v = _mm256_add_ps(zero, _mm256_loadu_ps(dy + ow));
        /* where in its window each argmax lies: 0, 1, W or W + 1 */
        const __m256i at = _mm256_sub_epi32(_mm256_loadu_si256((const __m256i *)(a + ow)),
                                            _mm256_add_epi32(_mm256_set1_epi32(base + 2 * ow),
                                                             lane2));
        __m256 q[4];
        const int32_t pos[4] = {0, 1, W, W + 1};
        for (int j = 0; j < 4; j++)
            q[j] = _mm256_and_ps(
                v, _mm256_castsi256_ps(_mm256_cmpeq_epi32(at, _mm256_set1_epi32(pos[j]))));
        /* interleave the columns of each row: per 128-bit half, then the halves */
        for (int r = 0; r < 2; r++) {
            const __m256 lo = _mm256_unpacklo_ps(q[2 * r], q[2 * r + 1]);
            const __m256 hi = _mm256_unpackhi_ps(q[2 * r], q[2 * r + 1]);
            float *dr = r ? d1 : d0;
            _mm256_storeu_ps(dr + 2 * ow, _mm256_permute2f128_ps(lo, hi, 0x20));
            _mm256_storeu_ps(dr + 2 * ow + 8, _mm256_permute2f128_ps(lo, hi, 0x31));
        }
    }
}

/* maxpool_set_rows_2x2_avx2 for rows of 4 <= Wo < 8 windows, four at a time. */
__attribute__((target("avx2"))) static void maxpool_set_rows_2x2_x4(float *restrict d0,
                                                                    float *restrict d1,
                                                                    const float *restrict dy,
                                                                    const int32_t *restrict a,
                                                                    int W, int Wo, int32_t base)
{
    const __m128i lane2 = _mm_setr_epi32(0, 2, 4, 6);
    for (int ow = 0; ow + 4 <= Wo; ow = next_block(ow, Wo, 4)) {
        const __m128 v = _mm_add_ps(_mm_setzero_ps(), _mm_loadu_ps(dy + ow));
        const __m128i at =
            _mm_sub_epi32(_mm_loadu_si128((const __m128i *)(a + ow)),
                          _mm_add_epi32(_mm_set1_epi32(base + 2 * ow), lane2));
        const int32_t pos[4] = {0, 1, W, W + 1};
        __m128 q[4];
        for (int j = 0; j < 4; j++)
            q[j] = _mm_and_ps(v, _mm_castsi128_ps(_mm_cmpeq_epi32(at, _mm_set1_epi32(pos[j]))));
        for (int r = 0; r < 2; r++) {
            float *dr = r ? d1 : d0;
            _mm_storeu_ps(dr + 2 * ow, _mm_unpacklo_ps(q[2 * r], q[2 * r + 1]));
            _mm_storeu_ps(dr + 2 * ow + 4, _mm_unpackhi_ps(q[2 * r], q[2 * r + 1]));
        }
    }
}

/* Two rows in vectors of eight or four windows; false (nothing done) for
 * rows of fewer than four. */
static bool maxpool_set_rows_2x2_vec(float *d0, float *d1, const float *dy, const int32_t *a,
                                     int W, int Wo, int32_t base)
{
    if (Wo >= 8)
        maxpool_set_rows_2x2_avx2(d0, d1, dy, a, W, Wo, base);
    else if (Wo >= 4)
        maxpool_set_rows_2x2_x4(d0, d1, dy, a, W, Wo, base);
    return Wo >= 4;
}
#endif

/* A plane of the set form for 2x2, stride-2, unpadded windows that tile it
 * (H = 2 Ho, W = 2 Wo): each input written once, no zeroing first. */
static void maxpool_set_plane_2x2(float *restrict d, const float *restrict dy,
                                  const int32_t *restrict a, int W, int Ho, int Wo)
{
#ifdef POOL_X86
    const bool avx2 = fb_cpu_own_avx2();
#endif
    for (int oh = 0; oh < Ho; oh++) {
        float *restrict d0 = d + (size_t)(2 * oh) * W, *restrict d1 = d0 + W;
        const float *restrict dyr = dy + (size_t)oh * Wo;
        const int32_t *restrict ar = a + (size_t)oh * Wo;
        const int32_t base = 2 * oh * W;
#ifdef POOL_X86
        if (avx2 && maxpool_set_rows_2x2_vec(d0, d1, dyr, ar, W, Wo, base)) continue;
#endif
        for (int ow = 0; ow < Wo; ow++) {
            const int32_t at = ar[ow] - (base + 2 * ow);
            const float v = 0.0f + dyr[ow];
            d0[2 * ow] = at == 0 ? v : 0.0f;
            d0[2 * ow + 1] = at == 1 ? v : 0.0f;
            d1[2 * ow] = at == W ? v : 0.0f;
            d1[2 * ow + 1] = at == W + 1 ? v : 0.0f;
        }
    }
}

/* din [N, BC, H, W] += dout routed to argmax; with set, each plane is zeroed
 * first (or, for 2x2 windows that tile it, written once). */
static void maxpool_backward(fb_backend *be, float *din, const float *dout, const int32_t *argmax,
                             const fb_pool_geom *g, bool set)
{
    const size_t HW = (size_t)g->H * g->W, HoWo = (size_t)g->Ho * g->Wo;
    const size_t P = (size_t)g->N * g->BC;
    const bool tiles = set && g->kh == 2 && g->kw == 2 && g->sh == 2 && g->sw == 2 &&
                       g->ph == 0 && g->pw == 0 && g->H == 2 * g->Ho && g->W == 2 * g->Wo;
    const int nt = fb_cpu_team(be, (double)(P * HW), POOL_GRAIN);
#pragma omp parallel num_threads(nt) if (nt > 1)
    {
        size_t p0, p1;
        fb_cpu_split(P, omp_get_thread_num(), omp_get_num_threads(), 1, &p0, &p1);
        for (size_t p = p0; p < p1; p++) {
            float *restrict d = din + p * HW;
            const float *restrict dy = dout + p * HoWo;
            const int32_t *restrict a = argmax + p * HoWo;
            if (tiles) {
                maxpool_set_plane_2x2(d, dy, a, g->W, g->Ho, g->Wo);
                continue;
            }
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
 * and back).  2x2 windows that tile the plane write each input once instead
 * (eight windows at a time with AVX2).
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
