/*
 * The timed cuDNN algorithm search (FUSEBOX_CUDNN_SEARCH, kernels/cuda/cuda_conv.cu).
 *
 * For grouped, shared and ungrouped convolutions, small and large enough for
 * cuDNN to offer several algorithms, each shape runs forward and backward
 * with the heuristic choice, then with the timed one, on the same random
 * inputs and the same starting values of the accumulated gradients.  It
 * requires:
 *   - the timed outputs (out, din, dw, dbias) equal the heuristic ones and
 *     cpu-ref's within the cross-check's convolution bound;
 *   - the guard floats after every output survive (the search writes only
 *     its own scratch);
 *   - the heuristic plan runs no search, the timed plan one per direction
 *     (two for the shared first layer, which has no data gradient), and a
 *     second timed step on the same shape makes no plan and no search and
 *     gives the same bits (the choice is cached with the plan);
 *   - an unknown FUSEBOX_CUDNN_SEARCH value is the backend's error
 *     FB_ERR_BAD_ENUM naming the variable, and the output stays untouched.
 * Skipped (77) where no CUDA device is usable and in a build without CUDA.
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

#define GUARD 32
#define SENTINEL 12345.5f
/* The cross-check's bound for float convolutions (test_gpu_crosscheck.c). */
#define B_CONV 5e-5
#define B_DBL 1e-6

static fb_backend *g_cu, *g_ref;
static uint64_t g_rng;

static float rnd_val(void)
{
    g_rng ^= g_rng << 13;
    g_rng ^= g_rng >> 7;
    g_rng ^= g_rng << 17;
    float u = (float)(g_rng >> 40) / 16777216.0f;
    return (g_rng & 1) ? 0.1f + 0.9f * u : -0.1f - 0.9f * u;
}

/* n random floats (n + GUARD in host memory, the guard set). */
static float *host_rand(size_t n)
{
    float *h = malloc((n + GUARD) * sizeof *h);
    CHECK(h != NULL);
    for (size_t i = 0; i < n; i++)
        h[i] = rnd_val();
    for (int i = 0; i < GUARD; i++)
        h[n + i] = SENTINEL;
    return h;
}

/* A device copy of h [n + GUARD]. */
static float *dev_from(const float *h, size_t n)
{
    float *d = fb_backend_alloc(g_cu, (n + GUARD) * sizeof *d);
    CHECK(d != NULL);
    fb_backend_upload(g_cu, d, h, (n + GUARD) * sizeof *d);
    return d;
}

/* The device buffer d [n + GUARD] back in host memory; the backend must have
 * no error. */
static float *dev_get(const float *d, size_t n)
{
    char msg[256];
    float *h = malloc((n + GUARD) * sizeof *h);
    CHECK(h != NULL);
    fb_backend_sync(g_cu);
    fb_backend_download(g_cu, h, d, (n + GUARD) * sizeof *h);
    int rc = fb_cuda_backend_error(g_cu, msg, sizeof msg);
    if (rc != FB_OK) fprintf(stderr, "backend error: %s\n", msg);
    CHECK_INT_EQ(rc, FB_OK);
    return h;
}

/* Normalised error of got against want over n floats. */
static double nerr(const float *got, const float *want, size_t n)
{
    double num = 0.0, den = 0.0;
    for (size_t i = 0; i < n; i++) {
        double d = (double)got[i] - want[i];
        num += d * d;
        den += (double)want[i] * want[i];
    }
    return den > 0.0 ? sqrt(num / den) : sqrt(num);
}

static int g_failures;

/* Records whether got matches want within bound and its guard survived. */
static void expect(const char *shape, const char *what, const float *got, const float *want,
                   size_t n, double bound)
{
    size_t bad_guard = 0;
    for (int i = 0; i < GUARD; i++)
        if (got[n + i] != SENTINEL) bad_guard++;
    double e = nerr(got, want, n);
    bool ok = !bad_guard && e <= bound;
    if (!ok) g_failures++;
    printf("%s %-34s %-22s nerr=%.3g (bound %.1g) guard overwritten=%zu\n", ok ? "ok  " : "FAIL",
           shape, what, e, bound, bad_guard);
}

/* Outputs of one forward and backward on the device, in host memory. */
typedef struct {
    float *out, *din, *dw, *db;
} results;

static void results_free(results *r)
{
    free(r->out);
    free(r->din);
    free(r->dw);
    free(r->db);
}

/* Host inputs of one shape; the gradient buffers start from din0/dw0/db0. */
typedef struct {
    fb_conv_geom g;
    size_t nin, nw, nout, nb;
    float *in, *w, *bias, *dout, *din0, *dw0, *db0;
} shape;

/* Forward and backward of s on the device with the search mode `mode`
 * (NULL: unset), from fresh copies of the inputs and gradient starts. */
static results run_device(const shape *s, const char *mode)
{
    if (mode)
        setenv("FUSEBOX_CUDNN_SEARCH", mode, 1);
    else
        unsetenv("FUSEBOX_CUDNN_SEARCH");
    float *in = dev_from(s->in, s->nin), *w = dev_from(s->w, s->nw);
    float *bias = dev_from(s->bias, s->nb), *dout = dev_from(s->dout, s->nout);
    float *out = dev_from(s->dout, s->nout); /* overwritten: any start will do */
    float *din = dev_from(s->din0, s->nin), *dw = dev_from(s->dw0, s->nw);
    float *db = dev_from(s->db0, s->nb);
    fb_conv2d_forward(g_cu, out, in, w, bias, &s->g, NULL);
    fb_conv2d_backward(g_cu, s->g.shared ? NULL : din, dw, db, dout, in, w, &s->g, NULL);
    results r = {dev_get(out, s->nout), dev_get(din, s->nin), dev_get(dw, s->nw),
                 dev_get(db, s->nb)};
    float *all[] = {in, w, bias, dout, out, din, dw, db};
    for (size_t i = 0; i < sizeof all / sizeof *all; i++)
        fb_backend_free(g_cu, all[i]);
    return r;
}

/* The same on cpu-ref. */
static results run_ref(const shape *s)
{
    results r = {malloc((s->nout + GUARD) * sizeof(float)),
                 malloc((s->nin + GUARD) * sizeof(float)), malloc((s->nw + GUARD) * sizeof(float)),
                 malloc((s->nb + GUARD) * sizeof(float))};
    CHECK(r.out && r.din && r.dw && r.db);
    memcpy(r.din, s->din0, (s->nin + GUARD) * sizeof(float));
    memcpy(r.dw, s->dw0, (s->nw + GUARD) * sizeof(float));
    memcpy(r.db, s->db0, (s->nb + GUARD) * sizeof(float));
    for (int i = 0; i < GUARD; i++)
        r.out[s->nout + i] = SENTINEL;
    fb_conv2d_forward(g_ref, r.out, s->in, s->w, s->bias, &s->g, NULL);
    fb_conv2d_backward(g_ref, s->g.shared ? NULL : r.din, r.dw, r.db, s->dout, s->in, s->w, &s->g,
                       NULL);
    return r;
}

static void case_search(fb_conv_geom g)
{
    fb_conv_geom_finish(&g);
    char name[96];
    snprintf(name, sizeof name, "N%d B%d C%d %dx%d K%d k%dx%d s%d p%d%s", g.N, g.B, g.C, g.H, g.W,
             g.K, g.kh, g.kw, g.sh, g.ph, g.shared ? " shared" : "");
    shape s = {.g = g};
    s.nin = (size_t)g.N * (g.shared ? 1 : g.B) * g.C * g.H * g.W;
    s.nw = (size_t)g.B * g.K * g.C * g.kh * g.kw;
    s.nout = (size_t)g.N * g.B * g.K * g.Ho * g.Wo;
    s.nb = (size_t)g.B * g.K;
    s.in = host_rand(s.nin);
    s.w = host_rand(s.nw);
    s.bias = host_rand(s.nb);
    s.dout = host_rand(s.nout);
    s.din0 = host_rand(s.nin);
    s.dw0 = host_rand(s.nw);
    s.db0 = host_rand(s.nb);

    fb_cuda_pool_stats a, b, c, d;
    fb_cuda_backend_pool_stats(g_cu, &a);
    results h = run_device(&s, "heuristic");
    fb_cuda_backend_pool_stats(g_cu, &b);
    CHECK_INT_EQ(b.conv_plans, a.conv_plans + 1);
    CHECK_INT_EQ(b.conv_searches, a.conv_searches); /* the heuristic times nothing */

    results h0 = run_device(&s, NULL); /* unset: the default, the heuristic's plan again */
    fb_cuda_pool_stats b0;
    fb_cuda_backend_pool_stats(g_cu, &b0);
    CHECK_INT_EQ(b0.conv_plans, b.conv_plans);
    CHECK_INT_EQ(b0.conv_searches, b.conv_searches);
    CHECK(memcmp(h0.out, h.out, (s.nout + GUARD) * sizeof(float)) == 0);
    CHECK(memcmp(h0.dw, h.dw, (s.nw + GUARD) * sizeof(float)) == 0);

    results t = run_device(&s, "timed");
    fb_cuda_backend_pool_stats(g_cu, &c);
    CHECK_INT_EQ(c.conv_plans, b.conv_plans + 1);
    CHECK_INT_EQ(c.conv_searches, b.conv_searches + (g.shared ? 2 : 3));

    results t2 = run_device(&s, "timed");
    fb_cuda_backend_pool_stats(g_cu, &d);
    CHECK_INT_EQ(d.conv_plans, c.conv_plans);       /* the plan is cached */
    CHECK_INT_EQ(d.conv_searches, c.conv_searches); /* and so is its choice */
    CHECK(memcmp(t2.out, t.out, (s.nout + GUARD) * sizeof(float)) == 0);
    CHECK(memcmp(t2.dw, t.dw, (s.nw + GUARD) * sizeof(float)) == 0);
    CHECK(memcmp(t2.din, t.din, (s.nin + GUARD) * sizeof(float)) == 0);

    results r = run_ref(&s);
    expect(name, "out timed/heuristic", t.out, h.out, s.nout, B_CONV);
    expect(name, "dw timed/heuristic", t.dw, h.dw, s.nw, B_CONV);
    expect(name, "dbias timed/heuristic", t.db, h.db, s.nb, B_DBL);
    expect(name, "out timed/cpu-ref", t.out, r.out, s.nout, B_CONV);
    expect(name, "dw timed/cpu-ref", t.dw, r.dw, s.nw, B_CONV);
    expect(name, "out heuristic/cpu-ref", h.out, r.out, s.nout, B_CONV);
    if (!g.shared) {
        expect(name, "din timed/heuristic", t.din, h.din, s.nin, B_CONV);
        expect(name, "din timed/cpu-ref", t.din, r.din, s.nin, B_CONV);
    }
    results_free(&h);
    results_free(&h0);
    results_free(&t);
    results_free(&t2);
    results_free(&r);
    float *all[] = {s.in, s.w, s.bias, s.dout, s.din0, s.dw0, s.db0};
    for (size_t i = 0; i < sizeof all / sizeof *all; i++)
        free(all[i]);
}

/* An unknown mode is an error the caller sees; nothing is written. */
static void case_bad_mode(void)
{
    char msg[256];
    fb_conv_geom g = {.N = 2,
                      .B = 2,
                      .C = 3,
                      .H = 6,
                      .W = 6,
                      .K = 4,
                      .kh = 3,
                      .kw = 3,
                      .sh = 1,
                      .sw = 1,
                      .ph = 1,
                      .pw = 1};
    fb_conv_geom_finish(&g);
    size_t nin = (size_t)g.N * g.B * g.C * g.H * g.W, nw = (size_t)g.B * g.K * g.C * 9;
    size_t nout = (size_t)g.N * g.B * g.K * g.Ho * g.Wo;
    float *hin = host_rand(nin), *hw = host_rand(nw), *hout = host_rand(nout);
    float *in = dev_from(hin, nin), *w = dev_from(hw, nw), *out = dev_from(hout, nout);
    CHECK_INT_EQ(fb_cuda_backend_error(g_cu, msg, sizeof msg), FB_OK);
    setenv("FUSEBOX_CUDNN_SEARCH", "fastest", 1);
    fb_conv2d_forward(g_cu, out, in, w, NULL, &g, NULL);
    fb_backend_sync(g_cu);
    CHECK_INT_EQ(fb_cuda_backend_error(g_cu, msg, sizeof msg), FB_ERR_BAD_ENUM);
    printf("ok   an unknown mode is refused: %s\n", msg);
    CHECK(strstr(msg, "FUSEBOX_CUDNN_SEARCH") != NULL && strstr(msg, "fastest") != NULL);
    fb_cuda_backend_clear_error(g_cu);
    unsetenv("FUSEBOX_CUDNN_SEARCH");
    float *got = dev_get(out, nout);
    CHECK(memcmp(got, hout, (nout + GUARD) * sizeof(float)) == 0);
    free(got);
    /* the backend runs again once the variable is fixed */
    fb_conv2d_forward(g_cu, out, in, w, NULL, &g, NULL);
    got = dev_get(out, nout);
    CHECK(memcmp(got, hout, nout * sizeof(float)) != 0);
    free(got);
    fb_backend_free(g_cu, in);
    fb_backend_free(g_cu, w);
    fb_backend_free(g_cu, out);
    free(hin);
    free(hw);
    free(hout);
}

int main(void)
{
    setvbuf(stdout, NULL, _IOLBF, 0);
    int rc = gt_backends(false, &g_cu, &g_ref, NULL);
    if (rc) return rc;
    g_rng = gt_seed();

    case_bad_mode();
    case_search((fb_conv_geom){.N = 3,
                               .B = 1,
                               .C = 2,
                               .H = 9,
                               .W = 8,
                               .K = 4,
                               .kh = 3,
                               .kw = 3,
                               .sh = 1,
                               .sw = 1,
                               .ph = 1,
                               .pw = 1});
    case_search((fb_conv_geom){.N = 2,
                               .B = 3,
                               .C = 3,
                               .H = 11,
                               .W = 7,
                               .K = 5,
                               .kh = 3,
                               .kw = 2,
                               .sh = 2,
                               .sw = 1,
                               .ph = 1,
                               .pw = 0});
    case_search((fb_conv_geom){.N = 4,
                               .B = 4,
                               .C = 1,
                               .H = 28,
                               .W = 28,
                               .K = 8,
                               .kh = 5,
                               .kw = 5,
                               .sh = 1,
                               .sw = 1,
                               .ph = 2,
                               .pw = 2,
                               .shared = true});
    /* large enough that cuDNN ranks several algorithms (GEMM, Winograd, FFT) */
    case_search((fb_conv_geom){.N = 16,
                               .B = 4,
                               .C = 16,
                               .H = 32,
                               .W = 32,
                               .K = 32,
                               .kh = 3,
                               .kw = 3,
                               .sh = 1,
                               .sw = 1,
                               .ph = 1,
                               .pw = 1});
    case_search((fb_conv_geom){.N = 8,
                               .B = 2,
                               .C = 32,
                               .H = 16,
                               .W = 16,
                               .K = 64,
                               .kh = 1,
                               .kw = 1,
                               .sh = 1,
                               .sw = 1,
                               .ph = 0,
                               .pw = 0});
    if (g_failures) {
        fprintf(stderr, "%d comparison(s) failed\n", g_failures);
        return 1;
    }
    printf("ok\n");
    return 0;
}
