/*
 * Weights files of an array member: fb_array_save / fb_array_load.
 *
 * A CNN with batch norm (conv, batchnorm, relu, maxpool, flatten, linear,
 * batchnorm) in an array of 3 trains a few steps, so that parameters, running
 * statistics and num_batches_tracked all differ from their initial values.
 *   - Round trip: member 1's file loaded into slot 0 of a fresh array makes
 *     that slot a copy of it: the same file when saved again, and the same
 *     eval-mode logits (which read the running statistics) and training loss.
 *   - Rejections: a wrong shape, a missing parameter, an extra unknown
 *     tensor (also one named like a batch-norm counter of a layer the model
 *     does not have), a wrong dtype, a non-scalar num_batches_tracked, a
 *     truncated or garbage file return FB_ERR_CHECKPOINT and leave every
 *     member exactly as it was; a missing file is FB_ERR_IO, also harmless.
 *   - A file without running statistics loads the parameters and keeps the
 *     member's statistics.
 *   - fb_array_new refuses specs with different fusion keys
 *     (FB_ERR_NOT_FUSIBLE) and a bad init file, leaving *out untouched.
 */
#include "engine_util.h"

#include "array.h"
#include "kernels.h"

#define B 3
#define BS 16
#define SIDE 8
#define CLASSES 5

static char dir[512];
static fb_dataset ds;

static const char *layers =
    "[{\"type\":\"conv2d\",\"out\":3,\"kernel\":[3,3]},{\"type\":\"batchnorm\"},"
    "{\"type\":\"relu\"},{\"type\":\"maxpool2d\",\"kernel\":[2,2]},{\"type\":\"flatten\"},"
    "{\"type\":\"linear\",\"out\":5},{\"type\":\"batchnorm\",\"momentum\":0.3}]";

static fb_job_spec *spec(int seed, const char *optim, const char *init)
{
    char extra[1200] = "";
    if (init) snprintf(extra, sizeof extra, ",\"init\":\"%s\"", init);
    return et_spec("{\"name\":\"io%d\",\"dataset\":\"synthetic\",\"model\":{\"input\":[1,%d,%d],"
                   "\"layers\":%s},\"batch_size\":%d,\"steps\":10,\"optimizer\":{\"type\":\"%s\","
                   "\"lr\":0.01},\"seed\":%d%s}",
                   seed, SIDE, SIDE, layers, BS, optim, seed, extra);
}

static fb_array *new_array(fb_job_spec *const *specs, int n)
{
    char msg[512];
    fb_array *a = NULL;
    int err = fb_array_new(fb_backend_cpu(), (const fb_job_spec *const *)specs, n, BS, &a, msg,
                           sizeof msg);
    if (err) fprintf(stderr, "fb_array_new: %s\n", msg);
    CHECK_INT_EQ(err, FB_OK);
    return a;
}

static void train_steps(fb_array *a, int steps)
{
    char msg[512];
    float loss[B];
    fb_optim_hparams hp[B];
    for (int s = 0; s < steps; s++) {
        int64_t first = (s * BS) % (ds.n - BS);
        CHECK_INT_EQ(fb_array_forward_backward(a, ds.x + first * SIDE * SIDE, ds.y + first, BS,
                                               true, (uint64_t)s, loss, NULL, msg, sizeof msg),
                     FB_OK);
        for (int b = 0; b < fb_array_size(a); b++)
            fb_array_hparams(a, b, s + 1, 10, &hp[b]);
        fb_array_step(a, hp);
    }
}

static void save(const fb_array *a, int m, const char *file, char *path, size_t cap)
{
    char msg[512];
    snprintf(path, cap, "%s/%s", dir, file);
    int err = fb_array_save(a, m, path, false, "note", "engine test", msg, sizeof msg);
    if (err) fprintf(stderr, "fb_array_save: %s\n", msg);
    CHECK_INT_EQ(err, FB_OK);
}

/* Eval-mode logits of member m on the first BS samples, [BS, CLASSES]. */
static void eval_logits(fb_array *a, int m, float *out)
{
    char msg[512];
    CHECK_INT_EQ(
        fb_array_forward_backward(a, ds.x, ds.y, BS, false, 0, NULL, NULL, msg, sizeof msg), FB_OK);
    fb_array_logits(a, m, BS, out);
}

/* Every member of a, saved now, must equal the files snap[0..n). */
static void check_unchanged(const fb_array *a, char snap[][1024], int n, const char *what)
{
    for (int m = 0; m < n; m++) {
        char now[1024];
        save(a, m, "now.safetensors", now, sizeof now);
        double e = et_st_compare(now, snap[m], NULL, 0);
        if (e != 0) {
            fprintf(stderr, "%s: member %d changed (error %.3g)\n", what, m, e);
            abort();
        }
    }
}

/* ---- building bad files from a good one ------------------------------------- */

typedef enum edit_kind {
    EDIT_NONE,
    EDIT_SHAPE,  /* target gets one more row */
    EDIT_DROP,   /* target is left out */
    EDIT_EXTRA,  /* a tensor named extra is added */
    EDIT_DTYPE,  /* target is written as I32 */
    EDIT_SCALAR, /* target (an I64 scalar) becomes [1] */
} edit_kind;

/* Copies src to dst tensor by tensor, applying one edit to tensor target. */
static void rewrite(const char *src, const char *dst, edit_kind kind, const char *target,
                    const char *extra)
{
    char msg[512];
    fb_st_file *f = et_st_open(src);
    fb_st_writer *w = fb_st_writer_new();
    CHECK(w != NULL);
    void *keep[64];
    int n_keep = 0;
    bool hit = false;
    for (size_t i = 0; i < fb_st_count(f); i++) {
        const fb_st_tensor *t = fb_st_at(f, i);
        int64_t shape[FB_ST_MAX_DIMS];
        int ndim = t->ndim;
        memcpy(shape, t->shape, sizeof shape);
        fb_st_dtype dtype = t->dtype;
        size_t nbytes = t->nbytes;
        bool is_target = target && strcmp(t->name, target) == 0;
        hit |= is_target;
        if (is_target && kind == EDIT_DROP) continue;
        if (is_target && kind == EDIT_SHAPE) {
            shape[0] += 1;
            nbytes += t->nbytes / (size_t)t->shape[0];
        }
        if (is_target && kind == EDIT_DTYPE) {
            CHECK(dtype == FB_ST_F32);
            dtype = FB_ST_I32; /* same size, wrong kind */
        }
        if (is_target && kind == EDIT_SCALAR) {
            CHECK(ndim == 0);
            ndim = 1;
            shape[0] = 1;
        }
        CHECK(n_keep < 64);
        void *data = calloc(1, nbytes + 8);
        CHECK(data != NULL);
        memcpy(data, t->data, t->nbytes);
        keep[n_keep++] = data;
        CHECK_INT_EQ(fb_st_writer_add(w, t->name, dtype, shape, ndim, data, msg, sizeof msg), 0);
    }
    if (kind != EDIT_NONE && kind != EDIT_EXTRA) CHECK(hit);
    static const float extra_data[4] = {1, 2, 3, 4};
    static const int64_t extra_i64 = 7;
    if (kind == EDIT_EXTRA) {
        const char *dot = strrchr(extra, '.');
        int64_t shape[1] = {4};
        if (strcmp(dot, ".num_batches_tracked") == 0)
            CHECK_INT_EQ(fb_st_writer_add_i64(w, extra, NULL, 0, &extra_i64, msg, sizeof msg), 0);
        else
            CHECK_INT_EQ(fb_st_writer_add_f32(w, extra, shape, 1, extra_data, msg, sizeof msg), 0);
    }
    CHECK_INT_EQ(fb_st_write(w, dst, msg, sizeof msg), 0);
    fb_st_writer_free(w);
    for (int i = 0; i < n_keep; i++)
        free(keep[i]);
    fb_st_close(f);
}

/* Loading path into slot 1 must fail with want and change nothing. */
static void expect_rejected(fb_array *a, char snap[][1024], const char *path, int want,
                            const char *what, const char *needle)
{
    char msg[512] = "";
    int err = fb_array_load(a, 1, path, msg, sizeof msg);
    printf("%-36s -> %s: %s\n", what, fb_err_code(err), msg);
    CHECK_INT_EQ(err, want);
    if (needle && !strstr(msg, needle)) {
        fprintf(stderr, "%s: message does not mention \"%s\"\n", what, needle);
        abort();
    }
    check_unchanged(a, snap, B, what);
}

int main(void)
{
    setvbuf(stdout, NULL, _IONBF, 0);
    double t0 = et_now();
    char msg[512];
    ds = et_synthetic(256, SIDE, CLASSES, 5);
    et_tmpdir(dir, sizeof dir, "array-io");

    fb_job_spec *specs[B];
    for (int b = 0; b < B; b++)
        specs[b] = spec(10 + b, "adam", NULL);
    fb_array *a = new_array(specs, B);
    train_steps(a, 6);

    /* the file is what a PyTorch user expects from this nn.Sequential */
    char snap[B][1024];
    for (int m = 0; m < B; m++) {
        char file[64];
        snprintf(file, sizeof file, "snap%d.safetensors", m);
        save(a, m, file, snap[m], sizeof snap[m]);
    }
    fb_st_file *f = et_st_open(snap[1]);
    const char *names[] = {"0.weight",
                           "0.bias",
                           "1.weight",
                           "1.bias",
                           "1.running_mean",
                           "1.running_var",
                           "1.num_batches_tracked",
                           "5.weight",
                           "5.bias",
                           "6.weight",
                           "6.bias",
                           "6.running_mean",
                           "6.running_var",
                           "6.num_batches_tracked"};
    CHECK_INT_EQ(fb_st_count(f), sizeof names / sizeof *names);
    for (size_t i = 0; i < sizeof names / sizeof *names; i++)
        CHECK(fb_st_find(f, names[i]));
    const fb_st_tensor *t = fb_st_find(f, "0.weight");
    CHECK(t->ndim == 4 && t->shape[0] == 3 && t->shape[1] == 1 && t->shape[2] == 3 &&
          t->shape[3] == 3);
    t = fb_st_find(f, "5.weight");
    CHECK(t->ndim == 2 && t->shape[0] == 5 && t->shape[1] == 27);
    int64_t tracked = 0;
    CHECK_INT_EQ(fb_st_get_i64(f, "6.num_batches_tracked", NULL, 0, &tracked, msg, sizeof msg), 0);
    CHECK_INT_EQ(tracked, 6);
    float rv[5];
    int64_t shape5[1] = {5};
    CHECK_INT_EQ(fb_st_get_f32(f, "6.running_var", shape5, 1, rv, msg, sizeof msg), 0);
    CHECK(rv[0] != 1.0f); /* the statistics moved */
    CHECK_STR_EQ(fb_st_metadata_get(f, "note"), "engine test");
    /* the file describes its member: spec, preprocessing, version */
    char *canon = fb_job_spec_canonical(specs[1]);
    CHECK(canon != NULL);
    CHECK_STR_EQ(fb_st_metadata_get(f, "spec"), canon);
    free(canon);
    CHECK_STR_EQ(fb_st_metadata_get(f, "preprocess"), FB_PREPROCESS_JSON);
    CHECK(fb_st_metadata_get(f, "fusebox_version") != NULL);
    CHECK_INT_EQ(fb_st_metadata_count(f), 4);
    fb_st_close(f);

    /* gradients of the last backward, under the same names, no buffers */
    char grads[1024];
    snprintf(grads, sizeof grads, "%s/grads.safetensors", dir);
    CHECK_INT_EQ(fb_array_save(a, 1, grads, true, NULL, NULL, msg, sizeof msg), 0);
    f = et_st_open(grads);
    CHECK_INT_EQ(fb_st_count(f), 8);
    CHECK(fb_st_find(f, "6.weight") && !fb_st_find(f, "6.running_mean"));
    fb_st_close(f);

    /* ---- round trip: member 1 into slot 0 of a fresh array of other seeds */
    fb_job_spec *other[B];
    for (int b = 0; b < B; b++)
        other[b] = spec(20 + b, "adam", NULL);
    fb_array *c = new_array(other, B);
    CHECK_INT_EQ(fb_array_load(c, 0, snap[1], msg, sizeof msg), FB_OK);
    char copy[1024];
    save(c, 0, "copy.safetensors", copy, sizeof copy);
    CHECK(et_st_compare(copy, snap[1], NULL, 0) == 0);
    float la[BS * CLASSES], lc[BS * CLASSES];
    eval_logits(a, 1, la);
    eval_logits(c, 0, lc);
    for (int i = 0; i < BS * CLASSES; i++)
        CHECK(la[i] == lc[i]);
    float loss_a[B], loss_c[B];
    CHECK_INT_EQ(
        fb_array_forward_backward(a, ds.x, ds.y, BS, true, 99, loss_a, NULL, msg, sizeof msg),
        FB_OK);
    CHECK_INT_EQ(
        fb_array_forward_backward(c, ds.x, ds.y, BS, true, 99, loss_c, NULL, msg, sizeof msg),
        FB_OK);
    CHECK(loss_a[1] == loss_c[0]);
    CHECK(loss_c[1] != loss_c[0]); /* the other slots kept their own weights */
    printf("round trip: member 1 -> fresh slot 0: identical file, eval logits and loss %.6f\n",
           loss_a[1]);
    fb_array_free(c);

    /* a train-mode forward updated running statistics: take new snapshots */
    for (int m = 0; m < B; m++) {
        char file[64];
        snprintf(file, sizeof file, "snap%d.safetensors", m);
        save(a, m, file, snap[m], sizeof snap[m]);
    }
    /* a file from another member, to make sure a failed load would show */
    const char *src = snap[2];

    /* ---- rejected files: member 1 and its neighbours unchanged */
    char bad[1024];
    snprintf(bad, sizeof bad, "%s/bad.safetensors", dir);
    rewrite(src, bad, EDIT_SHAPE, "5.weight", NULL);
    expect_rejected(a, snap, bad, FB_ERR_CHECKPOINT, "wrong shape (5.weight [6, 27])", "5.weight");
    rewrite(src, bad, EDIT_SHAPE, "1.running_mean", NULL);
    expect_rejected(a, snap, bad, FB_ERR_CHECKPOINT, "wrong shape (1.running_mean [4])",
                    "1.running_mean");
    rewrite(src, bad, EDIT_DROP, "6.bias", NULL);
    expect_rejected(a, snap, bad, FB_ERR_CHECKPOINT, "missing parameter (6.bias)", "6.bias");
    rewrite(src, bad, EDIT_EXTRA, NULL, "7.weight");
    expect_rejected(a, snap, bad, FB_ERR_CHECKPOINT, "extra tensor (7.weight)", "7.weight");
    rewrite(src, bad, EDIT_EXTRA, NULL, "encoder.0.weight");
    expect_rejected(a, snap, bad, FB_ERR_CHECKPOINT, "extra tensor (encoder.0.weight)",
                    "encoder.0.weight");
    rewrite(src, bad, EDIT_EXTRA, NULL, "3.num_batches_tracked");
    expect_rejected(a, snap, bad, FB_ERR_CHECKPOINT, "extra tensor (3.num_batches_tracked)",
                    "3.num_batches_tracked");
    rewrite(src, bad, EDIT_DTYPE, "0.weight", NULL);
    expect_rejected(a, snap, bad, FB_ERR_CHECKPOINT, "wrong dtype (0.weight I32)", "0.weight");
    rewrite(src, bad, EDIT_SCALAR, "6.num_batches_tracked", NULL);
    expect_rejected(a, snap, bad, FB_ERR_CHECKPOINT, "num_batches_tracked of shape [1]",
                    "6.num_batches_tracked");

    size_t len;
    FILE *fp = fopen(src, "rb");
    CHECK(fp != NULL);
    fseek(fp, 0, SEEK_END);
    len = (size_t)ftell(fp);
    fseek(fp, 0, SEEK_SET);
    char *bytes = malloc(len);
    CHECK(bytes && fread(bytes, 1, len, fp) == len);
    fclose(fp);
    fp = fopen(bad, "wb");
    CHECK(fp && fwrite(bytes, 1, len - 7, fp) == len - 7 && fclose(fp) == 0);
    expect_rejected(a, snap, bad, FB_ERR_CHECKPOINT, "truncated file", NULL);
    for (size_t i = 0; i < len; i++)
        bytes[i] = (char)(i * 131 + 7);
    fp = fopen(bad, "wb");
    CHECK(fp && fwrite(bytes, 1, len, fp) == len && fclose(fp) == 0);
    expect_rejected(a, snap, bad, FB_ERR_CHECKPOINT, "garbage file", NULL);
    fp = fopen(bad, "wb");
    CHECK(fp && fclose(fp) == 0);
    expect_rejected(a, snap, bad, FB_ERR_CHECKPOINT, "empty file", NULL);
    free(bytes);
    snprintf(bad, sizeof bad, "%s/absent.safetensors", dir);
    expect_rejected(a, snap, bad, FB_ERR_IO, "missing file", NULL);

    /* ---- a file without running statistics: parameters load, statistics stay */
    char partial[1024];
    snprintf(partial, sizeof partial, "%s/partial.safetensors", dir);
    char tmp[1024];
    snprintf(tmp, sizeof tmp, "%s/partial2.safetensors", dir);
    rewrite(src, partial, EDIT_DROP, "1.running_mean", NULL);
    rewrite(partial, tmp, EDIT_DROP, "1.running_var", NULL);
    rewrite(tmp, partial, EDIT_DROP, "1.num_batches_tracked", NULL);
    CHECK_INT_EQ(fb_array_load(a, 1, partial, msg, sizeof msg), FB_OK);
    char now[1024];
    save(a, 1, "after-partial.safetensors", now, sizeof now);
    fb_st_file *fn = et_st_open(now), *fs = et_st_open(src), *fo = et_st_open(snap[1]);
    for (size_t i = 0; i < fb_st_count(fn); i++) {
        const fb_st_tensor *tn = fb_st_at(fn, i);
        bool bn1 = strncmp(tn->name, "1.running", 9) == 0 ||
                   strcmp(tn->name, "1.num_batches_tracked") == 0;
        const fb_st_tensor *tw = fb_st_find(bn1 ? fo : fs, tn->name);
        CHECK(tw && tw->nbytes == tn->nbytes);
        if (memcmp(tw->data, tn->data, tn->nbytes) != 0) {
            fprintf(stderr, "partial load: %s is not from the %s\n", tn->name,
                    bn1 ? "member's own statistics" : "file");
            abort();
        }
    }
    fb_st_close(fn);
    fb_st_close(fs);
    fb_st_close(fo);
    printf("file without 1.running_*: parameters loaded, statistics kept\n");
    fb_array_free(a);

    /* ---- leaving moves a member's whole state down a slot, its counters included:
     * slot 2 holds a trained member (num_batches_tracked 7), the others fresh ones */
    fb_array *r = new_array(other, B);
    CHECK_INT_EQ(fb_array_load(r, 2, src, msg, sizeof msg), FB_OK);
    char before[B][1024];
    for (int m = 0; m < B; m++) {
        char file[64];
        snprintf(file, sizeof file, "before%d.safetensors", m);
        save(r, m, file, before[m], sizeof before[m]);
    }
    fb_array_remove(r, 1);
    CHECK_INT_EQ(fb_array_size(r), 2);
    CHECK(fb_array_spec(r, 0) == other[0] && fb_array_spec(r, 1) == other[2]);
    save(r, 0, "after0.safetensors", now, sizeof now);
    CHECK(et_st_compare(now, before[0], NULL, 0) == 0);
    save(r, 1, "after1.safetensors", now, sizeof now);
    CHECK(et_st_compare(now, before[2], NULL, 0) == 0);
    fb_array_remove(r, 0);
    save(r, 0, "after2.safetensors", now, sizeof now);
    CHECK(et_st_compare(now, before[2], NULL, 0) == 0);
    fb_st_file *fr = et_st_open(now);
    CHECK_INT_EQ(fb_st_get_i64(fr, "1.num_batches_tracked", NULL, 0, &tracked, msg, sizeof msg), 0);
    CHECK_INT_EQ(tracked, 7);
    fb_st_close(fr);
    fb_array_remove(r, 0);
    CHECK_INT_EQ(fb_array_size(r), 0);
    fb_array_free(r);
    printf("removal: the trained member kept parameters, statistics and counters\n");

    /* ---- fb_array_new: fusion keys and init files */
    fb_job_spec *sgd = spec(30, "sgd", NULL);
    fb_job_spec *mixed[2] = {specs[0], sgd};
    fb_array *untouched = (fb_array *)&mixed; /* any recognisable non-NULL value */
    fb_array *out = untouched;
    int err = fb_array_new(fb_backend_cpu(), (const fb_job_spec *const *)mixed, 2, BS, &out, msg,
                           sizeof msg);
    printf("fb_array_new(adam + sgd) -> %s: %s\n", fb_err_code(err), msg);
    CHECK_INT_EQ(err, FB_ERR_NOT_FUSIBLE);
    CHECK(out == untouched);
    CHECK(strstr(msg, "io10") && strstr(msg, "io30"));
    fb_job_spec *wide = et_spec(
        "{\"name\":\"wide\",\"dataset\":\"synthetic\",\"model\":{\"input\":[1,%d,%d],"
        "\"layers\":[{\"type\":\"flatten\"},{\"type\":\"linear\",\"out\":5}]},\"batch_size\":%d,"
        "\"steps\":10,\"optimizer\":{\"type\":\"adam\",\"lr\":0.01},\"seed\":1}",
        SIDE, SIDE, BS);
    fb_job_spec *mixed2[3] = {specs[0], specs[1], wide};
    err = fb_array_new(fb_backend_cpu(), (const fb_job_spec *const *)mixed2, 3, BS, &out, msg,
                       sizeof msg);
    CHECK_INT_EQ(err, FB_ERR_NOT_FUSIBLE);
    CHECK(out == untouched);

    snprintf(bad, sizeof bad, "%s/bad-init.safetensors", dir);
    rewrite(src, bad, EDIT_SHAPE, "0.weight", NULL);
    fb_job_spec *with_bad_init = spec(40, "adam", bad);
    fb_job_spec *pair[2] = {specs[0], with_bad_init};
    err = fb_array_new(fb_backend_cpu(), (const fb_job_spec *const *)pair, 2, BS, &out, msg,
                       sizeof msg);
    printf("fb_array_new(bad init) -> %s: %s\n", fb_err_code(err), msg);
    CHECK_INT_EQ(err, FB_ERR_CHECKPOINT);
    CHECK(out == untouched);

    /* a good init file makes the member start from it */
    fb_job_spec *with_init = spec(41, "adam", src);
    pair[1] = with_init;
    out = NULL;
    CHECK_INT_EQ(fb_array_new(fb_backend_cpu(), (const fb_job_spec *const *)pair, 2, BS, &out, msg,
                              sizeof msg),
                 FB_OK);
    save(out, 1, "from-init.safetensors", now, sizeof now);
    CHECK(et_st_compare(now, src, NULL, 0) == 0);
    fb_array_free(out);

    et_spec_free(sgd);
    et_spec_free(wide);
    et_spec_free(with_bad_init);
    et_spec_free(with_init);
    for (int b = 0; b < B; b++) {
        et_spec_free(specs[b]);
        et_spec_free(other[b]);
    }
    fb_dataset_free(&ds);
    et_rmtree(dir);
    printf("total %.2f s\n", et_now() - t0);
    return 0;
}
