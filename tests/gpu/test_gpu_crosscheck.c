/*
 * The CUDA backend against the plain-C reference, op by op.
 *
 * Every op of the backend interface runs on both backends on the same fresh
 * random inputs (never zeros; the seed is printed and FB_TEST_SEED repeats a
 * run), for one member and several, shared and not, odd sizes.  Outputs an op
 * overwrites start as NaN on the device, so an element the kernel never
 * writes shows up; outputs an op accumulates into start from the same random
 * values on both sides, so a missing accumulation shows up.  Every device
 * buffer has a guard of sentinel floats after its end that must survive.
 * Results are compared by normalised error sqrt(sum (gpu - ref)^2 / sum
 * ref^2) with a bound per op, and NaN and infinities must sit at the same
 * places.  Dropout masks and argmax indices must match exactly.  Then the
 * backend's own controls: errors, the pool, the streams.  The bf16 cases
 * check the rounding and unscaling ops exactly, then linear and conv with
 * TF32 on over operands each backend rounded to bf16 itself, which is how a
 * bf16 array runs on a GPU (workers/array_pass.c).  Skipped where no
 * CUDA device exists (and in a build without CUDA);
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

#define GUARD 64
#define SENTINEL 12345.5f

static fb_backend *g_cu, *g_ref;
static uint64_t g_rng;
static int g_failures, g_checks;

/* ---- random inputs ---- */

static uint64_t rnd_u64(void)
{
    g_rng ^= g_rng << 13;
    g_rng ^= g_rng >> 7;
    g_rng ^= g_rng << 17;
    return g_rng;
}

/* Uniform magnitude in [0.1, 1], random sign: never zero. */
static float rnd_val(void)
{
    float u = (float)(rnd_u64() >> 40) / 16777216.0f;
    float v = 0.1f + 0.9f * u;
    return (rnd_u64() & 1) ? v : -v;
}

/* ---- tensor pairs: the reference's host copy and the device copy ---- */

typedef enum { T_IN, T_OUT, T_ACC } tmode;

typedef struct {
    size_t n;
    float *h; /* reference backend memory (host) */
    float *d; /* CUDA memory, n + GUARD floats */
} tpair;

static void dev_put(float *d, const float *h, size_t n)
{
    float *tmp = malloc((n + GUARD) * sizeof *tmp);
    CHECK(tmp != NULL);
    memcpy(tmp, h, n * sizeof *tmp);
    for (int i = 0; i < GUARD; i++)
        tmp[n + i] = SENTINEL;
    fb_backend_upload(g_cu, d, tmp, (n + GUARD) * sizeof *tmp);
    free(tmp);
}

/* A pair of n floats: inputs and accumulated outputs get the same random
 * values on both sides; overwritten outputs are NaN on the device. */
static tpair tp_new(size_t n, tmode mode)
{
    tpair t = {.n = n};
    t.h = fb_backend_alloc(g_ref, (n ? n : 1) * sizeof(float));
    t.d = fb_backend_alloc(g_cu, (n + GUARD) * sizeof(float));
    CHECK(t.h && t.d);
    for (size_t i = 0; i < n; i++)
        t.h[i] = mode == T_OUT ? 0.0f : rnd_val();
    if (mode == T_OUT) {
        float *nan_fill = malloc((n ? n : 1) * sizeof *nan_fill);
        CHECK(nan_fill != NULL);
        for (size_t i = 0; i < n; i++)
            nan_fill[i] = NAN;
        dev_put(t.d, nan_fill, n);
        free(nan_fill);
    } else {
        dev_put(t.d, t.h, n);
    }
    return t;
}

static void tp_free(tpair *t)
{
    fb_backend_free(g_ref, t->h);
    fb_backend_free(g_cu, t->d);
    memset(t, 0, sizeof *t);
}

/* Sets element i on both sides (for NaN/Inf cases). */
static void tp_set(tpair *t, size_t i, float v)
{
    t->h[i] = v;
    fb_backend_upload(g_cu, t->d + i, &v, sizeof v);
}

/* Compares the device copy with the reference: guard intact, NaN/Inf at the
 * same places, normalised error within bound.  Records a failure and goes
 * on, so one run reports every op that is wrong. */
static void tp_check(const char *op, const char *name, const tpair *t, double bound)
{
    float *got = malloc((t->n + GUARD) * sizeof *got);
    CHECK(got != NULL);
    fb_backend_sync(g_cu);
    fb_backend_download(g_cu, got, t->d, (t->n + GUARD) * sizeof *got);
    char msg[256];
    int rc = fb_cuda_backend_error(g_cu, msg, sizeof msg);
    if (rc != FB_OK) {
        /* The op (or one before it in this case) failed on the device: a
         * verdict for it, then the backend runs again, so that one refusal
         * (cuDNN's, say) does not hide the verdicts of the cases after it. */
        g_checks++;
        g_failures++;
        fprintf(stderr, "FAIL %-28s %-8s backend error %d: %s\n", op, name, rc, msg);
        fb_cuda_backend_clear_error(g_cu);
        free(got);
        return;
    }
    bool ok = true;
    size_t bad_guard = 0, bad_class = 0, first_class = 0;
    for (int i = 0; i < GUARD; i++)
        if (got[t->n + i] != SENTINEL) bad_guard++;
    double num = 0.0, den = 0.0;
    for (size_t i = 0; i < t->n; i++) {
        float a = got[i], b = t->h[i];
        if (isnan(a) != isnan(b) || isinf(a) != isinf(b) ||
            (isinf(a) && isinf(b) && signbit(a) != signbit(b))) {
            if (!bad_class) first_class = i;
            bad_class++;
            continue;
        }
        if (!isfinite(b)) continue;
        num += ((double)a - b) * ((double)a - b);
        den += (double)b * b;
    }
    double err = den > 0.0 ? sqrt(num / den) : sqrt(num);
    if (bad_guard || bad_class || !(err <= bound)) ok = false;
    g_checks++;
    if (!ok) {
        g_failures++;
        fprintf(stderr,
                "FAIL %-28s %-8s n=%zu nerr=%.3g (bound %.1g) guard overwritten=%zu "
                "nan/inf mismatches=%zu",
                op, name, t->n, err, bound, bad_guard, bad_class);
        if (bad_class)
            fprintf(stderr, " (first at %zu: gpu %g, ref %g)", first_class,
                    (double)got[first_class], (double)t->h[first_class]);
        fputc('\n', stderr);
    } else {
        printf("ok   %-28s %-8s n=%-7zu nerr=%.3g\n", op, name, t->n, err);
    }
    free(got);
}

/* Bounds.  Float GEMMs against the reference's double sums (dot products of
 * up to 784 terms); convolutions, whose deterministic cuDNN algorithms
 * include Winograd and FFT ones that round more; kernels that compute in
 * double as the reference does (only the final float rounding differs);
 * exact ones.  A wrong layout or a missed element gives errors near 1. */
#define B_GEMM 1e-5
#define B_CONV 5e-5
#define B_DBL 1e-6
#define B_EXACT 0.0
/* Convolutions over bf16 operands with TF32 on: cuDNN may transform the
 * operands (Winograd, FFT) before the tensor cores round them to TF32's 10
 * bits, which can cost about 2^-11 per element; still far below bf16's own
 * rounding (2^-8) and below a wrong layout's errors near 1. */
#define B_CONV_BF16 1e-3
/* Linear products over bf16 operands with TF32 on: the products are exact
 * (bf16's 8 significant bits fit TF32's 11), but the tensor cores add them in
 * float without rounding each sum to nearest (Fasi, Higham, Mikaitis and
 * Pranesh, "Numerical behavior of NVIDIA tensor cores", 2021), so the error
 * of a dot product of hundreds of terms can reach B_GEMM's; still far below
 * bf16's own rounding (2^-8) and a wrong layout's errors near 1. */
#define B_GEMM_TF32 1e-4

/* Set while the linear and conv cases run in bf16 (main): each backend rounds
 * the operands with its own fb_round_bf16, and the CUDA one computes with
 * TF32, as it does for a bf16 group. */
static bool g_bf16;

/* Rounds an input pair to bf16 in place, each side with its own backend. */
static void tp_round(tpair *t)
{
    if (!g_bf16) return;
    fb_round_bf16(g_ref, t->h, t->h, t->n);
    fb_round_bf16(g_cu, t->d, t->d, t->n);
}

/* ---- linear and sgemm ---- */

static void case_linear(int N, int B, int I, int O, bool shared, bool with_bias)
{
    char op[64];
    snprintf(op, sizeof op, "linear N%d B%d I%d O%d%s%s%s", N, B, I, O, shared ? " sh" : "",
             with_bias ? "" : " nb", g_bf16 ? " bf16" : "");
    int Bi = shared ? 1 : B;
    tpair in = tp_new((size_t)N * Bi * I, T_IN), w = tp_new((size_t)B * O * I, T_IN);
    tpair bias = tp_new((size_t)B * O, T_IN), out = tp_new((size_t)N * B * O, T_OUT);
    double bound = g_bf16 ? B_GEMM_TF32 : B_GEMM;
    tp_round(&in);
    tp_round(&w);
    fb_linear_forward(g_ref, out.h, in.h, w.h, with_bias ? bias.h : NULL, N, B, I, O, shared);
    fb_linear_forward(g_cu, out.d, in.d, w.d, with_bias ? bias.d : NULL, N, B, I, O, shared);
    tp_check(op, "out", &out, bound);

    tpair dout = tp_new((size_t)N * B * O, T_IN), din = tp_new((size_t)N * Bi * I, T_ACC);
    tpair dw = tp_new((size_t)B * O * I, T_ACC), db = tp_new((size_t)B * O, T_ACC);
    tp_round(&dout);
    fb_linear_backward(g_ref, din.h, dw.h, with_bias ? db.h : NULL, dout.h, in.h, w.h, N, B, I, O,
                       shared);
    fb_linear_backward(g_cu, din.d, dw.d, with_bias ? db.d : NULL, dout.d, in.d, w.d, N, B, I, O,
                       shared);
    tp_check(op, "din", &din, bound);
    tp_check(op, "dw", &dw, bound);
    tp_check(op, "dbias", &db, B_DBL);
    tpair *all[] = {&in, &w, &bias, &out, &dout, &din, &dw, &db};
    for (size_t i = 0; i < sizeof all / sizeof *all; i++)
        tp_free(all[i]);
}

static void case_sgemm(int M, int N, int K)
{
    char op[64];
    snprintf(op, sizeof op, "sgemm %dx%dx%d", M, N, K);
    tpair a = tp_new((size_t)M * K, T_IN), b = tp_new((size_t)K * N, T_IN);
    tpair c = tp_new((size_t)M * N, T_OUT);
    fb_sgemm(g_ref, c.h, a.h, b.h, M, N, K);
    fb_sgemm(g_cu, c.d, a.d, b.d, M, N, K);
    tp_check(op, "c", &c, B_GEMM);
    tp_free(&a);
    tp_free(&b);
    tp_free(&c);
}

/* ---- conv2d ---- */

static void case_conv(fb_conv_geom g)
{
    fb_conv_geom_finish(&g);
    char op[96];
    snprintf(op, sizeof op, "conv N%d B%d C%d %dx%d K%d k%dx%d s%d p%d%s%s", g.N, g.B, g.C, g.H,
             g.W, g.K, g.kh, g.kw, g.sh, g.ph, g.shared ? " sh" : "", g_bf16 ? " bf16" : "");
    double bound = g_bf16 ? B_CONV_BF16 : B_CONV;
    int Bi = g.shared ? 1 : g.B;
    size_t nin = (size_t)g.N * Bi * g.C * g.H * g.W, nw = (size_t)g.B * g.K * g.C * g.kh * g.kw;
    size_t nout = (size_t)g.N * g.B * g.K * g.Ho * g.Wo;
    tpair in = tp_new(nin, T_IN), w = tp_new(nw, T_IN), bias = tp_new((size_t)g.B * g.K, T_IN);
    tpair out = tp_new(nout, T_OUT);
    tp_round(&in);
    tp_round(&w);
    fb_conv2d_forward(g_ref, out.h, in.h, w.h, bias.h, &g, NULL);
    size_t sf = fb_conv2d_scratch_floats(g_cu, &g);
    float *scratch = sf ? fb_backend_alloc(g_cu, sf * sizeof(float)) : NULL;
    fb_conv2d_forward(g_cu, out.d, in.d, w.d, bias.d, &g, scratch);
    tp_check(op, "out", &out, bound);

    tpair dout = tp_new(nout, T_IN), din = tp_new(g.shared ? 0 : nin, T_ACC);
    tpair dw = tp_new(nw, T_ACC), db = tp_new((size_t)g.B * g.K, T_ACC);
    tp_round(&dout);
    fb_conv2d_backward(g_ref, g.shared ? NULL : din.h, dw.h, db.h, dout.h, in.h, w.h, &g, NULL);
    fb_conv2d_backward(g_cu, g.shared ? NULL : din.d, dw.d, db.d, dout.d, in.d, w.d, &g, scratch);
    if (!g.shared) tp_check(op, "din", &din, bound);
    tp_check(op, "dw", &dw, bound);
    tp_check(op, "dbias", &db, B_DBL);
    fb_backend_free(g_cu, scratch);
    tpair *all[] = {&in, &w, &bias, &out, &dout, &din, &dw, &db};
    for (size_t i = 0; i < sizeof all / sizeof *all; i++)
        tp_free(all[i]);
}

/* ---- bf16: rounding and the unscaling of loss scaling ---- */

/* Rounds n random values plus the hard ones (ties, subnormals, the largest
 * floats, NaN, infinities) on both backends; the results must be equal bit
 * for bit, in place and not. */
static void case_round_bf16(size_t n)
{
    char op[64];
    snprintf(op, sizeof op, "round_bf16 n%zu", n);
    static const float hard[] = {1.00390625f, 1.01171875f,   -1.00390625f, 1e-40f,
                                 -1e-45f,     3.4028235e38f, -3.4e38f,     INFINITY,
                                 -INFINITY,   NAN,           0.0f,         -0.0f};
    tpair in = tp_new(n, T_IN), out = tp_new(n, T_OUT);
    for (size_t i = 0; i < sizeof hard / sizeof *hard && i < n; i++)
        tp_set(&in, i * 7 % n, hard[i]);
    fb_round_bf16(g_ref, out.h, in.h, n);
    fb_round_bf16(g_cu, out.d, in.d, n);
    tp_check(op, "out", &out, B_EXACT);
    fb_round_bf16(g_ref, in.h, in.h, n);
    fb_round_bf16(g_cu, in.d, in.d, n);
    tp_check(op, "inplace", &in, B_EXACT);
    tp_free(&in);
    tp_free(&out);
}

/* fb_grad_unscale: B members over four blocks (one empty) with a gap
 * between two of them that must stay as it was; members 1 and B-1 get a NaN
 * and an infinity in different blocks, the others stay finite.  Each member
 * has its own power-of-two inverse scale (one above 1, as for a loss scale
 * below 1), so the products and the flags must match exactly. */
static void case_grad_unscale(int B)
{
    char op[64];
    snprintf(op, sizeof op, "grad_unscale B%d", B);
    fb_param_block blocks[4] = {{0, 37}, {(size_t)B * 37, 0}, {(size_t)B * 37 + 16, 129}, {0, 3}};
    blocks[3].offset = blocks[2].offset + (size_t)B * 129 + 32; /* a 32-float gap before it */
    size_t n = blocks[3].offset + (size_t)B * blocks[3].per_member;
    tpair g = tp_new(n, T_ACC), flags = tp_new((size_t)B, T_OUT);
    float inv[8];
    for (int b = 0; b < B; b++)
        inv[b] = ldexpf(1.0f, b % 2 ? 3 : -16 - b);
    if (B > 1) tp_set(&g, blocks[0].offset + 1 * 37 + 36, NAN);
    tp_set(&g, blocks[2].offset + (size_t)(B - 1) * 129 + 5, -INFINITY);
    tp_set(&g, blocks[2].offset + (size_t)B * 129 + 3, NAN); /* in the gap: not a member's */
    fb_grad_unscale(g_ref, flags.h, g.h, inv, blocks, 4, B);
    fb_grad_unscale(g_cu, flags.d, g.d, inv, blocks, 4, B);
    tp_check(op, "flags", &flags, B_EXACT);
    tp_check(op, "grads", &g, B_EXACT);
    CHECK(flags.h[B - 1] == 1.0f && (B < 3 || flags.h[0] == 0.0f));
    tp_free(&g);
    tp_free(&flags);
}

/* ---- pooling ---- */

static void case_pool(fb_pool_geom g, bool with_nan)
{
    fb_pool_geom_finish(&g);
    char op[96];
    snprintf(op, sizeof op, "pool N%d BC%d %dx%d k%dx%d s%d p%d%s", g.N, g.BC, g.H, g.W, g.kh,
             g.kw, g.sh, g.ph, with_nan ? " nan" : "");
    size_t nin = (size_t)g.N * g.BC * g.H * g.W, nout = (size_t)g.N * g.BC * g.Ho * g.Wo;
    tpair in = tp_new(nin, T_IN), out = tp_new(nout, T_OUT);
    if (with_nan) tp_set(&in, nin / 3, NAN);
    int32_t *am_h = fb_backend_alloc(g_ref, nout * sizeof(int32_t));
    int32_t *am_d = fb_backend_alloc(g_cu, nout * sizeof(int32_t));
    int32_t *am_got = malloc(nout * sizeof(int32_t));
    CHECK(am_h && am_d && am_got);
    fb_maxpool2d_forward(g_ref, out.h, am_h, in.h, &g);
    fb_maxpool2d_forward(g_cu, out.d, am_d, in.d, &g);
    tp_check(op, "max out", &out, B_EXACT);
    fb_backend_download(g_cu, am_got, am_d, nout * sizeof(int32_t));
    size_t am_bad = 0;
    for (size_t i = 0; i < nout; i++)
        am_bad += am_got[i] != am_h[i];
    g_checks++;
    if (am_bad) {
        g_failures++;
        fprintf(stderr, "FAIL %s argmax: %zu of %zu differ\n", op, am_bad, nout);
    }

    tpair dout = tp_new(nout, T_IN), din = tp_new(nin, T_ACC);
    fb_maxpool2d_backward(g_ref, din.h, dout.h, am_h, &g);
    fb_maxpool2d_backward(g_cu, din.d, dout.d, am_d, &g);
    tp_check(op, "max din", &din, B_EXACT);

    tpair aout = tp_new(nout, T_OUT), adin = tp_new(nin, T_ACC);
    fb_avgpool2d_forward(g_ref, aout.h, in.h, &g);
    fb_avgpool2d_forward(g_cu, aout.d, in.d, &g);
    tp_check(op, "avg out", &aout, B_DBL);
    fb_avgpool2d_backward(g_ref, adin.h, dout.h, &g);
    fb_avgpool2d_backward(g_cu, adin.d, dout.d, &g);
    tp_check(op, "avg din", &adin, B_EXACT);

    fb_backend_free(g_ref, am_h);
    fb_backend_free(g_cu, am_d);
    free(am_got);
    tpair *all[] = {&in, &out, &dout, &din, &aout, &adin};
    for (size_t i = 0; i < sizeof all / sizeof *all; i++)
        tp_free(all[i]);
}

static void case_gap(int N, int BC, int HW)
{
    char op[64];
    snprintf(op, sizeof op, "global_avgpool N%d BC%d HW%d", N, BC, HW);
    tpair in = tp_new((size_t)N * BC * HW, T_IN), out = tp_new((size_t)N * BC, T_OUT);
    fb_global_avgpool_forward(g_ref, out.h, in.h, N, BC, HW);
    fb_global_avgpool_forward(g_cu, out.d, in.d, N, BC, HW);
    tp_check(op, "out", &out, B_DBL);
    tpair dout = tp_new((size_t)N * BC, T_IN), din = tp_new((size_t)N * BC * HW, T_ACC);
    fb_global_avgpool_backward(g_ref, din.h, dout.h, N, BC, HW);
    fb_global_avgpool_backward(g_cu, din.d, dout.d, N, BC, HW);
    tp_check(op, "din", &din, B_EXACT);
    tpair *all[] = {&in, &out, &dout, &din};
    for (size_t i = 0; i < sizeof all / sizeof *all; i++)
        tp_free(all[i]);
}

/* ---- elementwise ---- */

static void case_act(fb_act act, size_t n)
{
    static const char *names[] = {"relu", "gelu", "gelu_tanh", "tanh", "sigmoid"};
    char op[64];
    snprintf(op, sizeof op, "act %s n%zu", names[act], n);
    tpair in = tp_new(n, T_IN), out = tp_new(n, T_OUT);
    for (size_t i = 0; i < n; i++) /* a wider range than [-1, 1] */
        in.h[i] *= 4.0f;
    dev_put(in.d, in.h, n);
    tp_set(&in, n / 2, NAN);
    tp_set(&in, n / 3, INFINITY);
    tp_set(&in, n / 4, -INFINITY);
    fb_act_forward(g_ref, act, out.h, in.h, n);
    fb_act_forward(g_cu, act, out.d, in.d, n);
    tp_check(op, "out", &out, B_DBL);
    /* backward on finite inputs (the reference's derivative of inf is NaN
     * for some, which is not a property to pin down here) */
    tpair in2 = tp_new(n, T_IN), out2 = tp_new(n, T_OUT), dout = tp_new(n, T_IN);
    tpair din = tp_new(n, T_ACC);
    fb_act_forward(g_ref, act, out2.h, in2.h, n);
    fb_act_forward(g_cu, act, out2.d, in2.d, n);
    fb_act_backward(g_ref, act, din.h, dout.h, in2.h, out2.h, n);
    fb_act_backward(g_cu, act, din.d, dout.d, in2.d, out2.d, n);
    tp_check(op, "din", &din, B_DBL);
    tpair *all[] = {&in, &out, &in2, &out2, &dout, &din};
    for (size_t i = 0; i < sizeof all / sizeof *all; i++)
        tp_free(all[i]);
}

static void case_add(size_t n)
{
    char op[64];
    snprintf(op, sizeof op, "add/accumulate n%zu", n);
    tpair a = tp_new(n, T_IN), b = tp_new(n, T_IN), out = tp_new(n, T_OUT), y = tp_new(n, T_ACC);
    fb_add_forward(g_ref, out.h, a.h, b.h, n);
    fb_add_forward(g_cu, out.d, a.d, b.d, n);
    tp_check(op, "out", &out, B_EXACT);
    fb_accumulate(g_ref, y.h, a.h, n);
    fb_accumulate(g_cu, y.d, a.d, n);
    tp_check(op, "y", &y, B_EXACT);
    /* out aliasing an input */
    fb_add_forward(g_ref, a.h, a.h, b.h, n);
    fb_add_forward(g_cu, a.d, a.d, b.d, n);
    tp_check(op, "aliased", &a, B_EXACT);
    tpair *all[] = {&a, &b, &out, &y};
    for (size_t i = 0; i < sizeof all / sizeof *all; i++)
        tp_free(all[i]);
}

static void case_dropout(int N, int B, int F, float p, int64_t n_offset)
{
    char op[64];
    snprintf(op, sizeof op, "dropout N%d B%d F%d p%.2f", N, B, F, (double)p);
    uint64_t seeds[16];
    CHECK(B <= 16);
    for (int b = 0; b < B; b++)
        seeds[b] = rnd_u64();
    uint64_t stream = rnd_u64();
    size_t n = (size_t)N * B * F;
    tpair in = tp_new(n, T_IN), out = tp_new(n, T_OUT), dout = tp_new(n, T_IN);
    tpair din = tp_new(n, T_ACC);
    fb_dropout_forward(g_ref, out.h, in.h, seeds, stream, p, N, B, F, n_offset);
    fb_dropout_forward(g_cu, out.d, in.d, seeds, stream, p, N, B, F, n_offset);
    tp_check(op, "out", &out, B_EXACT);
    fb_dropout_backward(g_ref, din.h, dout.h, seeds, stream, p, N, B, F, n_offset);
    fb_dropout_backward(g_cu, din.d, dout.d, seeds, stream, p, N, B, F, n_offset);
    tp_check(op, "din", &din, B_EXACT);
    tpair *all[] = {&in, &out, &dout, &din};
    for (size_t i = 0; i < sizeof all / sizeof *all; i++)
        tp_free(all[i]);
}

/* ---- normalisation ---- */

static void case_batchnorm(int N, int BC, int HW, bool affine)
{
    char op[64];
    snprintf(op, sizeof op, "batchnorm N%d BC%d HW%d%s", N, BC, HW, affine ? "" : " na");
    size_t n = (size_t)N * BC * HW;
    tpair in = tp_new(n, T_IN), out = tp_new(n, T_OUT), mean = tp_new((size_t)BC, T_OUT);
    tpair rstd = tp_new((size_t)BC, T_OUT), gamma = tp_new((size_t)BC, T_IN);
    tpair beta = tp_new((size_t)BC, T_IN), rm = tp_new((size_t)BC, T_ACC);
    tpair rv = tp_new((size_t)BC, T_ACC);
    for (int c = 0; c < BC; c++) /* a variance must be positive */
        rv.h[c] = fabsf(rv.h[c]);
    dev_put(rv.d, rv.h, (size_t)BC);
    fb_batchnorm_forward_train(g_ref, out.h, mean.h, rstd.h, rm.h, rv.h, in.h,
                               affine ? gamma.h : NULL, affine ? beta.h : NULL, N, BC, HW, 1e-5f,
                               0.1f);
    fb_batchnorm_forward_train(g_cu, out.d, mean.d, rstd.d, rm.d, rv.d, in.d,
                               affine ? gamma.d : NULL, affine ? beta.d : NULL, N, BC, HW, 1e-5f,
                               0.1f);
    tp_check(op, "out", &out, B_DBL);
    tp_check(op, "mean", &mean, B_DBL);
    tp_check(op, "rstd", &rstd, B_DBL);
    tp_check(op, "run_mean", &rm, B_DBL);
    tp_check(op, "run_var", &rv, B_DBL);

    tpair eout = tp_new(n, T_OUT);
    fb_batchnorm_forward_eval(g_ref, eout.h, in.h, affine ? gamma.h : NULL, affine ? beta.h : NULL,
                              rm.h, rv.h, N, BC, HW, 1e-5f);
    fb_batchnorm_forward_eval(g_cu, eout.d, in.d, affine ? gamma.d : NULL, affine ? beta.d : NULL,
                              rm.d, rv.d, N, BC, HW, 1e-5f);
    tp_check(op, "eval out", &eout, B_DBL);

    /* backward from the reference's saved statistics on both sides */
    dev_put(mean.d, mean.h, (size_t)BC);
    dev_put(rstd.d, rstd.h, (size_t)BC);
    tpair dout = tp_new(n, T_IN), din = tp_new(n, T_ACC), dg = tp_new((size_t)BC, T_ACC);
    tpair dbt = tp_new((size_t)BC, T_ACC);
    fb_batchnorm_backward(g_ref, din.h, affine ? dg.h : NULL, affine ? dbt.h : NULL, dout.h, in.h,
                          mean.h, rstd.h, affine ? gamma.h : NULL, N, BC, HW);
    fb_batchnorm_backward(g_cu, din.d, affine ? dg.d : NULL, affine ? dbt.d : NULL, dout.d, in.d,
                          mean.d, rstd.d, affine ? gamma.d : NULL, N, BC, HW);
    tp_check(op, "din", &din, B_DBL);
    tp_check(op, "dgamma", &dg, B_DBL);
    tp_check(op, "dbeta", &dbt, B_DBL);
    tpair *all[] = {&in, &out, &mean, &rstd, &gamma, &beta, &rm, &rv, &eout, &dout, &din, &dg, &dbt};
    for (size_t i = 0; i < sizeof all / sizeof *all; i++)
        tp_free(all[i]);
}

static void case_layernorm(int N, int B, int F, bool affine)
{
    char op[64];
    snprintf(op, sizeof op, "layernorm N%d B%d F%d%s", N, B, F, affine ? "" : " na");
    size_t n = (size_t)N * B * F, rows = (size_t)N * B;
    tpair in = tp_new(n, T_IN), out = tp_new(n, T_OUT), mean = tp_new(rows, T_OUT);
    tpair rstd = tp_new(rows, T_OUT), gamma = tp_new((size_t)B * F, T_IN);
    tpair beta = tp_new((size_t)B * F, T_IN);
    fb_layernorm_forward(g_ref, out.h, mean.h, rstd.h, in.h, affine ? gamma.h : NULL,
                         affine ? beta.h : NULL, N, B, F, 1e-5f);
    fb_layernorm_forward(g_cu, out.d, mean.d, rstd.d, in.d, affine ? gamma.d : NULL,
                         affine ? beta.d : NULL, N, B, F, 1e-5f);
    tp_check(op, "out", &out, B_DBL);
    tp_check(op, "mean", &mean, B_DBL);
    tp_check(op, "rstd", &rstd, B_DBL);
    dev_put(mean.d, mean.h, rows);
    dev_put(rstd.d, rstd.h, rows);
    tpair dout = tp_new(n, T_IN), din = tp_new(n, T_ACC), dg = tp_new((size_t)B * F, T_ACC);
    tpair dbt = tp_new((size_t)B * F, T_ACC);
    fb_layernorm_backward(g_ref, din.h, affine ? dg.h : NULL, affine ? dbt.h : NULL, dout.h, in.h,
                          mean.h, rstd.h, affine ? gamma.h : NULL, N, B, F);
    fb_layernorm_backward(g_cu, din.d, affine ? dg.d : NULL, affine ? dbt.d : NULL, dout.d, in.d,
                          mean.d, rstd.d, affine ? gamma.d : NULL, N, B, F);
    tp_check(op, "din", &din, B_DBL);
    tp_check(op, "dgamma", &dg, B_DBL);
    tp_check(op, "dbeta", &dbt, B_DBL);
    tpair *all[] = {&in, &out, &mean, &rstd, &gamma, &beta, &dout, &din, &dg, &dbt};
    for (size_t i = 0; i < sizeof all / sizeof *all; i++)
        tp_free(all[i]);
}

/* ---- losses ---- */

static int32_t *labels_new(int N, int K, int32_t **dev)
{
    int32_t *h = fb_backend_alloc(g_ref, (size_t)N * sizeof *h);
    *dev = fb_backend_alloc(g_cu, (size_t)N * sizeof **dev);
    CHECK(h && *dev);
    for (int n = 0; n < N; n++)
        h[n] = (int32_t)(rnd_u64() % (uint64_t)K);
    fb_backend_upload(g_cu, *dev, h, (size_t)N * sizeof *h);
    return h;
}

static void case_xent(int N, int B, int K)
{
    char op[64];
    snprintf(op, sizeof op, "softmax_xent N%d B%d K%d", N, B, K);
    int32_t *yd, *yh = labels_new(N, K, &yd);
    size_t n = (size_t)N * B * K;
    tpair z = tp_new(n, T_IN), loss = tp_new((size_t)B, T_OUT), dz = tp_new(n, T_OUT);
    tpair correct = tp_new((size_t)B, T_OUT);
    for (size_t i = 0; i < n; i++) /* logits spread enough to matter */
        z.h[i] *= 5.0f;
    dev_put(z.d, z.h, n);
    fb_softmax_xent(g_ref, loss.h, dz.h, correct.h, z.h, yh, N, B, K, 1.0f / (float)N);
    fb_softmax_xent(g_cu, loss.d, dz.d, correct.d, z.d, yd, N, B, K, 1.0f / (float)N);
    tp_check(op, "loss", &loss, B_DBL);
    tp_check(op, "dlogits", &dz, B_DBL);
    tp_check(op, "correct", &correct, B_EXACT);
    fb_backend_free(g_ref, yh);
    fb_backend_free(g_cu, yd);
    tpair *all[] = {&z, &loss, &dz, &correct};
    for (size_t i = 0; i < sizeof all / sizeof *all; i++)
        tp_free(all[i]);
}

static void case_mse(int N, int B, int K)
{
    char op[64];
    snprintf(op, sizeof op, "mse N%d B%d K%d", N, B, K);
    size_t n = (size_t)N * B * K;
    tpair pred = tp_new(n, T_IN), tgt = tp_new((size_t)N * K, T_IN);
    tpair loss = tp_new((size_t)B, T_OUT), dp = tp_new(n, T_OUT);
    fb_mse(g_ref, loss.h, dp.h, pred.h, tgt.h, N, B, K, 1.0f / (float)N);
    fb_mse(g_cu, loss.d, dp.d, pred.d, tgt.d, N, B, K, 1.0f / (float)N);
    tp_check(op, "loss", &loss, B_DBL);
    tp_check(op, "dpred", &dp, B_DBL);
    tpair *all[] = {&pred, &tgt, &loss, &dp};
    for (size_t i = 0; i < sizeof all / sizeof *all; i++)
        tp_free(all[i]);
}

/* ---- sequences ---- */

static void case_embedding(int N, int T, int B, int V, int D)
{
    char op[64];
    snprintf(op, sizeof op, "embedding N%d T%d B%d V%d D%d", N, T, B, V, D);
    int32_t *idd, *idh = labels_new(N * T, V, &idd);
    size_t n = (size_t)N * T * B * D, n_tab = (size_t)B * V * D;
    tpair table = tp_new(n_tab, T_IN), out = tp_new(n, T_OUT);
    CHECK_INT_EQ(fb_embedding_forward(g_ref, out.h, idh, table.h, N, T, B, V, D, NULL, 0), FB_OK);
    CHECK_INT_EQ(fb_embedding_forward(g_cu, out.d, idd, table.d, N, T, B, V, D, NULL, 0), FB_OK);
    tp_check(op, "out", &out, B_EXACT);
    tpair dout = tp_new(n, T_IN), dtab = tp_new(n_tab, T_ACC);
    CHECK_INT_EQ(fb_embedding_backward(g_ref, dtab.h, dout.h, idh, N, T, B, V, D, NULL, 0), FB_OK);
    CHECK_INT_EQ(fb_embedding_backward(g_cu, dtab.d, dout.d, idd, N, T, B, V, D, NULL, 0), FB_OK);
    tp_check(op, "dtable", &dtab, B_EXACT);
    fb_backend_free(g_ref, idh);
    fb_backend_free(g_cu, idd);
    tpair *all[] = {&table, &out, &dout, &dtab};
    for (size_t i = 0; i < sizeof all / sizeof *all; i++)
        tp_free(all[i]);
}

static void case_positional(int N, int T, int B, int L, int D)
{
    char op[64];
    snprintf(op, sizeof op, "positional N%d T%d B%d L%d D%d", N, T, B, L, D);
    size_t n = (size_t)N * T * B * D, n_pos = (size_t)B * L * D;
    tpair in = tp_new(n, T_IN), pos = tp_new(n_pos, T_IN), out = tp_new(n, T_OUT);
    fb_positional_forward(g_ref, out.h, in.h, pos.h, N, T, B, L, D);
    fb_positional_forward(g_cu, out.d, in.d, pos.d, N, T, B, L, D);
    tp_check(op, "out", &out, B_EXACT);
    tpair dout = tp_new(n, T_IN), din = tp_new(n, T_ACC), dpos = tp_new(n_pos, T_ACC);
    fb_positional_backward(g_ref, din.h, dpos.h, dout.h, N, T, B, L, D);
    fb_positional_backward(g_cu, din.d, dpos.d, dout.d, N, T, B, L, D);
    tp_check(op, "din", &din, B_EXACT);
    tp_check(op, "dpos", &dpos, B_DBL);
    tpair *all[] = {&in, &pos, &out, &dout, &din, &dpos};
    for (size_t i = 0; i < sizeof all / sizeof *all; i++)
        tp_free(all[i]);
}

/* The backward runs on the reference's probs on both sides, so that it is
 * compared on the same inputs. */
static void case_attention(int N, int T, int B, int D, int H, bool causal)
{
    char op[64];
    snprintf(op, sizeof op, "attention N%d T%d B%d D%d H%d%s", N, T, B, D, H,
             causal ? " causal" : "");
    size_t n = (size_t)N * T * B * D, np = (size_t)N * B * H * T * T;
    tpair qkv = tp_new(3 * n, T_IN), out = tp_new(n, T_OUT), probs = tp_new(np, T_OUT);
    for (size_t i = 0; i < 3 * n; i++) /* scores spread enough to matter */
        qkv.h[i] *= 3.0f;
    dev_put(qkv.d, qkv.h, 3 * n);
    size_t ns_ref = fb_attention_scratch_floats(g_ref, N, T, B, H);
    size_t ns = fb_attention_scratch_floats(g_cu, N, T, B, H);
    float *s_ref = ns_ref ? fb_backend_alloc(g_ref, ns_ref * sizeof(float)) : NULL;
    float *s_cu = ns ? fb_backend_alloc(g_cu, ns * sizeof(float)) : NULL;
    CHECK((ns_ref == 0 || s_ref) && (ns == 0 || s_cu));
    fb_attention_forward(g_ref, out.h, probs.h, qkv.h, N, T, B, D, H, causal, s_ref);
    fb_attention_forward(g_cu, out.d, probs.d, qkv.d, N, T, B, D, H, causal, s_cu);
    tp_check(op, "out", &out, B_GEMM);
    tp_check(op, "probs", &probs, B_GEMM);
    dev_put(probs.d, probs.h, np);
    tpair dout = tp_new(n, T_IN), dqkv = tp_new(3 * n, T_ACC);
    fb_attention_backward(g_ref, dqkv.h, dout.h, probs.h, qkv.h, N, T, B, D, H, s_ref);
    fb_attention_backward(g_cu, dqkv.d, dout.d, probs.d, qkv.d, N, T, B, D, H, s_cu);
    tp_check(op, "dqkv", &dqkv, B_GEMM);
    fb_backend_free(g_ref, s_ref);
    fb_backend_free(g_cu, s_cu);
    tpair *all[] = {&qkv, &out, &probs, &dout, &dqkv};
    for (size_t i = 0; i < sizeof all / sizeof *all; i++)
        tp_free(all[i]);
}

static void case_seq_pool(int N, int T, int B, int D, fb_seq_pool kind)
{
    char op[64];
    snprintf(op, sizeof op, "seq_pool %s N%d T%d B%d D%d",
             kind == FB_SEQ_POOL_MEAN ? "mean" : "first", N, T, B, D);
    size_t n = (size_t)N * T * B * D, no = (size_t)N * B * D;
    tpair in = tp_new(n, T_IN), out = tp_new(no, T_OUT);
    fb_seq_pool_forward(g_ref, kind, out.h, in.h, N, T, B, D);
    fb_seq_pool_forward(g_cu, kind, out.d, in.d, N, T, B, D);
    tp_check(op, "out", &out, B_DBL);
    tpair dout = tp_new(no, T_IN), din = tp_new(n, T_ACC);
    fb_seq_pool_backward(g_ref, kind, din.h, dout.h, N, T, B, D);
    fb_seq_pool_backward(g_cu, kind, din.d, dout.d, N, T, B, D);
    tp_check(op, "din", &din, B_DBL);
    tpair *all[] = {&in, &out, &dout, &din};
    for (size_t i = 0; i < sizeof all / sizeof *all; i++)
        tp_free(all[i]);
}

/* ---- optimizer ---- */

static void case_optim(fb_optim_kind kind, int B, float momentum, int nesterov)
{
    static const char *names[] = {"sgd", "adam", "adamw"};
    char op[64];
    snprintf(op, sizeof op, "optim %s B%d m%.1f%s", names[kind], B, (double)momentum,
             nesterov ? " nesterov" : "");
    /* three blocks of odd sizes, one empty, at offsets with gaps */
    fb_param_block blocks[4] = {{0, 37}, {(size_t)B * 37 + 5, 0}, {(size_t)B * 37 + 5, 129},
                                {(size_t)B * 166 + 11, 3}};
    size_t n = (size_t)B * 169 + 11;
    tpair p = tp_new(n, T_ACC), g = tp_new(n, T_IN), s1 = tp_new(n, T_ACC), s2 = tp_new(n, T_ACC);
    for (size_t i = 0; i < n; i++) /* a second moment is never negative */
        s2.h[i] = fabsf(s2.h[i]);
    dev_put(s2.d, s2.h, n);
    fb_optim_hparams hp[8];
    CHECK(B <= 8);
    for (int step = 1; step <= 3; step++) {
        for (int b = 0; b < B; b++) {
            fb_optim_hparams h = {.lr = 0.01f * (float)(b + 1),
                                  .weight_decay = b % 2 ? 0.05f : 0.0f,
                                  .momentum = momentum,
                                  .dampening = b == 2 ? 0.1f : 0.0f,
                                  .nesterov = nesterov,
                                  .beta1 = 0.9f,
                                  .beta2 = 0.999f - 0.001f * (float)b,
                                  .eps = 1e-8f,
                                  .t = step + b};
            if (b == 1 && B > 2) h = (fb_optim_hparams){0}; /* an empty slot */
            hp[b] = h;
        }
        bool sgd = kind == FB_OPTIM_KIND_SGD;
        fb_optim_step(g_ref, kind, p.h, g.h, s1.h, sgd ? NULL : s2.h, blocks, 4, B, hp);
        fb_optim_step(g_cu, kind, p.d, g.d, s1.d, sgd ? NULL : s2.d, blocks, 4, B, hp);
    }
    tp_check(op, "params", &p, B_DBL);
    tp_check(op, "state1", &s1, B_DBL);
    tp_check(op, "state2", &s2, B_DBL);
    tpair *all[] = {&p, &g, &s1, &s2};
    for (size_t i = 0; i < sizeof all / sizeof *all; i++)
        tp_free(all[i]);
}

/* ---- the backend's own controls ---- */

static void check_controls(void)
{
    char msg[256];
    const int ndev = 64; /* more devices than the backend serves */
    fb_backend *untouched = (fb_backend *)&msg;
    CHECK_INT_EQ(fb_cuda_backend_get(ndev, &untouched, msg, sizeof msg), FB_ERR_NOT_FOUND);
    CHECK(untouched == (fb_backend *)&msg);
    CHECK_INT_EQ(fb_cuda_backend_get(-1, &untouched, msg, sizeof msg), FB_ERR_NOT_FOUND);
    CHECK(fb_backend_cuda(ndev) == NULL);
    CHECK(fb_backend_cuda(0) == g_cu); /* one backend per device */
    CHECK(fb_backend_is_cuda(g_cu));
    CHECK(!fb_backend_is_cuda(g_ref));
    CHECK(!fb_backend_is_cuda(NULL));
    CHECK_STR_EQ(fb_backend_name(g_cu), "cuda");
    for (int op = 0; op < FB_OP_COUNT; op++)
        CHECK(fb_backend_supports(g_cu, (fb_op)op));

    void *s0 = fb_cuda_backend_stream(g_cu, FB_CUDA_STREAM_COMPUTE);
    void *s1 = fb_cuda_backend_stream(g_cu, FB_CUDA_STREAM_COMM);
    CHECK(s0 != NULL && s1 != NULL && s0 != s1);
    CHECK(fb_cuda_backend_stream(g_cu, 2) == NULL);
    CHECK(fb_cuda_backend_stream(g_ref, FB_CUDA_STREAM_COMPUTE) == NULL);

    /* The pool: memory comes back zeroed, aligned, and a freed block is
     * reused without a new cudaMalloc. */
    fb_cuda_pool_stats a, b;
    float *p = fb_backend_alloc(g_cu, 1000 * sizeof(float));
    CHECK(p != NULL && ((uintptr_t)p % 64) == 0);
    float host[1000];
    for (int i = 0; i < 1000; i++)
        host[i] = 1.0f;
    fb_backend_upload(g_cu, p, host, sizeof host);
    fb_backend_free(g_cu, p);
    fb_cuda_backend_pool_stats(g_cu, &a);
    float *q = fb_backend_alloc(g_cu, 999 * sizeof(float));
    fb_cuda_backend_pool_stats(g_cu, &b);
    CHECK(q != NULL);
    CHECK_INT_EQ(b.device_mallocs, a.device_mallocs);
    CHECK_INT_EQ(b.reuses, a.reuses + 1);
    fb_backend_download(g_cu, host, q, 999 * sizeof(float));
    for (int i = 0; i < 999; i++)
        CHECK(host[i] == 0.0f);
    fb_backend_free(g_cu, q);
    fb_cuda_backend_trim(g_cu);
    fb_cuda_backend_pool_stats(g_cu, &b);
    CHECK_INT_EQ(b.bytes_cached, 0);
    printf("ok   pool: %llu device mallocs, %llu reuses, %llu bytes scratch\n",
           (unsigned long long)b.device_mallocs, (unsigned long long)b.reuses,
           (unsigned long long)b.bytes_scratch);

    /* A bad label is an error the caller sees, not a crash; clearing it
     * lets the backend run again. */
    CHECK_INT_EQ(fb_cuda_backend_error(g_cu, msg, sizeof msg), FB_OK);
    int32_t bad[3] = {0, 7, 1}, *yd = fb_backend_alloc(g_cu, sizeof bad);
    float *z = fb_backend_alloc(g_cu, 3 * 2 * 4 * sizeof(float));
    float *loss = fb_backend_alloc(g_cu, 2 * sizeof(float));
    CHECK(yd && z && loss);
    fb_backend_upload(g_cu, yd, bad, sizeof bad);
    fb_softmax_xent(g_cu, loss, NULL, NULL, z, yd, 3, 2, 4, 1.0f / 3.0f);
    fb_backend_sync(g_cu);
    CHECK_INT_EQ(fb_cuda_backend_error(g_cu, msg, sizeof msg), FB_ERR_DATA);
    printf("ok   bad label reported: %s\n", msg);
    float keep[2] = {-3.0f, -3.0f};
    fb_backend_download(g_cu, keep, loss, sizeof keep); /* skipped while the error stands */
    CHECK(keep[0] == -3.0f && keep[1] == -3.0f);
    fb_cuda_backend_clear_error(g_cu);
    CHECK_INT_EQ(fb_cuda_backend_error(g_cu, msg, sizeof msg), FB_OK);
    fb_backend_download(g_cu, keep, loss, sizeof keep);
    CHECK(isnan(keep[1]) || isnan(keep[0]));
    fb_backend_free(g_cu, yd);
    fb_backend_free(g_cu, z);
    fb_backend_free(g_cu, loss);

    /* A bad token id too: recorded at the sync, the output left as it was. */
    int32_t ids[4] = {0, 2, 9, 1}, *idd = fb_backend_alloc(g_cu, sizeof ids);
    float tab[2 * 3 * 2], emb[4 * 2 * 2];
    for (int i = 0; i < 12; i++)
        tab[i] = (float)i;
    for (int i = 0; i < 16; i++)
        emb[i] = -3.0f;
    float *td = fb_backend_alloc(g_cu, sizeof tab), *ed = fb_backend_alloc(g_cu, sizeof emb);
    CHECK(idd && td && ed);
    fb_backend_upload(g_cu, idd, ids, sizeof ids);
    fb_backend_upload(g_cu, td, tab, sizeof tab);
    fb_backend_upload(g_cu, ed, emb, sizeof emb);
    CHECK_INT_EQ(fb_embedding_forward(g_cu, ed, idd, td, 2, 2, 2, 3, 2, NULL, 0), FB_OK);
    fb_backend_sync(g_cu);
    CHECK_INT_EQ(fb_cuda_backend_error(g_cu, msg, sizeof msg), FB_ERR_DATA);
    CHECK(strstr(msg, "token id") != NULL);
    printf("ok   bad token id reported: %s\n", msg);
    fb_cuda_backend_clear_error(g_cu);
    fb_backend_download(g_cu, emb, ed, sizeof emb);
    for (int i = 0; i < 16; i++)
        CHECK(emb[i] == -3.0f);
    fb_backend_free(g_cu, idd);
    fb_backend_free(g_cu, td);
    fb_backend_free(g_cu, ed);
}

int main(void)
{
    char msg[256];
    /* line by line, so that the cases run before a failed CHECK aborts are shown */
    setvbuf(stdout, NULL, _IOLBF, 0);
    /* FB_GPU_CROSSCHECK_BACKEND=cpu runs the same cases on the fast CPU
     * backend instead, which proves the harness itself on a machine without
     * a GPU (the CUDA-only checks of the backend's controls are left out). */
    bool on_cpu;
    int rc = gt_backends(true, &g_cu, &g_ref, &on_cpu);
    if (rc) return rc;
    g_rng = gt_seed();

    if (!on_cpu) check_controls();

    /* The own kernels first, then cuBLAS, then cuDNN: a failing op records
     * its verdict and the backend goes on (tp_check), so every op is judged. */
    case_pool((fb_pool_geom){.N = 2, .BC = 6, .H = 9, .W = 7, .kh = 3, .kw = 3, .sh = 2, .sw = 2,
                             .ph = 1, .pw = 1},
              false);
    case_pool((fb_pool_geom){.N = 3, .BC = 4, .H = 8, .W = 8, .kh = 2, .kw = 2, .sh = 2, .sw = 2},
              false);
    case_pool((fb_pool_geom){.N = 1, .BC = 5, .H = 7, .W = 9, .kh = 3, .kw = 2, .sh = 1, .sw = 1,
                             .ph = 1, .pw = 1},
              true);
    case_gap(3, 5, 49);
    case_gap(2, 7, 1);
    case_gap(1, 3, 1000);

    for (int a = FB_ACT_RELU; a <= FB_ACT_SIGMOID; a++)
        case_act((fb_act)a, 1031);
    case_add(4099);
    case_add(1);
    case_dropout(5, 3, 37, 0.3f, 11);
    case_dropout(4, 1, 129, 0.5f, 0);
    case_dropout(3, 2, 5, 0.0f, 2);
    case_dropout(3, 2, 5, 1.0f, 2);

    case_batchnorm(4, 6, 25, true);
    case_batchnorm(16, 3, 1, false);
    case_batchnorm(1, 2, 7, true);
    case_batchnorm(128, 48, 49, true);
    case_layernorm(5, 3, 37, true);
    case_layernorm(2, 1, 300, false);
    case_layernorm(64, 4, 1, true);

    case_xent(9, 3, 10);
    case_xent(4, 1, 1000);
    case_xent(1, 2, 1);
    case_mse(7, 2, 5);
    case_mse(3, 1, 1);

    case_embedding(3, 5, 1, 7, 4);
    case_embedding(4, 17, 3, 5, 33);
    case_embedding(8, 64, 4, 256, 128);
    case_positional(3, 5, 1, 5, 4);
    case_positional(4, 17, 3, 20, 33);
    for (int causal = 0; causal <= 1; causal++) {
        case_attention(2, 1, 1, 4, 1, causal);
        case_attention(3, 5, 1, 6, 1, causal);
        case_attention(2, 7, 3, 6, 3, causal);
        case_attention(3, 9, 2, 10, 2, causal);
        case_attention(4, 33, 3, 64, 4, causal);
        case_attention(8, 64, 4, 128, 4, causal);
    }
    for (int kind = FB_SEQ_POOL_MEAN; kind <= FB_SEQ_POOL_FIRST; kind++) {
        case_seq_pool(3, 1, 1, 5, (fb_seq_pool)kind);
        case_seq_pool(4, 17, 3, 33, (fb_seq_pool)kind);
    }

    for (int b = 1; b <= 5; b += 4) {
        case_optim(FB_OPTIM_KIND_SGD, b, 0.0f, 0);
        case_optim(FB_OPTIM_KIND_SGD, b, 0.9f, 0);
        case_optim(FB_OPTIM_KIND_SGD, b, 0.9f, 1);
        case_optim(FB_OPTIM_KIND_ADAM, b, 0.0f, 0);
        case_optim(FB_OPTIM_KIND_ADAMW, b, 0.0f, 0);
    }

    case_round_bf16(4099);
    case_round_bf16(12);
    case_grad_unscale(1);
    case_grad_unscale(5);

    /* cuBLAS: float, then bf16 operands with TF32 on */
    for (int s = 0; s < 2; s++) {
        case_linear(7, 1, 13, 5, s, true);
        case_linear(9, 3, 17, 11, s, true);
        case_linear(33, 4, 64, 31, s, false);
        case_linear(1, 5, 3, 1, s, true);
    }
    case_linear(128, 16, 784, 256, false, true);
    case_linear(128, 16, 784, 256, true, true);
    case_sgemm(37, 29, 53);
    case_sgemm(1, 1, 1);
    case_sgemm(64, 48, 0);
    case_sgemm(256, 128, 512);
    g_bf16 = true;
    fb_cuda_backend_set_tf32(g_cu, true);
    case_linear(33, 4, 64, 31, false, true);
    case_linear(33, 4, 64, 31, true, false);
    case_linear(128, 16, 784, 256, false, true);
    fb_cuda_backend_set_tf32(g_cu, false);
    g_bf16 = false;

    /* cuDNN last: a refusal there leaves every verdict above standing */
    case_conv((fb_conv_geom){.N = 3, .B = 1, .C = 2, .H = 9, .W = 8, .K = 4, .kh = 3, .kw = 3,
                             .sh = 1, .sw = 1, .ph = 1, .pw = 1});
    case_conv((fb_conv_geom){.N = 2, .B = 3, .C = 3, .H = 11, .W = 7, .K = 5, .kh = 3, .kw = 2,
                             .sh = 2, .sw = 1, .ph = 1, .pw = 0});
    case_conv((fb_conv_geom){.N = 2, .B = 4, .C = 1, .H = 10, .W = 10, .K = 3, .kh = 5, .kw = 5,
                             .sh = 1, .sw = 1, .ph = 2, .pw = 2, .shared = true});
    case_conv((fb_conv_geom){.N = 5, .B = 2, .C = 16, .H = 14, .W = 14, .K = 32, .kh = 3, .kw = 3,
                             .sh = 1, .sw = 1, .ph = 1, .pw = 1});
    case_conv((fb_conv_geom){.N = 4, .B = 1, .C = 3, .H = 6, .W = 5, .K = 2, .kh = 1, .kw = 1,
                             .sh = 1, .sw = 1, .ph = 0, .pw = 0, .shared = true});
    g_bf16 = true;
    fb_cuda_backend_set_tf32(g_cu, true);
    case_conv((fb_conv_geom){.N = 2,
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
    case_conv((fb_conv_geom){.N = 5,
                             .B = 2,
                             .C = 16,
                             .H = 14,
                             .W = 14,
                             .K = 32,
                             .kh = 3,
                             .kw = 3,
                             .sh = 1,
                             .sw = 1,
                             .ph = 1,
                             .pw = 1});
    case_conv((fb_conv_geom){.N = 2,
                             .B = 4,
                             .C = 1,
                             .H = 10,
                             .W = 10,
                             .K = 3,
                             .kh = 5,
                             .kw = 5,
                             .sh = 1,
                             .sw = 1,
                             .ph = 2,
                             .pw = 2,
                             .shared = true});
    fb_cuda_backend_set_tf32(g_cu, false);
    g_bf16 = false;

    CHECK_INT_EQ(fb_cuda_backend_error(g_cu, msg, sizeof msg), FB_OK);
    printf("%d of %d checks failed\n", g_failures, g_checks);
    CHECK_INT_EQ(g_failures, 0);
    return 0;
}
