/*
 * Checkpoints of a session (session.h, docs/checkpoints.md): their events,
 * files and bytes, and the strict validation of fb_session_restore.
 *
 *   - events: a member with checkpoint_every k gets FB_TRAIN_CHECKPOINT at
 *     every multiple of k before its last step, and only there, with and
 *     without out_dir and blobs; with out_dir the file
 *     <name>.checkpoint.safetensors holds exactly the event's blob bytes (one
 *     serializer for files and buffers); blobs parse back with the expected
 *     tensors and metadata; the done event's blob is the model only; both
 *     describe themselves: the member's canonical spec, the preprocessing,
 *     fusebox's version, the step and the metrics known at that step;
 *   - metrics in checkpoints: the latest evaluation rides along, also
 *     between evaluations, and a restored member carries its checkpoint's
 *     metrics on, so it writes the bytes the uninterrupted run writes;
 *   - a full checkpoint file serves as a spec's init file (its model part);
 *   - bad checkpoints: a wrong step, fusion key, seed, format or step text,
 *     a missing parameter, optimizer tensor or batch-norm counter, an unknown
 *     tensor, a wrong shape or dtype, truncated bytes, garbage, no bytes, a
 *     model file, another member's checkpoint: each is FB_ERR_CHECKPOINT
 *     with a message naming the tensor or field, and neither the member nor
 *     its neighbour changes (their checkpoint bytes before and after are
 *     equal); so is a malformed "metrics" entry (not an object, a value of
 *     the wrong type or range, halves of a pair); a checkpoint from before
 *     the description (no spec, preprocess, version or metrics) restores;
 *     then the good checkpoint restores and round-trips byte for byte.
 */
#include "session_util.h"

#include <jansson.h>

#include "array.h"

#define N_TRAIN 128
#define SIDE 6
#define CLASSES 4
#define BS 16

static fb_dataset train;

static const char *const mlp =
    "[{\"type\":\"flatten\"},{\"type\":\"linear\",\"out\":12},{\"type\":\"relu\"},"
    "{\"type\":\"linear\",\"out\":4}]";
static const char *const cnn =
    "[{\"type\":\"conv2d\",\"out\":3,\"kernel\":[3,3],\"padding\":[1,1]},"
    "{\"type\":\"batchnorm\"},{\"type\":\"relu\"},{\"type\":\"flatten\"},"
    "{\"type\":\"linear\",\"out\":4}]";

static fb_job_spec *spec(const char *name, const char *layers, const char *optim, int steps,
                         int ckpt_every, int seed, const char *init)
{
    char extra[700] = "";
    if (init) snprintf(extra, sizeof extra, ",\"init\":\"%s\"", init);
    return et_spec("{\"name\":\"%s\",\"dataset\":\"synthetic\",\"model\":{\"input\":[1,%d,%d],"
                   "\"layers\":%s},\"batch_size\":%d,\"steps\":%d,\"optimizer\":%s,"
                   "\"checkpoint_every\":%d,\"seed\":%d,\"data_seed\":2%s}",
                   name, SIDE, SIDE, layers, BS, steps, optim, ckpt_every, seed, extra);
}

/* ---- events, files and blobs --------------------------------------------------- */

/* The description every file of s carries: its canonical spec, the preprocessing of uint8
 * samples, the version; its "metrics" parsed (the caller json_decref's it). */
static json_t *check_description(const fb_st_file *f, const fb_job_spec *s)
{
    char *canon = fb_job_spec_canonical(s);
    CHECK(canon != NULL);
    CHECK_STR_EQ(fb_st_metadata_get(f, "spec"), canon);
    free(canon);
    CHECK_STR_EQ(fb_st_metadata_get(f, "preprocess"), "{\"uint8_scale\":0.00392156862745098}");
    CHECK(fb_st_metadata_get(f, "fusebox_version") != NULL);
    CHECK(strlen(fb_st_metadata_get(f, "fusebox_version")) > 0);
    const char *text = fb_st_metadata_get(f, "metrics");
    CHECK(text != NULL);
    json_t *m = json_loads(text, 0, NULL);
    CHECK(json_is_object(m));
    return m;
}

/* A metrics object with training values and, without a validation set or test split, no
 * evaluation. */
static void check_train_metrics(json_t *m)
{
    CHECK(json_is_number(json_object_get(m, "loss")));
    CHECK(json_number_value(json_object_get(m, "loss")) > 0);
    double acc = json_number_value(json_object_get(m, "accuracy"));
    CHECK(json_is_number(json_object_get(m, "accuracy")) && acc >= 0 && acc <= 1);
    CHECK(json_object_get(m, "val_loss") == NULL && json_object_get(m, "val_step") == NULL);
    CHECK(json_object_get(m, "test_loss") == NULL);
    CHECK_INT_EQ(json_object_size(m), 2);
    json_decref(m);
}

static void check_ckpt_blob(const su_blob *b, const fb_job_spec *s)
{
    fb_st_file *f = su_parse(b->data, b->len);
    char num[32];
    snprintf(num, sizeof num, "%lld", (long long)b->step);
    CHECK_STR_EQ(fb_st_metadata_get(f, "format"), FB_CHECKPOINT_FORMAT);
    CHECK_STR_EQ(fb_st_metadata_get(f, "step"), num);
    CHECK_STR_EQ(fb_st_metadata_get(f, "fusion_key"), s->fusion_key);
    CHECK_STR_EQ(fb_st_metadata_get(f, "name"), s->name);
    snprintf(num, sizeof num, "%llu", (unsigned long long)s->seed);
    CHECK_STR_EQ(fb_st_metadata_get(f, "seed"), num);
    CHECK_STR_EQ(fb_st_metadata_get(f, "data_seed"), "2");
    check_train_metrics(check_description(f, s));
    CHECK_INT_EQ(fb_st_metadata_count(f), 10);
    /* 4 parameters, each with Adam's two moments */
    CHECK_INT_EQ(fb_st_count(f), 12);
    const char *names[] = {"1.weight", "optim.exp_avg.1.weight", "optim.exp_avg_sq.3.bias"};
    for (int k = 0; k < 3; k++) {
        const fb_st_tensor *t = fb_st_find(f, names[k]);
        CHECK(t != NULL);
        CHECK_INT_EQ(t->dtype, FB_ST_F32);
    }
    CHECK_INT_EQ(fb_st_find(f, "optim.exp_avg.1.weight")->shape[1], SIDE * SIDE);
    fb_st_close(f);
}

static void test_events(void)
{
    const char *adam = "{\"type\":\"adam\",\"lr\":0.01}";
    fb_job_spec *specs[3] = {spec("a", mlp, adam, 17, 5, 1, NULL),
                             spec("b", mlp, adam, 16, 4, 2, NULL),
                             spec("c", mlp, adam, 12, 0, 3, NULL)};
    const int64_t want[2][3] = {{5, 10, 15}, {4, 8, 12}};
    char dir[512];
    et_tmpdir(dir, sizeof dir, "session-ckpt");
    static su_log log;
    for (int mode = 0; mode < 3; mode++) {
        /* 0: events only; 1: out_dir and blobs; 2: blobs only */
        su_log_init(&log);
        log.check_files = true;
        fb_session *s = su_open(specs, 3, &train, NULL, 0, mode == 1 ? dir : NULL, mode > 0, &log);
        CHECK_INT_EQ(fb_session_total_steps(s, 0), 17);
        CHECK_INT_EQ(fb_session_total_steps(s, 2), 12);
        CHECK_INT_EQ(fb_session_total_steps(s, 3), 0);
        CHECK(!fb_session_has(s, 3) && !fb_session_has(s, -1));
        su_step_to(s, -1);
        CHECK_INT_EQ(fb_session_steps_done(s), 17);
        fb_session_free(s);
        CHECK_INT_EQ(log.ckpts[2], 0);
        for (int m = 0; m < 2; m++) {
            CHECK_INT_EQ(log.ckpts[m], 3);
            for (int k = 0; k < 3; k++) {
                const su_blob *b = &log.ckpt[m][k];
                CHECK_INT_EQ(b->step, want[m][k]);
                if (mode == 1) {
                    char path[1024];
                    snprintf(path, sizeof path, "%s/%s.checkpoint.safetensors", dir,
                             specs[m]->name);
                    CHECK_STR_EQ(b->path, path);
                } else {
                    CHECK_STR_EQ(b->path, "");
                }
                if (mode == 0) {
                    CHECK(b->data == NULL);
                    continue;
                }
                check_ckpt_blob(b, specs[m]);
            }
        }
        for (int m = 0; m < 3; m++) {
            CHECK_INT_EQ(log.dones[m], 1);
            const su_blob *d = &log.done[m];
            CHECK_INT_EQ(d->step, fb_train_total_steps(specs[m], N_TRAIN));
            if (mode == 0) {
                CHECK(d->data == NULL);
                continue;
            }
            /* the model only: what load_state_dict takes, and the step */
            fb_st_file *f = su_parse(d->data, d->len);
            CHECK_INT_EQ(fb_st_count(f), 4);
            CHECK(fb_st_find(f, "3.bias") != NULL);
            check_train_metrics(check_description(f, specs[m]));
            CHECK_INT_EQ(fb_st_metadata_count(f), 5);
            char num[32];
            snprintf(num, sizeof num, "%lld", (long long)d->step);
            CHECK_STR_EQ(fb_st_metadata_get(f, "step"), num);
            fb_st_close(f);
            if (mode == 1) {
                size_t n;
                void *file = du_read(d->path, &n);
                CHECK_INT_EQ(n, d->len);
                CHECK(memcmp(file, d->data, n) == 0);
                free(file);
            }
        }
        if (mode != 2) su_log_free(&log);
    }
    /* the files hold each member's last checkpoint and final model */
    char path[1024];
    snprintf(path, sizeof path, "%s/a.checkpoint.safetensors", dir);
    size_t n;
    void *file = du_read(path, &n);
    CHECK_INT_EQ(n, log.ckpt[0][2].len);
    CHECK(memcmp(file, log.ckpt[0][2].data, n) == 0);
    free(file);

    /* a full checkpoint is a valid init file: its model part */
    fb_job_spec *init = spec("a", mlp, adam, 17, 5, 1, path);
    static su_log none;
    su_log_init(&none);
    fb_session *s = su_open(&init, 1, &train, NULL, 0, NULL, false, &none);
    void *model;
    size_t model_len;
    char msg[512];
    CHECK_INT_EQ(fb_session_model(s, 0, &model, &model_len, msg, sizeof msg), FB_OK);
    fb_st_file *fm = su_parse(model, model_len), *fc = su_parse(log.ckpt[0][2].data, n);
    for (size_t i = 0; i < fb_st_count(fm); i++) {
        const fb_st_tensor *t = fb_st_at(fm, i), *u = fb_st_find(fc, t->name);
        CHECK(u != NULL && u->nbytes == t->nbytes);
        CHECK(memcmp(t->data, u->data, t->nbytes) == 0);
    }
    printf("checkpoint events at 5/10/15 and 4/8/12 in 3 modes; files equal blobs; a "
           "checkpoint serves as init (%zu tensors)\n",
           fb_st_count(fm));
    fb_st_close(fm);
    fb_st_close(fc);
    free(model);
    fb_session_free(s);
    et_spec_free(init);
    su_log_free(&log);
    et_rmtree(dir);
    for (int i = 0; i < 3; i++)
        et_spec_free(specs[i]);
}

/* ---- bad checkpoints -------------------------------------------------------------- */

typedef struct edit {
    const char *drop;       /* a tensor left out */
    const char *extra;      /* a tensor added (F32 [2]) */
    const char *reshape;    /* a tensor whose first dimension shrinks by one */
    const char *retype;     /* a tensor stored as another dtype of the same size */
    const char *meta_key;   /* a metadata entry set to meta_value, */
    const char *meta_value; /* or removed when meta_value is NULL */
} edit;

/* The checkpoint buf rewritten with one edit; malloc'd. */
static void *rewrite(const void *buf, size_t len, const edit *e, size_t *out_len)
{
    char msg[512];
    fb_st_file *f = su_parse(buf, len);
    fb_st_writer *w = fb_st_writer_new();
    CHECK(w != NULL);
    static const float two[2] = {1.0f, 2.0f};
    for (size_t i = 0; i < fb_st_count(f); i++) {
        const fb_st_tensor *t = fb_st_at(f, i);
        if (e->drop && strcmp(t->name, e->drop) == 0) continue;
        int64_t shape[FB_ST_MAX_DIMS];
        memcpy(shape, t->shape, sizeof shape);
        if (e->reshape && strcmp(t->name, e->reshape) == 0) shape[0]--;
        fb_st_dtype dt = t->dtype;
        if (e->retype && strcmp(t->name, e->retype) == 0)
            dt = dt == FB_ST_F32 ? FB_ST_I32 : FB_ST_F64;
        CHECK_INT_EQ(fb_st_writer_add(w, t->name, dt, shape, t->ndim, t->data, msg, sizeof msg), 0);
    }
    if (e->extra) {
        int64_t shape[1] = {2};
        CHECK_INT_EQ(fb_st_writer_add_f32(w, e->extra, shape, 1, two, msg, sizeof msg), 0);
    }
    for (size_t i = 0; i < fb_st_metadata_count(f); i++) {
        const char *k, *v;
        CHECK_INT_EQ(fb_st_metadata_at(f, i, &k, &v), 0);
        if (e->meta_key && strcmp(k, e->meta_key) == 0) continue;
        CHECK_INT_EQ(fb_st_writer_set_metadata(w, k, v, msg, sizeof msg), 0);
    }
    if (e->meta_key && e->meta_value)
        CHECK_INT_EQ(fb_st_writer_set_metadata(w, e->meta_key, e->meta_value, msg, sizeof msg), 0);
    void *out = NULL;
    CHECK_INT_EQ(fb_st_write_buffer(w, &out, out_len, msg, sizeof msg), 0);
    fb_st_writer_free(w);
    fb_st_close(f); /* the writer referenced its data until here */
    return out;
}

static void refuse_edit(fb_session *s, const void *good, size_t len, edit e, const char *names,
                        const char *what)
{
    size_t n;
    void *bad = rewrite(good, len, &e, &n);
    su_expect_refused(s, bad, n, names, what);
    free(bad);
}

static void test_bad_checkpoints(const char *layers, bool cnn_case)
{
    const char *adam = "{\"type\":\"adam\",\"lr\":0.01}";
    fb_job_spec *specs[2] = {spec("left", layers, adam, 30, 0, 11, NULL),
                             spec("right", layers, adam, 30, 0, 12, NULL)};
    static su_log log;
    su_log_init(&log);
    /* a trained session gives the good checkpoint at step 12 (and one at step 11) */
    fb_session *t = su_open(specs, 2, &train, NULL, 0, NULL, false, &log);
    su_step_to(t, 11);
    size_t early_len, good_len, other_len, model_len;
    void *early = su_checkpoint(t, 0, &early_len);
    su_step_to(t, 12);
    void *good = su_checkpoint(t, 0, &good_len);
    void *other = su_checkpoint(t, 1, &other_len);
    char msg[512];
    void *model = NULL;
    CHECK_INT_EQ(fb_session_model(t, 0, &model, &model_len, msg, sizeof msg), FB_OK);
    fb_session_free(t);

    /* the target: a fresh session at step 12, whose member 0 differs from the checkpoint */
    fb_session *s = su_open(specs, 2, &train, NULL, 12, NULL, false, &log);
    size_t fresh_len;
    void *fresh = su_checkpoint(s, 0, &fresh_len);
    CHECK(fresh_len != good_len || memcmp(fresh, good, good_len) != 0);
    free(fresh);

    printf("%s:\n", cnn_case ? "cnn with batch norm" : "mlp");
    su_expect_refused(s, early, early_len, "metadata step is 11", "wrong step");
    su_expect_refused(s, other, other_len, "metadata seed is 12", "another member's");
    su_expect_refused(s, model, model_len, "format", "a model file");
    su_expect_refused(s, good, good_len - 9, "checkpoint of left", "truncated");
    su_expect_refused(s, NULL, 0, "checkpoint of left", "no bytes");
    uint8_t garbage[300];
    uint64_t st = 77;
    for (size_t i = 0; i < sizeof garbage; i++)
        garbage[i] = (uint8_t)et_next(&st);
    su_expect_refused(s, garbage, sizeof garbage, "checkpoint of left", "garbage");
    refuse_edit(s, good, good_len, (edit){.meta_key = "fusion_key", .meta_value = "0123abcd"},
                "fusion_key is 0123abcd", "wrong fusion key");
    refuse_edit(s, good, good_len,
                (edit){.meta_key = "format", .meta_value = "fusebox-checkpoint-2"},
                "format is \"fusebox-checkpoint-2\"", "wrong format");
    refuse_edit(s, good, good_len, (edit){.meta_key = "format"}, "format is missing", "no format");
    refuse_edit(s, good, good_len, (edit){.meta_key = "step", .meta_value = "12x"}, "step is 12x",
                "step not a number");
    refuse_edit(s, good, good_len, (edit){.meta_key = "step", .meta_value = "-12"}, "step is -12",
                "negative step");
    refuse_edit(s, good, good_len, (edit){.meta_key = "data_seed", .meta_value = "3"},
                "data_seed is 3", "wrong data seed");
    const char *w_name = cnn_case ? "0.weight" : "1.weight";
    const char *last_bias = cnn_case ? "4.bias" : "3.bias";
    char opt[64];
    snprintf(opt, sizeof opt, "optim.exp_avg_sq.%s", w_name);
    refuse_edit(s, good, good_len, (edit){.drop = last_bias}, last_bias, "missing parameter");
    char want[96];
    snprintf(want, sizeof want, "tensor %s is missing", opt);
    refuse_edit(s, good, good_len, (edit){.drop = opt}, want, "missing optimizer state");
    snprintf(want, sizeof want, "optim.momentum_buffer.%s", w_name);
    refuse_edit(s, good, good_len, (edit){.extra = want}, want, "SGD state in an Adam job");
    refuse_edit(s, good, good_len, (edit){.extra = "bogus"}, "tensor bogus is not part",
                "unknown tensor");
    snprintf(want, sizeof want, "tensor %s has shape", w_name);
    refuse_edit(s, good, good_len, (edit){.reshape = w_name}, want, "wrong shape");
    snprintf(want, sizeof want, "optim.exp_avg.%s has shape", w_name);
    snprintf(opt, sizeof opt, "optim.exp_avg.%s", w_name);
    refuse_edit(s, good, good_len, (edit){.reshape = opt}, want, "wrong optimizer shape");
    snprintf(want, sizeof want, "tensor %s has dtype I32, expected F32", last_bias);
    refuse_edit(s, good, good_len, (edit){.retype = last_bias}, want, "wrong dtype");
    if (cnn_case) {
        refuse_edit(s, good, good_len, (edit){.drop = "1.num_batches_tracked"},
                    "1.num_batches_tracked is missing", "missing counter");
        refuse_edit(s, good, good_len, (edit){.retype = "1.num_batches_tracked"},
                    "1.num_batches_tracked has dtype F64, expected I64", "counter dtype");
        refuse_edit(s, good, good_len, (edit){.drop = "1.running_var"}, "1.running_var is missing",
                    "missing running_var");
    }

    /* the metrics entry, when there, is read strictly */
    static const struct {
        const char *value, *names, *what;
    } bad_metrics[] = {
        {"[1, 2]", "metrics is not a JSON object", "metrics an array"},
        {"{\"loss\": 0.5", "metrics is not a JSON object", "metrics not JSON"},
        {"{\"loss\": \"low\", \"accuracy\": 0.5}", "metrics.loss is not a number",
         "loss a string"},
        {"{\"loss\": -1, \"accuracy\": 0.5}", "metrics.loss is not a number", "negative loss"},
        {"{\"loss\": 0.5, \"accuracy\": 1.5}", "metrics.accuracy is not a number in [0, 1]",
         "accuracy above 1"},
        {"{\"loss\": 0.5}", "metrics has loss without accuracy", "loss alone"},
        {"{\"accuracy\": 0.5}", "metrics has accuracy without loss", "accuracy alone"},
        {"{\"val_loss\": 0.5, \"val_accuracy\": 0.5, \"val_step\": 13}",
         "metrics.val_step is not a step in [1, 12]", "validation after the step"},
        {"{\"val_loss\": 0.5, \"val_accuracy\": 0.5, \"val_step\": 1.5}",
         "metrics.val_step is not a step", "val_step a fraction"},
        {"{\"val_loss\": 0.5, \"val_accuracy\": 0.5}", "needs val_loss, val_accuracy and val_step",
         "validation without its step"},
        {"{\"val_step\": 4}", "needs val_loss, val_accuracy and val_step",
         "a step without its validation"},
        {"{\"test_loss\": 0.5}", "metrics has test_loss without test_accuracy", "test loss alone"},
        {"{\"test_loss\": 0.5, \"test_accuracy\": 2}",
         "metrics.test_accuracy is not a number in [0, 1]", "test accuracy above 1"},
    };
    for (size_t k = 0; k < sizeof bad_metrics / sizeof bad_metrics[0]; k++)
        refuse_edit(s, good, good_len,
                    (edit){.meta_key = "metrics", .meta_value = bad_metrics[k].value},
                    bad_metrics[k].names, bad_metrics[k].what);

    /* a checkpoint from before the files described themselves still restores */
    static const char *const added[] = {"spec", "preprocess", "fusebox_version", "metrics"};
    size_t old_len = good_len;
    void *old = malloc(good_len);
    CHECK(old != NULL);
    memcpy(old, good, good_len);
    for (size_t k = 0; k < sizeof added / sizeof added[0]; k++) {
        size_t n;
        void *next = rewrite(old, old_len, &(edit){.meta_key = added[k]}, &n);
        free(old);
        old = next;
        old_len = n;
    }
    su_restore(s, 0, old, old_len);
    free(old);
    printf("  %-34s -> ok\n", "a checkpoint without a description");

    /* the good one restores, and the member then is exactly the checkpoint */
    su_restore(s, 0, good, good_len);
    size_t back_len;
    void *back = su_checkpoint(s, 0, &back_len);
    CHECK_INT_EQ(back_len, good_len);
    CHECK(memcmp(back, good, good_len) == 0);
    free(back);
    /* and a restore after steps have been taken needs that step's checkpoint */
    su_step_to(s, 13);
    su_expect_refused(s, good, good_len, "the session is at step 13", "stale after a step");

    fb_session_free(s);
    free(early);
    free(good);
    free(other);
    free(model);
    su_log_free(&log);
    for (int i = 0; i < 2; i++)
        et_spec_free(specs[i]);
}

/*
 * The metrics of checkpoints with a test split: the latest evaluation (step 5) rides along in
 * the checkpoint at step 7, between evaluations; a session resumed from it at step 7 writes the
 * uninterrupted run's bytes at step 8 (its evaluation known only from the checkpoint) and the
 * same final model, whose metrics are the last step's training values and final evaluation.
 */
static void test_metrics(void)
{
    fb_job_spec *sp = et_spec("{\"name\":\"m\",\"dataset\":\"synthetic\",\"model\":{\"input\":"
                              "[1,%d,%d],\"layers\":%s},\"batch_size\":%d,\"steps\":12,"
                              "\"optimizer\":{\"type\":\"sgd\",\"lr\":0.1},\"eval_every\":5}",
                              SIDE, SIDE, mlp, BS);
    static su_log whole, resumed;
    su_log_init(&whole);
    fb_session *s = su_open(&sp, 1, &train, &train, 0, NULL, true, &whole);
    su_step_to(s, 7);
    size_t at7_len, at8_len;
    void *at7 = su_checkpoint(s, 0, &at7_len);
    su_step_to(s, 8);
    void *at8 = su_checkpoint(s, 0, &at8_len);
    su_step_to(s, -1);
    fb_session_free(s);

    fb_st_file *f = su_parse(at7, at7_len);
    json_t *m = check_description(f, sp);
    CHECK_INT_EQ(json_integer_value(json_object_get(m, "val_step")), 5);
    CHECK(json_is_number(json_object_get(m, "val_loss")));
    CHECK(json_is_number(json_object_get(m, "val_accuracy")));
    CHECK(json_is_number(json_object_get(m, "loss")));
    CHECK(json_is_number(json_object_get(m, "accuracy")));
    CHECK_INT_EQ(json_object_size(m), 5);
    json_decref(m);
    fb_st_close(f);

    su_log_init(&resumed);
    s = su_open(&sp, 1, &train, &train, 7, NULL, true, &resumed);
    su_restore(s, 0, at7, at7_len);
    su_step_to(s, 8);
    size_t again_len;
    void *again = su_checkpoint(s, 0, &again_len);
    CHECK(again_len == at8_len && memcmp(again, at8, at8_len) == 0);
    su_step_to(s, -1);
    fb_session_free(s);
    CHECK_INT_EQ(resumed.dones[0], 1);
    CHECK(resumed.done[0].len == whole.done[0].len &&
          memcmp(resumed.done[0].data, whole.done[0].data, whole.done[0].len) == 0);

    /* the final model: the last step's training values and the final validation (no test
     * split here) */
    f = su_parse(whole.done[0].data, whole.done[0].len);
    CHECK_STR_EQ(fb_st_metadata_get(f, "step"), "12");
    m = check_description(f, sp);
    CHECK_INT_EQ(json_integer_value(json_object_get(m, "val_step")), 12);
    CHECK_INT_EQ(json_object_size(m), 5);
    /* the float loss in 9 digits: the same float */
    CHECK((float)json_number_value(json_object_get(m, "loss")) == (float)whole.loss[0][12]);
    json_decref(m);
    fb_st_close(f);
    printf("metrics: the evaluation of step 5 in the checkpoint of step 7; resumed from it, the "
           "same bytes at step 8 and at the end\n");
    free(at7);
    free(at8);
    free(again);
    su_log_free(&whole);
    su_log_free(&resumed);
    et_spec_free(sp);
}

/* fb_session_new refuses a start at or past a member's end, and a negative one. */
static void test_bad_start(void)
{
    fb_job_spec *sp = spec("short", mlp, "{\"type\":\"sgd\",\"lr\":0.1}", 5, 0, 1, NULL);
    const int64_t starts[] = {5, 6, -1};
    for (int k = 0; k < 3; k++) {
        fb_train_opts o = {.start_step = starts[k]};
        fb_session *s = NULL;
        char msg[256];
        int err = fb_session_new(&s, fb_backend_cpu(), (const fb_job_spec *const *)&sp, 1, &train,
                                 NULL, &o, msg, sizeof msg);
        printf("  start at %lld -> %s: %s\n", (long long)starts[k], fb_err_code(err), msg);
        CHECK_INT_EQ(err, FB_ERR_OUT_OF_RANGE);
        CHECK(s == NULL);
    }
    et_spec_free(sp);
}

int main(void)
{
    train = et_synthetic(N_TRAIN, SIDE, CLASSES, 3);
    test_events();
    test_bad_checkpoints(mlp, false);
    test_bad_checkpoints(cnn, true);
    test_metrics();
    test_bad_start();
    fb_dataset_free(&train);
    return 0;
}
