/*
 * The training session on two CPU devices, and on D = 2 x P = 2 devices with
 * pipeline stages: every member of a B = 4 array
 * (members with different step counts, so one leaves mid-run) logs the same
 * losses as on one device within 1e-5 while the split changes between steps
 * (as REBALANCE does), a member detached mid-run leaves both replicas, and a
 * checkpoint taken on two devices resumes on one device exactly where the
 * two-device run goes on.  The pipeline session logs the same losses too,
 * loses a member mid-run, and its checkpoint (gathered from the stages)
 * resumes on one device.  A bad split is refused and changes nothing.
 */
#include "session/session_util.h"

#include "device.h"
#include "data_parallel.h"

#define SIDE 6
#define BS 16
#define STEPS 40

static fb_job_spec *member(int i, double dropout)
{
    return et_spec("{\"name\":\"m%d\",\"dataset\":\"synthetic\",\"model\":{\"input\":[1,%d,%d],"
                   "\"layers\":[{\"type\":\"flatten\"},{\"type\":\"linear\",\"out\":24},"
                   "{\"type\":\"relu\"},{\"type\":\"dropout\",\"p\":%g},"
                   "{\"type\":\"linear\",\"out\":5}]},\"batch_size\":%d,\"steps\":%d,"
                   "\"optimizer\":{\"type\":\"adamw\",\"lr\":%g},"
                   "\"schedule\":{\"type\":\"cosine\"},\"seed\":%d,\"data_seed\":4,"
                   "\"checkpoint_every\":20}",
                   i, SIDE, SIDE, dropout, BS, i == 3 ? STEPS / 2 : STEPS, 0.003 * (1 + i), 60 + i);
}

static fb_session *open_dp(fb_job_spec *const *specs, const fb_dataset *train, int64_t start,
                           su_log *log, const int64_t *split, int P)
{
    fb_device devs[4];
    char msg[512];
    CHECK_INT_EQ(fb_devices_discover(2 * P, (uint64_t)1 << 30, devs, 4, msg, sizeof msg), 2 * P);
    fb_dp_opts dpo = {.bucket_bytes = 1024, .threads = 1, .slow_rank = -1};
    fb_train_opts o = {.log_every = 1,
                       .cb = su_record,
                       .user = log,
                       .start_step = start,
                       .blobs = true,
                       .devices = devs,
                       .n_devices = 2 * P,
                       .split = split,
                       .dp = &dpo,
                       .pipeline = P,
                       .micro_batches = 4};
    fb_session *s = NULL;
    int err = fb_session_new(&s, fb_backend_cpu(), (const fb_job_spec *const *)specs, 4, train,
                             NULL, &o, msg, sizeof msg);
    if (err) fprintf(stderr, "fb_session_new: %s\n", msg);
    CHECK_INT_EQ(err, FB_OK);
    CHECK_INT_EQ(fb_session_devices(s), 2 * P);
    CHECK_INT_EQ(fb_session_shards(s), 2);
    return s;
}

static double worst_loss(const su_log *a, const su_log *ref, int from)
{
    double worst = 0;
    for (int m = 0; m < 4; m++)
        for (int t = from; t <= STEPS; t++) {
            double r = ref->loss[m][t], g = a->loss[m][t];
            if (isnan(r)) {
                CHECK(isnan(g));
                continue;
            }
            CHECK(isfinite(g));
            worst = fmax(worst, fabs(g - r) / fmax(fabs(r), 1e-12));
        }
    return worst;
}

int main(void)
{
    fb_dataset train = et_synthetic(160, SIDE, 5, 2);
    fb_job_spec *specs[4];
    for (int i = 0; i < 4; i++) specs[i] = member(i, 0.2);
    char msg[512];

    static su_log ref, par, resumed;
    su_log_init(&ref);
    su_log_init(&par);
    su_log_init(&resumed);
    fb_session *one = su_open(specs, 4, &train, NULL, 0, NULL, true, &ref);
    CHECK_INT_EQ(fb_session_devices(one), 1);
    su_step_to(one, -1);
    fb_session_free(one);
    CHECK_INT_EQ(ref.dones[3], 1);

    int64_t uneven[2] = {11, 5};
    fb_session *two = open_dp(specs, &train, 0, &par, uneven, 1);
    su_step_to(two, 13);
    /* a bad split is refused and the old one stays */
    int64_t bad[2] = {16, 0}, bad3[3] = {6, 5, 5}, bad_sum[2] = {8, 9};
    CHECK_INT_EQ(fb_session_set_split(two, bad, 2, msg, sizeof msg), FB_ERR_OUT_OF_RANGE);
    CHECK_INT_EQ(fb_session_set_split(two, bad3, 3, msg, sizeof msg), FB_ERR_OUT_OF_RANGE);
    CHECK_INT_EQ(fb_session_set_split(two, bad_sum, 2, msg, sizeof msg), FB_ERR_OUT_OF_RANGE);
    printf("refused: %s\n", msg);
    int64_t rebalanced[2] = {4, 12};
    CHECK_INT_EQ(fb_session_set_split(two, rebalanced, 2, msg, sizeof msg), FB_OK);
    su_step_to(two, 20);
    size_t ck_len;
    void *ck = su_checkpoint(two, 0, &ck_len);
    su_step_to(two, -1);
    fb_session_times t = fb_session_take_times(two);
    printf("two devices: %lld steps, compute %.2f ms, comm %.2f ms, idle %.2f ms per step\n",
           (long long)t.steps, t.compute_ms / t.steps, t.comm_ms / t.steps, t.idle_ms / t.steps);
    CHECK_INT_EQ(t.devices, 2);
    CHECK(t.compute_ms > 0 && t.comm_ms >= 0 && t.idle_ms >= 0);
    fb_session_free(two);
    CHECK_INT_EQ(par.dones[3], 1); /* member 3 left at step 20, from both replicas */
    double w = worst_loss(&par, &ref, 1);
    printf("two devices, split 11/5 then 4/12: worst relative loss error %.3g\n", w);
    CHECK(w <= 1e-5);

    /* a two-device checkpoint resumes on one device */
    fb_session *back = su_open(specs, 3, &train, NULL, 20, NULL, true, &resumed);
    su_restore(back, 0, ck, ck_len);
    su_step_to(back, -1);
    fb_session_free(back);
    double wr = 0;
    for (int t2 = 21; t2 <= STEPS; t2++)
        wr = fmax(wr, fabs(resumed.loss[0][t2] - ref.loss[0][t2]) / fabs(ref.loss[0][t2]));
    printf("resumed on one device from step 20: worst relative loss error %.3g\n", wr);
    CHECK(wr <= 1e-5);
    free(ck);

    /* opening with a bad split fails cleanly */
    fb_device devs[2];
    CHECK_INT_EQ(fb_devices_discover(2, (uint64_t)1 << 30, devs, 2, msg, sizeof msg), 2);
    int64_t wrong[2] = {10, 10};
    fb_train_opts o = {.devices = devs, .n_devices = 2, .split = wrong};
    fb_session *s = NULL;
    CHECK_INT_EQ(fb_session_new(&s, fb_backend_cpu(), (const fb_job_spec *const *)specs, 4,
                                &train, NULL, &o, msg, sizeof msg),
                 FB_ERR_OUT_OF_RANGE);
    CHECK(s == NULL);
    printf("refused at open: %s\n", msg);

    /* pipeline: 2 shards x 2 stages, 4 micro-batches; no dropout (stages after the first
     * draw their own masks, pipeline_parallel.h) */
    for (int i = 0; i < 4; i++) {
        et_spec_free(specs[i]);
        specs[i] = member(i, 0);
    }
    su_log_free(&ref);
    su_log_free(&par);
    su_log_free(&resumed);
    one = su_open(specs, 4, &train, NULL, 0, NULL, true, &ref);
    su_step_to(one, -1);
    fb_session_free(one);
    fb_session *pipe = open_dp(specs, &train, 0, &par, uneven, 2);
    su_step_to(pipe, 11);
    CHECK_INT_EQ(fb_session_set_split(pipe, rebalanced, 2, msg, sizeof msg), FB_OK);
    fb_session_detach(pipe, 2);
    su_step_to(pipe, 20);
    ck = su_checkpoint(pipe, 1, &ck_len);
    su_step_to(pipe, -1);
    t = fb_session_take_times(pipe);
    printf("pipeline: compute %.2f ms, idle (bubble) %.2f ms per step\n", t.compute_ms / t.steps,
           t.idle_ms / t.steps);
    CHECK(t.compute_ms > 0 && t.idle_ms > 0);
    fb_session_free(pipe);
    CHECK_INT_EQ(par.dones[2], 0);
    CHECK_INT_EQ(par.dones[3], 1);
    for (int t2 = 12; t2 <= STEPS; t2++) par.loss[2][t2] = ref.loss[2][t2] = NAN;
    w = worst_loss(&par, &ref, 1);
    printf("2 shards x 2 stages, split 11/5 then 4/12, member 2 detached: worst relative loss "
           "error %.3g\n", w);
    CHECK(w <= 1e-5);
    back = su_open(&specs[1], 1, &train, NULL, 20, NULL, true, &resumed);
    su_restore(back, 0, ck, ck_len);
    su_step_to(back, -1);
    fb_session_free(back);
    wr = 0;
    for (int t2 = 21; t2 <= STEPS; t2++)
        wr = fmax(wr, fabs(resumed.loss[0][t2] - ref.loss[1][t2]) / fabs(ref.loss[1][t2]));
    printf("pipeline checkpoint resumed on one device: worst relative loss error %.3g\n", wr);
    CHECK(wr <= 1e-5);
    free(ck);

    su_log_free(&ref);
    su_log_free(&par);
    su_log_free(&resumed);
    for (int i = 0; i < 4; i++) et_spec_free(specs[i]);
    free(train.x);
    free(train.y);
    printf("ok\n");
    return 0;
}
