/*
 * bf16 precision of the training array (docs/jobspec.md, "precision").
 *
 * Definition: on the reference backend, the logits and gradients of a bf16
 * MLP array and of a bf16 CNN array equal, bit for bit, the float ops of
 * kernels.h applied by hand to operands rounded with fb_round_bf16 (inputs,
 * weights, output gradients), and differ from an fp32 array's.
 *
 * Loss scaling: with power-of-two scales a finite run trains the same bits as
 * with every scale fixed at 1 (no scaling); a member whose scaled gradients
 * overflow skips its updates (parameters and optimizer state untouched),
 * halves its scale each time, and then trains, while the other members of
 * its array follow exactly their solo runs; scales double after the growth
 * interval, each member on its own count; bad scales are refused and change
 * nothing; fp32 arrays have no scale.
 */
#include "engine_util.h"

#include "array.h"
#include "kernels.h"

/* A 3x3 convolution with padding 1 of one shared side x side channel into k
 * channels, for one member (defined above the test's size macros, which
 * share their names with the geometry's fields). */
static fb_conv_geom conv3x3(int n, int side, int k)
{
    fb_conv_geom g = {.N = n,
                      .B = 1,
                      .C = 1,
                      .H = side,
                      .W = side,
                      .K = k,
                      .kh = 3,
                      .kw = 3,
                      .sh = 1,
                      .sw = 1,
                      .ph = 1,
                      .pw = 1,
                      .shared = true};
    fb_conv_geom_finish(&g);
    return g;
}

#define SIDE 6
#define F (SIDE * SIDE)
#define HID 16
#define K 10
#define N 16
#define MAX_B 3

static fb_dataset ds;

static fb_job_spec *mlp_spec(const char *precision, double lr, int seed)
{
    return et_spec("{\"name\":\"m%d\",\"dataset\":\"synthetic\",\"model\":{\"input\":[1,%d,%d],"
                   "\"layers\":[{\"type\":\"flatten\"},{\"type\":\"linear\",\"out\":%d},"
                   "{\"type\":\"relu\"},{\"type\":\"linear\",\"out\":%d}]},\"batch_size\":%d,"
                   "\"steps\":100,\"optimizer\":{\"type\":\"adam\",\"lr\":%.17g},\"seed\":%d,"
                   "\"precision\":\"%s\"}",
                   seed, SIDE, SIDE, HID, K, N, lr, seed, precision);
}

static fb_array *new_array(fb_backend *be, fb_job_spec **specs, int B)
{
    char msg[512];
    fb_array *a = NULL;
    int err = fb_array_new(be, (const fb_job_spec *const *)specs, B, N, &a, msg, sizeof msg);
    if (err) fprintf(stderr, "fb_array_new: %s\n", msg);
    CHECK_INT_EQ(err, FB_OK);
    return a;
}

/* The minibatch of step s: N consecutive samples. */
static void batch(int s, float *x, int32_t *y)
{
    int64_t first = ((int64_t)s * N) % (ds.n - N);
    memcpy(x, ds.x + first * F, (size_t)N * F * sizeof *x);
    memcpy(y, ds.y + first, (size_t)N * sizeof *y);
}

/* One training step of every member; losses into l. */
static void train_step(fb_array *a, int s, float *l)
{
    char msg[512];
    float x[N * F];
    int32_t y[N];
    fb_optim_hparams hp[MAX_B];
    batch(s, x, y);
    int err = fb_array_forward_backward(a, x, y, N, true, (uint64_t)s, l, NULL, msg, sizeof msg);
    if (err) fprintf(stderr, "fb_array_forward_backward: %s\n", msg);
    CHECK_INT_EQ(err, FB_OK);
    for (int b = 0; b < fb_array_size(a); b++)
        fb_array_hparams(a, b, s + 1, 100, &hp[b]);
    fb_array_step(a, hp);
}

/* All of member m's values of a part, concatenated, into a malloc'd block. */
static float *member_values(const fb_array *a, int m, fb_array_part part, size_t *n_out)
{
    int T = fb_array_tensor_count(a, part);
    size_t n = 0;
    for (int t = 0; t < T; t++)
        n += fb_array_tensor_at(a, part, t).numel;
    float *v = malloc((n ? n : 1) * sizeof *v), *at = v;
    CHECK(v != NULL);
    for (int t = 0; t < T; t++) {
        fb_array_get(a, m, part, t, at);
        at += fb_array_tensor_at(a, part, t).numel;
    }
    *n_out = n;
    return v;
}

static bool same_bits(const float *x, const float *y, size_t n)
{
    return memcmp(x, y, n * sizeof *x) == 0;
}

static float *rounded(const float *v, size_t n)
{
    float *r = malloc(n * sizeof *r);
    CHECK(r != NULL);
    fb_round_bf16(fb_backend_cpu_ref(), r, v, n);
    return r;
}

/* ---- the definition ---- */

static void test_definition(void)
{
    fb_backend *ref = fb_backend_cpu_ref();
    fb_job_spec *specs[2] = {mlp_spec("bf16", 1e-3, 1), mlp_spec("bf16", 2e-3, 2)};
    fb_array *a = new_array(ref, specs, 2);
    float x[N * F], l[2], logits[N * K];
    int32_t y[N];
    char msg[256];
    batch(0, x, y);
    CHECK_INT_EQ(fb_array_forward_backward(a, x, y, N, true, 0, l, NULL, msg, sizeof msg), FB_OK);
    for (int m = 0; m < 2; m++) {
        /* tensors: 0 = 1.weight [HID, F], 1 = 1.bias, 2 = 3.weight [K, HID], 3 = 3.bias */
        float w1[HID * F], b1[HID], w2[K * HID], b2[K];
        fb_array_get(a, m, FB_ARRAY_PARAM, 0, w1);
        fb_array_get(a, m, FB_ARRAY_PARAM, 1, b1);
        fb_array_get(a, m, FB_ARRAY_PARAM, 2, w2);
        fb_array_get(a, m, FB_ARRAY_PARAM, 3, b2);
        float *rx = rounded(x, N * F), *rw1 = rounded(w1, HID * F), *rw2 = rounded(w2, K * HID);
        float pre[N * HID], h[N * HID], out[N * K], loss, dl[N * K];
        fb_linear_forward(ref, pre, rx, rw1, b1, N, 1, F, HID, true);
        fb_act_forward(ref, FB_ACT_RELU, h, pre, N * HID);
        float *rh = rounded(h, N * HID);
        fb_linear_forward(ref, out, rh, rw2, b2, N, 1, HID, K, false);
        fb_array_logits(a, m, N, logits);
        CHECK(same_bits(logits, out, N * K));
        fb_softmax_xent(ref, &loss, dl, NULL, out, y, N, 1, K, 1.0f / N);
        CHECK(loss == l[m]);
        float *rdl = rounded(dl, N * K);
        float dh[N * HID] = {0}, dpre[N * HID] = {0}, gw1[HID * F] = {0}, gb1[HID] = {0};
        float gw2[K * HID] = {0}, gb2[K] = {0};
        fb_linear_backward(ref, dh, gw2, gb2, rdl, rh, rw2, N, 1, HID, K, false);
        fb_act_backward(ref, FB_ACT_RELU, dpre, dh, pre, NULL, N * HID);
        float *rdpre = rounded(dpre, N * HID);
        fb_linear_backward(ref, NULL, gw1, gb1, rdpre, rx, rw1, N, 1, F, HID, true);
        float got[HID * F];
        fb_array_get(a, m, FB_ARRAY_GRAD, 0, got);
        CHECK(same_bits(got, gw1, HID * F));
        fb_array_get(a, m, FB_ARRAY_GRAD, 1, got);
        CHECK(same_bits(got, gb1, HID));
        fb_array_get(a, m, FB_ARRAY_GRAD, 2, got);
        CHECK(same_bits(got, gw2, K * HID));
        fb_array_get(a, m, FB_ARRAY_GRAD, 3, got);
        CHECK(same_bits(got, gb2, K));
        free(rx);
        free(rw1);
        free(rw2);
        free(rh);
        free(rdl);
        free(rdpre);
    }
    /* the same members in fp32 compute other logits: the mode is not a no-op */
    fb_job_spec *f32[2] = {mlp_spec("fp32", 1e-3, 1), mlp_spec("fp32", 2e-3, 2)};
    fb_array *b = new_array(ref, f32, 2);
    float l32[2], logits32[N * K];
    CHECK_INT_EQ(fb_array_forward_backward(b, x, y, N, true, 0, l32, NULL, msg, sizeof msg), FB_OK);
    fb_array_logits(a, 0, N, logits);
    fb_array_logits(b, 0, N, logits32);
    bool nan_ok = true;
    double d = 0;
    for (int i = 0; i < N * K; i++)
        d = fmax(d, fabs((double)logits[i] - logits32[i]));
    CHECK(nan_ok && d > 1e-5 && d < 0.1);
    CHECK(fb_array_loss_scale(b, 0) == 1.0f && !fb_array_update_skipped(b, 0));
    printf("definition: bf16 logits and gradients match the rounded ops bit for bit; "
           "max |bf16 - fp32| logit %.3g\n",
           d);
    fb_array_free(a);
    fb_array_free(b);
    for (int i = 0; i < 2; i++) {
        et_spec_free(specs[i]);
        et_spec_free(f32[i]);
    }
}

/* The same for a convolution (shared input, so a grouped conv of B = 2 with
 * one input): conv 3x3 -> relu -> flatten -> linear. */
static void test_definition_conv(void)
{
    enum { C2 = 2, HW = F * C2 };
    fb_backend *ref = fb_backend_cpu_ref();
    fb_job_spec *specs[2];
    for (int i = 0; i < 2; i++)
        specs[i] = et_spec("{\"name\":\"c%d\",\"dataset\":\"synthetic\",\"model\":{\"input\":"
                           "[1,%d,%d],\"layers\":[{\"type\":\"conv2d\",\"out\":%d,\"kernel\":3,"
                           "\"padding\":1},{\"type\":\"relu\"},{\"type\":\"flatten\"},"
                           "{\"type\":\"linear\",\"out\":%d}]},\"batch_size\":%d,\"steps\":10,"
                           "\"optimizer\":{\"type\":\"sgd\",\"lr\":0.1},\"seed\":%d,"
                           "\"precision\":\"bf16\"}",
                           i, SIDE, SIDE, C2, K, N, 20 + i);
    fb_array *a = new_array(ref, specs, 2);
    float x[N * F], l[2], logits[N * K];
    int32_t y[N];
    char msg[256];
    batch(3, x, y);
    CHECK_INT_EQ(fb_array_forward_backward(a, x, y, N, true, 0, l, NULL, msg, sizeof msg), FB_OK);
    fb_conv_geom g = conv3x3(N, SIDE, C2);
    for (int m = 0; m < 2; m++) {
        /* tensors: 0 = 0.weight [C2, 1, 3, 3], 1 = 0.bias, 2 = 3.weight [K, HW], 3 = 3.bias */
        float wc[C2 * 9], bc[C2], w2[K * HW], b2[K];
        fb_array_get(a, m, FB_ARRAY_PARAM, 0, wc);
        fb_array_get(a, m, FB_ARRAY_PARAM, 1, bc);
        fb_array_get(a, m, FB_ARRAY_PARAM, 2, w2);
        fb_array_get(a, m, FB_ARRAY_PARAM, 3, b2);
        float *rx = rounded(x, N * F), *rwc = rounded(wc, C2 * 9), *rw2 = rounded(w2, K * HW);
        float pre[N * HW], h[N * HW], out[N * K], loss, dl[N * K];
        fb_conv2d_forward(ref, pre, rx, rwc, bc, &g, NULL);
        fb_act_forward(ref, FB_ACT_RELU, h, pre, N * HW);
        float *rh = rounded(h, N * HW);
        fb_linear_forward(ref, out, rh, rw2, b2, N, 1, HW, K, false);
        fb_array_logits(a, m, N, logits);
        CHECK(same_bits(logits, out, N * K));
        fb_softmax_xent(ref, &loss, dl, NULL, out, y, N, 1, K, 1.0f / N);
        CHECK(loss == l[m]);
        float *rdl = rounded(dl, N * K);
        static float dh[N * HW], dpre[N * HW];
        memset(dh, 0, sizeof dh);
        memset(dpre, 0, sizeof dpre);
        float gwc[C2 * 9] = {0}, gbc[C2] = {0}, gw2[K * HW] = {0}, gb2[K] = {0};
        fb_linear_backward(ref, dh, gw2, gb2, rdl, rh, rw2, N, 1, HW, K, false);
        fb_act_backward(ref, FB_ACT_RELU, dpre, dh, pre, NULL, N * HW);
        float *rdpre = rounded(dpre, N * HW);
        fb_conv2d_backward(ref, NULL, gwc, gbc, rdpre, rx, rwc, &g, NULL);
        float got[K * HW];
        fb_array_get(a, m, FB_ARRAY_GRAD, 0, got);
        CHECK(same_bits(got, gwc, C2 * 9));
        fb_array_get(a, m, FB_ARRAY_GRAD, 1, got);
        CHECK(same_bits(got, gbc, C2));
        fb_array_get(a, m, FB_ARRAY_GRAD, 2, got);
        CHECK(same_bits(got, gw2, K * HW));
        free(rx);
        free(rwc);
        free(rw2);
        free(rh);
        free(rdl);
        free(rdpre);
    }
    printf("definition: a bf16 convolution's logits and gradients match the rounded ops bit for "
           "bit\n");
    fb_array_free(a);
    et_spec_free(specs[0]);
    et_spec_free(specs[1]);
}

/* ---- loss scaling ---- */

/* Power-of-two scaling is exact: the default scales train the same bits as
 * scales fixed at 1 that never grow. */
static void test_scaling_exact(void)
{
    fb_job_spec *specs[2] = {mlp_spec("bf16", 3e-3, 3), mlp_spec("bf16", 1e-2, 4)};
    fb_array *a = new_array(fb_backend_cpu(), specs, 2);
    fb_array *u = new_array(fb_backend_cpu(), specs, 2);
    char msg[256];
    fb_array_set_loss_scale_interval(u, (int64_t)1 << 40);
    for (int m = 0; m < 2; m++)
        CHECK_INT_EQ(fb_array_set_loss_scale(u, m, 1.0f, 0, msg, sizeof msg), FB_OK);
    CHECK(fb_array_loss_scale(a, 0) == FB_LOSS_SCALE_INIT);
    for (int s = 0; s < 40; s++) {
        float la[2], lu[2];
        train_step(a, s, la);
        train_step(u, s, lu);
        CHECK(same_bits(la, lu, 2));
    }
    for (int m = 0; m < 2; m++) {
        size_t n1, n2;
        float *p1 = member_values(a, m, FB_ARRAY_PARAM, &n1);
        float *p2 = member_values(u, m, FB_ARRAY_PARAM, &n2);
        CHECK(n1 == n2 && same_bits(p1, p2, n1));
        free(p1);
        free(p2);
        CHECK(fb_array_loss_scale(a, m) == FB_LOSS_SCALE_INIT);
        CHECK(fb_array_loss_scale(u, m) == 1.0f);
    }
    printf("scaling: 40 steps at scale 2^16 equal the unscaled run bit for bit\n");
    fb_array_free(a);
    fb_array_free(u);
    et_spec_free(specs[0]);
    et_spec_free(specs[1]);
}

/*
 * Member 1 of three gets output weights near 1e36: its logits stay finite,
 * but its loss gradient times 2^16, carried back through those weights,
 * overflows.  It must skip updates, halving its scale, until the scaled
 * gradient fits; members 0 and 2 must equal their solo runs bit for bit
 * throughout (reference backend).
 */
static void test_overflow_isolated(void)
{
    fb_backend *ref = fb_backend_cpu_ref();
    fb_job_spec *specs[3] = {mlp_spec("bf16", 1e-3, 5), mlp_spec("bf16", 1e-3, 6),
                             mlp_spec("bf16", 4e-3, 7)};
    fb_array *a = new_array(ref, specs, 3);
    fb_array *solo[3] = {new_array(ref, &specs[0], 1), NULL, new_array(ref, &specs[2], 1)};
    float w2[K * HID];
    fb_array_get(a, 1, FB_ARRAY_PARAM, 2, w2);
    for (int i = 0; i < K * HID; i++)
        w2[i] *= 1e36f;
    fb_array_set(a, 1, FB_ARRAY_PARAM, 2, w2);
    size_t np;
    float *p_before = member_values(a, 1, FB_ARRAY_PARAM, &np);
    int skipped = 0, s;
    float expect_scale = FB_LOSS_SCALE_INIT;
    for (s = 0; s < 40; s++) {
        float l[3], ls[1];
        train_step(a, s, l);
        CHECK(isfinite(l[1]));
        for (int m = 0; m < 3; m += 2) {
            train_step(solo[m], s, ls);
            CHECK(ls[0] == l[m]);
            CHECK(!fb_array_update_skipped(a, m));
            CHECK(fb_array_loss_scale(a, m) == FB_LOSS_SCALE_INIT);
        }
        if (fb_array_update_skipped(a, 1)) {
            CHECK(skipped == s); /* skips come first, then it trains */
            skipped++;
            expect_scale *= 0.5f;
            size_t n;
            float *p = member_values(a, 1, FB_ARRAY_PARAM, &n);
            float *st = member_values(a, 1, FB_ARRAY_STATE1, &n);
            CHECK(same_bits(p, p_before, np));
            for (size_t i = 0; i < n; i++)
                CHECK(st[i] == 0.0f);
            free(p);
            free(st);
        }
        CHECK(fb_array_loss_scale(a, 1) == expect_scale);
    }
    CHECK(skipped >= 1 && skipped < 40);
    size_t n;
    float *p_after = member_values(a, 1, FB_ARRAY_PARAM, &n);
    CHECK(!same_bits(p_after, p_before, np)); /* it trains once its scale fits */
    for (int m = 0; m < 3; m += 2) {
        size_t n1, n2;
        float *p1 = member_values(a, m, FB_ARRAY_PARAM, &n1);
        float *p2 = member_values(solo[m], 0, FB_ARRAY_PARAM, &n2);
        CHECK(n1 == n2 && same_bits(p1, p2, n1));
        free(p1);
        free(p2);
    }
    printf("overflow: member 1 skipped %d updates (scale now 2^%d), members 0 and 2 equal "
           "their solo runs\n",
           skipped, (int)log2f(fb_array_loss_scale(a, 1)));
    free(p_before);
    free(p_after);
    fb_array_free(a);
    fb_array_free(solo[0]);
    fb_array_free(solo[2]);
    for (int i = 0; i < 3; i++)
        et_spec_free(specs[i]);
}

/* With a growth interval of 3, scales double every 3 finite steps, each on
 * its own count; bad scales are refused and change nothing. */
static void test_growth_and_bad_input(void)
{
    fb_job_spec *specs[2] = {mlp_spec("bf16", 1e-3, 8), mlp_spec("bf16", 1e-3, 9)};
    fb_array *a = new_array(fb_backend_cpu(), specs, 2);
    char msg[256];
    fb_array_set_loss_scale_interval(a, 3);
    CHECK_INT_EQ(fb_array_set_loss_scale(a, 1, 0x1p20f, 2, msg, sizeof msg), FB_OK);
    float l[2];
    train_step(a, 0, l);
    CHECK(fb_array_loss_scale(a, 0) == 0x1p16f && fb_array_loss_scale_good(a, 0) == 1);
    CHECK(fb_array_loss_scale(a, 1) == 0x1p21f && fb_array_loss_scale_good(a, 1) == 0);
    for (int s = 1; s < 7; s++)
        train_step(a, s, l);
    CHECK(fb_array_loss_scale(a, 0) == 0x1p18f && fb_array_loss_scale_good(a, 0) == 1);
    CHECK(fb_array_loss_scale(a, 1) == 0x1p23f && fb_array_loss_scale_good(a, 1) == 0);

    const float bad_scales[] = {3.0f, 0.0f, -4.0f, 0x1p65f, 0x1p-25f, NAN, INFINITY};
    for (size_t i = 0; i < sizeof bad_scales / sizeof *bad_scales; i++) {
        msg[0] = '\0';
        CHECK_INT_EQ(fb_array_set_loss_scale(a, 0, bad_scales[i], 0, msg, sizeof msg),
                     FB_ERR_OUT_OF_RANGE);
        CHECK(strstr(msg, "power of two") != NULL);
    }
    CHECK_INT_EQ(fb_array_set_loss_scale(a, 0, 2.0f, -1, msg, sizeof msg), FB_ERR_OUT_OF_RANGE);
    CHECK_INT_EQ(fb_array_set_loss_scale(a, 0, 2.0f, 3, msg, sizeof msg), FB_ERR_OUT_OF_RANGE);
    CHECK(fb_array_loss_scale(a, 0) == 0x1p18f && fb_array_loss_scale_good(a, 0) == 1);

    fb_job_spec *f32 = mlp_spec("fp32", 1e-3, 8);
    fb_array *b = new_array(fb_backend_cpu(), &f32, 1);
    CHECK_INT_EQ(fb_array_set_loss_scale(b, 0, 2.0f, 0, msg, sizeof msg), FB_ERR_CONFLICT);
    CHECK(fb_array_loss_scale(b, 0) == 1.0f && fb_array_loss_scale_good(b, 0) == 0);
    printf("growth: scales double every 3 finite steps per member; bad scales refused\n");
    fb_array_free(a);
    fb_array_free(b);
    et_spec_free(f32);
    et_spec_free(specs[0]);
    et_spec_free(specs[1]);
}

int main(void)
{
    setvbuf(stdout, NULL, _IONBF, 0);
    ds = et_synthetic(512, SIDE, K, 11);
    test_definition();
    test_definition_conv();
    test_scaling_exact();
    test_overflow_isolated();
    test_growth_and_bad_input();
    fb_dataset_free(&ds);
    printf("ok\n");
    return 0;
}
