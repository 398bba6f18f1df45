/*
 * Finite-difference check of every op's backward against its own forward, on
 * both CPU backends, unfused (B = 1) and fused (B = 3).
 *
 * The scalar objective is a random projection of the output, L = sum r_i
 * out_i (summed in double), so dout = r; for the losses it is the sum of the
 * per-member losses and the gradient is dlogits / dpred with grad_scale =
 * 1/N.  Each input element is moved by +-h and the central difference
 * (L(x + h) - L(x - h)) / 2h is compared with the analytic gradient by
 * normalised error max|num - ana| / max(1, max|ana|).  Backward ops
 * accumulate, so their gradient buffers start from random values that are
 * subtracted afterwards; loss gradients are overwritten and start as NaN.
 * Inputs of kinked ops (relu, max pooling) are kept away from their kinks.
 */
#include "kt_util.h"

#define GC_MAX_P 4
#define GC_H 1e-3f
#define GC_TOL 2e-3

typedef struct gc gc;
struct gc {
    char name[96];
    fb_backend *be;
    int n_p;
    struct {
        const char *name;
        float *x; /* the input, perturbed in place */
        size_t n;
        float *grad; /* analytic gradient buffer */
    } p[GC_MAX_P];
    size_t n_out;
    bool loss; /* objective = sum of outputs; gradients overwritten */
    void (*fwd)(gc *g, float *out);
    void (*bwd)(gc *g, const float *dout);
    const void *arg;
};

static int g_failures, g_problems;

static void gc_param(gc *g, const char *name, float *x, size_t n)
{
    CHECK(g->n_p < GC_MAX_P);
    g->p[g->n_p].name = name;
    g->p[g->n_p].x = x;
    g->p[g->n_p].n = n;
    g->p[g->n_p].grad = kt_guarded_new(n);
    g->n_p++;
}

static double gc_objective(gc *g, float *out, const float *r)
{
    g->fwd(g, out);
    double L = 0.0;
    for (size_t i = 0; i < g->n_out; i++)
        L += (double)r[i] * out[i];
    return L;
}

/* Runs the check for every parameter, prints one line per parameter. */
static void gc_run(gc *g)
{
    float *r = kt_rand(g->n_out, -1, 1);
    float *out = kt_guarded_new(g->n_out);
    float *init[GC_MAX_P];
    if (g->loss)
        for (size_t i = 0; i < g->n_out; i++)
            r[i] = 1.0f;
    for (int k = 0; k < g->n_p; k++) {
        init[k] = kt_rand(g->p[k].n, -1, 1);
        for (size_t i = 0; i < g->p[k].n; i++)
            g->p[k].grad[i] = g->loss ? NAN : init[k][i];
    }
    g->bwd(g, r);
    for (int k = 0; k < g->n_p; k++) {
        CHECK(kt_guarded_ok(g->p[k].grad, g->p[k].n));
        if (!g->loss)
            for (size_t i = 0; i < g->p[k].n; i++)
                g->p[k].grad[i] -= init[k][i];
    }
    for (int k = 0; k < g->n_p; k++) {
        float *x = g->p[k].x;
        const float *ana = g->p[k].grad;
        double md = 0.0, ma = 1.0;
        for (size_t i = 0; i < g->p[k].n; i++) {
            float saved = x[i];
            x[i] = saved + GC_H;
            double hp = (double)x[i] - saved;
            double Lp = gc_objective(g, out, r);
            x[i] = saved - GC_H;
            double hm = saved - (double)x[i];
            double Lm = gc_objective(g, out, r);
            x[i] = saved;
            double num = (Lp - Lm) / (hp + hm);
            double d = fabs(num - ana[i]);
            if (!(d <= md)) /* NaN propagates into md */
                md = d;
            if (fabs(ana[i]) > ma) ma = fabs(ana[i]);
        }
        CHECK(kt_guarded_ok(out, g->n_out));
        double e = md / ma;
        bool ok = e <= GC_TOL;
        printf("%-56s %-8s d%-6s err %.2e %s\n", g->name, fb_backend_name(g->be), g->p[k].name, e,
               ok ? "ok" : "FAIL");
        g_failures += !ok;
        g_problems++;
        free(init[k]);
        kt_guarded_free(g->p[k].grad);
    }
    free(r);
    kt_guarded_free(out);
}

static fb_backend *backends[2];

/* ---- linear ---- */

typedef struct {
    int N, B, I, O;
    bool shared;
} lin_arg;

static void lin_fwd(gc *g, float *out)
{
    const lin_arg *a = g->arg;
    fb_linear_forward(g->be, out, g->p[0].x, g->p[1].x, g->p[2].x, a->N, a->B, a->I, a->O,
                      a->shared);
}

static void lin_bwd(gc *g, const float *dout)
{
    const lin_arg *a = g->arg;
    fb_linear_backward(g->be, g->p[0].grad, g->p[1].grad, g->p[2].grad, dout, g->p[0].x, g->p[1].x,
                       a->N, a->B, a->I, a->O, a->shared);
}

static void check_linear(fb_backend *be, int B, bool shared)
{
    lin_arg a = {4, B, 5, 3, shared};
    int Bi = shared ? 1 : B;
    float *in = kt_rand((size_t)a.N * Bi * a.I, -1, 1), *w = kt_rand((size_t)B * a.O * a.I, -1, 1);
    float *bias = kt_rand((size_t)B * a.O, -1, 1);
    gc g = {.be = be, .n_out = (size_t)a.N * B * a.O, .fwd = lin_fwd, .bwd = lin_bwd, .arg = &a};
    snprintf(g.name, sizeof g.name, "linear B%d %s", B, shared ? "shared" : "fused");
    gc_param(&g, "in", in, (size_t)a.N * Bi * a.I);
    gc_param(&g, "w", w, (size_t)B * a.O * a.I);
    gc_param(&g, "bias", bias, (size_t)B * a.O);
    gc_run(&g);
    free(in);
    free(w);
    free(bias);
}

/* ---- conv2d ---- */

typedef struct {
    fb_conv_geom geo;
    float *in; /* the shared input, which is data, not a parameter */
} conv_arg;

/* Not shared: p = {in, w, bias}; shared: p = {w, bias} and the input in arg. */
static void conv_fwd(gc *g, float *out)
{
    const conv_arg *a = g->arg;
    size_t ns = fb_conv2d_scratch_floats(g->be, &a->geo);
    float *s = ns ? malloc(ns * sizeof(float)) : NULL;
    int w = a->geo.shared ? 0 : 1;
    fb_conv2d_forward(g->be, out, a->geo.shared ? a->in : g->p[0].x, g->p[w].x, g->p[w + 1].x,
                      &a->geo, s);
    free(s);
}

static void conv_bwd(gc *g, const float *dout)
{
    const conv_arg *a = g->arg;
    size_t ns = fb_conv2d_scratch_floats(g->be, &a->geo);
    float *s = ns ? malloc(ns * sizeof(float)) : NULL;
    int w = a->geo.shared ? 0 : 1;
    fb_conv2d_backward(g->be, a->geo.shared ? NULL : g->p[0].grad, g->p[w].grad, g->p[w + 1].grad,
                       dout, a->geo.shared ? a->in : g->p[0].x, g->p[w].x, &a->geo, s);
    free(s);
}

static void check_conv(fb_backend *be, int B, bool shared, int k, int s, int pad)
{
    conv_arg a = {{.N = 2,
                   .B = B,
                   .C = 2,
                   .H = 5,
                   .W = 6,
                   .K = 2,
                   .kh = k,
                   .kw = k,
                   .sh = s,
                   .sw = s,
                   .ph = pad,
                   .pw = pad,
                   .shared = shared},
                  NULL};
    fb_conv_geom *geo = &a.geo;
    fb_conv_geom_finish(geo);
    int Bi = shared ? 1 : B;
    size_t n_in = (size_t)geo->N * Bi * geo->C * geo->H * geo->W;
    size_t n_w = (size_t)B * geo->K * geo->C * k * k;
    float *in = kt_rand(n_in, -1, 1), *w = kt_rand(n_w, -1, 1);
    float *bias = kt_rand((size_t)B * geo->K, -1, 1);
    gc g = {.be = be,
            .n_out = (size_t)geo->N * B * geo->K * geo->Ho * geo->Wo,
            .fwd = conv_fwd,
            .bwd = conv_bwd,
            .arg = &a};
    snprintf(g.name, sizeof g.name, "conv2d B%d %s k%d s%d p%d", B, shared ? "shared" : "fused", k,
             s, pad);
    if (shared)
        a.in = in;
    else
        gc_param(&g, "in", in, n_in);
    gc_param(&g, "w", w, n_w);
    gc_param(&g, "bias", bias, (size_t)B * geo->K);
    gc_run(&g);
    free(in);
    free(w);
    free(bias);
}

/* ---- pooling ---- */

/* n distinct values spaced 2/n apart in random order: no ties, no kinks
 * within +-h for n below ~1000. */
static float *distinct_values(size_t n)
{
    float *x = malloc(n * sizeof(float));
    CHECK(x != NULL);
    for (size_t i = 0; i < n; i++)
        x[i] = -1.0f + 2.0f * (float)i / (float)n;
    for (size_t i = n; i > 1; i--) {
        size_t j = (size_t)kt_int((int)i);
        float t = x[i - 1];
        x[i - 1] = x[j];
        x[j] = t;
    }
    return x;
}

typedef struct {
    fb_pool_geom g;
    int kind; /* 0 max, 1 avg, 2 global */
} pool_arg;

static void pool_fwd(gc *g, float *out)
{
    const pool_arg *a = g->arg;
    if (a->kind == 0) {
        int32_t *am = malloc(g->n_out * sizeof(int32_t));
        CHECK(am != NULL);
        fb_maxpool2d_forward(g->be, out, am, g->p[0].x, &a->g);
        free(am);
    } else if (a->kind == 1) {
        fb_avgpool2d_forward(g->be, out, g->p[0].x, &a->g);
    } else {
        fb_global_avgpool_forward(g->be, out, g->p[0].x, a->g.N, a->g.BC, a->g.H * a->g.W);
    }
}

static void pool_bwd(gc *g, const float *dout)
{
    const pool_arg *a = g->arg;
    if (a->kind == 0) {
        int32_t *am = malloc(g->n_out * sizeof(int32_t));
        float *out = malloc(g->n_out * sizeof(float));
        CHECK(am && out);
        fb_maxpool2d_forward(g->be, out, am, g->p[0].x, &a->g);
        fb_maxpool2d_backward(g->be, g->p[0].grad, dout, am, &a->g);
        free(am);
        free(out);
    } else if (a->kind == 1) {
        fb_avgpool2d_backward(g->be, g->p[0].grad, dout, &a->g);
    } else {
        fb_global_avgpool_backward(g->be, g->p[0].grad, dout, a->g.N, a->g.BC, a->g.H * a->g.W);
    }
}

static void check_pool(fb_backend *be, int B, int kind, int k, int s, int pad)
{
    static const char *names[] = {"maxpool2d", "avgpool2d", "global_avgpool"};
    pool_arg a = {{.N = 2,
                   .BC = 2 * B,
                   .H = 5,
                   .W = 6,
                   .kh = k,
                   .kw = k,
                   .sh = s,
                   .sw = s,
                   .ph = pad,
                   .pw = pad},
                  kind};
    fb_pool_geom_finish(&a.g);
    size_t n_in = (size_t)a.g.N * a.g.BC * a.g.H * a.g.W;
    float *in = distinct_values(n_in);
    gc g = {.be = be, .fwd = pool_fwd, .bwd = pool_bwd, .arg = &a};
    g.n_out = kind == 2 ? (size_t)a.g.N * a.g.BC : (size_t)a.g.N * a.g.BC * a.g.Ho * a.g.Wo;
    if (kind == 2)
        snprintf(g.name, sizeof g.name, "%s B%d", names[kind], B);
    else
        snprintf(g.name, sizeof g.name, "%s B%d k%d s%d p%d", names[kind], B, k, s, pad);
    gc_param(&g, "in", in, n_in);
    gc_run(&g);
    free(in);
}

/* ---- activations, add, dropout ---- */

typedef struct {
    fb_act act;
    size_t n;
} act_arg;

static void act_fwd(gc *g, float *out)
{
    const act_arg *a = g->arg;
    fb_act_forward(g->be, a->act, out, g->p[0].x, a->n);
}

static void act_bwd(gc *g, const float *dout)
{
    const act_arg *a = g->arg;
    float *out = malloc(a->n * sizeof(float));
    CHECK(out != NULL);
    fb_act_forward(g->be, a->act, out, g->p[0].x, a->n);
    fb_act_backward(g->be, a->act, g->p[0].grad, dout, g->p[0].x, out, a->n);
    free(out);
}

static void check_act(fb_backend *be, int B, fb_act act)
{
    static const char *names[] = {"relu", "gelu", "gelu_tanh", "tanh", "sigmoid"};
    act_arg a = {act, (size_t)3 * B * 7};
    float *in = kt_rand(a.n, -3, 3);
    for (size_t i = 0; i < a.n; i++)
        if (fabsf(in[i]) < 0.05f) in[i] = in[i] < 0 ? -0.05f : 0.05f;
    gc g = {.be = be, .n_out = a.n, .fwd = act_fwd, .bwd = act_bwd, .arg = &a};
    snprintf(g.name, sizeof g.name, "act %s [3, %d, 7]", names[act], B);
    gc_param(&g, "in", in, a.n);
    gc_run(&g);
    free(in);
}

static void add_fwd(gc *g, float *out)
{
    fb_add_forward(g->be, out, g->p[0].x, g->p[1].x, g->n_out);
}

static void add_bwd(gc *g, const float *dout)
{
    fb_accumulate(g->be, g->p[0].grad, dout, g->n_out);
    fb_accumulate(g->be, g->p[1].grad, dout, g->n_out);
}

static void check_add(fb_backend *be, int B)
{
    size_t n = (size_t)4 * B * 5;
    float *a = kt_rand(n, -1, 1), *b = kt_rand(n, -1, 1);
    gc g = {.be = be, .n_out = n, .fwd = add_fwd, .bwd = add_bwd};
    snprintf(g.name, sizeof g.name, "add (+ accumulate) [4, %d, 5]", B);
    gc_param(&g, "a", a, n);
    gc_param(&g, "b", b, n);
    gc_run(&g);
    free(a);
    free(b);
}

typedef struct {
    int N, B, F;
    float p;
    uint64_t seeds[3];
} drop_arg;

static void drop_fwd(gc *g, float *out)
{
    const drop_arg *a = g->arg;
    fb_dropout_forward(g->be, out, g->p[0].x, a->seeds, 5, a->p, a->N, a->B, a->F, 3);
}

static void drop_bwd(gc *g, const float *dout)
{
    const drop_arg *a = g->arg;
    fb_dropout_backward(g->be, g->p[0].grad, dout, a->seeds, 5, a->p, a->N, a->B, a->F, 3);
}

static void check_dropout(fb_backend *be, int B)
{
    drop_arg a = {4, B, 6, 0.3f, {101, 202, 303}};
    size_t n = (size_t)a.N * B * a.F;
    float *in = kt_rand(n, -1, 1);
    gc g = {.be = be, .n_out = n, .fwd = drop_fwd, .bwd = drop_bwd, .arg = &a};
    snprintf(g.name, sizeof g.name, "dropout p0.3 [4, %d, 6]", B);
    gc_param(&g, "in", in, n);
    gc_run(&g);

    /* Exactly: din = dout * mask * scale, mask * scale = forward of ones. */
    float *ones = malloc(n * sizeof(float)), *ms = malloc(n * sizeof(float));
    float *dout = kt_rand(n, -1, 1), *din = calloc(n, sizeof(float));
    CHECK(ones && ms && din);
    for (size_t i = 0; i < n; i++)
        ones[i] = 1.0f;
    fb_dropout_forward(be, ms, ones, a.seeds, 5, a.p, a.N, a.B, a.F, 3);
    fb_dropout_backward(be, din, dout, a.seeds, 5, a.p, a.N, a.B, a.F, 3);
    const float scale = 1.0f / (1.0f - a.p);
    for (size_t i = 0; i < n; i++) {
        CHECK(ms[i] == 0.0f || ms[i] == scale);
        CHECK(din[i] == dout[i] * ms[i]);
    }
    printf("%-56s %-8s din == dout * mask * scale ok\n", g.name, fb_backend_name(be));
    free(ones);
    free(ms);
    free(dout);
    free(din);
    free(in);
}

/* ---- normalisation ---- */

typedef struct {
    int N, C, HW; /* batchnorm: C = BC; layernorm: C = B, HW = F */
} norm_arg;

static void bn_fwd(gc *g, float *out)
{
    const norm_arg *a = g->arg;
    float *st = malloc(4 * (size_t)a->C * sizeof(float));
    CHECK(st != NULL);
    fb_batchnorm_forward_train(g->be, out, st, st + a->C, st + 2 * a->C, st + 3 * a->C, g->p[0].x,
                               g->p[1].x, g->p[2].x, a->N, a->C, a->HW, 1e-5f, 0.1f);
    free(st);
}

static void bn_bwd(gc *g, const float *dout)
{
    const norm_arg *a = g->arg;
    float *st = calloc(4 * (size_t)a->C, sizeof(float));
    float *out = malloc(g->n_out * sizeof(float));
    CHECK(st && out);
    fb_batchnorm_forward_train(g->be, out, st, st + a->C, st + 2 * a->C, st + 3 * a->C, g->p[0].x,
                               g->p[1].x, g->p[2].x, a->N, a->C, a->HW, 1e-5f, 0.1f);
    fb_batchnorm_backward(g->be, g->p[0].grad, g->p[1].grad, g->p[2].grad, dout, g->p[0].x, st,
                          st + a->C, g->p[1].x, a->N, a->C, a->HW);
    free(st);
    free(out);
}

static void check_batchnorm(fb_backend *be, int B, int HW)
{
    norm_arg a = {5, 2 * B, HW};
    size_t n = (size_t)a.N * a.C * HW;
    float *in = kt_rand(n, -1, 2), *gamma = kt_rand(a.C, 0.5f, 1.5f);
    float *beta = kt_rand(a.C, -1, 1);
    gc g = {.be = be, .n_out = n, .fwd = bn_fwd, .bwd = bn_bwd, .arg = &a};
    snprintf(g.name, sizeof g.name, "batchnorm train N5 B%d C2 HW%d", B, HW);
    gc_param(&g, "in", in, n);
    gc_param(&g, "gamma", gamma, a.C);
    gc_param(&g, "beta", beta, a.C);
    gc_run(&g);
    free(in);
    free(gamma);
    free(beta);
}

static void ln_fwd(gc *g, float *out)
{
    const norm_arg *a = g->arg;
    float *st = malloc(2 * (size_t)a->N * a->C * sizeof(float));
    CHECK(st != NULL);
    fb_layernorm_forward(g->be, out, st, st + (size_t)a->N * a->C, g->p[0].x, g->p[1].x, g->p[2].x,
                         a->N, a->C, a->HW, 1e-5f);
    free(st);
}

static void ln_bwd(gc *g, const float *dout)
{
    const norm_arg *a = g->arg;
    size_t rows = (size_t)a->N * a->C;
    float *st = malloc(2 * rows * sizeof(float)), *out = malloc(g->n_out * sizeof(float));
    CHECK(st && out);
    fb_layernorm_forward(g->be, out, st, st + rows, g->p[0].x, g->p[1].x, g->p[2].x, a->N, a->C,
                         a->HW, 1e-5f);
    fb_layernorm_backward(g->be, g->p[0].grad, g->p[1].grad, g->p[2].grad, dout, g->p[0].x, st,
                          st + rows, g->p[1].x, a->N, a->C, a->HW);
    free(st);
    free(out);
}

static void check_layernorm(fb_backend *be, int B)
{
    norm_arg a = {3, B, 6};
    size_t n = (size_t)a.N * B * a.HW;
    float *in = kt_rand(n, -1, 2), *gamma = kt_rand((size_t)B * a.HW, 0.5f, 1.5f);
    float *beta = kt_rand((size_t)B * a.HW, -1, 1);
    gc g = {.be = be, .n_out = n, .fwd = ln_fwd, .bwd = ln_bwd, .arg = &a};
    snprintf(g.name, sizeof g.name, "layernorm [3, %d, 6]", B);
    gc_param(&g, "in", in, n);
    gc_param(&g, "gamma", gamma, (size_t)B * a.HW);
    gc_param(&g, "beta", beta, (size_t)B * a.HW);
    gc_run(&g);
    free(in);
    free(gamma);
    free(beta);
}

/* ---- sequences ---- */

typedef struct {
    int N, T, B, V, D, L, H;
    bool causal;
    fb_seq_pool kind;
    int32_t ids[16];
} seq_arg;

static void emb_fwd(gc *g, float *out)
{
    const seq_arg *a = g->arg;
    CHECK_INT_EQ(fb_embedding_forward(g->be, out, a->ids, g->p[0].x, a->N, a->T, a->B, a->V, a->D,
                                      NULL, 0),
                 0);
}

static void emb_bwd(gc *g, const float *dout)
{
    const seq_arg *a = g->arg;
    CHECK_INT_EQ(fb_embedding_backward(g->be, g->p[0].grad, dout, a->ids, a->N, a->T, a->B, a->V,
                                       a->D, NULL, 0),
                 0);
}

/* Repeated ids, so that a row of the table gets several positions' gradient. */
static void check_embedding(fb_backend *be, int B)
{
    seq_arg a = {.N = 2, .T = 4, .B = B, .V = 5, .D = 3, .ids = {0, 3, 3, 1, 4, 3, 0, 0}};
    size_t n_tab = (size_t)B * a.V * a.D;
    float *table = kt_rand(n_tab, -1, 1);
    gc g = {.be = be,
            .n_out = (size_t)a.N * a.T * B * a.D,
            .fwd = emb_fwd,
            .bwd = emb_bwd,
            .arg = &a};
    snprintf(g.name, sizeof g.name, "embedding [2, 4, %d, 3] V5", B);
    gc_param(&g, "table", table, n_tab);
    gc_run(&g);
    free(table);
}

static void pos_fwd(gc *g, float *out)
{
    const seq_arg *a = g->arg;
    fb_positional_forward(g->be, out, g->p[0].x, g->p[1].x, a->N, a->T, a->B, a->L, a->D);
}

static void pos_bwd(gc *g, const float *dout)
{
    const seq_arg *a = g->arg;
    fb_positional_backward(g->be, g->p[0].grad, g->p[1].grad, dout, a->N, a->T, a->B, a->L, a->D);
}

/* L > T: the rows of pos past T have no effect and get gradient 0. */
static void check_positional(fb_backend *be, int B)
{
    seq_arg a = {.N = 2, .T = 3, .B = B, .D = 4, .L = 5};
    size_t n = (size_t)a.N * a.T * B * a.D, n_pos = (size_t)B * a.L * a.D;
    float *in = kt_rand(n, -1, 1), *pos = kt_rand(n_pos, -1, 1);
    gc g = {.be = be, .n_out = n, .fwd = pos_fwd, .bwd = pos_bwd, .arg = &a};
    snprintf(g.name, sizeof g.name, "positional [2, 3, %d, 4] L5", B);
    gc_param(&g, "in", in, n);
    gc_param(&g, "pos", pos, n_pos);
    gc_run(&g);
    free(in);
    free(pos);
}

static void attn_fwd(gc *g, float *out)
{
    const seq_arg *a = g->arg;
    size_t ns = fb_attention_scratch_floats(g->be, a->N, a->T, a->B, a->H);
    float *s = ns ? malloc(ns * sizeof(float)) : NULL;
    float *probs = malloc((size_t)a->N * a->B * a->H * a->T * a->T * sizeof(float));
    CHECK(probs != NULL);
    fb_attention_forward(g->be, out, probs, g->p[0].x, a->N, a->T, a->B, a->D, a->H, a->causal, s);
    free(probs);
    free(s);
}

static void attn_bwd(gc *g, const float *dout)
{
    const seq_arg *a = g->arg;
    size_t ns = fb_attention_scratch_floats(g->be, a->N, a->T, a->B, a->H);
    float *s = ns ? malloc(ns * sizeof(float)) : NULL;
    float *probs = malloc((size_t)a->N * a->B * a->H * a->T * a->T * sizeof(float));
    float *out = malloc((size_t)a->N * a->T * a->B * a->D * sizeof(float));
    CHECK(probs && out);
    fb_attention_forward(g->be, out, probs, g->p[0].x, a->N, a->T, a->B, a->D, a->H, a->causal, s);
    fb_attention_backward(g->be, g->p[0].grad, dout, probs, g->p[0].x, a->N, a->T, a->B, a->D,
                          a->H, s);
    free(out);
    free(probs);
    free(s);
}

static void check_attention(fb_backend *be, int B, int T, int H, bool causal)
{
    seq_arg a = {.N = 2, .T = T, .B = B, .D = 4, .H = H, .causal = causal};
    size_t n = (size_t)a.N * T * B * 3 * a.D;
    float *qkv = kt_rand(n, -1, 1);
    gc g = {.be = be,
            .n_out = (size_t)a.N * T * B * a.D,
            .fwd = attn_fwd,
            .bwd = attn_bwd,
            .arg = &a};
    snprintf(g.name, sizeof g.name, "attention [2, %d, %d, 4] H%d %s", T, B, H,
             causal ? "causal" : "full");
    gc_param(&g, "qkv", qkv, n);
    gc_run(&g);
    free(qkv);
}

static void spool_fwd(gc *g, float *out)
{
    const seq_arg *a = g->arg;
    fb_seq_pool_forward(g->be, a->kind, out, g->p[0].x, a->N, a->T, a->B, a->D);
}

static void spool_bwd(gc *g, const float *dout)
{
    const seq_arg *a = g->arg;
    fb_seq_pool_backward(g->be, a->kind, g->p[0].grad, dout, a->N, a->T, a->B, a->D);
}

static void check_seq_pool(fb_backend *be, int B, fb_seq_pool kind)
{
    seq_arg a = {.N = 2, .T = 3, .B = B, .D = 4, .kind = kind};
    size_t n = (size_t)a.N * a.T * B * a.D;
    float *in = kt_rand(n, -1, 1);
    gc g = {.be = be, .n_out = (size_t)a.N * B * a.D, .fwd = spool_fwd, .bwd = spool_bwd, .arg = &a};
    snprintf(g.name, sizeof g.name, "seq_pool %s [2, 3, %d, 4]",
             kind == FB_SEQ_POOL_MEAN ? "mean" : "first", B);
    gc_param(&g, "in", in, n);
    gc_run(&g);
    free(in);
}

/* ---- losses ---- */

typedef struct {
    int N, B, K;
    int32_t labels[8];
    float *target;
} loss_arg;

static void xent_fwd(gc *g, float *out)
{
    const loss_arg *a = g->arg;
    fb_softmax_xent(g->be, out, NULL, NULL, g->p[0].x, a->labels, a->N, a->B, a->K,
                    1.0f / (float)a->N);
}

static void xent_bwd(gc *g, const float *dout)
{
    const loss_arg *a = g->arg;
    float loss[3];
    fb_softmax_xent(g->be, loss, g->p[0].grad, NULL, g->p[0].x, a->labels, a->N, a->B, a->K,
                    1.0f / (float)a->N);
}

static void mse_fwd(gc *g, float *out)
{
    const loss_arg *a = g->arg;
    fb_mse(g->be, out, NULL, g->p[0].x, a->target, a->N, a->B, a->K, 1.0f / (float)a->N);
}

static void mse_bwd(gc *g, const float *dout)
{
    const loss_arg *a = g->arg;
    float loss[3];
    fb_mse(g->be, loss, g->p[0].grad, g->p[0].x, a->target, a->N, a->B, a->K, 1.0f / (float)a->N);
}

static void check_losses(fb_backend *be, int B)
{
    loss_arg a = {6, B, 4, {0, 3, 1, 2, 3, 0, 0, 0}, NULL};
    size_t n = (size_t)a.N * B * a.K;
    float *logits = kt_rand(n, -3, 3);
    a.target = kt_rand((size_t)a.N * a.K, -1, 1);
    gc g = {.be = be, .n_out = B, .loss = true, .fwd = xent_fwd, .bwd = xent_bwd, .arg = &a};
    snprintf(g.name, sizeof g.name, "softmax_xent sum of loss [6, %d, 4]", B);
    gc_param(&g, "logits", logits, n);
    gc_run(&g);
    gc g2 = {.be = be, .n_out = B, .loss = true, .fwd = mse_fwd, .bwd = mse_bwd, .arg = &a};
    snprintf(g2.name, sizeof g2.name, "mse sum of loss [6, %d, 4]", B);
    gc_param(&g2, "pred", logits, n);
    gc_run(&g2);
    free(logits);
    free(a.target);
}

int main(void)
{
    backends[0] = fb_backend_cpu_ref();
    backends[1] = fb_backend_cpu();
    for (int k = 0; k < 2; k++) {
        fb_backend *be = backends[k];
        for (int B = 1; B <= 3; B += 2) {
            check_linear(be, B, false);
            check_linear(be, B, true);
            check_conv(be, B, false, 3, 1, 1);
            check_conv(be, B, false, 3, 2, 1);
            check_conv(be, B, true, 3, 2, 1);
            check_conv(be, B, false, 1, 1, 0);
            check_pool(be, B, 0, 3, 2, 1);
            check_pool(be, B, 0, 2, 2, 0);
            check_pool(be, B, 1, 3, 2, 1);
            check_pool(be, B, 2, 1, 1, 0);
            for (int act = FB_ACT_RELU; act <= FB_ACT_SIGMOID; act++)
                check_act(be, B, (fb_act)act);
            check_add(be, B);
            check_dropout(be, B);
            check_batchnorm(be, B, 1);
            check_batchnorm(be, B, 4);
            check_layernorm(be, B);
            check_embedding(be, B);
            check_positional(be, B);
            check_attention(be, B, 1, 1, true);
            check_attention(be, B, 4, 1, false);
            check_attention(be, B, 4, 2, true);
            check_attention(be, B, 5, 2, false);
            check_seq_pool(be, B, FB_SEQ_POOL_MEAN);
            check_seq_pool(be, B, FB_SEQ_POOL_FIRST);
            check_losses(be, B);
        }
    }
    printf("%d gradients checked, %d failed\n", g_problems, g_failures);
    CHECK_INT_EQ(g_failures, 0);
    return 0;
}
