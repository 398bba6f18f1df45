/*
 * Bucketed all-reduce: every rank hands over the same collectives in the
 * same order (reverse layer order, bucket by bucket), a small bucket gives
 * several collectives per step, a deliberately slow rank neither deadlocks
 * nor changes any result (bit for bit), and neither does turning overlap
 * off.  Bad input (a split that does not add up, an empty shard, a label
 * outside the outputs, bad options) gets a clear error and changes nothing.
 * A broadcast copies replica 0's state to the others.
 */
#include "par_util.h"

#define STEPS 12
#define MAXC 64

static double base[STEPS][PU_B], got[STEPS][PU_B];

static void same_collectives(fb_dp *dp, int min_count)
{
    size_t s0[MAXC], s1[MAXC];
    int n0 = fb_dp_last_collectives(dp, 0, s0, MAXC);
    int n1 = fb_dp_last_collectives(dp, 1, s1, MAXC);
    CHECK_INT_EQ(n0, n1);
    CHECK(n0 >= min_count && n0 <= MAXC);
    for (int k = 0; k < n0; k++) CHECK_INT_EQ(s0[k], s1[k]);
}

static void check_identical(const char *what)
{
    for (int t = 0; t < STEPS; t++)
        for (int b = 0; b < PU_B; b++) {
            if (got[t][b] != base[t][b])
                fprintf(stderr, "%s: step %d member %d: %.9g != %.9g\n", what, t, b, got[t][b],
                        base[t][b]);
            CHECK(got[t][b] == base[t][b]);
        }
    printf("%s: identical to the undisturbed run\n", what);
}

/* Copies every parameter of every member of replica d. */
static float *snapshot(fb_dp *dp, int d, size_t *n_out)
{
    fb_array *a = fb_dp_array(dp, d);
    size_t total = 0;
    int T = fb_array_tensor_count(a, FB_ARRAY_PARAM);
    for (int t = 0; t < T; t++) total += fb_array_tensor_at(a, FB_ARRAY_PARAM, t).numel;
    float *v = malloc(total * PU_B * sizeof *v), *at = v;
    CHECK(v != NULL);
    for (int m = 0; m < PU_B; m++)
        for (int t = 0; t < T; t++) {
            fb_array_get(a, m, FB_ARRAY_PARAM, t, at);
            at += fb_array_tensor_at(a, FB_ARRAY_PARAM, t).numel;
        }
    *n_out = total * PU_B;
    return v;
}

static void bad_input(const pu_specs *p, const fb_dataset *ds)
{
    char msg[256];
    fb_device devs[2];
    pu_devices(devs, 2);
    fb_dp *dp = NULL;
    fb_dp_opts bad = {.bucket_bytes = 1, .slow_rank = -1};
    CHECK_INT_EQ(fb_dp_new(devs, 2, (const fb_job_spec *const *)p->s, PU_B, PU_BS, &bad, &dp, msg,
                           sizeof msg),
                 FB_ERR_OUT_OF_RANGE);
    CHECK(dp == NULL && strstr(msg, "bucket") != NULL);
    CHECK_INT_EQ(fb_dp_new(devs, 0, (const fb_job_spec *const *)p->s, PU_B, PU_BS, NULL, &dp, msg,
                           sizeof msg),
                 FB_ERR_OUT_OF_RANGE);
    CHECK(dp == NULL);
    CHECK_INT_EQ(fb_dp_new(devs, 2, (const fb_job_spec *const *)p->s, PU_B, PU_BS, NULL, &dp, msg,
                           sizeof msg),
                 FB_OK);
    int64_t F = (int64_t)ds->C * ds->H * ds->W;
    float *x = malloc((size_t)(PU_BS * F) * sizeof *x);
    int32_t y[PU_BS];
    CHECK(x != NULL);
    pu_batch(ds, 0, x, y);
    size_t n_before, n_after;
    float *before = snapshot(dp, 0, &n_before);
    float loss[PU_B] = {-1, -1, -1, -1};

    int64_t wrong_sum[2] = {10, 9};
    CHECK_INT_EQ(fb_dp_forward_backward(dp, x, y, PU_BS, wrong_sum, 0, loss, NULL, msg, sizeof msg),
                 FB_ERR_OUT_OF_RANGE);
    printf("bad split: %s\n", msg);
    CHECK(strstr(msg, "adds up") != NULL);
    int64_t empty[2] = {0, PU_BS};
    CHECK_INT_EQ(fb_dp_forward_backward(dp, x, y, PU_BS, empty, 0, loss, NULL, msg, sizeof msg),
                 FB_ERR_OUT_OF_RANGE);
    printf("empty shard: %s\n", msg);
    CHECK(strstr(msg, "shard 0") != NULL);
    int64_t negative[2] = {-5, PU_BS + 5};
    CHECK_INT_EQ(fb_dp_forward_backward(dp, x, y, PU_BS, negative, 0, loss, NULL, msg, sizeof msg),
                 FB_ERR_OUT_OF_RANGE);
    y[7] = PU_CLASSES;
    CHECK_INT_EQ(fb_dp_forward_backward(dp, x, y, PU_BS, NULL, 0, loss, NULL, msg, sizeof msg),
                 FB_ERR_DATA);
    printf("bad label: %s\n", msg);
    CHECK(strstr(msg, "sample 7") != NULL);
    for (int b = 0; b < PU_B; b++) CHECK(loss[b] == -1); /* outputs untouched */
    float *after = snapshot(dp, 0, &n_after);
    CHECK_INT_EQ(n_before, n_after);
    CHECK(memcmp(before, after, n_before * sizeof *before) == 0);
    free(after);

    /* a state changed on replica 0 alone reaches the other replica by broadcast */
    fb_array *a0 = fb_dp_array(dp, 0), *a1 = fb_dp_array(dp, 1);
    size_t n0 = fb_array_tensor_at(a0, FB_ARRAY_PARAM, 0).numel;
    float *v = malloc(n0 * sizeof *v), *w = malloc(n0 * sizeof *w);
    CHECK(v && w);
    for (size_t i = 0; i < n0; i++) v[i] = 0.25f + (float)i;
    fb_array_set(a0, 2, FB_ARRAY_PARAM, 0, v);
    fb_array_set(a0, 2, FB_ARRAY_STATE1, 0, v);
    fb_array_get(a1, 2, FB_ARRAY_PARAM, 0, w);
    CHECK(memcmp(v, w, n0 * sizeof *v) != 0);
    CHECK_INT_EQ(fb_dp_broadcast(dp, msg, sizeof msg), FB_OK);
    fb_array_get(a1, 2, FB_ARRAY_PARAM, 0, w);
    CHECK(memcmp(v, w, n0 * sizeof *v) == 0);
    fb_array_get(a1, 2, FB_ARRAY_STATE1, 0, w);
    CHECK(memcmp(v, w, n0 * sizeof *v) == 0);
    free(v);
    free(w);

    /* the group still trains after the refusals */
    y[7] = 0;
    CHECK_INT_EQ(fb_dp_forward_backward(dp, x, y, PU_BS, NULL, 0, loss, NULL, msg, sizeof msg),
                 FB_OK);
    for (int b = 0; b < PU_B; b++) CHECK(isfinite(loss[b]) && loss[b] > 0);
    free(before);
    free(x);
    fb_dp_free(dp);
    fb_dp_free(NULL);
}

int main(void)
{
    fb_dataset ds = et_synthetic(120, PU_SIDE, PU_CLASSES, 9);
    pu_specs mlp = pu_make(false), cnn = pu_make(true);
    fb_dp *dp = NULL;

    /* 2 KiB buckets: the MLP's 4 members' gradients (about 25 KB) make several */
    fb_dp_opts o = {.bucket_bytes = 2048, .threads = 1, .slow_rank = -1};
    pu_dp_run(&mlp, &ds, STEPS, 2, &o, NULL, base, &dp);
    same_collectives(dp, 3);
    size_t sizes[MAXC];
    int n = fb_dp_last_collectives(dp, 0, sizes, MAXC);
    printf("mlp, 2 KiB buckets: %d collectives of", n);
    for (int k = 0; k < n; k++) printf(" %zu", sizes[k]);
    printf(" floats\n");
    /* reverse layer order: the last linear layer (16 -> 5, x4 members: 320 + 20
     * floats) is in the first bucket, which holds at least 2 KiB */
    CHECK(sizes[0] * sizeof(float) >= 2048 || n == 1);
    fb_dp_free(dp);

    fb_dp_opts slow = o;
    slow.slow_rank = 1;
    slow.slow_us = 3000;
    pu_dp_run(&mlp, &ds, STEPS, 2, &slow, NULL, got, &dp);
    same_collectives(dp, 3);
    fb_dp_free(dp);
    check_identical("mlp with rank 1 slowed down");
    slow.slow_rank = 0;
    pu_dp_run(&mlp, &ds, STEPS, 2, &slow, NULL, got, NULL);
    check_identical("mlp with rank 0 slowed down");

    fb_dp_opts serial = o;
    serial.no_overlap = true;
    pu_dp_run(&mlp, &ds, STEPS, 2, &serial, NULL, got, NULL);
    check_identical("mlp with overlap off");

    fb_dp_opts one = o;
    one.bucket_bytes = (size_t)1 << 30;
    pu_dp_run(&mlp, &ds, STEPS, 2, &one, NULL, got, &dp);
    same_collectives(dp, 1);
    CHECK_INT_EQ(fb_dp_last_collectives(dp, 0, sizes, MAXC), 1);
    fb_dp_free(dp);
    check_identical("mlp with one bucket");

    /* synchronised batch norm adds its own collectives in forward and
     * backward; they interleave with the buckets identically on every rank,
     * also with a straggler */
    fb_dp_opts sync = o;
    sync.sync_bn = true;
    pu_dp_run(&cnn, &ds, STEPS, 2, &sync, NULL, base, &dp);
    same_collectives(dp, 4);
    fb_dp_free(dp);
    sync.slow_rank = 1;
    sync.slow_us = 3000;
    pu_dp_run(&cnn, &ds, STEPS, 2, &sync, NULL, got, &dp);
    same_collectives(dp, 4);
    fb_dp_free(dp);
    check_identical("conv+bn (synchronised) with rank 1 slowed down");

    bad_input(&mlp, &ds);

    pu_free(&mlp);
    pu_free(&cnn);
    free(ds.x);
    free(ds.y);
    printf("ok\n");
    return 0;
}
