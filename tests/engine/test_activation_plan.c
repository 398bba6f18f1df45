/*
 * The activation plan of an array (workers/array.c): buffers that are never
 * live at the same step of a training pass share bytes.
 *
 * The plan itself, for models that cover every layer kind, residual blocks
 * with an identity and with a conv shortcut, nested blocks, a branch that
 * starts on the shared-input copy, and both losses: every used buffer lies
 * 64-byte aligned inside the slab; no two buffers live at a common step
 * overlap in bytes; both plans agree on every buffer's size and live range;
 * the private plan (every buffer its own bytes) is the sum of the buffers and
 * the shared plan is no larger.  A plain chain never holds more than two
 * activation gradients at once, and the benchmark's CNN shape needs at most
 * 40% of the private plan (it needed 100%, and twice the activations, when
 * gradients mirrored activations).
 *
 * Training: the same three members trained with the shared and with the
 * private plan, on batches of varying size, one member leaving half-way,
 * then an eval pass with labels and a prediction pass without: every loss,
 * correct count, logit, parameter, gradient and running statistic must be
 * bitwise equal, on the fast CPU backend and on the plain-C reference.  A
 * plan that let two live buffers share bytes would corrupt one of them;
 * a plan that missed a use of a buffer stops the array at its liveness
 * assertion.
 *
 * Bad input: an unknown plan is refused with FB_ERR_OUT_OF_RANGE and leaves
 * the output untouched.
 */
#include "engine_util.h"

#include "array.h"
#include "kernels.h"

#define CLASSES 5
#define MAX_N 8
#define B0 3
#define STEPS 6

typedef struct model_case {
    const char *name;
    int C, H, W;
    const char *loss;
    const char *layers;
    bool chain; /* no residual block: at most two gradients live at once */
} model_case;

static const model_case cases[] = {
    {"mlp", 1, 6, 6, "cross_entropy",
     "[{\"type\":\"flatten\"},{\"type\":\"linear\",\"out\":16},{\"type\":\"relu\"},"
     "{\"type\":\"dropout\",\"p\":0.25},{\"type\":\"linear\",\"out\":12},{\"type\":\"gelu\"},"
     "{\"type\":\"linear\",\"out\":5}]",
     true},
    /* the shape of bench/fusion's CNN, smaller */
    {"cnn", 1, 8, 8, "cross_entropy",
     "[{\"type\":\"conv2d\",\"out\":4,\"kernel\":3,\"padding\":1},{\"type\":\"relu\"},"
     "{\"type\":\"maxpool2d\",\"kernel\":2},"
     "{\"type\":\"conv2d\",\"out\":6,\"kernel\":3,\"padding\":1},{\"type\":\"relu\"},"
     "{\"type\":\"maxpool2d\",\"kernel\":2},{\"type\":\"flatten\"},"
     "{\"type\":\"linear\",\"out\":5}]",
     true},
    {"resnet", 3, 8, 8, "cross_entropy",
     "[{\"type\":\"conv2d\",\"out\":4,\"kernel\":3,\"padding\":1,\"bias\":false},"
     "{\"type\":\"batchnorm\"},{\"type\":\"relu\"},"
     "{\"type\":\"residual\",\"body\":["
     "{\"type\":\"conv2d\",\"out\":4,\"kernel\":3,\"padding\":1,\"bias\":false},"
     "{\"type\":\"batchnorm\"},{\"type\":\"relu\"},"
     "{\"type\":\"conv2d\",\"out\":4,\"kernel\":3,\"padding\":1,\"bias\":false},"
     "{\"type\":\"batchnorm\"}],\"shortcut\":[]},"
     "{\"type\":\"relu\"},"
     "{\"type\":\"residual\",\"body\":["
     "{\"type\":\"conv2d\",\"out\":8,\"kernel\":3,\"stride\":2,\"padding\":1,\"bias\":false},"
     "{\"type\":\"batchnorm\"},{\"type\":\"relu\"},"
     "{\"type\":\"conv2d\",\"out\":8,\"kernel\":3,\"padding\":1,\"bias\":false},"
     "{\"type\":\"batchnorm\"}],\"shortcut\":["
     "{\"type\":\"conv2d\",\"out\":8,\"kernel\":1,\"stride\":2,\"bias\":false},"
     "{\"type\":\"batchnorm\"}]},"
     "{\"type\":\"relu\"},{\"type\":\"global_avgpool\"},{\"type\":\"linear\",\"out\":5}]",
     false},
    /* batch norm first (a per-member copy of the input), nested blocks, a
     * shortcut that is a layer of its own, every activation, layer norm,
     * average pooling, a block over flat features with dropout inside */
    {"branches", 2, 6, 6, "cross_entropy",
     "[{\"type\":\"batchnorm\"},"
     "{\"type\":\"residual\",\"body\":["
     "{\"type\":\"conv2d\",\"out\":2,\"kernel\":3,\"padding\":1},{\"type\":\"tanh\"},"
     "{\"type\":\"conv2d\",\"out\":2,\"kernel\":3,\"padding\":1}],\"shortcut\":[]},"
     "{\"type\":\"sigmoid\"},"
     "{\"type\":\"residual\",\"body\":["
     "{\"type\":\"residual\",\"body\":["
     "{\"type\":\"conv2d\",\"out\":3,\"kernel\":3,\"padding\":1},{\"type\":\"relu\"}],"
     "\"shortcut\":[{\"type\":\"conv2d\",\"out\":3,\"kernel\":1}]},"
     "{\"type\":\"layernorm\"}],"
     "\"shortcut\":[{\"type\":\"conv2d\",\"out\":3,\"kernel\":1}]},"
     "{\"type\":\"avgpool2d\",\"kernel\":2},{\"type\":\"flatten\"},"
     "{\"type\":\"residual\",\"body\":[{\"type\":\"linear\",\"out\":27},{\"type\":\"gelu\"},"
     "{\"type\":\"dropout\",\"p\":0.3}],\"shortcut\":[]},"
     "{\"type\":\"linear\",\"out\":5}]",
     false},
    /* relu straight on the shared input, mse loss */
    {"mse", 1, 6, 6, "mse",
     "[{\"type\":\"relu\"},{\"type\":\"conv2d\",\"out\":3,\"kernel\":3},"
     "{\"type\":\"global_avgpool\"},{\"type\":\"layernorm\"},{\"type\":\"linear\",\"out\":8},"
     "{\"type\":\"sigmoid\"},{\"type\":\"linear\",\"out\":5}]",
     true},
};
#define N_CASES ((int)(sizeof cases / sizeof cases[0]))

static fb_job_spec *member_spec(const model_case *mc, int i)
{
    return et_spec("{\"name\":\"%s-%d\",\"dataset\":\"synthetic\",\"model\":{\"input\":[%d,%d,%d],"
                   "\"layers\":%s},\"loss\":\"%s\",\"batch_size\":%d,\"steps\":%d,"
                   "\"optimizer\":{\"type\":\"adamw\",\"lr\":%.17g,\"weight_decay\":0.01},"
                   "\"seed\":%d}",
                   mc->name, i, mc->C, mc->H, mc->W, mc->layers, mc->loss, MAX_N, STEPS,
                   3e-3 * (1 + i), 11 + 7 * i);
}

static size_t span16(size_t floats)
{
    return (floats + 15) & ~(size_t)15;
}

/* The plan's invariants; returns the shared slab over the private one. */
static double check_plan(const model_case *mc, const fb_array *a, const fb_array *priv)
{
    int n = fb_array_buffer_count(a);
    CHECK_INT_EQ(n, fb_array_buffer_count(priv));
    size_t slab = fb_array_slab_floats(a), pslab = fb_array_slab_floats(priv), sum = 0;
    int used = 0;
    for (int i = 0; i < n; i++) {
        fb_array_buffer b = fb_array_buffer_at(a, i), p = fb_array_buffer_at(priv, i);
        CHECK_INT_EQ(b.first, p.first);
        CHECK_INT_EQ(b.last, p.last);
        CHECK_INT_EQ(b.floats, p.floats);
        CHECK_INT_EQ(b.grad, p.grad);
        if (b.floats == 0) {
            CHECK_INT_EQ(b.first, -1);
            continue;
        }
        used++;
        CHECK(b.first >= 0 && b.first <= b.last);
        CHECK_INT_EQ(b.offset % 16, 0);
        CHECK(b.offset + b.floats <= slab);
        CHECK_INT_EQ(p.offset % 16, 0);
        CHECK(p.offset + p.floats <= pslab);
        sum += span16(b.floats);
        for (int j = 0; j < i; j++) {
            fb_array_buffer o = fb_array_buffer_at(a, j), q = fb_array_buffer_at(priv, j);
            if (o.floats == 0) continue;
            /* the private plan shares nothing at all */
            CHECK(p.offset + p.floats <= q.offset || q.offset + q.floats <= p.offset);
            if (b.first > o.last || o.first > b.last) continue;
            if (!(b.offset + b.floats <= o.offset || o.offset + o.floats <= b.offset)) {
                fprintf(stderr,
                        "%s: buffers %d [%zu, %zu) steps %d..%d and %d [%zu, %zu) steps %d..%d "
                        "are live together and share bytes\n",
                        mc->name, i, b.offset, b.offset + b.floats, b.first, b.last, j, o.offset,
                        o.offset + o.floats, o.first, o.last);
                CHECK(!"live buffers overlap");
            }
        }
    }
    CHECK_INT_EQ(pslab, sum);
    CHECK(slab <= pslab);
    /* gradients live at once, counted at every step where a range starts */
    int most = 0;
    for (int i = 0; i < n; i++) {
        fb_array_buffer s = fb_array_buffer_at(a, i);
        if (s.floats == 0) continue;
        int live = 0;
        for (int j = 0; j < n; j++) {
            fb_array_buffer g = fb_array_buffer_at(a, j);
            if (g.grad && g.floats && g.first <= s.first && s.first <= g.last) live++;
        }
        if (live > most) most = live;
    }
    if (mc->chain) CHECK(most <= 2);
    printf("%-8s %3d buffers: shared slab %7zu floats, private %7zu (%.3f), at most %d "
           "gradients live\n",
           mc->name, used, slab, pslab, (double)slab / (double)pslab, most);
    return (double)slab / (double)pslab;
}

static void check_same(const char *what, const void *x, const void *y, size_t floats)
{
    if (memcmp(x, y, floats * sizeof(float)) == 0) return;
    const float *p = x, *q = y;
    for (size_t i = 0; i < floats; i++)
        if (memcmp(&p[i], &q[i], sizeof p[i]) != 0) {
            fprintf(stderr, "%s differs at %zu: shared %.9g, private %.9g\n", what, i, p[i],
                    q[i]);
            break;
        }
    CHECK(!"shared and private plans disagree");
}

/* Member m's tensors of part in both arrays must be bitwise equal. */
static void check_part(const fb_array *a, const fb_array *p, fb_array_part part, const char *tag)
{
    for (int t = 0; t < fb_array_tensor_count(a, part); t++) {
        fb_array_tensor d = fb_array_tensor_at(a, part, t);
        float *x = malloc(d.numel * sizeof *x), *y = malloc(d.numel * sizeof *y);
        CHECK(x && y);
        for (int m = 0; m < fb_array_size(a); m++) {
            char what[160];
            snprintf(what, sizeof what, "%s member %d %s (part %d)", tag, m, d.name, (int)part);
            fb_array_get(a, m, part, t, x);
            fb_array_get(p, m, part, t, y);
            check_same(what, x, y, d.numel);
        }
        free(x);
        free(y);
    }
}

static void run_case(fb_backend *be, const model_case *mc, double *ratio)
{
    char msg[512], tag[96];
    snprintf(tag, sizeof tag, "%s/%s", fb_backend_name(be), mc->name);
    fb_job_spec *specs[B0];
    for (int i = 0; i < B0; i++) specs[i] = member_spec(mc, i);
    fb_array *arr[2] = {NULL, NULL}; /* shared, private */
    for (int k = 0; k < 2; k++) {
        int err = fb_array_new_planned(be, (const fb_job_spec *const *)specs, B0, MAX_N,
                                       k ? FB_ARRAY_PLAN_PRIVATE : FB_ARRAY_PLAN_SHARED,
                                       &arr[k], msg, sizeof msg);
        if (err) fprintf(stderr, "%s: %s\n", tag, msg);
        CHECK_INT_EQ(err, FB_OK);
    }
    double r = check_plan(mc, arr[0], arr[1]);
    if (ratio) *ratio = r;

    size_t in = (size_t)mc->C * mc->H * mc->W;
    float *x = malloc(MAX_N * in * sizeof *x);
    int32_t y[MAX_N];
    CHECK(x != NULL);
    uint64_t rs = 99;
    static const int sizes[STEPS] = {8, 5, 8, 3, 8, 7};
    for (int s = 0; s < STEPS; s++) {
        int N = sizes[s];
        for (size_t i = 0; i < (size_t)N * in; i++) x[i] = 2.0f * et_uniform(&rs) - 1.0f;
        for (int i = 0; i < N; i++) y[i] = (int32_t)(et_next(&rs) % CLASSES);
        if (s == STEPS / 2) {
            /* a member leaves: the others keep training in fewer slots */
            fb_array_remove(arr[0], 1);
            fb_array_remove(arr[1], 1);
        }
        float loss[2][B0], correct[2][B0];
        for (int k = 0; k < 2; k++) {
            CHECK_INT_EQ(fb_array_forward_backward(arr[k], x, y, N, true, (uint64_t)s, loss[k],
                                                   correct[k], msg, sizeof msg),
                         FB_OK);
            fb_optim_hparams hp[B0];
            for (int m = 0; m < fb_array_size(arr[k]); m++)
                fb_array_hparams(arr[k], m, s + 1, STEPS, &hp[m]);
            fb_array_step(arr[k], hp);
        }
        int B = fb_array_size(arr[0]);
        char what[128];
        snprintf(what, sizeof what, "%s step %d loss", tag, s);
        check_same(what, loss[0], loss[1], (size_t)B);
        snprintf(what, sizeof what, "%s step %d correct", tag, s);
        check_same(what, correct[0], correct[1], (size_t)B);
        if (s + 1 == STEPS) check_part(arr[0], arr[1], FB_ARRAY_GRAD, tag);
    }
    check_part(arr[0], arr[1], FB_ARRAY_PARAM, tag);
    check_part(arr[0], arr[1], FB_ARRAY_STATE1, tag);
    check_part(arr[0], arr[1], FB_ARRAY_BUFFER, tag);

    /* an eval pass with labels, then a prediction without */
    float loss[2][B0], correct[2][B0];
    for (int k = 0; k < 2; k++)
        CHECK_INT_EQ(fb_array_forward_backward(arr[k], x, y, 6, false, 0, loss[k], correct[k],
                                               msg, sizeof msg),
                     FB_OK);
    check_same("eval loss", loss[0], loss[1], (size_t)fb_array_size(arr[0]));
    check_same("eval correct", correct[0], correct[1], (size_t)fb_array_size(arr[0]));
    float logits[2][MAX_N * CLASSES];
    for (int k = 0; k < 2; k++)
        CHECK_INT_EQ(fb_array_forward_backward(arr[k], x, NULL, 4, false, 0, NULL, NULL, msg,
                                               sizeof msg),
                     FB_OK);
    for (int m = 0; m < fb_array_size(arr[0]); m++) {
        for (int k = 0; k < 2; k++) fb_array_logits(arr[k], m, 4, logits[k]);
        check_same("logits", logits[0], logits[1], 4 * CLASSES);
    }
    /* the logits are really the model's: finite, and not all equal */
    bool varied = false;
    for (int i = 0; i < 4 * CLASSES; i++) {
        CHECK(isfinite(logits[0][i]));
        varied |= logits[0][i] != logits[0][0];
    }
    CHECK(varied);

    free(x);
    for (int k = 0; k < 2; k++) fb_array_free(arr[k]);
    for (int i = 0; i < B0; i++) et_spec_free(specs[i]);
}

static void test_bad_plan(void)
{
    char msg[256] = "";
    fb_job_spec *s = member_spec(&cases[0], 0);
    const fb_job_spec *specs[1] = {s};
    fb_array *sentinel = (fb_array *)&msg, *a = sentinel;
    int err = fb_array_new_planned(fb_backend_cpu(), specs, 1, MAX_N, (fb_array_plan)7, &a, msg,
                                   sizeof msg);
    CHECK_INT_EQ(err, FB_ERR_OUT_OF_RANGE);
    CHECK(a == sentinel);
    CHECK(strstr(msg, "plan") != NULL);
    err = fb_array_new_planned(fb_backend_cpu(), specs, 1, MAX_N, (fb_array_plan)-1, &a, msg,
                               sizeof msg);
    CHECK_INT_EQ(err, FB_ERR_OUT_OF_RANGE);
    CHECK(a == sentinel);
    et_spec_free(s);
}

int main(void)
{
    double t0 = et_now();
    test_bad_plan();
    for (int c = 0; c < N_CASES; c++) {
        double ratio = 0;
        run_case(fb_backend_cpu(), &cases[c], &ratio);
        if (strcmp(cases[c].name, "cnn") == 0) CHECK(ratio <= 0.40);
    }
    for (int c = 0; c < N_CASES; c++) run_case(fb_backend_cpu_ref(), &cases[c], NULL);
    printf("activation plan: all cases agree (%.1f s)\n", et_now() - t0);
    return 0;
}
