/*
 * Members leave a session without disturbing the others (session.h).
 *
 * An MLP with dropout under Adam, B = 3 members on a shuffled in-memory
 * dataset, 30 steps:
 *   - detach: member 1 detached after step 10 is gone at once (no further
 *     event, no checkpoint, no restore); members 0 and 2 end as in a run
 *     where member 1 never was, within the fusion tolerance of tests/engine
 *     (losses relative 1e-5, weights normalised 1e-4: the GEMMs change shape
 *     with B, so sums may round differently; both errors are printed);
 *   - divergence: member 1 with a learning rate of 1e30 (past what a spec
 *     accepts, set in memory) produces a non-finite loss; it fails alone with
 *     exactly one FB_TRAIN_FAILED event (FB_ERR_DIVERGED, "loss is ... at
 *     step N") and no done event, and members 0 and 2 end as in the run
 *     without it, within the same tolerance; through fb_train_run the run
 *     succeeds with member 1's final loss NaN;
 *   - parameters that become non-finite in a member's last update (a
 *     learning rate that is infinite in float) fail it too ("parameters are
 *     not finite after step 1"), and no final weights file is written for it;
 *   - fb_session_take_times counts the steps and resets.
 */
#include "session_util.h"

#include "train.h"

#define N_TRAIN 160
#define N_TEST 48
#define SIDE 8
#define CLASSES 5
#define BS 16
#define STEPS 30
#define DETACH_AT 10

#define LOSS_TOL 1e-5
#define WEIGHT_TOL 1e-4

static fb_dataset train, test;

static fb_job_spec *member(int i, int steps)
{
    return et_spec("{\"name\":\"m%d\",\"dataset\":\"synthetic\",\"model\":{\"input\":[1,%d,%d],"
                   "\"layers\":[{\"type\":\"flatten\"},{\"type\":\"linear\",\"out\":24},"
                   "{\"type\":\"relu\"},{\"type\":\"dropout\",\"p\":0.2},"
                   "{\"type\":\"linear\",\"out\":5}]},\"batch_size\":%d,\"steps\":%d,"
                   "\"optimizer\":{\"type\":\"adam\",\"lr\":%g},"
                   "\"schedule\":{\"type\":\"cosine\"},\"seed\":%d,\"data_seed\":4,"
                   "\"eval_every\":10}",
                   i, SIDE, SIDE, BS, steps, 0.004 * (1 + i), 40 + i);
}

/* Members `ours` of run `a` against members 0.. of the reference run `ref`:
 * prints and checks the worst loss and weight errors. */
static void compare_runs(const char *what, const su_log *a, const int *ours, int n,
                         const su_log *ref)
{
    double worst_loss = 0, worst_weight = 0, worst_abs = 0;
    bool identical = true;
    for (int k = 0; k < n; k++) {
        int m = ours[k];
        CHECK_INT_EQ(a->dones[m], 1);
        CHECK_INT_EQ(ref->dones[k], 1);
        for (int st = 1; st <= STEPS; st++) {
            double x = a->loss[m][st], y = ref->loss[k][st];
            CHECK(isfinite(x) && isfinite(y));
            worst_loss = fmax(worst_loss, fabs(x - y) / fmax(fabs(y), 1e-12));
            identical &= x == y;
        }
        double max_abs;
        double w = su_compare(a->done[m].data, a->done[m].len, ref->done[k].data, ref->done[k].len,
                              &max_abs);
        worst_weight = fmax(worst_weight, w);
        worst_abs = fmax(worst_abs, max_abs);
        identical &= max_abs == 0;
    }
    printf("%s: survivors vs the run without the member: losses %.3g (relative, bound %g), "
           "weights %.3g (normalised, bound %g), max abs diff %.3g%s\n",
           what, worst_loss, LOSS_TOL, worst_weight, WEIGHT_TOL, worst_abs,
           identical ? " (bit-identical)" : "");
    CHECK(worst_loss <= LOSS_TOL);
    CHECK(worst_weight <= WEIGHT_TOL);
}

static void test_detach_and_divergence(void)
{
    fb_job_spec *specs[3] = {member(0, STEPS), member(1, STEPS), member(2, STEPS)};
    fb_job_spec *pair[2] = {specs[0], specs[2]};
    static su_log ref, run;
    char msg[512];

    /* the reference: members 0 and 2 only */
    su_log_init(&ref);
    fb_session *s = su_open(pair, 2, &train, &test, 0, NULL, true, &ref);
    su_step_to(s, -1);
    fb_session_free(s);

    /* detach member 1 after step 10 */
    su_log_init(&run);
    s = su_open(specs, 3, &train, &test, 0, NULL, true, &run);
    su_step_to(s, DETACH_AT);
    fb_session_times t = fb_session_take_times(s);
    CHECK_INT_EQ(t.steps, DETACH_AT);
    CHECK(t.compute_ms > 0 && t.io_ms >= 0 && t.other_ms >= 0);
    t = fb_session_take_times(s);
    CHECK_INT_EQ(t.steps, 0);
    CHECK(t.compute_ms == 0 && t.io_ms == 0 && t.other_ms == 0);
    fb_session_detach(s, 1);
    CHECK(!fb_session_has(s, 1));
    CHECK(fb_session_has(s, 0) && fb_session_has(s, 2));
    CHECK_INT_EQ(fb_session_size(s), 2);
    fb_session_detach(s, 1); /* again, and members that never were: no-ops */
    fb_session_detach(s, 7);
    fb_session_detach(s, -1);
    CHECK_INT_EQ(fb_session_size(s), 2);
    void *buf = NULL;
    size_t len = 0;
    CHECK_INT_EQ(fb_session_checkpoint(s, 1, &buf, &len, msg, sizeof msg), FB_ERR_NOT_FOUND);
    CHECK(buf == NULL && len == 0);
    CHECK_INT_EQ(fb_session_model(s, 1, &buf, &len, msg, sizeof msg), FB_ERR_NOT_FOUND);
    void *ck0 = su_checkpoint(s, 0, &len);
    CHECK_INT_EQ(fb_session_restore(s, 1, ck0, len, msg, sizeof msg), FB_ERR_NOT_FOUND);
    free(ck0);
    su_step_to(s, -1);
    t = fb_session_take_times(s);
    CHECK_INT_EQ(t.steps, STEPS - DETACH_AT);
    CHECK(fb_session_done(s));
    fb_session_free(s);
    CHECK_INT_EQ(run.steps[1], DETACH_AT); /* nothing after it left */
    CHECK_INT_EQ(run.dones[1], 0);
    CHECK_INT_EQ(run.failures[1], 0);
    CHECK(isnan(run.loss[1][DETACH_AT + 1]));
    const int survivors[2] = {0, 2};
    compare_runs("detach", &run, survivors, 2, &ref);
    su_log_free(&run);

    /* member 1 diverges */
    specs[1]->optim.lr = 1e30;
    su_log_init(&run);
    s = su_open(specs, 3, &train, &test, 0, NULL, true, &run);
    su_step_to(s, -1);
    fb_session_free(s);
    CHECK_INT_EQ(run.failures[0] + run.failures[1] + run.failures[2], 1);
    CHECK_INT_EQ(run.failures[1], 1);
    CHECK_INT_EQ(run.failed_err[1], FB_ERR_DIVERGED);
    CHECK_INT_EQ(run.dones[1], 0);
    char want[64];
    snprintf(want, sizeof want, " at step %lld", (long long)run.failed_step[1]);
    printf("divergence: member 1 failed at step %lld: %s\n", (long long)run.failed_step[1],
           run.failed_text[1]);
    CHECK(strncmp(run.failed_text[1], "loss is ", 8) == 0);
    CHECK(strstr(run.failed_text[1], want) != NULL);
    CHECK(run.failed_step[1] >= 2 && run.failed_step[1] < STEPS);
    /* its last step event is before the failure; none after */
    CHECK_INT_EQ(run.steps[1], run.failed_step[1] - 1);
    compare_runs("divergence", &run, survivors, 2, &ref);
    su_log_free(&run);

    /* the same through fb_train_run: it succeeds, member 1 has no result */
    double fl[3], fa[3];
    fb_train_opts o = {.log_every = 0};
    int err = fb_train_run(fb_backend_cpu(), (const fb_job_spec *const *)specs, 3, &train, &test,
                           &o, fl, fa, msg, sizeof msg);
    if (err) fprintf(stderr, "fb_train_run: %s\n", msg);
    CHECK_INT_EQ(err, FB_OK);
    CHECK(isnan(fl[1]) && isnan(fa[1]));
    CHECK(isfinite(fl[0]) && isfinite(fl[2]) && isfinite(fa[0]) && isfinite(fa[2]));

    su_log_free(&ref);
    for (int i = 0; i < 3; i++)
        et_spec_free(specs[i]);
}

static void test_parameters_not_finite(void)
{
    fb_job_spec *specs[2] = {member(0, 5), member(1, 1)};
    specs[1]->optim.lr = 1e39; /* infinite once it is a float */
    char dir[512];
    et_tmpdir(dir, sizeof dir, "session-inf");
    static su_log run;
    su_log_init(&run);
    fb_session *s = su_open(specs, 2, &train, NULL, 0, dir, false, &run);
    su_step_to(s, -1);
    fb_session_free(s);
    CHECK_INT_EQ(run.failures[1], 1);
    CHECK_INT_EQ(run.failed_err[1], FB_ERR_DIVERGED);
    CHECK_STR_EQ(run.failed_text[1], "parameters are not finite after step 1");
    CHECK_INT_EQ(run.dones[1], 0);
    CHECK_INT_EQ(run.dones[0], 1);
    CHECK_INT_EQ(run.failures[0], 0);
    char path[1024];
    snprintf(path, sizeof path, "%s/m1.safetensors", dir);
    CHECK(access(path, F_OK) != 0);
    snprintf(path, sizeof path, "%s/m0.safetensors", dir);
    CHECK(access(path, F_OK) == 0);
    printf("non-finite parameters: member 1 failed: %s\n", run.failed_text[1]);
    su_log_free(&run);
    et_rmtree(dir);
    et_spec_free(specs[0]);
    et_spec_free(specs[1]);
}

int main(void)
{
    train = et_synthetic(N_TRAIN, SIDE, CLASSES, 5);
    test = et_synthetic(N_TEST, SIDE, CLASSES, 6);
    test_detach_and_divergence();
    test_parameters_not_finite();
    fb_dataset_free(&train);
    fb_dataset_free(&test);
    return 0;
}
