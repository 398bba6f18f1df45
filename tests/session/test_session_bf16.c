/*
 * A bf16 member's dynamic loss scale in its full-state checkpoint
 * (docs/checkpoints.md, "bf16 loss scale").
 *
 *   - resume: member "hot" starts from an init file whose output weights are
 *     near 1e36, so its scaled gradients overflow and it skips updates,
 *     halving its scale, before it trains; member "calm" trains normally.
 *     Both are checkpointed at step 10 (metadata loss_scale below 2^16 for
 *     hot, 2^16 with 10 good steps for calm), restored into a fresh session
 *     at step 10, and trained to step 20: every loss and the step-20
 *     checkpoints equal the uninterrupted run's bit for bit.  Without the
 *     scale in the checkpoint hot would restart at 2^16 and skip again.  The
 *     same on P = 2 pipeline stages (the scale gathered from the stages into
 *     the checkpoint and scattered back into them);
 *   - corrupt values (not a power of two, out of [2^-24, 2^64], not a number,
 *     a negative, fractional or too large good-step count, one key without
 *     the other) are FB_ERR_CHECKPOINT naming the field, and neither member
 *     changes;
 *   - a checkpoint from before the scale was kept (no keys) loads and starts
 *     at 2^16 with 0 good steps; an fp32 job refuses the keys; an fp32
 *     checkpoint is refused by a bf16 job (and the reverse) by its fusion
 *     key, since precision is part of it.
 */
#include "session_util.h"

#include "array.h"
#include "device.h"

#define N_TRAIN 128
#define SIDE 6
#define CLASSES 4
#define BS 16
#define HID 12
#define CUT 10
#define END 20

static fb_dataset train;

static fb_job_spec *spec(const char *name, const char *precision, int seed, const char *init)
{
    char extra[700] = "";
    if (init) snprintf(extra, sizeof extra, ",\"init\":\"%s\"", init);
    return et_spec("{\"name\":\"%s\",\"dataset\":\"synthetic\",\"model\":{\"input\":[1,%d,%d],"
                   "\"layers\":[{\"type\":\"flatten\"},{\"type\":\"linear\",\"out\":%d},"
                   "{\"type\":\"relu\"},{\"type\":\"linear\",\"out\":%d}]},\"batch_size\":%d,"
                   "\"steps\":30,\"optimizer\":{\"type\":\"adam\",\"lr\":0.001},"
                   "\"seed\":%d,\"data_seed\":2,\"precision\":\"%s\"%s}",
                   name, SIDE, SIDE, HID, CLASSES, BS, seed, precision, extra);
}

/* Writes the init file of "hot": its own initial weights with the output
 * layer's (3.weight) times 1e36, so its logits stay finite but its loss
 * gradient times 2^16, carried back through them, does not. */
static void write_hot_init(const char *path)
{
    fb_job_spec *s = spec("hot", "bf16", 5, NULL);
    fb_array *a = NULL;
    char msg[512];
    const fb_job_spec *one = s;
    CHECK_INT_EQ(fb_array_new(fb_backend_cpu(), &one, 1, BS, &a, msg, sizeof msg), FB_OK);
    float w[CLASSES * HID];
    CHECK_INT_EQ((int)fb_array_tensor_at(a, FB_ARRAY_PARAM, 2).numel, CLASSES * HID);
    fb_array_get(a, 0, FB_ARRAY_PARAM, 2, w);
    for (int i = 0; i < CLASSES * HID; i++)
        w[i] *= 1e36f;
    fb_array_set(a, 0, FB_ARRAY_PARAM, 2, w);
    CHECK_INT_EQ(fb_array_save(a, 0, path, false, NULL, NULL, msg, sizeof msg), FB_OK);
    fb_array_free(a);
    et_spec_free(s);
}

/* The checkpoint buf with metadata key set to value, or removed when value
 * is NULL; malloc'd. */
static void *with_meta(const void *buf, size_t len, const char *key, const char *value,
                       size_t *out_len)
{
    char msg[512];
    fb_st_file *f = su_parse(buf, len);
    fb_st_writer *w = fb_st_writer_new();
    CHECK(w != NULL);
    for (size_t i = 0; i < fb_st_count(f); i++) {
        const fb_st_tensor *t = fb_st_at(f, i);
        CHECK_INT_EQ(
            fb_st_writer_add(w, t->name, t->dtype, t->shape, t->ndim, t->data, msg, sizeof msg), 0);
    }
    for (size_t i = 0; i < fb_st_metadata_count(f); i++) {
        const char *k, *v;
        CHECK_INT_EQ(fb_st_metadata_at(f, i, &k, &v), 0);
        if (strcmp(k, key) == 0) continue;
        CHECK_INT_EQ(fb_st_writer_set_metadata(w, k, v, msg, sizeof msg), 0);
    }
    if (value) CHECK_INT_EQ(fb_st_writer_set_metadata(w, key, value, msg, sizeof msg), 0);
    void *out = NULL;
    CHECK_INT_EQ(fb_st_write_buffer(w, &out, out_len, msg, sizeof msg), 0);
    fb_st_writer_free(w);
    fb_st_close(f);
    return out;
}

/* A metadata value of checkpoint bytes, copied into out ("" when absent). */
static void meta_of(const void *buf, size_t len, const char *key, char *out, size_t cap)
{
    fb_st_file *f = su_parse(buf, len);
    const char *v = fb_st_metadata_get(f, key);
    snprintf(out, cap, "%s", v ? v : "");
    fb_st_close(f);
}

/* A session like su_open's on P = 2 pipeline stages of CPU devices (one shard, two
 * micro-batches). */
static fb_session *open_pipeline(fb_job_spec *const *specs, int n, int64_t start, su_log *log)
{
    static fb_device devs[2];
    char msg[512];
    CHECK_INT_EQ(fb_devices_discover(2, (uint64_t)1 << 30, devs, 2, msg, sizeof msg), 2);
    fb_train_opts o = {.log_every = 1,
                       .cb = su_record,
                       .user = log,
                       .start_step = start,
                       .devices = devs,
                       .n_devices = 2,
                       .pipeline = 2,
                       .micro_batches = 2};
    fb_session *s = NULL;
    int err = fb_session_new(&s, fb_backend_cpu(), (const fb_job_spec *const *)specs, n, &train,
                             NULL, &o, msg, sizeof msg);
    if (err) fprintf(stderr, "fb_session_new: %s (%s)\n", msg, fb_err_code(err));
    CHECK_INT_EQ(err, FB_OK);
    return s;
}

/* The resume of main on pipeline stages: the scale gathered from the stages
 * into the checkpoint has halved, and scattered back on restore the run
 * continues bit for bit.  (Not compared with the one-device run: once the
 * scale has just fitted, hot's gradients sit near the float range, where
 * summing micro-batches instead of the whole batch can move a later skip.) */
static void test_pipeline_resume(fb_job_spec *const *specs)
{
    static su_log whole, resumed;
    su_log_init(&whole);
    fb_session *s = open_pipeline(specs, 2, 0, &whole);
    su_step_to(s, CUT);
    size_t cut_len[2], end_len[2];
    void *cut[2], *end[2];
    for (int m = 0; m < 2; m++)
        cut[m] = su_checkpoint(s, m, &cut_len[m]);
    su_step_to(s, END);
    for (int m = 0; m < 2; m++)
        end[m] = su_checkpoint(s, m, &end_len[m]);
    fb_session_free(s);
    char v[64];
    meta_of(cut[0], cut_len[0], "loss_scale", v, sizeof v);
    printf("pipeline of 2 stages: hot at step %d has loss_scale %s\n", CUT, v);
    CHECK(strtod(v, NULL) < 0x1p16);
    su_log_init(&resumed);
    s = open_pipeline(specs, 2, CUT, &resumed);
    for (int m = 0; m < 2; m++)
        su_restore(s, m, cut[m], cut_len[m]);
    su_step_to(s, END);
    for (int m = 0; m < 2; m++) {
        for (int t = CUT + 1; t <= END; t++)
            CHECK(whole.loss[m][t] == resumed.loss[m][t]);
        size_t n;
        void *got = su_checkpoint(s, m, &n);
        CHECK(n == end_len[m] && memcmp(got, end[m], n) == 0);
        free(got);
        free(cut[m]);
        free(end[m]);
    }
    fb_session_free(s);
    su_log_free(&whole);
    su_log_free(&resumed);
    printf("pipeline of 2 stages: resumed at step %d bit for bit\n", CUT);
}

static void refuse_meta(fb_session *s, const void *good, size_t len, const char *key,
                        const char *value, const char *names, const char *what)
{
    size_t n;
    void *bad = with_meta(good, len, key, value, &n);
    su_expect_refused(s, bad, n, names, what);
    free(bad);
}

int main(void)
{
    train = et_synthetic(N_TRAIN, SIDE, CLASSES, 3);
    char dir[256], init[512];
    et_tmpdir(dir, sizeof dir, "session-bf16");
    snprintf(init, sizeof init, "%s/hot-init.safetensors", dir);
    write_hot_init(init);
    fb_job_spec *specs[2] = {spec("hot", "bf16", 5, init), spec("calm", "bf16", 6, NULL)};

    /* the uninterrupted run, with both members' checkpoints at CUT and END */
    static su_log whole, resumed, scratch;
    su_log_init(&whole);
    fb_session *s = su_open(specs, 2, &train, NULL, 0, NULL, false, &whole);
    su_step_to(s, CUT);
    size_t cut_len[2], end_len[2];
    void *cut[2], *end[2];
    for (int m = 0; m < 2; m++)
        cut[m] = su_checkpoint(s, m, &cut_len[m]);
    su_step_to(s, END);
    for (int m = 0; m < 2; m++)
        end[m] = su_checkpoint(s, m, &end_len[m]);
    fb_session_free(s);

    char v[64];
    meta_of(cut[0], cut_len[0], "loss_scale", v, sizeof v);
    double hot_scale = strtod(v, NULL);
    printf("hot at step %d: loss_scale %s", CUT, v);
    meta_of(cut[0], cut_len[0], "loss_scale_good", v, sizeof v);
    printf(", good %s\n", v);
    CHECK(hot_scale >= 0x1p-24 && hot_scale < 0x1p16); /* it halved, */
    CHECK(strcmp(v, "0") != 0);                        /* and has trained since */
    meta_of(cut[1], cut_len[1], "loss_scale", v, sizeof v);
    CHECK_STR_EQ(v, "65536");
    meta_of(cut[1], cut_len[1], "loss_scale_good", v, sizeof v);
    CHECK_STR_EQ(v, "10");

    /* resumed at CUT from the checkpoints: the same losses and the same END bytes */
    su_log_init(&resumed);
    s = su_open(specs, 2, &train, NULL, CUT, NULL, false, &resumed);
    for (int m = 0; m < 2; m++)
        su_restore(s, m, cut[m], cut_len[m]);
    su_step_to(s, END);
    for (int m = 0; m < 2; m++) {
        for (int t = CUT + 1; t <= END; t++)
            CHECK(whole.loss[m][t] == resumed.loss[m][t]);
        size_t n;
        void *got = su_checkpoint(s, m, &n);
        CHECK(n == end_len[m] && memcmp(got, end[m], n) == 0);
        free(got);
    }
    fb_session_free(s);
    printf("resume: both members continue from step %d bit for bit to step %d\n", CUT, END);
    test_pipeline_resume(specs);

    /* corrupt values: refused, nothing changes */
    su_log_init(&scratch);
    s = su_open(specs, 2, &train, NULL, CUT, NULL, false, &scratch);
    const void *g = cut[0];
    size_t gl = cut_len[0];
    static const char *const bad_scales[] = {
        "3",
        "0",
        "-65536",
        "nan",
        "inf",
        "1e-30",
        "65536x",
        "",
        "1180591620717411303424",      /* 2^70: a float, above the range */
        "0.0000000298023223876953125", /* 2^-25: a float, below the range */
    };
    for (size_t k = 0; k < sizeof bad_scales / sizeof *bad_scales; k++) {
        char what[64];
        snprintf(what, sizeof what, "loss_scale \"%.20s\"", bad_scales[k]);
        refuse_meta(s, g, gl, "loss_scale", bad_scales[k], "power of two", what);
    }
    static const char *const bad_goods[] = {"-1", "1.5", "x", "", "2000", "99999999999999999999"};
    for (size_t k = 0; k < sizeof bad_goods / sizeof *bad_goods; k++) {
        char what[64];
        snprintf(what, sizeof what, "loss_scale_good \"%.20s\"", bad_goods[k]);
        refuse_meta(s, g, gl, "loss_scale_good", bad_goods[k],
                    k == 4 ? "step count 2000 is outside" : "loss_scale_good is", what);
    }
    refuse_meta(s, g, gl, "loss_scale_good", NULL, "loss_scale_good is missing",
                "no loss_scale_good");
    refuse_meta(s, g, gl, "loss_scale", NULL, "loss_scale is missing", "no loss_scale");

    /* from before the scale was kept: loads, and starts at 2^16 with 0 good steps */
    size_t l1, l2, back_len;
    void *old1 = with_meta(g, gl, "loss_scale", NULL, &l1);
    void *old = with_meta(old1, l1, "loss_scale_good", NULL, &l2);
    su_restore(s, 0, old, l2);
    void *back = su_checkpoint(s, 0, &back_len);
    meta_of(back, back_len, "loss_scale", v, sizeof v);
    CHECK_STR_EQ(v, "65536");
    meta_of(back, back_len, "loss_scale_good", v, sizeof v);
    CHECK_STR_EQ(v, "0");
    free(back);
    free(old1);
    free(old);
    printf("a checkpoint without the keys loads at scale 2^16, 0 good steps\n");
    fb_session_free(s);

    /* across precisions */
    fb_job_spec *f32[2] = {spec("hot", "fp32", 5, NULL), spec("calm", "fp32", 6, NULL)};
    s = su_open(f32, 2, &train, NULL, CUT, NULL, false, &scratch);
    size_t fl;
    void *f32_ckpt = su_checkpoint(s, 0, &fl);
    meta_of(f32_ckpt, fl, "loss_scale", v, sizeof v);
    CHECK_STR_EQ(v, ""); /* an fp32 job has no loss scale to keep */
    refuse_meta(s, f32_ckpt, fl, "loss_scale", "1024", "loss_scale is set, but",
                "fp32 job, loss_scale set");
    su_expect_refused(s, g, gl, "fusion_key", "a bf16 checkpoint in an fp32 job");
    fb_session_free(s);
    s = su_open(specs, 2, &train, NULL, CUT, NULL, false, &scratch);
    su_expect_refused(s, f32_ckpt, fl, "fusion_key", "an fp32 checkpoint in a bf16 job");
    fb_session_free(s);
    free(f32_ckpt);
    printf("ok\n");

    su_log_free(&whole);
    su_log_free(&resumed);
    su_log_free(&scratch);
    for (int m = 0; m < 2; m++) {
        free(cut[m]);
        free(end[m]);
        et_spec_free(specs[m]);
        et_spec_free(f32[m]);
    }
    et_rmtree(dir);
    fb_dataset_free(&train);
    return 0;
}
