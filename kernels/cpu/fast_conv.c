/*
 * Fast B-batched 2-D convolution.  Stride 1 with padding narrower than the
 * kernel (3x3 "same" among them), on planes that fit L2, runs on a padded
 * grid with multiply-add kernels of our own (fast_conv_grid.c); every other
 * geometry, here, by im2col + OpenBLAS GEMM, col2im for the input gradient.
 *
 * Per sample, a group's input [C, H, W] unfolds into col [C*kh*kw, Ho*Wo];
 * its output [Mg, Ho*Wo] is then w_g [Mg, C*kh*kw] . col.  Not shared, a group
 * is one member (Mg = K, B groups per sample); shared, the weights of all
 * members form one [B*K, C*kh*kw] matrix against the single input (Mg = B*K,
 * one GEMM per sample), so the input is never unfolded B times.  A 1x1,
 * stride-1, unpadded convolution needs no unfolding: col is the input itself.
 * Per-sample GEMMs are small enough for OpenBLAS's in-cache small-matrix
 * kernels, which measured faster here than GEMMs over several samples.
 * Threads split the samples; the weight and bias gradients are summed in
 * fixed chunks of samples, the same on any number of threads (see
 * fb_cpu_conv2d_scratch_floats).
 */
#include "cpu.h"

#include <cblas.h>
/* cblas.h pulls in <complex.h>, whose macro I would shadow our dimension I. */
#undef I
#include <stddef.h>
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

/* Whether the output keeps the input's width at stride 1 ("same" padding
 * along the rows): then the taps of one (c, i, j) over all in-image output
 * rows read one contiguous run of the input plane, shifted by j - pw, and
 * only each row's first or last column wraps into the neighbouring row. */
static bool conv_rows_contiguous(const fb_conv_geom *g)
{
    return g->sh == 1 && g->sw == 1 && g->Wo == g->W;
}

/* The output rows [*lo, *hi) whose tap row i lands inside [0, H) at stride 1. */
static void conv_row_range(int *lo, int *hi, const fb_conv_geom *g, int i)
{
    int a = g->ph - i, e = g->H + g->ph - i;
    *lo = a < 0 ? 0 : a > g->Ho ? g->Ho : a;
    *hi = e > g->Ho ? g->Ho : e < *lo ? *lo : e;
}

/* Where tap (i, j) of a conv_rows_contiguous geometry reads: output rows
 * [o0, o1) and in each the columns [lo, hi) are in the image; output index q
 * = oh*Wo + ow reads the plane at q + d, over the run [q0, q1) clipped to the
 * plane (what the clipping drops is a wrapped column). */
typedef struct {
    int o0, o1, lo, hi;
    ptrdiff_t d, q0, q1;
} tap_run;

static tap_run conv_tap_run(const fb_conv_geom *g, int i, int j)
{
    tap_run t;
    const ptrdiff_t plane = (ptrdiff_t)g->H * g->W;
    conv_row_range(&t.o0, &t.o1, g, i);
    conv_valid_range(&t.lo, &t.hi, g->W, g->Wo, 1, g->pw, j);
    t.d = (ptrdiff_t)(i - g->ph) * g->W + (j - g->pw);
    t.q0 = (ptrdiff_t)t.o0 * g->Wo;
    t.q1 = (ptrdiff_t)t.o1 * g->Wo;
    if (t.q0 + t.d < 0) t.q0 = -t.d;
    if (t.q1 + t.d > plane) t.q1 = plane - t.d;
    return t;
}

/* Zeroes the wrapped columns of the in-image rows of one col row r. */
static void zero_wrapped(float *restrict r, const tap_run *t, int Wo)
{
    for (int oh = t->o0; oh < t->o1; oh++) {
        float *restrict row = r + (size_t)oh * Wo;
        for (int ow = 0; ow < t->lo; ow++)
            row[ow] = 0.0f;
        for (int ow = t->hi; ow < Wo; ow++)
            row[ow] = 0.0f;
    }
}

/* One (c, i, j) row of col for conv_rows_contiguous geometries: the in-image
 * rows as one copy of the plane's run, then the wrapped columns and the rows
 * in the padding zeroed.  Writes exactly what the general loop writes. */
static void im2col_row_contiguous(float *restrict r, const float *restrict xc,
                                  const fb_conv_geom *g, int i, int j)
{
    const int Wo = g->Wo;
    const tap_run t = conv_tap_run(g, i, j);
    memset(r, 0, (size_t)t.o0 * Wo * sizeof *r);
    memset(r + (size_t)t.o1 * Wo, 0, (size_t)(g->Ho - t.o1) * Wo * sizeof *r);
    if (t.o1 == t.o0) return;
    if (t.q1 > t.q0) memcpy(r + t.q0, xc + t.q0 + t.d, (size_t)(t.q1 - t.q0) * sizeof *r);
    zero_wrapped(r, &t, Wo);
}

/* col[(c*kh + i)*kw + j, oh*Wo + ow] = x[c, oh*sh - ph + i, ow*sw - pw + j],
 * zero where the tap falls in the padding.  x [C, H, W].  Rows are short
 * (Wo values), so they are written by plain loops, not library calls, unless
 * the rows of a tap are one contiguous run (conv_rows_contiguous). */
static void conv_im2col(float *restrict col, const float *restrict x, const fb_conv_geom *g)
{
    const int H = g->H, W = g->W, Ho = g->Ho, Wo = g->Wo, sw = g->sw;
    const size_t HoWo = (size_t)Ho * Wo;
    const bool runs = conv_rows_contiguous(g);
    for (int c = 0; c < g->C; c++)
        for (int i = 0; i < g->kh; i++)
            for (int j = 0; j < g->kw; j++) {
                float *restrict row = col + ((size_t)(c * g->kh + i) * g->kw + j) * HoWo;
                const float *restrict xc = x + (size_t)c * H * W;
                if (runs) {
                    im2col_row_contiguous(row, xc, g, i, j);
                    continue;
                }
                const int shift = j - g->pw; /* input column of ow is ow*sw + shift */
                int lo, hi;
                conv_valid_range(&lo, &hi, W, Wo, sw, g->pw, j);
                for (int oh = 0; oh < Ho; oh++) {
                    float *restrict r = row + (size_t)oh * Wo;
                    int ih = oh * g->sh - g->ph + i;
                    if (ih < 0 || ih >= H) {
                        for (int ow = 0; ow < Wo; ow++)
                            r[ow] = 0.0f;
                        continue;
                    }
                    const float *restrict xr = xc + (size_t)ih * W;
                    for (int ow = 0; ow < lo; ow++)
                        r[ow] = 0.0f;
                    if (sw == 1)
                        for (int ow = lo; ow < hi; ow++)
                            r[ow] = xr[ow + shift];
                    else
                        for (int ow = lo; ow < hi; ow++)
                            r[ow] = xr[ow * sw + shift];
                    for (int ow = hi; ow < Wo; ow++)
                        r[ow] = 0.0f;
                }
            }
}

/* conv_col2im's (c, i, j) row for conv_rows_contiguous geometries: the
 * wrapped columns of the row (padding taps, which add nothing) are cleared,
 * then the in-image rows are added as one run.  Each input element gets the
 * same additions in the same order as from the general loop; a cleared
 * entry adds +0 to the element it wraps onto, which changes nothing unless
 * that element is -0 (then +0). */
static void col2im_row_contiguous(float *restrict xc, float *restrict r, const fb_conv_geom *g,
                                  int i, int j)
{
    const tap_run t = conv_tap_run(g, i, j);
    if (t.o1 == t.o0) return;
    zero_wrapped(r, &t, g->Wo);
    for (ptrdiff_t q = t.q0; q < t.q1; q++)
        xc[q + t.d] += r[q];
}

/* The adjoint of conv_im2col: x[c, ih, iw] += every col entry that was read
 * from it.  col is clobbered where it held padding taps. */
static void conv_col2im(float *restrict x, float *restrict col, const fb_conv_geom *g)
{
    const int H = g->H, W = g->W, Ho = g->Ho, Wo = g->Wo, sw = g->sw;
    const size_t HoWo = (size_t)Ho * Wo;
    const bool runs = conv_rows_contiguous(g);
    for (int c = 0; c < g->C; c++)
        for (int i = 0; i < g->kh; i++)
            for (int j = 0; j < g->kw; j++) {
                float *restrict row = col + ((size_t)(c * g->kh + i) * g->kw + j) * HoWo;
                float *restrict xc = x + (size_t)c * H * W;
                if (runs) {
                    col2im_row_contiguous(xc, row, g, i, j);
                    continue;
                }
                const int shift = j - g->pw;
                int lo, hi;
                conv_valid_range(&lo, &hi, W, Wo, sw, g->pw, j);
                for (int oh = 0; oh < Ho; oh++) {
                    int ih = oh * g->sh - g->ph + i;
                    if (ih < 0 || ih >= H || hi == lo) continue;
                    const float *restrict r = row + (size_t)oh * Wo;
                    float *restrict xr = xc + (size_t)ih * W;
                    if (sw == 1)
                        for (int ow = lo; ow < hi; ow++)
                            xr[ow + shift] += r[ow];
                    else
                        for (int ow = lo; ow < hi; ow++)
                            xr[ow * sw + shift] += r[ow];
                }
            }
}

/* Sum of one output plane, for the bias gradient: eight float lanes the
 * compiler turns into one vector, then added up in double. */
static double plane_sum(const float *restrict x, size_t n)
{
    float lane[8] = {0};
    size_t i = 0;
    for (; i + 8 <= n; i += 8)
        for (int k = 0; k < 8; k++)
            lane[k] += x[i + k];
    double s = 0.0;
    for (int k = 0; k < 8; k++)
        s += lane[k];
    for (; i < n; i++)
        s += x[i];
    return s;
}

/* The columns a sample's group input x [C, H, W] multiplies: x itself for a
 * pointwise convolution, else its unfolding into col_buf. */
static const float *conv_cols(float *col_buf, const float *x, const fb_conv_geom *g)
{
    if (conv_is_pointwise(g)) return x;
    conv_im2col(col_buf, x, g);
    return col_buf;
}

/* Floats of one thread's unfolded input [C*kh*kw, Ho*Wo] (0 when pointwise). */
static size_t col_floats(const fb_conv_geom *g)
{
    return conv_is_pointwise(g) ? 0 : (size_t)g->C * g->kh * g->kw * g->Ho * g->Wo;
}

/* Floats of one thread's space: the grid's (fast_conv_grid.c) or the unfolding. */
static size_t thread_floats(const fb_conv_geom *g)
{
    return fb_cpu_conv_grid_fits(g) ? fb_cpu_conv_grid_floats(g) : col_floats(g);
}

/* Floats of one chunk's weight and bias gradient sums [B*K*C*kh*kw + B*K]. */
static size_t partial_floats(const fb_conv_geom *g)
{
    return (size_t)g->B * g->K * ((size_t)g->C * g->kh * g->kw + 1);
}

/* A conv of this many flops per thread is worth splitting over samples. */
#define CONV_GRAIN 2e6

/* Samples per chunk of the weight and bias gradients: a chunk's sums are
 * formed alone, from zero, and the chunks are added into dw and dbias in
 * chunk order, so the gradients do not depend on how many threads share the
 * chunks (a tile of members on one thread gets what the whole array gets on
 * two). */
#define CONV_CHUNK 16

static size_t conv_chunks(const fb_conv_geom *g)
{
    return ((size_t)g->N + CONV_CHUNK - 1) / CONV_CHUNK;
}

/* Threads for a conv of geometry g: never more than the scratch was sized for. */
static int conv_team(const fb_backend *be, const fb_conv_geom *g)
{
    double flops = 2.0 * g->N * (double)g->B * g->K * g->C * g->kh * g->kw * g->Ho * g->Wo;
    int nt = fb_cpu_team(be, flops, CONV_GRAIN);
    return nt < g->N ? nt : (g->N > 0 ? g->N : 1);
}

/*
 * Floats of scratch for fb_cpu_threads(be) threads: each thread's unfolded
 * input, and the backward's chunk sums: one at a time on one thread, every
 * chunk's on more (they are added up in order at the end).  The size depends
 * on the thread count, so scratch is sized after fb_backend_set_threads.
 */
size_t fb_cpu_conv2d_scratch_floats(const fb_backend *be, const fb_conv_geom *g)
{
    const size_t T = (size_t)fb_cpu_threads(be);
    return T * thread_floats(g) + (T == 1 ? 1 : conv_chunks(g)) * partial_floats(g);
}

/* dw += one chunk's weight gradient sums p [dw_n], dbias += its bias sums
 * (after them in p). */
static void add_sums(float *restrict dw, float *restrict dbias, const float *restrict p,
                     size_t dw_n, size_t BK)
{
    for (size_t i = 0; i < dw_n; i++)
        dw[i] += p[i];
    if (dbias)
        for (size_t ch = 0; ch < BK; ch++)
            dbias[ch] += p[dw_n + ch];
}

/* One sample n of the forward by unfolding: out_n [B*K, Ho, Wo].  col_buf:
 * the thread's unfolding space. */
static void conv_forward_sample(float *out_n, const float *in, const float *w, const float *bias,
                                const fb_conv_geom *g, size_t n, float *col_buf)
{
    /* groups of input channels; per: the members that read one group (all when shared) */
    const int groups = g->shared ? 1 : g->B, per = g->shared ? g->B : 1;
    const int CKK = g->C * g->kh * g->kw, HoWo = g->Ho * g->Wo;
    const size_t HW = (size_t)g->H * g->W, BK = (size_t)g->B * g->K;
    if (bias)
        for (size_t ch = 0; ch < BK; ch++) {
            float *restrict o = out_n + ch * HoWo;
            const float v = bias[ch];
            for (int i = 0; i < HoWo; i++)
                o[i] = v;
        }
    for (int gi = 0; gi < groups; gi++) {
        const float *col = conv_cols(col_buf, in + (n * groups + gi) * g->C * HW, g);
        /* one GEMM per member, of its solo shape (fast_linear.c says why) */
        for (int b = gi * per; b < (gi + 1) * per; b++)
            cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, g->K, HoWo, CKK, 1.0f,
                        w + (size_t)b * g->K * CKK, CKK, col, HoWo, bias ? 1.0f : 0.0f,
                        out_n + (size_t)b * g->K * HoWo, HoWo);
    }
}

/*
 * out[N, B*K, Ho, Wo] = conv(in[N, Bi*C, H, W], w[B, K, C, kh, kw]) + bias[B, K];
 * scratch holds fb_cpu_conv2d_scratch_floats() floats.  Threads take
 * contiguous ranges of samples, each working in its own part of scratch: on
 * the grid (stride 1, fast_conv_grid.c) or unfolded.
 */
void fb_cpu_conv2d_forward(fb_backend *be, float *out, const float *in, const float *w,
                           const float *bias, const fb_conv_geom *g, float *scratch)
{
    const bool pw = conv_is_pointwise(g), grid = fb_cpu_conv_grid_fits(g);
    const size_t BK = (size_t)g->B * g->K, HoWo = (size_t)g->Ho * g->Wo;
    FB_ASSERT(pw || scratch != NULL);
    const int nt = conv_team(be, g);
#pragma omp parallel num_threads(nt) if (nt > 1)
    {
        const int t = omp_get_thread_num();
        float *space = pw ? NULL : scratch + (size_t)t * thread_floats(g);
        size_t n0, n1;
        fb_cpu_split((size_t)g->N, t, omp_get_num_threads(), 1, &n0, &n1);
        if (grid)
            fb_cpu_conv_grid_forward(out, in, w, bias, g, n0, n1, space);
        else
            for (size_t n = n0; n < n1; n++)
                conv_forward_sample(out + n * BK * HoWo, in, w, bias, g, n, space);
    }
}

/* One sample n of the backward: its plane sums into db, its weight gradient
 * into dw (both [B*K*CKK + B*K] sums of a chunk) and (not shared) its input
 * gradient into din.  col_buf: the thread's unfolding space. */
static void conv_backward_sample(float *din, float *dw, float *db, const float *dout,
                                 const float *in, const float *w, const fb_conv_geom *g, size_t n,
                                 float *col_buf)
{
    const bool pw = conv_is_pointwise(g);
    /* groups of input channels; per: the members that read one group (all when shared) */
    const int groups = g->shared ? 1 : g->B, Mg = g->shared ? g->B * g->K : g->K;
    const int per = g->shared ? g->B : 1;
    const int CKK = g->C * g->kh * g->kw, HoWo = g->Ho * g->Wo;
    const size_t HW = (size_t)g->H * g->W, BK = (size_t)g->B * g->K;
    if (db)
        for (size_t ch = 0; ch < BK; ch++)
            db[ch] += (float)plane_sum(dout + (n * BK + ch) * HoWo, (size_t)HoWo);
    for (int gi = 0; gi < groups; gi++) {
        const float *x = in + (n * groups + gi) * g->C * HW;
        const float *dout_g = dout + (n * BK + (size_t)gi * Mg) * HoWo;
        const float *w_g = w + (size_t)gi * Mg * CKK;
        const float *col = conv_cols(col_buf, x, g);
        for (int b = gi * per; b < (gi + 1) * per; b++)
            cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, g->K, CKK, HoWo, 1.0f,
                        dout + (n * BK + (size_t)b * g->K) * HoWo, HoWo, col, HoWo, 1.0f,
                        dw + (size_t)b * g->K * CKK, CKK);
        if (!din) continue;
        float *din_g = din + (n * groups + gi) * g->C * HW;
        if (pw) {
            /* din_g [C, HW] += w_g^T [C, K] . dout_g [K, HW] */
            cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, g->C, HoWo, Mg, 1.0f, w_g, CKK,
                        dout_g, HoWo, 1.0f, din_g, HoWo);
        } else {
            cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, CKK, HoWo, Mg, 1.0f, w_g, CKK,
                        dout_g, HoWo, 0.0f, col_buf, HoWo);
            conv_col2im(din_g, col_buf, g);
        }
    }
}

/*
 * dout [N, B*K, Ho, Wo]; accumulates into dbias[B*K] (plane sums) and dw_g
 * [Mg, CKK] (dout_g . col^T) the sums of each chunk of CONV_CHUNK samples,
 * chunk after chunk, and (not shared) din_g += col2im(w_g^T . dout_g) per
 * sample.  Threads take contiguous ranges of chunks; on one, each chunk's
 * sums are added in as soon as they are formed, on more, after all are.
 */
void fb_cpu_conv2d_backward(fb_backend *be, float *din, float *dw, float *dbias,
                            const float *dout, const float *in, const float *w,
                            const fb_conv_geom *g, float *scratch)
{
    const bool pw = conv_is_pointwise(g);
    const size_t BK = (size_t)g->B * g->K, dw_n = BK * g->C * g->kh * g->kw;
    const size_t nc = conv_chunks(g), np = partial_floats(g);
    if (nc == 0) return;
    FB_ASSERT(scratch != NULL);
    int nt = conv_team(be, g);
    if ((size_t)nt > nc) nt = (int)nc;
    const bool grid = fb_cpu_conv_grid_fits(g);
    float *sums = scratch + (size_t)fb_cpu_threads(be) * thread_floats(g);
#pragma omp parallel num_threads(nt) if (nt > 1)
    {
        const int t = omp_get_thread_num();
        float *space = pw ? NULL : scratch + (size_t)t * thread_floats(g);
        size_t c0, c1;
        fb_cpu_split(nc, t, omp_get_num_threads(), 1, &c0, &c1);
        for (size_t c = c0; c < c1; c++) {
            float *my_dw = nt > 1 ? sums + c * np : sums;
            memset(my_dw, 0, np * sizeof(float));
            const size_t n1 = (c + 1) * CONV_CHUNK, n_end = n1 < (size_t)g->N ? n1 : (size_t)g->N;
            if (grid)
                fb_cpu_conv_grid_backward(din, my_dw, dbias ? my_dw + dw_n : NULL, dout, in, w, g,
                                          c * CONV_CHUNK, n_end, space);
            else
                for (size_t n = c * CONV_CHUNK; n < n_end; n++)
                    conv_backward_sample(din, my_dw, dbias ? my_dw + dw_n : NULL, dout, in, w,
                                         g, n, space);
            if (nt == 1) add_sums(dw, dbias, my_dw, dw_n, BK);
        }
    }
    /* on several threads, every chunk's sums in chunk order */
    if (nt > 1)
        for (size_t c = 0; c < nc; c++)
            add_sums(dw, dbias, sums + c * np, dw_n, BK);
}
