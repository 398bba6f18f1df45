/*
 * Backend cross-check: every op, both directions, run on the fast CPU backend
 * ("cpu") and on the reference ("cpu-ref") with the same fixed-seed inputs.
 * Each output is compared by normalised error max|a - b| / max(1, max|b|)
 * against a per-op bound, NaN/Inf positions must agree, and every output
 * buffer (and conv scratch) is guarded by canaries that must stay intact.
 * Outputs an op overwrites start as NaN on the backend under test (and as a
 * finite junk value on the reference), so an element it forgets to write
 * shows up; outputs an op accumulates into start from the same random values.
 * One line per case.
 */
#include "errors.h"
#include "kt_util.h"

#include <stdarg.h>

#define MAX_OUT 6

typedef enum { OUT_ACCUM, OUT_OVERWRITE, OUT_EXACT } out_kind;

typedef struct cc_case cc_case;
typedef void (*cc_run_fn)(fb_backend *be, const cc_case *c, float **outs);

struct cc_case {
    char name[112];
    double tol;
    int n_out;
    struct {
        const char *name;
        size_t n;
        out_kind kind;
        float *init; /* owned; NULL for overwritten outputs */
    } out[MAX_OUT];
    cc_run_fn run;
    const void *arg;
};

static int g_cases, g_failures;
static fb_backend *g_fast, *g_ref;

static cc_case cc_new(cc_run_fn run, const void *arg, double tol, const char *fmt, ...)
{
    cc_case c;
    memset(&c, 0, sizeof c);
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(c.name, sizeof c.name, fmt, ap);
    va_end(ap);
    c.run = run;
    c.arg = arg;
    c.tol = tol;
    return c;
}

/* Adds an output of n floats; accumulated outputs start from init (copied) or
 * from random values in [-1, 1) when init is NULL. */
static void cc_out(cc_case *c, const char *name, size_t n, out_kind kind, const float *init)
{
    CHECK(c->n_out < MAX_OUT);
    int o = c->n_out++;
    c->out[o].name = name;
    c->out[o].n = n;
    c->out[o].kind = kind;
    c->out[o].init = NULL;
    if (kind == OUT_ACCUM) {
        c->out[o].init = kt_rand(n, -1.0f, 1.0f);
        if (init) memcpy(c->out[o].init, init, n * sizeof(float));
    }
}

/* Runs the case on both backends, compares, prints one line, frees. */
static void cc_run(cc_case *c)
{
    float *bufs[2][MAX_OUT];
    fb_backend *bes[2] = {g_fast, g_ref};
    bool ok = true;
    for (int k = 0; k < 2; k++) {
        for (int o = 0; o < c->n_out; o++) {
            size_t n = c->out[o].n;
            float *p = kt_guarded_new(n);
            if (c->out[o].kind == OUT_ACCUM) {
                memcpy(p, c->out[o].init, n * sizeof(float));
            } else {
                float junk = k == 0 ? NAN : 12345.0f;
                for (size_t i = 0; i < n; i++)
                    p[i] = junk;
            }
            bufs[k][o] = p;
        }
        c->run(bes[k], c, bufs[k]);
        for (int o = 0; o < c->n_out; o++)
            if (!kt_guarded_ok(bufs[k][o], c->out[o].n)) {
                printf("  %s: output %s written out of bounds on %s\n", c->name, c->out[o].name,
                       fb_backend_name(bes[k]));
                ok = false;
            }
    }
    double worst = 0.0;
    for (int o = 0; o < c->n_out; o++) {
        const float *a = bufs[0][o], *b = bufs[1][o];
        size_t n = c->out[o].n;
        if (c->out[o].kind == OUT_EXACT) {
            if (memcmp(a, b, n * sizeof(float)) != 0) {
                printf("  %s: output %s differs (exact)\n", c->name, c->out[o].name);
                ok = false;
            }
            continue;
        }
        bool nan_ok;
        double e = kt_norm_err(a, b, n, &nan_ok);
        if (!nan_ok) {
            printf("  %s: output %s: NaN/Inf positions differ\n", c->name, c->out[o].name);
            ok = false;
        }
        if (!(e <= c->tol)) {
            printf("  %s: output %s: error %.3g > %.1g\n", c->name, c->out[o].name, e, c->tol);
            ok = false;
        }
        if (e > worst) worst = e;
    }
    printf("%-64s err %.2e tol %.0e %s\n", c->name, worst, c->tol, ok ? "ok" : "FAIL");
    g_cases++;
    g_failures += !ok;
    for (int k = 0; k < 2; k++)
        for (int o = 0; o < c->n_out; o++)
            kt_guarded_free(bufs[k][o]);
    for (int o = 0; o < c->n_out; o++)
        free(c->out[o].init);
}

/* ---- linear ---- */

typedef struct {
    int N, B, I, O;
    bool shared, bias, din;
    float *in, *w, *b, *dout;
} lin_arg;

static void run_linear_fwd(fb_backend *be, const cc_case *c, float **outs)
{
    const lin_arg *a = c->arg;
    fb_linear_forward(be, outs[0], a->in, a->w, a->bias ? a->b : NULL, a->N, a->B, a->I, a->O,
                      a->shared);
}

static void run_linear_bwd(fb_backend *be, const cc_case *c, float **outs)
{
    const lin_arg *a = c->arg;
    fb_linear_backward(be, a->din ? outs[2] : NULL, outs[0], a->bias ? outs[1] : NULL, a->dout,
                       a->in, a->w, a->N, a->B, a->I, a->O, a->shared);
}

static void cases_linear(void)
{
    static const struct {
        int N, B, I, O;
        bool shared, bias, din;
    } cfg[] = {
        {5, 1, 7, 3, false, true, true},      {5, 3, 7, 3, false, true, true},
        {5, 3, 7, 3, true, true, true},       {4, 3, 13, 9, false, false, true},
        {17, 3, 33, 10, true, true, false},   {2, 1, 1, 1, false, true, true},
        {9, 3, 64, 31, false, true, true},    {1, 1, 5, 4, true, false, true},
        {64, 4, 300, 130, false, true, true}, {64, 4, 300, 130, true, true, true},
        /* large enough to be cut over threads: rows of one member, members, columns */
        {256, 1, 300, 130, false, true, true}, {96, 2, 257, 129, false, true, true},
        {96, 5, 200, 67, false, false, true},  {128, 6, 301, 50, true, true, true},
    };
    for (size_t i = 0; i < sizeof cfg / sizeof cfg[0]; i++) {
        lin_arg a = {cfg[i].N,   cfg[i].B, cfg[i].I, cfg[i].O, cfg[i].shared, cfg[i].bias,
                     cfg[i].din, NULL,     NULL,     NULL,     NULL};
        int Bi = a.shared ? 1 : a.B;
        size_t n_in = (size_t)a.N * Bi * a.I, n_out = (size_t)a.N * a.B * a.O;
        a.in = kt_rand(n_in, -1, 1);
        a.w = kt_rand((size_t)a.B * a.O * a.I, -1, 1);
        a.b = kt_rand((size_t)a.B * a.O, -1, 1);
        a.dout = kt_rand(n_out, -1, 1);
        const char *tag = a.shared ? "shared" : "fused";
        cc_case c = cc_new(run_linear_fwd, &a, 1e-5, "linear_fwd N%d B%d I%d O%d %s%s", a.N, a.B,
                           a.I, a.O, tag, a.bias ? "" : " nobias");
        cc_out(&c, "out", n_out, OUT_OVERWRITE, NULL);
        cc_run(&c);
        c = cc_new(run_linear_bwd, &a, 1e-5, "linear_bwd N%d B%d I%d O%d %s%s%s", a.N, a.B, a.I,
                   a.O, tag, a.bias ? "" : " nobias", a.din ? "" : " nodin");
        cc_out(&c, "dw", (size_t)a.B * a.O * a.I, OUT_ACCUM, NULL);
        cc_out(&c, "dbias", (size_t)a.B * a.O, OUT_ACCUM, NULL);
        cc_out(&c, "din", n_in, OUT_ACCUM, NULL);
        cc_run(&c);
        free(a.in);
        free(a.w);
        free(a.b);
        free(a.dout);
    }
}

/* ---- conv2d ---- */

typedef struct {
    fb_conv_geom g;
    bool bias;
    float *in, *w, *b, *dout;
} conv_arg;

static float *scratch_for(fb_backend *be, const fb_conv_geom *g, size_t *n)
{
    *n = fb_conv2d_scratch_floats(be, g);
    return *n ? kt_guarded_new(*n) : NULL;
}

static void scratch_done(float *s, size_t n, const char *name)
{
    if (s && !kt_guarded_ok(s, n)) {
        printf("  %s: conv scratch written out of bounds\n", name);
        g_failures++;
    }
    kt_guarded_free(s);
}

static void run_conv_fwd(fb_backend *be, const cc_case *c, float **outs)
{
    const conv_arg *a = c->arg;
    size_t ns;
    float *s = scratch_for(be, &a->g, &ns);
    fb_conv2d_forward(be, outs[0], a->in, a->w, a->bias ? a->b : NULL, &a->g, s);
    scratch_done(s, ns, c->name);
}

static void run_conv_bwd(fb_backend *be, const cc_case *c, float **outs)
{
    const conv_arg *a = c->arg;
    size_t ns;
    float *s = scratch_for(be, &a->g, &ns);
    fb_conv2d_backward(be, a->g.shared ? NULL : outs[2], outs[0], a->bias ? outs[1] : NULL, a->dout,
                       a->in, a->w, &a->g, s);
    scratch_done(s, ns, c->name);
}

static void cases_conv(void)
{
    /* N B C H W K kh kw sh sw ph pw shared bias */
    static const int cfg[][14] = {
        {2, 1, 2, 7, 6, 3, 3, 3, 1, 1, 1, 1, 0, 1},    {2, 3, 2, 7, 6, 3, 3, 3, 1, 1, 1, 1, 0, 1},
        {2, 3, 1, 9, 9, 4, 3, 3, 1, 1, 1, 1, 1, 1},    {2, 1, 3, 6, 6, 4, 2, 2, 2, 2, 0, 0, 1, 1},
        {2, 3, 2, 8, 7, 2, 3, 2, 2, 1, 1, 0, 0, 1},    {3, 3, 3, 5, 5, 2, 1, 1, 1, 1, 0, 0, 0, 1},
        {2, 3, 2, 9, 8, 3, 5, 5, 2, 2, 2, 2, 0, 0},    {1, 3, 2, 5, 5, 3, 1, 1, 2, 2, 0, 0, 0, 1},
        {2, 3, 2, 4, 4, 2, 4, 4, 1, 1, 0, 0, 0, 1},    {2, 3, 2, 5, 6, 3, 3, 3, 3, 2, 1, 1, 1, 0},
        {2, 1, 4, 3, 3, 5, 1, 1, 1, 1, 0, 0, 1, 1},    {2, 3, 2, 6, 5, 2, 3, 1, 1, 3, 0, 1, 0, 1},
        {4, 3, 8, 14, 14, 16, 3, 3, 1, 1, 1, 1, 0, 1}, {4, 4, 1, 28, 28, 8, 5, 5, 1, 1, 2, 2, 1, 1},
        /* cut over threads by samples: private weight gradients, pointwise, strided */
        {9, 1, 8, 14, 14, 16, 3, 3, 1, 1, 1, 1, 0, 1}, {16, 2, 16, 16, 16, 32, 1, 1, 1, 1, 0, 0, 0, 1},
        {7, 2, 3, 17, 15, 24, 3, 3, 2, 2, 1, 1, 0, 0}, {10, 3, 1, 28, 28, 16, 3, 3, 1, 1, 1, 1, 1, 1},
        /* stride 1 keeping the width (a tap's rows are one run): a kernel
         * wider than the image, one row, no row padding, ph != pw */
        {2, 2, 2, 3, 3, 2, 5, 5, 1, 1, 2, 2, 0, 1},    {2, 2, 3, 1, 7, 2, 3, 3, 1, 1, 1, 1, 1, 1},
        {2, 3, 2, 6, 5, 2, 3, 1, 1, 1, 0, 0, 0, 1},    {3, 2, 2, 8, 6, 3, 5, 3, 1, 1, 1, 1, 0, 0},
        /* the grid (stride 1): a row of taps padded only along it, a grid
         * of one short tile, more rows than a block; unfolded instead:
         * padding as wide as the kernel, planes too large for the grid */
        {2, 2, 3, 5, 5, 3, 1, 3, 1, 1, 0, 1, 0, 1},    {2, 2, 2, 2, 3, 5, 2, 2, 1, 1, 0, 0, 1, 1},
        {3, 1, 2, 6, 6, 9, 3, 3, 1, 1, 1, 1, 0, 0},    {2, 2, 2, 5, 5, 3, 1, 1, 1, 1, 1, 1, 0, 1},
        {2, 1, 32, 32, 32, 4, 3, 3, 1, 1, 1, 1, 0, 1},
    };
    for (size_t i = 0; i < sizeof cfg / sizeof cfg[0]; i++) {
        const int *q = cfg[i];
        conv_arg a;
        memset(&a, 0, sizeof a);
        a.g = (fb_conv_geom){.N = q[0],
                             .B = q[1],
                             .C = q[2],
                             .H = q[3],
                             .W = q[4],
                             .K = q[5],
                             .kh = q[6],
                             .kw = q[7],
                             .sh = q[8],
                             .sw = q[9],
                             .ph = q[10],
                             .pw = q[11],
                             .shared = q[12] != 0};
        a.bias = q[13] != 0;
        fb_conv_geom_finish(&a.g);
        const fb_conv_geom *g = &a.g;
        int Bi = g->shared ? 1 : g->B;
        size_t n_in = (size_t)g->N * Bi * g->C * g->H * g->W;
        size_t n_w = (size_t)g->B * g->K * g->C * g->kh * g->kw;
        size_t n_out = (size_t)g->N * g->B * g->K * g->Ho * g->Wo;
        a.in = kt_rand(n_in, -1, 1);
        a.w = kt_rand(n_w, -1, 1);
        a.b = kt_rand((size_t)g->B * g->K, -1, 1);
        a.dout = kt_rand(n_out, -1, 1);
        char desc[96];
        snprintf(desc, sizeof desc, "N%d B%d C%d %dx%d K%d k%dx%d s%d,%d p%d,%d %s%s", g->N, g->B,
                 g->C, g->H, g->W, g->K, g->kh, g->kw, g->sh, g->sw, g->ph, g->pw,
                 g->shared ? "shared" : "fused", a.bias ? "" : " nobias");
        cc_case c = cc_new(run_conv_fwd, &a, 1e-5, "conv2d_fwd %s", desc);
        cc_out(&c, "out", n_out, OUT_OVERWRITE, NULL);
        cc_run(&c);
        c = cc_new(run_conv_bwd, &a, 1e-5, "conv2d_bwd %s", desc);
        cc_out(&c, "dw", n_w, OUT_ACCUM, NULL);
        cc_out(&c, "dbias", (size_t)g->B * g->K, OUT_ACCUM, NULL);
        if (!g->shared) cc_out(&c, "din", n_in, OUT_ACCUM, NULL);
        cc_run(&c);
        free(a.in);
        free(a.w);
        free(a.b);
        free(a.dout);
    }
}

/* ---- pooling ---- */

typedef struct {
    fb_pool_geom g;
    float *in, *dout;
    int32_t *argmax;
} pool_arg;

static void run_maxpool_fwd(fb_backend *be, const cc_case *c, float **outs)
{
    const pool_arg *a = c->arg;
    fb_maxpool2d_forward(be, outs[0], (int32_t *)(void *)outs[1], a->in, &a->g);
}

static void run_maxpool_bwd(fb_backend *be, const cc_case *c, float **outs)
{
    const pool_arg *a = c->arg;
    fb_maxpool2d_backward(be, outs[0], a->dout, a->argmax, &a->g);
}

static void run_avgpool_fwd(fb_backend *be, const cc_case *c, float **outs)
{
    const pool_arg *a = c->arg;
    fb_avgpool2d_forward(be, outs[0], a->in, &a->g);
}

static void run_avgpool_bwd(fb_backend *be, const cc_case *c, float **outs)
{
    const pool_arg *a = c->arg;
    fb_avgpool2d_backward(be, outs[0], a->dout, &a->g);
}

static void run_gap_fwd(fb_backend *be, const cc_case *c, float **outs)
{
    const pool_arg *a = c->arg;
    fb_global_avgpool_forward(be, outs[0], a->in, a->g.N, a->g.BC, a->g.H * a->g.W);
}

static void run_gap_bwd(fb_backend *be, const cc_case *c, float **outs)
{
    const pool_arg *a = c->arg;
    fb_global_avgpool_backward(be, outs[0], a->dout, a->g.N, a->g.BC, a->g.H * a->g.W);
}

static void cases_pool(void)
{
    /* N C H W kh kw sh sw ph pw, ties */
    static const int cfg[][11] = {
        {2, 2, 6, 6, 2, 2, 2, 2, 0, 0, 0}, {2, 2, 7, 5, 3, 3, 2, 2, 1, 1, 0},
        {1, 2, 5, 5, 3, 3, 1, 1, 1, 1, 1}, {2, 1, 6, 7, 2, 3, 1, 2, 1, 0, 0},
        {3, 2, 7, 7, 2, 2, 2, 2, 0, 0, 1}, {1, 1, 4, 4, 4, 4, 1, 1, 0, 0, 0},
        {2, 2, 5, 6, 3, 2, 3, 1, 1, 1, 0},
        /* cut over threads by planes: the 2x2 path (odd size, ties) and the general one */
        {4, 16, 29, 28, 2, 2, 2, 2, 0, 0, 1}, {8, 16, 15, 15, 3, 3, 2, 2, 1, 1, 1},
        /* 2x2 rows of two blocks of eight windows and a tail, and of four and
         * a tail: ties, NaN, +-Inf */
        {2, 3, 34, 37, 2, 2, 2, 2, 0, 0, 1}, {3, 4, 14, 15, 2, 2, 2, 2, 0, 0, 1},
    };
    for (int B = 1; B <= 3; B += 2)
        for (size_t i = 0; i < sizeof cfg / sizeof cfg[0]; i++) {
            const int *q = cfg[i];
            pool_arg a;
            a.g = (fb_pool_geom){.N = q[0],
                                 .BC = B * q[1],
                                 .H = q[2],
                                 .W = q[3],
                                 .kh = q[4],
                                 .kw = q[5],
                                 .sh = q[6],
                                 .sw = q[7],
                                 .ph = q[8],
                                 .pw = q[9]};
            fb_pool_geom_finish(&a.g);
            const fb_pool_geom *g = &a.g;
            size_t n_in = (size_t)g->N * g->BC * g->H * g->W;
            size_t n_out = (size_t)g->N * g->BC * g->Ho * g->Wo;
            a.in = kt_rand(n_in, -1, 1);
            if (q[10]) { /* coarse values: many ties, plus NaN and -Inf */
                for (size_t j = 0; j < n_in; j++)
                    a.in[j] = (float)(int)(a.in[j] * 2.0f) * 0.5f;
                a.in[n_in / 3] = NAN;
                a.in[n_in / 2] = -INFINITY;
                a.in[n_in - 1] = INFINITY;
            }
            a.dout = kt_rand(n_out, -1, 1);
            a.argmax = malloc(n_out * sizeof(int32_t));
            float *tmp = malloc(n_out * sizeof(float));
            CHECK(a.argmax && tmp);
            fb_maxpool2d_forward(g_ref, tmp, a.argmax, a.in, g);
            free(tmp);
            char desc[80];
            snprintf(desc, sizeof desc, "N%d BC%d %dx%d k%dx%d s%d,%d p%d,%d%s", g->N, g->BC, g->H,
                     g->W, g->kh, g->kw, g->sh, g->sw, g->ph, g->pw, q[10] ? " ties+nan" : "");
            cc_case c = cc_new(run_maxpool_fwd, &a, 0.0, "maxpool2d_fwd %s", desc);
            cc_out(&c, "out", n_out, OUT_OVERWRITE, NULL);
            cc_out(&c, "argmax", n_out, OUT_EXACT, NULL);
            cc_run(&c);
            c = cc_new(run_maxpool_bwd, &a, 1e-6, "maxpool2d_bwd %s", desc);
            cc_out(&c, "din", n_in, OUT_ACCUM, NULL);
            cc_run(&c);
            c = cc_new(run_avgpool_fwd, &a, 1e-6, "avgpool2d_fwd %s", desc);
            cc_out(&c, "out", n_out, OUT_OVERWRITE, NULL);
            cc_run(&c);
            c = cc_new(run_avgpool_bwd, &a, 1e-6, "avgpool2d_bwd %s", desc);
            cc_out(&c, "din", n_in, OUT_ACCUM, NULL);
            cc_run(&c);
            if (i < 3) {
                c = cc_new(run_gap_fwd, &a, 1e-6, "global_avgpool_fwd N%d BC%d HW%d%s", g->N, g->BC,
                           g->H * g->W, q[10] ? " nan" : "");
                cc_out(&c, "out", (size_t)g->N * g->BC, OUT_OVERWRITE, NULL);
                cc_run(&c);
                c = cc_new(run_gap_bwd, &a, 1e-6, "global_avgpool_bwd N%d BC%d HW%d", g->N, g->BC,
                           g->H * g->W);
                cc_out(&c, "din", n_in, OUT_ACCUM, NULL);
                cc_run(&c);
            }
            free(a.in);
            free(a.dout);
            free(a.argmax);
        }
}

/* ---- elementwise ---- */

typedef struct {
    fb_act act;
    size_t n;
    float *in, *out, *dout, *other;
} elt_arg;

static void run_act_fwd(fb_backend *be, const cc_case *c, float **outs)
{
    const elt_arg *a = c->arg;
    fb_act_forward(be, a->act, outs[0], a->in, a->n);
}

static void run_act_bwd(fb_backend *be, const cc_case *c, float **outs)
{
    const elt_arg *a = c->arg;
    fb_act_backward(be, a->act, outs[0], a->dout, a->in, a->out, a->n);
}

static void run_act_inplace(fb_backend *be, const cc_case *c, float **outs)
{
    const elt_arg *a = c->arg;
    memcpy(outs[0], a->in, a->n * sizeof(float));
    fb_act_forward(be, a->act, outs[0], outs[0], a->n);
}

static void run_add(fb_backend *be, const cc_case *c, float **outs)
{
    const elt_arg *a = c->arg;
    fb_add_forward(be, outs[0], a->in, a->other, a->n);
    /* aliased: out = out + b */
    memcpy(outs[1], a->in, a->n * sizeof(float));
    fb_add_forward(be, outs[1], outs[1], a->other, a->n);
}

static void run_accumulate(fb_backend *be, const cc_case *c, float **outs)
{
    const elt_arg *a = c->arg;
    fb_accumulate(be, outs[0], a->in, a->n);
}

static void cases_eltwise_n(size_t n);

/* A small array, and one large enough to be cut over threads. */
static void cases_eltwise(void)
{
    cases_eltwise_n(1001);
    cases_eltwise_n(100003);
}

static void cases_eltwise_n(size_t n)
{
    static const char *names[] = {"relu", "gelu", "gelu_tanh", "tanh", "sigmoid"};
    elt_arg a;
    a.n = n;
    a.in = kt_rand(n, -6, 6);
    a.in[3] = NAN;
    a.in[10] = INFINITY;
    a.in[11] = -INFINITY;
    a.in[12] = 0.0f;
    a.in[13] = -0.0f;
    a.in[14] = 40.0f;
    a.in[15] = -40.0f;
    a.out = malloc(n * sizeof(float));
    a.dout = kt_rand(n, -1, 1);
    a.other = kt_rand(n, -1, 1);
    CHECK(a.out != NULL);
    for (int act = FB_ACT_RELU; act <= FB_ACT_SIGMOID; act++) {
        a.act = (fb_act)act;
        fb_act_forward(g_ref, a.act, a.out, a.in, n);
        cc_case c = cc_new(run_act_fwd, &a, 1e-6, "act_fwd %s n%zu (nan, inf)", names[act], n);
        cc_out(&c, "out", n, OUT_OVERWRITE, NULL);
        cc_run(&c);
        c = cc_new(run_act_inplace, &a, 1e-6, "act_fwd %s n%zu in place", names[act], n);
        cc_out(&c, "out", n, OUT_OVERWRITE, NULL);
        cc_run(&c);
        c = cc_new(run_act_bwd, &a, 1e-5, "act_bwd %s n%zu (nan, inf)", names[act], n);
        cc_out(&c, "din", n, OUT_ACCUM, NULL);
        cc_run(&c);
    }
    cc_case c = cc_new(run_add, &a, 0.0, "add n%zu (plain and aliased)", n);
    cc_out(&c, "out", n, OUT_OVERWRITE, NULL);
    cc_out(&c, "out_aliased", n, OUT_OVERWRITE, NULL);
    cc_run(&c);
    c = cc_new(run_accumulate, &a, 0.0, "accumulate n%zu", n);
    cc_out(&c, "y", n, OUT_ACCUM, NULL);
    cc_run(&c);
    free(a.in);
    free(a.out);
    free(a.dout);
    free(a.other);
}

typedef struct {
    int N, B, F;
    float p;
    int64_t n_offset;
    uint64_t seeds[4];
    float *in, *dout;
} drop_arg;

static void run_dropout_fwd(fb_backend *be, const cc_case *c, float **outs)
{
    const drop_arg *a = c->arg;
    fb_dropout_forward(be, outs[0], a->in, a->seeds, 77, a->p, a->N, a->B, a->F, a->n_offset);
}

static void run_dropout_bwd(fb_backend *be, const cc_case *c, float **outs)
{
    const drop_arg *a = c->arg;
    fb_dropout_backward(be, outs[0], a->dout, a->seeds, 77, a->p, a->N, a->B, a->F, a->n_offset);
}

static void cases_dropout(void)
{
    static const struct {
        int N, B, F;
        float p;
        int64_t off;
    } cfg[] = {{7, 1, 13, 0.3f, 0}, {7, 3, 13, 0.3f, 5}, {4, 3, 9, 0.0f, 0}, {3, 2, 5, 0.9f, 2}};
    for (size_t i = 0; i < sizeof cfg / sizeof cfg[0]; i++) {
        drop_arg a = {cfg[i].N,   cfg[i].B,         cfg[i].F, cfg[i].p,
                      cfg[i].off, {11, 22, 33, 44}, NULL,     NULL};
        size_t n = (size_t)a.N * a.B * a.F;
        a.in = kt_rand(n, -1, 1);
        a.dout = kt_rand(n, -1, 1);
        cc_case c = cc_new(run_dropout_fwd, &a, 0.0, "dropout_fwd N%d B%d F%d p%.1f off%d", a.N,
                           a.B, a.F, a.p, (int)a.n_offset);
        cc_out(&c, "out", n, OUT_OVERWRITE, NULL);
        cc_run(&c);
        c = cc_new(run_dropout_bwd, &a, 0.0, "dropout_bwd N%d B%d F%d p%.1f off%d", a.N, a.B, a.F,
                   a.p, (int)a.n_offset);
        cc_out(&c, "din", n, OUT_ACCUM, NULL);
        cc_run(&c);
        free(a.in);
        free(a.dout);
    }
}

/* ---- normalisation ---- */

typedef struct {
    int N, C, HW; /* batchnorm: C = BC; layernorm: C = B, HW = F */
    bool affine;
    float *in, *gamma, *beta, *dout, *mean, *rstd, *rmean, *rvar;
} norm_arg;

static void run_bn_train(fb_backend *be, const cc_case *c, float **outs)
{
    const norm_arg *a = c->arg;
    fb_batchnorm_forward_train(be, outs[0], outs[1], outs[2], outs[3], outs[4], a->in,
                               a->affine ? a->gamma : NULL, a->affine ? a->beta : NULL, a->N, a->C,
                               a->HW, 1e-5f, 0.1f);
}

static void run_bn_eval(fb_backend *be, const cc_case *c, float **outs)
{
    const norm_arg *a = c->arg;
    fb_batchnorm_forward_eval(be, outs[0], a->in, a->affine ? a->gamma : NULL,
                              a->affine ? a->beta : NULL, a->rmean, a->rvar, a->N, a->C, a->HW,
                              1e-5f);
}

static void run_bn_bwd(fb_backend *be, const cc_case *c, float **outs)
{
    const norm_arg *a = c->arg;
    fb_batchnorm_backward(be, outs[0], a->affine ? outs[1] : NULL, a->affine ? outs[2] : NULL,
                          a->dout, a->in, a->mean, a->rstd, a->affine ? a->gamma : NULL, a->N, a->C,
                          a->HW);
}

static void run_ln_fwd(fb_backend *be, const cc_case *c, float **outs)
{
    const norm_arg *a = c->arg;
    fb_layernorm_forward(be, outs[0], outs[1], outs[2], a->in, a->affine ? a->gamma : NULL,
                         a->affine ? a->beta : NULL, a->N, a->C, a->HW, 1e-5f);
}

static void run_ln_bwd(fb_backend *be, const cc_case *c, float **outs)
{
    const norm_arg *a = c->arg;
    fb_layernorm_backward(be, outs[0], a->affine ? outs[1] : NULL, a->affine ? outs[2] : NULL,
                          a->dout, a->in, a->mean, a->rstd, a->affine ? a->gamma : NULL, a->N, a->C,
                          a->HW);
}

static void norm_arg_init(norm_arg *a, int N, int C, int HW, bool affine, size_t n_param,
                          size_t n_stat)
{
    size_t n = (size_t)N * C * HW;
    a->N = N;
    a->C = C;
    a->HW = HW;
    a->affine = affine;
    a->in = kt_rand(n, -2, 3);
    a->dout = kt_rand(n, -1, 1);
    a->gamma = kt_rand(n_param, 0.5f, 1.5f);
    a->beta = kt_rand(n_param, -1, 1);
    a->rmean = kt_rand(n_param, -1, 1);
    a->rvar = kt_rand(n_param, 0.5f, 2);
    a->mean = malloc(n_stat * sizeof(float));
    a->rstd = malloc(n_stat * sizeof(float));
    CHECK(a->mean && a->rstd);
}

static void norm_arg_free(norm_arg *a)
{
    free(a->in);
    free(a->dout);
    free(a->gamma);
    free(a->beta);
    free(a->rmean);
    free(a->rvar);
    free(a->mean);
    free(a->rstd);
}

static void cases_norm(void)
{
    /* batchnorm: N, B, C, HW, affine */
    static const int bn[][5] = {{6, 1, 3, 1, 1},   {6, 3, 3, 1, 1},   {4, 3, 2, 25, 1},
                                {3, 1, 5, 9, 0},   {5, 3, 100, 1, 1}, {2, 3, 2, 49, 0},
                                {33, 2, 150, 1, 1}};
    for (size_t i = 0; i < sizeof bn / sizeof bn[0]; i++) {
        int N = bn[i][0], BC = bn[i][1] * bn[i][2], HW = bn[i][3];
        norm_arg a;
        norm_arg_init(&a, N, BC, HW, bn[i][4] != 0, (size_t)BC, (size_t)BC);
        size_t n = (size_t)N * BC * HW;
        float *tmp = malloc(n * sizeof(float));
        float *rm = malloc(BC * sizeof(float)), *rv = malloc(BC * sizeof(float));
        CHECK(tmp && rm && rv);
        fb_batchnorm_forward_train(g_ref, tmp, a.mean, a.rstd, rm, rv, a.in, a.gamma, a.beta, N, BC,
                                   HW, 1e-5f, 0.1f);
        char desc[64];
        snprintf(desc, sizeof desc, "N%d B%d C%d HW%d%s", N, bn[i][1], bn[i][2], HW,
                 a.affine ? "" : " noaffine");
        cc_case c = cc_new(run_bn_train, &a, 1e-5, "batchnorm_fwd_train %s", desc);
        cc_out(&c, "out", n, OUT_OVERWRITE, NULL);
        cc_out(&c, "mean", BC, OUT_OVERWRITE, NULL);
        cc_out(&c, "rstd", BC, OUT_OVERWRITE, NULL);
        cc_out(&c, "running_mean", BC, OUT_ACCUM, a.rmean);
        cc_out(&c, "running_var", BC, OUT_ACCUM, a.rvar);
        cc_run(&c);
        c = cc_new(run_bn_eval, &a, 1e-5, "batchnorm_fwd_eval %s", desc);
        cc_out(&c, "out", n, OUT_OVERWRITE, NULL);
        cc_run(&c);
        c = cc_new(run_bn_bwd, &a, 1e-5, "batchnorm_bwd %s", desc);
        cc_out(&c, "din", n, OUT_ACCUM, NULL);
        cc_out(&c, "dgamma", BC, OUT_ACCUM, NULL);
        cc_out(&c, "dbeta", BC, OUT_ACCUM, NULL);
        cc_run(&c);
        free(tmp);
        free(rm);
        free(rv);
        norm_arg_free(&a);
    }
    /* layernorm: N, B, F, affine */
    static const int ln[][4] = {{5, 1, 7, 1}, {5, 3, 7, 1}, {4, 3, 33, 0}, {9, 2, 128, 1}};
    for (size_t i = 0; i < sizeof ln / sizeof ln[0]; i++) {
        int N = ln[i][0], B = ln[i][1], F = ln[i][2];
        norm_arg a;
        norm_arg_init(&a, N, B, F, ln[i][3] != 0, (size_t)B * F, (size_t)N * B);
        size_t n = (size_t)N * B * F;
        float *tmp = malloc(n * sizeof(float));
        CHECK(tmp != NULL);
        fb_layernorm_forward(g_ref, tmp, a.mean, a.rstd, a.in, a.gamma, a.beta, N, B, F, 1e-5f);
        cc_case c = cc_new(run_ln_fwd, &a, 1e-5, "layernorm_fwd N%d B%d F%d%s", N, B, F,
                           a.affine ? "" : " noaffine");
        cc_out(&c, "out", n, OUT_OVERWRITE, NULL);
        cc_out(&c, "mean", (size_t)N * B, OUT_OVERWRITE, NULL);
        cc_out(&c, "rstd", (size_t)N * B, OUT_OVERWRITE, NULL);
        cc_run(&c);
        c = cc_new(run_ln_bwd, &a, 1e-5, "layernorm_bwd N%d B%d F%d%s", N, B, F,
                   a.affine ? "" : " noaffine");
        cc_out(&c, "din", n, OUT_ACCUM, NULL);
        cc_out(&c, "dgamma", (size_t)B * F, OUT_ACCUM, NULL);
        cc_out(&c, "dbeta", (size_t)B * F, OUT_ACCUM, NULL);
        cc_run(&c);
        free(tmp);
        norm_arg_free(&a);
    }
}

/* ---- sequences ---- */

typedef struct {
    int N, T, B, V, D, L, H;
    bool causal, din;
    fb_seq_pool kind;
    int32_t *ids;
    float *table, *in, *pos, *qkv, *probs, *dout;
} seq_arg;

static void run_emb_fwd(fb_backend *be, const cc_case *c, float **outs)
{
    const seq_arg *a = c->arg;
    CHECK_INT_EQ(fb_embedding_forward(be, outs[0], a->ids, a->table, a->N, a->T, a->B, a->V, a->D,
                                      NULL, 0),
                 FB_OK);
}

static void run_emb_bwd(fb_backend *be, const cc_case *c, float **outs)
{
    const seq_arg *a = c->arg;
    CHECK_INT_EQ(fb_embedding_backward(be, outs[0], a->dout, a->ids, a->N, a->T, a->B, a->V, a->D,
                                       NULL, 0),
                 FB_OK);
}

static void run_pos_fwd(fb_backend *be, const cc_case *c, float **outs)
{
    const seq_arg *a = c->arg;
    size_t n = (size_t)a->N * a->T * a->B * a->D;
    fb_positional_forward(be, outs[0], a->in, a->pos, a->N, a->T, a->B, a->L, a->D);
    memcpy(outs[1], a->in, n * sizeof(float)); /* in place */
    fb_positional_forward(be, outs[1], outs[1], a->pos, a->N, a->T, a->B, a->L, a->D);
}

static void run_pos_bwd(fb_backend *be, const cc_case *c, float **outs)
{
    const seq_arg *a = c->arg;
    fb_positional_backward(be, a->din ? outs[1] : NULL, outs[0], a->dout, a->N, a->T, a->B, a->L,
                           a->D);
}

/* Attention scratch of the backend, guarded like conv scratch. */
static float *attn_scratch(fb_backend *be, const seq_arg *a, size_t *n)
{
    *n = fb_attention_scratch_floats(be, a->N, a->T, a->B, a->H);
    return *n ? kt_guarded_new(*n) : NULL;
}

static void run_attn_fwd(fb_backend *be, const cc_case *c, float **outs)
{
    const seq_arg *a = c->arg;
    size_t ns;
    float *s = attn_scratch(be, a, &ns);
    fb_attention_forward(be, outs[0], outs[1], a->qkv, a->N, a->T, a->B, a->D, a->H, a->causal, s);
    scratch_done(s, ns, c->name);
}

static void run_attn_bwd(fb_backend *be, const cc_case *c, float **outs)
{
    const seq_arg *a = c->arg;
    size_t ns;
    float *s = attn_scratch(be, a, &ns);
    fb_attention_backward(be, outs[0], a->dout, a->probs, a->qkv, a->N, a->T, a->B, a->D, a->H, s);
    scratch_done(s, ns, c->name);
}

static void run_spool_fwd(fb_backend *be, const cc_case *c, float **outs)
{
    const seq_arg *a = c->arg;
    fb_seq_pool_forward(be, a->kind, outs[0], a->in, a->N, a->T, a->B, a->D);
}

static void run_spool_bwd(fb_backend *be, const cc_case *c, float **outs)
{
    const seq_arg *a = c->arg;
    fb_seq_pool_backward(be, a->kind, outs[0], a->dout, a->N, a->T, a->B, a->D);
}

/* Embedding and positional add over a table of shapes; few distinct ids so
 * that many positions add into the same rows of dtable, which must match the
 * reference exactly. */
static void cases_embed(void)
{
    /* N, T, B, V, D, L */
    static const int cfg[][6] = {{3, 5, 1, 7, 4, 5},     {3, 5, 3, 7, 4, 9},   {2, 1, 2, 3, 5, 1},
                                 {1, 1, 1, 1, 1, 1},     {4, 17, 3, 5, 33, 20},
                                 {16, 64, 4, 256, 40, 64}, {8, 32, 1, 3, 300, 32}};
    for (size_t i = 0; i < sizeof cfg / sizeof cfg[0]; i++) {
        seq_arg a;
        memset(&a, 0, sizeof a);
        a.N = cfg[i][0], a.T = cfg[i][1], a.B = cfg[i][2], a.V = cfg[i][3], a.D = cfg[i][4];
        a.L = cfg[i][5];
        a.din = i % 2 == 0;
        size_t P = (size_t)a.N * a.T, n = P * a.B * a.D, n_tab = (size_t)a.B * a.V * a.D;
        size_t n_pos = (size_t)a.B * a.L * a.D;
        a.ids = malloc(P * sizeof(int32_t));
        CHECK(a.ids != NULL);
        for (size_t p = 0; p < P; p++)
            a.ids[p] = kt_int(a.V);
        a.table = kt_rand(n_tab, -1, 1);
        a.in = kt_rand(n, -1, 1);
        a.pos = kt_rand(n_pos, -1, 1);
        a.dout = kt_rand(n, -1, 1);
        char desc[64];
        snprintf(desc, sizeof desc, "N%d T%d B%d D%d", a.N, a.T, a.B, a.D);
        cc_case c = cc_new(run_emb_fwd, &a, 0.0, "embedding_fwd %s V%d", desc, a.V);
        cc_out(&c, "out", n, OUT_OVERWRITE, NULL);
        cc_run(&c);
        c = cc_new(run_emb_bwd, &a, 0.0, "embedding_bwd %s V%d (exact)", desc, a.V);
        cc_out(&c, "dtable", n_tab, OUT_ACCUM, NULL);
        cc_run(&c);
        c = cc_new(run_pos_fwd, &a, 0.0, "positional_fwd %s L%d (and in place)", desc, a.L);
        cc_out(&c, "out", n, OUT_OVERWRITE, NULL);
        cc_out(&c, "out_inplace", n, OUT_OVERWRITE, NULL);
        cc_run(&c);
        c = cc_new(run_pos_bwd, &a, 1e-6, "positional_bwd %s L%d%s", desc, a.L,
                   a.din ? "" : " nodin");
        cc_out(&c, "dpos", n_pos, OUT_ACCUM, NULL);
        cc_out(&c, "din", n, OUT_ACCUM, NULL);
        cc_run(&c);
        free(a.ids);
        free(a.table);
        free(a.in);
        free(a.pos);
        free(a.dout);
    }
}

/* An id outside [0, V) is FB_ERR_DATA with a message, never a crash, and the
 * output is left as it was, on both backends and in both directions. */
static void check_embed_bad_ids(void)
{
    fb_backend *bes[2] = {g_fast, g_ref};
    const int32_t bad[2][6] = {{0, 1, 2, 5, 1, 0}, {0, -1, 2, 3, 1, 0}};
    float table[2 * 5 * 3], out[6 * 2 * 3], dtab[2 * 5 * 3];
    for (size_t i = 0; i < sizeof table / sizeof table[0]; i++)
        table[i] = (float)i;
    for (int k = 0; k < 2; k++)
        for (int j = 0; j < 2; j++) {
            char msg[128] = "";
            for (size_t i = 0; i < sizeof out / sizeof out[0]; i++)
                out[i] = -7.0f;
            for (size_t i = 0; i < sizeof dtab / sizeof dtab[0]; i++)
                dtab[i] = -7.0f;
            CHECK_INT_EQ(fb_embedding_forward(bes[k], out, bad[j], table, 2, 3, 2, 5, 3, msg,
                                              sizeof msg),
                         FB_ERR_DATA);
            CHECK(strstr(msg, "token id") != NULL);
            CHECK_INT_EQ(fb_embedding_backward(bes[k], dtab, out, bad[j], 2, 3, 2, 5, 3, NULL, 0),
                         FB_ERR_DATA);
            for (size_t i = 0; i < sizeof out / sizeof out[0]; i++)
                CHECK(out[i] == -7.0f);
            for (size_t i = 0; i < sizeof dtab / sizeof dtab[0]; i++)
                CHECK(dtab[i] == -7.0f);
            if (j == 1) printf("  %s: %s\n", fb_backend_name(bes[k]), msg);
        }
    printf("%-64s ok\n", "embedding: ids outside [0, V) are FB_ERR_DATA, output untouched");
}

/* qkv uniform in [-amp, amp); a large amp makes scores whose exp overflows
 * unless the maximum is subtracted. */
static void seq_qkv_init(seq_arg *a, float amp)
{
    size_t n3 = (size_t)a->N * a->T * a->B * 3 * a->D;
    a->qkv = kt_rand(n3, -amp, amp);
    a->dout = kt_rand((size_t)a->N * a->T * a->B * a->D, -1, 1);
    a->probs = malloc((size_t)a->N * a->B * a->H * a->T * a->T * sizeof(float));
    float *tmp = malloc((size_t)a->N * a->T * a->B * a->D * sizeof(float));
    CHECK(a->probs && tmp);
    fb_attention_forward(g_ref, tmp, a->probs, a->qkv, a->N, a->T, a->B, a->D, a->H, a->causal,
                         NULL);
    free(tmp);
}

static void cases_attention(void)
{
    /* N, T, B, D, H, causal, amplitude of qkv */
    static const int cfg[][7] = {
        {2, 1, 1, 4, 1, 1, 2},  {2, 1, 3, 4, 2, 0, 2},  {3, 5, 1, 6, 1, 0, 2},
        {3, 5, 1, 6, 1, 1, 2},  {2, 7, 3, 6, 3, 1, 2},  {2, 7, 3, 6, 3, 0, 2},
        {1, 4, 2, 5, 5, 1, 2},  {3, 9, 2, 10, 2, 0, 2},
        /* scores in the hundreds: expf overflows unless the maximum is subtracted */
        {2, 6, 2, 8, 2, 0, 16}, {2, 6, 2, 8, 2, 1, 16},
        /* large enough to be dealt over threads, odd T */
        {4, 33, 3, 64, 4, 1, 2}, {5, 16, 4, 32, 4, 0, 2}, {2, 64, 2, 128, 4, 1, 2},
    };
    for (size_t i = 0; i < sizeof cfg / sizeof cfg[0]; i++) {
        seq_arg a;
        memset(&a, 0, sizeof a);
        a.N = cfg[i][0], a.T = cfg[i][1], a.B = cfg[i][2], a.D = cfg[i][3], a.H = cfg[i][4];
        a.causal = cfg[i][5] != 0;
        seq_qkv_init(&a, (float)cfg[i][6]);
        size_t n = (size_t)a.N * a.T * a.B * a.D;
        size_t np = (size_t)a.N * a.B * a.H * a.T * a.T;
        char desc[64];
        snprintf(desc, sizeof desc, "N%d T%d B%d D%d H%d %s qkv+-%d", a.N, a.T, a.B, a.D, a.H,
                 a.causal ? "causal" : "full", cfg[i][6]);
        cc_case c = cc_new(run_attn_fwd, &a, 1e-5, "attention_fwd %s", desc);
        cc_out(&c, "out", n, OUT_OVERWRITE, NULL);
        cc_out(&c, "probs", np, OUT_OVERWRITE, NULL);
        cc_run(&c);
        c = cc_new(run_attn_bwd, &a, 1e-5, "attention_bwd %s", desc);
        cc_out(&c, "dqkv", 3 * n, OUT_ACCUM, NULL);
        cc_run(&c);
        free(a.qkv);
        free(a.dout);
        free(a.probs);
    }
}

/* The fast attention gives the same bits on any number of threads (the
 * embedding gradient is checked bit for bit against the reference at every
 * count already). */
static void check_seq_threads(void)
{
    seq_arg a;
    memset(&a, 0, sizeof a);
    a.N = 4, a.T = 33, a.B = 3, a.D = 64, a.H = 4, a.causal = true;
    seq_qkv_init(&a, 2.0f);
    size_t n = (size_t)a.N * a.T * a.B * a.D, np = (size_t)a.N * a.B * a.H * a.T * a.T;
    float *res[2][3];
    static const int threads[2] = {1, 3};
    for (int k = 0; k < 2; k++) {
        fb_backend_set_threads(g_fast, threads[k]);
        res[k][0] = calloc(n, sizeof(float));
        res[k][1] = calloc(np, sizeof(float));
        res[k][2] = calloc(3 * n, sizeof(float));
        CHECK(res[k][0] && res[k][1] && res[k][2]);
        size_t ns = fb_attention_scratch_floats(g_fast, a.N, a.T, a.B, a.H);
        float *s = malloc(ns * sizeof(float));
        CHECK(s != NULL);
        fb_attention_forward(g_fast, res[k][0], res[k][1], a.qkv, a.N, a.T, a.B, a.D, a.H, true, s);
        fb_attention_backward(g_fast, res[k][2], a.dout, res[k][1], a.qkv, a.N, a.T, a.B, a.D, a.H,
                              s);
        free(s);
    }
    CHECK(memcmp(res[0][0], res[1][0], n * sizeof(float)) == 0);
    CHECK(memcmp(res[0][1], res[1][1], np * sizeof(float)) == 0);
    CHECK(memcmp(res[0][2], res[1][2], 3 * n * sizeof(float)) == 0);
    for (int k = 0; k < 2; k++)
        for (int j = 0; j < 3; j++)
            free(res[k][j]);
    free(a.qkv);
    free(a.dout);
    free(a.probs);
    printf("%-64s ok\n", "attention: the same bits on 1 and 3 threads");
}

/* The results of one run on 1 thread and one on 3 are the same bits; frees both. */
static void same_bits_free(float **one, float **three, const size_t *sizes, int n)
{
    for (int j = 0; j < n; j++) {
        CHECK(memcmp(one[j], three[j], sizes[j] * sizeof(float)) == 0);
        free(one[j]);
        free(three[j]);
    }
}

/* The fast layer norm gives the same bits on any number of threads: rows are
 * cut over threads forward, members backward (each walking its rows in
 * order, so dgamma and dbeta are summed alike). */
static void check_layernorm_threads(void)
{
    const int N = 300, B = 3, F = 128;
    const size_t n = (size_t)N * B * F, nr = (size_t)N * B, np = (size_t)B * F;
    float *x = kt_rand(n, -3, 3), *dy = kt_rand(n, -1, 1), *g = kt_rand(np, 0.5f, 1.5f);
    float *bt = kt_rand(np, -1, 1);
    float *res[2][6];
    const size_t sizes[6] = {n, nr, nr, n, np, np};
    static const int threads[2] = {1, 3};
    for (int k = 0; k < 2; k++) {
        fb_backend_set_threads(g_fast, threads[k]);
        for (int j = 0; j < 6; j++) {
            res[k][j] = calloc(sizes[j], sizeof(float));
            CHECK(res[k][j] != NULL);
        }
        fb_layernorm_forward(g_fast, res[k][0], res[k][1], res[k][2], x, g, bt, N, B, F, 1e-5f);
        fb_layernorm_backward(g_fast, res[k][3], res[k][4], res[k][5], dy, x, res[k][1], res[k][2],
                              g, N, B, F);
    }
    same_bits_free(res[0], res[1], sizes, 6);
    free(x);
    free(dy);
    free(g);
    free(bt);
    printf("%-64s ok\n", "layernorm: the same bits on 1 and 3 threads");
}

/* The positional gradient and the sequence pooling give the same bits on any
 * number of threads: each sum (over samples, over positions) is one thread's,
 * in order, whatever the team.  Large enough that 3 threads split them. */
static void check_seqops_threads(void)
{
    const int N = 24, T = 64, B = 3, L = 80, D = 128;
    const size_t n = (size_t)N * T * B * D, np = (size_t)B * L * D, no = (size_t)N * B * D;
    float *dout = kt_rand(n, -1, 1), *pooled = kt_rand(no, -1, 1), *x = kt_rand(n, -2, 2);
    float *res[2][5];
    const size_t sizes[5] = {n, np, no, n, n};
    static const int threads[2] = {1, 3};
    for (int k = 0; k < 2; k++) {
        fb_backend_set_threads(g_fast, threads[k]);
        for (int j = 0; j < 5; j++) {
            res[k][j] = calloc(sizes[j], sizeof(float));
            CHECK(res[k][j] != NULL);
        }
        fb_positional_backward(g_fast, res[k][0], res[k][1], dout, N, T, B, L, D);
        fb_seq_pool_forward(g_fast, FB_SEQ_POOL_MEAN, res[k][2], x, N, T, B, D);
        fb_seq_pool_backward(g_fast, FB_SEQ_POOL_MEAN, res[k][3], pooled, N, T, B, D);
        fb_seq_pool_backward(g_fast, FB_SEQ_POOL_FIRST, res[k][4], pooled, N, T, B, D);
    }
    same_bits_free(res[0], res[1], sizes, 5);
    free(dout);
    free(pooled);
    free(x);
    printf("%-64s ok\n", "positional, seq pool: the same bits on 1 and 3 threads");
}

/* The `_set` forms of the activation and max-pooling gradients write what
 * zeroing din and adding into it leaves, bit for bit, whatever din held
 * before (NaN here), with -0 and NaN among the gradients: on the fast
 * backend (its own forms) and on the reference (zero, then add). */
static void check_set_forms(fb_backend *be, const char *name)
{
    const size_t n = 4099;
    float *x = kt_rand(n, -2, 2), *dy = kt_rand(n, -1, 1), *y = malloc(n * sizeof *y);
    float *acc = malloc(n * sizeof *acc), *set = malloc(n * sizeof *set);
    CHECK(y && acc && set);
    for (size_t i = 0; i < n; i += 7)
        dy[i] = -0.0f;
    dy[5] = NAN;
    x[11] = 0.0f;
    for (fb_act act = FB_ACT_RELU; act <= FB_ACT_SIGMOID; act++) {
        fb_act_forward(be, act, y, x, n);
        const bool uses_out = act == FB_ACT_TANH || act == FB_ACT_SIGMOID;
        memset(acc, 0, n * sizeof *acc);
        fb_act_backward(be, act, acc, dy, uses_out ? NULL : x, uses_out ? y : NULL, n);
        for (size_t i = 0; i < n; i++)
            set[i] = NAN;
        fb_act_backward_set(be, act, set, dy, uses_out ? NULL : x, uses_out ? y : NULL, n);
        CHECK(memcmp(acc, set, n * sizeof *acc) == 0);
    }
    /* 2x2 windows over even and odd planes (a row and a column past the last
     * window), rows of three windows, of four and a tail, of one and two
     * blocks of eight and a tail, and overlapping padded 3x3 windows of
     * stride 2 */
    static const int geo[][6] = {{6, 8, 2, 2, 0, 0},   {7, 9, 2, 2, 0, 0},   {14, 14, 2, 2, 0, 0},
                                 {6, 6, 2, 2, 0, 0},   {28, 28, 2, 2, 0, 0}, {16, 34, 2, 2, 0, 0},
                                 {9, 35, 2, 2, 0, 0},  {7, 9, 3, 2, 1, 1}};
    for (size_t k = 0; k < sizeof geo / sizeof geo[0]; k++) {
        fb_pool_geom g = {.N = 3, .BC = 5, .H = geo[k][0], .W = geo[k][1], .kh = geo[k][2],
                          .kw = geo[k][2], .sh = geo[k][3], .sw = geo[k][3], .ph = geo[k][4],
                          .pw = geo[k][4]};
        fb_pool_geom_finish(&g);
        const size_t ni = (size_t)g.N * g.BC * g.H * g.W, no = (size_t)g.N * g.BC * g.Ho * g.Wo;
        float *in = kt_rand(ni, -1, 1), *out = malloc(no * sizeof *out);
        float *a = calloc(ni, sizeof *a), *b = malloc(ni * sizeof *b);
        int32_t *am = malloc(no * sizeof *am);
        CHECK(out && a && b && am);
        for (size_t i = 0; i < ni; i++)
            b[i] = NAN;
        fb_maxpool2d_forward(be, out, am, in, &g);
        fb_maxpool2d_backward(be, a, dy, am, &g);
        fb_maxpool2d_backward_set(be, b, dy, am, &g);
        CHECK(memcmp(a, b, ni * sizeof *a) == 0);
        free(in);
        free(out);
        free(a);
        free(b);
        free(am);
    }
    free(x);
    free(dy);
    free(y);
    free(acc);
    free(set);
    printf("%-64s ok\n", name);
}

/* A convolution's forward and backward on g_fast at `threads` threads, the
 * fast CPU kernels portable or not: res [out, dw, dbias, din] (din untouched
 * when shared), allocated here. */
static void conv_both(float *res[4], const size_t sizes[4], const fb_conv_geom *g, int threads,
                      bool portable, const float *in, const float *w, const float *bias,
                      const float *dout)
{
    fb_backend_set_threads(g_fast, threads);
    fb_cpu_kernels_portable(portable);
    for (int j = 0; j < 4; j++) {
        res[j] = calloc(sizes[j], sizeof(float));
        CHECK(res[j] != NULL);
    }
    size_t ns;
    float *sc = scratch_for(g_fast, g, &ns);
    fb_conv2d_forward(g_fast, res[0], in, w, bias, g, sc);
    fb_conv2d_backward(g_fast, g->shared ? NULL : res[3], res[1], res[2], dout, in, w, g, sc);
    scratch_done(sc, ns, "conv bits");
    fb_cpu_kernels_portable(false);
}

/* conv_both in two settings (threads, portable) gives the same bits, for each
 * geometry {N B C H W K kh kw ph pw shared}. */
static void conv_same_bits(const int (*cfg)[11], size_t n_cfg, const int threads[2],
                           const bool portable[2])
{
    for (size_t i = 0; i < n_cfg; i++) {
        const int *q = cfg[i];
        fb_conv_geom g = {.N = q[0], .B = q[1], .C = q[2], .H = q[3], .W = q[4], .K = q[5],
                          .kh = q[6], .kw = q[7], .sh = 1, .sw = 1, .ph = q[8], .pw = q[9],
                          .shared = q[10]};
        fb_conv_geom_finish(&g);
        const size_t ni = (size_t)g.N * (g.shared ? 1 : g.B) * g.C * g.H * g.W;
        const size_t nw = (size_t)g.B * g.K * g.C * g.kh * g.kw, nb = (size_t)g.B * g.K;
        const size_t no = (size_t)g.N * g.B * g.K * g.Ho * g.Wo;
        float *in = kt_rand(ni, -1, 1), *w = kt_rand(nw, -0.5f, 0.5f), *bias = kt_rand(nb, -1, 1);
        float *dout = kt_rand(no, -1, 1);
        float *res[2][4];
        const size_t sizes[4] = {no, nw, nb, ni};
        for (int k = 0; k < 2; k++)
            conv_both(res[k], sizes, &g, threads[k], portable[k], in, w, bias, dout);
        same_bits_free(res[0], res[1], sizes, 4);
        free(in);
        free(w);
        free(bias);
        free(dout);
    }
}

/* The fast convolution's gradients are the same bits on 1 and 3 threads: the
 * weight and bias gradients are summed in fixed chunks of samples, whatever
 * the team (three chunks here, the last short), the input gradient per
 * sample; shared and not, on the grid and unfolded (pointwise). */
static void check_conv_threads(void)
{
    static const int cfg[][11] = {{40, 3, 8, 14, 14, 16, 3, 3, 1, 1, 0},
                                  {37, 4, 1, 28, 28, 8, 3, 3, 1, 1, 1},
                                  {33, 2, 16, 9, 9, 32, 1, 1, 0, 0, 0}};
    conv_same_bits(cfg, sizeof cfg / sizeof cfg[0], (const int[2]){1, 3},
                   (const bool[2]){false, false});
    printf("%-64s ok\n", "conv2d: the same bits on 1 and 3 threads");
}

/* The stride-1 convolutions' own kernels (AVX2 where the CPU has it) give the
 * bits of their portable loops: each sum is the same fused multiply-adds in
 * the same order.  Rows and taps that fill no whole block (K, C not multiples
 * of 4), grids that end in a short tile, the output gradient padded as the
 * grid and not, shared, one and two threads. */
static void check_conv_portable(void)
{
    static const int cfg[][11] = {
        {18, 2, 3, 14, 14, 7, 3, 3, 1, 1, 0}, {17, 3, 1, 28, 28, 16, 3, 3, 1, 1, 1},
        {5, 2, 5, 9, 6, 6, 5, 3, 2, 1, 0},    {4, 2, 3, 5, 5, 5, 1, 3, 0, 1, 0},
        {3, 3, 2, 7, 7, 2, 4, 4, 0, 0, 0},    {6, 1, 16, 14, 14, 32, 3, 3, 1, 1, 0},
        {3, 2, 2, 3, 3, 3, 5, 5, 2, 2, 0},
    };
    for (int t = 1; t <= 2; t++)
        conv_same_bits(cfg, sizeof cfg / sizeof cfg[0], (const int[2]){t, t},
                       (const bool[2]){false, true});
    printf("%-64s ok\n", "conv2d: the own kernels give the portable loops' bits");
}

static void cases_seq_pool(void)
{
    static const int cfg[][4] = {{3, 1, 1, 5}, {3, 7, 3, 5}, {2, 33, 2, 300}, {16, 64, 4, 128}};
    static const char *names[] = {"mean", "first"};
    for (size_t i = 0; i < sizeof cfg / sizeof cfg[0]; i++)
        for (int kind = FB_SEQ_POOL_MEAN; kind <= FB_SEQ_POOL_FIRST; kind++) {
            seq_arg a;
            memset(&a, 0, sizeof a);
            a.N = cfg[i][0], a.T = cfg[i][1], a.B = cfg[i][2], a.D = cfg[i][3];
            a.kind = (fb_seq_pool)kind;
            size_t n = (size_t)a.N * a.T * a.B * a.D, no = (size_t)a.N * a.B * a.D;
            a.in = kt_rand(n, -1, 1);
            a.dout = kt_rand(no, -1, 1);
            cc_case c = cc_new(run_spool_fwd, &a, 1e-6, "seq_pool_fwd %s N%d T%d B%d D%d",
                               names[kind], a.N, a.T, a.B, a.D);
            cc_out(&c, "out", no, OUT_OVERWRITE, NULL);
            cc_run(&c);
            c = cc_new(run_spool_bwd, &a, 1e-6, "seq_pool_bwd %s N%d T%d B%d D%d", names[kind], a.N,
                       a.T, a.B, a.D);
            cc_out(&c, "din", n, OUT_ACCUM, NULL);
            cc_run(&c);
            free(a.in);
            free(a.dout);
        }
}

/* ---- losses ---- */

typedef struct {
    int N, B, K;
    bool grads;
    float *logits, *target;
    int32_t *labels;
} loss_arg;

static void run_xent(fb_backend *be, const cc_case *c, float **outs)
{
    const loss_arg *a = c->arg;
    fb_softmax_xent(be, outs[0], a->grads ? outs[1] : NULL, a->grads ? outs[2] : NULL, a->logits,
                    a->labels, a->N, a->B, a->K, 1.0f / (float)a->N);
}

static void run_mse(fb_backend *be, const cc_case *c, float **outs)
{
    const loss_arg *a = c->arg;
    fb_mse(be, outs[0], a->grads ? outs[1] : NULL, a->logits, a->target, a->N, a->B, a->K,
           1.0f / (float)a->N);
}

static void cases_loss(void)
{
    /* the last two: rows longer than the fast path's chunk of 256, and enough
     * work for members on threads, with and without dlogits */
    static const int cfg[][4] = {{8, 1, 10, 1}, {8, 3, 10, 1},   {5, 3, 1, 1},
                                 {13, 2, 7, 0}, {40, 3, 300, 1}, {40, 3, 300, 0}};
    for (size_t i = 0; i < sizeof cfg / sizeof cfg[0]; i++) {
        loss_arg a = {cfg[i][0], cfg[i][1], cfg[i][2], cfg[i][3] != 0, NULL, NULL, NULL};
        size_t n = (size_t)a.N * a.B * a.K;
        a.logits = kt_rand(n, -8, 8);
        a.logits[0] = 50.0f; /* large logits exercise the max shift */
        a.target = kt_rand((size_t)a.N * a.K, -1, 1);
        a.labels = malloc(a.N * sizeof(int32_t));
        CHECK(a.labels != NULL);
        for (int j = 0; j < a.N; j++)
            a.labels[j] = kt_int(a.K);
        cc_case c = cc_new(run_xent, &a, 1e-5, "softmax_xent N%d B%d K%d%s", a.N, a.B, a.K,
                           a.grads ? "" : " loss only");
        cc_out(&c, "loss", a.B, OUT_OVERWRITE, NULL);
        if (a.grads) {
            cc_out(&c, "dlogits", n, OUT_OVERWRITE, NULL);
            cc_out(&c, "correct", a.B, OUT_OVERWRITE, NULL);
        }
        cc_run(&c);
        c = cc_new(run_mse, &a, 1e-5, "mse N%d B%d K%d%s", a.N, a.B, a.K,
                   a.grads ? "" : " loss only");
        cc_out(&c, "loss", a.B, OUT_OVERWRITE, NULL);
        if (a.grads) cc_out(&c, "dpred", n, OUT_OVERWRITE, NULL);
        cc_run(&c);
        free(a.logits);
        free(a.target);
        free(a.labels);
    }
}

/* ---- optimizers ---- */

typedef struct {
    fb_optim_kind kind;
    int B, n_blocks;
    fb_param_block blocks[3];
    fb_optim_hparams hp[4];
    size_t total;
    float *grads;
} optim_arg;

static void run_optim(fb_backend *be, const cc_case *c, float **outs)
{
    const optim_arg *a = c->arg;
    fb_optim_step(be, a->kind, outs[0], a->grads, outs[1],
                  a->kind == FB_OPTIM_KIND_SGD ? NULL : outs[2], a->blocks, a->n_blocks, a->B,
                  a->hp);
}

static void cases_optim_sizes(const size_t sizes[3], bool big);

/* Small blocks, and blocks large enough to be cut into pieces over threads. */
static void cases_optim(void)
{
    static const size_t small[3] = {7, 33, 1}, large[3] = {70001, 33, 9000};
    cases_optim_sizes(small, false);
    cases_optim_sizes(large, true);
}

static void cases_optim_sizes(const size_t sizes[3], bool big)
{
    static const char *names[] = {"sgd", "adam", "adamw"};
    for (int kind = FB_OPTIM_KIND_SGD; kind <= FB_OPTIM_KIND_ADAMW; kind++)
        for (int t = 1; t <= 3; t += 2) {
            optim_arg a;
            memset(&a, 0, sizeof a);
            a.kind = (fb_optim_kind)kind;
            a.B = 4;
            a.n_blocks = 3;
            /* blocks with gaps between them; the gaps must stay untouched */
            size_t per[3] = {sizes[0], sizes[1], sizes[2]}, off = 3;
            for (int k = 0; k < 3; k++) {
                a.blocks[k] = (fb_param_block){off, per[k]};
                off += per[k] * a.B + 2;
            }
            a.total = off;
            for (int b = 0; b < a.B; b++) {
                fb_optim_hparams *h = &a.hp[b];
                h->lr = 0.01f * (float)(b + 1);
                h->weight_decay = b == 1 ? 0.0f : 0.05f * b;
                h->momentum = b == 0 ? 0.0f : 0.9f;
                h->dampening = b == 3 ? 0.1f : 0.0f;
                h->nesterov = b == 3;
                h->beta1 = 0.9f - 0.05f * b;
                h->beta2 = 0.999f - 0.002f * b;
                h->eps = 1e-8f * (float)(b + 1);
                h->t = t + b;
            }
            a.hp[2].lr = 0.0f; /* an empty slot */
            a.hp[2].t = 0;
            a.grads = kt_rand(a.total, -1, 1);
            float *v = kt_rand(a.total, 0, 0.01f);
            cc_case c = cc_new(run_optim, &a, 1e-6, "optim %s B%d t%d.. %s(one slot empty)",
                               names[kind], a.B, t, big ? "large " : "");
            cc_out(&c, "params", a.total, OUT_ACCUM, NULL);
            cc_out(&c, "state1", a.total, OUT_ACCUM, NULL);
            cc_out(&c, "state2", a.total, OUT_ACCUM, v);
            cc_run(&c);
            free(v);
            free(a.grads);
        }
}

/* ---- GEMM ---- */

typedef struct {
    int M, N, K;
    float *a, *b;
} gemm_arg;

static void run_sgemm(fb_backend *be, const cc_case *c, float **outs)
{
    const gemm_arg *a = c->arg;
    fb_sgemm(be, outs[0], a->a, a->b, a->M, a->N, a->K);
}

static void cases_gemm(void)
{
    static const int cfg[][3] = {{1, 1, 1}, {7, 5, 3}, {33, 17, 65}, {64, 64, 64}};
    for (size_t i = 0; i < sizeof cfg / sizeof cfg[0]; i++) {
        gemm_arg a = {cfg[i][0], cfg[i][1], cfg[i][2], NULL, NULL};
        a.a = kt_rand((size_t)a.M * a.K, -1, 1);
        a.b = kt_rand((size_t)a.K * a.N, -1, 1);
        cc_case c = cc_new(run_sgemm, &a, 1e-5, "sgemm %dx%dx%d", a.M, a.N, a.K);
        cc_out(&c, "c", (size_t)a.M * a.N, OUT_OVERWRITE, NULL);
        cc_run(&c);
        free(a.a);
        free(a.b);
    }
}

/* ---- backend handles and memory ---- */

static void check_backends(void)
{
    CHECK_STR_EQ(fb_backend_name(g_fast), "cpu");
    CHECK_STR_EQ(fb_backend_name(g_ref), "cpu-ref");
    for (int op = 0; op < FB_OP_COUNT; op++) {
        CHECK(fb_backend_supports(g_fast, (fb_op)op));
        CHECK(fb_backend_supports(g_ref, (fb_op)op));
    }
    CHECK(!fb_backend_supports(g_fast, FB_OP_COUNT));
#ifndef FB_HAVE_CUDA
    CHECK(fb_backend_cuda(0) == NULL);
#endif
    fb_backend *bes[2] = {g_fast, g_ref};
    for (int k = 0; k < 2; k++) {
        fb_backend *be = bes[k];
        float host[37], back[37];
        for (int i = 0; i < 37; i++)
            host[i] = (float)i - 3.5f;
        float *p = fb_backend_alloc(be, sizeof host), *q = fb_backend_alloc(be, sizeof host);
        CHECK(p && q);
        CHECK(((uintptr_t)p % 64) == 0);
        for (int i = 0; i < 37; i++)
            CHECK(p[i] == 0.0f);
        fb_backend_upload(be, p, host, sizeof host);
        fb_backend_copy(be, q, p, sizeof host);
        fb_backend_download(be, back, q, sizeof host);
        CHECK(memcmp(host, back, sizeof host) == 0);
        fb_backend_zero(be, q, sizeof host);
        fb_backend_download(be, back, q, sizeof host);
        for (int i = 0; i < 37; i++)
            CHECK(back[i] == 0.0f);
        fb_backend_sync(be);
        fb_backend_free(be, p);
        fb_backend_free(be, q);
        fb_backend_free(be, NULL);
    }
    printf("%-64s ok\n", "backends: names, supports, memory");
}

/* Zeroing large enough to be cut over threads: every byte, and only those. */
static void check_big_zero(void)
{
    const size_t n = (3u << 20) + 37; /* floats: over the per-thread grain, not a round size */
    float *p = fb_backend_alloc(g_fast, (n + 2) * sizeof(float));
    CHECK(p != NULL);
    for (size_t i = 0; i < n + 2; i++)
        p[i] = 1.0f;
    fb_backend_zero(g_fast, p + 1, n * sizeof(float));
    CHECK(p[0] == 1.0f && p[n + 1] == 1.0f);
    for (size_t i = 1; i <= n; i++)
        CHECK(p[i] == 0.0f);
    fb_backend_free(g_fast, p);
    printf("%-64s ok\n", "zero: a large range, cut over threads");
}

int main(void)
{
    g_fast = fb_backend_cpu();
    g_ref = fb_backend_cpu_ref();
    CHECK(g_fast != NULL && g_ref != NULL);
    check_backends();
    check_embed_bad_ids();
    check_seq_threads();
    check_layernorm_threads();
    check_seqops_threads();
    check_conv_threads();
    check_conv_portable();
    check_set_forms(g_ref, "set forms (reference): zero and add, bit for bit");
    for (int t = 1; t <= 3; t += 2) {
        fb_backend_set_threads(g_fast, t);
        check_set_forms(g_fast, t == 1 ? "set forms (fast, 1 thread): zero and add, bit for bit"
                                       : "set forms (fast, 3 threads): zero and add, bit for bit");
    }
    /* the pooling written for AVX2 has portable loops too: the same results */
    fb_backend_set_threads(g_fast, 1);
    fb_cpu_kernels_portable(true);
    check_set_forms(g_fast, "set forms (fast, portable loops): zero and add, bit for bit");
    printf("-- fast backend's portable loops\n");
    cases_pool();
    fb_cpu_kernels_portable(false);
    /* one thread, and three (more than this machine's cores, and an odd count,
     * so that work is cut unevenly) for the fast backend's threaded paths */
    static const int threads[] = {1, 3};
    for (size_t t = 0; t < sizeof threads / sizeof threads[0]; t++) {
        fb_backend_set_threads(g_fast, threads[t]);
        printf("-- fast backend on %d thread(s)\n", threads[t]);
        check_big_zero();
        cases_linear();
        cases_conv();
        cases_pool();
        cases_eltwise();
        cases_dropout();
        cases_norm();
        cases_embed();
        cases_attention();
        cases_seq_pool();
        cases_loss();
        cases_optim();
        cases_gemm();
    }
    printf("%d cases, %d failed\n", g_cases, g_failures);
    CHECK_INT_EQ(g_failures, 0);
    return 0;
}
