/*
 * fb_array_train_step (workers/array.h): training the members in tiles, each
 * tile's forward, backward and update one after another, leaves every member
 * bit for bit where fb_array_forward_backward and fb_array_step over the
 * whole array leave it: losses, correct counts, parameters, gradients,
 * optimizer state and batch-norm statistics, for uneven tiles (B = 7 in
 * tiles of 3), at 1 thread (tiles one after another) and at 2 and 3 (tiles
 * dealt to the threads, each on its own lane: more tiles than threads, a
 * thread per member), for an MLP with dropout (SGD with momentum, AdamW), a
 * CNN with batch norm (Adam) and a language model with dropout in its
 * transformer block (AdamW; its ids checked and staged per tile, per lane).  A member whose loss is
 * not finite is not updated, as the session wants, while the others are.  Bad input is refused
 * before anything changes (a table of cases), at 1 and 2 threads.
 */
#include "engine_util.h"

#include "array.h"
#include "kernels.h"

#define SIDE 12
#define CLASSES 10
/* three chunks of a convolution's weight gradient (fast_conv.c), the last
 * short, and enough work that the whole array's conv takes 2 and 3 threads */
#define BS 40
#define STEPS 12
#define B 7

/* the language model: T positions of ids below V */
#define T 8
#define V 13

typedef enum { MLP, CNN, LM } model;
static const char *const model_name[] = {"mlp", "cnn", "lm"};

static fb_dataset ds;

static fb_job_spec *member_spec(model mo, const char *optim, int i)
{
    const char *layers =
        mo == CNN
            ? "[{\"type\":\"conv2d\",\"out\":8,\"kernel\":[3,3],\"padding\":[1,1]},"
              "{\"type\":\"batchnorm\"},{\"type\":\"relu\"},{\"type\":\"maxpool2d\",\"kernel\":[2,"
              "2]},"
              "{\"type\":\"flatten\"},{\"type\":\"linear\",\"out\":10}]"
        : mo == LM ? "[{\"type\":\"embedding\",\"dim\":8},{\"type\":\"positional\",\"max_len\":8},"
                     "{\"type\":\"transformer_block\",\"heads\":2,\"mlp_ratio\":2,\"dropout\":0.1},"
                     "{\"type\":\"layernorm\"},{\"type\":\"linear\",\"out\":13}]"
                   : "[{\"type\":\"flatten\"},{\"type\":\"linear\",\"out\":24},{\"type\":\"relu\"},"
                     "{\"type\":\"dropout\",\"p\":0.25},{\"type\":\"linear\",\"out\":10}]";
    char o[200];
    if (strcmp(optim, "sgd") == 0)
        snprintf(o, sizeof o, "{\"type\":\"sgd\",\"lr\":%.17g,\"momentum\":0.9,\"nesterov\":%s}",
                 0.02 + 0.01 * i, i % 2 ? "true" : "false");
    else
        snprintf(o, sizeof o, "{\"type\":\"%s\",\"lr\":%.17g,\"weight_decay\":0.01}", optim,
                 1e-3 * (1 + i));
    char input[64];
    if (mo == LM)
        snprintf(input, sizeof input, "{\"tokens\":%d,\"vocab\":%d}", T, V);
    else
        snprintf(input, sizeof input, "[1,%d,%d]", SIDE, SIDE);
    return et_spec("{\"name\":\"tile-%d\",\"dataset\":\"%s\",\"model\":{\"input\":%s,"
                   "\"layers\":%s},\"batch_size\":%d,\"steps\":%d,\"optimizer\":%s,\"seed\":%d}",
                   i, mo == LM ? "text" : "synthetic", input, layers, BS, STEPS, o, 100 + 7 * i);
}

static fb_array *new_array(fb_backend *be, fb_job_spec **specs)
{
    char msg[512];
    fb_array *a = NULL;
    int err = fb_array_new(be, (const fb_job_spec *const *)specs, B, BS, &a, msg, sizeof msg);
    if (err) fprintf(stderr, "fb_array_new: %s\n", msg);
    CHECK_INT_EQ(err, FB_OK);
    return a;
}

/* Every value of every member, part by part, as bytes. */
static size_t snapshot(const fb_array *a, float *dst)
{
    size_t n = 0;
    for (int part = FB_ARRAY_PARAM; part <= FB_ARRAY_BUFFER; part++)
        for (int t = 0; t < fb_array_tensor_count(a, (fb_array_part)part); t++) {
            fb_array_tensor d = fb_array_tensor_at(a, (fb_array_part)part, t);
            for (int m = 0; m < fb_array_size(a); m++) {
                if (dst) fb_array_get(a, m, (fb_array_part)part, t, dst + n);
                n += d.numel;
            }
        }
    return n;
}

/* A step's images, or for the language model records of T + 1 ids (as floats). */
static void batch(model mo, int step, float *x, int32_t *y)
{
    const int64_t F = (int64_t)SIDE * SIDE;
    if (mo == LM) {
        for (int i = 0; i < BS * (T + 1); i++)
            x[i] = (float)((step * 7 + i * 5 + i / 3) % V);
        for (int i = 0; i < BS; i++)
            y[i] = 0;
        return;
    }
    for (int i = 0; i < BS; i++) {
        int64_t k = (step * 5 + i * 3) % ds.n;
        memcpy(x + i * F, ds.x + k * F, (size_t)F * sizeof *x);
        y[i] = ds.y[k];
    }
}

static void hparams(const fb_array *a, int step, fb_optim_hparams *hp)
{
    for (int b = 0; b < B; b++)
        fb_array_hparams(a, b, step + 1, STEPS, &hp[b]);
}

/* Trains one array tiled and one whole, compares everything after every step.
 * nan_member >= 0: that member's first parameter tensor is NaN from the start. */
static void run_case(model mo, const char *optim, int threads, int tile, int nan_member)
{
    fb_backend *be = fb_backend_clone_threads(fb_backend_cpu(), threads);
    CHECK(be != NULL);
    fb_job_spec *specs[B];
    for (int i = 0; i < B; i++)
        specs[i] = member_spec(mo, optim, i);
    fb_array *tiled = new_array(be, specs), *whole = new_array(be, specs);
    fb_array_set_tile(tiled, tile);
    /* the members at one thread, whole: a member's result does not depend
     * on the thread count (a conv's weight gradient is summed in fixed chunks
     * of samples, fast_conv.c) */
    fb_backend *be1 = fb_backend_clone_threads(fb_backend_cpu(), 1);
    CHECK(be1 != NULL);
    fb_array *one = new_array(be1, specs);
    size_t n = snapshot(whole, NULL);
    float *vt = malloc(n * sizeof *vt), *vw = malloc(n * sizeof *vw);
    CHECK(vt && vw);
    float *bad = NULL;
    if (nan_member >= 0) {
        fb_array_tensor d = fb_array_tensor_at(whole, FB_ARRAY_PARAM, 0);
        bad = malloc(d.numel * sizeof *bad);
        CHECK(bad != NULL);
        for (size_t i = 0; i < d.numel; i++)
            bad[i] = NAN;
        fb_array_set(tiled, nan_member, FB_ARRAY_PARAM, 0, bad);
        fb_array_set(whole, nan_member, FB_ARRAY_PARAM, 0, bad);
        if (one) fb_array_set(one, nan_member, FB_ARRAY_PARAM, 0, bad);
    }
    float x[BS * SIDE * SIDE], lt[B], lw[B], ct[B], cw[B], before[64];
    int32_t y[BS];
    fb_optim_hparams hp[B];
    char msg[512];
    for (int step = 0; step < STEPS; step++) {
        batch(mo, step, x, y);
        hparams(whole, step, hp);
        if (nan_member >= 0)
            fb_array_get(tiled, nan_member, FB_ARRAY_PARAM, 1, before); /* its bias: finite */
        CHECK_INT_EQ(
            fb_array_train_step(tiled, x, y, BS, (uint64_t)step, hp, lt, ct, msg, sizeof msg),
            FB_OK);
        CHECK_INT_EQ(fb_array_forward_backward(whole, x, y, BS, true, (uint64_t)step, lw, cw, msg,
                                               sizeof msg),
                     FB_OK);
        for (int b = 0; b < B; b++)
            if (!isfinite(lw[b])) memset(&hp[b], 0, sizeof hp[b]);
        fb_array_step(whole, hp);
        if (one) {
            float lo[B];
            CHECK_INT_EQ(fb_array_forward_backward(one, x, y, BS, true, (uint64_t)step, lo, NULL,
                                                   msg, sizeof msg),
                         FB_OK);
            fb_array_step(one, hp);
            CHECK(memcmp(lo, lw, sizeof lo) == 0);
            snapshot(one, vw);
            snapshot(tiled, vt);
            CHECK(memcmp(vt, vw, n * sizeof *vt) == 0);
        }
        CHECK(memcmp(lt, lw, sizeof lt) == 0);
        CHECK(memcmp(ct, cw, sizeof ct) == 0);
        snapshot(tiled, vt);
        snapshot(whole, vw);
        CHECK(memcmp(vt, vw, n * sizeof *vt) == 0);
        for (int b = 0; b < B; b++)
            CHECK(b == nan_member ? !isfinite(lt[b]) : isfinite(lt[b]));
        if (nan_member >= 0) {
            float after[64];
            size_t nb = fb_array_tensor_at(tiled, FB_ARRAY_PARAM, 1).numel;
            CHECK(nb <= 64);
            fb_array_get(tiled, nan_member, FB_ARRAY_PARAM, 1, after);
            CHECK(memcmp(before, after, nb * sizeof *after) == 0); /* not updated */
        }
    }
    /* a member trained: its parameters moved */
    float *init = malloc(n * sizeof *init);
    CHECK(init != NULL);
    fb_array *fresh = new_array(be, specs);
    snapshot(fresh, init);
    CHECK(memcmp(init, vt, sizeof(float) * 64) != 0);
    printf("ok: %s %s threads=%d tile=%d nan_member=%d, %d steps bit-identical\n", model_name[mo],
           optim, threads, tile, nan_member, STEPS);
    fb_array_free(fresh);
    free(init);
    free(bad);
    free(vt);
    free(vw);
    fb_array_free(tiled);
    fb_array_free(whole);
    fb_array_free(one);
    fb_backend_clone_free(be1);
    for (int i = 0; i < B; i++)
        et_spec_free(specs[i]);
    fb_backend_clone_free(be);
}

/* An array in tiles of 2 after one good step, and a snapshot of every value,
 * for the bad-input tables. */
typedef struct {
    fb_backend *be;
    fb_job_spec *specs[B];
    fb_array *a;
    fb_optim_hparams hp[B];
    float *v0, *v1;
    size_t n;
    int threads;
} refusals;

static void refusals_open(refusals *r, model mo, int threads, float *x, int32_t *y)
{
    r->threads = threads;
    r->be = fb_backend_clone_threads(fb_backend_cpu(), threads);
    CHECK(r->be != NULL);
    for (int i = 0; i < B; i++)
        r->specs[i] = member_spec(mo, "adamw", i);
    r->a = new_array(r->be, r->specs);
    fb_array_set_tile(r->a, 2);
    batch(mo, 0, x, y);
    hparams(r->a, 0, r->hp);
    float l[B];
    char msg[512];
    CHECK_INT_EQ(fb_array_train_step(r->a, x, y, BS, 0, r->hp, l, NULL, msg, sizeof msg), FB_OK);
    r->n = snapshot(r->a, NULL);
    r->v0 = malloc(r->n * sizeof *r->v0);
    r->v1 = malloc(r->n * sizeof *r->v1);
    CHECK(r->v0 && r->v1);
    snapshot(r->a, r->v0);
}

/* One refused step: the error, its message, and not one value changed. */
static void refused(refusals *r, const char *what, int err, int want, const char *msg,
                    const char *says)
{
    printf("bad input (%s, %d threads): %s: %s\n", what, r->threads, fb_err_code(err), msg);
    CHECK_INT_EQ(err, want);
    CHECK(strstr(msg, says) != NULL);
    snapshot(r->a, r->v1);
    CHECK(memcmp(r->v0, r->v1, r->n * sizeof *r->v0) == 0);
}

static void refusals_close(refusals *r)
{
    free(r->v0);
    free(r->v1);
    fb_array_free(r->a);
    for (int i = 0; i < B; i++)
        et_spec_free(r->specs[i]);
    fb_backend_clone_free(r->be);
}

/* Bad labels and batch sizes for the MLP in tiles. */
static void bad_input(int threads)
{
    refusals r;
    float x[(BS + 1) * SIDE * SIDE], l[B];
    int32_t y[BS + 1];
    char msg[512];
    refusals_open(&r, MLP, threads, x, y);
    y[BS] = 0;
    static const struct {
        const char *what;
        int N, sample;
        int32_t label;
        int err;
        const char *says;
    } cases[] = {
        {"label past the outputs", BS, 3, CLASSES, FB_ERR_DATA, "outside the model's 10 outputs"},
        {"negative label", BS, BS - 1, -1, FB_ERR_DATA, "label -1 of sample 39"},
        {"no samples", 0, 0, 0, FB_ERR_OUT_OF_RANGE, "batch of 0 samples"},
        {"more samples than the array holds", BS + 1, 0, 0, FB_ERR_OUT_OF_RANGE,
         "batch of 41 samples, the array holds 40"},
    };
    for (size_t c = 0; c < sizeof cases / sizeof cases[0]; c++) {
        int32_t keep = y[cases[c].sample];
        y[cases[c].sample] = cases[c].label ? cases[c].label : keep;
        msg[0] = '\0';
        int err = fb_array_train_step(r.a, x, y, cases[c].N, 1, r.hp, l, NULL, msg, sizeof msg);
        y[cases[c].sample] = keep;
        refused(&r, cases[c].what, err, cases[c].err, msg, cases[c].says);
    }
    refusals_close(&r);
}

/* Bad ids for the language model in tiles: refused by every tile before it
 * changes anything, the message naming the sample and the position. */
static void bad_tokens(int threads)
{
    refusals r;
    float x[BS * (T + 1)], l[B];
    int32_t y[BS];
    char msg[512];
    refusals_open(&r, LM, threads, x, y);
    static const struct {
        const char *what;
        int at; /* index into x */
        float id;
        const char *says;
    } cases[] = {
        {"id at the vocab", 9 * (T + 1) + 3, (float)V, "token 13 at position 3 of sample 9"},
        {"negative id", 0, -1.0f, "token -1 at position 0 of sample 0"},
        {"fractional id", (BS - 1) * (T + 1) + T, 2.5f, "of sample 39"},
        {"NaN id", 4 * (T + 1) + 1, NAN, "at position 1 of sample 4"},
    };
    for (size_t c = 0; c < sizeof cases / sizeof cases[0]; c++) {
        float keep = x[cases[c].at];
        x[cases[c].at] = cases[c].id;
        msg[0] = '\0';
        int err = fb_array_train_step(r.a, x, y, BS, 1, r.hp, l, NULL, msg, sizeof msg);
        x[cases[c].at] = keep;
        refused(&r, cases[c].what, err, FB_ERR_DATA, msg, cases[c].says);
    }
    refusals_close(&r);
}

int main(void)
{
    ds = et_synthetic(256, SIDE, CLASSES, 11);
    run_case(MLP, "adamw", 1, 3, -1);
    run_case(MLP, "sgd", 1, 1, -1);
    run_case(MLP, "adamw", 2, 3, -1);
    run_case(MLP, "sgd", 2, 2, -1);
    run_case(MLP, "adamw", 2, 1, -1); /* 7 tiles on 2 lanes */
    run_case(MLP, "adamw", 3, 0, -1); /* the default: one tile per thread, uneven */
    run_case(MLP, "sgd", 3, 1, 5);
    run_case(MLP, "adamw", 1, 0, -1); /* the default tile: the whole array here */
    run_case(CNN, "adam", 1, 3, -1);
    run_case(CNN, "adam", 2, 3, -1);
    run_case(CNN, "adam", 3, 0, -1);
    run_case(MLP, "adam", 1, 2, 4);
    run_case(LM, "adamw", 1, 3, -1);
    run_case(LM, "adamw", 2, 2, -1);
    run_case(LM, "adamw", 3, 0, -1);
    bad_input(1);
    bad_input(2);
    bad_tokens(1);
    bad_tokens(2);
    fb_dataset_free(&ds);
    return 0;
}
