/*
 * Pipeline parallelism follows the single-device trajectory: a fused array
 * of B = 4 split into P = 2 stages with 4 micro-batches, and D = 2 data
 * shards x P = 2 stages (with an uneven 70/30 split), has every member's
 * loss within 1e-5 (relative) of the same array on one device over 50
 * steps, for an MLP and a conv net.  Three stages and one micro-batch too.
 * Bad input is refused without a step.
 */
#include "par_util.h"

#include "pipeline_parallel.h"

static double ref[PU_STEPS][PU_B], got[PU_STEPS][PU_B];

static fb_job_spec *mlp(int i)
{
    return et_spec("{\"name\":\"pm%d\",\"dataset\":\"synthetic\",\"model\":{\"input\":[1,%d,%d],"
                   "\"layers\":[{\"type\":\"flatten\"},{\"type\":\"linear\",\"out\":32},"
                   "{\"type\":\"relu\"},{\"type\":\"linear\",\"out\":16},{\"type\":\"tanh\"},"
                   "{\"type\":\"linear\",\"out\":%d}]},\"batch_size\":%d,\"steps\":%d,"
                   "\"optimizer\":{\"type\":\"adam\",\"lr\":%g},\"seed\":%d,\"data_seed\":3}",
                   i, PU_SIDE, PU_SIDE, PU_CLASSES, PU_BS, PU_STEPS, 0.002 * (1 + i), 31 + i);
}

static fb_job_spec *cnn(int i)
{
    return et_spec("{\"name\":\"pc%d\",\"dataset\":\"synthetic\",\"model\":{\"input\":[1,%d,%d],"
                   "\"layers\":[{\"type\":\"conv2d\",\"out\":4,\"kernel\":3,\"padding\":1},"
                   "{\"type\":\"relu\"},{\"type\":\"conv2d\",\"out\":4,\"kernel\":3,"
                   "\"padding\":1},{\"type\":\"relu\"},{\"type\":\"maxpool2d\",\"kernel\":2},"
                   "{\"type\":\"flatten\"},{\"type\":\"linear\",\"out\":%d}]},\"batch_size\":%d,"
                   "\"steps\":%d,\"optimizer\":{\"type\":\"sgd\",\"lr\":%g,\"momentum\":0.9},"
                   "\"seed\":%d,\"data_seed\":3}",
                   i, PU_SIDE, PU_SIDE, PU_CLASSES, PU_BS, PU_STEPS, 0.02 * (1 + i), 41 + i);
}

static void run_pp(const pu_specs *p, const fb_dataset *ds, int D, int P, int m,
                   const int64_t *split, const char *what)
{
    char msg[256];
    fb_device devs[8];
    CHECK_INT_EQ(fb_devices_discover(D * P, (uint64_t)1 << 30, devs, 8, msg, sizeof msg), D * P);
    fb_dp_opts o = {.bucket_bytes = 4096, .threads = 1, .slow_rank = -1};
    fb_pp *pp = NULL;
    int err = fb_pp_new(devs, D, P, m, (const fb_job_spec *const *)p->s, PU_B, PU_BS, &o, &pp, msg,
                        sizeof msg);
    if (err) fprintf(stderr, "fb_pp_new: %s\n", msg);
    CHECK_INT_EQ(err, FB_OK);
    int64_t F = (int64_t)ds->C * ds->H * ds->W;
    float *x = malloc((size_t)(PU_BS * F) * sizeof *x);
    int32_t y[PU_BS];
    float l[PU_B];
    fb_optim_hparams hp[PU_B];
    CHECK(x != NULL);
    fb_array *a = NULL; /* for the hyperparameters only */
    CHECK_INT_EQ(fb_array_new(fb_backend_cpu_ref(), (const fb_job_spec *const *)p->s, PU_B, 1, &a,
                              msg, sizeof msg),
                 FB_OK);
    for (int t = 0; t < PU_STEPS; t++) {
        pu_batch(ds, t, x, y);
        for (int b = 0; b < PU_B; b++) fb_array_hparams(a, b, t + 1, PU_STEPS, &hp[b]);
        err = fb_pp_train_step(pp, x, y, PU_BS, split, (uint64_t)t, hp, l, NULL, msg, sizeof msg);
        if (err) fprintf(stderr, "step %d: %s\n", t, msg);
        CHECK_INT_EQ(err, FB_OK);
        for (int b = 0; b < PU_B; b++) got[t][b] = l[b];
    }
    fb_pp_times tm = fb_pp_take_times(pp);
    double busy = 0;
    for (int s = 0; s < P; s++) busy += tm.busy_ms[s];
    double worst = pu_worst(got, ref, PU_STEPS);
    printf("%-34s stages at", what);
    for (int s = 0; s < P; s++) printf(" %d", fb_pp_stage_first(pp, s));
    printf(": worst relative loss error %.3g, idle share %.2f\n", worst,
           1 - busy / (P * tm.wall_ms));
    CHECK(worst <= 1e-5);
    fb_array_free(a);
    free(x);
    fb_pp_free(pp);
}

static void bad_input(const pu_specs *p, const fb_dataset *ds)
{
    char msg[256];
    fb_device devs[4];
    CHECK_INT_EQ(fb_devices_discover(4, (uint64_t)1 << 30, devs, 4, msg, sizeof msg), 4);
    fb_pp *pp = NULL;
    CHECK_INT_EQ(fb_pp_new(devs, 2, 2, 16, (const fb_job_spec *const *)p->s, PU_B, PU_BS, NULL,
                           &pp, msg, sizeof msg),
                 FB_ERR_OUT_OF_RANGE); /* 16 x 2 > 20 samples */
    CHECK(pp == NULL);
    printf("refused: %s\n", msg);
    CHECK_INT_EQ(fb_pp_new(devs, 1, 4, 2, (const fb_job_spec *const *)p->s, PU_B, PU_BS, NULL, &pp,
                           msg, sizeof msg),
                 FB_ERR_OUT_OF_RANGE); /* 3 cuts, the MLP has 2 places */
    CHECK(pp == NULL);
    printf("refused: %s\n", msg);
    CHECK_INT_EQ(fb_pp_new(devs, 2, 2, 2, (const fb_job_spec *const *)p->s, PU_B, PU_BS, NULL, &pp,
                           msg, sizeof msg),
                 FB_OK);
    int64_t F = (int64_t)ds->C * ds->H * ds->W;
    float *x = calloc((size_t)(PU_BS * F), sizeof *x);
    int32_t y[PU_BS] = {0};
    float l[PU_B] = {-1, -1, -1, -1};
    fb_optim_hparams hp[PU_B];
    memset(hp, 0, sizeof hp);
    int64_t bad_split[2] = {15, 4};
    CHECK_INT_EQ(fb_pp_train_step(pp, x, y, PU_BS, bad_split, 0, hp, l, NULL, msg, sizeof msg),
                 FB_ERR_OUT_OF_RANGE);
    CHECK_INT_EQ(fb_pp_train_step(pp, x, y, PU_BS - 1, NULL, 0, hp, l, NULL, msg, sizeof msg),
                 FB_ERR_OUT_OF_RANGE);
    y[3] = -2;
    CHECK_INT_EQ(fb_pp_train_step(pp, x, y, PU_BS, NULL, 0, hp, l, NULL, msg, sizeof msg), FB_ERR_DATA);
    CHECK(strstr(msg, "sample 3") != NULL);
    for (int b = 0; b < PU_B; b++) CHECK(l[b] == -1);
    free(x);
    fb_pp_free(pp);
    fb_pp_free(NULL);
}

int main(void)
{
    fb_dataset ds = et_synthetic(200, PU_SIDE, PU_CLASSES, 5);
    pu_specs p;
    for (int i = 0; i < PU_B; i++) p.s[i] = mlp(i);
    pu_reference(&p, &ds, PU_STEPS, ref);
    CHECK(fabs(ref[PU_STEPS - 1][0] - ref[0][0]) > 1e-2);
    int64_t split[2] = {14, 6};
    run_pp(&p, &ds, 1, 2, 4, NULL, "mlp P=2 m=4");
    run_pp(&p, &ds, 2, 2, 4, split, "mlp D=2 x P=2 m=4, split 70/30");
    run_pp(&p, &ds, 1, 3, 1, NULL, "mlp P=3 m=1");
    bad_input(&p, &ds);
    pu_free(&p);

    for (int i = 0; i < PU_B; i++) p.s[i] = cnn(i);
    pu_reference(&p, &ds, PU_STEPS, ref);
    run_pp(&p, &ds, 1, 2, 4, NULL, "conv P=2 m=4");
    run_pp(&p, &ds, 2, 2, 4, split, "conv D=2 x P=2 m=4, split 70/30");
    pu_free(&p);
    free(ds.x);
    free(ds.y);
    printf("ok\n");
    return 0;
}
