/*
 * Data parallelism follows the single-device trajectory: a fused array of
 * B = 4 trained on D = 2 CPU devices with an even split, an uneven 70/30
 * split and a split that changes mid-run has every member's loss within
 * 1e-5 (relative) of the same array on one device over 50 steps; a conv +
 * batch-norm array does too with synchronised batch norm, and (the check
 * that the comparison can fail) does not with per-device statistics.  The
 * replicas stay bit-identical.
 */
#include "par_util.h"

static double ref_mlp[PU_STEPS][PU_B], ref_cnn[PU_STEPS][PU_B], got[PU_STEPS][PU_B];

static void split_70_30(int t, int64_t *s)
{
    (void)t;
    s[0] = PU_BS * 7 / 10;
    s[1] = PU_BS - s[0];
}

/* even, then 30/70 from step 17, then 85/15 from step 34 (a REBALANCE) */
static void split_changing(int t, int64_t *s)
{
    int first = t < 17 ? PU_BS / 2 : t < 34 ? PU_BS * 3 / 10 : PU_BS * 85 / 100;
    s[0] = first;
    s[1] = PU_BS - first;
}

static void check_replicas_equal(fb_dp *dp)
{
    fb_array *a0 = fb_dp_array(dp, 0), *a1 = fb_dp_array(dp, 1);
    size_t big = fb_array_member_params(a0);
    float *v0 = malloc(big * sizeof *v0), *v1 = malloc(big * sizeof *v1);
    CHECK(v0 && v1);
    for (int m = 0; m < PU_B; m++)
        for (int t = 0; t < fb_array_tensor_count(a0, FB_ARRAY_PARAM); t++) {
            size_t n = fb_array_tensor_at(a0, FB_ARRAY_PARAM, t).numel;
            fb_array_get(a0, m, FB_ARRAY_PARAM, t, v0);
            fb_array_get(a1, m, FB_ARRAY_PARAM, t, v1);
            CHECK(memcmp(v0, v1, n * sizeof *v0) == 0);
        }
    free(v0);
    free(v1);
}

static void report(const char *what, double worst, double bound, bool below)
{
    printf("%-44s worst relative loss error %.3g (%s %.0e)\n", what, worst,
           below ? "must be <=" : "must be >", bound);
    if (below)
        CHECK(worst <= bound);
    else
        CHECK(worst > bound);
}

int main(void)
{
    fb_dataset ds = et_synthetic(200, PU_SIDE, PU_CLASSES, 5);
    pu_specs mlp = pu_make(false), cnn = pu_make(true);
    pu_reference(&mlp, &ds, PU_STEPS, ref_mlp);
    pu_reference(&cnn, &ds, PU_STEPS, ref_cnn);
    /* the trajectory moves: a comparison against a constant would pass anyway */
    CHECK(fabs(ref_mlp[PU_STEPS - 1][0] - ref_mlp[0][0]) > 1e-2);
    CHECK(fabs(ref_cnn[PU_STEPS - 1][0] - ref_cnn[0][0]) > 1e-2);

    fb_dp_opts o = {.bucket_bytes = 2048, .threads = 1, .slow_rank = -1};
    fb_dp *dp = NULL;
    pu_dp_run(&mlp, &ds, PU_STEPS, 2, &o, NULL, got, &dp);
    report("mlp D=2 even", pu_worst(got, ref_mlp, PU_STEPS), 1e-5, true);
    check_replicas_equal(dp);
    fb_dp_free(dp);

    pu_dp_run(&mlp, &ds, PU_STEPS, 2, &o, split_70_30, got, NULL);
    report("mlp D=2 70/30", pu_worst(got, ref_mlp, PU_STEPS), 1e-5, true);

    pu_dp_run(&mlp, &ds, PU_STEPS, 2, &o, split_changing, got, NULL);
    report("mlp D=2 split 50/50 -> 30/70 -> 85/15", pu_worst(got, ref_mlp, PU_STEPS), 1e-5, true);

    fb_dp_opts sync = o;
    sync.sync_bn = true;
    pu_dp_run(&cnn, &ds, PU_STEPS, 2, &sync, split_70_30, got, &dp);
    report("conv+bn D=2 70/30, synchronised batch norm", pu_worst(got, ref_cnn, PU_STEPS), 1e-5,
           true);
    check_replicas_equal(dp);
    fb_dp_free(dp);

    pu_dp_run(&cnn, &ds, PU_STEPS, 2, &sync, split_changing, got, NULL);
    report("conv+bn D=2 changing split, synchronised bn", pu_worst(got, ref_cnn, PU_STEPS), 1e-5,
           true);

    pu_dp_run(&cnn, &ds, PU_STEPS, 2, &o, split_70_30, got, NULL);
    report("conv+bn D=2 70/30, per-device batch norm", pu_worst(got, ref_cnn, PU_STEPS), 1e-5,
           false);

    pu_free(&mlp);
    pu_free(&cnn);
    free(ds.x);
    free(ds.y);
    printf("ok\n");
    return 0;
}
