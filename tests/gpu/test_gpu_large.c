/*
 * The CUDA backend's own kernels on sizes past one pass of their grid, and on
 * degenerate shapes, against cpu-ref.
 *
 * fbc_grid (kernels/cuda/cuda_internal.h) caps a launch at 32 blocks per SM,
 * so on any device of up to 160 SMs an elementwise kernel of 256 threads
 * covers at most 1.3 million items per pass, a one-warp-per-row kernel 41
 * thousand rows, a 128-thread loss kernel 655 thousand rows.  The
 * cross-check's cases are far smaller, so the grid-stride continuation
 * (indices past the first pass) is never exercised there; every case here
 * is several passes long: activations, add, accumulate, dropout, max
 * pooling both ways, global average pooling, layer norm, the cross-entropy
 * rows and the fused Adam step.  Overwritten outputs start as NaN on the
 * device, so an element no thread reaches shows up.  Skipped (77) where no
 * CUDA device is usable and in a build without CUDA;
 * FB_GPU_CROSSCHECK_BACKEND=cpu runs the cases on the fast CPU backend.
 */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "check.h"
#include "cuda/cuda_backend.h"
#include "gpu_test.h"
#include "errors.h"
#include "kernels.h"

#define B_DBL 1e-6
#define B_EXACT 0.0

static fb_backend *g_cu, *g_ref;
static uint64_t g_rng;
static int g_failures;

static float rnd_val(void)
{
    g_rng ^= g_rng << 13;
    g_rng ^= g_rng >> 7;
    g_rng ^= g_rng << 17;
    float u = (float)(g_rng >> 40) / 16777216.0f;
    return (g_rng & 1) ? 0.1f + 0.9f * u : -0.1f - 0.9f * u;
}

/* A tensor on both backends: the reference's copy h, the device's d. */
typedef struct {
    size_t n;
    float *h, *d;
} pair;

/* n floats: random on both sides (nan_dev false), or random on the host and
 * NaN on the device (an output the op overwrites). */
static pair pair_new(size_t n, bool nan_dev)
{
    pair p = {.n = n};
    p.h = fb_backend_alloc(g_ref, (n ? n : 1) * sizeof(float));
    p.d = fb_backend_alloc(g_cu, (n ? n : 1) * sizeof(float));
    float *tmp = malloc((n ? n : 1) * sizeof *tmp);
    CHECK(p.h && p.d && tmp);
    for (size_t i = 0; i < n; i++) {
        p.h[i] = rnd_val();
        tmp[i] = nan_dev ? NAN : p.h[i];
    }
    fb_backend_upload(g_cu, p.d, tmp, n * sizeof *tmp);
    free(tmp);
    return p;
}

static void pair_free(pair *p)
{
    fb_backend_free(g_ref, p->h);
    fb_backend_free(g_cu, p->d);
}

/* Compares the device copy with the reference by normalised error; a NaN
 * left on the device fails. */
static void expect(const char *op, const char *what, const pair *p, double bound)
{
    char msg[256];
    float *got = malloc((p->n ? p->n : 1) * sizeof *got);
    CHECK(got != NULL);
    fb_backend_sync(g_cu);
    fb_backend_download(g_cu, got, p->d, p->n * sizeof *got);
    int rc = fb_cuda_backend_error(g_cu, msg, sizeof msg);
    if (rc != FB_OK) fprintf(stderr, "%s %s: backend error: %s\n", op, what, msg);
    CHECK_INT_EQ(rc, FB_OK);
    double num = 0.0, den = 0.0;
    size_t nans = 0;
    for (size_t i = 0; i < p->n; i++) {
        if (isnan(got[i]) != isnan(p->h[i])) nans++;
        double d = (double)got[i] - p->h[i];
        num += d * d;
        den += (double)p->h[i] * p->h[i];
    }
    double e = den > 0.0 ? sqrt(num / den) : sqrt(num);
    bool ok = nans == 0 && e <= bound;
    if (!ok) g_failures++;
    printf("%s %-40s %-8s n=%-9zu nerr=%.3g (bound %.1g) nan mismatches=%zu\n",
           ok ? "ok  " : "FAIL", op, what, p->n, e, bound, nans);
    free(got);
}

#define BIG ((size_t)3000017) /* odd, and past two passes of any grid up to 160 SMs */

static void case_eltwise(void)
{
    pair in = pair_new(BIG, false), out = pair_new(BIG, true);
    fb_act_forward(g_ref, FB_ACT_GELU, out.h, in.h, BIG);
    fb_act_forward(g_cu, FB_ACT_GELU, out.d, in.d, BIG);
    expect("gelu forward 3000017", "out", &out, B_DBL);
    pair dout = pair_new(BIG, false), din = pair_new(BIG, false);
    fb_act_backward(g_ref, FB_ACT_SIGMOID, din.h, dout.h, in.h, out.h, BIG);
    fb_act_backward(g_cu, FB_ACT_SIGMOID, din.d, dout.d, in.d, out.d, BIG);
    expect("sigmoid backward 3000017", "din", &din, B_DBL);
    pair sum = pair_new(BIG, true);
    fb_add_forward(g_ref, sum.h, in.h, dout.h, BIG);
    fb_add_forward(g_cu, sum.d, in.d, dout.d, BIG);
    expect("add 3000017", "out", &sum, B_EXACT);
    pair y = pair_new(BIG, false); /* equal on both sides, unlike din by now */
    fb_accumulate(g_ref, y.h, sum.h, BIG);
    fb_accumulate(g_cu, y.d, sum.d, BIG);
    expect("accumulate 3000017", "y", &y, B_EXACT);
    pair *all[] = {&in, &out, &dout, &din, &sum, &y};
    for (size_t i = 0; i < sizeof all / sizeof *all; i++)
        pair_free(all[i]);
}

static void case_dropout(void)
{
    const int N = 1000, B = 3, F = 1031;
    const uint64_t seeds[3] = {11, 12, 0x9e3779b97f4a7c15ull};
    size_t n = (size_t)N * B * F;
    pair in = pair_new(n, false), out = pair_new(n, true);
    fb_dropout_forward(g_ref, out.h, in.h, seeds, 5, 0.3f, N, B, F, 77);
    fb_dropout_forward(g_cu, out.d, in.d, seeds, 5, 0.3f, N, B, F, 77);
    expect("dropout N1000 B3 F1031", "out", &out, B_EXACT);
    pair_free(&in);
    pair_free(&out);
}

static void case_maxpool(void)
{
    fb_pool_geom g = {
        .N = 8, .BC = 96, .H = 64, .W = 64, .kh = 3, .kw = 3, .sh = 2, .sw = 2, .ph = 1, .pw = 1};
    fb_pool_geom_finish(&g);
    size_t nin = (size_t)g.N * g.BC * g.H * g.W, nout = (size_t)g.N * g.BC * g.Ho * g.Wo;
    pair in = pair_new(nin, false), out = pair_new(nout, true);
    int32_t *am_h = fb_backend_alloc(g_ref, nout * sizeof *am_h);
    int32_t *am_d = fb_backend_alloc(g_cu, nout * sizeof *am_d);
    CHECK(am_h && am_d);
    fb_maxpool2d_forward(g_ref, out.h, am_h, in.h, &g);
    fb_maxpool2d_forward(g_cu, out.d, am_d, in.d, &g);
    expect("maxpool N8 BC96 64x64 k3 s2 p1", "out", &out, B_EXACT);
    int32_t *am = malloc(nout * sizeof *am);
    CHECK(am != NULL);
    fb_backend_download(g_cu, am, am_d, nout * sizeof *am);
    size_t diff = 0;
    for (size_t i = 0; i < nout; i++)
        diff += am[i] != am_h[i];
    printf("%s maxpool argmax mismatches=%zu of %zu\n", diff ? "FAIL" : "ok  ", diff, nout);
    if (diff) g_failures++;
    free(am);
    pair dout = pair_new(nout, false), din = pair_new(nin, false);
    fb_maxpool2d_backward(g_ref, din.h, dout.h, am_h, &g);
    fb_maxpool2d_backward(g_cu, din.d, dout.d, am_d, &g);
    expect("maxpool backward (3.1M inputs)", "din", &din, B_EXACT);
    fb_backend_free(g_ref, am_h);
    fb_backend_free(g_cu, am_d);
    pair *all[] = {&in, &out, &dout, &din};
    for (size_t i = 0; i < sizeof all / sizeof *all; i++)
        pair_free(all[i]);
}

static void case_gap_layernorm(void)
{
    const int N = 1000, BC = 96, HW = 7; /* 96000 planes, one warp each */
    pair in = pair_new((size_t)N * BC * HW, false), out = pair_new((size_t)N * BC, true);
    fb_global_avgpool_forward(g_ref, out.h, in.h, N, BC, HW);
    fb_global_avgpool_forward(g_cu, out.d, in.d, N, BC, HW);
    expect("global avgpool 96000 planes", "out", &out, B_DBL);
    pair_free(&in);
    pair_free(&out);

    const int LN = 1024, LB = 80, LF = 33; /* 81920 rows, one warp each */
    size_t n = (size_t)LN * LB * LF;
    pair x = pair_new(n, false), y = pair_new(n, true), g = pair_new((size_t)LB * LF, false);
    pair bt = pair_new((size_t)LB * LF, false);
    pair mean = pair_new((size_t)LN * LB, true), rstd = pair_new((size_t)LN * LB, true);
    fb_layernorm_forward(g_ref, y.h, mean.h, rstd.h, x.h, g.h, bt.h, LN, LB, LF, 1e-5f);
    fb_layernorm_forward(g_cu, y.d, mean.d, rstd.d, x.d, g.d, bt.d, LN, LB, LF, 1e-5f);
    expect("layernorm 81920 rows F33", "out", &y, B_DBL);
    expect("layernorm 81920 rows F33", "rstd", &rstd, B_DBL);
    pair dy = pair_new(n, false), dx = pair_new(n, false);
    fb_layernorm_backward(g_ref, dx.h, NULL, NULL, dy.h, x.h, mean.h, rstd.h, g.h, LN, LB, LF);
    fb_layernorm_backward(g_cu, dx.d, NULL, NULL, dy.d, x.d, mean.d, rstd.d, g.d, LN, LB, LF);
    expect("layernorm backward 81920 rows", "din", &dx, B_DBL);
    pair *all[] = {&x, &y, &g, &bt, &mean, &rstd, &dy, &dx};
    for (size_t i = 0; i < sizeof all / sizeof *all; i++)
        pair_free(all[i]);
}

static void case_xent(void)
{
    const int N = 25000, B = 32, K = 3; /* 800000 rows, one thread each */
    size_t n = (size_t)N * B * K;
    pair z = pair_new(n, false), dz = pair_new(n, true);
    pair loss = pair_new(B, true), correct = pair_new(B, true);
    int32_t *y_h = fb_backend_alloc(g_ref, (size_t)N * sizeof *y_h);
    int32_t *y_d = fb_backend_alloc(g_cu, (size_t)N * sizeof *y_d);
    CHECK(y_h && y_d);
    for (int i = 0; i < N; i++)
        y_h[i] = (int32_t)(((void)rnd_val(), g_rng >> 33) % (uint64_t)K);
    fb_backend_upload(g_cu, y_d, y_h, (size_t)N * sizeof *y_h);
    fb_softmax_xent(g_ref, loss.h, dz.h, correct.h, z.h, y_h, N, B, K, 1.0f / N);
    fb_softmax_xent(g_cu, loss.d, dz.d, correct.d, z.d, y_d, N, B, K, 1.0f / N);
    expect("softmax_xent 800000 rows", "dlogits", &dz, B_DBL);
    expect("softmax_xent 800000 rows", "loss", &loss, B_DBL);
    expect("softmax_xent 800000 rows", "correct", &correct, B_EXACT);
    fb_backend_free(g_ref, y_h);
    fb_backend_free(g_cu, y_d);
    pair *all[] = {&z, &dz, &loss, &correct};
    for (size_t i = 0; i < sizeof all / sizeof *all; i++)
        pair_free(all[i]);
}

static void case_adam(void)
{
    const int B = 3;
    fb_param_block blocks[2] = {{.offset = 0, .per_member = 700001},
                                {.offset = 3 * 700001, .per_member = 300007}};
    size_t n = (size_t)B * (700001 + 300007);
    pair p = pair_new(n, false), g = pair_new(n, false), m = pair_new(n, false);
    pair v = pair_new(n, false);
    for (size_t i = 0; i < n; i++)
        v.h[i] = fabsf(v.h[i]);
    fb_backend_upload(g_cu, v.d, v.h, n * sizeof(float));
    fb_optim_hparams hp[3];
    for (int b = 0; b < B; b++)
        hp[b] = (fb_optim_hparams){.lr = 1e-3f * (float)(b + 1),
                                   .weight_decay = 0.01f,
                                   .beta1 = 0.9f,
                                   .beta2 = 0.999f,
                                   .eps = 1e-8f,
                                   .t = 3 + b};
    fb_optim_step(g_ref, FB_OPTIM_KIND_ADAMW, p.h, g.h, m.h, v.h, blocks, 2, B, hp);
    fb_optim_step(g_cu, FB_OPTIM_KIND_ADAMW, p.d, g.d, m.d, v.d, blocks, 2, B, hp);
    expect("adamw 3.0M parameters", "params", &p, B_DBL);
    expect("adamw 3.0M parameters", "state1", &m, B_DBL);
    expect("adamw 3.0M parameters", "state2", &v, B_DBL);
    pair *all[] = {&p, &g, &m, &v};
    for (size_t i = 0; i < sizeof all / sizeof *all; i++)
        pair_free(all[i]);
}

int main(void)
{
    setvbuf(stdout, NULL, _IOLBF, 0);
    /* FB_GPU_CROSSCHECK_BACKEND=cpu runs the cases on the fast CPU backend,
     * as the cross-check does: it proves the harness without a GPU. */
    int rc = gt_backends(true, &g_cu, &g_ref, NULL);
    if (rc) return rc;
    g_rng = gt_seed();

    case_eltwise();
    case_dropout();
    case_maxpool();
    case_gap_layernorm();
    case_xent();
    case_adam();
    if (g_failures) {
        fprintf(stderr, "%d comparison(s) failed\n", g_failures);
        return 1;
    }
    printf("ok\n");
    return 0;
}
