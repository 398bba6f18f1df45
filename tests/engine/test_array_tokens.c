/*
 * Token models in the fused array (docs/jobspec.md, "Token models").
 *
 * Gradients: every parameter tensor of a one-block language model and of a
 * pooled classifier checked against central finite differences of the
 * array's own loss at a few entries, on the plain-C reference backend.
 *
 * Fusion: three members with their own seeds, dropout in the blocks, trained
 * fused for a few steps give bitwise the losses, parameters and gradients of
 * each member trained alone, and the shared activation plan trains bitwise
 * as the private one (a plan that let live buffers share bytes would not).
 *
 * Files: a member saved under its PyTorch names loads back into another
 * slot bit for bit.
 *
 * Bad input: ids that are not integers in [0, vocab) are refused with
 * FB_ERR_DATA naming the sample and position, and nothing changes.  A
 * session does not open on a dataset that does not fit the model (records
 * of the wrong length, ids beyond the vocab, values that are not ids, no
 * labels for a pooled classifier): FB_ERR_DATA naming the problem.
 */
#include "engine_util.h"

#include "array.h"
#include "kernels.h"
#include "session.h"

#define T 6
#define V 11
#define N 4
#define STEPS 4

static const char *const lm_spec =
    "{\"name\":\"m%d\",\"dataset\":\"text\",\"model\":{\"input\":{\"tokens\":6,\"vocab\":11},"
    "\"layers\":[{\"type\":\"embedding\",\"dim\":8},{\"type\":\"positional\",\"max_len\":8},"
    "{\"type\":\"transformer_block\",\"heads\":2,\"mlp_ratio\":2,\"dropout\":%g},"
    "{\"type\":\"layernorm\"},{\"type\":\"linear\",\"out\":11}]},\"batch_size\":4,\"steps\":10,"
    "\"optimizer\":{\"type\":\"adamw\",\"lr\":%g},\"seed\":%d}";

static const char *const cls_spec =
    "{\"name\":\"c%d\",\"dataset\":\"text\",\"model\":{\"input\":{\"tokens\":6,\"vocab\":11},"
    "\"layers\":[{\"type\":\"embedding\",\"dim\":8},{\"type\":\"positional\"},"
    "{\"type\":\"transformer_block\",\"heads\":4,\"causal\":false,\"dropout\":%g},"
    "{\"type\":\"pool\",\"mode\":\"first\"},{\"type\":\"gelu\"},{\"type\":\"linear\",\"out\":3}]},"
    "\"batch_size\":4,\"steps\":10,\"optimizer\":{\"type\":\"adam\",\"lr\":%g},\"seed\":%d}";

/* Records of rec ids (as floats) and labels below 3, from the test's generator. */
static void batch(uint64_t *st, int rec, float *x, int32_t *y)
{
    for (int i = 0; i < N * rec; i++) x[i] = (float)(et_next(st) % V);
    for (int n = 0; n < N; n++) y[n] = (int32_t)(et_next(st) % 3);
}

static fb_array *make(fb_backend *be, const fb_job_spec *const *specs, int B, fb_array_plan plan)
{
    fb_array *a = NULL;
    char msg[512];
    int err = fb_array_new_planned(be, specs, B, N, plan, &a, msg, sizeof msg);
    if (err) fprintf(stderr, "fb_array_new: %s\n", msg);
    CHECK_INT_EQ(err, FB_OK);
    return a;
}

static float loss_of(fb_array *a, const float *x, const int32_t *y)
{
    float loss;
    char msg[256];
    CHECK_INT_EQ(fb_array_forward_backward(a, x, y, N, true, 0, &loss, NULL, msg, sizeof msg),
                 FB_OK);
    return loss;
}

static void check_fd(const char *spec_fmt, int rec)
{
    fb_job_spec *s = et_spec(spec_fmt, 0, 0.0, 1e-3, 5);
    const fb_job_spec *specs[1] = {s};
    fb_array *a = make(fb_backend_cpu_ref(), specs, 1, FB_ARRAY_PLAN_SHARED);
    uint64_t st = 77;
    float x[N * (T + 1)];
    int32_t y[N];
    batch(&st, rec, x, y);
    loss_of(a, x, y);
    int nt = fb_array_tensor_count(a, FB_ARRAY_PARAM), checked = 0;
    double worst = 0;
    for (int t = 0; t < nt; t++) {
        fb_array_tensor d = fb_array_tensor_at(a, FB_ARRAY_PARAM, t);
        float *p = malloc(d.numel * sizeof *p), *g = malloc(d.numel * sizeof *g);
        CHECK(p && g);
        fb_array_get(a, 0, FB_ARRAY_PARAM, t, p);
        loss_of(a, x, y);
        fb_array_get(a, 0, FB_ARRAY_GRAD, t, g);
        /* the entry with the largest gradient and two fixed ones */
        size_t at[3] = {0, d.numel / 2, 0};
        for (size_t i = 0; i < d.numel; i++)
            if (fabsf(g[i]) > fabsf(g[at[2]])) at[2] = i;
        for (int k = 0; k < 3; k++) {
            size_t i = at[k];
            const float h = 1e-2f;
            float keep = p[i];
            p[i] = keep + h;
            fb_array_set(a, 0, FB_ARRAY_PARAM, t, p);
            double up = loss_of(a, x, y);
            p[i] = keep - h;
            fb_array_set(a, 0, FB_ARRAY_PARAM, t, p);
            double down = loss_of(a, x, y);
            p[i] = keep;
            fb_array_set(a, 0, FB_ARRAY_PARAM, t, p);
            double fd = (up - down) / (2.0 * h), err = fabs(fd - g[i]);
            if (err > 2e-3 + 2e-2 * fabs(fd)) {
                fprintf(stderr, "%s[%zu]: finite difference %.6g, gradient %.6g\n", d.name, i, fd,
                        (double)g[i]);
                abort();
            }
            if (err > worst) worst = err;
            checked++;
        }
        free(p);
        free(g);
    }
    printf("finite differences (%s): %d entries of %d tensors, worst abs error %.2e\n",
           s->lm ? "lm" : "pool", checked, nt, worst);
    fb_array_free(a);
    et_spec_free(s);
}

/* Every parameter and gradient of slot m of a equals slot k of b bit for bit. */
static void check_same(fb_array *a, int m, fb_array *b, int k, const char *what)
{
    for (int part = FB_ARRAY_PARAM; part <= FB_ARRAY_GRAD; part++) {
        for (int t = 0; t < fb_array_tensor_count(a, (fb_array_part)part); t++) {
            fb_array_tensor d = fb_array_tensor_at(a, (fb_array_part)part, t);
            float *u = malloc(d.numel * sizeof *u), *v = malloc(d.numel * sizeof *v);
            CHECK(u && v);
            fb_array_get(a, m, (fb_array_part)part, t, u);
            fb_array_get(b, k, (fb_array_part)part, t, v);
            if (memcmp(u, v, d.numel * sizeof *u) != 0) {
                fprintf(stderr, "%s: %s of %s differs\n", what, part ? "gradient" : "value", d.name);
                abort();
            }
            free(u);
            free(v);
        }
    }
}

static void check_fusion(fb_backend *be, const char *spec_fmt, int rec)
{
    enum { B = 3 };
    fb_job_spec *s[B];
    const fb_job_spec *sp[B];
    for (int b = 0; b < B; b++) {
        s[b] = et_spec(spec_fmt, b, 0.2, 1e-3 * (b + 1), 10 + b);
        sp[b] = s[b];
    }
    fb_array *fused = make(be, sp, B, FB_ARRAY_PLAN_SHARED);
    fb_array *priv = make(be, sp, B, FB_ARRAY_PLAN_PRIVATE);
    fb_array *alone[B];
    for (int b = 0; b < B; b++) alone[b] = make(be, &sp[b], 1, FB_ARRAY_PLAN_SHARED);
    uint64_t st = 99;
    float x[N * (T + 1)];
    int32_t y[N];
    char msg[256];
    for (int step = 1; step <= STEPS; step++) {
        batch(&st, rec, x, y);
        float lf[B], lp[B], cf[B];
        CHECK_INT_EQ(fb_array_forward_backward(fused, x, y, N, true, (uint64_t)step, lf, cf, msg,
                                               sizeof msg),
                     FB_OK);
        CHECK_INT_EQ(fb_array_forward_backward(priv, x, y, N, true, (uint64_t)step, lp, NULL, msg,
                                               sizeof msg),
                     FB_OK);
        fb_optim_hparams hp[B];
        for (int b = 0; b < B; b++) {
            float l1, c1;
            CHECK_INT_EQ(fb_array_forward_backward(alone[b], x, y, N, true, (uint64_t)step, &l1,
                                                   &c1, msg, sizeof msg),
                         FB_OK);
            CHECK(memcmp(&l1, &lf[b], sizeof l1) == 0);
            CHECK(memcmp(&c1, &cf[b], sizeof c1) == 0);
            CHECK(memcmp(&lp[b], &lf[b], sizeof l1) == 0);
            CHECK(cf[b] >= 0 && cf[b] <= N);
            check_same(alone[b], 0, fused, b, "alone vs fused");
            check_same(priv, b, fused, b, "private vs shared plan");
            fb_array_hparams(fused, b, step, 10, &hp[b]);
            fb_array_step(alone[b], &hp[b]);
        }
        fb_array_step(fused, hp);
        fb_array_step(priv, hp);
    }
    printf("fusion (%s, %s): %d members, %d steps, bitwise alone = fused = private plan\n",
           fb_backend_name(be), s[0]->lm ? "lm" : "pool", B, STEPS);

    /* a member saved and loaded into another slot */
    char dir[256], path[512];
    et_tmpdir(dir, sizeof dir, "tokens");
    snprintf(path, sizeof path, "%s/m0.safetensors", dir);
    CHECK_INT_EQ(fb_array_save(fused, 0, path, false, NULL, NULL, msg, sizeof msg), FB_OK);
    CHECK_INT_EQ(fb_array_load(priv, 2, path, msg, sizeof msg), FB_OK);
    for (int t = 0; t < fb_array_tensor_count(fused, FB_ARRAY_PARAM); t++) {
        fb_array_tensor d = fb_array_tensor_at(fused, FB_ARRAY_PARAM, t);
        float *u = malloc(d.numel * sizeof *u), *v = malloc(d.numel * sizeof *v);
        CHECK(u && v);
        fb_array_get(fused, 0, FB_ARRAY_PARAM, t, u);
        fb_array_get(priv, 2, FB_ARRAY_PARAM, t, v);
        CHECK(memcmp(u, v, d.numel * sizeof *u) == 0);
        free(u);
        free(v);
    }
    fb_array_tensor w = fb_array_tensor_at(fused, FB_ARRAY_PARAM, 2);
    CHECK_STR_EQ(w.name, "2.ln1.weight");
    w = fb_array_tensor_at(fused, FB_ARRAY_PARAM, 4);
    CHECK_STR_EQ(w.name, "2.attn.in_proj_weight");
    CHECK_INT_EQ(w.shape[0], 24);
    CHECK_INT_EQ(w.shape[1], 8);
    et_rmtree(dir);

    for (int b = 0; b < B; b++) {
        fb_array_free(alone[b]);
        et_spec_free(s[b]);
    }
    fb_array_free(fused);
    fb_array_free(priv);
}

typedef struct bad_case {
    int sample, pos;
    float value;
} bad_case;

static void check_bad_ids(void)
{
    fb_job_spec *s = et_spec(lm_spec, 0, 0.0, 1e-3, 1);
    const fb_job_spec *sp[1] = {s};
    fb_array *a = make(fb_backend_cpu(), sp, 1, FB_ARRAY_PLAN_SHARED);
    static const bad_case cases[] = {
        {0, 0, 11.0f}, {1, 2, -1.0f}, {3, 6, 2.5f}, {2, 3, NAN}, {0, 5, 1e9f}, {3, 0, INFINITY},
    };
    fb_array_tensor d = fb_array_tensor_at(a, FB_ARRAY_PARAM, 0);
    float *before = malloc(d.numel * sizeof *before), *after = malloc(d.numel * sizeof *after);
    CHECK(before && after);
    for (size_t c = 0; c < sizeof cases / sizeof cases[0]; c++) {
        uint64_t st = 5;
        float x[N * (T + 1)];
        int32_t y[N];
        batch(&st, T + 1, x, y);
        loss_of(a, x, y); /* the gradients of a good batch */
        fb_array_get(a, 0, FB_ARRAY_GRAD, 0, before);
        x[cases[c].sample * (T + 1) + cases[c].pos] = cases[c].value;
        char msg[256] = "", want[64];
        float loss = -7;
        int err = fb_array_forward_backward(a, x, y, N, true, 0, &loss, NULL, msg, sizeof msg);
        printf("bad id %g at sample %d position %d -> %s: %s\n", (double)cases[c].value,
               cases[c].sample, cases[c].pos, fb_err_code(err), msg);
        CHECK_INT_EQ(err, FB_ERR_DATA);
        snprintf(want, sizeof want, "position %d of sample %d", cases[c].pos, cases[c].sample);
        CHECK(strstr(msg, want) != NULL);
        CHECK(strstr(msg, "model.input.vocab") != NULL);
        CHECK(loss == -7);
        fb_array_get(a, 0, FB_ARRAY_GRAD, 0, after);
        CHECK(memcmp(before, after, d.numel * sizeof *before) == 0);
    }
    free(before);
    free(after);
    fb_array_free(a);
    et_spec_free(s);
}

typedef struct data_case {
    const char *what;
    bool lm;     /* the language model, else the pooled classifier */
    int rec;     /* values per record */
    int classes; /* the dataset's n_classes (0: no labels) */
    float bad;   /* a value put at record 5, position 1 (0: none) */
    int expect;
    const char *needle;
} data_case;

static void check_session_data(void)
{
    static const data_case cases[] = {
        {"lm, label-less", true, T + 1, 0, 0, FB_OK, NULL},
        {"pool, labelled", false, T, 3, 0, FB_OK, NULL},
        {"lm on records of T", true, T, 0, 0, FB_ERR_DATA, "reads records of 7 tokens"},
        {"pool on records of T + 1", false, T + 1, 3, 0, FB_ERR_DATA, "reads records of 6 tokens"},
        {"pool without labels", false, T, 0, 0, FB_ERR_DATA, "has no labels"},
        {"id at vocab", true, T + 1, 0, 11, FB_ERR_DATA, "record 5 position 1: 11 is not a token id"},
        {"pixel value", true, T + 1, 0, 0.5f, FB_ERR_DATA, "0.5 is not a token id below the "
                                                            "model's vocab 11"},
    };
    for (size_t c = 0; c < sizeof cases / sizeof cases[0]; c++) {
        const data_case *k = &cases[c];
        fb_job_spec *s = et_spec(k->lm ? lm_spec : cls_spec, 0, 0.0, 1e-3, 1);
        const fb_job_spec *sp[1] = {s};
        enum { n = 16 };
        fb_dataset ds = {.n = n, .C = 1, .H = 1, .W = k->rec, .n_classes = k->classes};
        ds.x = calloc((size_t)n * (size_t)k->rec, sizeof *ds.x);
        ds.y = calloc(n, sizeof *ds.y);
        CHECK(ds.x && ds.y);
        for (int i = 0; i < n * k->rec; i++) ds.x[i] = (float)(i % V);
        if (k->bad != 0) ds.x[5 * k->rec + 1] = k->bad;
        fb_session *ss = NULL;
        char msg[512] = "";
        int err = fb_session_new(&ss, fb_backend_cpu(), sp, 1, &ds, NULL, NULL, msg, sizeof msg);
        printf("session on %s -> %s %s\n", k->what, fb_err_code(err), msg);
        CHECK_INT_EQ(err, k->expect);
        if (k->needle) CHECK(strstr(msg, k->needle) != NULL);
        CHECK((ss != NULL) == (err == FB_OK));
        fb_session_free(ss);
        free(ds.x);
        free(ds.y);
        et_spec_free(s);
    }
    /* more than one device: refused before anything is built */
    fb_job_spec *s = et_spec(lm_spec, 0, 0.0, 1e-3, 1);
    const fb_job_spec *sp[1] = {s};
    fb_dataset ds = {.n = 16, .C = 1, .H = 1, .W = T + 1, .n_classes = 0};
    ds.x = calloc(16 * (T + 1), sizeof *ds.x);
    ds.y = calloc(16, sizeof *ds.y);
    CHECK(ds.x && ds.y);
    fb_train_opts o = {.n_devices = 2};
    fb_session *ss = NULL;
    char msg[512] = "";
    int err = fb_session_new(&ss, fb_backend_cpu(), sp, 1, &ds, NULL, &o, msg, sizeof msg);
    printf("session on 2 devices -> %s %s\n", fb_err_code(err), msg);
    CHECK_INT_EQ(err, FB_ERR_UNSUPPORTED);
    CHECK(ss == NULL && strstr(msg, "train on one device") != NULL);
    free(ds.x);
    free(ds.y);
    et_spec_free(s);
}

int main(void)
{
    check_fd(lm_spec, T + 1);
    check_fd(cls_spec, T);
    check_fusion(fb_backend_cpu(), lm_spec, T + 1);
    check_fusion(fb_backend_cpu_ref(), lm_spec, T + 1);
    check_fusion(fb_backend_cpu(), cls_spec, T);
    check_bad_ids();
    check_session_data();
    printf("array tokens: all checks passed\n");
    return 0;
}
