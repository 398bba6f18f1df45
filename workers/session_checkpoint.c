/*
 * A session's files: each member's full-state checkpoint and its model as
 * safetensors bytes (session.h describes the format), and restoring a
 * member from a checkpoint or initial weights, checked whole before
 * anything changes, on every array that holds its state.
 */
#include <errno.h>
#include <float.h>
#include <inttypes.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <jansson.h>

#include "safetensors.h"
#include "session_impl.h"

#define NAME_CAP 256
#define METRICS_CAP 256

/* The names of docs/jobspec.md's metric vocabulary ("Metrics") that the
 * files' "metrics" entry uses; val_step is the step of the validation, as a
 * job's latest_metrics has it. */
#define METRIC_LOSS "loss"
#define METRIC_ACCURACY "accuracy"
#define METRIC_VAL_LOSS "val_loss"
#define METRIC_VAL_ACCURACY "val_accuracy"
#define METRIC_VAL_STEP "val_step"
#define METRIC_TEST_LOSS "test_loss"
#define METRIC_TEST_ACCURACY "test_accuracy"

/* ---- checkpoint bytes ------------------------------------------------------ */

/* The optimizer state a member carries: slot names and the array parts they live in. */
static int optim_slots(const fb_job_spec *spec, const char **names, fb_array_part *parts)
{
    if (spec->optim.type == FB_OPTIM_SGD) {
        /* without momentum torch.optim.SGD keeps no state, and neither do we */
        if (spec->optim.momentum == 0) return 0;
        names[0] = "momentum_buffer";
        parts[0] = FB_ARRAY_STATE1;
        return 1;
    }
    names[0] = "exp_avg";
    parts[0] = FB_ARRAY_STATE1;
    names[1] = "exp_avg_sq";
    parts[1] = FB_ARRAY_STATE2;
    return 2;
}

/* A number of the "metrics" entry: shortest round-trip digits (digits; 9
 * for a float, 17 for a double), null where it is not finite (JSON has no
 * NaN). */
static size_t put_number(char *buf, size_t cap, const char *key, double v, int digits)
{
    if (!isfinite(v)) return (size_t)snprintf(buf, cap, "\"%s\":null,", key);
    return (size_t)snprintf(buf, cap, "\"%s\":%.*g,", key, digits, v);
}

/* The "metrics" entry of a member's files: a JSON object with sorted keys of
 * what is known of it, "{}" before its first step. */
static void metrics_json(const member_metrics *k, char *buf, size_t cap)
{
    size_t at = (size_t)snprintf(buf, cap, "{");
    if (k->trained) at += put_number(buf + at, cap - at, METRIC_ACCURACY, k->accuracy, 17);
    if (k->trained) at += put_number(buf + at, cap - at, METRIC_LOSS, k->loss, 9);
    if (k->tested) {
        at += put_number(buf + at, cap - at, METRIC_TEST_ACCURACY, k->test_accuracy, 17);
        at += put_number(buf + at, cap - at, METRIC_TEST_LOSS, k->test_loss, 17);
    }
    if (k->val_step >= 0) {
        at += put_number(buf + at, cap - at, METRIC_VAL_ACCURACY, k->val_accuracy, 17);
        at += put_number(buf + at, cap - at, METRIC_VAL_LOSS, k->val_loss, 17);
        at += (size_t)snprintf(buf + at, cap - at, "\"%s\":%" PRId64 ",", METRIC_VAL_STEP,
                               k->val_step);
    }
    FB_ASSERT(at < cap);
    if (buf[at - 1] == ',') at--; /* the last entry's comma */
    snprintf(buf + at, cap - at, "}");
}

/*
 * A writer holding slot b's model (parameters, buffers, counters; metadata
 * "step", the description of fb_array_add_description and "metrics") or,
 * with full, its whole training state (plus optimizer state and the
 * checkpoint metadata).  *hold1 and *hold2 keep the data the writer
 * references alive; the caller frees them after the writer.
 */
static int member_writer(const fb_session *s, int b, bool full, fb_st_writer **out, void **hold1,
                         void **hold2, char *msg, size_t msg_cap)
{
    const fb_array *a = s->a;
    const fb_job_spec *spec = fb_array_spec(a, b);
    int err;
    void *h1 = NULL;
    float *h2 = NULL;
    fb_st_writer *w = fb_st_writer_new();
    if (!w) return fb_errf(msg, msg_cap, FB_ERR_NOMEM, "out of memory");
    if ((err = fb_array_add_tensors(a, b, false, w, &h1, msg, msg_cap))) goto fail;
    char num[32];
    snprintf(num, sizeof num, "%" PRId64, s->step);
    if ((err = fb_st_writer_set_metadata(w, "step", num, msg, msg_cap))) goto fail;
    if ((err = fb_array_add_description(a, b, w, msg, msg_cap))) goto fail;
    char metrics[METRICS_CAP];
    metrics_json(&s->known[s->member[b]], metrics, sizeof metrics);
    if ((err = fb_st_writer_set_metadata(w, "metrics", metrics, msg, msg_cap))) goto fail;
    if (full) {
        const char *names[2];
        fb_array_part parts[2];
        int n_slots = optim_slots(spec, names, parts);
        int n_params = fb_array_tensor_count(a, FB_ARRAY_PARAM);
        size_t floats = 0;
        for (int t = 0; t < n_params; t++)
            floats += fb_array_tensor_at(a, FB_ARRAY_PARAM, t).numel;
        h2 = malloc((floats * (size_t)n_slots + 1) * sizeof *h2);
        if (!h2) {
            err = fb_errf(msg, msg_cap, FB_ERR_NOMEM, "out of memory");
            goto fail;
        }
        float *at = h2;
        for (int k = 0; k < n_slots; k++) {
            for (int t = 0; t < n_params; t++) {
                fb_array_tensor d = fb_array_tensor_at(a, parts[k], t);
                char name[NAME_CAP];
                snprintf(name, sizeof name, "optim.%s.%s", names[k], d.name);
                fb_array_get(a, b, parts[k], t, at);
                if ((err = fb_st_writer_add_f32(w, name, d.shape, d.ndim, at, msg, msg_cap)))
                    goto fail;
                at += d.numel;
            }
        }
        const char *keys[] = {"format",    "fusion_key", "name",           "seed",
                              "data_seed", "loss_scale", "loss_scale_good"};
        char seed[32], data_seed[32], scale[48], good[32];
        snprintf(seed, sizeof seed, "%" PRIu64, (uint64_t)spec->seed);
        snprintf(data_seed, sizeof data_seed, "%" PRIu64, (uint64_t)spec->data_seed);
        /* a power of two has a finite decimal expansion: 25 digits write every
         * scale of [2^-24, 2^64] exactly, so it reads back to the same float */
        snprintf(scale, sizeof scale, "%.25g", (double)fb_array_loss_scale(a, b));
        snprintf(good, sizeof good, "%" PRId64, fb_array_loss_scale_good(a, b));
        const char *values[] = {
            FB_CHECKPOINT_FORMAT, spec->fusion_key, spec->name, seed, data_seed, scale, good};
        /* only a bf16 member has a loss scale */
        size_t n_keys = sizeof keys / sizeof *keys - (spec->precision == FB_PREC_BF16 ? 0 : 2);
        for (size_t k = 0; k < n_keys; k++)
            if ((err = fb_st_writer_set_metadata(w, keys[k], values[k], msg, msg_cap))) goto fail;
    }
    *out = w;
    *hold1 = h1;
    *hold2 = h2;
    return FB_OK;
fail:
    fb_st_writer_free(w);
    free(h1);
    free(h2);
    return err;
}

/* Slot b's bytes: its full state or its model. */
static int member_bytes(const fb_session *s, int b, bool full, void **buf, size_t *len, char *msg,
                        size_t msg_cap)
{
    fb_st_writer *w = NULL;
    void *h1 = NULL, *h2 = NULL;
    int err = member_writer(s, b, full, &w, &h1, &h2, msg, msg_cap);
    if (!err) err = fb_st_write_buffer(w, buf, len, msg, msg_cap);
    fb_st_writer_free(w);
    free(h1);
    free(h2);
    return err;
}

/* The files of a step (session_impl.h). */
int fb_session_member_output(const fb_session *s, int b, bool full, const char *suffix, char *path,
                             void **buf, size_t *len, char *msg, size_t msg_cap)
{
    path[0] = '\0';
    *buf = NULL;
    *len = 0;
    if (!s->opts.out_dir && !s->opts.blobs) return FB_OK;
    fb_st_writer *w = NULL;
    void *h1 = NULL, *h2 = NULL;
    int err = member_writer(s, b, full, &w, &h1, &h2, msg, msg_cap);
    if (!err && s->opts.out_dir) {
        snprintf(path, PATH_CAP, "%s/%s%s", s->opts.out_dir, s->files[s->member[b]], suffix);
        err = fb_st_write(w, path, msg, msg_cap);
        if (err) path[0] = '\0';
    }
    if (!err && s->opts.blobs) err = fb_st_write_buffer(w, buf, len, msg, msg_cap);
    fb_st_writer_free(w);
    free(h1);
    free(h2);
    return err;
}

int fb_session_checkpoint(const fb_session *s, int member, void **buf, size_t *len, char *msg,
                          size_t msg_cap)
{
    int b = fb_session_slot(s, member);
    if (b < 0)
        return fb_errf(msg, msg_cap, FB_ERR_NOT_FOUND, "member %d is not in the array", member);
    return member_bytes(s, b, true, buf, len, msg, msg_cap);
}

int fb_session_model(const fb_session *s, int member, void **buf, size_t *len, char *msg,
                     size_t msg_cap)
{
    int b = fb_session_slot(s, member);
    if (b < 0)
        return fb_errf(msg, msg_cap, FB_ERR_NOT_FOUND, "member %d is not in the array", member);
    return member_bytes(s, b, false, buf, len, msg, msg_cap);
}

/* ---- restoring ------------------------------------------------------------- */

/* The arrays that each hold every member's whole state: the engine's
 * replicas, or the session's array alone. */
static int replica_count(const fb_session *s)
{
    return s->engine->replicas ? s->engine->replicas(s) : 1;
}

static fb_array *replica_at(const fb_session *s, int d)
{
    return s->engine->replica ? s->engine->replica(s, d) : s->a;
}

/* Parses a metadata value as a non-negative decimal integer. */
static bool meta_u64(const char *v, uint64_t *out)
{
    if (!v || *v < '0' || *v > '9') return false;
    char *end;
    errno = 0;
    unsigned long long x = strtoull(v, &end, 10);
    if (errno || *end) return false;
    *out = (uint64_t)x;
    return true;
}

static const char *fmt_shape(char *buf, size_t cap, const int64_t *shape, int ndim)
{
    size_t at = 0;
    at += (size_t)snprintf(buf, cap, "[");
    for (int i = 0; i < ndim && at < cap; i++)
        at += (size_t)snprintf(buf + at, cap - at, "%s%" PRId64, i ? ", " : "", shape[i]);
    if (at < cap) snprintf(buf + at, cap - at, "]");
    return buf;
}

/* Checks that tensor name is in f with dtype and shape; copies its bytes to dst. */
static int take_tensor(const fb_st_file *f, const char *who, const char *name, fb_st_dtype dtype,
                       const int64_t *shape, int ndim, void *dst, char *msg, size_t msg_cap)
{
    const fb_st_tensor *t = fb_st_find(f, name);
    if (!t) return fb_errf(msg, msg_cap, FB_ERR_CHECKPOINT, "%s: tensor %s is missing", who, name);
    if (t->dtype != dtype)
        return fb_errf(msg, msg_cap, FB_ERR_CHECKPOINT, "%s: tensor %s has dtype %s, expected %s",
                       who, name, fb_st_dtype_name(t->dtype), fb_st_dtype_name(dtype));
    bool same = t->ndim == ndim;
    for (int i = 0; same && i < ndim; i++)
        same = t->shape[i] == shape[i];
    if (!same) {
        char got[160], want[160];
        return fb_errf(msg, msg_cap, FB_ERR_CHECKPOINT, "%s: tensor %s has shape %s, expected %s",
                       who, name, fmt_shape(got, sizeof got, t->shape, t->ndim),
                       fmt_shape(want, sizeof want, shape, ndim));
    }
    memcpy(dst, t->data, t->nbytes);
    return FB_OK;
}

/* Whether name is one of the tensors a checkpoint of slot b holds. */
static bool known_tensor(const fb_session *s, int b, const char *name)
{
    const fb_array *a = s->a;
    const fb_array_part parts[] = {FB_ARRAY_PARAM, FB_ARRAY_BUFFER};
    for (int p = 0; p < 2; p++)
        for (int t = 0; t < fb_array_tensor_count(a, parts[p]); t++)
            if (strcmp(fb_array_tensor_at(a, parts[p], t).name, name) == 0) return true;
    for (int k = 0; k < fb_array_bn_count(a); k++) {
        char bn[NAME_CAP];
        fb_array_bn_name(a, k, bn, sizeof bn);
        if (strcmp(bn, name) == 0) return true;
    }
    const char *names[2];
    fb_array_part oparts[2];
    int n_slots = optim_slots(fb_array_spec(a, b), names, oparts);
    for (int k = 0; k < n_slots; k++) {
        size_t len = strlen(names[k]);
        if (strncmp(name, "optim.", 6) != 0 || strncmp(name + 6, names[k], len) != 0 ||
            name[6 + len] != '.')
            continue;
        for (int t = 0; t < fb_array_tensor_count(a, FB_ARRAY_PARAM); t++)
            if (strcmp(fb_array_tensor_at(a, FB_ARRAY_PARAM, t).name, name + 7 + len) == 0)
                return true;
    }
    return false;
}

/* Checks the checkpoint's metadata against slot b and the session. */
static int check_metadata(const fb_session *s, int b, const fb_st_file *f, const char *who,
                          char *msg, size_t msg_cap)
{
    const fb_job_spec *spec = fb_array_spec(s->a, b);
    const char *format = fb_st_metadata_get(f, "format");
    if (!format || strcmp(format, FB_CHECKPOINT_FORMAT) != 0)
        return fb_errf(msg, msg_cap, FB_ERR_CHECKPOINT,
                       "%s: metadata format is %s%s%s, expected \"%s\"", who, format ? "\"" : "",
                       format ? format : "missing", format ? "\"" : "", FB_CHECKPOINT_FORMAT);
    uint64_t step;
    const char *v = fb_st_metadata_get(f, "step");
    if (!meta_u64(v, &step))
        return fb_errf(msg, msg_cap, FB_ERR_CHECKPOINT,
                       "%s: metadata step is %s, expected a step count", who, v ? v : "missing");
    if (step != (uint64_t)s->step)
        return fb_errf(msg, msg_cap, FB_ERR_CHECKPOINT,
                       "%s: metadata step is %" PRIu64 ", the session is at step %" PRId64, who,
                       step, s->step);
    v = fb_st_metadata_get(f, "fusion_key");
    if (!v || strcmp(v, spec->fusion_key) != 0)
        return fb_errf(msg, msg_cap, FB_ERR_CHECKPOINT,
                       "%s: metadata fusion_key is %s, the job's is %s", who, v ? v : "missing",
                       spec->fusion_key);
    /* the seeds drive the dropout masks and the data order: another seed is another job */
    const char *keys[] = {"seed", "data_seed"};
    uint64_t want[] = {(uint64_t)spec->seed, (uint64_t)spec->data_seed};
    for (int k = 0; k < 2; k++) {
        uint64_t got;
        v = fb_st_metadata_get(f, keys[k]);
        if (!meta_u64(v, &got) || got != want[k])
            return fb_errf(msg, msg_cap, FB_ERR_CHECKPOINT,
                           "%s: metadata %s is %s, the job's is %" PRIu64, who, keys[k],
                           v ? v : "missing", want[k]);
    }
    return FB_OK;
}

/*
 * The loss scale of a checkpoint of slot b: *scale and *good from the
 * metadata "loss_scale" (the scale's exact decimal) and "loss_scale_good"
 * (finite steps since it last changed).  A bf16 checkpoint written before
 * the scale was kept has neither and starts at FB_LOSS_SCALE_INIT with 0
 * steps, as a fresh member does; one key without the other, or either in
 * the checkpoint of a job without a loss scale, is refused.  The range
 * checks are fb_array_set_loss_scale's, made by the caller.
 */
static int read_loss_scale(const fb_session *s, int b, const fb_st_file *f, const char *who,
                           float *scale, int64_t *good, char *msg, size_t msg_cap)
{
    const fb_job_spec *spec = fb_array_spec(s->a, b);
    const char *vs = fb_st_metadata_get(f, "loss_scale");
    const char *vg = fb_st_metadata_get(f, "loss_scale_good");
    if (spec->precision != FB_PREC_BF16) {
        if (vs || vg)
            return fb_errf(msg, msg_cap, FB_ERR_CHECKPOINT,
                           "%s: metadata %s is set, but the job's precision has no loss scale", who,
                           vs ? "loss_scale" : "loss_scale_good");
        *scale = 1.0f;
        *good = 0;
        return FB_OK;
    }
    if (!vs && !vg) {
        *scale = FB_LOSS_SCALE_INIT;
        *good = 0;
        return FB_OK;
    }
    if (!vs || !vg)
        return fb_errf(msg, msg_cap, FB_ERR_CHECKPOINT, "%s: metadata %s is missing (%s is set)",
                       who, vs ? "loss_scale_good" : "loss_scale",
                       vs ? "loss_scale" : "loss_scale_good");
    /* strict: the whole text is one number, exactly a float (the writer's
     * exact decimal is), so a damaged digit is refused, not rounded away */
    char *end;
    errno = 0;
    double x = strtod(vs, &end);
    if (end == vs || *end || errno || !(x > 0 && x <= FLT_MAX) || (double)(float)x != x)
        return fb_errf(msg, msg_cap, FB_ERR_CHECKPOINT,
                       "%s: metadata loss_scale is %s, expected a power of two in [2^-24, 2^64]",
                       who, vs);
    uint64_t g;
    if (!meta_u64(vg, &g) || g > INT64_MAX)
        return fb_errf(msg, msg_cap, FB_ERR_CHECKPOINT,
                       "%s: metadata loss_scale_good is %s, expected a count of steps", who, vg);
    *scale = (float)x;
    *good = (int64_t)g;
    return FB_OK;
}

/* A number of the metrics entry into *out: present with json null (NaN), or
 * a number; *seen tells whether it was present. */
static int metric_value(const json_t *o, const char *key, const char *who, double lo, double hi,
                        bool *seen, double *out, char *msg, size_t msg_cap)
{
    const json_t *v = json_object_get(o, key);
    *seen = v != NULL;
    if (!v) return FB_OK;
    if (json_is_null(v)) {
        *out = NAN;
        return FB_OK;
    }
    if (!json_is_number(v) || !(json_number_value(v) >= lo && json_number_value(v) <= hi))
        return fb_errf(msg, msg_cap, FB_ERR_CHECKPOINT,
                       "%s: metadata metrics.%s is not a number in [%g, %g]", who, key, lo, hi);
    *out = json_number_value(v);
    return FB_OK;
}

/*
 * The metrics entry of a checkpoint at step `step` into *out: absent (a file
 * from before the entry) means nothing known; present, it must be a JSON
 * object whose loss and accuracy come together, as do val_loss,
 * val_accuracy and val_step (at most step), and test_loss and test_accuracy;
 * other keys are ignored, so a later vocabulary (or an earlier one, whose
 * eval_* were test evaluations) still loads.
 */
static int read_metrics(const fb_st_file *f, const char *who, int64_t step, member_metrics *out,
                        char *msg, size_t msg_cap)
{
    member_metrics k = {.val_step = -1};
    const char *text = fb_st_metadata_get(f, "metrics");
    if (!text) {
        *out = k;
        return FB_OK;
    }
    json_t *o = json_loads(text, JSON_REJECT_DUPLICATES, NULL);
    int err = FB_OK;
    if (!json_is_object(o)) {
        err = fb_errf(msg, msg_cap, FB_ERR_CHECKPOINT, "%s: metadata metrics is not a JSON object",
                      who);
        goto done;
    }
    bool has_loss, has_acc, has_eloss, has_eacc, has_tloss, has_tacc;
    double loss = 0;
    if ((err = metric_value(o, METRIC_LOSS, who, 0, HUGE_VAL, &has_loss, &loss, msg, msg_cap)) ||
        (err = metric_value(o, METRIC_ACCURACY, who, 0, 1, &has_acc, &k.accuracy, msg, msg_cap)) ||
        (err = metric_value(o, METRIC_VAL_LOSS, who, 0, HUGE_VAL, &has_eloss, &k.val_loss, msg,
                            msg_cap)) ||
        (err = metric_value(o, METRIC_VAL_ACCURACY, who, 0, 1, &has_eacc, &k.val_accuracy, msg,
                            msg_cap)) ||
        (err = metric_value(o, METRIC_TEST_LOSS, who, 0, HUGE_VAL, &has_tloss, &k.test_loss, msg,
                            msg_cap)) ||
        (err = metric_value(o, METRIC_TEST_ACCURACY, who, 0, 1, &has_tacc, &k.test_accuracy, msg,
                            msg_cap)))
        goto done;
    if (has_tloss != has_tacc) {
        err = fb_errf(msg, msg_cap, FB_ERR_CHECKPOINT, "%s: metadata metrics has %s without %s",
                      who, has_tloss ? METRIC_TEST_LOSS : METRIC_TEST_ACCURACY,
                      has_tloss ? METRIC_TEST_ACCURACY : METRIC_TEST_LOSS);
        goto done;
    }
    k.tested = has_tloss;
    if (has_loss != has_acc) {
        err = fb_errf(msg, msg_cap, FB_ERR_CHECKPOINT, "%s: metadata metrics has %s without %s",
                      who, has_loss ? METRIC_LOSS : METRIC_ACCURACY,
                      has_loss ? METRIC_ACCURACY : METRIC_LOSS);
        goto done;
    }
    k.trained = has_loss;
    k.loss = (float)loss;
    const json_t *es = json_object_get(o, METRIC_VAL_STEP);
    if (es && (!json_is_integer(es) || json_integer_value(es) < 1 ||
               json_integer_value(es) > step)) {
        err = fb_errf(msg, msg_cap, FB_ERR_CHECKPOINT,
                      "%s: metadata metrics.%s is not a step in [1, %" PRId64 "]", who,
                      METRIC_VAL_STEP, step);
        goto done;
    }
    if (has_eloss != has_eacc || has_eloss != (es != NULL)) {
        err = fb_errf(msg, msg_cap, FB_ERR_CHECKPOINT,
                      "%s: metadata metrics needs %s, %s and %s together", who, METRIC_VAL_LOSS,
                      METRIC_VAL_ACCURACY, METRIC_VAL_STEP);
        goto done;
    }
    if (es) k.val_step = (int64_t)json_integer_value(es);
    *out = k;
done:
    json_decref(o);
    return err;
}

int fb_session_restore(fb_session *s, int member, const void *buf, size_t len, char *msg,
                       size_t msg_cap)
{
    int b = fb_session_slot(s, member);
    if (b < 0)
        return fb_errf(msg, msg_cap, FB_ERR_NOT_FOUND, "member %d is not in the array", member);
    fb_array *a = s->a;
    const fb_job_spec *spec = fb_array_spec(a, b);
    char who[FILE_CAP + 32];
    snprintf(who, sizeof who, "checkpoint of %s", spec->name);
    if (!buf || len == 0) return fb_errf(msg, msg_cap, FB_ERR_CHECKPOINT, "%s: no bytes", who);

    fb_st_file *f = NULL;
    char inner[512];
    int err = fb_st_parse_buffer(buf, len, &f, inner, sizeof inner);
    if (err) {
        if (err == FB_ERR_NOMEM) return fb_errf(msg, msg_cap, err, "%s", inner);
        return fb_errf(msg, msg_cap, FB_ERR_CHECKPOINT, "%s: %s", who, inner);
    }
    const char *names[2];
    fb_array_part oparts[2];
    int n_slots = optim_slots(spec, names, oparts);
    int n_params = fb_array_tensor_count(a, FB_ARRAY_PARAM);
    int n_bufs = fb_array_tensor_count(a, FB_ARRAY_BUFFER);
    int n_bn = fb_array_bn_count(a);
    /* every value lands in scratch first: the member changes only once all of it fits */
    size_t floats = 0;
    for (int t = 0; t < n_params; t++)
        floats += fb_array_tensor_at(a, FB_ARRAY_PARAM, t).numel * (size_t)(1 + n_slots);
    for (int t = 0; t < n_bufs; t++)
        floats += fb_array_tensor_at(a, FB_ARRAY_BUFFER, t).numel;
    float *scratch = malloc((floats + 1) * sizeof *scratch);
    int64_t *tracked = malloc(((size_t)n_bn + 1) * sizeof *tracked);
    if (!scratch || !tracked) {
        err = fb_errf(msg, msg_cap, FB_ERR_NOMEM, "out of memory");
        goto done;
    }
    if ((err = check_metadata(s, b, f, who, msg, msg_cap))) goto done;
    for (size_t i = 0; i < fb_st_count(f); i++) {
        const char *name = fb_st_at(f, i)->name;
        if (!known_tensor(s, b, name)) {
            err = fb_errf(msg, msg_cap, FB_ERR_CHECKPOINT,
                          "%s: tensor %s is not part of this job's training state", who, name);
            goto done;
        }
    }
    float *at = scratch;
    const fb_array_part parts[] = {FB_ARRAY_PARAM, FB_ARRAY_BUFFER};
    for (int p = 0; p < 2; p++) {
        for (int t = 0; t < fb_array_tensor_count(a, parts[p]); t++) {
            fb_array_tensor d = fb_array_tensor_at(a, parts[p], t);
            if ((err = take_tensor(f, who, d.name, FB_ST_F32, d.shape, d.ndim, at, msg, msg_cap)))
                goto done;
            at += d.numel;
        }
    }
    for (int k = 0; k < n_slots; k++) {
        for (int t = 0; t < n_params; t++) {
            fb_array_tensor d = fb_array_tensor_at(a, oparts[k], t);
            char name[NAME_CAP];
            snprintf(name, sizeof name, "optim.%s.%s", names[k], d.name);
            if ((err = take_tensor(f, who, name, FB_ST_F32, d.shape, d.ndim, at, msg, msg_cap)))
                goto done;
            at += d.numel;
        }
    }
    for (int k = 0; k < n_bn; k++) {
        char name[NAME_CAP];
        fb_array_bn_name(a, k, name, sizeof name);
        if ((err = take_tensor(f, who, name, FB_ST_I64, NULL, 0, &tracked[k], msg, msg_cap)))
            goto done;
        if (tracked[k] < 0) {
            err = fb_errf(msg, msg_cap, FB_ERR_CHECKPOINT,
                          "%s: tensor %s is negative (%" PRId64 ")", who, name, tracked[k]);
            goto done;
        }
    }

    member_metrics known;
    if ((err = read_metrics(f, who, s->step, &known, msg, msg_cap))) goto done;
    float scale = FB_LOSS_SCALE_INIT;
    int64_t good = 0;
    if ((err = read_loss_scale(s, b, f, who, &scale, &good, msg, msg_cap))) goto done;
    if (spec->precision == FB_PREC_BF16) {
        /* the last check; it changes only the scale of a, and only when it passes,
         * after which nothing below fails */
        char inner[256];
        if ((err = fb_array_set_loss_scale(a, b, scale, good, inner, sizeof inner))) {
            const char *vs = fb_st_metadata_get(f, "loss_scale");
            err = fb_errf(msg, msg_cap, FB_ERR_CHECKPOINT,
                          "%s: metadata loss_scale %s, good %" PRId64 ": %s", who,
                          vs ? vs : "(absent)", good, inner);
            goto done;
        }
    }

    /* everything fits: now change the member, in the order it was read, on every
     * data-parallel replica (they hold one state) */
    int replicas = replica_count(s);
    for (int d = 0; d < replicas; d++) {
        fb_array *ad = replica_at(s, d);
        at = scratch;
        for (int p = 0; p < 2; p++) {
            for (int t = 0; t < fb_array_tensor_count(ad, parts[p]); t++) {
                fb_array_set(ad, b, parts[p], t, at);
                at += fb_array_tensor_at(ad, parts[p], t).numel;
            }
        }
        for (int k = 0; k < n_slots; k++) {
            for (int t = 0; t < n_params; t++) {
                fb_array_set(ad, b, oparts[k], t, at);
                at += fb_array_tensor_at(ad, oparts[k], t).numel;
            }
        }
        for (int k = 0; k < n_bn; k++)
            fb_array_set_bn_tracked(ad, b, k, tracked[k]);
        if (spec->precision == FB_PREC_BF16 && ad != a) {
            int rc = fb_array_set_loss_scale(ad, b, scale, good, NULL, 0);
            FB_ASSERT(rc == FB_OK); /* a's replica took the same values */
        }
    }
    if (s->engine->scatter) s->engine->scatter(s, b);
    s->known[member] = known;
    err = FB_OK;
done:
    free(scratch);
    free(tracked);
    fb_st_close(f);
    return err;
}

int fb_session_load_weights(fb_session *s, int member, const void *buf, size_t len, char *msg,
                            size_t msg_cap)
{
    int b = fb_session_slot(s, member);
    if (b < 0)
        return fb_errf(msg, msg_cap, FB_ERR_NOT_FOUND, "member %d is not in the array", member);
    if (s->step != 0)
        return fb_errf(msg, msg_cap, FB_ERR_STATE_CONFLICT,
                       "initial weights are for a session at step 0, this one is at %lld",
                       (long long)s->step);
    fb_array *a = s->a;
    if (!buf || len == 0)
        return fb_errf(msg, msg_cap, FB_ERR_CHECKPOINT, "the init weights: no bytes");
    int err = fb_array_load_buffer(a, b, buf, len, "the init weights", msg, msg_cap);
    if (err) return err;
    /* the data-parallel replicas hold one state: they take what the first took */
    int replicas = replica_count(s);
    const fb_array_part parts[] = {FB_ARRAY_PARAM, FB_ARRAY_BUFFER};
    size_t most = 1;
    for (int p = 0; p < 2; p++)
        for (int t = 0; t < fb_array_tensor_count(a, parts[p]); t++)
            if (fb_array_tensor_at(a, parts[p], t).numel > most)
                most = fb_array_tensor_at(a, parts[p], t).numel;
    float *tmp = replicas > 1 ? malloc(most * sizeof *tmp) : NULL;
    if (replicas > 1 && !tmp) return fb_errf(msg, msg_cap, FB_ERR_NOMEM, "out of memory");
    for (int d = 0; d < replicas; d++) {
        fb_array *ad = replica_at(s, d);
        if (ad == a) continue;
        for (int p = 0; p < 2; p++)
            for (int t = 0; t < fb_array_tensor_count(a, parts[p]); t++) {
                fb_array_get(a, b, parts[p], t, tmp);
                fb_array_set(ad, b, parts[p], t, tmp);
            }
        for (int k = 0; k < fb_array_bn_count(a); k++)
            fb_array_set_bn_tracked(ad, b, k, fb_array_bn_tracked(a, b, k));
    }
    free(tmp);
    if (s->engine->scatter) s->engine->scatter(s, b);
    return FB_OK;
}
