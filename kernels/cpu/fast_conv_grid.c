/*
 * Stride-1 convolutions on a padded grid, multiplied by kernels of our own.
 *
 * A sample's group input x [C, H, W] is copied into zero-padded planes
 * xp [C, Hp, Wp] (Hp = H + 2ph, Wp = W + 2pw).  On the grid of Ho rows of Wp
 * columns, position q = oh*Wp + ow reads tap (c, i, j) at xp[c][q + i*Wp + j]:
 * for every tap the grid reads one contiguous run of xp, so the convolution
 * is a GEMM whose right-hand side is read straight from xp, neither unfolded
 * (im2col) nor repacked (as OpenBLAS repacks it).  The Wp - Wo columns past
 * each output row are computed and dropped.
 *
 *   forward:  y [Mg, grid] = w_g [Mg, C*kh*kw] . taps(xp)
 *   din:      the same product on the output gradient padded by
 *             (kh-1-ph, kw-1-pw), with the kernel flipped and transposed:
 *             y [C, grid'] = w_g' [C, Mg*kh*kw] . taps(dout padded)
 *   dw:       per (row, tap) a dot product over the grid with the output
 *             gradient laid on it, zero in the dropped columns.
 *
 * Rounding: every product is added by a fused multiply-add (one rounding),
 * in a fixed order.  An output element sums its taps in order, from zero.  A
 * weight gradient sums a chunk's grid positions in eight lanes (position mod
 * 8), sample after sample, and adds the lanes in a fixed tree.  The AVX2
 * kernels and the portable loops (fmaf, correctly rounded everywhere) do
 * exactly that, so the bits depend neither on the CPU nor on B nor on the
 * threads (fb_cpu_kernels_portable switches to the portable loops, for the
 * test that shows it; fb_cpu_own_avx2 chooses).
 */
#include "cpu.h"

#include <math.h>
#include <string.h>

#if defined(__x86_64__) && defined(__GNUC__)
#include <immintrin.h>
#define GRID_X86 1
#endif

#define MR 4    /* rows of a tile: broadcast weights (forward) or gradient rows (dw) */
#define NR 24   /* grid positions of a full forward tile: three vectors of 8 */
#define LANES 8 /* the weight gradient's lanes */
#define DW_TAPS 3

static size_t round_up(size_t n, size_t m)
{
    return (n + m - 1) / m * m;
}

/* Floats of the padded planes a product may read (120 KiB).  Every block of
 * four rows reads all of them again; past about this size OpenBLAS, which
 * blocks its GEMM for the cache, measured faster here (3x3 same convolutions
 * on one thread, forward and backward, medians of three: 16 -> 32 channels
 * on 14x14 ran 1.6x faster on the grid, 64 on 14x14 (64 KiB of planes) 1.3x,
 * 32 on 28x28 (115 KiB) 1.15x; 128 on 14x14 (128 KiB) and 64 on 28x28
 * (230 KiB) 0.7-0.8x), so larger ones keep im2col. */
#define GRID_PLANES_MAX 30720

bool fb_cpu_conv_grid_fits(const fb_conv_geom *g)
{
    const bool pointwise = g->kh == 1 && g->kw == 1 && g->ph == 0 && g->pw == 0;
    if (g->sh != 1 || g->sw != 1 || pointwise || g->ph >= g->kh || g->pw >= g->kw || g->Ho <= 0 ||
        g->Wo <= 0)
        return false;
    /* the padded input, and (not shared: shared, there is no input gradient)
     * the padded output gradient the input gradient's product reads */
    const size_t xp = (size_t)g->C * (g->H + 2 * g->ph) * (g->W + 2 * g->pw);
    const size_t dq =
        (size_t)g->K * (g->Ho + 2 * (g->kh - 1 - g->ph)) * (g->Wo + 2 * (g->kw - 1 - g->pw));
    return xp <= GRID_PLANES_MAX && (g->shared || dq <= GRID_PLANES_MAX);
}

/* Taps read by a product: C planes of `plane` floats, rows of Wp, kh x kw. */
typedef struct {
    const float *src;
    size_t plane;
    int C, kh, kw, Wp;
} taps;

/* The sizes one sample's work uses, from the geometry. */
typedef struct {
    int Mg, Mr;         /* rows of a group's weights, and rounded up to MR */
    int Hp, Wp;         /* padded input planes */
    int Hq, Wq, tq, lq; /* padded output-gradient planes, and the padding above and left */
    int Cr;             /* input channels rounded up to MR */
    int CKK, Kr;        /* taps of the weights; with the bias's run, rounded up to DW_TAPS */
    bool dq_is_dg;      /* the padded output gradient, offset, is also it on the grid */
    size_t P, P2;       /* grid positions (forward and dw; din), multiples of 8 */
    size_t xp_n, dg_n, dq_n, y_n, a_n, l_n;
} grid_dims;

static grid_dims dims(const fb_conv_geom *g)
{
    grid_dims d;
    d.Mg = g->shared ? g->B * g->K : g->K;
    d.Mr = (int)round_up((size_t)d.Mg, MR);
    d.Hp = g->H + 2 * g->ph;
    d.Wp = g->W + 2 * g->pw;
    d.tq = g->kh - 1 - g->ph;
    d.lq = g->kw - 1 - g->pw;
    d.Hq = g->Ho + 2 * d.tq;
    d.Wq = g->Wo + 2 * d.lq;
    d.Cr = (int)round_up((size_t)g->C, MR);
    d.CKK = g->C * g->kh * g->kw;
    d.Kr = (int)round_up((size_t)d.CKK + 1, DW_TAPS);
    d.P = round_up((size_t)g->Ho * d.Wp, LANES);
    d.P2 = round_up((size_t)g->H * d.Wq, LANES);
    /* a product reads past its last plane by at most NR + kw floats */
    const size_t slack = NR + (size_t)g->kw;
    d.xp_n = round_up((size_t)g->C * d.Hp * d.Wp + slack, 16);
    /* Read from row tq, column lq on, the padded output gradient is the
     * gradient on the grid when the rows are as long (Wq == Wp: the columns
     * past each row are padding, zero) and the grid's last positions (up to 7
     * past Ho*Wp) land in zeros: the 2*tq rows of padding between planes, or
     * the slack after the last (sized for the rows past Mg too). */
    d.dq_is_dg = d.Wq == d.Wp && (d.P == (size_t)g->Ho * d.Wp || 2 * (size_t)d.tq * d.Wq >= 8);
    d.dg_n = d.dq_is_dg ? 0 : (size_t)d.Mr * d.P;
    d.dq_n = round_up((size_t)d.Mr * d.Hq * d.Wq + slack, 16);
    d.y_n = (size_t)MR * (d.P > d.P2 ? d.P : d.P2); /* one block of rows */
    const size_t af = (size_t)d.Mr * d.CKK, ab = (size_t)d.Cr * d.Mg * g->kh * g->kw;
    d.a_n = af > ab ? af : ab;
    d.l_n = (size_t)d.Mr * d.Kr * LANES;
    return d;
}

size_t fb_cpu_conv_grid_floats(const fb_conv_geom *g)
{
    const grid_dims d = dims(g);
    return d.xp_n + d.dg_n + d.dq_n + d.y_n + d.a_n + d.l_n + d.P;
}

/*
 * Places src [C, h, w] into planes of rows Ws long, `stride` floats apart, at
 * row top, column left.  The rest of each plane (the padding) is written by
 * nobody and stays as the caller zeroed it once, for every sample.  Rows are
 * short: a plain loop, not a library call (see kernels/CMakeLists.txt).
 */
static void place_planes(float *restrict dst, size_t stride, const float *restrict src, int C,
                         int h, int w, int top, int left, int Ws)
{
    for (int c = 0; c < C; c++)
        for (int r = 0; r < h; r++) {
            float *restrict row = dst + (size_t)c * stride + (size_t)(top + r) * Ws + left;
            const float *restrict sr = src + ((size_t)c * h + r) * w;
            for (int k = 0; k < w; k++)
                row[k] = sr[k];
        }
}

/* ---- the product: y [MR, P] = a (one block of rows, packed [taps][MR]) . taps ---- */

#ifdef GRID_X86
/* One tile: MR rows by nv vectors of 8 positions from t->src (already offset
 * to the tile).  Inlined with nv constant, so the accumulators stay in
 * registers. */
__attribute__((target("avx2,fma"), always_inline)) static inline void
tile_avx2(float *restrict y, size_t ldy, const float *restrict a, const taps *t, const float *src,
          int nv, int kw_const)
{
    const int kw = kw_const ? kw_const : t->kw;
    __m256 acc[MR][3];
    for (int r = 0; r < MR; r++)
        for (int v = 0; v < 3; v++)
            acc[r][v] = _mm256_setzero_ps();
    for (int c = 0; c < t->C; c++)
        for (int i = 0; i < t->kh; i++) {
            const float *row = src + (size_t)c * t->plane + (size_t)i * t->Wp;
            for (int j = 0; j < kw; j++, a += MR) {
                __m256 b[3];
                for (int v = 0; v < nv; v++)
                    b[v] = _mm256_loadu_ps(row + j + 8 * v);
                for (int r = 0; r < MR; r++) {
                    const __m256 w = _mm256_broadcast_ss(a + r);
                    for (int v = 0; v < nv; v++)
                        acc[r][v] = _mm256_fmadd_ps(w, b[v], acc[r][v]);
                }
            }
        }
    for (int r = 0; r < MR; r++)
        for (int v = 0; v < nv; v++)
            _mm256_storeu_ps(y + r * ldy + 8 * v, acc[r][v]);
}

/* The block's weights and the taps stay in L1 while the tiles move along the grid. */
__attribute__((target("avx2,fma"))) static void
product_avx2(float *restrict y, size_t ldy, const float *restrict a, const taps *t, size_t P)
{
    for (size_t q = 0; q < P;) {
        const size_t left = P - q;
        /* 32 left goes as 16 + 16: a tile of one vector has too few sums in flight */
        const int nv = left >= NR && left != 32 ? 3 : left >= 16 ? 2 : 1;
        /* the common 3-wide kernel unrolled */
        if (nv == 3 && t->kw == 3)
            tile_avx2(y + q, ldy, a, t, t->src + q, 3, 3);
        else if (nv == 3)
            tile_avx2(y + q, ldy, a, t, t->src + q, 3, 0);
        else if (nv == 2)
            tile_avx2(y + q, ldy, a, t, t->src + q, 2, 0);
        else
            tile_avx2(y + q, ldy, a, t, t->src + q, 1, 0);
        q += (size_t)nv * 8;
    }
}
#endif

/* The same sums by fmaf, one position at a time. */
static void product_portable(float *restrict y, size_t ldy, const float *restrict a, const taps *t,
                             size_t P)
{
    for (size_t q = 0; q < P; q++) {
        float acc[MR] = {0};
        const float *ak = a;
        for (int c = 0; c < t->C; c++)
            for (int i = 0; i < t->kh; i++) {
                const float *row = t->src + (size_t)c * t->plane + (size_t)i * t->Wp + q;
                for (int j = 0; j < t->kw; j++, ak += MR)
                    for (int r = 0; r < MR; r++)
                        acc[r] = fmaf(ak[r], row[j], acc[r]);
            }
        for (int r = 0; r < MR; r++)
            y[(size_t)r * ldy + q] = acc[r];
    }
}

static void product(float *y, size_t ldy, const float *a, const taps *t, size_t P)
{
#ifdef GRID_X86
    if (fb_cpu_own_avx2()) {
        product_avx2(y, ldy, a, t, P);
        return;
    }
#endif
    product_portable(y, ldy, a, t, P);
}

/* ---- the weight gradient: lanes += dot products over the grid ---- */

/* The runs the weight gradient multiplies: tap k < CKK of t, then (k == CKK)
 * the run of ones whose products sum the bias gradient; taps past those read
 * the first, and their sums are dropped. */
typedef struct {
    taps t;
    const float *ones;
    int CKK;
} runs;

/* Walks the runs in order without dividing: run k is tap (c, i, j). */
typedef struct {
    const runs *r;
    int k, c, i, j;
} run_cursor;

__attribute__((always_inline)) static inline const float *next_run(run_cursor *u)
{
    const runs *r = u->r;
    const taps *t = &r->t;
    const float *p = u->k == r->CKK ? r->ones
                     : u->k > r->CKK
                         ? t->src
                         : t->src + (size_t)u->c * t->plane + (size_t)u->i * t->Wp + u->j;
    u->k++;
    if (++u->j == t->kw) {
        u->j = 0;
        if (++u->i == t->kh) {
            u->i = 0;
            u->c++;
        }
    }
    return p;
}

/* lane [Mr rows][Kr runs][LANES] += d [Mr, P] (the output gradient on the
 * grid, rows ldd apart) times each run. */
#ifdef GRID_X86
__attribute__((target("avx2,fma"))) static void dots_avx2(float *restrict lane, int Mr, int Kr,
                                                          const float *restrict d, size_t ldd,
                                                          size_t P, const runs *rs)
{
    const size_t lr = (size_t)Kr * LANES;
    for (int m = 0; m < Mr; m += MR) {
        run_cursor u = {.r = rs};
        for (int k = 0; k < Kr; k += DW_TAPS) {
            float *l = lane + ((size_t)m * Kr + k) * LANES;
            const float *x0 = next_run(&u), *x1 = next_run(&u), *x2 = next_run(&u);
            __m256 acc[MR][DW_TAPS];
            for (int r = 0; r < MR; r++)
                for (int t = 0; t < DW_TAPS; t++)
                    acc[r][t] = _mm256_loadu_ps(l + r * lr + t * LANES);
            for (size_t q = 0; q < P; q += 8) {
                const __m256 b0 = _mm256_loadu_ps(x0 + q), b1 = _mm256_loadu_ps(x1 + q),
                             b2 = _mm256_loadu_ps(x2 + q);
                for (int r = 0; r < MR; r++) {
                    const __m256 g = _mm256_loadu_ps(d + (size_t)(m + r) * ldd + q);
                    acc[r][0] = _mm256_fmadd_ps(g, b0, acc[r][0]);
                    acc[r][1] = _mm256_fmadd_ps(g, b1, acc[r][1]);
                    acc[r][2] = _mm256_fmadd_ps(g, b2, acc[r][2]);
                }
            }
            for (int r = 0; r < MR; r++)
                for (int t = 0; t < DW_TAPS; t++)
                    _mm256_storeu_ps(l + r * lr + t * LANES, acc[r][t]);
        }
    }
}
#endif

static void dots_portable(float *restrict lane, int Mr, int Kr, const float *restrict d, size_t ldd,
                          size_t P, const runs *rs)
{
    for (int m = 0; m < Mr; m++) {
        run_cursor u = {.r = rs};
        for (int k = 0; k < Kr; k++) {
            float *l = lane + ((size_t)m * Kr + k) * LANES;
            const float *dm = d + (size_t)m * ldd, *xk = next_run(&u);
            for (size_t q = 0; q < P; q++)
                l[q % LANES] = fmaf(dm[q], xk[q], l[q % LANES]);
        }
    }
}

static void dots(float *lane, int Mr, int Kr, const float *d, size_t ldd, size_t P, const runs *rs)
{
#ifdef GRID_X86
    if (fb_cpu_own_avx2()) {
        dots_avx2(lane, Mr, Kr, d, ldd, P, rs);
        return;
    }
#endif
    dots_portable(lane, Mr, Kr, d, ldd, P, rs);
}

/* The lanes of one weight gradient added in a fixed tree. */
static float lane_sum(const float *l)
{
    return ((l[0] + l[1]) + (l[2] + l[3])) + ((l[4] + l[5]) + (l[6] + l[7]));
}

/* ---- per sample and per chunk ---- */

/* a [Mr/MR][CKK][MR] = w_g [Mg, CKK] by row blocks, zero rows past Mg. */
static void pack_rows(float *restrict a, const float *restrict w_g, int Mg, int Mr, int CKK)
{
    for (int m = 0; m < Mr; m += MR)
        for (int k = 0; k < CKK; k++)
            for (int r = 0; r < MR; r++)
                a[((size_t)m * CKK) + (size_t)k * MR + r] =
                    m + r < Mg ? w_g[(size_t)(m + r) * CKK + k] : 0.0f;
}

/* a [Cr/MR][Mg*kh*kw][MR]: row c, tap (m, i, j) = w_g[m, c, kh-1-i, kw-1-j]. */
static void pack_flipped(float *restrict a, const float *restrict w_g, const fb_conv_geom *g,
                         int Mg, int Cr)
{
    const int kk = g->kh * g->kw, T = Mg * kk;
    for (int c0 = 0; c0 < Cr; c0 += MR)
        for (int m = 0; m < Mg; m++)
            for (int i = 0; i < g->kh; i++)
                for (int j = 0; j < g->kw; j++) {
                    const int tap = (m * g->kh + i) * g->kw + j;
                    float *dst = a + (size_t)c0 * T + (size_t)tap * MR;
                    for (int r = 0; r < MR; r++) {
                        const int c = c0 + r;
                        dst[r] =
                            c < g->C
                                ? w_g[((size_t)m * g->C + c) * kk +
                                      (size_t)(g->kh - 1 - i) * g->kw + (size_t)(g->kw - 1 - j)]
                                : 0.0f;
                    }
                }
}

/* Scratch regions of one thread. */
typedef struct {
    float *xp, *dg, *dq, *y, *a, *lane, *ones;
} grid_space;

static grid_space space(float *s, const grid_dims *d)
{
    grid_space p;
    p.xp = s;
    p.dg = p.xp + d->xp_n;
    p.dq = p.dg + d->dg_n;
    p.y = p.dq + d->dq_n;
    p.a = p.y + d->y_n;
    p.lane = p.a + d->a_n;
    p.ones = p.lane + d->l_n;
    return p;
}

static void pad_input(float *xp, const float *x, const fb_conv_geom *g, const grid_dims *d)
{
    place_planes(xp, (size_t)d->Hp * d->Wp, x, g->C, g->H, g->W, g->ph, g->pw, d->Wp);
}

static taps input_taps(const float *xp, const fb_conv_geom *g, const grid_dims *d)
{
    return (taps){.src = xp,
                  .plane = (size_t)d->Hp * d->Wp,
                  .C = g->C,
                  .kh = g->kh,
                  .kw = g->kw,
                  .Wp = d->Wp};
}

/*
 * Samples [n0, n1): out_n [B*K, Ho, Wo] (its group inputs at in + n's) = the
 * product plus bias (when not NULL), one group after another.
 */
void fb_cpu_conv_grid_forward(float *out, const float *in, const float *w, const float *bias,
                              const fb_conv_geom *g, size_t n0, size_t n1, float *scratch)
{
    const grid_dims d = dims(g);
    grid_space s = space(scratch, &d);
    const int groups = g->shared ? 1 : g->B;
    const size_t HW = (size_t)g->H * g->W, HoWo = (size_t)g->Ho * g->Wo;
    const size_t BK = (size_t)g->B * g->K;
    memset(s.xp, 0, d.xp_n * sizeof *s.xp);
    for (int gi = 0; gi < groups; gi++) {
        pack_rows(s.a, w + (size_t)gi * d.Mg * d.CKK, d.Mg, d.Mr, d.CKK);
        for (size_t n = n0; n < n1; n++) {
            pad_input(s.xp, in + (n * groups + gi) * g->C * HW, g, &d);
            const taps t = input_taps(s.xp, g, &d);
            /* a block of rows at a time, taken out of y while it is in L1 */
            for (int m0 = 0; m0 < d.Mg; m0 += MR) {
                product(s.y, d.P, s.a + (size_t)m0 * d.CKK, &t, d.P);
                for (int m = m0; m < d.Mg && m < m0 + MR; m++) {
                    const size_t ch = (size_t)gi * d.Mg + m;
                    const float bv = bias ? bias[ch] : 0.0f;
                    float *out_m = out + (n * BK + ch) * HoWo;
                    for (int oh = 0; oh < g->Ho; oh++) {
                        const float *restrict yr = s.y + (size_t)(m - m0) * d.P + (size_t)oh * d.Wp;
                        float *restrict o = out_m + (size_t)oh * g->Wo;
                        if (bias)
                            for (int ow = 0; ow < g->Wo; ow++)
                                o[ow] = yr[ow] + bv;
                        else
                            for (int ow = 0; ow < g->Wo; ow++)
                                o[ow] = yr[ow];
                    }
                }
            }
        }
    }
}

/*
 * Samples [n0, n1) of one chunk: sums [B*K*CKK] = their weight gradients and
 * (when db is not NULL) db [B*K] = their bias gradients, set one group after
 * another; (when din is not NULL) their input gradients added into din.
 */
void fb_cpu_conv_grid_backward(float *din, float *sums, float *db, const float *dout,
                               const float *in, const float *w, const fb_conv_geom *g, size_t n0,
                               size_t n1, float *scratch)
{
    const grid_dims d = dims(g);
    grid_space s = space(scratch, &d);
    const int groups = g->shared ? 1 : g->B;
    const size_t HW = (size_t)g->H * g->W, HoWo = (size_t)g->Ho * g->Wo;
    const size_t BK = (size_t)g->B * g->K, planeq = (size_t)d.Hq * d.Wq;
    const int Kr = d.Kr;
    for (size_t q = 0; q < d.P; q++)
        s.ones[q] = 1.0f;
    /* the padding of every plane, for all the samples */
    memset(s.xp, 0, d.xp_n * sizeof *s.xp);
    memset(s.dg, 0, d.dg_n * sizeof *s.dg);
    if (din || d.dq_is_dg) memset(s.dq, 0, d.dq_n * sizeof *s.dq);
    for (int gi = 0; gi < groups; gi++) {
        memset(s.lane, 0, d.l_n * sizeof *s.lane);
        if (din) pack_flipped(s.a, w + (size_t)gi * d.Mg * d.CKK, g, d.Mg, d.Cr);
        for (size_t n = n0; n < n1; n++) {
            const float *dout_g = dout + (n * BK + (size_t)gi * d.Mg) * HoWo;
            pad_input(s.xp, in + (n * groups + gi) * g->C * HW, g, &d);
            const runs rs = {.t = input_taps(s.xp, g, &d), .ones = s.ones, .CKK = d.CKK};
            if (din || d.dq_is_dg)
                place_planes(s.dq, planeq, dout_g, d.Mg, g->Ho, g->Wo, d.tq, d.lq, d.Wq);
            if (d.dq_is_dg) {
                /* the padded output gradient is already laid on the grid */
                dots(s.lane, d.Mr, Kr, s.dq + (size_t)d.tq * d.Wq + d.lq, planeq, d.P, &rs);
            } else {
                /* the output gradient on the grid: rows of Wp, the last Wp - Wo zero */
                place_planes(s.dg, d.P, dout_g, d.Mg, g->Ho, g->Wo, 0, 0, d.Wp);
                dots(s.lane, d.Mr, Kr, s.dg, d.P, d.P, &rs);
            }
            if (!din) continue;
            const taps t = {
                .src = s.dq, .plane = planeq, .C = d.Mg, .kh = g->kh, .kw = g->kw, .Wp = d.Wq};
            float *din_g = din + (n * groups + gi) * g->C * HW;
            const size_t T = (size_t)d.Mg * g->kh * g->kw;
            for (int c0 = 0; c0 < g->C; c0 += MR) {
                product(s.y, d.P2, s.a + (size_t)c0 * T, &t, d.P2);
                for (int c = c0; c < g->C && c < c0 + MR; c++)
                    for (int ih = 0; ih < g->H; ih++) {
                        const float *restrict yr =
                            s.y + (size_t)(c - c0) * d.P2 + (size_t)ih * d.Wq;
                        float *restrict o = din_g + (size_t)c * HW + (size_t)ih * g->W;
                        for (int iw = 0; iw < g->W; iw++)
                            o[iw] += yr[iw];
                    }
            }
        }
        for (int m = 0; m < d.Mg; m++) {
            const float *lm = s.lane + (size_t)m * Kr * LANES;
            float *sm = sums + ((size_t)gi * d.Mg + m) * d.CKK;
            for (int k = 0; k < d.CKK; k++)
                sm[k] = lane_sum(lm + (size_t)k * LANES);
            if (db) db[(size_t)gi * d.Mg + m] = lane_sum(lm + (size_t)d.CKK * LANES);
        }
    }
}
