/*
 * fb_array_train_steps (workers/array.h): a window of K steps, each tile of
 * members through all K before the next tile, leaves every member bit for
 * bit where K single steps of the whole array leave it (losses, correct
 * counts, parameters, gradients, optimizer state, batch-norm statistics),
 * for windows of 1 to 5 steps (12 steps cut unevenly), tiles of 1 and 3 and
 * the default, at 1 thread and at 2 (tiles dealt to lanes), for an MLP with
 * dropout (AdamW), a CNN with batch norm (Adam) and a language model (AdamW).
 * A member that diverges inside a window (an enormous learning rate at one
 * step) is not updated from the step its loss is not finite, as the session
 * wants, and the others go on.  A window with one bad batch is refused
 * before anything trains, naming the step.
 */
#include "engine_util.h"

#include "array.h"
#include "kernels.h"

#define SIDE 10
#define CLASSES 10
#define BS 24
#define STEPS 12
#define B 5
#define KMAX 5
#define T 8
#define V 13

typedef enum { MLP, CNN, LM } model;
static const char *const model_name[] = {"mlp", "cnn", "lm"};

static fb_dataset ds;

static fb_job_spec *member_spec(model mo, int i)
{
    const char *layers =
        mo == CNN ? "[{\"type\":\"conv2d\",\"out\":6,\"kernel\":[3,3],\"padding\":[1,1]},"
                    "{\"type\":\"batchnorm\"},{\"type\":\"relu\"},"
                    "{\"type\":\"maxpool2d\",\"kernel\":[2,2]},"
                    "{\"type\":\"flatten\"},{\"type\":\"linear\",\"out\":10}]"
        : mo == LM ? "[{\"type\":\"embedding\",\"dim\":8},{\"type\":\"positional\",\"max_len\":8},"
                     "{\"type\":\"transformer_block\",\"heads\":2,\"mlp_ratio\":2,\"dropout\":0.1},"
                     "{\"type\":\"layernorm\"},{\"type\":\"linear\",\"out\":13}]"
                   : "[{\"type\":\"flatten\"},{\"type\":\"linear\",\"out\":20},{\"type\":\"relu\"},"
                     "{\"type\":\"dropout\",\"p\":0.25},{\"type\":\"linear\",\"out\":10}]";
    const char *optim = mo == CNN ? "adam" : "adamw";
    char input[64];
    if (mo == LM)
        snprintf(input, sizeof input, "{\"tokens\":%d,\"vocab\":%d}", T, V);
    else
        snprintf(input, sizeof input, "[1,%d,%d]", SIDE, SIDE);
    return et_spec("{\"name\":\"win-%d\",\"dataset\":\"%s\",\"model\":{\"input\":%s,"
                   "\"layers\":%s},\"batch_size\":%d,\"steps\":%d,"
                   "\"optimizer\":{\"type\":\"%s\",\"lr\":%.17g,\"weight_decay\":0.01},"
                   "\"seed\":%d}",
                   i, mo == LM ? "text" : "synthetic", input, layers, BS, STEPS, optim,
                   1e-3 * (1 + i), 300 + 11 * i);
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

/* Every value of every member, part by part. */
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

/* Step `step`'s images, or for the language model records of T + 1 ids. */
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

/* Step `step`'s hyperparameters; the member `diverge` gets a learning rate
 * that sends its parameters past float at step `at`. */
static void hparams(const fb_array *a, int step, int diverge, int at, fb_optim_hparams *hp)
{
    for (int b = 0; b < B; b++) {
        fb_array_hparams(a, b, step + 1, STEPS, &hp[b]);
        if (b == diverge && step == at) hp[b].lr = 1e38f;
    }
}

#define XN (BS * SIDE * SIDE > BS * (T + 1) ? BS * SIDE * SIDE : BS * (T + 1))

/* Trains one array in windows of K and one whole array a step at a time
 * (an empty slot's hyperparameters once a member's loss is not finite, as
 * the session gives it), and compares everything after every window. */
static void run_case(model mo, int threads, int tile, int K, int diverge)
{
    fb_backend *be = fb_backend_clone_threads(fb_backend_cpu(), threads);
    CHECK(be != NULL);
    fb_job_spec *specs[B];
    for (int i = 0; i < B; i++)
        specs[i] = member_spec(mo, i);
    fb_array *win = new_array(be, specs), *ref = new_array(be, specs);
    fb_array_set_tile(win, tile);
    fb_array_set_tile(ref, B); /* one tile: the whole array's step */
    size_t n = snapshot(ref, NULL);
    float *vw = malloc(n * sizeof *vw), *vr = malloc(n * sizeof *vr);
    float *xs[KMAX];
    int32_t *ys[KMAX];
    for (int k = 0; k < KMAX; k++) {
        xs[k] = malloc(XN * sizeof *xs[k]);
        ys[k] = malloc(BS * sizeof *ys[k]);
        CHECK(xs[k] && ys[k]);
    }
    CHECK(vw && vr);
    fb_optim_hparams hw[KMAX * B], hr[B];
    float lw[KMAX * B], cw[KMAX * B], lr[B], cr[B];
    uint64_t stream[KMAX];
    bool dead[B] = {false};
    int diverged_at = -1;
    char msg[512];
    for (int step = 0; step < STEPS;) {
        int k = STEPS - step < K ? STEPS - step : K;
        for (int j = 0; j < k; j++) {
            batch(mo, step + j, xs[j], ys[j]);
            hparams(win, step + j, diverge, 4, hw + j * B);
            stream[j] = (uint64_t)(step + j);
        }
        CHECK_INT_EQ(fb_array_train_steps(win, k, (const float *const *)xs,
                                          (const int32_t *const *)ys, BS, stream, hw, lw, cw, msg,
                                          sizeof msg),
                     FB_OK);
        for (int j = 0; j < k; j++) {
            hparams(ref, step + j, diverge, 4, hr);
            /* the session's empty slot for a member that failed, from the next step on */
            for (int b = 0; b < B; b++)
                if (dead[b]) memset(&hr[b], 0, sizeof hr[b]);
            CHECK_INT_EQ(fb_array_train_step(ref, xs[j], ys[j], BS, (uint64_t)(step + j), hr, lr,
                                             cr, msg, sizeof msg),
                         FB_OK);
            for (int b = 0; b < B; b++) {
                if (dead[b]) continue;
                CHECK(memcmp(&lw[j * B + b], &lr[b], sizeof lr[b]) == 0);
                CHECK(memcmp(&cw[j * B + b], &cr[b], sizeof cr[b]) == 0);
                if (!isfinite(lr[b])) {
                    dead[b] = true;
                    diverged_at = step + j;
                }
            }
        }
        step += k;
        snapshot(win, vw);
        snapshot(ref, vr);
        CHECK(memcmp(vw, vr, n * sizeof *vw) == 0);
    }
    if (diverge >= 0) CHECK_INT_EQ(diverged_at, 5); /* its loss is not finite the step after */
    for (int b = 0; b < B; b++)
        CHECK(dead[b] == (b == diverge));
    printf("ok: %s threads=%d tile=%d window=%d diverge=%d, %d steps bit-identical\n",
           model_name[mo], threads, tile, K, diverge, STEPS);
    for (int k = 0; k < KMAX; k++) {
        free(xs[k]);
        free(ys[k]);
    }
    free(vw);
    free(vr);
    fb_array_free(win);
    fb_array_free(ref);
    for (int i = 0; i < B; i++)
        et_spec_free(specs[i]);
    fb_backend_clone_free(be);
}

/* A window whose third batch has a label past the outputs, or a batch size
 * the array does not hold: refused before any step trains. */
static void bad_window(int threads)
{
    fb_backend *be = fb_backend_clone_threads(fb_backend_cpu(), threads);
    CHECK(be != NULL);
    fb_job_spec *specs[B];
    for (int i = 0; i < B; i++)
        specs[i] = member_spec(MLP, i);
    fb_array *a = new_array(be, specs);
    fb_array_set_tile(a, 2);
    size_t n = snapshot(a, NULL);
    float *v0 = malloc(n * sizeof *v0), *v1 = malloc(n * sizeof *v1);
    float *xs[3];
    int32_t *ys[3];
    fb_optim_hparams hp[3 * B];
    float l[3 * B];
    uint64_t stream[3] = {0, 1, 2};
    for (int k = 0; k < 3; k++) {
        xs[k] = malloc(XN * sizeof *xs[k]);
        ys[k] = malloc(BS * sizeof *ys[k]);
        CHECK(xs[k] && ys[k]);
        batch(MLP, k, xs[k], ys[k]);
        hparams(a, k, -1, -1, hp + k * B);
    }
    CHECK(v0 && v1);
    snapshot(a, v0);
    static const struct {
        const char *what;
        int N;
        int32_t label;
        int err;
        const char *says;
    } cases[] = {
        {"label past the outputs", BS, CLASSES, FB_ERR_DATA,
         "label 10 of sample 7 is outside the model's 10 outputs (step 3 of the window)"},
        {"negative label", BS, -2, FB_ERR_DATA, "label -2 of sample 7"},
        {"more samples than the array holds", BS + 1, 0, FB_ERR_OUT_OF_RANGE,
         "batch of 25 samples, the array holds 24 (step 1 of the window)"},
    };
    char msg[512];
    for (size_t c = 0; c < sizeof cases / sizeof cases[0]; c++) {
        int32_t keep = ys[2][7];
        if (cases[c].label) ys[2][7] = cases[c].label;
        msg[0] = '\0';
        int err = fb_array_train_steps(a, 3, (const float *const *)xs, (const int32_t *const *)ys,
                                       cases[c].N, stream, hp, l, NULL, msg, sizeof msg);
        ys[2][7] = keep;
        printf("bad window (%s, %d threads): %s: %s\n", cases[c].what, threads,
               fb_err_code(err), msg);
        CHECK_INT_EQ(err, cases[c].err);
        CHECK(strstr(msg, cases[c].says) != NULL);
        snapshot(a, v1);
        CHECK(memcmp(v0, v1, n * sizeof *v0) == 0);
    }
    for (int k = 0; k < 3; k++) {
        free(xs[k]);
        free(ys[k]);
    }
    free(v0);
    free(v1);
    fb_array_free(a);
    for (int i = 0; i < B; i++)
        et_spec_free(specs[i]);
    fb_backend_clone_free(be);
}

int main(void)
{
    ds = et_synthetic(200, SIDE, CLASSES, 13);
    run_case(MLP, 1, 1, 5, -1);
    run_case(MLP, 1, 3, 4, 2);
    run_case(MLP, 1, 0, 1, -1);
    run_case(MLP, 2, 1, 5, 3);
    run_case(MLP, 2, 0, 3, -1);
    run_case(CNN, 1, 2, 5, -1);
    run_case(CNN, 2, 1, 4, 1);
    run_case(LM, 1, 2, 5, -1);
    run_case(LM, 2, 0, 2, 0);
    bad_window(1);
    bad_window(2);
    fb_dataset_free(&ds);
    return 0;
}
